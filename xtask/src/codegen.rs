//! `cargo xtask codegen`: rewrites the generated parts of the docs from their sources.
//!
//! Each generated part has a test beside its source that fails while the committed file is
//! stale; this command runs those tests with `SHEAF_UPDATE_GENERATED` set, which makes them
//! write the fresh text instead of failing. So the source of truth and the freshness check are
//! one piece of code, and xtask stays free of the service's dependencies.

use std::process::ExitCode;

use crate::process::{run_step, workspace_root};

/// The tests that own a generated part: (package, test filter).
const GENERATORS: &[(&str, &str)] = &[
    (
        "sheaf-server",
        "settings::docs::tests::configuration_md_is_generated_from_the_table",
    ),
    (
        "sheaf-server",
        "runbook::operations_md_documents_every_metric_the_page_renders",
    ),
];

pub fn codegen() -> anyhow::Result<ExitCode> {
    let mut passed = true;
    for (package, test) in GENERATORS {
        let mut cmd =
            std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
        cmd.args([
            "test",
            "--quiet",
            "--package",
            package,
            "--lib",
            "--",
            "--exact",
            test,
        ])
        .env("SHEAF_UPDATE_GENERATED", "1")
        .current_dir(workspace_root());
        passed &= run_step(&mut cmd)?;
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
