//! The load and probes the scenarios run with the shared client for the `sheaf` HTTP API
//! (`sheaf_testenv::api`): a paced publisher that retries each event until some process
//! accepts it, a `/readyz` poller, and an RSS sampler.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use serde_json::{Value, json};
use sheaf_engine::backoff::Backoff;
use sheaf_testenv::process::status_kib;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::report::{Report, at, secs};

/// The client for the API of any `sheaf` process (the shared one).
pub use sheaf_testenv::api::Api;

/// The topic every scenario publishes with.
pub const TOPIC: &str = "chaos.event";

/// One sample of a Prometheus page (`name` with its labels, as printed).
pub use sheaf_testenv::process::metric_sample as metric;

/// The base URLs publishes go to; a scenario removes a process before it stops it and adds the
/// one it starts.
#[derive(Debug, Clone, Default)]
pub struct Targets(Arc<RwLock<Vec<String>>>);

impl Targets {
    /// Targets with these base URLs.
    pub fn new(bases: &[String]) -> Self {
        Self(Arc::new(RwLock::new(bases.to_vec())))
    }

    /// Sends further publishes to `base` too.
    pub fn add(&self, base: String) {
        self.0.write().unwrap_or_else(|e| e.into_inner()).push(base);
    }

    /// Sends no further publishes to `base`.
    pub fn remove(&self, base: &str) {
        self.0
            .write()
            .unwrap_or_else(|e| e.into_inner())
            .retain(|b| b != base);
    }

    fn pick(&self, n: usize) -> Option<String> {
        let bases = self.0.read().unwrap_or_else(|e| e.into_inner());
        (!bases.is_empty()).then(|| bases[n % bases.len()].clone())
    }
}

/// How the publisher paces and retries.
#[derive(Debug, Clone, Copy)]
pub struct Pace {
    /// Events started per second.
    pub rate: f64,
    /// Publishes in flight (retries included) at most.
    pub concurrency: usize,
    /// How long one event may keep being retried before the publisher gives up on it.
    pub give_up_after: Duration,
}

/// What the publisher did.
#[derive(Debug, Default)]
pub struct Published {
    /// When each accepted event was first answered 202.
    pub accepted: HashMap<String, Instant>,
    /// Tries that were not answered 202, by answer (`503`, `no answer`, …).
    pub refused: HashMap<String, usize>,
    /// When each of those tries was answered (or gave up waiting for an answer).
    pub refused_at: Vec<Instant>,
    /// 202s that said `duplicate: true` (an earlier try had been recorded after all).
    pub repeats: usize,
    /// Events never accepted (the publisher gave up on them).
    pub gave_up: Vec<String>,
}

impl Published {
    /// Refused tries, all answers together.
    pub fn refused_total(&self) -> usize {
        self.refused.values().sum()
    }

    /// The refusals as `answer × count, …`.
    pub fn refused_text(&self) -> String {
        if self.refused.is_empty() {
            return "none".to_owned();
        }
        let mut parts: Vec<String> = self
            .refused
            .iter()
            .map(|(k, v)| format!("{k} × {v}"))
            .collect();
        parts.sort();
        parts.join(", ")
    }
}

/// The body of event `i`: ~1 KB, so memory figures mean something.
pub fn event_data(scenario: &str, i: usize) -> Value {
    json!({ "scenario": scenario, "n": i, "pad": "x".repeat(1_000) })
}

/// Waits between a publisher's tries of one event: 100 ms doubling to 1 s, by the service's
/// own backoff rule, so a process that is down is asked again soon after it is back.
const PUBLISH_BACKOFF: Backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));

/// Publishes `ids` (tenant `tenant`) at `pace.rate`, each retried with backoff (to whichever
/// target is next) until a process answers 202. Runs in the background.
pub fn publish_paced(
    api: Api,
    targets: Targets,
    tenant: String,
    scenario: &'static str,
    ids: Vec<String>,
    pace: Pace,
) -> JoinHandle<Published> {
    tokio::spawn(async move {
        let outcome = Arc::new(Mutex::new(Published::default()));
        let start = tokio::time::Instant::now();
        futures::stream::iter(ids.into_iter().enumerate())
            .for_each_concurrent(pace.concurrency, |(i, id)| {
                let api = api.clone();
                let targets = targets.clone();
                let tenant = tenant.clone();
                let outcome = Arc::clone(&outcome);
                async move {
                    let due = start + Duration::from_secs_f64(i as f64 / pace.rate);
                    tokio::time::sleep_until(due).await;
                    let data = event_data(scenario, i);
                    publish_until_accepted(
                        &api,
                        &targets,
                        &tenant,
                        &id,
                        &data,
                        i,
                        pace.give_up_after,
                        &outcome,
                    )
                    .await;
                }
            })
            .await;
        let mut outcome = outcome.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *outcome)
    })
}

