//! The steady phase second by second, in the configurations whose queue is in Postgres: what
//! the load offered and had accepted, what the receiver got and how late, beside what the
//! `sheaf` process, the host, Postgres and ClickHouse did in that second. An earlier round saw
//! one ~3 s stall in one 5-minute run of four that nothing in sheaf's log explained
//! (`docs/benchmarks.md`, "delivery"); with this record the next one comes with the seconds
//! around it.
//!
//! The readings come from `watch.rs`; the per-event counts come afterwards, from the load's and
//! the receiver's own timestamps ([`seconds`]); [`stalls`] finds the seconds that went wrong and
//! [`stall_tables`] prints them with the seconds around them.

use std::collections::HashMap;

use serde::Serialize;

use crate::load;
use crate::report::{self, Table};

use super::watch::Tick;

/// The seconds at a phase's start not judged: connections, caches and the first parts settle.
pub const SETTLE_SECONDS: u32 = 5;
/// A second delivering less than this share of the offered rate, while the load publishes, is a
/// stall.
pub const STALL_SHARE: f64 = 0.25;
/// The publish → delivered p99, of the events published in a second, that makes it a stall
/// (the steady target's bound).
pub const STALL_P99_MS: f64 = 1_000.0;
/// The seconds printed before and after a stall.
const AROUND: u32 = 3;
/// Stalls printed per run; the rest are in the JSON.
const PRINTED_STALLS: usize = 5;

/// One second of the phase: second `s` is `[s, s + 1)` after the watcher started.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Second {
    pub s: u32,
    /// Publishes started in it, publishes answered 202 in it, first deliveries that arrived in it.
    pub offered: u32,
    pub accepted: u32,
    pub delivered: u32,
    /// Publish → delivered p99 of the events whose publish started in it (`None`: none
    /// delivered), and how many of those were never delivered.
    pub p99_ms: Option<f64>,
    pub undelivered: u32,
    /// The readings at its end; `None` when the watcher skipped it.
    pub tick: Option<Tick>,
}

/// A run of stalled seconds, `from..=to` (stalled seconds at most seven seconds apart are one
/// stall: the seconds printed around them would overlap or touch).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Stall {
    pub from: u32,
    pub to: u32,
}

/// A steady run second by second, and its stalls.
#[derive(Debug, Clone, Default, Serialize)]
pub struct SecondBySecond {
    pub seconds: Vec<Second>,
    pub stalls: Vec<Stall>,
    /// The offered rate, events/s.
    pub rate: f64,
}

/// The phase's seconds from the load's publish times, the receiver's arrival times (both in µs
/// after `base`) and the watcher's readings; `started` is the watcher's start on that clock.
pub fn seconds(
    sent: &load::Sent,
    first: u64,
    delivered_at: &HashMap<u64, u64>,
    started_micros: u64,
    ticks: Vec<Tick>,
) -> Vec<Second> {
    let second_of = |micros: u64| (micros.saturating_sub(started_micros) / 1_000_000) as usize;
    let mut rows: Vec<Second> = Vec::new();
    let at = |rows: &mut Vec<Second>, s: usize| -> usize {
        while rows.len() <= s {
            let n = rows.len() as u32;
            rows.push(Second {
                s: n,
                ..Second::default()
            });
        }
        s
    };
    let mut latencies: Vec<Vec<f64>> = Vec::new();
    for (i, &start) in sent.started_micros.iter().enumerate() {
        let s = at(&mut rows, second_of(start));
        rows[s].offered += 1;
        if let Some(&accepted) = sent.accepted_micros.get(i).filter(|&&a| a > 0) {
            let a = at(&mut rows, second_of(accepted));
            rows[a].accepted += 1;
        }
        match delivered_at.get(&(first + i as u64)) {
            Some(&arrived) => {
                let d = at(&mut rows, second_of(arrived));
                rows[d].delivered += 1;
                if latencies.len() <= s {
                    latencies.resize_with(s + 1, Vec::new);
                }
                latencies[s].push(arrived.saturating_sub(start) as f64 / 1000.0);
            }
            None => rows[s].undelivered += 1,
        }
    }
    for (s, lat) in latencies.into_iter().enumerate() {
        if !lat.is_empty() {
            rows[s].p99_ms = Some(report::percentile(lat, 99.0));
        }
    }
    // A reading at the end of second s is taken about s + 1 seconds after the start.
    for tick in ticks {
        let s = ((tick.at_micros as f64 / 1e6).round() as usize).saturating_sub(1);
        if s < rows.len() {
            rows[s].tick = Some(tick);
        }
    }
    rows
}

