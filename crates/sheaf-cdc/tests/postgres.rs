//! The source against the real Postgres: each test has its own table, publication and
//! slot (unique names), and drops them at the end, also when it fails. Skipped without
//! `SHEAF_TEST_POSTGRES_URL`, failing under CI.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use sheaf_cdc::{
    CdcConfig, CdcMessage, CdcSource, CdcStream, Change, ConnectionConfig, Error, Lsn, Op,
    PublicationTables, RowFilter,
};
use sheaf_testenv::postgres::drop_replication_slot_or_report;
use sqlx::PgPool;

pub(crate) struct Pg {
    pub(crate) pool: PgPool,
    pub(crate) connection: ConnectionConfig,
    pub(crate) table: String,
    pub(crate) slot: String,
    pub(crate) publication: String,
}

impl Pg {
    async fn new(url: &str) -> Pg {
        let pool = sqlx::postgres::PgPoolOptions::new()
            .max_connections(2)
            .connect(url)
            .await
            .expect("connect");
        let name = sheaf_testenv::unique_name("cdc");
        let pg = Pg {
            pool,
            connection: ConnectionConfig::from_url(url).expect("url"),
            table: format!("{name}_t"),
            slot: format!("{name}_slot"),
            publication: format!("{name}_pub"),
        };
        pg.exec(&format!(
            "CREATE TABLE {} (id int8 PRIMARY KEY, note text)",
            pg.table
        ))
        .await;
        pg
    }

    pub(crate) fn config(&self) -> CdcConfig {
        let mut config = CdcConfig::new(self.connection.clone(), &self.slot, &self.publication);
        config.create_missing = Some(PublicationTables::Tables(vec![format!(
            "public.{}",
            self.table
        )]));
        config.status_interval = Duration::from_millis(200);
        config.application_name = self.slot.clone();
        config
    }

    async fn exec(&self, sql: &str) {
        sqlx::raw_sql(sql)
            .execute(&self.pool)
            .await
            .unwrap_or_else(|e| panic!("{sql}: {e}"));
    }

    /// Inserts ids `from..=to` in one transaction.
    pub(crate) async fn insert(&self, from: i64, to: i64) {
        self.exec(&format!(
            "INSERT INTO {} SELECT g, 'row ' || g FROM generate_series({from}, {to}) g",
            self.table
        ))
        .await;
    }

