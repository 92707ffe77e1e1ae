//! A transformation runner on its own, for programs that embed a [`sheaf_transform::pool::Pool`]
//! and have no command of theirs to run one (Sheaf's service runs `sheaf transform-runner`).

fn main() -> std::process::ExitCode {
    match sheaf_transform::runner::serve_stdio() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sheaf-transform-runner: {e}");
            std::process::ExitCode::FAILURE
        }
    }
}
