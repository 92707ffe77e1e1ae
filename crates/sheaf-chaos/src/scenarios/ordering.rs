//! `ordering`: per-key ordered delivery survives a SIGKILL and the expiry of the dead process's
//! leases. Two `sheaf` processes share Postgres (queue) and ClickHouse (log); the tenant's one
//! destination is ordered by `/data/key`. Each of 30 keys (50 at full size) gets 10 events (40)
//! `{"key": "k07", "seq": 1…n}`, published one after the other (the next only once the previous
//! was answered 202) alternately through both processes, the keys side by side. The receiver
//! answers after 400 ms, so most keys' first waiting job is leased by one process or the other
//! at any moment, and answers every 5th request 503, so retries hold keys back in the middle of
//! their runs. Once a quarter of the events arrived, and as soon as the victim's own counters
//! say it holds a fifth as many jobs as there are keys (claims come in batches, so its share
//! swings between a few and most of them), one process is SIGKILLed. The jobs it held stay
//! leased (found as `kill` finds them: leased at the kill, on the same lease 1.5 s later) and
//! hold their keys back until the lease ends; the survivor must then deliver each of them
//! before anything later of its key.
//!
//! The order check reads every request the receiver answered, whatever its status, with when it
//! arrived and when it was answered. For one key, when a request arrives, let `done` be the
//! longest run `1..=done` of the key's events already answered 2xx, and `top` the highest seq
//! answered 2xx. A request for `seq` is
//!
//! - in order when `seq == done + 1` (the next event: its first try or a retry);
//! - a repeat when `seq == done` (the last delivered event again, as when the victim delivered
//!   it but died before recording it): allowed, counted;
//! - out of order otherwise, or when `top > seq`: an event tried before every earlier one
//!   succeeded (even a try that fails), or an earlier event tried after a later one succeeded.
//!
//! That is the promise of docs/api.md ("Ordering": an event is never attempted before the one
//! published before it succeeded or was dead-lettered) without dead letters: the suite's retry
//! schedule never gives up within a run, and the final checks require none. Each request's
//! arrival is compared with the answers to the earlier ones, not merely put in answer order:
//! the receiver answers after its delay, so two overlapping requests would otherwise look
//! sequential.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::{Delivery, Failing, Receiver};
use tokio::task::JoinHandle;

use crate::api::{Api, Published, Targets, metric, publish_until_accepted};
use crate::env::{Ctx, QUEUE_LEASE};
use crate::report::{Report, secs};
use crate::sheaf;

use super::{TENANT, after_the_kill, claimed_jobs, settle, stranded_recovery, wait_until};

/// The JSON pointer the destination is ordered by.
const ORDER_KEY: &str = "/data/key";

/// How long one event may keep being retried before the publisher gives up on it.
const GIVE_UP_AFTER: Duration = Duration::from_secs(180);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("ordering");
    let load = Load::sized(ctx.quick);
    let schema = ctx.unique("ordering");
    let settings = ctx.sheaf_settings(&schema, &schema);
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(400))
        .failing(Failing::EveryNth(5))
        .start()
        .await?;
    let (a, b) = tokio::join!(
        sheaf::spawn(ctx, "ordering", "a", &settings),
        sheaf::spawn(ctx, "ordering", "b", &settings)
    );
    let (a, b) = (a?, b?);
    let api = Api::new(Duration::from_secs(10))?;
    ordered_destination(&api, &a.base(), &receiver.url()).await?;
    let targets = Targets::new(&[a.base(), b.base()]);
    report.note(
        "load",
        format!(
            "{} keys × {} events, each key's next event published once the previous was accepted, {} apart, alternately to both processes",
            load.keys,
            load.per_key,
            secs(load.gap)
        ),
    );
    let publishing = load.publish(api.clone(), targets.clone());

    // Mid-burst: once a quarter of the events arrived, and at a moment the victim holds a fair
    // share of the keys' leases (claims come in batches, so the share swings between a few and
    // most of them).
    wait_until(Duration::from_secs(120), || {
        receiver.delivered_count() >= load.events() / 4
    })
    .await;
    let in_hand = wait_for_jobs_in_hand(&api, &a, load.keys / 5, Duration::from_secs(10)).await;
    targets.remove(&a.base());
    report.note(
        "kill",
        format!(
            "after {} deliveries, sheaf a holding {in_hand} jobs by its own counters",
            receiver.delivered_count()
        ),
    );
    let killed = kill(ctx, &mut report, a, &schema).await?;

    let published = publishing.await?;
    let before = published
        .accepted
        .values()
        .filter(|at| **at < killed.at)
        .count();
    report.note(
        "events accepted before the kill",
        format!("{before} of {}", published.accepted.len()),
    );
    settle(ctx, &mut report, &schema, &receiver, &published).await?;
    let (came_back, text) = stranded_recovery(&killed.held, &receiver, killed.at, "sheaf a");
    report.note("held jobs delivered by sheaf b", text);
    report.check(
        came_back == killed.held.len(),
        format!(
            "only {came_back} of the {} held jobs were delivered after the kill",
            killed.held.len()
        ),
    );
    check_order(&mut report, &receiver.deliveries());
    after_the_kill(
        ctx,
        report,
        (&api, b, &schema),
        (killed.at, &published, &receiver),
        &[
            "sheaf_jobs_claimed_total",
            "sheaf_leases_lost_total",
            "sheaf_deliveries_total{outcome=\"success\"}",
            "sheaf_deliveries_total{outcome=\"failed\"}",
        ],
    )
    .await
}

