//! A fresh schema per test, dropped when the test ends (also when it fails), and the gate that
//! keeps the throughput measurement alone on the machine.

use std::time::Duration;

use sheaf_postgres::{PostgresConfig, PostgresStores};
use sheaf_store::testkit::fixtures::ago;
use sheaf_store::{AttemptKey, DestinationId, EventId, TenantId};
use sqlx::Connection;

/// The advisory lock key of [`Gate`] (a constant no other code uses: "SHEAFPGT" in ASCII).
const GATE_KEY: i64 = 0x5348_4541_4650_4754;

/// A Postgres advisory lock held for a test's duration: every test takes it shared, the
/// measurement exclusively, so the measured figures are not diluted by these tests running at the
/// same time on two cores. It lives in the server, not the process, because `cargo xtask test`
/// runs each test in a process of its own (nextest). Dropping the gate drops its connection,
/// which releases the lock.
pub struct Gate {
    _conn: sqlx::PgConnection,
}

impl Gate {
    /// Waits (at most 10 minutes, the whole suite's length many times over) for the shared lock.
    pub async fn shared(url: &str) -> Gate {
        Self::take(url, "pg_try_advisory_lock_shared").await
    }

    /// Waits (at most 10 minutes) until no other test holds the gate, and keeps them out.
    pub async fn exclusive(url: &str) -> Gate {
        Self::take(url, "pg_try_advisory_lock").await
    }