/// Publishes one event (`id`, `data`) as `tenant`, retried with backoff until a process
/// answers 202 or `give_up_after` passes; the `n`th try goes to target `pick + n`, so
/// consecutive events and consecutive tries alternate between the processes. Records the
/// outcome in `outcome`; returns whether the event was accepted.
#[allow(clippy::too_many_arguments)]
pub async fn publish_until_accepted(
    api: &Api,
    targets: &Targets,
    tenant: &str,
    id: &str,
    data: &Value,
    pick: usize,
    give_up_after: Duration,
    outcome: &Mutex<Published>,
) -> bool {
    let deadline = Instant::now() + give_up_after;
    let mut backoff = PUBLISH_BACKOFF;
    let mut attempt = 0;
    loop {
        let answer = match targets.pick(pick + attempt) {
            Some(base) => match api.publish(&base, tenant, TOPIC, id, data).await {
                Ok((202, body)) => {
                    let mut outcome = outcome.lock().unwrap_or_else(|e| e.into_inner());
                    outcome.accepted.insert(id.to_owned(), Instant::now());
                    if body["duplicate"].as_bool() == Some(true) {
                        outcome.repeats += 1;
                    }
                    return true;
                }
                Ok((status, _)) => status.to_string(),
                Err(_) => "no answer".to_owned(),
            },
            None => "no process".to_owned(),
        };
        let give_up = Instant::now() >= deadline;
        {
            let mut guard = outcome.lock().unwrap_or_else(|e| e.into_inner());
            *guard.refused.entry(answer).or_default() += 1;
            guard.refused_at.push(Instant::now());
            if give_up {
                guard.gave_up.push(id.to_owned());
            }
        }
        if give_up {
            return false;
        }
        tokio::time::sleep(backoff.next_delay()).await;
        attempt += 1;
    }
}

/// A background probe: polls `/readyz` of one process every 100 ms until stopped.
#[derive(Debug)]
pub struct ReadyzProbe {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<(Instant, Option<u16>)>>,
}

impl ReadyzProbe {
    /// Starts polling `base`.
    pub fn start(api: Api, base: String) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !*stopped.borrow() {
                let at = Instant::now();
                let status = api.readyz(&base).await.map(|(status, _)| status);
                samples.push((at, status));
                tokio::select! {
                    _ = stopped.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(100)) => {}
                }
            }
            samples
        });
        Self { stop, task }
    }

    /// Stops polling; returns every sample (when, status or `None` for no answer).
    pub async fn finish(self) -> Vec<(Instant, Option<u16>)> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// What the `/readyz` samples say about one outage.
#[derive(Debug, Clone)]
pub struct Readiness {
    /// First sample not answered 200 at or after `from`.
    pub unready_at: Option<Instant>,
    /// First sample answered 200 after that.
    pub ready_again_at: Option<Instant>,
    /// Between the two: samples answered with another status, by status.
    pub answered: std::collections::BTreeMap<u16, usize>,
    /// Between the two: samples that got no answer within the probe's timeout.
    pub no_answer: usize,
}

impl Readiness {
    /// Notes when `/readyz` went unready and came back (relative to `t0`, and how long after
    /// `fault_end`, when `server` answered again), or fails the checks if it never did either.
    pub fn record(&self, report: &mut Report, t0: Instant, fault_end: Instant, server: &str) {
        match (self.unready_at, self.ready_again_at) {
            (Some(down), Some(up)) => report.note(
                "/readyz",
                format!(
                    "not ready from {} to {} ({}: {}), ready again {} after {server}",
                    at(t0, down),
                    at(t0, up),
                    secs(up - down),
                    self.answers_text(),
                    secs(up.saturating_duration_since(fault_end))
                ),
            ),
            (down, up) => {
                report.check(
                    down.is_some(),
                    "/readyz never stopped answering 200 during the outage",
                );
                report.check(up.is_some(), "/readyz never answered 200 again");
            }
        }
    }

