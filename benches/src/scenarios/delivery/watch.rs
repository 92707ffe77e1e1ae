//! The steady phase's readings, once a second, for `stall.rs`: what the `sheaf` process, the
//! host, Postgres and ClickHouse were doing at the end of each second.
//!
//! One Postgres connection and two statements a second: `pg_stat_activity` of the run's
//! database (sheaf's own connections told apart by the `application_name` the scenario gives
//! them), then the checkpointer's counters (`pg_stat_bgwriter`), WAL bytes (`pg_stat_wal`) and
//! the vacuums and analyzes in progress, with the table each holds its lock on (the `sheaf` role
//! may not read other roles' backends in `pg_stat_activity`, nor the progress views' relation,
//! but every role reads `pg_locks`). From `/proc`: the CPU of `sheaf`, Postgres (the postmaster
//! and its children) and ClickHouse, sheaf's RSS, the host's CPU and its CPU and IO pressure.
//! And sheaf's `/metrics` page: queue depth and outbox, jobs claimed and events shipped. Each
//! half waits at most [`PROBE_TIMEOUT`], so a server that stops answering shows as a reading
//! that did not come, with how long it was waited for.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::oneshot;

/// How long a reading waits for Postgres or for `/metrics`: under the second, so a server that
/// stops answering shows as a reading that did not come rather than as seconds not read.
const PROBE_TIMEOUT: Duration = Duration::from_millis(900);

/// What the watcher reads.
#[derive(Debug, Clone)]
pub struct Watched {
    pub postgres_url: String,
    /// The `application_name` of sheaf's connections, and the schema its statements name (the
    /// run's schema, stripped from the statements' text).
    pub schema: String,
    pub sheaf_pid: u32,
    pub postgres_pid: Option<u32>,
    pub clickhouse_pid: Option<u32>,
    /// sheaf's `/metrics` page.
    pub metrics_url: String,
}

/// The readings at the end of one second.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Tick {
    /// Microseconds after the watcher started.
    pub at_micros: u64,
    /// CPU used since the previous reading, in % of one core.
    pub sheaf_cpu_pct: Option<f64>,
    pub postgres_cpu_pct: Option<f64>,
    pub clickhouse_cpu_pct: Option<f64>,
    pub sheaf_rss_mib: Option<f64>,
    pub host: Option<Host>,
    /// `None`: Postgres did not answer within [`PROBE_TIMEOUT`], or failed (`postgres_error`).
    pub postgres: Option<PgActivity>,
    pub postgres_error: Option<String>,
    /// How long the two statements took to answer.
    pub postgres_probe_ms: f64,
    /// `None`: the page did not come within [`PROBE_TIMEOUT`].
    pub metrics: Option<SheafGauges>,
    pub metrics_probe_ms: f64,
}

/// The host since the previous reading: `/proc/stat` and `/proc/pressure`.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct Host {
    /// Of all cores' time: busy, waiting on IO, taken by the hypervisor.
    pub busy_pct: f64,
    pub iowait_pct: f64,
    pub steal_pct: f64,
    /// Milliseconds in which every runnable task waited on IO (`io` full), and in which some
    /// waited for a CPU (`cpu` some); `None` without pressure stall information.
    pub io_stall_ms: Option<f64>,
    pub cpu_wait_ms: Option<f64>,
}

/// Postgres at the end of a second, and its counters since the previous reading.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PgActivity {
    /// sheaf's connections running a statement, by what they waited on (`CPU`: on nothing),
    /// most first.
    pub sheaf_active: Vec<(String, u32)>,
    pub sheaf_idle_in_transaction: u32,
    /// The database's other client connections running a statement (tests, other runs).
    pub others_active: u32,
    /// The longest-running statement among the database's client connections.
    pub longest: Option<LongestStatement>,
    /// Vacuums and analyzes in progress in the database (`vacuum jobs`).
    pub maintenance: Vec<String>,
    pub checkpoints_timed: i64,
    pub checkpoints_requested: i64,
    pub buffers_checkpoint: i64,
    pub checkpoint_write_ms: f64,
    pub checkpoint_sync_ms: f64,
    /// Buffers backends had to write themselves (`None` on Postgres 17, which moved it).
    pub buffers_backend: Option<i64>,
    pub wal_bytes: i64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct LongestStatement {
    pub running_ms: f64,
    /// Its first 80 characters, the run's schema left out.
    pub text: String,
    pub sheaf: bool,
    /// What it waited on (`CPU`: nothing).
    pub waiting_on: String,
}