/// Whether second `row` stalled. After the first [`SETTLE_SECONDS`]: while the load was
/// publishing (before `last`, the second of the last publish, a partial one), it delivered less
/// than [`STALL_SHARE`] of the offered `rate`, also when the load itself offered less (an open
/// loop with at most 512 publishes in flight stops offering while they are held up); or, in any
/// second, the events published in it took more than [`STALL_P99_MS`] at p99.
pub fn stalled(row: &Second, rate: f64, last: u32) -> bool {
    if row.s < SETTLE_SECONDS {
        return false;
    }
    let starved = row.s < last && f64::from(row.delivered) < STALL_SHARE * rate;
    starved || row.p99_ms.is_some_and(|p99| p99 > STALL_P99_MS)
}

/// The second of the last publish.
fn last_publish(rows: &[Second]) -> u32 {
    rows.iter().rev().find(|r| r.offered > 0).map_or(0, |r| r.s)
}

/// The stalled seconds, in runs.
pub fn stalls(rows: &[Second], rate: f64) -> Vec<Stall> {
    let last = last_publish(rows);
    let mut out: Vec<Stall> = Vec::new();
    for row in rows.iter().filter(|row| stalled(row, rate, last)) {
        match out.last_mut() {
            Some(stall) if row.s <= stall.to + 2 * AROUND + 1 => stall.to = row.s,
            _ => out.push(Stall {
                from: row.s,
                to: row.s,
            }),
        }
    }
    out
}

impl SecondBySecond {
    pub fn new(seconds: Vec<Second>, rate: f64) -> Self {
        SecondBySecond {
            stalls: stalls(&seconds, rate),
            seconds,
            rate,
        }
    }

    /// The judged second (after the first [`SETTLE_SECONDS`], before the last publish's) that
    /// delivered the least.
    pub fn slowest(&self) -> Option<&Second> {
        let last = last_publish(&self.seconds);
        self.seconds
            .iter()
            .filter(|r| r.s >= SETTLE_SECONDS && r.s < last)
            .min_by_key(|r| r.delivered)
    }

    /// One line: the stalls' seconds, or `no stall: the slowest second delivered …`.
    pub fn verdict(&self) -> String {
        if self.stalls.is_empty() {
            return match self.slowest() {
                Some(r) => format!(
                    "no stall: the slowest second delivered {} events ({:.0} % of offered)",
                    report::count(f64::from(r.delivered)),
                    f64::from(r.delivered) * 100.0 / self.rate
                ),
                None => "no stall: no second long enough to judge".to_owned(),
            };
        }
        let spans: Vec<String> = self
            .stalls
            .iter()
            .map(|st| {
                if st.from == st.to {
                    format!("s {}", st.from)
                } else {
                    format!("s {}–{}", st.from, st.to)
                }
            })
            .collect();
        format!(
            "{} stall{}: {}",
            self.stalls.len(),
            if self.stalls.len() == 1 { "" } else { "s" },
            spans.join(", ")
        )
    }
}

/// One table per stall (at most [`PRINTED_STALLS`]): its seconds and [`AROUND`] on each side.
pub fn stall_tables(what: &str, watch: &SecondBySecond) -> Vec<Table> {
    let last = watch.seconds.len().saturating_sub(1) as u32;
    watch
        .stalls
        .iter()
        .take(PRINTED_STALLS)
        .map(|stall| {
            let from = stall.from.saturating_sub(AROUND);
            let to = (stall.to + AROUND).min(last);
            let mut table = Table::new(
                format!(
                    "Stall in {what}, second {}{} of the steady phase ({} events/s offered): \
                     each second's load, and the readings at its end (CPU in % of one core, \
                     counters since the previous second; `!` marks a stalled second)",
                    stall.from,
                    if stall.to > stall.from {
                        format!("–{}", stall.to)
                    } else {
                        String::new()
                    },
                    report::count(watch.rate)
                ),
                &[
                    "s",
                    "offered / accepted / delivered",
                    "p99 of its publishes",
                    "sheaf CPU, RSS",
                    "Postgres / ClickHouse CPU",
                    "host: busy, iowait, steal; IO stall, CPU wait",
                    "Postgres answered in",
                    "sheaf's active connections",
                    "longest statement",
                    "others active",
                    "vacuum, analyze",
                    "checkpoint, WAL",
                    "queue due / claimed, outbox; jobs claimed / handed over, events shipped",
                ],
            );
            for row in &watch.seconds[from as usize..=to as usize] {
                table.row(second_cells(row, watch.rate, last_publish(&watch.seconds)));
            }
            table
        })
        .collect()
}

