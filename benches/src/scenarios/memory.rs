//! `memory`: the embedded stores' memory and disk under a flood. One `sheaf serve` (the binary
//! `cargo xtask bench` built) on the SQLite file, as a new user starts it (no store settings:
//! the default retention of 25,000 events), or on the in-memory stores with
//! `SHEAF_BENCH_MEMORY_STORE=memory`, one tenant, one
//! webhook destination on a loopback receiver answering 200, and 32 closed-loop publishers, each
//! publishing unique ids as fast as its answers come back until a deadline. The process's RSS
//! (`VmRSS`) is sampled every second; the target compares the RSS at the end of the flood with
//! the RSS after its first minute (the log is full by then: 25,000 events take a few seconds at
//! the saturated rate), so it fails when memory follows the traffic instead of the retention.
//! On SQLite the database file (`sheaf.db` and its write-ahead log) is sampled too, and compared
//! the same way: retention must reuse the space it frees.
//!
//! The receiver forgets what it recorded every second (it keeps every delivery's headers and
//! body otherwise, which is the bench's memory, not sheaf's), so delivered counts come from
//! sheaf's `/metrics` (`sheaf_deliveries_total{outcome="success"}`). At the end, the events and
//! attempts the log retained are counted through the API's listings.
//!
//! The bytes each retained event costs are not measured here (RSS includes the allocator's
//! slack and everything else the process holds): `benches/benches/memory_footprint.rs` counts
//! them with a counting allocator.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, ensure};
use serde::Serialize;
use sheaf_testenv::receiver::Receiver;

use crate::context::Ctx;
use crate::plot::{Figure, Panel};
use crate::progress::Progress;
use crate::report::{self, PeakRss, Report, Table};
use crate::sheaf::{Publisher, Sheaf, metric};

use super::delivery::PAD_BYTES;

const QUESTION: &str = "Do the RSS of `sheaf serve` on its embedded stores (the SQLite file, or \
    the memory backends; default retention) and the size of its file follow the retention \
    settings rather than the traffic, under a flood of publishes at the saturated rate?";

/// Which embedded store the flood runs on (`sqlite`, the default, or `memory`).
const STORE_VAR: &str = "SHEAF_BENCH_MEMORY_STORE";

/// The embedded store under the flood.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
enum Store {
    Sqlite,
    Memory,
}

impl Store {
    fn from_env() -> anyhow::Result<Self> {
        match std::env::var(STORE_VAR).as_deref() {
            Err(_) | Ok("sqlite") => Ok(Store::Sqlite),
            Ok("memory") => Ok(Store::Memory),
            Ok(other) => {
                anyhow::bail!("{STORE_VAR}: unknown store `{other}`; expected sqlite or memory")
            }
        }
    }

    fn label(self) -> &'static str {
        match self {
            Store::Sqlite => "the SQLite store",
            Store::Memory => "the memory backends",
        }
    }

    /// The RSS at the end may be at most this multiple of the baseline: the SQLite store's
    /// target (its issue's) is tighter, as its log and queue are on disk.
    fn max_growth(self) -> f64 {
        match self {
            Store::Sqlite => 1.2,
            Store::Memory => MAX_GROWTH,
        }
    }
}

/// The SQLite file at the end may be at most this multiple of its size at the baseline.
const MAX_FILE_GROWTH: f64 = 1.5;

/// The tenant the flood publishes to.
const TENANT: &str = "bench";

/// The RSS at the end of the flood may be at most this multiple of the RSS after its first
/// minute (docs/benchmarks.md, "Targets at a glance").
const MAX_GROWTH: f64 = 1.5;

/// How long the scenario waits, after the deadline, for the backlog to be worked off: a backlog
/// the flood left behind is reported, not waited for (at the saturated rate the publishers
/// outrun the deliveries, and the backlog can take longer than the flood to work off).
const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);

