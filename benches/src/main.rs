//! `sheaf-bench <scenario>|all [--quick] [--out DIR]`: the experiments Sheaf's coalescing comes
//! from (docs/benchmarks.md), reproduced on the real servers with Sheaf and the design it
//! replaces side by side in one run.
//!
//! Run it through `cargo xtask bench`, which starts Postgres, ClickHouse, RabbitMQ and NATS and
//! passes their URLs in `SHEAF_TEST_POSTGRES_URL`, `SHEAF_TEST_CLICKHOUSE_URL`,
//! `SHEAF_TEST_RABBITMQ_URL` and `SHEAF_TEST_NATS_URL` (and the `sheaf` binary in
//! `SHEAF_BENCH_SHEAF_BIN`). Each scenario prints its table, and writes the raw results to
//! `<out>/<scenario>.json` and a plot to `<out>/<scenario>.svg` (`target/bench/` by default).
//! `--quick` runs every scenario at a size that finishes in seconds, to prove it still works;
//! nothing here ever fails because of a timing, only because a step could not run.

mod ch;
mod context;
mod load;
mod pg;
mod plot;
mod proc;
mod profile;
mod progress;
mod report;
mod scenarios;
mod sheaf;

use std::process::ExitCode;

use anyhow::{Context as _, bail};

use crate::context::Ctx;

const USAGE: &str = "\
usage: sheaf-bench <scenario>|all [--quick] [--out DIR]

scenarios:
  lookup     latest-attempt lookups: server CPU, bytes and lookups/s per key, single vs batched, two ClickHouse layouts and Postgres
  parts      ClickHouse parts from 10 writers: write coalescer waits of 0, 500 ms, 2 s and server-side async_insert
  queue      100,000 no-op jobs on Postgres: Sheaf's leased queue vs savepoints, 1/4/16 workers
  delivery   publish to a local receiver through `sheaf`: events/s and latency, memory vs Postgres + ClickHouse
  burst      the retry-lookup experiment's failing-webhook burst through `sheaf`: lookup batching off, fixed, adaptive
  cdc        Postgres inserts to changes through the CDC reader: row per message vs batch_transactions
  destinations  events/s through `sheaf` to each destination type side by side: webhook, RabbitMQ, NATS JetStream
  memory     `sheaf` on its memory backends under a 10-minute flood: RSS at the end vs after the first minute
  clickhouse-insert  batches to the ClickHouse cluster: one INSERT to the Distributed table vs one per replica of each shard

environment: SHEAF_TEST_POSTGRES_URL, SHEAF_TEST_CLICKHOUSE_URL, SHEAF_TEST_RABBITMQ_URL, SHEAF_TEST_NATS_URL,
  SHEAF_TEST_CLICKHOUSE_CLUSTER, SHEAF_TEST_CLICKHOUSE_CLUSTER_NODES, SHEAF_BENCH_SHEAF_BIN (set by `cargo xtask bench`)
";

fn main() -> ExitCode {
    match try_main() {
        Ok(code) => code,
        Err(err) => {
            eprintln!("sheaf-bench: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

fn try_main() -> anyhow::Result<ExitCode> {
    let mut quick = false;
    let mut out = None;
    let mut names = Vec::new();
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--quick" => quick = true,
            "--out" => out = Some(args.next().context("--out needs a directory")?),
            "-h" | "--help" | "help" => {
                print!("{USAGE}");
                return Ok(ExitCode::SUCCESS);
            }
            name if !name.starts_with('-') => names.push(name.to_owned()),
            other => {
                eprint!("{USAGE}");
                bail!("unknown option `{other}`")
            }
        }
    }
    let selected: Vec<&str> = match names.as_slice() {
        [] => {
            eprint!("{USAGE}");
            bail!("name a scenario, or `all`")
        }
        [all] if all == "all" => scenarios::NAMES.to_vec(),
        names => {
            for name in names {
                if !scenarios::NAMES.contains(&name.as_str()) {
                    eprint!("{USAGE}");
                    bail!("unknown scenario `{name}`");
                }
            }
            names.iter().map(String::as_str).collect()
        }
    };
    let ctx = Ctx::from_env(quick, out)?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    let mut failed = Vec::new();
    for name in selected {
        eprintln!("sheaf-bench: {name}{}", if quick { " (quick)" } else { "" });
        let started = std::time::Instant::now();
        match runtime.block_on(scenarios::run(name, &ctx)) {
            Ok(report) => {
                report.print();
                let written = report.write(&ctx, started.elapsed())?;
                eprintln!(
                    "sheaf-bench: {name} done in {:.1} s; wrote {}",
                    started.elapsed().as_secs_f64(),
                    written.join(", ")
                );
            }
            Err(err) => {
                eprintln!("sheaf-bench: {name} failed: {err:#}");
                failed.push(name);
            }
        }
    }
    if failed.is_empty() {
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("sheaf-bench: failed: {}", failed.join(", "));
        Ok(ExitCode::FAILURE)
    }
}
