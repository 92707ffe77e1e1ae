//! What only the SQLite backend promises: group commit through the single writer, a failing
//! write rolled back alone, the file kept across a reopen, and what opening refuses.

use std::time::Duration;

use sheaf_sqlite::{SqliteError, SqliteOptions, SqliteStore, Synchronous};
use sheaf_store::testkit::fixtures::{destination, event, job, unique_tenant};
use sheaf_store::{ErrorKind, QueueDepth, Timestamp};

use crate::support::{TestDb, fill_until_refused};

/// Concurrent writers share transactions: many operations, fewer flushes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_transactions() {
    let db = TestDb::new("group-commit").await;
    let log = db.store.log_store();
    let tenant = unique_tenant("group");
    let writers: Vec<_> = (0..200)
        .map(|i| {
            let log = log.clone();
            let e = event(&tenant, &format!("e{i}"), "t", Timestamp::now());
            tokio::spawn(async move { log.insert_many(&[e], &[]).await })
        })
        .collect();
    for writer in writers {
        writer.await.expect("task").expect("insert");
    }
    let metrics = db.store.write_metrics();
    eprintln!(
        "200 concurrent inserts: {} flushes, {} operations",
        metrics.writes, metrics.records_written
    );
    assert_eq!(metrics.records_written, 200, "{metrics:?}");
    assert!(
        metrics.writes < 200,
        "some flushes carried several writes: {metrics:?}"
    );
    assert_eq!(metrics.failed_writes, 0);
    db.store.close().await;
}

/// In one flush, a write that fails (a taken destination id) is rolled back alone and answered
/// with its own error; the others commit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_write_is_rolled_back_alone() {
    let db = TestDb::new("savepoints").await;
    let entities = db.store.entity_store();
    let tenant = unique_tenant("savepoints");
    entities
        .upsert_tenant(&tenant, &Default::default())
        .await
        .expect("tenant");
    let taken = destination(&tenant);
    entities.create_destination(&taken).await.expect("create");
    let calls: Vec<_> = (0..40)
        .map(|i| {
            let entities = entities.clone();
            // Every other call reuses the taken id.
            let d = if i % 2 == 0 {
                destination(&tenant)
            } else {
                sheaf_store::Destination {
                    secret: sheaf_store::testkit::fixtures::secret(),
                    ..taken.clone()
                }
            };
            tokio::spawn(async move { (i, d.id, entities.create_destination(&d).await) })
        })
        .collect();
    let mut created = 1;
    for call in calls {
        let (i, _, result) = call.await.expect("task");
        if i % 2 == 0 {
            result.expect("a fresh id is created");
            created += 1;
        } else {
            assert_eq!(result.unwrap_err().kind(), ErrorKind::Conflict);
        }
    }
    let listed = entities.list_destinations(&tenant).await.expect("list");
    assert_eq!(listed.len(), created);
    let stored = entities
        .get_destination(&tenant, &taken.id)
        .await
        .expect("get");
    assert_eq!(stored, Some(taken), "the taken destination is untouched");
    db.store.close().await;
}

/// Jobs, their leases and the schema survive closing and opening the file again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_file_keeps_the_queue_across_a_reopen() {
    let db = TestDb::new("reopen").await;
    let path = db.store.path().to_owned();
    let tenant = unique_tenant("reopen");
    let jobs = [
        job(&tenant, Timestamp::now()),
        job(&tenant, Timestamp::now()),
    ];
    let queue = db.store.job_queue();
    queue.enqueue(&jobs).await.expect("enqueue");
    let claimed = queue
        .claim(1, Duration::from_secs(600))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    db.store.close().await;

    let store = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .expect("reopen");
    let queue = store.job_queue();
    assert_eq!(
        queue.depth().await.expect("depth"),
        QueueDepth {
            due: 1,
            claimed: 1,
            ..QueueDepth::default()
        }
    );
    let lost = queue.complete(&[claimed[0].lease]).await.expect("complete");
    assert!(
        lost.is_empty(),
        "the lease taken before the reopen still holds"
    );
    let version: i64 = sqlx::query_scalar("PRAGMA user_version")
        .fetch_one(store.readers())
        .await
        .expect("user_version");
    assert_eq!(version, SqliteStore::schema_version());
    let mode: String = sqlx::query_scalar("PRAGMA journal_mode")
        .fetch_one(store.readers())
        .await
        .expect("journal_mode");
    assert_eq!(mode, "wal");
    store.close().await;
}

