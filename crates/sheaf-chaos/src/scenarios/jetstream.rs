//! What the scenarios on the JetStream queue (`nats-node`, `sheaf-process`) share: the settings
//! of a `sheaf` on the fault suite's NATS cluster, the cluster started and stopped around a
//! scenario, a client of the scenario's own that reads the bucket's stream (its leader, its
//! replicas, its consumers) and the leases in it, a probe of each process's `/metrics` (its
//! counters, and whether its view of the bucket is current), the end-of-run checks that replace
//! the Postgres queue's table reads (the queue's depth as every process sees it), and the
//! cleanup of the scenario's bucket.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use async_nats::jetstream::{self, kv, stream::ClusterInfo};
use futures::StreamExt as _;
use sheaf_store::Timestamp;
use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::Receiver;

use crate::api::{Api, Published, metric};
use crate::env::Ctx;
use crate::report::{Report, secs};

/// The bucket's replicas: one per node of the cluster, so a write needs two of them.
pub const REPLICAS: usize = 3;

/// How long the queue may take to show no job left once every event arrived: completions are
/// written just after the delivery, and a view reads them a moment later.
const DRAIN: Duration = Duration::from_secs(30);

/// Starts the fault suite's NATS cluster for a scenario and notes how long it took.
pub async fn cluster_up(ctx: &Ctx, report: &mut Report) -> anyhow::Result<()> {
    anyhow::ensure!(
        ctx.nats_cluster.len() == REPLICAS,
        "the fault suite's NATS cluster should have {REPLICAS} nodes, not {:?}",
        ctx.nats_cluster
    );
    let took = ctx.ctl(&["nats-cluster", "up"]).await?;
    report.note(
        "cluster",
        format!(
            "NATS JetStream, {REPLICAS} nodes ({}), started in {}",
            ctx.nats_cluster.join(", "),
            secs(took)
        ),
    );
    Ok(())
}

/// Stops the cluster whatever the scenario's `outcome` (its nodes are the scenario's alone),
/// then hands the outcome on.
pub async fn cluster_down(ctx: &Ctx, outcome: anyhow::Result<()>) -> anyhow::Result<()> {
    let down = ctx.ctl(&["nats-cluster", "down"]).await;
    outcome?;
    down.map(|_| ())
}

/// The client URL of node `name` (`n1`, `n2`, `n3`: the cluster's URLs are in that order).
pub fn node_url(ctx: &Ctx, name: &str) -> anyhow::Result<String> {
    name.strip_prefix('n')
        .and_then(|n| n.parse::<usize>().ok())
        .and_then(|n| ctx.nats_cluster.get(n.checked_sub(1)?))
        .cloned()
        .ok_or_else(|| anyhow::anyhow!("no node {name} in {:?}", ctx.nats_cluster))
}

/// The settings of a `sheaf` on the JetStream queue of bucket `bucket` (kept on [`REPLICAS`]
/// nodes), connecting to `urls`, with its tenants in Postgres schema `schema` and its log in
/// the suite's ClickHouse database of the same name; the rest as every scenario has it.
pub fn settings(
    ctx: &Ctx,
    schema: &str,
    bucket: &str,
    urls: &[String],
    lease: Duration,
) -> Vec<(String, String)> {
    let mut settings = ctx.sheaf_settings(schema, schema);
    for (name, value) in &mut settings {
        match name.as_str() {
            "SHEAF_QUEUE" => "jetstream".clone_into(value),
            "SHEAF_QUEUE_LEASE" => *value = format!("{}s", lease.as_secs()),
            _ => {}
        }
    }
    settings.extend([
        ("SHEAF_JETSTREAM_URLS".to_owned(), urls.join(",")),
        ("SHEAF_JETSTREAM_BUCKET".to_owned(), bucket.to_owned()),
        ("SHEAF_JETSTREAM_REPLICAS".to_owned(), REPLICAS.to_string()),
    ]);
    settings
}

/// The bucket's stream, seen through a connection of the scenario's own to every node.
pub struct Bucket {
    pub name: String,
    context: jetstream::Context,
}

