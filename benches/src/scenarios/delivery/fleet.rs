//! The `sheaf serve` processes of one configuration: one, or several sharing its stores (the
//! JetStream configurations), started one after another with the same environment, measured
//! together (CPU summed, each one's share kept), and stopped together.

use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use crate::sheaf::{Publisher, Sheaf};

/// One configuration's processes; the first is the one the scenario configures the tenant
/// through.
pub(super) struct Fleet {
    processes: Vec<Sheaf>,
}

impl Fleet {
    /// Starts `count` processes with `env`, each logging to `log` with its number before the
    /// extension when there are several. One at a time: each migrates the shared schema and
    /// database at start, and a second process only starts once the first listens.
    pub(super) async fn start(
        bin: &Path,
        env: &[(&str, String)],
        log: &Path,
        count: usize,
    ) -> anyhow::Result<Fleet> {
        let mut processes = Vec::with_capacity(count);
        for n in 1..=count {
            let log = if count == 1 {
                log.to_path_buf()
            } else {
                log.with_extension(format!("{n}.log"))
            };
            processes.push(Sheaf::start(bin, env, &log).await?);
        }
        Ok(Fleet { processes })
    }

    /// The first process.
    pub(super) fn first(&self) -> &Sheaf {
        &self.processes[0]
    }

    /// A publisher spreading events over every process, by their seq.
    pub(super) fn publisher(&self, tenant: &str) -> Publisher {
        Publisher::across(&self.processes, tenant)
    }

    /// Each process's CPU time so far (with its children's: transformation runners).
    pub(super) fn cpu_times(&self) -> Vec<Option<Duration>> {
        self.processes.iter().map(Sheaf::cpu_time).collect()
    }

    /// The processes' resident sets, summed, in KiB.
    pub(super) fn rss_kib(&self) -> Option<u64> {
        self.processes.iter().map(Sheaf::rss_kib).sum()
    }

    /// The largest peak resident set of one process, in KiB.
    pub(super) fn peak_rss_kib(&self) -> Option<u64> {
        self.processes
            .iter()
            .map(Sheaf::peak_rss_kib)
            .collect::<Option<Vec<u64>>>()?
            .into_iter()
            .max()
    }

    /// What each process did over the run so far, from its `/metrics`; a process whose page
    /// cannot be read counts zeros.
    pub(super) async fn counters(&self) -> Vec<Counters> {
        let mut all = Vec::with_capacity(self.processes.len());
        for process in &self.processes {
            let page = process.metrics().await.unwrap_or_default();
            all.push(Counters::read(&page));
        }
        all
    }

    /// Stops every process (SIGTERM, a graceful stop); the first failure is returned after all
    /// were asked to stop.
    pub(super) async fn stop(self) -> anyhow::Result<()> {
        let mut outcome = Ok(());
        for process in self.processes {
            let stopped = process.stop().await;
            if outcome.is_ok() {
                outcome = stopped;
            }
        }
        outcome
    }
}

/// One process's counters over a run: how the work spread over the fleet.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct Counters {
    /// Publishes it accepted.
    pub(super) published: f64,
    /// Jobs its workers handled, every outcome.
    pub(super) handled: f64,
    /// Jobs its dispatcher claimed from the queue.
    pub(super) claimed: f64,
    /// First deliveries whose payload it read from the log store: jobs of events another
    /// process accepted (or that left its fresh-event cache).
    pub(super) payloads_from_log: f64,
    /// The queries those reads and the publishes' idempotency checks took (batched).
    pub(super) event_lookup_queries: f64,
    /// Writes to the log store (each one `INSERT` of one table's batch) and the rows in them.
    pub(super) log_writes: f64,
    pub(super) log_rows: f64,
    pub(super) leases_lost: f64,
}

impl Counters {
    fn read(page: &str) -> Self {
        Counters {
            published: sum(page, "sheaf_events_published_total"),
            handled: sum(page, "sheaf_deliveries_total"),
            claimed: sum(page, "sheaf_jobs_claimed_total"),
            payloads_from_log: sum(page, "sheaf_fresh_event_cache_misses_total"),
            event_lookup_queries: sum(page, "sheaf_event_lookup_queries_total"),
            log_writes: sum(page, "sheaf_log_writes_total"),
            log_rows: sum(page, "sheaf_log_write_rows_total"),
            leases_lost: sum(page, "sheaf_leases_lost_total"),
        }
    }

    /// What was counted between `before` and this reading.
    pub(super) fn since(&self, before: &Counters) -> Counters {
        Counters {
            published: self.published - before.published,
            handled: self.handled - before.handled,
            claimed: self.claimed - before.claimed,
            payloads_from_log: self.payloads_from_log - before.payloads_from_log,
            event_lookup_queries: self.event_lookup_queries - before.event_lookup_queries,
            log_writes: self.log_writes - before.log_writes,
            log_rows: self.log_rows - before.log_rows,
            leases_lost: self.leases_lost - before.leases_lost,
        }
    }

    /// Every process's counters added up.
    pub(super) fn total(all: &[Counters]) -> Counters {
        let zero = Counters::default();
        all.iter().fold(zero, |sum, c| Counters {
            published: sum.published + c.published,
            handled: sum.handled + c.handled,
            claimed: sum.claimed + c.claimed,
            payloads_from_log: sum.payloads_from_log + c.payloads_from_log,
            event_lookup_queries: sum.event_lookup_queries + c.event_lookup_queries,
            log_writes: sum.log_writes + c.log_writes,
            log_rows: sum.log_rows + c.log_rows,
            leases_lost: sum.leases_lost + c.leases_lost,
        })
    }
}

/// Every sample of the counter `name` on a Prometheus page, whatever its labels, added up.
fn sum(page: &str, name: &str) -> f64 {
    page.lines()
        .filter(|line| !line.starts_with('#'))
        .filter_map(|line| {
            let rest = line.strip_prefix(name)?;
            let (labels, value) = rest.rsplit_once(' ')?;
            (labels.is_empty() || labels.starts_with('{')).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_counter_is_summed_over_its_labels_and_no_other_counter() {
        let page = "# TYPE sheaf_deliveries_total counter\n\
                    sheaf_deliveries_total{outcome=\"delivered\"} 7\n\
                    sheaf_deliveries_total{outcome=\"retry\"} 2\n\
                    sheaf_deliveries_total_other 100\n\
                    sheaf_jobs_claimed_total 5\n";
        assert_eq!(super::sum(page, "sheaf_deliveries_total"), 9.0);
        assert_eq!(super::sum(page, "sheaf_jobs_claimed_total"), 5.0);
        assert_eq!(super::sum(page, "sheaf_missing_total"), 0.0);
    }
}
