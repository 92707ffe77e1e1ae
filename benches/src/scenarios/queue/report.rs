//! The `queue` scenario's report: the burn-down's table and figure, and the sustained phase's
//! tables (one row per window of the run, the three claims side by side), built from what
//! `measure.rs` and `sustained.rs` measured.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::context::Ctx;
use crate::pg::StatementTotals;
use crate::plot::{Bar, Figure, Panel};
use crate::report::{self, PeakRss, Report, Table};

use super::sustained::{Claim, PROCESSES, Plan, Sustained, WORKERS};
use super::{Design, Measured, QUESTION, SAMPLE_EVERY};

/// The three most frequent wait events other than plain running, as `event (n)`.
fn top_waits(waits: &BTreeMap<String, u64>) -> String {
    let mut list: Vec<(&String, &u64)> = waits
        .iter()
        .filter(|(k, _)| k.as_str() != "CPU:running")
        .collect();
    list.sort_by(|a, b| b.1.cmp(a.1));
    let shown: Vec<String> = list
        .iter()
        .take(3)
        .map(|(k, n)| format!("{k} ({n})"))
        .collect();
    if shown.is_empty() {
        "—".to_owned()
    } else {
        shown.join(", ")
    }
}

pub(super) fn build_report(
    ctx: &Ctx,
    jobs: i64,
    measured: Vec<Measured>,
    peak_kib: Option<u64>,
) -> Report {
    let mut report = Report::new("queue", QUESTION, ctx);
    let find = |design: Design, workers: usize| {
        measured
            .iter()
            .find(|m| m.design == design && m.workers == workers)
    };
    let mut table = Table::new(
        format!(
            "{} no-op jobs per run, wall time from first claim to last completion; waits sampled every {} ms",
            report::count(jobs as f64),
            SAMPLE_EVERY.as_millis()
        ),
        &[
            "workers",
            "savepoint jobs/s",
            "Sheaf jobs/s",
            "Sheaf ÷ savepoint",
            "MultiXact LWLock waits (savepoint / Sheaf)",
            "top waits, savepoint",
            "top waits, Sheaf",
        ],
    );
    let mut workers_seen: Vec<usize> = measured.iter().map(|m| m.workers).collect();
    workers_seen.dedup();
    for workers in &workers_seen {
        let (Some(s), Some(q)) = (
            find(Design::Savepoint, *workers),
            find(Design::Sheaf, *workers),
        ) else {
            continue;
        };
        table.row(vec![
            workers.to_string(),
            report::count(s.jobs_per_s),
            report::count(q.jobs_per_s),
            report::ratio(q.jobs_per_s / s.jobs_per_s),
            format!("{} / {}", s.multixact_waits, q.multixact_waits),
            top_waits(&s.waits),
            top_waits(&q.waits),
        ]);
    }
    report.tables.push(table);
    if let (Some(s), Some(q)) = (find(Design::Savepoint, 16), find(Design::Sheaf, 16)) {
        let ratio = q.jobs_per_s / s.jobs_per_s;
        report.target(
            "queue throughput at 16 workers, Sheaf against savepoints",
            "at least 3.5x",
            format!(
                "{} vs {} jobs/s = {}",
                report::count(q.jobs_per_s),
                report::count(s.jobs_per_s),
                report::ratio(ratio)
            ),
            ratio >= 3.5,
        );
    }
    report.memory.push(PeakRss::new(
        "sheaf-bench (Sheaf's queue client, in process)",
        peak_kib,
    ));
    report.note(
        "Postgres cost is wall time at saturation (jobs/s over the whole burn-down), not \
         pg_stat_statements; the bench process, its workers and Postgres share the 2 cores.",
    );
    report.note(
        "Waits count active backends of the run per pg_stat_activity sample; CPU:running is a \
         backend with no wait event (on CPU, or between statements).",
    );
    let series = |design: Design| {
        (
            design.label().to_owned(),
            measured
                .iter()
                .filter(|m| m.design == design)
                .map(|m| (m.workers as f64, m.jobs_per_s))
                .collect::<Vec<_>>(),
        )
    };
    report.figure = Some(
        Figure::new("queue: no-op jobs burned down on Postgres")
            .panel(Panel::Lines {
                title: "jobs per second by workers".to_owned(),
                x_label: "workers".to_owned(),
                y_label: "jobs/s".to_owned(),
                log_y: false,
                series: vec![series(Design::Savepoint), series(Design::Sheaf)],
            })
            .panel(Panel::Bars {
                title: "MultiXact LWLock waits sampled".to_owned(),
                unit: "active backends waiting, summed over samples".to_owned(),
                log: false,
                bars: measured
                    .iter()
                    .map(|m| {
                        Bar::new(
                            format!(
                                "{}, {} workers",
                                match m.design {
                                    Design::Savepoint => "savepoint",
                                    Design::Sheaf => "Sheaf",
                                },
                                m.workers
                            ),
                            m.multixact_waits as f64,
                            m.design as usize,
                        )
                    })
                    .collect(),
            }),
    );
    report.raw = serde_json::json!({ "jobs": jobs, "runs": measured });
    report
}

/// What one window of samples shows.
#[derive(Debug, Clone, Copy, Serialize)]
struct Window {
    pub until_s: f64,
    pub claim_mean_ms: f64,
    pub claim_blocks: f64,
    pub complete_mean_ms: f64,
    pub completed_per_s: f64,
    pub peak_dead_tuples: i64,
    pub live_tuples: i64,
    pub jobs_due_bytes: i64,
    pub autovacuums: i64,
}