impl Bucket {
    /// Connects to every node of the fault suite's cluster (any one answering will do; the
    /// client moves to another when its node dies).
    pub async fn connect(ctx: &Ctx, name: &str) -> anyhow::Result<Self> {
        let client = async_nats::ConnectOptions::new()
            .name("sheaf-chaos")
            .connect(ctx.nats_cluster.clone())
            .await?;
        Ok(Self {
            name: name.to_owned(),
            context: jetstream::new(client),
        })
    }

    fn stream_name(&self) -> String {
        format!("KV_{}", self.name)
    }

    /// The stream's cluster as its leader sees it (the leader's name, and each other replica:
    /// current or not, how far behind, when last seen), or why there is no answer within a
    /// second (no leader, during an election). What `/jsz?streams=true` shows under `cluster`.
    pub async fn cluster(&self) -> Result<ClusterInfo, String> {
        let ask = async {
            let stream = self
                .context
                .get_stream(self.stream_name())
                .await
                .map_err(|e| e.to_string())?;
            let info = stream.get_info().await.map_err(|e| e.to_string())?;
            info.cluster
                .ok_or_else(|| "the stream's info has no cluster".to_owned())
        };
        tokio::time::timeout(Duration::from_secs(1), ask)
            .await
            .unwrap_or_else(|_| Err("no answer within 1 s".to_owned()))
    }

    /// The node each consumer of the stream runs on, sorted: the ordered consumers through
    /// which every process's watcher reads the bucket into its view.
    pub async fn consumer_hosts(&self) -> anyhow::Result<Vec<String>> {
        let stream = self.context.get_stream(self.stream_name()).await?;
        let mut consumers = stream.consumers();
        let mut hosts = Vec::new();
        while let Some(info) = consumers.next().await {
            hosts.push(
                info?
                    .cluster
                    .and_then(|c| c.leader)
                    .unwrap_or_else(|| "?".to_owned()),
            );
        }
        hosts.sort();
        Ok(hosts)
    }

    /// The stream's leader, asked until one answers (at most `timeout`).
    pub async fn leader(&self, timeout: Duration) -> Option<String> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Some(leader) = self.cluster().await.ok().and_then(|c| c.leader) {
                return Some(leader);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        None
    }

    /// Every job in the bucket whose record carries a lease (`claimed_until`), by key: its
    /// event, the revision that wrote it, and the lease's end. Read through a watcher of every
    /// key's latest record, up to the last one at the time of asking.
    pub async fn leased_jobs(&self) -> anyhow::Result<HashMap<String, LeasedJob>> {
        let store = self.context.get_key_value(&self.name).await?;
        let mut entries = store.watch_with_history(">").await?;
        let mut leased = HashMap::new();
        let read = async {
            while let Some(entry) = entries.next().await {
                let entry = entry?;
                if entry.operation == kv::Operation::Put
                    && entry.key.starts_with("j.")
                    && let Some(job) = LeasedJob::from_record(&entry.value, entry.revision)
                {
                    leased.insert(entry.key.clone(), job);
                }
                if entry.delta == 0 {
                    break;
                }
            }
            anyhow::Ok(())
        };
        tokio::time::timeout(Duration::from_secs(10), read)
            .await
            .map_err(|_| anyhow::anyhow!("reading the bucket {} took over 10 s", self.name))??;
        Ok(leased)
    }

    /// Deletes the scenario's bucket (its stream) from the cluster.
    pub async fn delete(&self) -> anyhow::Result<()> {
        self.context.delete_stream(self.stream_name()).await?;
        Ok(())
    }
}

/// A job of the bucket under a lease, as read by [`Bucket::leased_jobs`].
#[derive(Debug, Clone)]
pub struct LeasedJob {
    pub event_id: String,
    /// The revision of the key that wrote the lease: any later write (a renewal, an outcome)
    /// changes it.
    pub revision: u64,
    /// When the lease runs out, on this process's clock (the same host's as `sheaf`'s).
    pub lease_ends: Instant,
}

