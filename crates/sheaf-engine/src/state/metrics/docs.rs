//! The table of every metric [`render`] writes, with its type and its `# HELP` text, read off
//! the page itself. The service writes it into `docs/operations.md` (`cargo xtask codegen`), and
//! its test fails while the committed table differs, so a metric cannot be rendered
//! undocumented, nor documented after it is gone.

use std::sync::Arc;

use sheaf_coalesce::CoalesceMetrics;
use sheaf_store::{OutboxBacklog, QueueDepth};

use super::{CdcState, MetricSources, Metrics, render};

/// A Markdown table, one row per metric of a page on which every section is present (CDC on, a queue depth and
/// an outbox backlog read), in the page's order.
pub fn metric_table() -> String {
    let service = Metrics::default();
    service.cdc.set_state(CdcState::Streaming);
    let sources = MetricSources {
        service: Arc::new(service),
        retry_lookup: Arc::new(CoalesceMetrics::new()),
        event_lookup: Arc::new(CoalesceMetrics::new()),
        log_write: Arc::new(CoalesceMetrics::new()),
        publish_commit: Arc::new(CoalesceMetrics::new()),
        admission: Arc::new(crate::state::admission::Admission::outbox(1)),
        memory_queue: None,
    };
    let page = render(
        &sources,
        Some(QueueDepth::default()),
        Some(OutboxBacklog::default()),
    );
    let mut out = String::from("| metric | type | meaning |\n|---|---|---|\n");
    let mut help = None;
    for line in page.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            help = rest.split_once(' ');
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("# TYPE <name> <kind>");
            let (help_name, text) = help.take().expect("# HELP comes before # TYPE");
            assert_eq!(help_name, name, "the HELP and TYPE lines name one metric");
            out.push_str(&format!(
                "| `{name}` | {kind} | {} |\n",
                text.replace('|', "\\|")
            ));
        }
    }
    out
}

#[cfg(test)]
#[test]
fn every_metric_has_a_help_text_and_a_name_of_the_service() {
    let table = metric_table();
    let rows: Vec<&str> = table.lines().skip(2).collect();
    assert!(rows.len() > 40, "{table}");
    for row in rows {
        assert!(row.starts_with("| `sheaf_"), "{row}");
        assert!(!row.ends_with("|  |"), "a metric without help: {row}");
    }
}
