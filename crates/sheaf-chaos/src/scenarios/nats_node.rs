//! `nats-node`: the JetStream queue on the fault suite's NATS cluster of 3 nodes (the bucket
//! kept on all three, started for this scenario alone), tenants in its Postgres and the log in
//! its ClickHouse; two `sheaf` processes under paced load, the receiver failing every fifth
//! request so that retries are rescheduled in the bucket. The node leading the bucket's stream
//! (read from the stream's cluster info; `n1` if none answers) is SIGKILLed, left down for 30 s
//! (10 s with `--quick`), and started again with its configuration, ports and store; the load
//! goes on for a few seconds after that.
//!
//! Sheaf b is given that node's URL alone, so the connection of at least one process is
//! certainly the one that dies: it must move to a node it learned from the cluster, and its
//! view of the bucket must read on from where it stopped. Sheaf a is given all three.
//!
//! The checks: deliveries go on while the node is down (the two others elect a new leader and
//! keep a majority); each process's view of the bucket is current again within [`VIEW_BACK`] of
//! the kill (read from its `/metrics`, whose queue depth waits for the view) and it delivers
//! after the node is back; every event answered 202 is delivered (publishes refused meanwhile
//! are tried again by the publisher and counted, not lost: their client was told); the queue
//! drains to nothing in every process's view; and once back, the node's replica of the stream
//! is current again. The duplicates (at-least-once: leases that ran out while their outcome
//! could not be written) are counted and reported, with each process's retry, lost-lease and
//! superseded counters, and for an event never delivered, its attempts in the log.

use std::time::{Duration, Instant};

use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::{Failing, Receiver};

use crate::api::{
    Api, PROBE_TIMEOUT, Pace, Published, ReadyzProbe, Targets, publish_paced, readiness,
};
use crate::env::{Ctx, QUEUE_LEASE};
use crate::report::{Report, at, recovery_after, secs};
use crate::sheaf;

use super::jetstream::{
    self, Bucket, COUNTERS, ProcessProbe, ProcessSample, check_drained, cleanup, node_url,
    queue_warnings, rose_between, slowest_answer_after, undelivered_attempts, view_back_after,
};
use super::{TENANT, counters, event_ids, settle_deliveries, stop_clean};

/// How long the node started again may take until its replica of the stream is current.
const CATCH_UP: Duration = Duration::from_secs(60);

/// How long after the kill a process's view of the bucket may take to be current again: the
/// election of a new leader takes 4 to 8 s here, and the watcher starts a stalled consumer again
/// 5 s after its last read. Before it did, a view could stop until the dead node came back.
const VIEW_BACK: Duration = Duration::from_secs(30);

/// Deliveries whose request arrived this long after the kill were claimed after it: a claim
/// made before the kill reaches the receiver within milliseconds (it answers in 20 ms).
const CLAIMED_AFTER: Duration = Duration::from_secs(1);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("nats-node");
    jetstream::cluster_up(ctx, &mut report).await?;
    let outcome = Box::pin(on_the_cluster(ctx, &mut report)).await;
    jetstream::cluster_down(ctx, outcome).await?;
    Ok(report)
}

/// The scenario's sizes: events, per second, load before the kill, time the node stays down.
fn sizes(quick: bool) -> (usize, f64, Duration, Duration) {
    if quick {
        (720, 40.0, Duration::from_secs(2), Duration::from_secs(10))
    } else {
        (2_000, 40.0, Duration::from_secs(8), Duration::from_secs(30))
    }
}