impl LeasedJob {
    /// The record's event and lease (sheaf-jetstream's `Record`: `{"job": {…, "event_id"},
    /// "claimed_until", …}`), or `None` for a job waiting or dead-lettered.
    fn from_record(value: &[u8], revision: u64) -> Option<Self> {
        let record: serde_json::Value = serde_json::from_slice(value).ok()?;
        if !record["dead"].is_null() {
            return None;
        }
        let claimed_until: Timestamp =
            serde_json::from_value(record["claimed_until"].clone()).ok()?;
        Some(Self {
            event_id: record["job"]["event_id"].as_str()?.to_owned(),
            revision,
            lease_ends: Instant::now() + claimed_until.saturating_duration_since(Timestamp::now()),
        })
    }
}

/// Asks one process's `/metrics` every 250 ms until stopped, each request on its own (one held
/// up does not hold up the next): its counters over time, and when its view of the bucket is
/// current. The page carries `sheaf_queue_jobs` only once the view has read up to the stream's
/// last sequence (the queue's `depth` asks the stream for it, then waits for the view, each at
/// most 10 s, and is left out when either fails).
#[derive(Debug)]
pub struct ProcessProbe {
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<Vec<ProcessSample>>,
}

/// One `/metrics` of a [`ProcessProbe`]: when it was asked and answered, whether the view was
/// current (the page had the queue's depth, and came within a second), and the process's
/// successful deliveries and accepted publishes so far (-1 without an answer).
#[derive(Debug, Clone, Copy)]
pub struct ProcessSample {
    pub asked: Instant,
    pub answered: Instant,
    pub current: bool,
    pub delivered: f64,
    pub published: f64,
}

impl ProcessProbe {
    pub fn start(base: String) -> anyhow::Result<Self> {
        // Longer than the 20 s a depth may take, so a slow page is still read.
        let api = Api::new(Duration::from_secs(25))?;
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(async move {
            let mut asked = Vec::new();
            while !*stopped.borrow() {
                let (api, base) = (api.clone(), base.clone());
                asked.push(tokio::spawn(async move { sample(&api, &base).await }));
                tokio::select! {
                    _ = stopped.changed() => {}
                    () = tokio::time::sleep(Duration::from_millis(250)) => {}
                }
            }
            let mut samples = Vec::with_capacity(asked.len());
            for request in asked {
                if let Ok(sample) = request.await {
                    samples.push(sample);
                }
            }
            samples
        });
        Ok(Self { stop, task })
    }

    /// Stops asking; returns every sample, in the order they were asked.
    pub async fn finish(self) -> Vec<ProcessSample> {
        let _ = self.stop.send(true);
        self.task.await.unwrap_or_default()
    }
}

/// One `/metrics` of the process at `base`.
async fn sample(api: &Api, base: &str) -> ProcessSample {
    let asked = Instant::now();
    let page = api.metrics(base).await.ok();
    let answered = Instant::now();
    let page = page.as_deref().unwrap_or_default();
    let counted = |name: &str| metric(page, name).unwrap_or(-1.0);
    ProcessSample {
        asked,
        answered,
        current: !depth(page).contains(&-1.0) && answered - asked < Duration::from_secs(1),
        delivered: counted("sheaf_deliveries_total{outcome=\"success\"}"),
        published: counted("sheaf_events_published_total"),
    }
}

/// What a process's counter (`delivered`, `published`) rose by between `from` and `to`, counted
/// sparingly: from its lowest value read by a sample asked at or after `from` (so nothing
/// counted before `from` is in it, even when that answer came late) to its highest read by one
/// answered at or before `to`; zero when there is no such pair.
pub fn rose_between(
    samples: &[ProcessSample],
    counter: fn(&ProcessSample) -> f64,
    from: Instant,
    to: Instant,
) -> f64 {
    let read = || samples.iter().filter(|s| counter(s) >= 0.0);
    let base = read()
        .filter(|s| s.asked >= from)
        .map(counter)
        .min_by(f64::total_cmp);
    let end = read()
        .filter(|s| s.answered <= to)
        .map(counter)
        .max_by(f64::total_cmp);
    match (base, end) {
        (Some(base), Some(end)) => (end - base).max(0.0),
        _ => 0.0,
    }
}

