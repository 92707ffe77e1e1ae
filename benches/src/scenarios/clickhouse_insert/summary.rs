//! The `clickhouse-insert` report: both ways side by side, their ratios, and every node's rows.

use super::{Kind, Measured, NodeRows, QUESTION, REPLICAS, Sizes, Way};
use crate::context::Ctx;
use crate::plot::{Bar, Figure, Panel};
use crate::report::{self, PeakRss, Report, Table};

pub(super) fn build_report(
    ctx: &Ctx,
    sizes: &Sizes,
    measured: &[Measured],
    placement: &[(Kind, usize, NodeRows)],
    payload_bytes: f64,
    peak_kib: Option<u64>,
) -> Report {
    let mut report = Report::new("clickhouse-insert", QUESTION, ctx);
    let mut table = Table::new(
        format!(
            "batches of events and of attempts (JSON payloads of {payload_bytes:.0} B on average) \
             to the 2 × 2 cluster, each way alternated in one run; node CPU is the four node \
             processes' user + system time"
        ),
        &[
            "table",
            "rows per batch",
            "way",
            "batches",
            "rows/s",
            "wall per batch, median",
            "p90",
            "node CPU per 1,000 rows",
            "insert queries' CPU per 1,000 rows",
            "INSERTs per batch (all nodes)",
            "bench CPU per 1,000 rows",
        ],
    );
    let mut ratios = Table::new(
        "per shard from the client against the Distributed table, same table and batch size",
        &[
            "table",
            "rows per batch",
            "rows/s, per shard ÷ Distributed",
            "median wall, Distributed ÷ per shard",
            "p90 wall, Distributed ÷ per shard",
            "node CPU, Distributed ÷ per shard",
            "insert queries' CPU, Distributed ÷ per shard",
            "node + bench CPU, Distributed ÷ per shard",
        ],
    );
    let mut bars = Vec::new();
    let mut cpu_bars = Vec::new();
    for m in measured {
        table.row(vec![
            m.kind.table().to_owned(),
            report::count(m.batch_rows as f64),
            m.way.label().to_owned(),
            m.batches.to_string(),
            report::count(m.rows_per_s()),
            report::millis(m.median_ms()),
            report::millis(m.p90_ms()),
            format!("{:.3} s", m.node_cpu_per_1000()),
            format!("{:.3} s", m.query_cpu_per_1000()),
            format!("{:.1}", m.logged.queries as f64 / m.batches.max(1) as f64),
            format!("{:.3} s", m.client_cpu_per_1000()),
        ]);
        let label = format!(
            "{}, {} rows: {}",
            m.kind.table(),
            report::count(m.batch_rows as f64),
            m.way.label()
        );
        bars.push(Bar::new(label.clone(), m.rows_per_s(), m.way as usize));
        cpu_bars.push(Bar::new(label, m.node_cpu_per_1000(), m.way as usize));
        if m.way == Way::PerShard
            && let Some(d) = measured.iter().find(|d| {
                d.way == Way::Distributed && d.kind == m.kind && d.batch_rows == m.batch_rows
            })
        {
            ratios.row(vec![
                m.kind.table().to_owned(),
                report::count(m.batch_rows as f64),
                ratio(m.rows_per_s() / d.rows_per_s()),
                ratio(d.median_ms() / m.median_ms()),
                ratio(d.p90_ms() / m.p90_ms()),
                ratio(d.node_cpu_per_1000() / m.node_cpu_per_1000()),
                ratio(d.query_cpu_per_1000() / m.query_cpu_per_1000()),
                ratio(
                    (d.node_cpu_per_1000() + d.client_cpu_per_1000())
                        / (m.node_cpu_per_1000() + m.client_cpu_per_1000()),
                ),
            ]);
        }
    }
    report.tables.push(table);
    report.tables.push(ratios);
    let mut nodes = Table::new(
        "rows on each node after the run (local tables): every node holds its shard's rows \
         both ways, none of the other shard's",
        &[
            "table",
            "node",
            "rows",
            "through Distributed",
            "per shard",
            "of the other shard",
        ],
    );
    for (kind, i, rows) in placement {
        nodes.row(vec![
            format!("{}_local", kind.table()),
            format!("shard {} replica {}", i / REPLICAS + 1, i % REPLICAS + 1),
            report::count(rows.rows as f64),
            report::count(rows.distributed as f64),
            report::count(rows.per_shard as f64),
            report::count(rows.misplaced as f64),
        ]);
    }
    report.tables.push(nodes);
    report.memory.push(PeakRss::new("sheaf-bench", peak_kib));
    report.note(
        "Rows/s is the batch's rows over the sum of its batches' wall times (one batch in flight \
         at a time, as one write coalescer per table sends them); wall per batch runs from the \
         first row sent to the last answer (for per shard, the last of the four inserts).",
    );
    report.note(
        "Node CPU is the change in utime + stime (/proc/<pid>/stat) of the four node processes \
         over each batch, summed; it includes whatever merges ran meanwhile, which alternating \
         the two ways spreads over both. Bench CPU is the bench process's own (generating no \
         rows: they are made before the clock starts), i.e. serializing and sending.",
    );
    report.note(
        "Insert queries' CPU is ProfileEvents user + system time of the measured batches' \
         INSERTs in every node's system.query_log (tagged by log_comment, which the Distributed \
         table passes on to the inserts it sends the replicas), summed: the inserts' own work \
         without merges. INSERTs per batch counts those queries.",
    );
    report.note(format!(
        "After {} warm-up batches per table and size; fresh rows every batch, {} tenants; the \
         bench's placement (SipHash-2-4 in Rust) was checked against the server's sipHash64 for \
         a batch of 1,000 keys before measuring, and by counting every node's rows after.",
        sizes.warmup_batches, sizes.tenants
    ));
    report.figure = Some(
        Figure::new("clickhouse-insert: one INSERT to the Distributed table vs one per replica")
            .panel(Panel::Bars {
                title: "rows/s".to_owned(),
                unit: "rows/s".to_owned(),
                log: false,
                bars,
            })
            .panel(Panel::Bars {
                title: "node CPU per 1,000 rows".to_owned(),
                unit: "s".to_owned(),
                log: false,
                bars: cpu_bars,
            }),
    );
    report.raw = serde_json::json!({
        "sizes": sizes,
        "payload_bytes": payload_bytes,
        "measured": measured,
        "placement": placement.iter().map(|(kind, node, rows)| serde_json::json!({
            "table": kind.table(), "node": node, "rows": rows,
        })).collect::<Vec<_>>(),
    });
    report
}

/// A ratio with two decimals (`1.27x`): the question is whether one way wins by 1.3x.
fn ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}x")
    } else {
        "n/a".to_owned()
    }
}