fn second_cells(row: &Second, rate: f64, last: u32) -> Vec<String> {
    let pct = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.0} %"));
    let tick = row.tick.as_ref();
    let pg = tick.and_then(|t| t.postgres.as_ref());
    let n = |v: f64| report::count(v);
    let mut cells = vec![
        format!(
            "{}{}",
            row.s,
            if stalled(row, rate, last) { " !" } else { "" }
        ),
        format!(
            "{} / {} / {}",
            n(f64::from(row.offered)),
            n(f64::from(row.accepted)),
            n(f64::from(row.delivered))
        ),
        match row.p99_ms {
            Some(p99) if row.undelivered > 0 => {
                format!("{} ({} undelivered)", report::millis(p99), row.undelivered)
            }
            Some(p99) => report::millis(p99),
            None => "–".to_owned(),
        },
    ];
    let Some(tick) = tick else {
        cells.extend(std::iter::repeat_n("not read".to_owned(), 10));
        return cells;
    };
    cells.push(format!(
        "{}, {}",
        pct(tick.sheaf_cpu_pct),
        tick.sheaf_rss_mib
            .map_or("–".to_owned(), |m| format!("{m:.0} MiB"))
    ));
    cells.push(format!(
        "{} / {}",
        pct(tick.postgres_cpu_pct),
        pct(tick.clickhouse_cpu_pct)
    ));
    cells.push(tick.host.map_or("–".to_owned(), |h| {
        let ms = |v: Option<f64>| v.map_or("–".to_owned(), |v| format!("{v:.0} ms"));
        format!(
            "{:.0} %, {:.0} %, {:.0} %; {}, {}",
            h.busy_pct,
            h.iowait_pct,
            h.steal_pct,
            ms(h.io_stall_ms),
            ms(h.cpu_wait_ms)
        )
    }));
    cells.push(match &tick.postgres_error {
        Some(e) => format!(
            "{} ({})",
            report::millis(tick.postgres_probe_ms),
            markdown(e)
        ),
        None => report::millis(tick.postgres_probe_ms),
    });
    let Some(pg) = pg else {
        cells.extend(std::iter::repeat_n("–".to_owned(), 5));
        cells.push(gauges_cell(tick));
        return cells;
    };
    let mut active: Vec<String> = pg
        .sheaf_active
        .iter()
        .map(|(wait, count)| format!("{count} {wait}"))
        .collect();
    if pg.sheaf_idle_in_transaction > 0 {
        active.push(format!("{} idle in tx", pg.sheaf_idle_in_transaction));
    }
    cells.push(if active.is_empty() {
        "none".to_owned()
    } else {
        active.join(", ")
    });
    cells.push(pg.longest.as_ref().map_or("–".to_owned(), |l| {
        format!(
            "{}{} on {}: `{}`",
            report::millis(l.running_ms),
            if l.sheaf { "" } else { " (not sheaf's)" },
            l.waiting_on,
            markdown(&l.text)
        )
    }));
    cells.push(pg.others_active.to_string());
    cells.push(if pg.maintenance.is_empty() {
        "–".to_owned()
    } else {
        pg.maintenance.join(", ")
    });
    let mut checkpoint = Vec::new();
    if pg.checkpoints_timed + pg.checkpoints_requested > 0 {
        checkpoint.push(format!(
            "started {} timed, {} requested",
            pg.checkpoints_timed, pg.checkpoints_requested
        ));
    }
    if pg.buffers_checkpoint > 0 {
        checkpoint.push(format!("{} buffers", n(pg.buffers_checkpoint as f64)));
    }
    if pg.checkpoint_sync_ms > 0.0 {
        checkpoint.push(format!("sync {}", report::millis(pg.checkpoint_sync_ms)));
    }
    if let Some(backend) = pg.buffers_backend.filter(|&b| b > 0) {
        checkpoint.push(format!("{} by backends", n(backend as f64)));
    }
    checkpoint.push(format!("WAL {} KiB", n(pg.wal_bytes as f64 / 1024.0)));
    cells.push(checkpoint.join(", "));
    cells.push(gauges_cell(tick));
    cells
}

fn gauges_cell(tick: &Tick) -> String {
    match tick.metrics {
        Some(g) => format!(
            "{} / {}, {}; {} / {}, {}{}",
            report::count(g.due),
            report::count(g.claimed),
            report::count(g.outbox_events),
            report::count(g.jobs_claimed),
            report::count(g.jobs_handed_over),
            report::count(g.events_shipped),
            if g.leases_lost > 0.0 {
                format!(", {} leases lost", g.leases_lost)
            } else {
                String::new()
            }
        ),
        None => format!("no page within {}", report::millis(tick.metrics_probe_ms)),
    }
}