/// How long after `from` a process's view was current for good: the answer of the first
/// current sample asked after the last one asked that was not, among those answered after
/// `from` (a page asked before and held up past it counts). Zero when every one of them was
/// current; `None` when the last one asked was not.
pub fn view_back_after(samples: &[ProcessSample], from: Instant) -> Option<Duration> {
    let mut after: Vec<&ProcessSample> = samples.iter().filter(|s| s.answered >= from).collect();
    after.sort_by_key(|s| s.asked);
    match after.iter().rposition(|s| !s.current) {
        None => Some(Duration::ZERO),
        Some(last_behind) => after
            .get(last_behind + 1)
            .map(|s| s.answered.saturating_duration_since(from)),
    }
}

/// The longest a `/metrics` of the probe took among those answered after `from`.
pub fn slowest_answer_after(samples: &[ProcessSample], from: Instant) -> Duration {
    samples
        .iter()
        .filter(|s| s.answered >= from)
        .map(|s| s.answered - s.asked)
        .max()
        .unwrap_or_default()
}

/// The queue's jobs by state as `sheaf` counts them (`sheaf_queue_jobs`, read at scrape time
/// from its view once it has read the whole stream): due, scheduled, claimed, dead-lettered;
/// -1 for a state missing from the page.
fn depth(page: &str) -> [f64; 4] {
    ["due", "scheduled", "claimed", "dead_lettered"].map(|state| {
        metric(page, &format!("sheaf_queue_jobs{{state=\"{state}\"}}")).unwrap_or(-1.0)
    })
}