/// What `/metrics` says about the deliveries.
#[derive(Debug, Clone, Copy, Default, Serialize)]
struct Deliveries {
    /// `sheaf_deliveries_total{outcome="success"}`.
    success: f64,
    /// `sheaf_deliveries_total{outcome="event_missing"}`: jobs dropped because their event had
    /// left the log before they ran.
    event_missing: f64,
    /// `sheaf_queue_jobs{state="due"}`: the backlog.
    due: f64,
}

impl Deliveries {
    async fn read(sheaf: &Sheaf) -> anyhow::Result<Self> {
        let page = sheaf.metrics().await?;
        Ok(Deliveries {
            success: metric(&page, "sheaf_deliveries_total", "outcome=\"success\""),
            event_missing: metric(&page, "sheaf_deliveries_total", "outcome=\"event_missing\""),
            due: metric(&page, "sheaf_queue_jobs", "state=\"due\""),
        })
    }
}

#[derive(Debug, Clone, Copy, Serialize)]
struct Sizes {
    flood_seconds: u64,
    /// When the baseline RSS is read, in seconds after the first publish.
    baseline_seconds: u64,
    publishers: usize,
    pad_bytes: usize,
}

/// One second of the flood.
#[derive(Debug, Clone, Copy, Serialize)]
struct Sample {
    /// Seconds since the first publish.
    at_s: f64,
    rss_kib: u64,
    /// Publishes answered 202 so far.
    published: u64,
    /// The SQLite file and its write-ahead log (0 on the memory backends).
    file_kib: u64,
    /// `sheaf_deliveries_total{outcome="success"}` growth since the flood began.
    delivered: f64,
    /// Jobs due in the queue.
    due: f64,
}

/// What the publishers did, counted by all of them together.
#[derive(Debug, Default)]
struct Counts {
    accepted: AtomicU64,
    refused: AtomicU64,
    errors: AtomicU64,
}

#[derive(Debug, Clone, Serialize)]
struct Measured {
    samples: Vec<Sample>,
    store: Store,
    rss_start_kib: u64,
    rss_baseline_kib: u64,
    rss_end_kib: u64,
    file_baseline_kib: u64,
    file_end_kib: u64,
    /// After the publishers stopped and every accepted event was delivered.
    rss_drained_kib: u64,
    peak_rss_kib: u64,
    flood_s: f64,
    accepted: u64,
    refused: u64,
    errors: u64,
    /// Delivered within the flood (metrics growth at its deadline).
    delivered_in_flood: f64,
    /// Delivered at the end (after at most [`DRAIN_TIMEOUT`] of draining).
    delivered: f64,
    /// Jobs dropped because their event had left the log, at the end.
    event_missing: f64,
    /// Jobs still due at the end of the flood, and at the end.
    due_at_deadline: f64,
    due_at_end: f64,
    retained_events: usize,
    retained_attempts: usize,
}

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let sizes = Sizes {
        flood_seconds: ctx.size(600, 20),
        baseline_seconds: ctx.size(60, 5),
        publishers: 32,
        pad_bytes: PAD_BYTES,
    };
    let store = Store::from_env()?;
    let bin = ctx.sheaf_bin()?.to_path_buf();
    let log = ctx.out_dir.join("logs").join("memory.log");
    let data_dir = ctx.out_dir.join("memory-data");
    let receiver = Receiver::start().await?;
    // Default retention; the store chosen by its one setting (the harness's own default is
    // the memory backends, so SQLite is named), in a data directory of the run's own.
    let env = match store {
        Store::Sqlite => {
            if data_dir.exists() {
                std::fs::remove_dir_all(&data_dir)?;
            }
            vec![
                ("SHEAF_LOG_STORE", "sqlite".to_owned()),
                ("SHEAF_DATA_DIR", data_dir.display().to_string()),
            ]
        }
        Store::Memory => Vec::new(),
    };
    let sheaf = Sheaf::start(&bin, &env, &log).await?;
    let file = (store == Store::Sqlite).then(|| data_dir.join("sheaf.db"));
    let outcome = flood(&sheaf, &receiver, &sizes, store, file.as_deref()).await;
    sheaf.stop().await?;
    let measured = outcome.with_context(|| format!("sheaf's log: {}", log.display()))?;
    Ok(build_report(ctx, &sizes, &measured))
}