/// Text that stays inside a Markdown table cell.
fn markdown(text: &str) -> String {
    text.replace('|', "\\|").replace('`', "'")
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// A minute at 2,000 events/s, every second delivering what it was offered at 20 ms p99.
    fn steady_minute() -> Vec<Second> {
        (0..60)
            .map(|s| Second {
                s,
                offered: 2_000,
                accepted: 2_000,
                delivered: 2_000,
                p99_ms: Some(20.0),
                ..Second::default()
            })
            .collect()
    }

    #[test]
    fn a_planted_stall_is_found_with_its_seconds() {
        let mut rows = steady_minute();
        // Three seconds delivering almost nothing, then the backlog, late.
        for row in &mut rows[30..33] {
            row.delivered = 100;
            row.p99_ms = Some(3_200.0);
        }
        // The load held up too: nothing offered, so nothing late, but nothing delivered.
        rows[31].offered = 0;
        rows[31].delivered = 0;
        rows[31].p99_ms = None;
        rows[33].delivered = 7_700;
        // A slow start and a partial last second are not stalls.
        rows[1].delivered = 0;
        rows[59].offered = 300;
        rows[59].delivered = 50;
        let watch = SecondBySecond::new(rows, 2_000.0);
        assert_eq!(watch.stalls, vec![Stall { from: 30, to: 32 }]);
        assert_eq!(watch.verdict(), "1 stall: s 30–32");
        let tables = stall_tables("Postgres + ClickHouse", &watch);
        assert_eq!(tables.len(), 1);
        let seconds: Vec<&str> = tables[0].rows.iter().map(|r| r[0].as_str()).collect();
        assert_eq!(
            seconds,
            ["27", "28", "29", "30 !", "31 !", "32 !", "33", "34", "35"]
        );
    }

    #[test]
    fn late_deliveries_alone_are_a_stall_and_near_stalls_are_one() {
        let mut rows = steady_minute();
        // Delivered in time by count, but the events published in second 40 took 1.4 s.
        rows[40].p99_ms = Some(1_400.0);
        // Two short stalls 4 s apart share their printed seconds: one stall.
        rows[50].delivered = 10;
        rows[54].delivered = 10;
        let watch = SecondBySecond::new(rows, 2_000.0);
        assert_eq!(
            watch.stalls,
            vec![Stall { from: 40, to: 40 }, Stall { from: 50, to: 54 }]
        );
    }

    #[test]
    fn without_a_stall_the_slowest_second_is_named() {
        let mut rows = steady_minute();
        rows[12].delivered = 1_640;
        let watch = SecondBySecond::new(rows, 2_000.0);
        assert!(watch.stalls.is_empty());
        assert_eq!(watch.slowest().map(|r| r.s), Some(12));
        assert_eq!(
            watch.verdict(),
            "no stall: the slowest second delivered 1,640 events (82 % of offered)"
        );
        assert!(stall_tables("memory", &watch).is_empty());
    }

    #[test]
    fn seconds_count_publishes_acceptances_and_deliveries_where_they_happened() {
        // Base clock: the watcher started at 1 s; three events published at 1.1 s, 1.5 s and
        // 2.2 s, accepted 10 ms later; the first two delivered at 1.2 s and 3.6 s, the third never.
        let sent = load::Sent {
            started_micros: vec![1_100_000, 1_500_000, 2_200_000],
            publish_micros: vec![10_000; 3],
            accepted_micros: vec![1_110_000, 1_510_000, 2_210_000],
            refused: 0,
            errors: 0,
            elapsed: Duration::from_secs(2),
        };
        let delivered = HashMap::from([(7, 1_200_000), (8, 3_600_000)]);
        let tick = Tick {
            at_micros: 1_003_000,
            ..Tick::default()
        };
        let rows = seconds(&sent, 7, &delivered, 1_000_000, vec![tick]);
        let counts: Vec<(u32, u32, u32, u32)> = rows
            .iter()
            .map(|r| (r.offered, r.accepted, r.delivered, r.undelivered))
            .collect();
        assert_eq!(counts, [(2, 2, 1, 0), (1, 1, 0, 1), (0, 0, 1, 0)]);
        assert_eq!(rows[0].p99_ms, Some(2_100.0));
        assert_eq!(rows[1].p99_ms, None);
        assert!(rows[0].tick.is_some() && rows[1].tick.is_none());
    }
}
