//! The `lookup` scenario's report: the table of every variant, the targets, the notes on how it
//! was measured, and the figure.

use super::{Measured, QUESTION, Sizes, Spread, Store, Tweak};
use crate::context::Ctx;
use crate::plot::{Bar, Figure, Panel};
use crate::report::{self, PeakRss, Report, Table};

pub(super) fn build_report(
    ctx: &Ctx,
    sizes: &Sizes,
    measured: Vec<Measured>,
    peak_kib: Option<u64>,
) -> Report {
    let mut report = Report::new("lookup", QUESTION, ctx);
    let find = |store: Store, keys: usize, spread: Spread, lazy: bool| {
        measured.iter().find(|m| {
            m.variant.store == store
                && m.variant.keys_per_query == keys
                && m.variant.spread == spread
                && m.variant.lazy == lazy
                && m.variant.tweak == Tweak::None
        })
    };
    let time_ordered_single = find(Store::ClickHouseTimeOrdered, 1, Spread::Month, true)
        .map_or(f64::NAN, |m| m.cpu_ms_per_key);

    let near = format!(
        "within {} day{}",
        sizes.near_window_days,
        if sizes.near_window_days == 1 { "" } else { "s" }
    );
    let mut table = Table::new(
        format!(
            "Per looked-up key, {} attempts (~2 KB payloads over 30 days); sequential medians, \
             then {} clients for {:.1} s",
            report::count(sizes.events as f64 * 4.0),
            sizes.clients,
            sizes.saturation.as_secs_f64()
        ),
        &[
            "store",
            "lookup",
            "keys' spread",
            "server CPU / key",
            "read / key",
            "latency / query",
            "lookups/s saturated",
            "CPU / key saturated",
            "time-ordered single ÷ this (CPU)",
        ],
    );
    for m in &measured {
        let v = &m.variant;
        let cpu = if v.store == Store::Postgres {
            format!("{} (exec)", report::millis(m.cpu_ms_per_key))
        } else {
            report::millis(m.cpu_ms_per_key)
        };
        table.row(vec![
            v.store.label().to_owned(),
            v.shape(),
            match v.spread {
                Spread::Month => "30 days".to_owned(),
                Spread::Near => near.clone(),
            },
            cpu,
            report::bytes(m.read_bytes_per_key),
            report::millis(m.latency_ms),
            report::count(m.keys_per_s),
            report::millis(m.saturated_cpu_ms_per_key),
            if v.store == Store::Postgres {
                "—".to_owned()
            } else {
                report::ratio(time_ordered_single / m.cpu_ms_per_key)
            },
        ]);
    }
    report.tables.push(table);

    let b100 = [
        find(Store::ClickHouseSheaf, 100, Spread::Month, true),
        find(Store::ClickHouseSheaf, 100, Spread::Near, true),
    ];
    if let [Some(month), Some(near_m)] = b100 {
        let worst_cpu = month.cpu_ms_per_key.max(near_m.cpu_ms_per_key);
        report.target(
            "ClickHouse, Sheaf's layout, batches of 100: server CPU per key",
            "at most 1 ms whatever the keys' time spread",
            format!(
                "{} (30 days), {} ({near})",
                report::millis(month.cpu_ms_per_key),
                report::millis(near_m.cpu_ms_per_key)
            ),
            worst_cpu <= 1.0,
        );
        let worst_ratio = time_ordered_single / worst_cpu;
        report.target(
            "ClickHouse, Sheaf's batches of 100 against single lookups on the time-ordered baseline layout (CPU per key)",
            "at least 10x less",
            format!(
                "{} single on the time-ordered layout ÷ {} = {}",
                report::millis(time_ordered_single),
                report::millis(worst_cpu),
                report::ratio(worst_ratio)
            ),
            worst_ratio >= 10.0,
        );
        let worst_bytes = month.read_bytes_per_key.max(near_m.read_bytes_per_key);
        report.target(
            "ClickHouse, Sheaf's layout, batches of 100: bytes read per key",
            "at most 0.1 MB",
            format!(
                "{} (30 days), {} ({near})",
                report::bytes(month.read_bytes_per_key),
                report::bytes(near_m.read_bytes_per_key)
            ),
            worst_bytes <= 100_000.0,
        );
    }
    let no_projections: Vec<&Measured> = measured
        .iter()
        .filter(|m| m.variant.tweak == Tweak::ProjectionsOff)
        .collect();
    if let ([month, near_m, ..], [Some(with_month), Some(with_near)]) =
        (no_projections.as_slice(), b100)
    {
        let share = 1.0 - month.cpu_ms_per_key / with_month.cpu_ms_per_key;
        report.note(format!(
            "Diagnostic, not the store's configuration: with projection analysis off \
             (optimize_use_projections = 0) Sheaf's batch of 100 costs {} per key over 30 days and \
             {} {near}, against {} and {} as shipped, so projection analysis accounts for {:.0} % of \
             a 30-day batch's CPU here; system.query_log's QueryPlanOptimizeMicroseconds and \
             FilteringMarksWithPrimaryKeyMicroseconds show where a batch's CPU goes.",
            report::millis(month.cpu_ms_per_key),
            report::millis(near_m.cpu_ms_per_key),
            report::millis(with_month.cpu_ms_per_key),
            report::millis(with_near.cpu_ms_per_key),
            share.max(0.0) * 100.0,
        ));
    }
    report.memory.push(PeakRss::new(
        "sheaf-bench (Sheaf's stores and clients, in process)",
        peak_kib,
    ));
    report.note(
        "ClickHouse: CPU is ProfileEvents UserTimeMicroseconds + SystemTimeMicroseconds and bytes \
         are read_bytes from system.query_log, median query ÷ keys per query; saturated CPU is the \
         sum over the saturated phase ÷ keys answered.",
    );
    report.note(
        "Postgres: CPU is pg_stat_statements total_exec_time (time inside the executor, which for \
         cached index probes is CPU) and bytes are shared buffers hit + read × 8 KiB, both summed \
         over the phase ÷ keys; lookups/s is wall time at saturation.",
    );
    report.note(
        "Both ClickHouse tables are merged to one part per month partition before measuring \
         (OPTIMIZE … FINAL); the time-ordered layout is MergeTree ordered by (attempt_time, attempt_id) \
         with the default granularity. Servers, clients and other work share the machine's 2 cores.",
    );

    let bars = |value: fn(&Measured) -> f64| -> Vec<Bar> {
        measured
            .iter()
            .map(|m| Bar::new(m.variant.short(sizes), value(m), m.variant.store as usize))
            .collect()
    };
    let cpu_bars = bars(|m| m.cpu_ms_per_key);
    let rate_bars = bars(|m| m.keys_per_s);
    report.figure = Some(
        Figure::new("lookup: cost per looked-up key (blue: Sheaf on ClickHouse, orange: time-ordered layout, green: Postgres)")
            .panel(Panel::Bars {
                title: "server CPU per key, sequential median (Postgres: execution time)".to_owned(),
                unit: "ms".to_owned(),
                log: true,
                bars: cpu_bars,
            })
            .panel(Panel::Bars {
                title: format!("lookups per second, {} clients at saturation", sizes.clients),
                unit: "keys/s".to_owned(),
                log: true,
                bars: rate_bars,
            }),
    );
    report.raw = serde_json::json!({
        "sizes": {
            "attempts": sizes.events * 4,
            "events": sizes.events,
            "saturation_s": sizes.saturation.as_secs_f64(),
            "clients": sizes.clients,
            "near_window_days": sizes.near_window_days,
        },
        "variants": measured,
    });
    report
}
