//! `cargo xtask test` and `cargo xtask ci`.

use crate::process::{describe, output_of, workspace_root};
use crate::services;
use anyhow::Context;
use std::io::{BufRead, BufReader};
use std::process::{Command, ExitCode, Stdio};

/// Starts the services, runs every suite with their URLs (and says how many doctests ran), then
/// packages and documents every publishable crate (`cargo xtask package`), then every benchmark
/// scenario at
/// its quick size (each must still run to completion, so a benchmark cannot rot unnoticed;
/// nothing there judges timing, which a shared CI machine cannot measure fairly), then every
/// fault scenario at its quick size (on servers of its own, which it starts and stops; a
/// scenario that loses an event fails the run), and stops what it started, also when a suite
/// fails.
pub fn test(runner_args: &[&str]) -> anyhow::Result<ExitCode> {
    // The cluster too: the ClickHouse suites also run against it (`sheaf-clickhouse`).
    let env = services::up(true)?;
    env.print();
    let outcome = run_suites(&env, runner_args).and_then(|suites_passed| {
        let packaged = crate::package::run(crate::package::Verify::Yes)?;
        let benches_ran = crate::bench::run(&env, &["all"], true)?;
        let chaos_passed = crate::chaos::run(&["all"], true)?;
        Ok([
            ("the test suites", suites_passed),
            ("packaging the publishable crates", packaged),
            ("the benchmarks at --quick size", benches_ran),
            ("the fault suite at --quick size", chaos_passed),
        ])
    });
    let stopped = services::stop(env.started);
    let steps = outcome?;
    stopped.context("the suites ran, but stopping the services failed")?;
    // One line at the very end that says what failed, so nobody has to scroll for it.
    let failed: Vec<&str> = steps
        .iter()
        .filter(|(_, ok)| !ok)
        .map(|(what, _)| *what)
        .collect();
    let passed = failed.is_empty();
    if passed {
        println!(
            "xtask: test passed: the test suites, packaging, the benchmarks and the fault suite (--quick)"
        );
    } else {
        eprintln!("xtask: test failed: {}", failed.join(", "));
    }
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// `cargo fmt --check` and clippy first: they are cheap and fail fast.
pub fn ci() -> anyhow::Result<ExitCode> {
    let checks: [&[&str]; 2] = [
        &["fmt", "--all", "--", "--check"],
        &[
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ],
    ];
    for args in checks {
        if !cargo(args).status().is_ok_and(|s| s.success()) {
            eprintln!("xtask: `cargo {}` failed", args.join(" "));
            return Ok(ExitCode::FAILURE);
        }
    }
    test(&[])
}

fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(args).current_dir(workspace_root());
    cmd
}

fn nextest_available() -> bool {
    output_of(&mut cargo(&["nextest", "--version"])).is_ok_and(|out| out.status.success())
}

fn run_suites(env: &services::ServicesEnv, runner_args: &[&str]) -> anyhow::Result<bool> {
    let mut steps: Vec<Command> = Vec::new();
    if nextest_available() {
        let mut cmd = cargo(&["nextest", "run", "--workspace", "--no-fail-fast"]);
        cmd.args(runner_args);
        steps.push(cmd);
        // nextest does not run doctests; cargo test does them in a second step.
        steps.push(cargo(&["test", "--workspace", "--doc"]));
    } else {
        let mut cmd = cargo(&["test", "--workspace", "--no-fail-fast"]);
        cmd.args(runner_args);
        steps.push(cmd);
    }

    let mut passed = true;
    let mut doctests = Doctests::default();
    for mut step in steps {
        step.envs(env.vars.iter().map(|(k, v)| (k, v)))
            .env(sheaf_testenv::PYTHON_VAR, services::venv_python());
        passed &= run_counting_doctests(&mut step, &mut doctests)?;
    }
    doctests.print();
    Ok(passed)
}

/// Doctests that passed, per crate, read from the test harness's lines on standard output
/// (cargo's own `Doc-tests <crate>` headings go to standard error): a doctest is named
/// `<file> - <item> (line N)`, with ` - compile` after it when it is only compiled (`no_run`).
#[derive(Debug, Default)]
struct Doctests {
    /// `(crate folder, ran, compiled only)`, in the order first seen.
    passed: Vec<(String, u64, u64)>,
}

impl Doctests {
    fn read(&mut self, line: &str) {
        let Some(name) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... ok"))
        else {
            return;
        };
        let Some((file, item)) = name.split_once(" - ") else {
            return;
        };
        if !file.ends_with(".rs") || !item.contains("(line ") {
            return;
        }
        // `crates/<name>/src/lib.rs`, `examples/<name>/…`: the crate's folder names it.
        let mut parts = file.split('/');
        let folder = match (parts.next(), parts.next()) {
            (Some("crates" | "examples"), Some(name)) => name,
            (Some(first), _) => first,
            (None, _) => file,
        };
        let index = match self.passed.iter().position(|(name, _, _)| name == folder) {
            Some(index) => index,
            None => {
                self.passed.push((folder.to_owned(), 0, 0));
                self.passed.len() - 1
            }
        };
        if item.ends_with(" - compile") {
            self.passed[index].2 += 1;
        } else {
            self.passed[index].1 += 1;
        }
    }

    fn print(&self) {
        let ran: u64 = self.passed.iter().map(|(_, ran, _)| ran).sum();
        let compiled: u64 = self.passed.iter().map(|(_, _, compiled)| compiled).sum();
        let per_crate: Vec<String> = self
            .passed
            .iter()
            .map(|(name, ran, compiled)| match compiled {
                0 => format!("{name} {ran}"),
                _ => format!("{name} {ran} + {compiled} compiled"),
            })
            .collect();
        println!(
            "xtask: {ran} doctests ran and passed, {compiled} more compiled only (no_run), in {} \
             crates: {}",
            self.passed.len(),
            per_crate.join(", ")
        );
    }
}

/// [`run_step`](crate::process::run_step), with the step's standard output passed through line by line and read for
/// doctest results on the way.
fn run_counting_doctests(cmd: &mut Command, doctests: &mut Doctests) -> anyhow::Result<bool> {
    println!("xtask: running `{}`", describe(cmd));
    let mut child = cmd
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("could not run `{}`", describe(cmd)))?;
    let stdout = child
        .stdout
        .take()
        .context("the step's stdout was not piped")?;
    for line in BufReader::new(stdout).lines() {
        let line = line.context("reading the step's output")?;
        println!("{line}");
        doctests.read(&line);
    }
    let status = child.wait()?;
    if !status.success() {
        eprintln!("xtask: `{}` failed ({status})", describe(cmd));
    }
    Ok(status.success())
}

#[cfg(test)]
mod tests {
    use super::Doctests;

    #[test]
    fn doctests_are_counted_per_crate_from_the_harness_lines() {
        let mut doctests = Doctests::default();
        for line in [
            "test crates/sheaf-cdc/src/lib.rs - (line 11) - compile ... ok",
            "test crates/sheaf-cdc/src/lib.rs - (line 97) ... ok",
            "test crates/sheaf-store/src/lib.rs - testkit::parity::run (line 48) ... ok",
            "test suites::parity_of_the_log_store ... ok",
            "test crates/sheaf-store/src/lib.rs - (line 60) ... FAILED",
            "test result: ok. 2 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out",
        ] {
            doctests.read(line);
        }
        assert_eq!(
            doctests.passed,
            [
                ("sheaf-cdc".to_owned(), 1, 1),
                ("sheaf-store".to_owned(), 1, 0)
            ]
        );
    }
}