    async fn current_wal_lsn(&self) -> Lsn {
        let text: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&self.pool)
            .await
            .unwrap();
        text.parse().unwrap()
    }

    async fn confirmed_flush_lsn(&self) -> Option<Lsn> {
        let text: Option<Option<String>> = sqlx::query_scalar(
            "SELECT confirmed_flush_lsn::text FROM pg_replication_slots WHERE slot_name = $1",
        )
        .bind(&self.slot)
        .fetch_optional(&self.pool)
        .await
        .unwrap();
        text.flatten().map(|t| t.parse().unwrap())
    }

    /// Waits (at most 15 s) until the slot's confirmed position reaches `at_least`.
    pub(crate) async fn wait_confirmed(&self, at_least: Lsn) -> Lsn {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        loop {
            let confirmed = self.confirmed_flush_lsn().await.unwrap_or_default();
            if confirmed >= at_least {
                return confirmed;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "confirmed_flush_lsn stuck at {confirmed}, want {at_least}"
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Drops the slot (at most 15 s, see `drop_replication_slot`), the publication and the
    /// table. An abandoned slot would retain WAL forever.
    async fn cleanup(&self) {
        drop_replication_slot_or_report(&self.pool, &self.slot, Duration::from_secs(15)).await;
        let _ = sqlx::raw_sql(&format!("DROP PUBLICATION IF EXISTS {}", self.publication))
            .execute(&self.pool)
            .await;
        let _ = sqlx::raw_sql(&format!("DROP TABLE IF EXISTS {}", self.table))
            .execute(&self.pool)
            .await;
    }
}

/// Runs `body` as a task, then cleans up whatever happened, then re-raises its panic.
pub(crate) async fn with_pg<F, Fut>(url: String, body: F)
where
    F: FnOnce(Arc<Pg>) -> Fut,
    Fut: Future<Output = ()> + Send + 'static,
{
    let pg = Arc::new(Pg::new(&url).await);
    let outcome = tokio::spawn(body(Arc::clone(&pg))).await;
    pg.cleanup().await;
    if let Err(e) = outcome {
        match e.try_into_panic() {
            Ok(panic) => std::panic::resume_unwind(panic),
            Err(e) => panic!("test task failed: {e}"),
        }
    }
}

pub(crate) async fn recv(stream: &mut CdcStream) -> CdcMessage {
    tokio::time::timeout(Duration::from_secs(15), stream.recv())
        .await
        .expect("a message within 15 s")
        .expect("no error")
        .expect("stream open")
}

pub(crate) fn id(change: &Change) -> i64 {
    change
        .new
        .as_ref()
        .or(change.old.as_ref().map(|(_, t)| t))
        .unwrap()
        .cells()[0]
        .as_str()
        .unwrap()
        .parse()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_is_one_row_per_message_with_topics_ids_and_stamps() {
    let url = sheaf_testenv::require_postgres!(
        "default_is_one_row_per_message_with_topics_ids_and_stamps"
    );
    with_pg(url, |pg| async move {
        let mut stream = CdcSource::start(pg.config()).await.expect("start");
        pg.insert(1, 3).await;
        pg.exec(&format!(
            "UPDATE {} SET note = 'changed' WHERE id = 1",
            pg.table
        ))
        .await;
        pg.exec(&format!("DELETE FROM {} WHERE id = 2", pg.table))
            .await;
        let mut messages = Vec::new();
        for _ in 0..5 {
            messages.push(recv(&mut stream).await);
        }
        assert!(
            messages.iter().all(|m| m.changes().len() == 1),
            "one row per message"
        );
        let changes: Vec<&Change> = messages.iter().map(|m| &m.changes()[0]).collect();
        let topics: Vec<String> = changes.iter().map(|c| c.topic()).collect();
        let t = &pg.table;
        assert_eq!(
            topics,
            [
                format!("public.{t}.insert"),
                format!("public.{t}.insert"),
                format!("public.{t}.insert"),
                format!("public.{t}.update"),
                format!("public.{t}.delete"),
            ]
        );
        assert_eq!(
            changes.iter().map(|c| id(c)).collect::<Vec<_>>(),
            [1, 2, 3, 1, 2]
        );
        assert_eq!(
            changes.iter().map(|c| c.position).collect::<Vec<_>>(),
            [0, 1, 2, 0, 0]
        );
        assert_eq!(changes[0].commit_lsn, changes[2].commit_lsn);
        assert!(changes[2].commit_lsn < changes[3].commit_lsn);
        // Stamps: own LSN inside the transaction, the commit's end for its last row.
        assert_eq!(messages[0].ack_lsn(), changes[0].lsn);
        assert_eq!(messages[1].ack_lsn(), changes[1].lsn);
        assert!(
            messages[2].ack_lsn() > changes[2].commit_lsn,
            "the last row carries the commit's end"
        );
        assert_eq!(changes[3].to_json().unwrap()["new"]["note"], "changed");
        assert_eq!(changes[4].op, Op::Delete);
        let last = messages[4].ack_lsn();
        for message in messages {
            message.ack();
        }
        // At least the last stamp; more is allowed: with nothing pending, a keepalive from the
        // server (other tests write WAL concurrently) confirms its sent position, which may lie
        // past our last commit. The mid-transaction tests check it never passes an open commit.
        assert!(
            stream.confirmed_lsn() >= last,
            "confirmed {:?} is behind the last acknowledged stamp {last:?}",
            stream.confirmed_lsn()
        );
        pg.wait_confirmed(last).await;
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batch_transactions_gives_transaction_sized_batches() {
    let url =
        sheaf_testenv::require_postgres!("batch_transactions_gives_transaction_sized_batches");
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        config.stream.batch_transactions = true;
        let mut stream = CdcSource::start(config).await.expect("start");
        pg.insert(1, 3).await;
        pg.insert(4, 5).await;
        let first = recv(&mut stream).await;
        let second = recv(&mut stream).await;
        assert_eq!(
            first.changes().iter().map(id).collect::<Vec<_>>(),
            [1, 2, 3]
        );
        assert_eq!(second.changes().iter().map(id).collect::<Vec<_>>(), [4, 5]);
        first.ack();
        let last = second.ack_lsn();
        second.ack();
        pg.wait_confirmed(last).await;
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_of_exactly_the_cap_is_stamped_with_its_commit() {
    let url = sheaf_testenv::require_postgres!(
        "a_transaction_of_exactly_the_cap_is_stamped_with_its_commit"
    );
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        config.stream.batch_transactions = true;
        config.stream.checkpoint_limit = 20; // row cap 10
        let mut stream = CdcSource::start(config.clone()).await.expect("start");
        pg.insert(1, 10).await;
        let exact = recv(&mut stream).await;
        assert_eq!(exact.changes().len(), 10);
        let last_row = exact.changes()[9].lsn;
        assert!(
            exact.ack_lsn() > exact.changes()[9].commit_lsn,
            "commit end, not the last row ({last_row})"
        );
        let commit_end = exact.ack_lsn();
        exact.ack();

        pg.insert(11, 21).await;
        let split = recv(&mut stream).await;
        assert_eq!(split.changes().len(), 10);
        assert_eq!(
            split.ack_lsn(),
            split.changes()[9].lsn,
            "open transaction: the row's own LSN"
        );
        let rest = recv(&mut stream).await;
        assert_eq!(rest.changes().iter().map(id).collect::<Vec<_>>(), [21]);
        let end = rest.ack_lsn();
        split.ack();
        rest.ack();
        stream.shutdown().await.expect("shutdown");
        // The last status update is on its way when `shutdown` returns; the walsender records
        // it when it reads it, so the slot is read until it shows (bounded).
        pg.wait_confirmed(end.max(commit_end)).await;

        // Nothing acknowledged comes back after a restart.
        let mut stream = CdcSource::start(config).await.expect("restart");
        pg.insert(100, 100).await;
        let next = recv(&mut stream).await;
        assert_eq!(
            next.changes().iter().map(id).collect::<Vec<_>>(),
            [100],
            "no replay"
        );
        next.ack();
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1500_row_transaction_arrives_in_batches_without_loss_or_replay_across_restart() {
    let url = sheaf_testenv::require_postgres!(
        "a_1500_row_transaction_arrives_in_batches_without_loss_or_replay_across_restart"
    );
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        config.stream.batch_transactions = true; // default checkpoint_limit 1024: row cap 512
        let mut stream = CdcSource::start(config.clone()).await.expect("start");
        pg.insert(1, 1500).await;
        let mut sizes = Vec::new();
        let mut seen = Vec::new();
        let mut last = Lsn::ZERO;
        while seen.len() < 1500 {
            let message = recv(&mut stream).await;
            sizes.push(message.changes().len());
            seen.extend(message.changes().iter().map(id));
            last = message.ack_lsn();
            message.ack();
        }
        assert_eq!(sizes, [512, 512, 476]);
        assert_eq!(
            seen,
            (1..=1500).collect::<Vec<_>>(),
            "every row once, in order"
        );
        stream.shutdown().await.expect("shutdown");
        // At least the commit's end was reported before the stop; a keepalive between
        // transactions may have confirmed the server's sent position beyond it. The report
        // is on its way when `shutdown` returns, so the slot is read until it shows it.
        pg.wait_confirmed(last).await;

        let mut stream = CdcSource::start(config)
            .await
            .expect("restart on the same slot");
        pg.insert(2000, 2000).await;
        let next = recv(&mut stream).await;
        assert_eq!(
            next.changes().iter().map(id).collect::<Vec<_>>(),
            [2000],
            "nothing replayed"
        );
        next.ack();
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stopped_mid_transaction_without_ack_then_restarted_delivers_at_least_once() {
    let url = sheaf_testenv::require_postgres!(
        "stopped_mid_transaction_without_ack_then_restarted_delivers_at_least_once"
    );
    with_pg(url, |pg| async move {
        let config = pg.config(); // one row per message, row cap 512
        let mut stream = CdcSource::start(config.clone()).await.expect("start");
        pg.insert(1, 3).await;
        let mut acked_until = Lsn::ZERO;
        for _ in 0..3 {
            let message = recv(&mut stream).await;
            acked_until = message.ack_lsn();
            message.ack();
        }
        pg.insert(1001, 1600).await;
        let mut first_session = Vec::new();
        let mut held = Vec::new();
        for _ in 0..100 {
            let message = recv(&mut stream).await;
            first_session.push(message.changes()[0].id());
            held.push(message); // handled but never acknowledged
        }
        let open_commit = held[0].changes()[0].commit_lsn;
        stream.shutdown().await.expect("shutdown");
        drop(held);
        // The first transaction is confirmed; the open one is not (a keepalive between
        // the two may have confirmed a position past the first, but never its commit).
        let confirmed = pg.wait_confirmed(acked_until).await;
        assert!(
            confirmed >= acked_until && confirmed <= open_commit,
            "{confirmed} outside {acked_until}..={open_commit}"
        );

        let mut stream = CdcSource::start(config).await.expect("restart");
        let mut ids = Vec::new();
        let mut second_session = Vec::new();
        while ids.len() < 600 {
            let message = recv(&mut stream).await;
            let change = &message.changes()[0];
            ids.push(id(change));
            second_session.push(change.id());
            message.ack();
        }
        assert_eq!(
            ids.first(),
            Some(&1001),
            "nothing before the last acknowledgement is replayed"
        );
        assert_eq!(
            ids,
            (1001..=1600).collect::<Vec<_>>(),
            "every row of the open transaction, once"
        );
        // The rows delivered twice have the same event ids, so a store deduplicates them.
        assert_eq!(first_session[..], second_session[..100]);
        let unique: BTreeSet<_> = second_session.iter().collect();
        assert_eq!(unique.len(), 600);
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stretch_where_filters_drop_everything_still_advances_confirmed_flush_lsn() {
    let url = sheaf_testenv::require_postgres!(
        "a_stretch_where_filters_drop_everything_still_advances_confirmed_flush_lsn"
    );
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        let drop_all: RowFilter = Arc::new(|_: &Change| false);
        config.stream.filter = Some(drop_all);
        let mut stream = CdcSource::start(config).await.expect("start");
        let start = pg.confirmed_flush_lsn().await.unwrap();
        for i in 0..4 {
            pg.insert(i * 10, i * 10 + 5).await;
        }
        let before_last = pg.current_wal_lsn().await;
        pg.insert(100, 700).await; // larger than the row cap: two flushes, both dropped
        let confirmed = pg.wait_confirmed(Lsn(before_last.0 + 1)).await;
        assert!(confirmed > start);
        assert!(
            tokio::time::timeout(Duration::from_millis(300), stream.recv())
                .await
                .is_err(),
            "every row was filtered"
        );
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_advances_an_idle_slot() {
    let url = sheaf_testenv::require_postgres!("the_heartbeat_advances_an_idle_slot");
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        config.heartbeat_interval = Some(Duration::from_millis(200));
        let stream = CdcSource::start(config).await.expect("start");
        let start = pg.confirmed_flush_lsn().await.unwrap();
        let confirmed = pg.wait_confirmed(Lsn(start.0 + 1)).await;
        assert!(confirmed > start);
        stream.shutdown().await.expect("shutdown");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_publication_or_slot_is_an_error_naming_it() {
    let url =
        sheaf_testenv::require_postgres!("a_missing_publication_or_slot_is_an_error_naming_it");
    with_pg(url, |pg| async move {
        let mut config = pg.config();
        config.create_missing = None;
        let err = CdcSource::start(config.clone()).await.unwrap_err();
        assert!(matches!(&err, Error::PublicationMissing { publication } if *publication == pg.publication), "{err}");
        assert!(err.to_string().contains(&pg.publication));

        pg.exec(&format!("CREATE PUBLICATION {} FOR TABLE {}", pg.publication, pg.table)).await;
        let err = CdcSource::start(config.clone()).await.unwrap_err();
        assert!(matches!(&err, Error::SlotMissing { slot } if *slot == pg.slot), "{err}");
        assert!(err.to_string().contains(&pg.slot));

        let mut wrong = config;
        wrong.connection.password = "not the password".into();
        let err = CdcSource::start(wrong).await.unwrap_err();
        assert!(matches!(err, Error::Transport(_)), "{err}");
    })
    .await;
}