async fn on_the_cluster(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    let (events, rate, before, down_for) = sizes(ctx.quick);
    let schema = ctx.unique("natsnode");
    let bucket = Bucket::connect(ctx, &schema).await?;
    let receiver = Receiver::builder()
        .delay(Duration::from_millis(20))
        .failing(Failing::EveryNth(5))
        .start()
        .await?;
    // Sheaf a creates the bucket; its leader is known from then on.
    let a = sheaf::spawn(
        ctx,
        "nats-node",
        "a",
        &jetstream::settings(ctx, &schema, &schema, &ctx.nats_cluster, QUEUE_LEASE),
    )
    .await?;
    let victim = victim(report, &bucket).await;
    let b = sheaf::spawn(
        ctx,
        "nats-node",
        "b",
        &jetstream::settings(
            ctx,
            &schema,
            &schema,
            &[node_url(ctx, &victim)?],
            QUEUE_LEASE,
        ),
    )
    .await?;
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant_with_destination(&a.base(), TENANT, &receiver.url())
        .await?;
    let readyz = ReadyzProbe::start(Api::new(PROBE_TIMEOUT)?, b.base());
    let probes = [
        ProcessProbe::start(a.base())?,
        ProcessProbe::start(b.base())?,
    ];
    let t0 = Instant::now();
    let load = publish_paced(
        api.clone(),
        Targets::new(&[a.base(), b.base()]),
        TENANT.to_owned(),
        "nats-node",
        event_ids("natsnode", events),
        Pace {
            rate,
            concurrency: 16,
            give_up_after: Duration::from_secs(240),
        },
    );
    tokio::time::sleep(before).await;
    let outage = node_down(ctx, report, &bucket, &victim, down_for, t0).await?;
    let published = load.await?;
    let load_end = Instant::now();
    settle_deliveries(report, &receiver, &published).await;

    while_down(report, &outage, &published, &receiver, t0);
    let [probe_a, probe_b] = probes;
    let sampled = [probe_a.finish().await, probe_b.finish().await];
    for (name, samples) in ["sheaf a", "sheaf b"].iter().zip(&sampled) {
        per_process(report, name, samples, &outage, load_end);
    }
    let samples = readyz.finish().await;
    let seen = readiness(&samples, outage.killed_at);
    report.note(
        "/readyz of sheaf b",
        match seen.unready_at {
            None => format!("200 throughout ({} probes)", samples.len()),
            Some(down) => format!(
                "not 200 from {} for {} ({})",
                at(t0, down),
                secs(seen.ready_again_at.unwrap_or(down) - down),
                seen.answers_text()
            ),
        },
    );
    report.recovery = recovery_after(
        outage.back_at,
        &published.accepted,
        &receiver.first_successes(),
    );
    report.note(
        "recovery",
        "from the node back until every event accepted before was delivered",
    );
    let processes = [&a, &b];
    check_drained(report, &api, &processes).await?;
    explain(
        ctx,
        report,
        (&api, &processes, &schema),
        &published,
        &receiver,
    )
    .await?;
    report.note("queue errors in the logs", queue_warnings(&processes));
    stop_clean(report, a).await?;
    stop_clean(report, b).await?;
    cleanup(ctx, report, &schema, &bucket).await
}

/// What tells the duplicates and any loss apart: each process's retry, lost-lease and
/// superseded counters, and for an accepted event never delivered, its attempts in the log.
async fn explain(
    ctx: &Ctx,
    report: &mut Report,
    (api, processes, schema): (&Api, &[&SheafProcess], &str),
    published: &Published,
    receiver: &Receiver,
) -> anyhow::Result<()> {
    for sheaf in processes {
        report.note(
            &format!("{} counters", sheaf.name),
            counters(api, sheaf, COUNTERS).await,
        );
    }
    let undelivered = undelivered_attempts(ctx, schema, published, receiver).await?;
    if !undelivered.is_empty() {
        report.note("attempts in the log of events never delivered", undelivered);
    }
    Ok(())
}

/// The node to kill: the bucket's stream's leader, else `n1`. Checks that the stream is kept
/// on all three nodes.
async fn victim(report: &mut Report, bucket: &Bucket) -> String {
    let cluster = bucket.cluster().await;
    let replicas = cluster.as_ref().map_or(0, |c| c.replicas.len() + 1);
    report.check(
        replicas == jetstream::REPLICAS,
        format!(
            "the bucket's stream has {replicas} replicas, not {}",
            jetstream::REPLICAS
        ),
    );
    match bucket.leader(Duration::from_secs(10)).await {
        Some(leader) => {
            report.note(
                "victim",
                format!(
                    "{leader}, the leader of the bucket's stream KV_{}",
                    bucket.name
                ),
            );
            leader
        }
        None => {
            report.note("victim", "n1 (the bucket's stream named no leader)");
            "n1".to_owned()
        }
    }
}

/// When the node went down and came back.
struct Outage {
    killed_at: Instant,
    /// When it was started again: the end of the time it was down.
    restarted_at: Instant,
    /// When it answered again and the meta cluster had all three.
    back_at: Instant,
}

