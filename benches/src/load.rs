//! Publishing load for the service scenarios: a given number of events, either as fast as a fixed
//! number of concurrent publishers can (saturation) or at a fixed rate (steady), each publish's
//! start time recorded on the bench's clock, and each event's first delivery read back from the
//! receiver on the same clock, for publish-to-delivery latency.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sheaf_testenv::receiver::Receiver;
use tokio::sync::Semaphore;

use crate::progress::Progress;
use crate::sheaf::Publisher;

/// What a load run sent.
#[derive(Debug)]
pub struct Sent {
    /// Publish start per event, in microseconds after the base (index = seq - first seq).
    pub started_micros: Vec<u64>,
    /// How long each accepted publish took to be answered 202, in microseconds (the publish
    /// latency a client sees; refused and failed publishes are not in it).
    pub publish_micros: Vec<u64>,
    /// When each publish was answered 202, in microseconds after the base (index = seq - first
    /// seq; 0 when it was not accepted): publishes accepted per second, for the delivery
    /// scenario's per-second record of its steady phase.
    pub accepted_micros: Vec<u64>,
    /// Publishes answered with something other than 202.
    pub refused: u64,
    /// Publishes that failed on the network.
    pub errors: u64,
    /// From the first publish to the last answer.
    pub elapsed: Duration,
}

/// How to pace the publishes.
#[derive(Debug, Clone, Copy)]
pub enum Pace {
    /// As fast as this many publishers in flight allow.
    Saturate(usize),
    /// This many events per second (at most 512 publishes in flight).
    Rate(f64),
}

/// Publishes events `first_seq..first_seq + count` with a payload `pad` of ~`pad.len()` bytes.
pub async fn publish(
    publisher: &Publisher,
    base: Instant,
    first_seq: u64,
    count: usize,
    pace: Pace,
    pad: Arc<String>,
    progress: &Arc<Progress>,
) -> Sent {
    let in_flight = match pace {
        Pace::Saturate(n) => n,
        Pace::Rate(_) => 512,
    };
    let permits = Arc::new(Semaphore::new(in_flight));
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let refused = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(AtomicU64::new(0));
    let answered: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let accepted: Arc<Vec<AtomicU64>> = Arc::new((0..count).map(|_| AtomicU64::new(0)).collect());
    let t0 = Instant::now();
    let mut tasks = Vec::with_capacity(count);
    for i in 0..count {
        if let Pace::Rate(rate) = pace {
            let due = t0 + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let Ok(permit) = Arc::clone(&permits).acquire_owned().await else {
            break;
        };
        let (publisher, pad, started, answered, accepted, refused, errors, progress) = (
            publisher.clone(),
            Arc::clone(&pad),
            Arc::clone(&started),
            Arc::clone(&answered),
            Arc::clone(&accepted),
            Arc::clone(&refused),
            Arc::clone(&errors),
            Arc::clone(progress),
        );
        tasks.push(tokio::spawn(async move {
            let _permit = permit;
            let start = Instant::now();
            started[i].store(
                start.duration_since(base).as_micros() as u64,
                Ordering::Relaxed,
            );
            match publisher.publish(first_seq + i as u64, &pad).await {
                Ok(true) => {
                    // At least 1 µs, so 0 keeps meaning "not accepted".
                    let took = (start.elapsed().as_micros() as u64).max(1);
                    answered[i].store(took, Ordering::Relaxed);
                    let at = start.duration_since(base).as_micros() as u64 + took;
                    accepted[i].store(at, Ordering::Relaxed);
                }
                Ok(false) => {
                    refused.fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            progress.inc(1);
        }));
    }
    for task in tasks {
        let _ = task.await;
    }
    Sent {
        started_micros: started.iter().map(|a| a.load(Ordering::Relaxed)).collect(),
        publish_micros: answered
            .iter()
            .map(|a| a.load(Ordering::Relaxed))
            .filter(|&took| took > 0)
            .collect(),
        accepted_micros: accepted.iter().map(|a| a.load(Ordering::Relaxed)).collect(),
        refused: refused.load(Ordering::Relaxed),
        errors: errors.load(Ordering::Relaxed),
        elapsed: t0.elapsed(),
    }
}

/// Publish-to-delivery latencies in milliseconds of the events of `sent` that were delivered,
/// and the time of the last delivery in microseconds after the base.
pub fn latencies(
    sent: &Sent,
    first_seq: u64,
    delivered: &std::collections::HashMap<u64, u64>,
) -> (Vec<f64>, u64) {
    let mut out = Vec::with_capacity(sent.started_micros.len());
    let mut last = 0;
    for (i, start) in sent.started_micros.iter().enumerate() {
        if let Some(at) = delivered.get(&(first_seq + i as u64)) {
            out.push(at.saturating_sub(*start) as f64 / 1000.0);
            last = last.max(*at);
        }
    }
    (out, last)
}

/// When each event (by the `seq` in its JSON body) was first answered 2xx by `receiver`, in
/// microseconds after `base`: the time its request arrived, on the bench process's clock, so
/// publish-to-delivery latency needs no clock but one.
pub fn delivered_at(receiver: &Receiver, base: Instant) -> std::collections::HashMap<u64, u64> {
    let mut first = std::collections::HashMap::new();
    for delivery in receiver.deliveries().iter().filter(|d| d.status == 200) {
        let seq = serde_json::from_slice::<serde_json::Value>(&delivery.body)
            .ok()
            .and_then(|v| v.get("seq").and_then(serde_json::Value::as_u64));
        if let Some(seq) = seq {
            let micros = delivery.arrived.duration_since(base).as_micros() as u64;
            first
                .entry(seq)
                .and_modify(|at: &mut u64| *at = (*at).min(micros))
                .or_insert(micros);
        }
    }
    first
}
