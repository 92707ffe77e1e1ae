//! What the CDC tests share: the application's database for one test (its schema, table, slot
//! and publication, dropped whatever the outcome), reading a delivered change back, and the
//! end-to-end test's workload.

use std::collections::{BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use sheaf_engine::metrics::CdcState;
use sheaf_server::Running;
use sheaf_testenv::postgres::drop_replication_slot_or_report;
use sheaf_testenv::process::SheafProcess;
use sheaf_testenv::receiver::Receiver;
use sqlx::PgPool;
use tokio::time::Instant;

use crate::support::{Client, base_env, spawn_sheaf};

/// The application's database for one test, and what to drop afterwards.
pub(super) struct App {
    pub(super) pool: PgPool,
    pub(super) url: String,
    /// The application's own schema; its table is `<schema>.items`.
    pub(super) schema: String,
    pub(super) slot: String,
    pub(super) publication: String,
    /// Sheaf's own Postgres schema (when the test keeps its stores in Postgres).
    pub(super) store_schema: Option<String>,
    /// ClickHouse URL and Sheaf's database there (when the test keeps its log there).
    pub(super) clickhouse: Option<(String, String)>,
}

impl App {
    pub(super) async fn new(url: &str) -> App {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect(url)
            .await
            .expect("connect to the test Postgres");
        let name = sheaf_testenv::unique_name("cdcapp");
        let app = App {
            pool,
            url: url.to_owned(),
            slot: format!("{name}_slot"),
            publication: format!("{name}_pub"),
            schema: name,
            store_schema: None,
            clickhouse: None,
        };
        app.exec(&format!(
            "CREATE SCHEMA {s}; CREATE TABLE {s}.items (id int8 PRIMARY KEY, version int8 NOT NULL, note text)",
            s = app.schema
        ))
        .await;
        app
    }

    pub(super) fn table(&self) -> String {
        format!("{}.items", self.schema)
    }

    /// The settings that point a `sheaf` at this application, its table feeding `tenant`.
    pub(super) fn cdc_env(&self, tenant: &str) -> Vec<(String, String)> {
        [
            ("SHEAF_CDC_ENABLED", "true"),
            ("SHEAF_CDC_POSTGRES_URL", self.url.as_str()),
            ("SHEAF_CDC_SLOT", self.slot.as_str()),
            ("SHEAF_CDC_PUBLICATION", self.publication.as_str()),
            ("SHEAF_CDC_CREATE_MISSING", "true"),
            ("SHEAF_CDC_TENANTS", &format!("{}={tenant}", self.table())),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
    }

    pub(super) async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// The slot's `confirmed_flush_lsn` as a number (0 when the slot does not exist yet).
    pub(super) async fn confirmed_flush_lsn(&self) -> u64 {
        let text: Option<Option<String>> = sqlx::query_scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_optional(&self.pool)
        .await
        .expect("read the slot");
        text.flatten().map_or(0, |t| lsn(&t))
    }

    /// Waits (at most 20 s) until the slot's confirmed position passes `lsn`.
    pub(super) async fn wait_confirmed_past(&self, lsn: u64) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let confirmed = self.confirmed_flush_lsn().await;
            if confirmed > lsn {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "confirmed_flush_lsn {confirmed:#x} did not pass {lsn:#x}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Drops the slot (at most 30 s, see `drop_replication_slot`), the publication, the
    /// application's schema and Sheaf's own schema and ClickHouse database.
    pub(super) async fn cleanup(&self) {
        drop_replication_slot_or_report(&self.pool, &self.slot, Duration::from_secs(30)).await;
        let mut statements = vec![
            format!("DROP PUBLICATION IF EXISTS {}", self.publication),
            format!("DROP SCHEMA IF EXISTS {} CASCADE", self.schema),
        ];
        if let Some(schema) = &self.store_schema {
            statements.push(format!("DROP SCHEMA IF EXISTS {schema} CASCADE"));
        }
        for sql in statements {
            if let Err(e) = sqlx::raw_sql(&sql).execute(&self.pool).await {
                eprintln!("cleanup: {sql}: {e}");
            }
        }
        if let Some((url, database)) = &self.clickhouse {
            let dropped = reqwest::Client::new()
                .post(url)
                .body(format!("DROP DATABASE IF EXISTS {database}"))
                .timeout(Duration::from_secs(30))
                .send()
                .await;
            if let Err(e) = dropped {
                eprintln!("cleanup: drop ClickHouse database {database}: {e}");
            }
        }
    }
}

/// `X/Y` as a number.
pub(super) fn lsn(text: &str) -> u64 {
    let (hi, lo) = text.split_once('/').expect("an LSN");
    (u64::from_str_radix(hi, 16).unwrap() << 32) | u64::from_str_radix(lo, 16).unwrap()
}

/// Runs `body`, then cleans up whatever happened (by then the body's server or child process
/// is dropped, which stops it), then re-raises its panic.
pub(super) async fn with_app<F, Fut>(app: App, body: F)
where
    F: FnOnce(Arc<App>) -> Fut,
    Fut: Future<Output = ()>,
{
    use futures::FutureExt as _;
    let app = Arc::new(app);
    let outcome = std::panic::AssertUnwindSafe(body(Arc::clone(&app)))
        .catch_unwind()
        .await;
    app.cleanup().await;
    if let Err(panic) = outcome {
        std::panic::resume_unwind(panic);
    }
}

/// Waits (at most 30 s) until the in-process server's CDC source streams.
pub(super) async fn wait_streaming(server: &Running) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while server.engine.cdc().state() != CdcState::Streaming {
        assert!(
            Instant::now() < deadline,
            "the CDC source did not start: {:?}",
            server.engine.cdc().last_error()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// What a delivery's body says the change was: (op, id, version); deletes carry only the
/// key (version 0), a truncate neither (id -1).
pub(super) fn change_key(body: &Value) -> (String, i64, i64) {
    let op = body["op"].as_str().unwrap_or_default().to_owned();
    let row = if body["new"].is_object() {
        &body["new"]
    } else {
        &body["old"]
    };
    (
        op,
        row["id"].as_i64().unwrap_or(-1),
        row["version"].as_i64().unwrap_or(0),
    )
}

pub(super) fn key(op: &str, id: i64, version: i64) -> (String, i64, i64) {
    (op.to_owned(), id, version)
}

/// The changes the receiver answered 200 for.
pub(super) fn delivered_changes(receiver: &Receiver) -> BTreeSet<(String, i64, i64)> {
    receiver
        .deliveries()
        .iter()
        .filter(|d| d.status == 200)
        .map(|d| change_key(&body_json(&d.body)))
        .collect()
}

pub(super) fn body_json(body: &[u8]) -> Value {
    serde_json::from_slice(body).expect("a JSON body")
}

/// Every event of `tenant` in the log store, through the API (pages of 1,000).
pub(super) async fn all_events(client: &Client, tenant: &str) -> Vec<Value> {
    let mut events = Vec::new();
    let mut next: Option<String> = None;
    for _ in 0..100 {
        let mut path = format!("/api/v1/tenants/{tenant}/events?limit=1000");
        if let Some(cursor) = &next {
            path.push_str(&format!("&next={cursor}"));
        }
        let page = client.get(&path).await;
        assert_eq!(page.status, 200, "{page:?}");
        events.extend(page.body["items"].as_array().cloned().unwrap_or_default());
        match page.body["next"].as_str() {
            Some(cursor) => next = Some(cursor.to_owned()),
            None => return events,
        }
    }
    panic!("more than 100 pages of events");
}

/// [`all_events`] once the log holds at least `expected` of them, or after 15 s with what it
/// holds: with the Postgres queue the log store receives events behind the outbox, within about
/// one `SHEAF_LOG_SHIP_INTERVAL` of their publish.
pub(super) async fn all_events_once_shipped(
    client: &Client,
    tenant: &str,
    expected: usize,
) -> Vec<Value> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let events = all_events(client, tenant).await;
        if events.len() >= expected || std::time::Instant::now() > deadline {
            return events;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
}

/// One statement of the application's workload.
#[derive(Debug, Clone, Copy)]
pub(super) enum AppOp {
    Insert(i64),
    Update { id: i64, version: i64 },
    Delete(i64),
}

impl AppOp {
    /// What the receiver will see for it: see [`change_key`].
    pub(super) fn key(self) -> (String, i64, i64) {
        match self {
            AppOp::Insert(id) => ("insert".into(), id, 1),
            AppOp::Update { id, version } => ("update".into(), id, version),
            AppOp::Delete(id) => ("delete".into(), id, 0),
        }
    }
}

/// Seed of the workload's generator (a fixed LCG: the same transactions every run).
pub(super) const WORKLOAD_SEED: u64 = 0x5eaf_0cdc_2000;

/// 2,000 inserts in transactions of 1 to 20 rows, two of 600 (over the default 512-row
/// cap, so each arrives in several messages), with updates of earlier rows in every third
/// transaction and deletes in every fifth. Every change is distinct: an update bumps the
/// row's version, a row is deleted at most once.
pub(super) fn workload() -> Vec<Vec<AppOp>> {
    let mut state = WORKLOAD_SEED;
    let mut random = move |below: usize| {
        state = state
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        usize::try_from(state >> 33).unwrap_or(0) % below
    };
    let mut transactions = Vec::new();
    let mut live: Vec<(i64, i64)> = Vec::new();
    let mut next_id = 1;
    while next_id <= 2_000 {
        let n = transactions.len();
        let mut ops = Vec::new();
        if n % 3 == 2 {
            for _ in 0..=random(5) {
                if live.is_empty() {
                    break;
                }
                let i = random(live.len());
                live[i].1 += 1;
                ops.push(AppOp::Update {
                    id: live[i].0,
                    version: live[i].1,
                });
            }
        }
        if n % 5 == 4 {
            for _ in 0..=random(3) {
                if live.is_empty() {
                    break;
                }
                let (id, _) = live.swap_remove(random(live.len()));
                ops.push(AppOp::Delete(id));
            }
        }
        let inserts = if n == 10 || n == 60 {
            600
        } else {
            1 + random(20)
        };
        for _ in 0..inserts {
            if next_id > 2_000 {
                break;
            }
            ops.push(AppOp::Insert(next_id));
            live.push((next_id, 1));
            next_id += 1;
        }
        transactions.push(ops);
    }
    transactions
}

/// Runs one transaction of the workload (consecutive inserts as one statement).
pub(super) async fn run_transaction(pool: &PgPool, table: &str, ops: &[AppOp]) {
    let mut tx = pool.begin().await.expect("begin");
    let mut inserts: Vec<i64> = Vec::new();
    for op in ops {
        match *op {
            AppOp::Insert(id) => inserts.push(id),
            AppOp::Update { id, version } => {
                sqlx::query(&format!(
                    "UPDATE {table} SET version = $2, note = 'v' || $2 WHERE id = $1"
                ))
                .bind(id)
                .bind(version)
                .execute(&mut *tx)
                .await
                .expect("update");
            }
            AppOp::Delete(id) => {
                sqlx::query(&format!("DELETE FROM {table} WHERE id = $1"))
                    .bind(id)
                    .execute(&mut *tx)
                    .await
                    .expect("delete");
            }
        }
    }
    if !inserts.is_empty() {
        sqlx::query(&format!(
            "INSERT INTO {table} SELECT g, 1, 'row ' || g FROM unnest($1::int8[]) g"
        ))
        .bind(&inserts)
        .execute(&mut *tx)
        .await
        .expect("insert");
    }
    tx.commit().await.expect("commit");
}

/// Starts the real binary with `env` (see [`spawn_sheaf`]).
pub(super) async fn spawn_with(env: &[(String, String)]) -> SheafProcess {
    let pairs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    spawn_sheaf(&pairs).await
}

/// Polls a metric of a `sheaf` process until `done` holds (bounded); returns its value.
pub(super) async fn wait_metric(
    client: &Client,
    name: &str,
    timeout: Duration,
    done: impl Fn(f64) -> bool,
) -> f64 {
    let deadline = Instant::now() + timeout;
    loop {
        let value = client.metric(name).await;
        if done(value) {
            return value;
        }
        assert!(
            Instant::now() < deadline,
            "{name} = {value} after {timeout:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where a test server of the CDC tests keeps its events.
#[derive(Debug, Clone, Copy)]
pub(super) enum Store {
    Memory,
    Sqlite,
}

impl Store {
    /// The settings of one new, empty store of this kind.
    pub(super) fn fresh(self) -> HashMap<String, String> {
        let mut env = base_env();
        if let Store::Sqlite = self {
            let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"))
                .join(sheaf_testenv::unique_name("sheaf-data"));
            env.insert("SHEAF_LOG_STORE".into(), "sqlite".into());
            env.insert("SHEAF_DATA_DIR".into(), dir.display().to_string());
        }
        env
    }
}
