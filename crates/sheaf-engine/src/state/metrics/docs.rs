//! The table of every metric [`render`] writes, with its type and its `# HELP` text, written
//! from [`FAMILIES`]. The service writes it into `docs/operations.md` (`cargo xtask codegen`),
//! and its test fails while the committed table differs; the test here fails while the page
//! declares other families than the table, so a metric can be neither rendered undocumented nor
//! documented after it is gone.

use super::families::FAMILIES;
#[cfg(test)]
use super::render;

/// A Markdown table, one row per metric family, in the order the page writes them.
pub fn metric_table() -> String {
    let mut out = String::from("| metric | type | meaning |\n|---|---|---|\n");
    for family in FAMILIES {
        out.push_str(&format!(
            "| `{}` | {} | {} |\n",
            family.name,
            family.kind.as_str(),
            family.help.replace('|', "\\|")
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashSet;
    use std::sync::Arc;

    use sheaf_coalesce::CoalesceMetrics;
    use sheaf_store::{OutboxBacklog, QueueDepth};

    use super::super::families::{FAMILIES, Kind};
    use super::super::{CdcState, MetricSources, Metrics};
    use super::*;

    /// A page on which every section is present: CDC on, a queue depth and an outbox backlog
    /// read, and destination types named so the labelled families have samples.
    fn full_page() -> String {
        let service = Metrics::default();
        service.cdc.set_state(CdcState::Streaming);
        service.set_destination_types(&["webhook", "nats"]);
        let sources = MetricSources {
            service: Arc::new(service),
            retry_lookup: Arc::new(CoalesceMetrics::new()),
            event_lookup: Arc::new(CoalesceMetrics::new()),
            log_write: Arc::new(CoalesceMetrics::new()),
            publish_commit: Arc::new(CoalesceMetrics::new()),
            admission: Arc::new(crate::state::admission::Admission::outbox(1)),
            memory_queue: None,
        };
        render(
            &sources,
            Some(QueueDepth::default()),
            Some(OutboxBacklog::default()),
        )
    }

    #[test]
    fn the_page_declares_exactly_the_tables_families_in_its_order() {
        let page = full_page();
        let mut declared = Vec::new();
        let mut lines = page.lines();
        while let Some(line) = lines.next() {
            let Some(help_line) = line.strip_prefix("# HELP ") else {
                continue;
            };
            let type_line = lines
                .next()
                .expect("a # TYPE line follows each # HELP line");
            declared.push(format!("# HELP {help_line}\n{type_line}"));
        }
        let expected: Vec<String> = FAMILIES
            .iter()
            .map(|f| {
                format!(
                    "# HELP {} {}\n# TYPE {} {}",
                    f.name,
                    f.help,
                    f.name,
                    f.kind.as_str()
                )
            })
            .collect();
        // Compared one family at a time, so a failure names the first place they part.
        for (i, (page, table)) in declared.iter().zip(&expected).enumerate() {
            assert_eq!(
                page, table,
                "family #{i}: the page (left) and FAMILIES (right) differ"
            );
        }
        assert_eq!(
            declared.len(),
            expected.len(),
            "the page declares {} families, FAMILIES {}",
            declared.len(),
            expected.len()
        );
    }

    /// Every sample line belongs to the family declared last above it, so no sample is written
    /// under another family's header (or none).
    #[test]
    fn every_sample_follows_its_own_familys_header() {
        let page = full_page();
        let mut current = None;
        for line in page.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                let name = rest.split_once(' ').expect("# TYPE <name> <kind>").0;
                current = FAMILIES.iter().find(|f| f.name == name);
                continue;
            }
            if line.starts_with('#') {
                continue;
            }
            let family = current.unwrap_or_else(|| panic!("a sample before any header: {line}"));
            let name = line
                .split(['{', ' '])
                .next()
                .expect("a sample line starts with its name");
            let suffix = name.strip_prefix(family.name);
            let fits = match family.kind {
                Kind::Histogram => matches!(suffix, Some("_bucket" | "_sum" | "_count")),
                Kind::Counter | Kind::Gauge => suffix == Some(""),
            };
            assert!(fits, "{line} is written under {}", family.name);
        }
    }

    #[test]
    fn every_family_is_named_once_with_a_help_text_the_text_format_takes() {
        let mut names = HashSet::new();
        for family in FAMILIES {
            assert!(names.insert(family.name), "{} twice", family.name);
            assert!(family.name.starts_with("sheaf_"), "{}", family.name);
            assert!(
                family
                    .name
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_'),
                "{}",
                family.name
            );
            assert_eq!(
                family.name.ends_with("_total"),
                family.kind == Kind::Counter,
                "counters, and only they, end in _total: {}",
                family.name
            );
            assert!(
                !family.help.trim().is_empty(),
                "{} has no help",
                family.name
            );
            assert!(
                !family.help.contains(['\\', '\n']),
                "{}: the text format would need its help escaped",
                family.name
            );
        }
        assert!(FAMILIES.len() > 40, "{}", FAMILIES.len());
    }

    #[test]
    fn the_table_has_one_row_per_family() {
        let table = metric_table();
        let rows: Vec<&str> = table.lines().skip(2).collect();
        assert_eq!(rows.len(), FAMILIES.len(), "{table}");
        for (row, family) in rows.iter().zip(FAMILIES) {
            assert!(row.starts_with(&format!("| `{}` | ", family.name)), "{row}");
        }
    }
}