/// A file made by a build before the queue's rows were keyed by id (schema version 5) keeps
/// its queued jobs through the migration that moves them, and the store claims them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_file_keeps_its_queue_through_the_upgrade() {
    use sqlx::Connection;
    let dir = TestDb::new("upgrade").await;
    let path = dir.store.path().to_owned();
    dir.store.close().await;
    for file in ["sheaf.db", "sheaf.db-wal", "sheaf.db-shm"] {
        let _ = std::fs::remove_file(dir.dir.join(file));
    }
    // The file as version 5 left it, with one job waiting.
    let tenant = unique_tenant("upgrade");
    let waiting = job(&tenant, Timestamp::now());
    {
        let options = sqlx::sqlite::SqliteConnectOptions::new()
            .filename(&path)
            .create_if_missing(true);
        let mut connection = sqlx::SqliteConnection::connect_with(&options)
            .await
            .expect("create a version 5 file");
        let version_5 = [
            include_str!("../migrations/0001_log.sql"),
            include_str!("../migrations/0002_entities.sql"),
            include_str!("../migrations/0003_queue.sql"),
            include_str!("../migrations/0004_replays.sql"),
            include_str!("../migrations/0005_retention.sql"),
        ];
        for sql in version_5 {
            sqlx::raw_sql(sql)
                .execute(&mut connection)
                .await
                .expect("an old migration");
        }
        sqlx::query(
            "INSERT INTO jobs (id, tenant_id, event_id, destination_id, attempt_number,
                               next_due_at)
             VALUES (?1, ?2, ?3, ?4, 1, ?5)",
        )
        .bind(waiting.id.to_string())
        .bind(waiting.tenant_id.as_str())
        .bind(waiting.event_id.as_str())
        .bind(waiting.destination_id.to_string())
        .bind(waiting.due_at.as_micros())
        .execute(&mut connection)
        .await
        .expect("a waiting job");
        sqlx::raw_sql("PRAGMA user_version = 5")
            .execute(&mut connection)
            .await
            .expect("version 5");
        connection.close().await.expect("close");
    }
    let store = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .expect("open and migrate");
    let without_rowid: String =
        sqlx::query_scalar("SELECT sql FROM sqlite_schema WHERE name = 'jobs'")
            .fetch_one(store.readers())
            .await
            .expect("the jobs table");
    assert!(without_rowid.contains("WITHOUT ROWID"), "{without_rowid}");
    let claimed = store
        .job_queue()
        .claim(10, Duration::from_secs(30))
        .await
        .expect("claim");
    assert_eq!(claimed.len(), 1);
    assert_eq!(claimed[0].job, waiting);
    store.close().await;
}

/// `synchronous=FULL` opens and writes like the default.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn full_synchronous_mode_works() {
    let options = SqliteOptions {
        synchronous: Synchronous::Full,
        ..SqliteOptions::default()
    };
    let db = TestDb::with_options("full-sync", options).await;
    let tenant = unique_tenant("full");
    let e = event(&tenant, "e1", "t", Timestamp::now());
    let log = db.store.log_store();
    log.insert_many(std::slice::from_ref(&e), &[])
        .await
        .expect("insert");
    assert_eq!(log.get_event(&tenant, &e.id).await.expect("get"), Some(e));
    db.store.close().await;
}

