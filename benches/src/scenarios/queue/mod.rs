//! `queue`: burning down no-op jobs on Postgres, Sheaf's lease queue against the savepoint
//! design it replaces (docs/benchmarks.md, "`queue`", with its earlier measurements), with 1, 4
//! and 16 workers, in the same run.
//!
//! - **Sheaf**: `PostgresJobQueue` driven the way the service's engine drives it: one dispatcher
//!   claims (`UPDATE … FOR UPDATE SKIP LOCKED … RETURNING`, a lease, no transaction held) only
//!   as many jobs as the channel to the workers has free slots (capacity = workers, as
//!   `SHEAF_DELIVERY_WORKERS` sizes it); workers take jobs from the channel and hand their
//!   outcome to one completer, which deletes the finished jobs in one statement per 5 ms or 256
//!   jobs (the service's `SHEAF_COMPLETER_*` defaults).
//! - **Savepoints**: each worker, on its own connection, opens a transaction, claims 10 due jobs
//!   with `SELECT … FOR UPDATE SKIP LOCKED`, and completes each inside its own `SAVEPOINT`
//!   (`DELETE`, `RELEASE`), then commits: one MultiXact per job, as in the production queue the
//!   lease design comes from.
//!
//! Every run starts from the same 100,000 due jobs (full size) in a fresh table state
//! (`TRUNCATE`, insert, `VACUUM ANALYZE`), in a schema of its own per design. Throughput is wall
//! time from the first claim to the last completion. While it runs, `pg_stat_activity` is
//! sampled every 10 ms for the run's own connections (tagged by `application_name`), counting
//! active backends per wait event, MultiXact LWLock waits among them.
//!
//! Then the sustained phase (`sustained.rs`): jobs offered at a steady rate for minutes, with
//! the claim as the earlier statement (joined to its subquery), as the one Sheaf ships (ids
//! picked in an init plan) and as a candidate pinned to the index (`claim_jobs`, defined in
//! `sustained.rs`), side by side.
//!
//! `measure.rs` runs the burn-down of each design, `sustained.rs` the sustained phase, and
//! `report.rs` builds the tables and the figure of both.

mod measure;
mod report;
mod sustained;

use measure::{fill, run_savepoint, run_sheaf};
use report::build_report;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use serde::Serialize;

use crate::context::Ctx;
use crate::pg::PgSchema;
use crate::progress::Progress;
use crate::report::Report;

const QUESTION: &str = "How fast do 1, 4 and 16 workers burn down 100,000 no-op jobs on Postgres \
    with Sheaf's queue (leases, one claimer, batched completion) and with the savepoint design \
    it replaces, and which waits show up?";

/// Jobs per claim in the savepoint design: 10, as in the hand measurement of both designs
/// (docs/benchmarks.md, "`queue`", earlier measurements).
const SAVEPOINT_CLAIM: i64 = 10;
/// The service's defaults for the completer (`SHEAF_COMPLETER_FLUSH_INTERVAL`, `…_MAX_BATCH`).
pub(super) const COMPLETER_INTERVAL: Duration = Duration::from_millis(5);
pub(super) const COMPLETER_MAX: usize = 256;
const LEASE: Duration = Duration::from_secs(60);
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Design {
    Savepoint,
    Sheaf,
}

impl Design {
    fn label(self) -> &'static str {
        match self {
            Design::Savepoint => "savepoint per job",
            Design::Sheaf => "Sheaf: leases, one claimer, batched completion",
        }
    }
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    design: Design,
    workers: usize,
    jobs: u64,
    seconds: f64,
    jobs_per_s: f64,
    /// Claim statements (Sheaf) or claiming transactions (savepoints).
    claims: u64,
    samples: u64,
    /// Active backends seen per wait event (`type:event`), summed over the samples.
    waits: BTreeMap<String, u64>,
    multixact_waits: u64,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let jobs: i64 = ctx.size(100_000, 2_000);
    let worker_counts = [1usize, 4, 16];
    crate::proc::reset_peak_rss();
    let url = ctx.postgres()?;
    let sheaf_schema = PgSchema::new(url, "bench_queue_sheaf");
    let savepoint_schema = PgSchema::new(url, "bench_queue_savepoint");
    for schema in [&sheaf_schema, &savepoint_schema] {
        let stores = sheaf_postgres::PostgresStores::new(schema.config(2))?;
        stores.migrate().await?;
        stores.close().await;
    }

    let progress = Progress::new(
        "queue: 6 runs",
        jobs as u64 * worker_counts.len() as u64 * 2,
    );
    let progress = Arc::new(progress);
    let mut measured = Vec::new();
    for workers in worker_counts {
        for design in [Design::Savepoint, Design::Sheaf] {
            let schema = match design {
                Design::Savepoint => &savepoint_schema,
                Design::Sheaf => &sheaf_schema,
            };
            fill(schema, jobs).await?;
            let m = match design {
                Design::Savepoint => run_savepoint(schema, jobs, workers, &progress).await,
                Design::Sheaf => run_sheaf(schema, jobs, workers, &progress).await,
            }
            .with_context(|| format!("{} with {workers} workers", design.label()))?;
            measured.push(m);
        }
    }
    progress.finish();
    let peak = crate::proc::peak_rss_kib(None);
    let plan = sustained::plan(ctx);
    let sustained = sustained::run(url, plan).await?;
    let mut report = build_report(ctx, jobs, measured, peak);
    report.tables.extend(report::tables(&sustained, plan));
    report.note(
        "Sustained: claim and completion means are pg_stat_statements total_exec_time per call \
         over each window (deltas, filtered by the run's schema); dead and live tuples are \
         pg_stat_user_tables; the server's autovacuum_naptime bounds how often autovacuum visits \
         the table.",
    );
    if let serde_json::Value::Object(raw) = &mut report.raw {
        raw.insert(
            "sustained".to_owned(),
            serde_json::json!({ "plan": plan, "runs": sustained }),
        );
    }
    Ok(report)
}