/// The database file and its write-ahead log, in KiB; 0 without a file.
fn file_kib(file: Option<&std::path::Path>) -> u64 {
    let Some(file) = file else { return 0 };
    let len = |path: &std::path::Path| std::fs::metadata(path).map_or(0, |m| m.len());
    let wal = file.with_extension("db-wal");
    (len(file) + len(&wal)) / 1024
}

async fn flood(
    sheaf: &Sheaf,
    receiver: &Receiver,
    sizes: &Sizes,
    store: Store,
    file: Option<&std::path::Path>,
) -> anyhow::Result<Measured> {
    sheaf.add_destination(TENANT, &receiver.url()).await?;
    let before = Deliveries::read(sheaf).await?;
    let rss_start_kib = sheaf.rss_kib().unwrap_or(0);
    let progress = Progress::new("memory: flood seconds", sizes.flood_seconds);
    let counts = Arc::new(Counts::default());
    let base = Instant::now();
    let deadline = base + Duration::from_secs(sizes.flood_seconds);
    let publishers: Vec<_> = (0..sizes.publishers)
        .map(|index| {
            let publisher = sheaf.publisher(TENANT);
            let counts = Arc::clone(&counts);
            let pad = "x".repeat(sizes.pad_bytes);
            let stride = sizes.publishers as u64;
            tokio::spawn(async move {
                publish_until(&publisher, index as u64, stride, &pad, deadline, &counts).await;
            })
        })
        .collect();
    let mut samples = Vec::new();
    let mut rss_baseline_kib = None;
    let mut file_baseline_kib = None;
    let mut next = base;
    while next < deadline {
        next += Duration::from_secs(1);
        tokio::time::sleep_until(next.into()).await;
        // The receiver keeps every delivery it answered: forget them, they are not sheaf's memory.
        receiver.reset();
        let rss_kib = sheaf.rss_kib().unwrap_or(0);
        let now = Deliveries::read(sheaf).await?;
        let sample = Sample {
            at_s: base.elapsed().as_secs_f64(),
            rss_kib,
            published: counts.accepted.load(Ordering::Relaxed),
            file_kib: file_kib(file),
            delivered: now.success - before.success,
            due: now.due,
        };
        if rss_baseline_kib.is_none() && sample.at_s >= sizes.baseline_seconds as f64 {
            rss_baseline_kib = Some(sample.rss_kib);
            file_baseline_kib = Some(sample.file_kib);
        }
        samples.push(sample);
        progress.inc(1);
    }
    let rss_end_kib = sheaf.rss_kib().unwrap_or(0);
    let file_end_kib = file_kib(file);
    let at_deadline = Deliveries::read(sheaf).await?;
    let delivered_in_flood = at_deadline.success - before.success;
    for publisher in publishers {
        publisher.await.context("a publisher panicked")?;
    }
    let flood_s = base.elapsed().as_secs_f64();
    progress.finish();
    let accepted = counts.accepted.load(Ordering::Relaxed);
    let drain_until = Instant::now() + DRAIN_TIMEOUT;
    let handled =
        |d: &Deliveries| d.success + d.event_missing - before.success - before.event_missing;
    let mut end = Deliveries::read(sheaf).await?;
    while handled(&end) < accepted as f64 && Instant::now() < drain_until {
        receiver.reset();
        tokio::time::sleep(Duration::from_millis(200)).await;
        end = Deliveries::read(sheaf).await?;
    }
    receiver.reset();
    let rss_drained_kib = sheaf.rss_kib().unwrap_or(0);
    let retained_events = count_listing(sheaf, "events").await?;
    let retained_attempts = count_listing(sheaf, "attempts").await?;
    Ok(Measured {
        samples,
        store,
        rss_start_kib,
        rss_baseline_kib: rss_baseline_kib.unwrap_or(rss_end_kib),
        rss_end_kib,
        file_baseline_kib: file_baseline_kib.unwrap_or(file_end_kib),
        file_end_kib,
        rss_drained_kib,
        peak_rss_kib: sheaf.peak_rss_kib().unwrap_or(0),
        flood_s,
        accepted,
        refused: counts.refused.load(Ordering::Relaxed),
        errors: counts.errors.load(Ordering::Relaxed),
        delivered_in_flood,
        delivered: end.success - before.success,
        event_missing: end.event_missing - before.event_missing,
        due_at_deadline: at_deadline.due,
        due_at_end: end.due,
        retained_events,
        retained_attempts,
    })
}

