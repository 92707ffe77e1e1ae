//! `broker`: one `sheaf` process delivers every event to a `rabbitmq` destination and a `nats`
//! destination while both brokers are stopped and started again (SIGTERM, ~3 s down, started on
//! the same port with the same data). The brokers are the scenario's own processes
//! (`sheaf_testenv::brokers`), so stopping them disturbs no other suite.
//!
//! During the outage every attempt fails (connection refused, or a connection the broker
//! closed) and is retried on the suite's short schedule; the same process must carry on by
//! itself and, once the brokers are back, get every accepted event to both: into the durable
//! queue (persistent messages, publisher confirms) and into the JetStream stream (file
//! storage, deduplicated by `Nats-Msg-Id`). Duplicates are allowed (at least once) and counted.
//!
//! What arrived is read at the brokers themselves (`clients.rs`): the queue is consumed for the
//! whole run, so each event's arrival is timed; the stream is read at the end, every
//! stored message by sequence with the time the server stored it.

use std::time::{Duration, Instant, SystemTime};

use anyhow::Context as _;
use serde_json::json;
use sheaf_testenv::brokers::{NatsServer, RabbitServer};

use crate::api::{
    Api, PROBE_TIMEOUT, Pace, ReadyzProbe, Targets, metric, publish_paced, readiness,
};
use crate::env::Ctx;
use crate::report::{Report, at, recovery_after, secs};
use crate::sheaf;

mod clients;

use super::{
    SETTLE, TENANT, check_events_logged, cleanup, counters, drained, event_ids, jobs_left,
    stop_clean,
};
use clients::{
    EXCHANGE, QUEUE, QueueTap, ROUTING_KEY, SUBJECT, create_stream, declare_queue, read_stream,
};

/// How long the brokers stay down between the stop and the start.
const DOWN_FOR: Duration = Duration::from_secs(3);

