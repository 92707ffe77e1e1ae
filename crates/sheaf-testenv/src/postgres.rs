//! Postgres helpers the suites share.

use std::time::{Duration, Instant};

use sqlx::PgPool;

/// Drops the logical replication slot `slot`, if it exists, within `patience`; returns whether
/// it is gone. A slot that outlives its test retains WAL for as long as it exists, so every
/// test, benchmark and fault scenario that creates one drops it this way, also when it failed.
///
/// A slot cannot be dropped while a walsender streams from it. A consumer that was just stopped
/// lets go of its slot within moments, but one that was killed, or whose connection is still
/// being torn down, can hold it until the server notices: so an active slot's walsender is
/// terminated (`pg_terminate_backend`, allowed for the role that started it), and the drop is
/// tried again every 100 ms until the slot is gone or `patience` has passed.
///
/// # Errors
/// When the server cannot be asked about the slot at all. A failed drop (the slot became
/// active again in between) is retried, not returned.
pub async fn drop_replication_slot(
    pool: &PgPool,
    slot: &str,
    patience: Duration,
) -> Result<bool, sqlx::Error> {
    let deadline = Instant::now() + patience;
    loop {
        let active_pid: Option<Option<i32>> =
            sqlx::query_scalar("SELECT active_pid FROM pg_replication_slots WHERE slot_name = $1")
                .bind(slot)
                .fetch_optional(pool)
                .await?;
        match active_pid {
            None => return Ok(true),
            Some(None) => {
                let dropped = sqlx::query("SELECT pg_drop_replication_slot($1)")
                    .bind(slot)
                    .execute(pool)
                    .await;
                if dropped.is_ok() {
                    continue;
                }
            }
            Some(Some(walsender)) => {
                let _ = sqlx::query("SELECT pg_terminate_backend($1)")
                    .bind(walsender)
                    .execute(pool)
                    .await;
            }
        }
        if Instant::now() >= deadline {
            return Ok(false);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// [`drop_replication_slot`] at the end of a test, whatever its outcome: a slot that could not be
/// dropped is reported (so someone drops it by hand) instead of failing a cleanup that runs
/// after the test's own verdict.
pub async fn drop_replication_slot_or_report(pool: &PgPool, slot: &str, patience: Duration) {
    match drop_replication_slot(pool, slot, patience).await {
        Ok(true) => {}
        Ok(false) => {
            eprintln!("replication slot {slot} is still in use after {patience:?}; drop it by hand")
        }
        Err(e) => eprintln!("could not drop replication slot {slot} ({e}); drop it by hand"),
    }
}