/// sheaf's `/metrics`: gauges at the end of the second, counters since the previous reading.
#[derive(Debug, Clone, Copy, Default, Serialize)]
pub struct SheafGauges {
    pub due: f64,
    pub claimed: f64,
    pub outbox_events: f64,
    /// Jobs claimed by the claim statement, and handed by a publish straight to a worker.
    pub jobs_claimed: f64,
    pub jobs_handed_over: f64,
    pub events_shipped: f64,
    pub leases_lost: f64,
}

/// Reads every second until finished.
pub struct Watcher {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<Tick>>,
    /// When it started, on the caller's clock.
    pub started: Instant,
}

impl Watcher {
    /// Connects to Postgres (an error if it cannot), takes the first readings and starts.
    pub async fn start(watched: Watched) -> anyhow::Result<Self> {
        let conn = crate::pg::connect(&watched.postgres_url).await?;
        let mut reader = Reader::new(watched, conn);
        let started = Instant::now();
        reader.read(started).await;
        let (stop, mut stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            let mut every =
                tokio::time::interval_at((started + Duration::from_secs(1)).into(), SECOND);
            every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            let mut ticks = Vec::new();
            loop {
                tokio::select! {
                    _ = &mut stopped => return ticks,
                    _ = every.tick() => {}
                }
                tokio::select! {
                    _ = &mut stopped => return ticks,
                    tick = reader.read(started) => ticks.push(tick),
                }
            }
        });
        Ok(Watcher {
            stop,
            task,
            started,
        })
    }

    /// Stops at once (a reading under way is dropped) and hands back the readings.
    pub async fn finish(self) -> Vec<Tick> {
        let _ = self.stop.send(());
        self.task.await.unwrap_or_default()
    }
}

const SECOND: Duration = Duration::from_secs(1);

/// The readings' state: the connection and the counters the next reading subtracts.
struct Reader {
    watched: Watched,
    postgres: PgProbe,
    metrics: MetricsProbe,
    last_at: Instant,
    last_cpu: [Option<Duration>; 3],
    last_host: Option<HostCounters>,
}

impl Reader {
    fn new(watched: Watched, conn: sqlx::PgConnection) -> Self {
        let http = reqwest::Client::builder()
            .timeout(PROBE_TIMEOUT)
            .build()
            .unwrap_or_default();
        Reader {
            postgres: PgProbe {
                url: watched.postgres_url.clone(),
                schema: watched.schema.clone(),
                conn: Some(conn),
                counters_sql: String::new(),
                last: None,
            },
            metrics: MetricsProbe {
                http,
                url: watched.metrics_url.clone(),
                last: None,
            },
            watched,
            last_at: Instant::now(),
            last_cpu: [None; 3],
            last_host: None,
        }
    }