/// The samples of `run` cut into windows of `window_s` seconds.
fn windows(run: &Sustained, window_s: u64) -> Vec<Window> {
    let mut out = Vec::new();
    let Some(first) = run.samples.first() else {
        return out;
    };
    let mut start = *first;
    let mut peak_dead = first.dead_tuples;
    for s in &run.samples[1..] {
        peak_dead = peak_dead.max(s.dead_tuples);
        let last = std::ptr::eq(s, run.samples.last().unwrap_or(s));
        if s.seconds - start.seconds + 0.5 < window_s as f64 && !last {
            continue;
        }
        let claim = s.claim.since(start.claim);
        let complete = s.complete.since(start.complete);
        let per = |t: StatementTotals, v: f64| if t.calls > 0 { v / t.calls as f64 } else { 0.0 };
        out.push(Window {
            until_s: s.seconds,
            claim_mean_ms: per(claim, claim.exec_ms),
            claim_blocks: per(claim, claim.blocks as f64),
            complete_mean_ms: per(complete, complete.exec_ms),
            completed_per_s: (s.completed - start.completed) as f64
                / (s.seconds - start.seconds).max(0.001),
            peak_dead_tuples: peak_dead,
            live_tuples: s.live_tuples,
            jobs_due_bytes: s.jobs_due_bytes,
            autovacuums: s.autovacuums - first.autovacuums,
        });
        start = *s;
        peak_dead = s.dead_tuples;
    }
    out
}

/// The per-window table's columns after "until", each showing every run's value.
const COLUMNS: [&str; 7] = [
    "claim mean",
    "blocks per claim",
    "completion mean",
    "jobs/s done",
    "peak dead tuples",
    "live rows at end",
    "jobs_due at end",
];

/// One run's cells of one window, in [`COLUMNS`]' order.
fn cells(w: &Window) -> [String; 7] {
    [
        report::millis(w.claim_mean_ms),
        format!("{:.0}", w.claim_blocks),
        report::millis(w.complete_mean_ms),
        report::count(w.completed_per_s),
        report::count(w.peak_dead_tuples as f64),
        report::count(w.live_tuples as f64),
        report::bytes(w.jobs_due_bytes as f64),
    ]
}

/// The side-by-side tables: per window, then a summary per configuration, in [`Claim::ALL`]'s
/// order.
pub(super) fn tables(runs: &[Sustained], plan: Plan) -> Vec<Table> {
    let runs: Vec<&Sustained> = Claim::ALL
        .iter()
        .filter_map(|c| runs.iter().find(|r| r.claim == *c))
        .collect();
    if runs.is_empty() {
        return Vec::new();
    }
    let all: Vec<Vec<Window>> = runs.iter().map(|r| windows(r, plan.window_s)).collect();
    let names: Vec<&str> = runs.iter().map(|r| r.claim.short()).collect();
    let what = |c: Claim| c.label().split_once(": ").map_or("", |(_, what)| what);
    let legend: Vec<String> = runs
        .iter()
        .map(|r| format!("{} = {}", r.claim.short(), what(r.claim)))
        .collect();
    let headers: Vec<String> = std::iter::once("until".to_owned())
        .chain(COLUMNS.map(|c| format!("{c}, {}", names.join(" / "))))
        .collect();
    let mut per_window = Table::new(
        format!(
            "Sustained: {} jobs/s offered for {} s per configuration by {PROCESSES} processes \
             (one claimer, {WORKERS} no-op workers, one completer each), sampled every {} s; \
             per {} s window ({})",
            report::count(plan.rate),
            plan.seconds,
            plan.sample_s,
            plan.window_s,
            legend.join("; ")
        ),
        &headers.iter().map(String::as_str).collect::<Vec<_>>(),
    );
    for i in 0..all.iter().map(Vec::len).min().unwrap_or(0) {
        let each: Vec<[String; 7]> = all.iter().map(|ws| cells(&ws[i])).collect();
        let mut row = vec![format!("{:.0} s", all[0][i].until_s)];
        row.extend((0..COLUMNS.len()).map(|k| {
            let values: Vec<&str> = each.iter().map(|c| c[k].as_str()).collect();
            values.join(" / ")
        }));
        per_window.row(row);
    }
    let mut summary = Table::new(
        "Sustained, whole run per configuration (claim means from pg_stat_statements deltas)",
        &[
            "claim",
            "jobs/s done (offered)",
            "left in the queue",
            "claim mean, first window",
            "claim mean, last window",
            "last ÷ first",
            "worst window",
            "peak dead tuples",
            "peak jobs_due",
            "autovacuum runs",
        ],
    );
    for (run, ws) in runs.iter().zip(&all) {
        let (Some(first), Some(last), Some(end)) = (ws.first(), ws.last(), run.samples.last())
        else {
            continue;
        };
        let worst = ws.iter().map(|w| w.claim_mean_ms).fold(0.0, f64::max);
        let peak_dead = run.samples.iter().map(|s| s.dead_tuples).max().unwrap_or(0);
        let peak_index = run
            .samples
            .iter()
            .map(|s| s.jobs_due_bytes)
            .max()
            .unwrap_or(0);
        summary.row(vec![
            run.claim.label().to_owned(),
            format!(
                "{} ({})",
                report::count(end.completed as f64 / end.seconds.max(0.001)),
                report::count(run.offered_per_s)
            ),
            report::count(end.enqueued.saturating_sub(end.completed) as f64),
            report::millis(first.claim_mean_ms),
            report::millis(last.claim_mean_ms),
            report::ratio(last.claim_mean_ms / first.claim_mean_ms),
            report::millis(worst),
            report::count(peak_dead as f64),
            report::bytes(peak_index as f64),
            (end.autovacuums - run.samples[0].autovacuums).to_string(),
        ]);
    }
    vec![per_window, summary]
}