pub async fn run(ctx: &Ctx) -> anyhow::Result<Report> {
    let mut report = Report::new("broker");
    // (events, per second, load before the fault)
    let (events, rate, before) = if ctx.quick {
        (500, 50.0, Duration::from_secs(3))
    } else {
        (2_000, 50.0, Duration::from_secs(10))
    };
    let (rabbit, nats) = tokio::join!(blocking(RabbitServer::start), blocking(NatsServer::start));
    let (mut rabbit, mut nats) = (rabbit.context("rabbitmq")?, nats.context("nats")?);
    report.note(
        "brokers",
        format!(
            "rabbitmq {} (pid {}), nats {} (pid {}), the scenario's own",
            rabbit.url(),
            rabbit.pid().unwrap_or(0),
            nats.url(),
            nats.pid().unwrap_or(0)
        ),
    );
    declare_queue(&rabbit.url()).await?;
    create_stream(&nats.url()).await?;

    let schema = ctx.unique("broker");
    let settings = ctx.sheaf_settings(&schema, &schema);
    let mut a = sheaf::spawn(ctx, "broker", "a", &settings).await?;
    let pid = a.pid();
    let api = Api::new(Duration::from_secs(10))?;
    api.tenant(&a.base(), TENANT).await?;
    let rabbit_config =
        json!({ "url": rabbit.url(), "exchange": EXCHANGE, "routing_key": ROUTING_KEY });
    api.destination(&a.base(), TENANT, "rabbitmq", rabbit_config)
        .await?;
    api.destination(
        &a.base(),
        TENANT,
        "nats",
        json!({ "url": nats.url(), "subject": SUBJECT }),
    )
    .await?;
    let tap = QueueTap::start(rabbit.url(), QUEUE.to_owned());
    let probe = ReadyzProbe::start(Api::new(PROBE_TIMEOUT)?, a.base());
    let t0 = Instant::now();
    let t0_wall = SystemTime::now();
    let load = publish_paced(
        api.clone(),
        Targets::new(&[a.base()]),
        TENANT.to_owned(),
        "broker",
        event_ids("broker", events),
        Pace {
            rate,
            concurrency: 16,
            give_up_after: Duration::from_secs(180),
        },
    );

    tokio::time::sleep(before).await;
    let fault_start = Instant::now();
    println!("  stopping rabbitmq and nats");
    let ((rabbit_back, rabbit_stopped), (nats_back, nats_stopped)) = tokio::join!(
        blocking_with(rabbit, RabbitServer::stop),
        blocking_with(nats, NatsServer::stop)
    );
    (rabbit, nats) = (rabbit_back, nats_back);
    let stopped_at = Instant::now();
    tokio::time::sleep(DOWN_FOR).await;
    println!("  starting rabbitmq and nats again on their ports");
    // Started again whatever the stop said: the checks below need them.
    let (rabbit_restart, nats_restart) = tokio::join!(
        async {
            let (rabbit, started) = blocking_with(rabbit, RabbitServer::restart).await;
            (rabbit, started, Instant::now())
        },
        async {
            let (nats, started) = blocking_with(nats, NatsServer::restart).await;
            (nats, started, Instant::now())
        }
    );
    let (rabbit_back, rabbit_started, rabbit_up) = rabbit_restart;
    let (nats_back, nats_started, nats_up) = nats_restart;
    (rabbit, nats) = (rabbit_back, nats_back);
    rabbit_stopped.context("stopping rabbitmq")?;
    nats_stopped.context("stopping nats")?;
    rabbit_started.context("starting rabbitmq again")?;
    nats_started.context("starting nats again")?;
    let fault_end = rabbit_up.max(nats_up);
    report.note(
        "brokers down",
        format!(
            "{} in all: stop from {} (both gone by {}), started again {} s later; rabbitmq answered again at {} (pid {}), nats at {} (pid {})",
            secs(fault_end - fault_start),
            at(t0, fault_start),
            at(t0, stopped_at),
            DOWN_FOR.as_secs(),
            at(t0, rabbit_up),
            rabbit.pid().unwrap_or(0),
            at(t0, nats_up),
            nats.pid().unwrap_or(0)
        ),
    );

    let published = load.await?;
    report.check(
        published.gave_up.is_empty(),
        format!(
            "the publisher gave up on {} events the process would not accept",
            published.gave_up.len()
        ),
    );
    // Every job done (delivered or dead-lettered) means nothing more will reach a broker.
    let settle_start = Instant::now();
    let mut left = jobs_left(ctx, &schema).await?;
    while left > 0 && settle_start.elapsed() < SETTLE {
        tokio::time::sleep(Duration::from_millis(200)).await;
        left = jobs_left(ctx, &schema).await?;
    }
    report.note(
        "queue emptied",
        format!(
            "{left} jobs left {} after the last publish",
            secs(settle_start.elapsed())
        ),
    );
    // The tap has the last messages within moments; bounded in case it lost the broker.
    let accepted = &published.accepted;
    let caught_up = Instant::now();
    while caught_up.elapsed() < Duration::from_secs(30) && !accepted.keys().all(|id| tap.has(id)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let queued = tap.finish().await;
    let stored = read_stream(&nats.url(), t0, t0_wall)
        .await
        .context("reading the stream")?;

    report.published = accepted.len();
    report.delivered = accepted
        .keys()
        .filter(|id| queued.first.contains_key(*id) && stored.first.contains_key(*id))
        .count();
    report.duplicates = queued.duplicates + stored.duplicates;
    for (broker, first) in [("rabbitmq", &queued.first), ("nats", &stored.first)] {
        let mut missing: Vec<&String> = accepted
            .keys()
            .filter(|id| !first.contains_key(*id))
            .collect();
        missing.sort();
        report.check(
            missing.is_empty(),
            format!(
                "{} accepted events never reached {broker} (first: {:?})",
                missing.len(),
                missing.iter().take(5).collect::<Vec<_>>()
            ),
        );
        let strangers = first
            .keys()
            .filter(|id| !accepted.contains_key(*id))
            .count();
        report.check(
            strangers == 0,
            format!("{broker} holds {strangers} messages whose id was never accepted"),
        );
    }
    report.note(
        "rabbitmq queue",
        format!(
            "{} messages consumed: {} events, {} duplicates (published again by sheaf), {} redelivered by the broker after a lost ack (not counted), {} without message_id; the consumer connected {} times",
            queued.messages,
            queued.first.len(),
            queued.duplicates,
            queued.redelivered,
            queued.without_id,
            queued.connections
        ),
    );
    report.note(
        "nats stream",
        format!(
            "{} messages stored (last sequence {}): {} events, {} duplicates past the stream's Nats-Msg-Id deduplication, {} without Nats-Msg-Id",
            stored.messages,
            stored.last_sequence,
            stored.first.len(),
            stored.duplicates,
            stored.without_id
        ),
    );
    report.check(
        queued.without_id == 0 && stored.without_id == 0,
        "messages without an event id reached the brokers",
    );

    let rabbit_recovery = recovery_after(rabbit_up, accepted, &queued.first);
    let nats_recovery = recovery_after(nats_up, accepted, &stored.first);
    report.recovery = rabbit_recovery.zip(nats_recovery).map(|(r, n)| r.max(n));
    report.note(
        "recovery",
        format!(
            "from each broker answering again until every event accepted before had reached it: rabbitmq {}, nats {} (nats by the stream's store times)",
            rabbit_recovery.map_or_else(|| "-".to_owned(), secs),
            nats_recovery.map_or_else(|| "-".to_owned(), secs)
        ),
    );

    report.check(
        a.running() && a.pid() == pid,
        "sheaf exited during the outage instead of retrying",
    );
    let page = api.metrics(&a.base()).await?;
    for kind in ["rabbitmq", "nats"] {
        let count = |result: &str| {
            metric(
                &page,
                &format!("sheaf_destination_attempts_total{{type=\"{kind}\",result=\"{result}\"}}"),
            )
            .unwrap_or(0.0)
        };
        let (delivered, retry, permanent) =
            (count("delivered"), count("retry"), count("permanent"));
        report.note(
            &format!("{kind} attempts"),
            format!(
                "{delivered} delivered, {retry} failed and retried, {permanent} permanent failures"
            ),
        );
        report.check(
            retry > 0.0,
            format!("no {kind} attempt failed during the outage (retry count 0): the fault never reached sheaf"),
        );
        report.check(
            permanent == 0.0,
            format!(
                "{permanent} {kind} attempts failed permanently: a broker outage must be retried"
            ),
        );
    }
    let samples = probe.finish().await;
    let seen = readiness(&samples, fault_start);
    report.note(
        "/readyz during the outage",
        match seen.unready_at {
            None => {
                "answered 200 throughout (the brokers are destinations, not the service's stores)"
                    .to_owned()
            }
            Some(down) => format!("not ready from {} ({})", at(t0, down), seen.answers_text()),
        },
    );
    report.note("publishes refused (retried)", published.refused_text());
    report.note(
        "sheaf counters",
        counters(
            &api,
            &a,
            &[
                "sheaf_deliveries_total{outcome=\"success\"}",
                "sheaf_deliveries_total{outcome=\"failed\"}",
            ],
        )
        .await,
    );
    drained(ctx, &mut report, &schema).await?;
    check_events_logged(&mut report, &api, &a, &published).await?;
    if !report.passed() {
        report.note("rabbitmq log (last lines)", last_lines(&rabbit.log(), 10));
        report.note("nats log (last lines)", last_lines(&nats.log(), 10));
    }
    stop_clean(&mut report, a).await?;
    cleanup(ctx, &mut report, &schema).await?;
    // Dropping them stops both brokers and removes their data.
    drop((rabbit, nats));
    Ok(report)
}

/// Runs a blocking broker call (a start waits seconds for the broker to answer) off the
/// runtime's workers.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    tokio::task::spawn_blocking(f).await?
}

/// Runs a blocking call on `server` off the runtime's workers, and hands the server back.
async fn blocking_with<S: Send + 'static>(
    mut server: S,
    f: impl FnOnce(&mut S) -> anyhow::Result<()> + Send + 'static,
) -> (S, anyhow::Result<()>) {
    let joined = tokio::task::spawn_blocking(move || {
        let outcome = f(&mut server);
        (server, outcome)
    })
    .await;
    match joined {
        Ok(done) => done,
        // The closure panicked and took the server with it; nothing to hand back.
        Err(err) => std::panic::resume_unwind(err.into_panic()),
    }
}

fn last_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join(" | ")
}