/// The end-of-run check of the queue: every process's `/metrics` shows no job left in the
/// bucket (none due, scheduled or claimed) and none dead-lettered, within [`DRAIN`].
pub async fn check_drained(
    report: &mut Report,
    api: &Api,
    processes: &[&SheafProcess],
) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut left = Vec::new();
    loop {
        left.clear();
        for sheaf in processes {
            let page = api.metrics(&sheaf.base()).await?;
            let counts = depth(&page);
            if counts != [0.0; 4] {
                left.push(format!(
                    "{}: {} due, {} scheduled, {} claimed, {} dead-lettered",
                    sheaf.name, counts[0], counts[1], counts[2], counts[3]
                ));
            }
        }
        if left.is_empty() || started.elapsed() > DRAIN {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    report.note(
        "queue drained",
        if left.is_empty() {
            format!(
                "every process's sheaf_queue_jobs 0 in every state {} after the last delivery",
                secs(started.elapsed())
            )
        } else {
            format!("not within {}: {}", secs(DRAIN), left.join("; "))
        },
    );
    report.check(
        left.is_empty(),
        format!("jobs are left in the bucket: {}", left.join("; ")),
    );
    Ok(())
}

/// Successful deliveries of one process (`sheaf_deliveries_total{outcome="success"}`) on a
/// metrics page.
pub fn successes(page: &str) -> f64 {
    metric(page, "sheaf_deliveries_total{outcome=\"success\"}").unwrap_or(0.0)
}

/// The counters that tell the JetStream scenarios' duplicates and losses apart, by process.
pub const COUNTERS: &[&str] = &[
    "sheaf_retries_total",
    "sheaf_leases_lost_total",
    "sheaf_deliveries_total{outcome=\"superseded\"}",
];

/// For the accepted events never delivered (the first five): the attempts the log store holds
/// for each, read from the suite's ClickHouse database `database`, as
/// `id: #1 failed 503 at <UTC time>, …`; empty when none is missing.
pub async fn undelivered_attempts(
    ctx: &Ctx,
    database: &str,
    published: &Published,
    receiver: &Receiver,
) -> anyhow::Result<String> {
    let delivered = receiver.first_successes();
    let mut missing: Vec<&String> = published
        .accepted
        .keys()
        .filter(|id| !delivered.contains_key(*id))
        .collect();
    missing.sort();
    missing.truncate(5);
    let mut lines = Vec::with_capacity(missing.len());
    for id in missing {
        let rows = ctx
            .clickhouse(&format!(
                "SELECT number, status, ifNull(toString(response_code), '-'), toString(attempt_time) FROM {database}.attempts WHERE event_id = '{id}' ORDER BY attempt_time FORMAT TSV"
            ))
            .await?;
        let attempts: Vec<String> = rows
            .lines()
            .map(|row| {
                let fields: Vec<&str> = row.split('\t').collect();
                match fields[..] {
                    [number, status, code, time] => format!("#{number} {status} {code} at {time}"),
                    _ => row.to_owned(),
                }
            })
            .collect();
        lines.push(format!(
            "{id}: {}",
            if attempts.is_empty() {
                "no attempt".to_owned()
            } else {
                attempts.join(", ")
            }
        ));
    }
    Ok(lines.join("; "))
}

/// Log lines of each process that say its queue failed, by kind, as `name: n kind, …`.
pub fn queue_warnings(processes: &[&SheafProcess]) -> String {
    const KINDS: &[(&str, &str)] = &[
        ("claim failed", "claims failed"),
        ("reading the queue's bucket failed", "watcher restarts"),
        (
            "reading the queue's bucket stalled",
            "watcher restarts after a stall",
        ),
        ("watching the queue's bucket failed", "watches refused"),
        ("lease renewal failed", "renewals failed"),
        ("jobs failed; trying again", "outcomes retried"),
        ("could not enqueue deliveries", "enqueues failed"),
    ];
    processes
        .iter()
        .map(|sheaf| {
            let log = sheaf.log();
            let counts: Vec<String> = KINDS
                .iter()
                .map(|(needle, what)| (log.lines().filter(|l| l.contains(needle)).count(), what))
                .filter(|(n, _)| *n > 0)
                .map(|(n, what)| format!("{n} {what}"))
                .collect();
            format!(
                "{}: {}",
                sheaf.name,
                if counts.is_empty() {
                    "none".to_owned()
                } else {
                    counts.join(", ")
                }
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Drops the scenario's Postgres schema, ClickHouse database and bucket when it passed; keeps
/// them for inspection (and says so) when it failed.
pub async fn cleanup(
    ctx: &Ctx,
    report: &mut Report,
    schema: &str,
    bucket: &Bucket,
) -> anyhow::Result<()> {
    if report.passed() {
        ctx.drop_stores(schema, schema).await?;
        bucket.delete().await
    } else {
        report.note(
            "kept for inspection",
            format!(
                "postgres schema and clickhouse database {schema} on the fault suite's servers, and the bucket {} (stream KV_{}) in the stores of its NATS cluster (target/xtask/chaos-nats-cluster/); `cargo xtask chaos-ctl nats-cluster up` brings the cluster up to look",
                bucket.name, bucket.name
            ),
        );
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_view_is_back_at_the_first_current_sample_after_the_last_behind() {
        let t0 = Instant::now();
        let ms = |n| t0 + Duration::from_millis(n);
        let sample = |asked, answered, current| ProcessSample {
            asked: ms(asked),
            answered: ms(answered),
            current,
            delivered: (answered / 100) as f64,
            published: -1.0,
        };
        let samples = [
            sample(0, 10, true),
            sample(100, 110, false),
            sample(200, 4_000, false),
            sample(4_100, 4_110, true),
            sample(4_200, 4_210, true),
        ];
        assert_eq!(
            view_back_after(&samples, ms(50)),
            Some(Duration::from_millis(4_060))
        );
        assert_eq!(view_back_after(&samples, ms(4_050)), Some(Duration::ZERO));
        // The page asked at 200 ms was held up until 4 s: behind, though asked before 3 s.
        assert_eq!(
            view_back_after(&samples, ms(3_000)),
            Some(Duration::from_millis(1_110))
        );
        assert_eq!(
            slowest_answer_after(&samples, ms(50)),
            Duration::from_millis(3_800)
        );
        assert_eq!(view_back_after(&samples[..3], ms(50)), None);
        let delivered = |s: &ProcessSample| s.delivered;
        // From the sample asked at 200 (answered at 4 s: 40) to the one answered at 4.11 s.
        assert_eq!(rose_between(&samples, delivered, ms(150), ms(4_150)), 1.0);
        assert_eq!(rose_between(&samples, delivered, ms(0), ms(5_000)), 42.0);
        assert_eq!(rose_between(&samples, delivered, ms(150), ms(3_000)), 0.0);
        let published = |s: &ProcessSample| s.published;
        assert_eq!(rose_between(&samples, published, ms(0), ms(5_000)), 0.0);
    }
}
