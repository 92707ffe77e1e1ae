//! A scenario's result: the four figures every fault is judged by (events published, delivered,
//! duplicates, recovery time), the scenario's own observations, and the checks that failed.

use std::collections::HashMap;
use std::time::{Duration, Instant};

/// What one scenario found.
#[derive(Debug)]
pub struct Report {
    /// The scenario's name.
    pub scenario: &'static str,
    /// Events accepted (answered 202), or changes committed for the CDC scenario.
    pub published: usize,
    /// Of those, how many reached the receiver (answered 200 at least once).
    pub delivered: usize,
    /// Requests answered 200 beyond the first for their event.
    pub duplicates: usize,
    /// How long after the fault ended every event accepted before that end was delivered.
    pub recovery: Option<Duration>,
    /// Observations, in order: (what, value).
    pub notes: Vec<(String, String)>,
    /// Checks that failed; empty means the scenario passed.
    pub failures: Vec<String>,
}

impl Report {
    /// An empty report for `scenario`.
    pub fn new(scenario: &'static str) -> Self {
        Self {
            scenario,
            published: 0,
            delivered: 0,
            duplicates: 0,
            recovery: None,
            notes: Vec::new(),
            failures: Vec::new(),
        }
    }

    /// Records an observation (and prints it, so a long run shows progress).
    pub fn note(&mut self, what: &str, value: impl std::fmt::Display) {
        let value = value.to_string();
        println!("  {what}: {value}");
        self.notes.push((what.to_owned(), value));
    }

    /// Records a check: `ok`, or a failure described by `what`.
    pub fn check(&mut self, ok: bool, what: impl Into<String>) {
        if !ok {
            let what = what.into();
            println!("  FAILED: {what}");
            self.failures.push(what);
        }
    }

    /// Whether every check passed.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }

    /// Fills in published, delivered and the missing-events check from what the publisher got
    /// accepted and what the receiver answered 200.
    pub fn deliveries(
        &mut self,
        accepted: &HashMap<String, Instant>,
        first_success: &HashMap<String, Instant>,
        duplicates: usize,
    ) {
        self.published = accepted.len();
        self.delivered = accepted
            .keys()
            .filter(|id| first_success.contains_key(*id))
            .count();
        self.duplicates = duplicates;
        let mut missing: Vec<&String> = accepted
            .keys()
            .filter(|id| !first_success.contains_key(*id))
            .collect();
        missing.sort();
        self.check(
            missing.is_empty(),
            format!(
                "{} accepted events were never delivered (first: {:?})",
                missing.len(),
                missing.iter().take(5).collect::<Vec<_>>()
            ),
        );
    }

    /// Prints the report as a block.
    pub fn print(&self) {
        println!(
            "\n== {}: {} ==",
            self.scenario,
            if self.passed() { "passed" } else { "FAILED" }
        );
        println!(
            "  published {}, delivered {}, duplicates {}, recovery {}",
            self.published,
            self.delivered,
            self.duplicates,
            self.recovery_text()
        );
        for (what, value) in &self.notes {
            println!("  {what}: {value}");
        }
        for failure in &self.failures {
            println!("  FAILED: {failure}");
        }
    }

    /// The recovery time, or `-` when there is none.
    pub fn recovery_text(&self) -> String {
        self.recovery
            .map_or_else(|| "-".to_owned(), |d| format!("{:.1} s", d.as_secs_f64()))
    }
}

/// How long after `fault_end` every event accepted before it was first delivered: the time the
/// service needed to catch up on what the fault held back. `None` when one of them was never
/// delivered; zero when none was held back past the end.
pub fn recovery_after(
    fault_end: Instant,
    accepted: &HashMap<String, Instant>,
    first_success: &HashMap<String, Instant>,
) -> Option<Duration> {
    let mut latest = Duration::ZERO;
    for (id, at) in accepted {
        if *at > fault_end {
            continue;
        }
        let delivered = first_success.get(id)?;
        latest = latest.max(delivered.saturating_duration_since(fault_end));
    }
    Some(latest)
}

/// Seconds from `t0` to `t`, for notes (`+3.2 s`).
pub fn at(t0: Instant, t: Instant) -> String {
    format!("+{:.1} s", t.saturating_duration_since(t0).as_secs_f64())
}

/// A duration in seconds, for notes.
pub fn secs(d: Duration) -> String {
    format!("{:.1} s", d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recovery_counts_only_events_accepted_before_the_end() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let accepted: HashMap<String, Instant> = [
            ("a".to_owned(), ms(0)),
            ("b".to_owned(), ms(100)),
            ("c".to_owned(), ms(900)),
        ]
        .into();
        let mut delivered: HashMap<String, Instant> = [
            ("a".to_owned(), ms(50)),
            ("b".to_owned(), ms(2_500)),
            ("c".to_owned(), ms(5_000)),
        ]
        .into();
        // The fault ended at 500 ms: `b` was held back until 2.5 s; `c` came after the end.
        assert_eq!(
            recovery_after(ms(500), &accepted, &delivered),
            Some(Duration::from_millis(2_000))
        );
        delivered.remove("b");
        assert_eq!(recovery_after(ms(500), &accepted, &delivered), None);
        assert_eq!(
            recovery_after(ms(10_000), &accepted, &[("a".to_owned(), ms(1))].into()),
            None
        );
    }
}
