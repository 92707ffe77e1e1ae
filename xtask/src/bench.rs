//! `cargo xtask bench <scenario>…|all [--quick]`: the experiments behind Sheaf's mechanisms, on
//! the real servers, each measuring Sheaf and the design it replaces (docs/benchmarks.md).
//!
//! Starts the services (Postgres, ClickHouse, RabbitMQ and NATS, like `test`, and stops only what
//! it started), builds the `sheaf` binary when a scenario spawns it, then runs the `sheaf-bench`
//! binary of the `sheaf-benches` crate with the servers' URLs in the environment. Full runs build in release;
//! `--quick` runs in the dev profile, so CI reuses the artifacts of the test build instead of
//! compiling the workspace a second time. Results go to `target/bench/<scenario>.json` and `.svg`.

use crate::process::{run_step, target_dir, workspace_root};
use crate::services;
use anyhow::{Context, bail};
use std::process::{Command, ExitCode};

/// Every scenario the bench binary knows, in the order `all` runs them, and those that spawn
/// `sheaf` processes, so the binary must be built first.
use sheaf_testenv::scenarios::{BENCH as SCENARIOS, BENCH_SPAWNING_SHEAF as SPAWNS_SHEAF};

/// `cargo xtask bench …`: parses the arguments, starts the services, runs, stops what it started.
pub fn bench(args: &[&str]) -> anyhow::Result<ExitCode> {
    let quick = args.contains(&"--quick");
    let names: Vec<&str> = args.iter().copied().filter(|a| *a != "--quick").collect();
    if names.is_empty() {
        bail!("name a scenario ({}) or `all`", SCENARIOS.join(", "));
    }
    for name in &names {
        if *name != "all" && !SCENARIOS.contains(name) {
            bail!(
                "unknown scenario `{name}`; expected one of {} or `all`",
                SCENARIOS.join(", ")
            );
        }
    }
    // These measure the log on the ClickHouse cluster (beside the single server in `delivery`
    // and `burst`), and `delivery` the JetStream queue on the NATS cluster: `--cluster` starts
    // both.
    let cluster = names
        .iter()
        .any(|n| matches!(*n, "delivery" | "burst" | "clickhouse-insert" | "all"));
    let env = services::up(cluster)?;
    env.print();
    let outcome = run(&env, &names, quick);
    let stopped = services::stop(env.started);
    let passed = outcome?;
    stopped.context("the benchmarks ran, but stopping the services failed")?;
    Ok(if passed {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}

/// Runs the named scenarios (or `all`) against running services; `Ok(false)` when one failed.
pub fn run(env: &services::ServicesEnv, names: &[&str], quick: bool) -> anyhow::Result<bool> {
    let root = workspace_root();
    let profile_args: &[&str] = if quick { &[] } else { &["--release"] };
    let mut sheaf_bin = None;
    if names
        .iter()
        .any(|n| *n == "all" || SPAWNS_SHEAF.contains(n))
    {
        let mut build = cargo(&["build", "--package", "sheaf-server", "--bin", "sheaf"]);
        build.args(profile_args);
        if !run_step(&mut build)? {
            return Ok(false);
        }
        sheaf_bin = Some(
            target_dir()
                .join(if quick { "debug" } else { "release" })
                .join("sheaf"),
        );
    }

    let mut cmd = cargo(&["run", "--package", "sheaf-benches", "--bin", "sheaf-bench"]);
    cmd.args(profile_args).arg("--").args(names);
    if quick {
        cmd.arg("--quick");
    }
    cmd.arg("--out").arg(root.join("target").join("bench"));
    cmd.envs(env.vars.iter().map(|(k, v)| (k, v)));
    if let Some(bin) = &sheaf_bin {
        cmd.env(sheaf_testenv::BENCH_SHEAF_BIN_VAR, bin);
    }
    run_step(&mut cmd)
}

fn cargo(args: &[&str]) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.args(args).current_dir(workspace_root());
    cmd
}