    /// One reading: /proc first (it always answers), then Postgres and `/metrics` side by side,
    /// each within [`PROBE_TIMEOUT`].
    async fn read(&mut self, started: Instant) -> Tick {
        use sheaf_testenv::process::{cpu_time, tree_cpu_time};
        let now = Instant::now();
        let elapsed = now.duration_since(self.last_at).as_secs_f64().max(1e-3);
        self.last_at = now;
        let w = &self.watched;
        let cpu = [
            cpu_time(w.sheaf_pid),
            w.postgres_pid.and_then(tree_cpu_time),
            w.clickhouse_pid.and_then(cpu_time),
        ];
        let pct = |i: usize| {
            let used = cpu[i]?.checked_sub(self.last_cpu[i]?)?;
            Some(used.as_secs_f64() * 100.0 / elapsed)
        };
        let (sheaf_cpu_pct, postgres_cpu_pct, clickhouse_cpu_pct) = (pct(0), pct(1), pct(2));
        self.last_cpu = cpu;
        let host_now = HostCounters::read();
        let host = match (self.last_host, host_now) {
            (Some(before), Some(after)) => Some(after.since(before)),
            _ => None,
        };
        self.last_host = host_now;
        let sheaf_rss_mib = crate::proc::rss_kib(Some(w.sheaf_pid)).map(|kib| kib as f64 / 1024.0);
        let ((postgres, postgres_error, postgres_probe_ms), (metrics, metrics_probe_ms)) =
            tokio::join!(self.postgres.read(), self.metrics.read());
        Tick {
            at_micros: now.duration_since(started).as_micros() as u64,
            sheaf_cpu_pct,
            postgres_cpu_pct,
            clickhouse_cpu_pct,
            sheaf_rss_mib,
            host,
            postgres,
            postgres_error,
            postgres_probe_ms,
            metrics,
            metrics_probe_ms,
        }
    }
}

/// The Postgres half of a reading.
struct PgProbe {
    url: String,
    schema: String,
    /// `None` after a reading failed or timed out: the next one connects again.
    conn: Option<sqlx::PgConnection>,
    /// [`counters_sql`] for the server's version, read on the first reading.
    counters_sql: String,
    last: Option<PgCounters>,
}

/// The database's client connections (but the watcher's), one row each.
const ACTIVITY: &str = "\
    SELECT coalesce(application_name = $1, false), state, wait_event_type, wait_event, \
           (extract(epoch FROM clock_timestamp() - query_start) * 1000)::float8, \
           left(regexp_replace(query, '\\s+', ' ', 'g'), 240) \
    FROM pg_stat_activity \
    WHERE datname = current_database() AND pid <> pg_backend_pid() \
      AND backend_type = 'client backend'";

/// The server's counters, and the vacuums and analyzes running in the database with the
/// relation each holds its `SHARE UPDATE EXCLUSIVE` lock on (`pg_locks` is readable by every
/// role, the progress views' relation column only by the backend's own).
fn counters_sql(version: i32) -> String {
    let checkpoints = if version >= 170_000 {
        "SELECT num_timed, num_requested, buffers_written, write_time, sync_time, \
                NULL::bigint AS buffers_backend FROM pg_stat_checkpointer"
    } else {
        "SELECT checkpoints_timed, checkpoints_req, buffers_checkpoint, checkpoint_write_time, \
                checkpoint_sync_time, buffers_backend FROM pg_stat_bgwriter"
    };
    format!(
        "SELECT c.*, (SELECT wal_bytes FROM pg_stat_wal)::bigint, \
           ARRAY(SELECT DISTINCT m.kind || ' ' || coalesce(l.relation::regclass::text, '?') \
                 FROM (SELECT pid, 'vacuum' AS kind FROM pg_stat_progress_vacuum WHERE datid = d.oid \
                       UNION ALL \
                       SELECT pid, 'analyze' FROM pg_stat_progress_analyze WHERE datid = d.oid) AS m \
                 LEFT JOIN pg_locks AS l ON l.pid = m.pid AND l.locktype = 'relation' \
                   AND l.mode = 'ShareUpdateExclusiveLock' AND l.database = d.oid) \
         FROM ({checkpoints}) AS c, pg_database AS d WHERE d.datname = current_database()"
    )
}

/// Cumulative counters, subtracted between readings.
#[derive(Debug, Clone, Copy)]
struct PgCounters {
    timed: i64,
    requested: i64,
    buffers: i64,
    write_ms: f64,
    sync_ms: f64,
    backend: Option<i64>,
    wal: i64,
}