    /// What the samples of the outage got, as `503 × 12, no answer within 2 s × 3`.
    pub fn answers_text(&self) -> String {
        let mut parts: Vec<String> = self
            .answered
            .iter()
            .map(|(status, n)| format!("{status} × {n}"))
            .collect();
        if self.no_answer > 0 {
            parts.push(format!(
                "no answer within {} s × {}",
                PROBE_TIMEOUT.as_secs(),
                self.no_answer
            ));
        }
        parts.join(", ")
    }
}

/// How long the `/readyz` probe waits for an answer.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(2);

/// Reads an outage out of `/readyz` samples: when it first stopped answering 200 at or after
/// `from`, and when it answered 200 again.
pub fn readiness(samples: &[(Instant, Option<u16>)], from: Instant) -> Readiness {
    let unready_at = samples
        .iter()
        .find(|(at, status)| *at >= from && *status != Some(200))
        .map(|(at, _)| *at);
    let ready_again_at = unready_at.and_then(|down| {
        samples
            .iter()
            .find(|(at, status)| *at > down && *status == Some(200))
            .map(|(at, _)| *at)
    });
    let mut answered = std::collections::BTreeMap::new();
    let mut no_answer = 0;
    if let Some(down) = unready_at {
        let up = ready_again_at.unwrap_or_else(|| samples.last().map_or(down, |(at, _)| *at));
        for (_, status) in samples.iter().filter(|(at, _)| *at >= down && *at < up) {
            match status {
                Some(status) => *answered.entry(*status).or_default() += 1,
                None => no_answer += 1,
            }
        }
    }
    Readiness {
        unready_at,
        ready_again_at,
        answered,
        no_answer,
    }
}

/// The largest RSS of a process seen by a background sampler (every 200 ms), per phase.
#[derive(Debug)]
pub struct RssSampler {
    stop: watch::Sender<bool>,
    task: JoinHandle<Vec<(Instant, u64)>>,
}

impl RssSampler {
    /// Samples `/proc/<pid>/status` `VmRSS` until stopped.
    pub fn start(pid: u32) -> Self {
        let (stop, mut stopped) = watch::channel(false);
        let task = tokio::spawn(async move {
            let mut samples = Vec::new();
            while !*stopped.borrow() {
                if let Some(kib) = status_kib(Some(pid), "VmRSS") {
                    samples.push((Instant::now(), kib));
                }
                tokio::select! {
                    _ = stopped.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(200)) => {}
                }
            }
            samples
        });
        Self { stop, task }
    }

    /// Stops sampling; returns every sample (when, KiB).
    pub async fn finish(self) -> Vec<(Instant, u64)> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// The largest sample between `from` and `to`, in MiB.
pub fn peak_mib(samples: &[(Instant, u64)], from: Instant, to: Instant) -> f64 {
    samples
        .iter()
        .filter(|(at, _)| *at >= from && *at <= to)
        .map(|(_, kib)| *kib)
        .max()
        .unwrap_or(0) as f64
        / 1024.0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_are_read_by_name_and_labels() {
        let page = "# HELP x y\nsheaf_deliveries_total{outcome=\"success\"} 12\nsheaf_claims 3\n";
        assert_eq!(
            metric(page, "sheaf_deliveries_total{outcome=\"success\"}"),
            Some(12.0)
        );
        assert_eq!(metric(page, "sheaf_claims"), Some(3.0));
        assert_eq!(metric(page, "sheaf_other"), None);
    }

    #[test]
    fn an_outage_is_read_from_readyz_samples() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let samples = [
            (at(0), Some(200)),
            (at(100), Some(200)),
            (at(200), Some(503)),
            (at(300), None),
            (at(400), Some(200)),
        ];
        let seen = readiness(&samples, at(50));
        assert_eq!(seen.unready_at, Some(at(200)));
        assert_eq!(seen.ready_again_at, Some(at(400)));
        assert_eq!(seen.answers_text(), "503 × 1, no answer within 2 s × 1");
        let none = readiness(&samples, at(450));
        assert_eq!(none.unready_at, None);
        assert_eq!(none.ready_again_at, None);
    }
}