    /// Tries every 20 ms instead of blocking in `pg_advisory_lock`: a statement blocked on a
    /// lock keeps its snapshot for as long as it waits, and that snapshot stops every other
    /// test's tables from being pruned meanwhile. `claims_and_renewals_are_hot_updates` then saw
    /// 30–88 % HOT updates instead of 98 %, depending on who was waiting.
    async fn take(url: &str, function: &str) -> Gate {
        let mut conn = sqlx::PgConnection::connect(url)
            .await
            .expect("connect to the test Postgres");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(600);
        loop {
            let taken: bool = sqlx::query_scalar(&format!("SELECT {function}($1)"))
                .bind(GATE_KEY)
                .fetch_one(&mut conn)
                .await
                .expect("take the test gate");
            if taken {
                return Gate { _conn: conn };
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "the test gate stayed taken for 10 minutes"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A migrated schema of its own, and the stores over it.
pub struct TestSchema {
    pub stores: PostgresStores,
    pub url: String,
    pub schema: String,
}

impl TestSchema {
    /// The default test configuration for a fresh, unique schema.
    pub fn config(url: &str) -> PostgresConfig {
        PostgresConfig {
            max_connections: 8,
            ..PostgresConfig::new(url).with_schema(sheaf_testenv::unique_name("pgtest"))
        }
    }

    /// A fresh schema with the default test configuration, migrated.
    pub async fn new(url: &str) -> Self {
        Self::with_config(Self::config(url)).await
    }

    /// A fresh schema (the one `config` names), migrated.
    pub async fn with_config(config: PostgresConfig) -> Self {
        let this = Self::unmigrated(config);
        this.stores.migrate().await.expect("migrate a fresh schema");
        this
    }

    /// The guard for the schema `config` names, before anything is created: whatever a test
    /// creates in it is dropped when the guard is.
    pub fn unmigrated(config: PostgresConfig) -> Self {
        let url = config.url.clone();
        let schema = config.schema.clone();
        let stores = PostgresStores::new(config).expect("the test configuration is valid");
        TestSchema {
            stores,
            url,
            schema,
        }
    }

    /// A plain connection to the test database, for inspecting the server.
    pub async fn connect(&self) -> sqlx::PgConnection {
        sqlx::PgConnection::connect(&self.url)
            .await
            .expect("connect to the test Postgres")
    }

    /// `"schema".table`.
    pub fn table(&self, name: &str) -> String {
        format!("\"{}\".{name}", self.schema)
    }
}

impl Drop for TestSchema {
    fn drop(&mut self) {
        // Drop cannot await, and may run while a failed test unwinds inside its runtime: a
        // thread of its own with a small runtime of its own does the cleanup.
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let outcome = std::thread::spawn(move || -> Result<(), String> {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .map_err(|e| e.to_string())?;
            runtime.block_on(async {
                let mut conn = sqlx::PgConnection::connect(&url)
                    .await
                    .map_err(|e| e.to_string())?;
                // A statement of a failed test may still hold a lock for a moment.
                sqlx::raw_sql(&format!(
                    "SET lock_timeout = '10s'; DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"
                ))
                .execute(&mut conn)
                .await
                .map_err(|e| e.to_string())?;
                conn.close().await.map_err(|e| e.to_string())
            })
        })
        .join();
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(e)) => eprintln!("could not drop test schema {}: {e}", self.schema),
            Err(_) => eprintln!("dropping test schema {} panicked", self.schema),
        }
    }
}

/// Polls `check` every `every` until it returns `Some`, for at most `limit`.
pub async fn wait_for<T, F, Fut>(limit: Duration, every: Duration, mut check: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        if let Some(value) = check().await {
            return Some(value);
        }
        if tokio::time::Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(every).await;
    }
}

/// `(n_tup_upd, n_tup_hot_upd)` of `schema.jobs` from `pg_stat_user_tables`, once at least
/// `at_least` updates are visible. Statistics reach the view asynchronously: a backend flushes
/// them when it goes idle (at most once a second) and when it exits, so callers close their pool
/// first and this polls for up to 15 s.
pub async fn job_update_stats(test: &TestSchema, at_least: i64) -> (i64, i64) {
    let mut conn = test.connect().await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
    loop {
        let stats = sqlx::query_as::<_, (i64, i64)>(
            "SELECT n_tup_upd, n_tup_hot_upd FROM pg_stat_user_tables
             WHERE schemaname = $1 AND relname = 'jobs'",
        )
        .bind(&test.schema)
        .fetch_optional(&mut conn)
        .await
        .expect("read pg_stat_user_tables");
        if let Some(stats) = stats.filter(|(updates, _)| *updates >= at_least) {
            return stats;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "pg_stat_user_tables did not show {at_least} updates of the job table within 15 s \
             (last seen: {stats:?})"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Fills the test's log with 50,000 events of 20 tenants and 200,000 attempts (four destinations
/// per event, one a second apart over the last day), generated by the server, and analyzes it.
/// Returns 100 lookup keys: 90 whose triple has attempts (bounds two days back), then 10 for a
/// destination without any.
pub async fn fill_attempts(test: &TestSchema) -> Vec<AttemptKey> {
    let mut conn = test.connect().await;
    let fill = format!(
        "INSERT INTO {events} (tenant_id, event_id, topic, event_time, data)
         SELECT 'fill-' || (g % 20), 'evt-' || g, 'order.created',
                now() - interval '1 day' + g * interval '1 second', json_build_object('n', g)
         FROM generate_series(1, 50000) AS g;
         INSERT INTO {attempts} (tenant_id, attempt_id, event_id, destination_id, number,
             attempt_time, status, trigger, response_code, duration_ms, response_body, error,
             event_topic)
         SELECT 'fill-' || (e % 20), md5('attempt-' || g)::uuid, 'evt-' || e,
                md5('destination-' || (g / 50000))::uuid, 1,
                now() - interval '1 day' + g * interval '1 second', 'failed', 'scheduled', 503,
                20, 'unavailable', NULL, 'order.created'
         FROM generate_series(0, 199999) AS g, LATERAL (SELECT g % 50000 + 1 AS e) AS k;
         ANALYZE {events}; ANALYZE {attempts};",
        events = test.table("events"),
        attempts = test.table("attempts"),
    );
    sqlx::raw_sql(&fill)
        .execute(&mut conn)
        .await
        .expect("generate the attempts");
    let destinations: Vec<uuid::Uuid> = sqlx::query_scalar(
        "SELECT md5('destination-' || d)::uuid FROM generate_series(0, 4) AS d ORDER BY d",
    )
    .fetch_all(&mut conn)
    .await
    .expect("destination ids");
    let since = ago(Duration::from_secs(2 * 24 * 3600));
    (0..100i64)
        .map(|i| {
            let e = 1 + i * 499;
            AttemptKey {
                tenant_id: TenantId::new(format!("fill-{}", e % 20)).expect("valid"),
                event_id: EventId::new(format!("evt-{e}")).expect("valid"),
                destination_id: DestinationId::from_uuid(
                    destinations[if i < 90 { (i % 4) as usize } else { 4 }],
                ),
                attempt_time: since,
            }
        })
        .collect()
}