/// [`counters_sql`]'s row: the checkpointer's six counters, WAL bytes, maintenance.
type CountersRow = (i64, i64, i64, f64, f64, Option<i64>, i64, Vec<String>);

type ActivityRow = (
    bool,
    Option<String>,
    Option<String>,
    Option<String>,
    Option<f64>,
    Option<String>,
);

impl PgProbe {
    async fn read(&mut self) -> (Option<PgActivity>, Option<String>, f64) {
        let t = Instant::now();
        let answer = tokio::time::timeout(PROBE_TIMEOUT, self.query()).await;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        match answer {
            Ok(Ok(activity)) => (Some(activity), None, ms),
            Ok(Err(e)) => {
                self.conn = None;
                (None, Some(format!("{e:#}")), ms)
            }
            Err(_) => {
                self.conn = None;
                (None, Some("no answer within 0.9 s".to_owned()), ms)
            }
        }
    }

    async fn query(&mut self) -> anyhow::Result<PgActivity> {
        let conn = match &mut self.conn {
            Some(conn) => conn,
            None => self.conn.insert(crate::pg::connect(&self.url).await?),
        };
        if self.counters_sql.is_empty() {
            let (version,): (i32,) =
                sqlx::query_as("SELECT current_setting('server_version_num')::int")
                    .fetch_one(&mut *conn)
                    .await?;
            self.counters_sql = counters_sql(version);
        }
        let rows: Vec<ActivityRow> = sqlx::query_as(ACTIVITY)
            .bind(&self.schema)
            .fetch_all(&mut *conn)
            .await?;
        let row: CountersRow = sqlx::query_as(&self.counters_sql)
            .fetch_one(&mut *conn)
            .await?;
        let now = PgCounters {
            timed: row.0,
            requested: row.1,
            buffers: row.2,
            write_ms: row.3,
            sync_ms: row.4,
            backend: row.5,
            wal: row.6,
        };
        let mut activity = summarize_activity(&rows, &self.schema);
        activity.maintenance = row.7.iter().map(|m| unqualified(m, &self.schema)).collect();
        if let Some(before) = self.last {
            activity.checkpoints_timed = now.timed - before.timed;
            activity.checkpoints_requested = now.requested - before.requested;
            activity.buffers_checkpoint = now.buffers - before.buffers;
            activity.checkpoint_write_ms = now.write_ms - before.write_ms;
            activity.checkpoint_sync_ms = now.sync_ms - before.sync_ms;
            activity.buffers_backend = now.backend.zip(before.backend).map(|(a, b)| a - b);
            activity.wal_bytes = now.wal - before.wal;
        }
        self.last = Some(now);
        Ok(activity)
    }
}

/// sheaf's active connections by wait, the others counted, the longest statement.
fn summarize_activity(rows: &[ActivityRow], schema: &str) -> PgActivity {
    let mut activity = PgActivity::default();
    let mut waits: HashMap<String, u32> = HashMap::new();
    for (sheaf, state, wait_type, wait, running_ms, text) in rows {
        let waiting_on = match (wait_type, wait) {
            (Some(kind), Some(event)) => format!("{kind}:{event}"),
            _ => "CPU".to_owned(),
        };
        match state.as_deref() {
            Some("active") => {}
            Some(s) if *sheaf && s.starts_with("idle in transaction") => {
                activity.sheaf_idle_in_transaction += 1;
                continue;
            }
            _ => continue,
        }
        if *sheaf {
            *waits.entry(waiting_on.clone()).or_default() += 1;
        } else {
            activity.others_active += 1;
        }
        let running_ms = running_ms.unwrap_or(0.0);
        if activity
            .longest
            .as_ref()
            .is_none_or(|l| running_ms > l.running_ms)
        {
            let text = unqualified(text.as_deref().unwrap_or(""), schema);
            activity.longest = Some(LongestStatement {
                running_ms,
                text: text.chars().take(80).collect(),
                sheaf: *sheaf,
                waiting_on,
            });
        }
    }
    let mut waits: Vec<(String, u32)> = waits.into_iter().collect();
    waits.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    activity.sheaf_active = waits;
    activity
}

