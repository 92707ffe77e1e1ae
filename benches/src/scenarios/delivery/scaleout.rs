//! The `delivery` report's part on the configurations that reach past one machine: the
//! JetStream queue on the NATS cluster with the log on the ClickHouse cluster, through 1, 2 and
//! 3 `sheaf` processes, beside the Postgres queue with one ClickHouse server (`clickhouse`)
//! and with the ClickHouse cluster, measured in the same run. Events/s and CPU per delivered
//! event by component, their ratios to `clickhouse`, how the work spread over the processes,
//! what the bucket's stream holds per waiting job, and the log's bytes on disk per event.

use crate::report::{self, Report, Table};

use super::{Backend, Measured, Phase};

/// The configurations this part compares, in their order.
const COMPARED: [Backend; 5] = [
    Backend::PostgresClickHouse,
    Backend::PostgresClickHouseCluster,
    Backend::JetStreamCluster1,
    Backend::JetStreamCluster2,
    Backend::JetStreamCluster3,
];

fn is_jetstream(backend: Backend) -> bool {
    backend.stores() == Backend::JetStreamCluster1
}

pub(super) fn add_to_report(report: &mut Report, measured: &[Measured]) {
    let compared: Vec<&Measured> = COMPARED
        .iter()
        .filter_map(|&b| measured.iter().find(|m| m.backend == b))
        .collect();
    if !compared.iter().any(|m| is_jetstream(m.backend)) {
        return;
    }
    let single = compared
        .iter()
        .copied()
        .find(|m| m.backend == Backend::PostgresClickHouse);
    cost_table(report, &compared, single);
    ratio_table(report, &compared, single);
    spread_table(report, &compared);
    stream_table(report, &compared);
    disk_table(report, &compared);
    queries_table(report, &compared);
    nothing_lost(report, &compared);
    report.note(
        "Past one machine: every process of these configurations (the `sheaf` processes, the \
         three nats-servers, the four ClickHouse nodes, Postgres, and the bench's publishers \
         and receiver) shares this machine's cores. A second or third `sheaf` process adds no \
         core, so events/s here cannot show scale-out; CPU per delivered event by component, \
         and its ratio to `clickhouse` in the same run, is what carries over to a fleet. \
         `sheaf` is every process of the configuration summed; NATS the three nodes' \
         `/proc/<pid>/stat` summed; ClickHouse every node's; Postgres the postmaster's tree \
         (on the JetStream configurations it holds tenants and destinations only).",
    );
}

fn us(v: Option<f64>) -> String {
    v.map_or_else(|| "–".to_owned(), |us| format!("{us:.0}"))
}

fn times(x: Option<f64>) -> String {
    match x {
        Some(x) if x.is_finite() => format!("{x:.2}x"),
        _ => "–".to_owned(),
    }
}

fn over(a: Option<f64>, b: Option<f64>) -> Option<f64> {
    Some(a? / b.filter(|b| *b > 0.0)?)
}

