//! The reader core on synthetic streams: batching, stamps, in-order acknowledgement,
//! the in-flight limit, row-less checkpoints, the output shapes and what a stalled
//! consumer leaves buffered. No server needed.

use std::sync::Arc;
use std::time::Duration;

use sheaf_cdc::encode;
use sheaf_cdc::pgoutput::TupleValue;
use sheaf_cdc::reader::{CHANNEL_DEPTH, MAX_BATCH_WAL_BYTES};
use sheaf_cdc::{
    BatchingPolicy, CdcMessage, CdcStream, Change, Lsn, RowFilter, StreamOptions, StreamReader,
    WalEvent, stream_pair,
};
use tokio::task::JoinHandle;

use crate::support::{ITEMS, items_relation, transaction};

/// Spawns a task that feeds `events` (after the relation) and hands the reader back.
fn feed(
    mut reader: StreamReader,
    events: Vec<WalEvent>,
) -> JoinHandle<(StreamReader, sheaf_cdc::Result<()>)> {
    tokio::spawn(async move {
        let mut result = reader
            .handle(WalEvent::Data {
                lsn: Lsn::ZERO,
                data: items_relation().into(),
            })
            .await;
        for event in events {
            if result.is_err() {
                break;
            }
            result = reader.handle(event).await;
        }
        (reader, result)
    })
}

async fn next(stream: &mut CdcStream) -> CdcMessage {
    tokio::time::timeout(Duration::from_secs(5), stream.recv())
        .await
        .expect("a message within 5 s")
        .expect("no error")
        .expect("stream open")
}

async fn nothing_within(stream: &mut CdcStream, wait: Duration) -> bool {
    tokio::time::timeout(wait, stream.recv()).await.is_err()
}

