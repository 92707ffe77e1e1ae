//! The two kinds of load the backpressure scenarios put on a process, both on unique event ids:
//!
//! - [`closed_loop`]: N publishers, each sending its next event as soon as the last one was
//!   accepted, and trying a refused one again after its `Retry-After`: what well-behaved
//!   clients do, and how a service's capacity is measured.
//! - [`open_loop`]: events started at a fixed rate whatever the latency (each on its own task,
//!   tried once), so a process that slows down or refuses does not slow the offered load down
//!   with it: what an overload is.
//!
//! Both record every answer: what was accepted (and how long its `202` took), what was refused
//! with `503`, whether each refusal said when to come back, and anything else.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::task::JoinHandle;

use crate::api::{Api, TOPIC, event_data};

/// What one load got from the process.
#[derive(Debug, Default)]
pub struct Load {
    /// Events answered `202`, and when.
    pub accepted: HashMap<String, Instant>,
    /// When each accepted publish was sent, and how long it took.
    pub latencies: Vec<(Instant, Duration)>,
    /// Publishes answered `503`.
    pub refused: usize,
    /// Of those, how many came without a `Retry-After`.
    pub refused_without_retry_after: usize,
    /// Other answers (or none), by status or `no answer`.
    pub other: HashMap<String, usize>,
    /// Events the load meant to start and could not (an open loop whose in-flight bound was
    /// full): the generator could not keep its rate.
    pub not_started: usize,
    /// When the load began and ended.
    pub began: Option<Instant>,
    /// When the last publish was answered.
    pub ended: Option<Instant>,
}

impl Load {
    /// Accepted publishes per second over the load's span.
    pub fn accepted_per_second(&self) -> f64 {
        match (self.began, self.ended) {
            (Some(began), Some(ended)) if ended > began => {
                self.accepted.len() as f64 / (ended - began).as_secs_f64()
            }
            _ => 0.0,
        }
    }

    /// The `q` quantile (0..=1) of the accepted publishes' latency.
    pub fn latency_quantile(&self, q: f64) -> Duration {
        self.latency_quantile_between(q, None, None)
    }

    /// The `q` quantile of the latency of the accepted publishes sent between `from` and `to`
    /// (either end open when `None`).
    pub fn latency_quantile_between(
        &self,
        q: f64,
        from: Option<Instant>,
        to: Option<Instant>,
    ) -> Duration {
        let mut sorted: Vec<Duration> = self
            .latencies
            .iter()
            .filter(|(sent, _)| from.is_none_or(|f| *sent >= f) && to.is_none_or(|t| *sent < t))
            .map(|(_, took)| *took)
            .collect();
        sorted.sort();
        if sorted.is_empty() {
            return Duration::ZERO;
        }
        let at = ((sorted.len() - 1) as f64 * q).round() as usize;
        sorted[at.min(sorted.len() - 1)]
    }

    /// Other answers as `answer × count, …`.
    pub fn other_text(&self) -> String {
        if self.other.is_empty() {
            return "none".to_owned();
        }
        let mut parts: Vec<String> = self
            .other
            .iter()
            .map(|(k, v)| format!("{k} × {v}"))
            .collect();
        parts.sort();
        parts.join(", ")
    }

    /// Every answer that was neither a `202` nor a `503`.
    pub fn other_total(&self) -> usize {
        self.other.values().sum()
    }

    fn record(&mut self, id: &str, sent: Instant, answer: &anyhow::Result<(u16, Option<u64>)>) {
        let now = Instant::now();
        self.ended = Some(self.ended.map_or(now, |e| e.max(now)));
        match answer {
            Ok((202, _)) => {
                self.accepted.insert(id.to_owned(), now);
                self.latencies.push((sent, now - sent));
            }
            Ok((503, retry_after)) => {
                self.refused += 1;
                if retry_after.is_none() {
                    self.refused_without_retry_after += 1;
                }
            }
            Ok((status, _)) => *self.other.entry(status.to_string()).or_default() += 1,
            Err(_) => *self.other.entry("no answer".to_owned()).or_default() += 1,
        }
    }
}

/// `publishers` closed-loop publishers on `base` until `until`: see the module docs. Event ids
/// are `<scenario>-<publisher>-<n>`.
pub fn closed_loop(
    api: Api,
    base: String,
    tenant: &str,
    scenario: &'static str,
    publishers: usize,
    until: Instant,
) -> JoinHandle<Load> {
    let tenant = tenant.to_owned();
    tokio::spawn(async move {
        let load = Arc::new(Mutex::new(Load {
            began: Some(Instant::now()),
            ..Load::default()
        }));
        let tasks: Vec<_> = (0..publishers)
            .map(|p| {
                let (api, base, tenant, load) =
                    (api.clone(), base.clone(), tenant.clone(), Arc::clone(&load));
                tokio::spawn(async move {
                    let mut n = 0usize;
                    'events: while Instant::now() < until {
                        let id = format!("{scenario}-{p:02}-{n:06}");
                        let data = event_data(scenario, n);
                        n += 1;
                        loop {
                            let sent = Instant::now();
                            let answer =
                                api.publish_answer(&base, &tenant, TOPIC, &id, &data).await;
                            load.lock()
                                .unwrap_or_else(|e| e.into_inner())
                                .record(&id, sent, &answer);
                            let wait = match answer {
                                Ok((202, _)) => continue 'events,
                                Ok((503, Some(seconds))) => Duration::from_secs(seconds.max(1)),
                                _ => Duration::from_millis(100),
                            };
                            if Instant::now() + wait >= until {
                                break 'events;
                            }
                            tokio::time::sleep(wait).await;
                        }
                    }
                })
            })
            .collect();
        for task in tasks {
            let _ = task.await;
        }
        let mut load = load.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *load)
    })
}

/// Events started at `rate` per second on `base` for `span`, each tried once on its own task,
/// at most `in_flight` at a time (beyond it an event is counted as not started): see the
/// module docs. Event ids are `<scenario>-<n>`.
pub fn open_loop(
    api: Api,
    base: String,
    tenant: &str,
    scenario: &'static str,
    rate: f64,
    span: Duration,
    in_flight: usize,
) -> JoinHandle<Load> {
    let tenant = tenant.to_owned();
    tokio::spawn(async move {
        let load = Arc::new(Mutex::new(Load::default()));
        let permits = Arc::new(tokio::sync::Semaphore::new(in_flight));
        let start = tokio::time::Instant::now();
        load.lock().unwrap_or_else(|e| e.into_inner()).began = Some(Instant::now());
        let total = (rate * span.as_secs_f64()) as usize;
        let mut tasks = Vec::with_capacity(total);
        for n in 0..total {
            tokio::time::sleep_until(start + Duration::from_secs_f64(n as f64 / rate)).await;
            let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
                load.lock().unwrap_or_else(|e| e.into_inner()).not_started += 1;
                continue;
            };
            let (api, base, tenant, load) =
                (api.clone(), base.clone(), tenant.clone(), Arc::clone(&load));
            tasks.push(tokio::spawn(async move {
                let id = format!("{scenario}-{n:07}");
                let sent = Instant::now();
                let answer = api
                    .publish_answer(&base, &tenant, TOPIC, &id, &event_data(scenario, n))
                    .await;
                load.lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .record(&id, sent, &answer);
                drop(permit);
            }));
        }
        for task in tasks {
            let _ = task.await;
        }
        let mut load = load.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::take(&mut *load)
    })
}