/// What the kill left: when it was, and the jobs the killed process held (their event ids).
#[derive(Debug)]
struct Killed {
    at: Instant,
    held: Vec<String>,
}

/// SIGKILLs `victim` and finds the jobs it held: those leased at the kill and still on the same
/// lease 1.5 s later (the survivor settles its own within a few hundred milliseconds, and nobody
/// can take a running lease). Checks that every queued job was ordered and that the victim held
/// some, or the run proves nothing about leases running out under a key.
async fn kill(
    ctx: &Ctx,
    report: &mut Report,
    victim: SheafProcess,
    schema: &str,
) -> anyhow::Result<Killed> {
    let leased_at_kill = claimed_jobs(ctx, schema).await?;
    let (queued, ordered) = ordered_jobs(ctx, schema).await?;
    let pid = victim.pid();
    let at = Instant::now();
    victim.kill()?;
    report.note(
        "killed",
        format!(
            "sheaf a (pid {pid}) with SIGKILL; jobs leased by both processes at that moment: {}; jobs queued: {queued}, {ordered} of them with an order key",
            leased_at_kill.len()
        ),
    );
    report.check(
        queued > 0 && ordered == queued,
        format!(
            "{} of the {queued} queued jobs had no order key",
            queued - ordered
        ),
    );
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let still = claimed_jobs(ctx, schema).await?;
    let held: Vec<String> = leased_at_kill
        .iter()
        .filter(|job| still.contains(job))
        .map(|job| job.event_id.clone())
        .collect();
    report.note(
        "ordered jobs held by the killed process",
        format!(
            "{} (still on the lease they had at the kill, 1.5 s later; lease {}): {}",
            held.len(),
            secs(QUEUE_LEASE),
            held.join(", ")
        ),
    );
    report.check(
        !held.is_empty(),
        "the killed process held no job at the kill: no lease ran out under an ordered key",
    );
    Ok(Killed { at, held })
}

/// Creates the tenant and its one webhook destination, ordered by [`ORDER_KEY`].
async fn ordered_destination(api: &Api, base: &str, url: &str) -> anyhow::Result<()> {
    api.tenant(base, TENANT).await?;
    let destination = json!({
        "type": "webhook",
        "topics": ["*"],
        "config": { "url": url },
        "ordering": { "key": ORDER_KEY },
    });
    let (status, answer) = api
        .call(
            reqwest::Method::POST,
            base,
            &format!("/api/v1/tenants/{TENANT}/destinations"),
            Some(&destination),
        )
        .await?;
    anyhow::ensure!(
        status == 201 && answer["ordering"]["key"] == ORDER_KEY,
        "creating the ordered destination answered {status}: {answer}"
    );
    Ok(())
}