fn ids(message: &CdcMessage) -> Vec<String> {
    message
        .changes()
        .iter()
        .map(|c| {
            c.new.as_ref().unwrap().cells()[0]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect()
}

fn options(limit: usize) -> StreamOptions {
    StreamOptions {
        checkpoint_limit: limit,
        ..StreamOptions::default()
    }
}

#[tokio::test]
async fn default_is_one_row_per_message_stamped_with_own_lsn_then_commit_end() {
    let (reader, mut stream) = stream_pair(&StreamOptions::default()).unwrap();
    let (events, end) = transaction(1000, 1, 1, 3, 10);
    let feeder = feed(reader, events);
    let mut stamps = Vec::new();
    for expected in ["1", "2", "3"] {
        let message = next(&mut stream).await;
        assert_eq!(ids(&message), [expected]);
        stamps.push(message.ack_lsn());
        message.ack();
    }
    assert_eq!(stamps, [Lsn(1001), Lsn(1101), end]);
    let (reader, result) = feeder.await.unwrap();
    result.unwrap();
    assert_eq!(reader.confirmed(), end);
    assert_eq!(stream.confirmed_lsn(), end);
    assert_eq!(stream.rows_in_flight(), 0);
}

#[tokio::test]
async fn batch_transactions_gives_one_message_per_transaction() {
    let options = StreamOptions {
        batch_transactions: true,
        ..StreamOptions::default()
    };
    let (reader, mut stream) = stream_pair(&options).unwrap();
    let (mut events, end1) = transaction(1000, 1, 1, 3, 10);
    let (more, end2) = transaction(5000, 2, 4, 2, 10);
    events.extend(more);
    let feeder = feed(reader, events);
    let first = next(&mut stream).await;
    assert_eq!(ids(&first), ["1", "2", "3"]);
    assert_eq!(first.ack_lsn(), end1);
    let second = next(&mut stream).await;
    assert_eq!(ids(&second), ["4", "5"]);
    assert_eq!(second.ack_lsn(), end2);
    // Positions restart in each transaction; commit LSNs differ.
    let positions: Vec<u32> = first
        .changes()
        .iter()
        .chain(second.changes())
        .map(|c| c.position)
        .collect();
    assert_eq!(positions, [0, 1, 2, 0, 1]);
    second.ack();
    assert_eq!(
        stream.confirmed_lsn(),
        Lsn::ZERO,
        "the first transaction is not acknowledged yet"
    );
    first.ack();
    assert_eq!(stream.confirmed_lsn(), end2);
    feeder.await.unwrap().1.unwrap();
}

#[tokio::test]
async fn a_transaction_of_exactly_the_cap_closes_with_its_commit() {
    // checkpoint_limit 8: row cap 4.
    let options = StreamOptions {
        batch_transactions: true,
        ..options(8)
    };
    assert_eq!(options.row_cap(), 4);
    let (reader, mut stream) = stream_pair(&options).unwrap();
    let (mut events, end1) = transaction(1000, 1, 1, 4, 10);
    let (more, end2) = transaction(5000, 2, 5, 5, 10);
    events.extend(more);
    let feeder = feed(reader, events);

    let exact = next(&mut stream).await;
    assert_eq!(exact.changes().len(), 4);
    assert_eq!(
        exact.ack_lsn(),
        end1,
        "stamped with the commit, not its last row"
    );
    exact.ack();

    let split = next(&mut stream).await;
    assert_eq!(ids(&split), ["5", "6", "7", "8"]);
    assert_eq!(
        split.ack_lsn(),
        Lsn(5000 + 1 + 3 * 100),
        "open transaction: its own LSN"
    );
    let rest = next(&mut stream).await;
    assert_eq!(ids(&rest), ["9"]);
    assert_eq!(rest.ack_lsn(), end2);
    split.ack();
    assert_eq!(stream.confirmed_lsn(), Lsn(5301));
    rest.ack();
    assert_eq!(stream.confirmed_lsn(), end2);
    feeder.await.unwrap().1.unwrap();
}

#[tokio::test]
async fn the_byte_cap_splits_before_the_row_that_would_pass_4_mib() {
    let options = StreamOptions {
        batch_transactions: true,
        ..StreamOptions::default()
    };
    let (reader, mut stream) = stream_pair(&options).unwrap();
    // Each row is 1 MiB of payload plus its framing: the fifth would start past 4 MiB.
    let (events, end) = transaction(1000, 1, 1, 6, 1024 * 1024);
    let feeder = feed(reader, events);
    let first = next(&mut stream).await;
    assert_eq!(first.changes().len(), 4);
    assert!(first.changes().iter().map(|c| c.wal_bytes).sum::<usize>() >= 4 * 1024 * 1024);
    let second = next(&mut stream).await;
    assert_eq!(second.changes().len(), 2);
    assert_eq!(second.ack_lsn(), end);
    first.ack();
    second.ack();
    feeder.await.unwrap().1.unwrap();
}

#[tokio::test]
async fn acknowledgements_advance_only_in_order() {
    let (reader, mut stream) = stream_pair(&StreamOptions::default()).unwrap();
    let (events, end) = transaction(1000, 1, 1, 3, 10);
    let feeder = feed(reader, events);
    let a = next(&mut stream).await;
    let b = next(&mut stream).await;
    let c = next(&mut stream).await;
    c.ack();
    b.ack();
    assert_eq!(stream.confirmed_lsn(), Lsn::ZERO);
    a.ack();
    assert_eq!(stream.confirmed_lsn(), end);
    feeder.await.unwrap().1.unwrap();
}

#[tokio::test(start_paused = true)]
async fn checkpoint_limit_holds_the_reader_back_until_acknowledged() {
    // Limit 4: batches of 2, two of them in flight.
    let (reader, mut stream) = stream_pair(&options(4)).unwrap();
    let (events, end) = transaction(1000, 1, 1, 10, 10);
    let feeder = feed(reader, events);
    let mut held = Vec::new();
    for _ in 0..4 {
        held.push(next(&mut stream).await);
    }
    assert_eq!(stream.rows_in_flight(), 4);
    assert!(
        nothing_within(&mut stream, Duration::from_secs(1)).await,
        "a fifth row while 4 are in flight"
    );
    // Acknowledging the newest two frees nothing: the oldest are still out.
    held.pop().unwrap().ack();
    held.pop().unwrap().ack();
    assert!(nothing_within(&mut stream, Duration::from_secs(1)).await);
    for message in held.drain(..) {
        message.ack();
    }
    let mut rest = Vec::new();
    while rest.len() < 6 {
        let message = next(&mut stream).await;
        rest.extend(ids(&message));
        message.ack();
    }
    assert_eq!(rest, ["5", "6", "7", "8", "9", "10"]);
    assert_eq!(stream.confirmed_lsn(), end);
    feeder.await.unwrap().1.unwrap();
}

#[tokio::test]
async fn a_filter_that_drops_everything_still_confirms_positions() {
    let filter: RowFilter = Arc::new(|_: &Change| false);
    let options = StreamOptions {
        filter: Some(filter),
        ..options(8)
    };
    let (reader, mut stream) = stream_pair(&options).unwrap();
    let (mut events, _) = transaction(1000, 1, 1, 3, 10);
    let (more, end) = transaction(5000, 2, 4, 9, 10); // split by the cap of 4, all dropped
    events.extend(more);
    let (reader, result) = feed(reader, events).await.unwrap();
    result.unwrap();
    assert!(nothing_within(&mut stream, Duration::from_millis(50)).await);
    assert_eq!(
        reader.confirmed(),
        end,
        "row-less checkpoints reached the last commit"
    );
}

#[tokio::test]
async fn a_filtered_last_row_moves_the_commit_stamp_to_the_last_kept_row() {
    let filter: RowFilter = Arc::new(|c: &Change| c.position != 2);
    let options = StreamOptions {
        filter: Some(filter),
        ..StreamOptions::default()
    };
    let (reader, mut stream) = stream_pair(&options).unwrap();
    let (events, end) = transaction(1000, 1, 1, 3, 10);
    let feeder = feed(reader, events);
    let a = next(&mut stream).await;
    let b = next(&mut stream).await;
    assert_eq!(
        (ids(&a), ids(&b)),
        (vec!["1".to_owned()], vec!["2".to_owned()])
    );
    assert_eq!(b.ack_lsn(), end);
    a.ack();
    b.ack();
    assert_eq!(stream.confirmed_lsn(), end);
    feeder.await.unwrap().1.unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_batching_policy_groups_rows_by_count_and_time() {
    let policy = BatchingPolicy {
        count: 5,
        max_wait: Duration::from_millis(10),
    };
    let options = StreamOptions {
        batching: Some(policy),
        ..StreamOptions::default()
    };
    let (reader, mut stream) = stream_pair(&options).unwrap();
    let (mut events, _) = transaction(1000, 1, 1, 3, 10);
    let (more, end2) = transaction(5000, 2, 4, 3, 10);
    events.extend(more);
    let feeder = feed(reader, events);
    let first = next(&mut stream).await;
    assert_eq!(ids(&first), ["1", "2", "3", "4", "5"]);
    assert_eq!(first.ack_lsn(), Lsn(5101));
    let second = next(&mut stream).await;
    assert_eq!(ids(&second), ["6"]);
    assert_eq!(second.ack_lsn(), end2);
    first.ack();
    second.ack();
    assert_eq!(stream.confirmed_lsn(), end2);
    feeder.await.unwrap().1.unwrap();
}

#[tokio::test]
async fn keepalives_are_checkpoints_only_between_transactions() {
    let (mut reader, mut stream) = stream_pair(&StreamOptions::default()).unwrap();
    reader
        .handle(WalEvent::Data {
            lsn: Lsn::ZERO,
            data: items_relation().into(),
        })
        .await
        .unwrap();
    let (events, end) = transaction(1000, 1, 1, 1, 10);
    let mut events = events.into_iter();
    reader.handle(events.next().unwrap()).await.unwrap(); // begin
    reader
        .handle(WalEvent::KeepAlive {
            wal_end: Lsn(900_000),
        })
        .await
        .unwrap();
    for event in events {
        reader.handle(event).await.unwrap();
    }
    let message = next(&mut stream).await;
    assert_eq!(
        stream.confirmed_lsn(),
        Lsn::ZERO,
        "the mid-transaction keepalive confirmed nothing"
    );
    reader
        .handle(WalEvent::KeepAlive { wal_end: Lsn(2000) })
        .await
        .unwrap();
    assert_eq!(
        stream.confirmed_lsn(),
        Lsn::ZERO,
        "behind an unacknowledged row"
    );
    message.ack();
    assert_eq!(stream.confirmed_lsn(), Lsn(2000));
    assert!(end < Lsn(2000));
}

#[tokio::test]
async fn a_dropped_consumer_stops_the_reader() {
    let (reader, stream) = stream_pair(&StreamOptions::default()).unwrap();
    drop(stream);
    let (events, _) = transaction(1000, 1, 1, 3, 10);
    let (_, result) = feed(reader, events).await.unwrap();
    assert!(
        matches!(result, Err(sheaf_cdc::Error::Closed)),
        "{result:?}"
    );
}

#[tokio::test]
async fn an_error_reaches_the_consumer_after_the_rows_before_it() {
    let policy = BatchingPolicy {
        count: 10,
        max_wait: Duration::from_millis(10),
    };
    let options = StreamOptions {
        batching: Some(policy),
        ..StreamOptions::default()
    };
    let (reader, mut stream) = stream_pair(&options).unwrap();
    let (events, _) = transaction(1000, 1, 1, 2, 10);
    let (reader, result) = feed(reader, events).await.unwrap();
    result.unwrap();
    reader.fail(sheaf_cdc::Error::Protocol("test".into())).await;
    drop(reader);
    let message = next(&mut stream).await;
    assert_eq!(ids(&message), ["1", "2"]);
    assert!(matches!(
        stream.recv().await,
        Err(sheaf_cdc::Error::Protocol(_))
    ));
    assert!(stream.recv().await.unwrap().is_none());
}

/// Feeds one transaction that never commits, its inserts' payloads cycling through
/// `payload_lens`, until the reader stops (the consumer is gone). No commit closes a batch
/// early, so every batch is closed by a cap.
fn feed_without_end(
    mut reader: StreamReader,
    payload_lens: &'static [usize],
) -> JoinHandle<sheaf_cdc::Result<()>> {
    tokio::spawn(async move {
        reader
            .handle(WalEvent::Data {
                lsn: Lsn::ZERO,
                data: items_relation().into(),
            })
            .await?;
        reader
            .handle(WalEvent::Data {
                lsn: Lsn(1000),
                data: encode::begin(Lsn(u64::MAX / 2), 0, 1).into(),
            })
            .await?;
        for (i, len) in payload_lens.iter().cycle().enumerate() {
            let id = i.to_string();
            let payload = "p".repeat(*len);
            let data = encode::insert(
                ITEMS,
                &[
                    TupleValue::Text(id.as_bytes()),
                    TupleValue::Text(payload.as_bytes()),
                ],
            );
            reader
                .handle(WalEvent::Data {
                    lsn: Lsn(1001 + i as u64 * 100),
                    data: data.into(),
                })
                .await?;
        }
        Ok(())
    })
}

/// What a stalled consumer left buffered.
#[derive(Debug)]
struct Stalled {
    rows: usize,
    wal_bytes: usize,
    largest_change: usize,
}

/// A consumer that takes one message, acknowledges it and stops receiving, while the reader
/// runs until it blocks. Then it checks what is in flight (the rows that `recv` returns
/// next, in order) and drops the stream, which stops the reader.
async fn stall(options: &StreamOptions, payload_lens: &'static [usize]) -> Stalled {
    let (reader, mut stream) = stream_pair(options).unwrap();
    let feeder = feed_without_end(reader, payload_lens);
    next(&mut stream).await.ack();
    // On paused time the clock only moves once every task is idle: the reader has gone as
    // far as the stalled consumer lets it.
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!feeder.is_finished(), "the reader is blocked, not stopped");
    let (rows, wal_bytes) = (stream.rows_in_flight(), stream.wal_bytes_in_flight());
    let (mut seen, mut seen_bytes, mut largest_change) = (0, 0, 0);
    while seen < rows {
        let message = next(&mut stream).await;
        let changes = &message.changes()[..message.changes().len().min(rows - seen)];
        seen += changes.len();
        seen_bytes += changes.iter().map(|c| c.wal_bytes).sum::<usize>();
        largest_change = changes
            .iter()
            .map(|c| c.wal_bytes)
            .fold(largest_change, usize::max);
        if options.batch_transactions {
            // One message is one reader batch: only its last change passes the byte cap.
            let (_, before) = message.changes().split_last().unwrap();
            let before = before.iter().map(|c| c.wal_bytes).sum::<usize>();
            assert!(
                before < MAX_BATCH_WAL_BYTES,
                "{before} B before the last change"
            );
            assert!(message.changes().len() <= options.row_cap());
        }
        message.ack();
    }
    assert_eq!(
        seen_bytes, wal_bytes,
        "wal_bytes_in_flight counts the rows in flight"
    );
    drop(stream);
    assert!(matches!(
        feeder.await.unwrap(),
        Err(sheaf_cdc::Error::Closed)
    ));
    Stalled {
        rows,
        wal_bytes,
        largest_change,
    }
}

/// Row payloads of 20–200 KiB: the 4 MiB byte cap closes batches, each past it by a
/// different part of a row.
const LARGE_ROWS: &[usize] = &[150_000, 30_000, 90_000, 210_000, 60_000, 20_000, 120_000];

#[tokio::test(start_paused = true)]
async fn a_stalled_consumer_leaves_at_most_the_buffer_bound_in_wal_bytes() {
    for options in [
        StreamOptions {
            batch_transactions: true,
            ..StreamOptions::default()
        },
        StreamOptions::default(),
        StreamOptions {
            batching: Some(BatchingPolicy {
                count: 7,
                max_wait: Duration::from_millis(10),
            }),
            ..StreamOptions::default()
        },
    ] {
        let bound = options.buffer_bound();
        let expected = if options.batch_transactions {
            CHANNEL_DEPTH + 1
        } else {
            CHANNEL_DEPTH + 2
        };
        assert_eq!(bound.batches, expected, "{options:?}");
        let stalled = stall(&options, LARGE_ROWS).await;
        let bytes = bound.wal_bytes(stalled.largest_change);
        assert!(
            stalled.wal_bytes <= bytes,
            "{options:?}: {stalled:?} above the bound of {bytes} B"
        );
        assert!(stalled.rows <= bound.rows, "{options:?}: {stalled:?}");
        // Batches close at the byte cap, so the reader filled every batch the bound counts:
        // one more would be over it.
        assert!(
            stalled.wal_bytes + MAX_BATCH_WAL_BYTES > bytes,
            "{options:?}: {stalled:?} is not the most the reader holds (bound {bytes} B)"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_stalled_consumer_leaves_at_most_the_buffer_bound_in_rows() {
    // Small rows: the row cap closes batches (1,000 rows with a limit of 100,000), or the
    // in-flight limit holds the reader back first (1,024 rows by default, batches of 512).
    let large_limit = StreamOptions {
        checkpoint_limit: 100_000,
        ..StreamOptions::default()
    };
    for (options, exact) in [
        (
            StreamOptions {
                batch_transactions: true,
                ..large_limit.clone()
            },
            // Every batch the bound counts, to the row.
            (CHANNEL_DEPTH + 1) * 1000,
        ),
        // The rest of the first batch, less the row returned, and the depth + 1 behind it.
        (large_limit.clone(), (CHANNEL_DEPTH + 2) * 1000 - 1),
        (
            StreamOptions {
                batching: Some(BatchingPolicy {
                    count: 300,
                    max_wait: Duration::from_millis(10),
                }),
                ..large_limit
            },
            (CHANNEL_DEPTH + 2) * 1000 - 300,
        ),
        // 511 left of the first batch, and one more batch of 512 fits under the limit.
        (StreamOptions::default(), 511 + 512),
    ] {
        let bound = options.buffer_bound();
        let stalled = stall(&options, &[10]).await;
        assert!(
            stalled.rows <= bound.rows,
            "{options:?}: {stalled:?} vs {bound:?}"
        );
        assert_eq!(stalled.rows, exact, "{options:?}: {bound:?}");
        assert!(stalled.wal_bytes <= bound.wal_bytes(stalled.largest_change));
    }
}