/// One closed-loop publisher: publishes `first`, `first + stride`, … (ids no other publisher
/// uses) until `deadline`, one at a time, allocating nothing per event beyond the request.
async fn publish_until(
    publisher: &Publisher,
    first: u64,
    stride: u64,
    pad: &str,
    deadline: Instant,
    counts: &Counts,
) {
    let mut seq = first;
    while Instant::now() < deadline {
        let counter = match publisher.publish(seq, pad).await {
            Ok(true) => &counts.accepted,
            Ok(false) => &counts.refused,
            Err(_) => &counts.errors,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        seq += stride;
    }
}

/// How many items the tenant's listing (`events` or `attempts`) holds, paged 1,000 at a time.
async fn count_listing(sheaf: &Sheaf, what: &str) -> anyhow::Result<usize> {
    let http = reqwest::Client::new();
    let mut total = 0;
    let mut next: Option<String> = None;
    loop {
        let mut request = http
            .get(sheaf.url(&format!("/api/v1/tenants/{TENANT}/{what}")))
            .query(&[("limit", "1000")]);
        if let Some(cursor) = &next {
            request = request.query(&[("next", cursor.as_str())]);
        }
        let response = request.send().await?;
        ensure!(
            response.status().is_success(),
            "list {what}: {}",
            response.status()
        );
        let page: serde_json::Value = serde_json::from_slice(&response.bytes().await?)?;
        total += page["items"].as_array().map_or(0, Vec::len);
        match page["next"].as_str() {
            Some(cursor) if !cursor.is_empty() => next = Some(cursor.to_owned()),
            _ => return Ok(total),
        }
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1} MiB", kib as f64 / 1024.0)
}

fn build_report(ctx: &Ctx, sizes: &Sizes, m: &Measured) -> Report {
    let mut report = Report::new("memory", QUESTION, ctx);
    let ratio = m.rss_end_kib as f64 / m.rss_baseline_kib.max(1) as f64;
    let store = m.store.label();
    let mut table = Table::new(
        format!(
            "One `sheaf serve` on {store} (default retention: 25,000 events, 100,000 \
             attempts), one webhook destination on a loopback receiver, ~{} B payloads, {} \
             closed-loop publishers with unique ids for {} s; RSS sampled every second",
            sizes.pad_bytes, sizes.publishers, sizes.flood_seconds
        ),
        &[
            "RSS before",
            &format!("RSS at {} s", sizes.baseline_seconds),
            "RSS at the end",
            "end ÷ baseline",
            "RSS drained",
            "peak RSS",
            "published (events/s)",
            "delivered (events/s)",
            "retained events / attempts",
            "backlog at the end of the flood",
            "dropped (event left the log)",
        ],
    );
    table.row(vec![
        mib(m.rss_start_kib),
        mib(m.rss_baseline_kib),
        mib(m.rss_end_kib),
        report::ratio(ratio),
        mib(m.rss_drained_kib),
        mib(m.peak_rss_kib),
        format!(
            "{} ({})",
            report::count(m.accepted as f64),
            report::count(m.accepted as f64 / m.flood_s.max(1e-9))
        ),
        format!(
            "{} ({})",
            report::count(m.delivered),
            report::count(m.delivered_in_flood / sizes.flood_seconds.max(1) as f64)
        ),
        format!(
            "{} / {}",
            report::count(m.retained_events as f64),
            report::count(m.retained_attempts as f64)
        ),
        report::count(m.due_at_deadline),
        report::count(m.event_missing),
    ]);
    report.tables.push(table);
    // RSS over the flood, a row every tenth of it.
    let every = (m.samples.len() / 10).max(1);
    let mut over_time = Table::new(
        "RSS (and the SQLite file) over the flood",
        &[
            "second",
            "RSS",
            "file",
            "published",
            "delivered",
            "jobs due",
        ],
    );
    for s in m
        .samples
        .iter()
        .enumerate()
        .filter(|(i, _)| (i + 1) % every == 0)
        .map(|(_, s)| s)
    {
        over_time.row(vec![
            format!("{:.0}", s.at_s),
            mib(s.rss_kib),
            mib(s.file_kib),
            report::count(s.published as f64),
            report::count(s.delivered),
            report::count(s.due),
        ]);
    }
    report.tables.push(over_time);
    let max_growth = m.store.max_growth();
    report.target(
        &format!(
            "{store}, RSS at the end of a {} s flood (32 closed-loop publishers) vs at {} s",
            sizes.flood_seconds, sizes.baseline_seconds
        ),
        &format!("within {max_growth}x"),
        format!(
            "{} → {} = {}",
            mib(m.rss_baseline_kib),
            mib(m.rss_end_kib),
            report::ratio(ratio)
        ),
        ratio <= max_growth,
    );
    if m.store == Store::Sqlite {
        let file_ratio = m.file_end_kib as f64 / m.file_baseline_kib.max(1) as f64;
        report.target(
            &format!(
                "the SQLite file (with its write-ahead log) at the end of the flood vs at {} s",
                sizes.baseline_seconds
            ),
            &format!("within {MAX_FILE_GROWTH}x"),
            format!(
                "{} → {} = {}",
                mib(m.file_baseline_kib),
                mib(m.file_end_kib),
                report::ratio(file_ratio)
            ),
            file_ratio <= MAX_FILE_GROWTH,
        );
    }
    report.memory.push(PeakRss::new(
        format!("sheaf serve ({store}, default retention)"),
        Some(m.peak_rss_kib),
    ));
    report.note(
        "RSS is VmRSS of the sheaf process from /proc/<pid>/status, read every second; the \
         peak is its VmHWM. Published counts publishes answered 202; delivered is the growth \
         of sheaf_deliveries_total{outcome=\"success\"}, its rate over the flood alone; \
         \"drained\" is after the publishers stopped and the backlog was worked off (at most \
         30 s). \
         Retained counts page the API's event and attempt listings at the end.",
    );
    if m.event_missing > 0.0 {
        report.note(format!(
            "The publishers outran the deliveries: {} jobs were due when the flood ended ({} at \
             the end), and {} deliveries were dropped because their event had left the log \
             (retention keeps the newest 25,000) before their job ran \
             (sheaf_deliveries_total{{outcome=\"event_missing\"}}).",
            report::count(m.due_at_deadline),
            report::count(m.due_at_end),
            report::count(m.event_missing)
        ));
    }
    if m.refused + m.errors > 0 {
        report.note(format!(
            "Publishes refused: {}, failed on the network: {}.",
            m.refused, m.errors
        ));
    }
    if ctx.quick {
        report.note(
            "Quick run: a 20 s flood compared at 5 s, when the log may not be full yet; the \
             ratio proves the scenario runs, not the bound (the full run floods for 10 minutes \
             and compares with the first minute).",
        );
    }
    report.note(
        "Bytes per retained event are not measured from RSS: `cargo bench -p sheaf-benches \
         --bench memory_footprint` counts them with a counting allocator.",
    );
    report.figure = Some(
        Figure::new(format!("memory: sheaf's RSS under a flood, {store}")).panel(Panel::Lines {
            title: format!(
                "{} closed-loop publishers, ~{} B payloads, default retention",
                sizes.publishers, sizes.pad_bytes
            ),
            x_label: "second of the flood".to_owned(),
            y_label: "RSS (MiB)".to_owned(),
            log_y: false,
            series: vec![(
                "sheaf serve".to_owned(),
                m.samples
                    .iter()
                    .map(|s| (s.at_s, s.rss_kib as f64 / 1024.0))
                    .collect(),
            )],
        }),
    );
    report.raw = serde_json::json!({ "sizes": sizes, "measured": m });
    report
}