/// Kills the victim, watches the stream's cluster for `down_for`, starts the victim again and,
/// from then on, waits until its replica of the stream is current.
async fn node_down(
    ctx: &Ctx,
    report: &mut Report,
    bucket: &Bucket,
    victim: &str,
    down_for: Duration,
    t0: Instant,
) -> anyhow::Result<Outage> {
    match bucket.consumer_hosts().await {
        Ok(hosts) => report.note(
            "the processes' watchers",
            format!(
                "read the bucket through ordered consumers on {}",
                hosts.join(", ")
            ),
        ),
        Err(err) => report.note("the processes' watchers", format!("not listed: {err:#}")),
    }
    ctx.ctl(&["nats-cluster", "kill", victim]).await?;
    let killed_at = Instant::now();
    let killed_utc = sheaf_store::Timestamp::now();
    let seen = watch_stream(bucket, victim, killed_at + down_for).await;
    let restarted_at = Instant::now();
    let (took, caught) = tokio::join!(
        async {
            let took = ctx.ctl(&["nats-cluster", "start", victim]).await;
            (took, Instant::now())
        },
        caught_up(bucket, victim, restarted_at)
    );
    let (took, back_at) = (took.0?, took.1);
    report.note(
        "node down",
        format!(
            "{victim} SIGKILLed at {} ({killed_utc}), started again at {}, answering with the meta cluster whole at {} ({} down, {} starting again)",
            at(t0, killed_at),
            at(t0, restarted_at),
            at(t0, back_at),
            secs(restarted_at - killed_at),
            secs(took)
        ),
    );
    report.note(
        "stream while the node was down",
        match &seen.elected {
            Some((when, leader)) => format!(
                "{leader} leader, seen {} after the kill (until then: {}); it listed {victim} as {}",
                secs(*when - killed_at),
                seen.until_elected,
                seen.victim.as_deref().unwrap_or("absent")
            ),
            None => format!("no leader but {victim} seen: {}", seen.until_elected),
        },
    );
    caught.record(report, victim);
    Ok(Outage {
        killed_at,
        restarted_at,
        back_at,
    })
}

/// What the stream's cluster info said while the node was down.
struct StreamSeen {
    /// When a leader other than the victim first answered, and which.
    elected: Option<(Instant, String)>,
    /// The last answer before that (an error, or the victim still named leader).
    until_elected: String,
    /// The victim's replica as the new leader last listed it.
    victim: Option<String>,
}

