//! `drop_replication_slot` drops an idle slot, answers for a missing one, and takes a slot from
//! a walsender that still streams from it (`pg_recvlogical`, which ships with Postgres).

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use sheaf_testenv::postgres::drop_replication_slot;
use sheaf_testenv::require_postgres;

async fn slot_state(pool: &sqlx::PgPool, slot: &str) -> Option<bool> {
    sqlx::query_scalar("SELECT active FROM pg_replication_slots WHERE slot_name = $1")
        .bind(slot)
        .fetch_optional(pool)
        .await
        .expect("read the slot")
}

#[tokio::test]
async fn idle_missing_and_streamed_slots_are_dropped() {
    let url = require_postgres!("idle_missing_and_streamed_slots_are_dropped");
    let pool = sqlx::PgPool::connect(&url)
        .await
        .expect("connect to the test Postgres");
    let slot = sheaf_testenv::unique_name("testenv_slot");

    let missing = drop_replication_slot(&pool, &slot, Duration::from_secs(1)).await;
    assert!(matches!(missing, Ok(true)), "{missing:?}");

    for streamed in [false, true] {
        sqlx::query("SELECT pg_create_logical_replication_slot($1, 'test_decoding')")
            .bind(&slot)
            .execute(&pool)
            .await
            .expect("create the slot");
        let mut consumer = streamed.then(|| {
            Command::new("pg_recvlogical")
                .args(["--dbname", &url, "--slot", &slot, "--start", "--no-loop"])
                .args(["--file", "/dev/null"])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("pg_recvlogical starts")
        });
        if streamed {
            let deadline = Instant::now() + Duration::from_secs(20);
            while slot_state(&pool, &slot).await != Some(true) {
                assert!(Instant::now() < deadline, "pg_recvlogical never streamed");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
        let dropped = drop_replication_slot(&pool, &slot, Duration::from_secs(20)).await;
        assert!(
            matches!(dropped, Ok(true)),
            "streamed {streamed}: {dropped:?}"
        );
        assert_eq!(slot_state(&pool, &slot).await, None, "the slot is gone");
        if let Some(consumer) = consumer.as_mut() {
            // Its walsender was terminated; should it linger, it is ended by its own PID.
            let _ = consumer.kill();
            let _ = consumer.wait();
        }
    }
}
