//! Heartbeats: how many processes share the queue.

use super::*;

/// Long enough that no machine, however loaded, lets a heartbeat expire between two calls.
const FRESH: Duration = LONG;
/// Short enough to wait out; the case sleeps longer than this before it expects an expiry.
const STALE_AFTER: Duration = Duration::from_millis(300);
const WAIT_OUT: Duration = Duration::from_millis(450);

/// A heartbeat counts its own process, at least 1. A backend that counts two processes with
/// fresh heartbeats (a shared queue) counts each process once however often it beats, and stops
/// counting a process whose last heartbeat is older than the ttl, whether the caller's own row
/// was fresh, stale or gone. A backend that says 1 to the second process is one only one process
/// can use, and must say 1 always.
///
/// The counting steps ask with a long ttl and the expiry steps with a short one after sleeping
/// longer than it, so a slow machine can only make a stale heartbeat staler, never a fresh one
/// stale.
pub async fn heartbeats_count_the_processes_sharing_the_queue(queue: &dyn JobQueue) {
    let (a, b) = (uuid::Uuid::now_v7(), uuid::Uuid::now_v7());
    let beat = |process: uuid::Uuid, ttl: Duration| async move {
        queue
            .heartbeat(process, ttl)
            .await
            .expect("heartbeat failed")
    };
    let first = beat(a, FRESH).await;
    assert!(first >= 1, "a heartbeat counts its own process");
    let second = beat(b, FRESH).await;
    if second == 1 {
        // One process per queue: every answer is 1.
        assert_eq!(first, 1, "a single-process queue counted {first} processes");
        for (process, ttl) in [(a, FRESH), (b, STALE_AFTER), (a, Duration::ZERO)] {
            assert_eq!(
                beat(process, ttl).await,
                1,
                "a queue that counted one process for two must always count one"
            );
        }
        return;
    }
    assert_eq!(
        (first, second),
        (1, 2),
        "two processes with fresh heartbeats on a queue nobody else uses"
    );
    assert_eq!(
        beat(a, FRESH).await,
        2,
        "a process beating again counts once"
    );
    assert_eq!(
        beat(b, FRESH).await,
        2,
        "a process beating again counts once"
    );

    // Both rows stale: a's own stale row is refreshed, b's is not counted (and may be deleted).
    tokio::time::sleep(WAIT_OUT).await;
    assert_eq!(
        beat(a, STALE_AFTER).await,
        1,
        "a process whose heartbeat is older than the ttl is not counted"
    );
    // b comes back: a's heartbeat is fresh, b's row is new or refreshed.
    assert_eq!(beat(b, FRESH).await, 2, "a returning process counts again");
    tokio::time::sleep(WAIT_OUT).await;
    assert_eq!(
        beat(b, STALE_AFTER).await,
        1,
        "a lone process counts itself once its peer's heartbeat expired"
    );
    // A zero ttl counts only the caller.
    assert_eq!(beat(a, Duration::ZERO).await, 1, "a zero ttl");
}