/// Asks the stream's cluster info every 100 ms until `until`.
async fn watch_stream(bucket: &Bucket, victim: &str, until: Instant) -> StreamSeen {
    let mut seen = StreamSeen {
        elected: None,
        until_elected: "no answer asked".to_owned(),
        victim: None,
    };
    while Instant::now() < until {
        match bucket.cluster().await {
            Ok(cluster) if cluster.leader.as_deref().is_some_and(|l| l != victim) => {
                let leader = cluster.leader.clone().unwrap_or_default();
                seen.elected.get_or_insert((Instant::now(), leader));
                seen.victim = cluster
                    .replicas
                    .iter()
                    .find(|p| p.name == victim)
                    .map(|p| format!("current {}, offline {}", p.current, p.offline));
            }
            Ok(cluster) if seen.elected.is_none() => {
                seen.until_elected = format!("leader {:?}", cluster.leader);
            }
            Err(why) if seen.elected.is_none() => seen.until_elected = why,
            _ => {}
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    seen
}

/// How the node's replica of the stream caught up after its start: how long it took (`None`:
/// not within [`CATCH_UP`]), how the leader first listed it, and how last.
struct CatchUp {
    took: Option<Duration>,
    first_seen: Option<String>,
    last_seen: String,
}

impl CatchUp {
    /// Notes it, and checks it happened within [`CATCH_UP`].
    fn record(&self, report: &mut Report, victim: &str) {
        report.note(
            "replica caught up",
            match self.took {
                Some(took) => format!(
                    "{victim}'s replica of the stream current {} after the node was started again (first listed as: {})",
                    secs(took),
                    self.first_seen.as_deref().unwrap_or("current")
                ),
                None => format!("not within {}: {}", secs(CATCH_UP), self.last_seen),
            },
        );
        report.check(
            self.took.is_some(),
            format!(
                "{victim}'s replica of the stream was not current within {CATCH_UP:?} of its start ({})",
                self.last_seen
            ),
        );
    }
}

/// From `started_at`, when the node was started again, waits until the stream's leader lists
/// `victim`'s replica as current, not offline and not behind (or `victim` leads the stream).
async fn caught_up(bucket: &Bucket, victim: &str, started_at: Instant) -> CatchUp {
    let mut first_seen = None;
    let mut last_seen = String::from("no answer");
    let current = loop {
        match bucket.cluster().await {
            Err(why) => last_seen = why,
            // Leading the stream again, it has every write the stream acknowledged.
            Ok(cluster) if cluster.leader.as_deref() == Some(victim) => {
                break Some(started_at.elapsed());
            }
            Ok(cluster) => match cluster.replicas.iter().find(|p| p.name == victim) {
                Some(peer) => {
                    last_seen = format!(
                        "current {}, offline {}, {} operations behind, seen {:.1} s ago",
                        peer.current,
                        peer.offline,
                        peer.lag.unwrap_or(0),
                        peer.active.as_secs_f64()
                    );
                    first_seen.get_or_insert_with(|| last_seen.clone());
                    if peer.current && !peer.offline && peer.lag.unwrap_or(0) == 0 {
                        break Some(started_at.elapsed());
                    }
                }
                None => {
                    last_seen = format!(
                        "not among the stream's replicas (leader {:?})",
                        cluster.leader
                    );
                }
            },
        }
        if started_at.elapsed() > CATCH_UP {
            break None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    CatchUp {
        took: current,
        first_seen,
        last_seen,
    }
}

/// The checks of what went on while the node was down: deliveries made, publishes refused
/// and tried again. A delivery counts as made while it was down when its request arrived a
/// second or more after the kill (so it was claimed after it) and was answered before the
/// node was started again.
fn while_down(
    report: &mut Report,
    outage: &Outage,
    published: &Published,
    receiver: &Receiver,
    t0: Instant,
) {
    let down = |t: &Instant| *t >= outage.killed_at && *t <= outage.restarted_at;
    let accepted = published.accepted.values().filter(|t| down(t)).count();
    let deliveries = receiver.deliveries();
    let claimed_after = outage.killed_at + CLAIMED_AFTER;
    let mut times: Vec<Instant> = deliveries
        .iter()
        .filter(|d| d.status == 200 && d.arrived >= claimed_after && down(&d.answered))
        .map(|d| d.answered)
        .collect();
    times.sort();
    let requests = deliveries
        .iter()
        .filter(|d| d.arrived >= claimed_after && down(&d.answered))
        .count();
    report.note(
        "while the node was down",
        format!(
            "{accepted} events accepted; {} delivered from {} after the kill on ({requests} requests, retries among them)",
            times.len(),
            secs(CLAIMED_AFTER)
        ),
    );
    report.check(
        !times.is_empty(),
        "no delivery was made while the node was down",
    );
    let (from, to) = longest_gap(outage.killed_at, &times, outage.restarted_at);
    report.note(
        "longest pause in deliveries while the node was down",
        format!(
            "{} (from {} to {})",
            secs(to - from),
            at(t0, from),
            at(t0, to)
        ),
    );
    let refused_down = published.refused_at.iter().filter(|t| down(t)).count();
    let span = match (
        published.refused_at.iter().min(),
        published.refused_at.iter().max(),
    ) {
        (Some(first), Some(last)) => format!(", between {} and {}", at(t0, *first), at(t0, *last)),
        _ => String::new(),
    };
    report.note(
        "publishes refused (tried again until accepted)",
        format!(
            "{} ({}), {refused_down} of them while the node was down{span}; {} accepted on a later try said `duplicate` (the refused try had recorded the event)",
            published.refused_total(),
            published.refused_text(),
            published.repeats
        ),
    );
}

/// The longest stretch between `from`, the sorted `times` and `to`: (its start, its end).
fn longest_gap(from: Instant, times: &[Instant], to: Instant) -> (Instant, Instant) {
    let mut edges = Vec::with_capacity(times.len() + 2);
    edges.push(from);
    edges.extend_from_slice(times);
    edges.push(to);
    edges
        .windows(2)
        .map(|w| (w[0], w[1]))
        .max_by_key(|(a, b)| b.saturating_duration_since(*a))
        .unwrap_or((from, to))
}

/// One process through the outage, from its probe's samples: when its view of the bucket was
/// current again, and what it delivered and accepted while the node was down and after it came
/// back. A process whose queue never recovered from the loss of its node (or of the stream's
/// leader) would never have a current view again, and would deliver nothing after it.
fn per_process(
    report: &mut Report,
    name: &str,
    samples: &[ProcessSample],
    outage: &Outage,
    load_end: Instant,
) {
    let delivered = |s: &ProcessSample| s.delivered;
    let published = |s: &ProcessSample| s.published;
    let from = outage.killed_at + CLAIMED_AFTER;
    let delivered_down = rose_between(samples, delivered, from, outage.restarted_at);
    let published_down = rose_between(samples, published, from, outage.restarted_at);
    let delivered_after = rose_between(samples, delivered, outage.back_at, load_end);
    let published_after = rose_between(samples, published, outage.back_at, load_end);
    let view_back = view_back_after(samples, outage.killed_at);
    report.note(
        name,
        format!(
            "view of the bucket current again {} after the kill (its /metrics took up to {} meanwhile); counted from its /metrics, at least {delivered_down} delivered and {published_down} accepted while the node was down, {delivered_after} and {published_after} after it came back",
            view_back.map_or_else(|| "never".to_owned(), secs),
            secs(slowest_answer_after(samples, outage.killed_at)),
        ),
    );
    report.check(
        view_back.is_some_and(|d| d <= VIEW_BACK),
        format!(
            "{name}'s view of the bucket was not current again within {VIEW_BACK:?} of the kill"
        ),
    );
    report.check(
        delivered_after > 0.0,
        format!("{name} delivered nothing after the node came back"),
    );
}