/// Waits (at most `timeout`) until `sheaf`'s own counters say it holds at least `at_least` jobs:
/// leased (claimed, or handed over by the commit of a publish it took) with neither an outcome
/// written nor the lease released. Returns the last figure read.
async fn wait_for_jobs_in_hand(
    api: &Api,
    sheaf: &SheafProcess,
    at_least: usize,
    timeout: Duration,
) -> usize {
    let deadline = Instant::now() + timeout;
    loop {
        let held = match api.metrics(&sheaf.base()).await {
            Ok(page) => {
                let count = |name| metric(&page, name).unwrap_or(0.0);
                count("sheaf_jobs_claimed_total") + count("sheaf_jobs_handed_over_total")
                    - count("sheaf_completer_outcomes_total")
                    - count("sheaf_jobs_released_total")
            }
            Err(_) => 0.0,
        };
        let held = held.max(0.0) as usize;
        if held >= at_least || Instant::now() >= deadline {
            return held;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Jobs in the queue, and how many of them carry an order key (all of them should: every
/// event has a key, and the one destination is ordered).
async fn ordered_jobs(ctx: &Ctx, schema: &str) -> anyhow::Result<(i64, i64)> {
    Ok(sqlx::query_as::<_, (i64, i64)>(&format!(
        "SELECT count(*), count(order_key) FROM {schema}.jobs"
    ))
    .fetch_one(&ctx.pg)
    .await?)
}

/// The publisher: keys side by side, each key's events one after the other.
#[derive(Debug, Clone, Copy)]
struct Load {
    keys: usize,
    per_key: usize,
    /// Between a publish's 202 and the next publish of its key.
    gap: Duration,
}

impl Load {
    /// 30 keys × 10 events with `--quick`, 50 × 40 at full size. 400 ms between a key's
    /// publishes keeps the burst going past the kill; the receiver's pace (about 0.45 s per
    /// event and key, 0.7 s with the retries) still lets each key's backlog grow, so its next
    /// job waits behind every lease and every retry.
    fn sized(quick: bool) -> Self {
        let (keys, per_key) = if quick { (30, 10) } else { (50, 40) };
        Self {
            keys,
            per_key,
            gap: Duration::from_millis(400),
        }
    }

    fn events(self) -> usize {
        self.keys * self.per_key
    }

    /// Publishes every key's events, `seq` 1 to `per_key`: the next only once the previous was
    /// accepted (which fixes the order the promise is about), each to the process after the
    /// one the previous went to. Runs in the background; a key whose event is given up on
    /// stops there (the final checks report the event).
    fn publish(self, api: Api, targets: Targets) -> JoinHandle<Published> {
        tokio::spawn(async move {
            let outcome = Arc::new(Mutex::new(Published::default()));
            let keys = (0..self.keys).map(|k| {
                let (api, targets, outcome) = (api.clone(), targets.clone(), Arc::clone(&outcome));
                async move {
                    for seq in 1..=self.per_key {
                        let data = json!({ "key": format!("k{k:02}"), "seq": seq });
                        let id = format!("ordering-k{k:02}-{seq:03}");
                        let pick = k + seq;
                        if !publish_until_accepted(
                            &api,
                            &targets,
                            TENANT,
                            &id,
                            &data,
                            pick,
                            GIVE_UP_AFTER,
                            &outcome,
                        )
                        .await
                        {
                            return;
                        }
                        tokio::time::sleep(self.gap).await;
                    }
                }
            });
            futures::future::join_all(keys).await;
            let mut outcome = outcome.lock().unwrap_or_else(|e| e.into_inner());
            std::mem::take(&mut *outcome)
        })
    }
}

/// Counts the receiver's requests by the rule of the module docs and checks that none was out
/// of order and that some failed (or no retry was put to the test).
fn check_order(report: &mut Report, deliveries: &[Delivery]) {
    let attempts: Vec<Attempt> = deliveries.iter().filter_map(Attempt::read).collect();
    let unreadable = deliveries.len() - attempts.len();
    report.check(
        unreadable == 0,
        format!("{unreadable} requests carried no key and seq"),
    );
    let count = count_order(&attempts);
    report.note(
        "requests at the receiver",
        format!("{}, {} of them answered 503", count.requests, count.failed),
    );
    report.note(
        "per-key order",
        format!(
            "{} requests out of order; {} repeats of a key's last delivered event",
            count.out_of_order, count.repeats
        ),
    );
    report.check(
        count.out_of_order == 0,
        format!(
            "{} requests were out of order (first: {})",
            count.out_of_order,
            count.examples.join("; ")
        ),
    );
    report.check(
        count.failed > 0,
        "the receiver failed no request, so no retry was put to the test",
    );
}

/// One request the receiver answered, as the order check reads it.
#[derive(Debug, Clone)]
struct Attempt {
    key: String,
    seq: u64,
    arrived: Instant,
    answered: Instant,
    succeeded: bool,
}

impl Attempt {
    /// The request's key and seq (from its body, the event's data); `None` when it has none.
    fn read(delivery: &Delivery) -> Option<Self> {
        let body: Value = serde_json::from_slice(&delivery.body).ok()?;
        Some(Self {
            key: body["key"].as_str()?.to_owned(),
            seq: body["seq"].as_u64()?,
            arrived: delivery.arrived,
            answered: delivery.answered,
            succeeded: (200..300).contains(&delivery.status),
        })
    }
}

/// What the order check counted.
#[derive(Debug, Default, PartialEq, Eq)]
struct OrderCount {
    requests: usize,
    failed: usize,
    repeats: usize,
    out_of_order: usize,
    /// The first few requests out of order, described.
    examples: Vec<String>,
}

/// How many requests out of order describe themselves in the failure.
const EXAMPLES: usize = 5;

/// Counts `attempts` (in any order) by the rule of the module docs.
fn count_order(attempts: &[Attempt]) -> OrderCount {
    let mut by_key: BTreeMap<&str, Vec<&Attempt>> = BTreeMap::new();
    for attempt in attempts {
        by_key.entry(&attempt.key).or_default().push(attempt);
    }
    let mut count = OrderCount::default();
    for (key, mut tries) in by_key {
        tries.sort_by_key(|a| a.arrived);
        let mut successes: Vec<&Attempt> = tries.iter().copied().filter(|a| a.succeeded).collect();
        successes.sort_by_key(|a| a.answered);
        let mut successes = successes.into_iter().peekable();
        let mut delivered = BTreeSet::new();
        let (mut done, mut top) = (0, 0);
        for attempt in tries {
            while let Some(success) = successes.next_if(|s| s.answered < attempt.arrived) {
                delivered.insert(success.seq);
                top = top.max(success.seq);
            }
            while delivered.contains(&(done + 1)) {
                done += 1;
            }
            count.requests += 1;
            if !attempt.succeeded {
                count.failed += 1;
            }
            let seq = attempt.seq;
            if top > seq || (seq != done + 1 && seq != done) {
                count.out_of_order += 1;
                if count.examples.len() < EXAMPLES {
                    count.examples.push(format!(
                        "{key}: {seq} tried when 1..={done} were delivered, {top} the highest"
                    ));
                }
            } else if seq == done {
                count.repeats += 1;
            }
        }
    }
    count
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Requests of key `k`, each `(seq, arrived ms, answered ms, succeeded)`.
    fn tries(list: &[(u64, u64, u64, bool)]) -> Vec<Attempt> {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        list.iter()
            .map(|&(seq, arrived, answered, succeeded)| Attempt {
                key: "k".to_owned(),
                seq,
                arrived: ms(arrived),
                answered: ms(answered),
                succeeded,
            })
            .collect()
    }

    #[test]
    fn retries_and_repeats_of_the_last_delivered_event_are_in_order() {
        // 1 fails and is retried; 2 is delivered, then delivered again (a repeat); 3 follows.
        let count = count_order(&tries(&[
            (1, 0, 200, false),
            (1, 1_200, 1_400, true),
            (2, 1_500, 1_700, true),
            (2, 6_000, 6_200, true),
            (3, 6_300, 6_500, true),
        ]));
        assert_eq!(count.requests, 5);
        assert_eq!(count.failed, 1);
        assert_eq!(count.repeats, 1);
        assert_eq!(count.out_of_order, 0, "{:?}", count.examples);
    }

    #[test]
    fn a_try_before_the_previous_event_succeeded_is_out_of_order_even_when_it_fails() {
        // 2 arrives while 1 is still waiting for its answer.
        let count = count_order(&tries(&[
            (1, 0, 200, true),
            (2, 100, 300, false),
            (2, 400, 600, true),
        ]));
        assert_eq!(count.out_of_order, 1);
        assert_eq!(
            count.examples,
            ["k: 2 tried when 1..=0 were delivered, 0 the highest"]
        );
    }

    #[test]
    fn an_earlier_event_after_a_later_one_is_out_of_order() {
        let count = count_order(&tries(&[
            (1, 0, 200, true),
            (2, 300, 500, true),
            (1, 600, 800, true),
            (3, 900, 1_000, true),
        ]));
        assert_eq!(count.out_of_order, 1, "{:?}", count.examples);
        assert_eq!(count.repeats, 0);
    }

    #[test]
    fn keys_are_counted_apart() {
        let mut both = tries(&[(1, 0, 200, true), (2, 300, 500, true)]);
        let mut other = tries(&[(1, 100, 250, true)]);
        other[0].key = "other".to_owned();
        both.append(&mut other);
        assert_eq!(count_order(&both).out_of_order, 0);
    }
}
