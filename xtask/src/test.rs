//! `cargo xtask test` and `cargo xtask ci`.

use crate::process::{output_of, run_step, workspace_root};
use crate::services;
use anyhow::Context;
use std::process::{Command, ExitCode};

/// Starts the services, runs every suite with their URLs, then every benchmark scenario at
/// its quick size (each must still run to completion, so a benchmark cannot rot unnoticed;
/// nothing there judges timing, which a shared CI machine cannot measure fairly), then every
/// fault scenario at its quick size (on servers of its own, which it starts and stops; a
/// scenario that loses an event fails the run), and stops what it started, also when a suite
/// fails.
pub fn test(runner_args: &[&str]) -> anyhow::Result<ExitCode> {
    let env = services::up()?;
    env.print();
    let outcome = run_suites(&env, runner_args).and_then(|suites_passed| {
        let benches_ran = crate::bench::run(&env, &["all"], true)?;
        let chaos_passed = crate::chaos::run(&["all"], true)?;
        Ok([
            ("the test suites", suites_passed),
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
            "xtask: test passed: the test suites, the benchmarks and the fault suite (--quick)"
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
    for mut step in steps {
        step.envs(env.vars.iter().map(|(k, v)| (k, v)))
            .env(sheaf_testenv::PYTHON_VAR, services::venv_python());
        passed &= run_step(&mut step)?;
    }
    Ok(passed)
}