/// `text` without the run's schema before its tables' names.
fn unqualified(text: &str, schema: &str) -> String {
    text.replace(&format!("\"{schema}\"."), "")
        .replace(&format!("{schema}."), "")
}

/// The `/metrics` half of a reading.
struct MetricsProbe {
    http: reqwest::Client,
    url: String,
    /// The counters of the previous page: claimed, handed over, shipped, leases lost.
    last: Option<[f64; 4]>,
}

impl MetricsProbe {
    async fn read(&mut self) -> (Option<SheafGauges>, f64) {
        let t = Instant::now();
        let page = async { self.http.get(&self.url).send().await?.text().await };
        let page = tokio::time::timeout(PROBE_TIMEOUT, page).await;
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let Ok(Ok(page)) = page else {
            return (None, ms);
        };
        let value = |name: &str, labels: &str| crate::sheaf::metric(&page, name, labels);
        let counters = [
            value("sheaf_jobs_claimed_total", ""),
            value("sheaf_jobs_handed_over_total", ""),
            value("sheaf_events_shipped_total", ""),
            value("sheaf_leases_lost_total", ""),
        ];
        let since = |i: usize| self.last.map_or(0.0, |last| counters[i] - last[i]);
        let gauges = SheafGauges {
            due: value("sheaf_queue_jobs", "state=\"due\""),
            claimed: value("sheaf_queue_jobs", "state=\"claimed\""),
            outbox_events: value("sheaf_outbox_events", ""),
            jobs_claimed: since(0),
            jobs_handed_over: since(1),
            events_shipped: since(2),
            leases_lost: since(3),
        };
        self.last = Some(counters);
        (Some(gauges), ms)
    }
}

/// The host's cumulative counters: `/proc/stat`'s first line in ticks, pressure totals in µs.
#[derive(Debug, Clone, Copy)]
struct HostCounters {
    total: u64,
    idle: u64,
    iowait: u64,
    steal: u64,
    io_full_us: Option<u64>,
    cpu_some_us: Option<u64>,
}

impl HostCounters {
    fn read() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let ticks: Vec<u64> = stat
            .lines()
            .next()?
            .strip_prefix("cpu ")?
            .split_whitespace()
            .filter_map(|v| v.parse().ok())
            .collect();
        // user nice system idle iowait irq softirq steal (guest time is inside user).
        let field = |i: usize| ticks.get(i).copied().unwrap_or(0);
        let pressure = |file: &str, kind: &str| {
            let text = std::fs::read_to_string(format!("/proc/pressure/{file}")).ok()?;
            let line = text.lines().find(|l| l.starts_with(kind))?;
            line.rsplit_once("total=")?.1.trim().parse().ok()
        };
        Some(HostCounters {
            total: (0..8).map(field).sum(),
            idle: field(3),
            iowait: field(4),
            steal: field(7),
            io_full_us: pressure("io", "full"),
            cpu_some_us: pressure("cpu", "some"),
        })
    }

    fn since(self, before: HostCounters) -> Host {
        let total = self.total.saturating_sub(before.total).max(1) as f64;
        let share = |now: u64, then: u64| now.saturating_sub(then) as f64 * 100.0 / total;
        let idle =
            self.idle.saturating_sub(before.idle) + self.iowait.saturating_sub(before.iowait);
        let ms =
            |now: Option<u64>, then: Option<u64>| Some(now?.saturating_sub(then?) as f64 / 1e3);
        Host {
            busy_pct: 100.0 - idle as f64 * 100.0 / total,
            iowait_pct: share(self.iowait, before.iowait),
            steal_pct: share(self.steal, before.steal),
            io_stall_ms: ms(self.io_full_us, before.io_full_us),
            cpu_wait_ms: ms(self.cpu_some_us, before.cpu_some_us),
        }
    }
}