/// A file from a newer build, options that cannot work and a missing directory are refused,
/// each naming what is wrong.
#[tokio::test]
async fn opening_refuses_what_cannot_work() {
    let db = TestDb::new("refusals").await;
    let path = db.store.path().to_owned();
    db.store.close().await;
    {
        use sqlx::Connection;
        let options = sqlx::sqlite::SqliteConnectOptions::new().filename(&path);
        let mut connection = sqlx::SqliteConnection::connect_with(&options)
            .await
            .expect("connect");
        sqlx::query("PRAGMA user_version = 999")
            .execute(&mut connection)
            .await
            .expect("set the version");
        connection.close().await.expect("close");
    }
    let err = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SqliteError::TooNew { found: 999, .. }),
        "{err}"
    );
    assert!(err.to_string().contains("999"), "{err}");

    let options = SqliteOptions {
        readers: 0,
        ..SqliteOptions::default()
    };
    let err = SqliteStore::open(&path, options).await.unwrap_err();
    assert!(err.to_string().contains("readers"), "{err}");
    assert_eq!(
        sheaf_store::Error::from(err).kind(),
        ErrorKind::InvalidInput
    );

    let missing = db.dir.join("no-such-dir").join("sheaf.db");
    let err = SqliteStore::open(&missing, SqliteOptions::default())
        .await
        .unwrap_err();
    assert!(
        matches!(err, SqliteError::Open { .. } | SqliteError::LockFile { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("no-such-dir"), "{err}");
}

/// A second store on an open file is refused by name; once the first closes, it opens.
#[tokio::test]
async fn a_second_store_on_the_same_file_is_refused() {
    let db = TestDb::new("lock").await;
    let path = db.store.path().to_owned();
    let err = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .unwrap_err();
    assert!(matches!(err, SqliteError::Locked { .. }), "{err}");
    assert!(err.to_string().contains("sheaf.db"), "{err}");
    assert_eq!(sheaf_store::Error::from(err).kind(), ErrorKind::Conflict);
    db.store.close().await;
    let again = SqliteStore::open(&path, SqliteOptions::default())
        .await
        .expect("opens once the first store closed");
    again.close().await;
}

/// A full file (here, the size cap; a full disk answers the same way) fails writes as
/// `Unavailable` and loses nothing committed; reads go on, and once retention frees space,
/// writes succeed again by themselves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_file_refuses_writes_and_recovers() {
    let options = SqliteOptions {
        max_size_bytes: Some(1024 * 1024),
        retention: sheaf_sqlite::LogRetention {
            max_age: None,
            max_events: 50,
            max_attempts: 50,
        },
        ..SqliteOptions::default()
    };
    let db = TestDb::with_options("full", options).await;
    let log = db.store.log_store();
    let tenant = unique_tenant("full");
    let (written, refusal) = fill_until_refused(log.as_ref(), &tenant, 4000, 20, 100).await;
    let refusal = refusal.expect("the cap was reached");
    assert_eq!(refusal.kind(), ErrorKind::Unavailable, "{refusal}");
    assert!(refusal.to_string().contains("full"), "{refusal}");
    eprintln!("refused after {} events: {refusal}", written.len());
    // Everything committed before the refusal is there, and reads go on.
    let last = written.last().expect("some were written");
    assert_eq!(
        log.get_event(&tenant, &last.id).await.expect("read"),
        Some(last.clone())
    );
    // Retention frees pages; the next write reuses them.
    while log.maintain().await.expect("maintain") {}
    let again = event(&tenant, "after", "t", Timestamp::now());
    log.insert_many(std::slice::from_ref(&again), &[])
        .await
        .expect("writes succeed once space is free");
    assert_eq!(
        log.get_event(&tenant, &again.id).await.expect("read"),
        Some(again)
    );
    db.store.close().await;
}

/// A backup taken while the store serves is a complete database of its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_opens_as_a_store_with_the_same_records() {
    let db = TestDb::new("backup").await;
    let log = db.store.log_store();
    let tenant = unique_tenant("backup");
    let e = event(&tenant, "e1", "t", Timestamp::now());
    log.insert_many(std::slice::from_ref(&e), &[])
        .await
        .expect("insert");
    let copy = db.dir.join("backup.db");
    db.store.backup(&copy).await.expect("backup");
    assert_eq!(
        db.store.backup(&copy).await.unwrap_err().kind(),
        ErrorKind::InvalidInput,
        "an existing file is not overwritten"
    );
    let restored = SqliteStore::open(&copy, SqliteOptions::default())
        .await
        .expect("open the copy");
    assert_eq!(
        restored
            .log_store()
            .get_event(&tenant, &e.id)
            .await
            .expect("get"),
        Some(e)
    );
    restored.close().await;
    db.store.close().await;
}

/// Reads run on their own connections and never wait for the writer: while another connection
/// holds the file's write lock and the store's next write waits for it, lookups still answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_do_not_wait_for_a_waiting_writer() {
    use sqlx::Connection;

    let db = TestDb::new("readers").await;
    let log = db.store.log_store();
    let tenant = unique_tenant("readers");
    let first = event(&tenant, "first", "t", Timestamp::now());
    log.insert_many(std::slice::from_ref(&first), &[])
        .await
        .expect("insert");

    let options = sqlx::sqlite::SqliteConnectOptions::new().filename(db.store.path());
    let mut other = sqlx::SqliteConnection::connect_with(&options)
        .await
        .expect("connect");
    sqlx::query("BEGIN IMMEDIATE")
        .execute(&mut other)
        .await
        .expect("take the write lock");
    let second = event(&tenant, "second", "t", Timestamp::now());
    let pending = {
        let (log, second) = (log.clone(), second.clone());
        tokio::spawn(async move { log.insert_many(&[second], &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(!pending.is_finished(), "the write waits for the lock");

    let asked = std::time::Instant::now();
    assert_eq!(
        log.get_event(&tenant, &first.id).await.expect("read"),
        Some(first)
    );
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "the read took {:?}",
        asked.elapsed()
    );
    assert!(!pending.is_finished(), "and still waits");

    sqlx::query("ROLLBACK")
        .execute(&mut other)
        .await
        .expect("let go");
    pending
        .await
        .expect("task")
        .expect("the write goes through once the lock is free");
    assert_eq!(
        log.get_event(&tenant, &second.id).await.expect("read"),
        Some(second)
    );
    other.close().await.expect("close");
    db.store.close().await;
}
