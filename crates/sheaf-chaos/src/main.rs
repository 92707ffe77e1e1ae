//! `sheaf-chaos [SCENARIO…|all] [--quick]`: Sheaf's fault suite (docs/operations.md, "Faults, and
//! what an operator sees" and "Running the fault suite").
//!
//! Each scenario starts real `sheaf serve` processes on the fault suite's own Postgres and
//! ClickHouse, and for some its ClickHouse or NATS cluster (prepared by `cargo xtask chaos`,
//! which is how this binary is meant to run), publishes a bounded, known set of events to a
//! loopback receiver that records every delivery by `webhook-id`, injects a fault while the
//! load runs, and then checks that every accepted event was delivered (delivered ⊇ published),
//! counting duplicates:
//!
//! - `kill`: two processes share the stores; one is SIGKILLed mid-burst, and its claimed jobs
//!   come back to the other when their lease ends;
//! - `ordering`: the same crash under keys published in sequence to a destination ordered by
//!   `/data/key`, with the receiver failing every fifth request; each key's events still reach
//!   it in publish order, the killed process's jobs first once their lease ends;
//! - `postgres`: Postgres is stopped and started under load; the process reconnects by itself
//!   and `/readyz` shows the outage;
//! - `clickhouse`: ClickHouse (the log store) is stopped for 30 s (5 s with `--quick`) while
//!   deliveries fail and retry; the process's memory stays bounded and retries that cannot
//!   look up their previous attempt wait instead of failing;
//! - `clickhouse-replica`: the log on a ClickHouse cluster of 2 shards × 2 replicas, one replica
//!   SIGKILLed for 30 s (5 s with `--quick`) and started again; publishes, deliveries and
//!   searches go on, and afterwards both replicas of each shard hold every event and attempt;
//! - `nats-node`: the JetStream queue on a NATS cluster of 3 nodes (the bucket on all three), the
//!   node leading the bucket's stream SIGKILLed for 30 s (10 s with `--quick`) and started again;
//!   deliveries go on without it, every process's view of the bucket recovers, the node's replica
//!   catches up, and publishes refused during the election are counted, not lost;
//! - `sheaf-process`: three processes on that queue, one SIGKILLed mid-burst; its leased jobs
//!   come back to the two others when their lease ends, not before;
//! - `shutdown`: SIGTERM under load; in-flight deliveries finish, no claim is left behind, and
//!   a new process delivers the rest;
//! - `cdc`: the process running the CDC source is SIGKILLed while it publishes a large
//!   transaction and started again; no change is lost or published as two events;
//! - `broker`: the RabbitMQ and NATS brokers of a rabbitmq and a nats destination (the
//!   scenario's own processes) are stopped and started again under load; the process retries
//!   through the outage by itself and every event reaches both brokers;
//! - `outage`: the receiver answers 503 for 30 s under 32 closed-loop publishers, on the memory
//!   backends and on Postgres + ClickHouse; every accepted event is delivered, refusals are
//!   `503` with `Retry-After`, memory stays under its bounds, nothing spins afterwards;
//! - `disabled`: a destination is disabled automatically, 1,000 events are published while it
//!   is, and enable + replay of its dead letters delivers every one;
//! - `overload`: an open-loop generator offers twice the measured capacity for 60 s; accepted
//!   events are all delivered, the rest refused with `503`, memory and latency bounded;
//! - `secrets`: `SHEAF_SECRETS_KEY` rotated under load: both processes rolled onto a new key
//!   with the old one decrypt-only, `sheaf secrets reseal` run while they deliver, then rolled
//!   onto the new key alone; nothing fails and no row is left under the old key.
//!
//! The numbers each prints (published, delivered, duplicates, recovery time and the
//! scenario's own observations) are the ones `docs/operations.md` describes.

mod api;
mod env;
mod load;
mod report;
mod scenarios;
mod sheaf;

use std::process::ExitCode;
use std::time::Instant;

use crate::env::Ctx;
use crate::report::Report;

fn main() -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("sheaf-chaos: cannot start the tokio runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(Box::pin(try_main())) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        Err(err) => {
            eprintln!("sheaf-chaos: error: {err:#}");
            ExitCode::FAILURE
        }
    }
}

async fn try_main() -> anyhow::Result<bool> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let quick = args.iter().any(|a| a == "--quick");
    let mut names: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| *a != "--quick")
        .collect();
    if names.is_empty() || names.contains(&"all") {
        names = scenarios::NAMES.to_vec();
    }
    for name in &names {
        if !scenarios::NAMES.contains(name) {
            anyhow::bail!(
                "unknown scenario `{name}`; expected one of {} or `all`",
                scenarios::NAMES.join(", ")
            );
        }
    }
    let ctx = Ctx::from_env(quick).await?;
    println!(
        "sheaf-chaos: {} ({}), run {}",
        names.join(", "),
        if quick { "quick" } else { "full" },
        ctx.run_id
    );
    let started = Instant::now();
    let mut reports = Vec::new();
    for name in names {
        println!("\n-- {name} --");
        let began = Instant::now();
        let mut report = match scenarios::run(&ctx, name).await {
            Ok(report) => report,
            Err(err) => {
                let mut report = Report::new(scenarios::static_name(name));
                report.check(false, format!("the scenario could not run: {err:#}"));
                report
            }
        };
        report.note("scenario took", report::secs(began.elapsed()));
        report.print();
        reports.push(report);
    }
    println!(
        "\nsheaf-chaos: summary ({}, {:.0} s)",
        if quick { "quick" } else { "full" },
        started.elapsed().as_secs_f64()
    );
    println!(
        "  {:<18} {:>9} {:>9} {:>10} {:>9}  result",
        "scenario", "published", "delivered", "duplicates", "recovery"
    );
    for r in &reports {
        println!(
            "  {:<18} {:>9} {:>9} {:>10} {:>9}  {}",
            r.scenario,
            r.published,
            r.delivered,
            r.duplicates,
            r.recovery_text(),
            if r.passed() { "passed" } else { "FAILED" }
        );
    }
    Ok(reports.iter().all(Report::passed))
}