/// The phases shown: saturation, and the (first) steady run.
fn phases(m: &Measured) -> [(&'static str, &Phase); 2] {
    [("saturation", &m.saturation), ("steady", m.steady())]
}

fn cost_table(report: &mut Report, compared: &[&Measured], single: Option<&Measured>) {
    let mut table = Table::new(
        "Past one machine: CPU µs per delivered event by component, beside the Postgres queue \
         with one ClickHouse server (`clickhouse`) in the same run",
        &[
            "configuration",
            "phase",
            "delivered / accepted",
            "duplicates",
            "events/s",
            "vs `clickhouse`",
            "`sheaf` (all processes)",
            "NATS (3 nodes)",
            "ClickHouse (all nodes)",
            "Postgres",
            "total",
            "total vs `clickhouse`",
            "`sheaf` per process",
        ],
    );
    for m in compared {
        for (name, p) in phases(m) {
            let base = single.map(|s| {
                if name == "steady" {
                    s.steady()
                } else {
                    &s.saturation
                }
            });
            table.row(vec![
                m.backend.label().to_owned(),
                name.to_owned(),
                format!(
                    "{} / {}",
                    report::count(p.delivered as f64),
                    report::count(p.accepted() as f64)
                ),
                p.duplicates.to_string(),
                report::count(p.events_per_s),
                times(over(Some(p.events_per_s), base.map(|b| b.events_per_s))),
                us(p.sheaf_cpu_us_per_event),
                us(p.nats_cpu_us_per_event),
                us(p.clickhouse_cpu_us_per_event),
                us(p.postgres_cpu_us_per_event),
                us(p.total_cpu_us_per_event()),
                times(over(
                    p.total_cpu_us_per_event(),
                    base.and_then(Phase::total_cpu_us_per_event),
                )),
                if p.sheaf_process_cpu_us_per_event.is_empty() {
                    "–".to_owned()
                } else {
                    p.sheaf_process_cpu_us_per_event
                        .iter()
                        .map(|us| format!("{us:.0}"))
                        .collect::<Vec<_>>()
                        .join(" / ")
                },
            ]);
        }
    }
    report.tables.push(table);
}

fn ratio_table(report: &mut Report, compared: &[&Measured], single: Option<&Measured>) {
    let Some(single) = single else { return };
    let base = &single.saturation;
    let mut table = Table::new(
        "The same at saturation, as ratios to `clickhouse` (CPU per delivered event; the queue: \
         Postgres on `clickhouse`, NATS + Postgres on JetStream)",
        &[
            "configuration",
            "events/s",
            "`sheaf`",
            "the queue and tenants",
            "ClickHouse",
            "total",
        ],
    );
    let queue = |p: &Phase| -> Option<f64> {
        Some(p.postgres_cpu_us_per_event? + p.nats_cpu_us_per_event.unwrap_or(0.0))
    };
    for m in compared {
        let p = &m.saturation;
        table.row(vec![
            m.backend.label().to_owned(),
            times(over(Some(p.events_per_s), Some(base.events_per_s))),
            times(over(p.sheaf_cpu_us_per_event, base.sheaf_cpu_us_per_event)),
            times(over(queue(p), queue(base))),
            times(over(
                p.clickhouse_cpu_us_per_event,
                base.clickhouse_cpu_us_per_event,
            )),
            times(over(
                p.total_cpu_us_per_event(),
                base.total_cpu_us_per_event(),
            )),
        ]);
    }
    report.tables.push(table);
}

/// How the work spread over the processes: each one's counters over the whole run.
fn spread_table(report: &mut Report, compared: &[&Measured]) {
    let mut table = Table::new(
        "How the work spread (each process's /metrics over the whole run: warm-up, backlog, \
         saturation, steady)",
        &[
            "configuration",
            "process",
            "publishes accepted",
            "jobs handled",
            "jobs claimed",
            "payloads read from the log",
            "event lookup queries",
            "log writes / rows",
            "leases lost",
        ],
    );
    for m in compared.iter().filter(|m| is_jetstream(m.backend)) {
        for (i, c) in m.processes.iter().enumerate() {
            table.row(vec![
                m.backend.label().to_owned(),
                (i + 1).to_string(),
                report::count(c.published),
                report::count(c.handled),
                report::count(c.claimed),
                report::count(c.payloads_from_log),
                report::count(c.event_lookup_queries),
                format!(
                    "{} / {}",
                    report::count(c.log_writes),
                    report::count(c.log_rows)
                ),
                report::count(c.leases_lost),
            ]);
        }
    }
    report.tables.push(table);

    let mut table = Table::new(
        "What each delivered event cost the log store at saturation (every process's /metrics \
         over the phase, added up)",
        &[
            "configuration",
            "payloads read from the log, per 1,000 events",
            "event lookup queries per 1,000 events",
            "log writes (INSERTs) per 1,000 events",
            "rows per log write",
            "ClickHouse CPU µs/event",
        ],
    );
    for m in compared {
        let c = &m.saturation_counters;
        let per_1000 =
            |v: f64| format!("{:.1}", v * 1_000.0 / m.saturation.delivered.max(1) as f64);
        table.row(vec![
            m.backend.label().to_owned(),
            per_1000(c.payloads_from_log),
            per_1000(c.event_lookup_queries),
            per_1000(c.log_writes),
            if c.log_writes > 0.0 {
                format!("{:.1}", c.log_rows / c.log_writes)
            } else {
                "–".to_owned()
            },
            us(m.saturation.clickhouse_cpu_us_per_event),
        ]);
    }
    report.tables.push(table);
}

/// The bucket's stream: bytes per waiting job, its leader and the nodes' CPU.
fn stream_table(report: &mut Report, compared: &[&Measured]) {
    let mut table = Table::new(
        "The JetStream bucket (3 replicas): a backlog of waiting jobs (the receiver refusing \
         every delivery), the stream after the steady phase, and each NATS node's CPU per \
         delivered event at saturation",
        &[
            "configuration",
            "backlog: waiting jobs added",
            "stream bytes added",
            "bytes per waiting job (one replica)",
            "backlog delivered / accepted, duplicates",
            "drained in",
            "after steady: messages / bytes",
            "stream leader",
            "NATS CPU µs/event at saturation, n1 / n2 / n3",
        ],
    );
    for m in compared {
        let Some(js) = &m.jetstream else { continue };
        let b = &js.backlog;
        let after = js.after_steady.as_ref().map_or("–".to_owned(), |s| {
            format!(
                "{} / {}",
                report::count(s.messages as f64),
                report::bytes(s.bytes as f64)
            )
        });
        table.row(vec![
            m.backend.label().to_owned(),
            report::count(b.peak.messages.saturating_sub(b.before.messages) as f64),
            report::bytes(b.peak.bytes.saturating_sub(b.before.bytes) as f64),
            b.bytes_per_job()
                .map_or("–".to_owned(), |v| format!("{v:.0} B")),
            format!(
                "{} / {}, {}",
                report::count(b.delivered as f64),
                report::count(b.accepted as f64),
                b.duplicates
            ),
            format!("{:.1} s", b.drained_s),
            after,
            b.peak.leader.clone().unwrap_or_else(|| "?".to_owned()),
            m.saturation
                .nats_node_cpu_us_per_event
                .iter()
                .map(|us| format!("{us:.0}"))
                .collect::<Vec<_>>()
                .join(" / "),
        ]);
    }
    report.tables.push(table);
}

/// The log's tables on disk after the run, every replica counted.
fn disk_table(report: &mut Report, compared: &[&Measured]) {
    let mut table = Table::new(
        "The log on disk after the run (`system.parts`, active parts, every node and replica \
         added up), per row and per event accepted over the run",
        &[
            "configuration",
            "table",
            "rows",
            "rows per event",
            "bytes on disk",
            "bytes per row",
            "bytes per event",
            "uncompressed per row",
            "parts",
        ],
    );
    for m in compared {
        let events = m.accepted_events.max(1) as f64;
        for t in m
            .clickhouse_disk
            .iter()
            .filter(|t| t.table.starts_with("events") || t.table.starts_with("attempts"))
        {
            let rows = t.rows.max(1) as f64;
            table.row(vec![
                m.backend.label().to_owned(),
                t.table.clone(),
                report::count(t.rows as f64),
                format!("{:.2}", t.rows as f64 / events),
                report::bytes(t.bytes_on_disk as f64),
                format!("{:.0} B", t.bytes_on_disk as f64 / rows),
                format!("{:.0} B", t.bytes_on_disk as f64 / events),
                format!("{:.0} B", t.bytes_uncompressed as f64 / rows),
                t.parts.to_string(),
            ]);
        }
    }
    if !table.rows.is_empty() {
        report.tables.push(table);
    }
}

/// Every accepted event delivered, in every phase of the JetStream configurations.
fn nothing_lost(report: &mut Report, compared: &[&Measured]) {
    for m in compared.iter().filter(|m| is_jetstream(m.backend)) {
        let mut lost = Vec::new();
        let mut duplicates = 0;
        for (name, p) in phases(m) {
            duplicates += p.duplicates;
            if p.delivered < p.accepted() {
                lost.push(format!("{name}: {} of {}", p.delivered, p.accepted()));
            }
        }
        if let Some(js) = &m.jetstream {
            duplicates += js.backlog.duplicates;
            if js.backlog.delivered < js.backlog.accepted {
                lost.push(format!(
                    "backlog: {} of {}",
                    js.backlog.delivered, js.backlog.accepted
                ));
            }
        }
        let measured = if lost.is_empty() {
            format!("every accepted event delivered; {duplicates} duplicate deliveries")
        } else {
            format!(
                "delivered {}; {duplicates} duplicate deliveries",
                lost.join(", ")
            )
        };
        report.target(
            &format!("{}: nothing lost", m.backend.label()),
            "every accepted event delivered, in the backlog, saturation and steady phases",
            measured,
            lost.is_empty(),
        );
    }
}

/// The log's queries over the run, every node counted: how many, how large, what they cost.
fn queries_table(report: &mut Report, compared: &[&Measured]) {
    let mut table = Table::new(
        "The log's queries over the whole run (`system.query_log` of every node, the queries \
         touching the run's database; sent: by Sheaf, forwarded: by the node Sheaf asked, to \
         a replica or the other shard), per event accepted over the run",
        &[
            "configuration",
            "INSERTs sent / forwarded",
            "INSERT CPU µs/event",
            "SELECTs sent / forwarded",
            "SELECTs sent per 1,000 events",
            "SELECT CPU µs/event",
            "CPU per INSERT sent (with its forwards) / per SELECT sent",
        ],
    );
    for m in compared {
        let events = m.accepted_events.max(1) as f64;
        let count = |kind: &str, initial: u8| {
            m.clickhouse_queries
                .iter()
                .find(|q| q.kind == kind && q.initial == initial)
                .map_or(0, |q| q.queries)
        };
        let cpu = |kind: &str| -> f64 {
            m.clickhouse_queries
                .iter()
                .filter(|q| q.kind == kind)
                .map(|q| q.cpu_micros as f64)
                .sum()
        };
        let inserts = count("Insert", 1);
        let selects = count("Select", 1);
        if inserts + selects == 0 {
            continue;
        }
        let per_query = |cpu_us: f64, n: u64| {
            if n == 0 {
                "–".to_owned()
            } else {
                report::millis(cpu_us / n as f64 / 1_000.0)
            }
        };
        table.row(vec![
            m.backend.label().to_owned(),
            format!(
                "{} / {}",
                report::count(inserts as f64),
                report::count(count("Insert", 0) as f64)
            ),
            format!("{:.0}", cpu("Insert") / events),
            format!(
                "{} / {}",
                report::count(selects as f64),
                report::count(count("Select", 0) as f64)
            ),
            format!("{:.1}", selects as f64 * 1_000.0 / events),
            format!("{:.0}", cpu("Select") / events),
            format!(
                "{} / {}",
                per_query(cpu("Insert"), inserts),
                per_query(cpu("Select"), selects)
            ),
        ]);
    }
    if !table.rows.is_empty() {
        report.tables.push(table);
    }
}
