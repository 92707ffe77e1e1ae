//! Decode + batch throughput on a synthetic pgoutput stream of 1,200-byte rows, 100 rows
//! per transaction (the shape of the per-transaction batching experiment:
//! docs/benchmarks.md, "cdc", earlier measurements), in one run:
//!
//! - `reader/*`: Sheaf's reader path (decoder, transaction batcher, acknowledgement
//!   tracking, a channel of depth 4 to a consumer task that acknowledges every message)
//!   against a one-row-per-send hand-off (the same decoder, a capacity-1 channel, one
//!   row per send: the reader before per-transaction batching), on a two-worker runtime
//!   so reader and consumer can overlap;
//! - `decode/*`: Sheaf's pgoutput decoder against `pg_walstream`'s parser on the same
//!   bytes, message by message (`parse`), and with relation lookup into owned change
//!   rows (`changes`).
//!
//! Throughput is in bytes of pgoutput messages; rows/s is that divided by the bytes per
//! row printed at the start. Run: `cargo bench -p sheaf-cdc --bench decode`.

use std::hint::black_box;
use std::time::Duration;

use bytes::Bytes;
use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use sheaf_cdc::encode;
use sheaf_cdc::pgoutput::{self, PgOutputMessage, TupleValue};
use sheaf_cdc::{ChangeDecoder, Lsn, StreamOptions, WalEvent, stream_pair};
use sheaf_testenv::pgoutput::{self as pgoutput_fixture, Column, type_oid};
use tokio::sync::mpsc;

const ROW_BYTES: usize = 1200;
const ROWS_PER_TRANSACTION: usize = 100;
const TRANSACTIONS: usize = 50;
const RELATION: u32 = 16_500;

struct Stream {
    events: Vec<WalEvent>,
    bytes: u64,
    rows: u64,
}

/// `public.orders(id int8, customer text, amount numeric, payload text)`, rows whose
/// Insert message is exactly `ROW_BYTES` long.
fn stream() -> Stream {
    let mut events = vec![WalEvent::Data {
        lsn: Lsn::ZERO,
        data: pgoutput_fixture::relation(
            RELATION,
            "public",
            "orders",
            b'd',
            &[
                Column::key("id", type_oid::INT8),
                Column::value("customer", type_oid::TEXT),
                Column::value("amount", type_oid::NUMERIC),
                Column::value("payload", type_oid::TEXT),
            ],
        )
        .into(),
    }];
    let mut lsn = 0x1_0000_0000u64;
    let mut bytes = 0u64;
    let mut id = 0u64;
    for txn in 0..TRANSACTIONS {
        let commit_lsn = Lsn(lsn + (ROWS_PER_TRANSACTION as u64 + 1) * ROW_BYTES as u64);
        let end = Lsn(commit_lsn.0 + 48);
        let begin = Bytes::from(encode::begin(commit_lsn, 0, 1000 + txn as u32));
        bytes += begin.len() as u64;
        events.push(WalEvent::Data {
            lsn: Lsn(lsn),
            data: begin,
        });
        for _ in 0..ROWS_PER_TRANSACTION {
            id += 1;
            let id_text = format!("{id:08}");
            let fixed = encode::insert(
                RELATION,
                &[
                    TupleValue::Text(id_text.as_bytes()),
                    TupleValue::Text(b"customer-0042"),
                    TupleValue::Text(b"123.45"),
                    TupleValue::Text(b""),
                ],
            )
            .len();
            let payload = "x".repeat(ROW_BYTES - fixed);
            let data = Bytes::from(encode::insert(
                RELATION,
                &[
                    TupleValue::Text(id_text.as_bytes()),
                    TupleValue::Text(b"customer-0042"),
                    TupleValue::Text(b"123.45"),
                    TupleValue::Text(payload.as_bytes()),
                ],
            ));
            debug_assert_eq!(data.len(), ROW_BYTES);
            lsn += ROW_BYTES as u64;
            bytes += data.len() as u64;
            events.push(WalEvent::Data {
                lsn: Lsn(lsn),
                data,
            });
        }
        let commit = Bytes::from(encode::commit(commit_lsn, end, 0));
        bytes += commit.len() as u64;
        events.push(WalEvent::Data {
            lsn: end,
            data: commit,
        });
        lsn = end.0 + 8;
    }
    Stream {
        events,
        bytes,
        rows: id,
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

/// Sheaf's reader path: everything the Postgres source does after the transport.
async fn sheaf_reader(events: &[WalEvent], options: &StreamOptions) -> u64 {
    let (mut reader, mut stream) = stream_pair(options).expect("options");
    let consumer = tokio::spawn(async move {
        let mut rows = 0u64;
        while let Ok(Some(message)) = stream.recv().await {
            rows += message.changes().len() as u64;
            message.ack();
        }
        rows
    });
    for event in events {
        reader.handle(event.clone()).await.expect("handled");
    }
    drop(reader);
    consumer.await.expect("consumer")
}

/// The reader before per-transaction batching: the same decoder, one row per send on a
/// capacity-1 channel.
async fn row_at_a_time(events: &[WalEvent]) -> u64 {
    let (tx, mut rx) = mpsc::channel(1);
    let consumer = tokio::spawn(async move {
        let mut rows = 0u64;
        while let Some(change) = rx.recv().await {
            black_box(&change);
            rows += 1;
        }
        rows
    });
    let mut decoder = ChangeDecoder::new();
    let mut out = Vec::new();
    for event in events {
        if let WalEvent::Data { lsn, data } = event {
            decoder.decode(*lsn, data, &mut out).expect("decoded");
            for change in out.drain(..) {
                tx.send(change).await.expect("consumer alive");
            }
        }
    }
    drop(tx);
    consumer.await.expect("consumer")
}

fn payloads(events: &[WalEvent]) -> Vec<Bytes> {
    events
        .iter()
        .filter_map(|e| match e {
            WalEvent::Data { data, .. } => Some(data.clone()),
            _ => None,
        })
        .collect()
}

fn benches(c: &mut Criterion) {
    let stream = stream();
    let per_row = stream.bytes as f64 / stream.rows as f64;
    println!(
        "stream: {} rows in {} transactions, {} bytes of pgoutput ({per_row:.1} bytes per row incl. begin/commit)",
        stream.rows, TRANSACTIONS, stream.bytes
    );
    let rt = runtime();
    let rows = stream.rows;

    let mut group = c.benchmark_group("reader");
    group.throughput(Throughput::Bytes(stream.bytes));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(3));
    let per_row_messages = StreamOptions::default();
    group.bench_function("sheaf_per_row_messages", |b| {
        b.to_async(&rt).iter(|| async {
            assert_eq!(sheaf_reader(&stream.events, &per_row_messages).await, rows)
        })
    });
    let transactions = StreamOptions {
        batch_transactions: true,
        ..StreamOptions::default()
    };
    group.bench_function("sheaf_batch_transactions", |b| {
        b.to_async(&rt)
            .iter(|| async { assert_eq!(sheaf_reader(&stream.events, &transactions).await, rows) })
    });
    group.bench_function("row_at_a_time_unbuffered", |b| {
        b.to_async(&rt)
            .iter(|| async { assert_eq!(row_at_a_time(&stream.events).await, rows) })
    });
    group.finish();

    let messages = payloads(&stream.events);
    let mut group = c.benchmark_group("decode");
    group.throughput(Throughput::Bytes(stream.bytes));
    group
        .sample_size(10)
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2));
    group.bench_function("parse/sheaf", |b| {
        b.iter(|| {
            for data in &messages {
                match pgoutput::decode(data).expect("decoded") {
                    PgOutputMessage::Insert(insert) => {
                        for value in insert.new {
                            black_box(value);
                        }
                    }
                    other => {
                        black_box(other);
                    }
                }
            }
        })
    });
    group.bench_function("parse/pg_walstream", |b| {
        b.iter(|| {
            let mut parser = pg_walstream::LogicalReplicationParser::with_protocol_version(1);
            for data in &messages {
                black_box(
                    parser
                        .parse_wal_message_bytes(data.clone())
                        .expect("parsed"),
                );
            }
        })
    });
    group.bench_function("changes/sheaf", |b| {
        b.iter(|| {
            let mut decoder = ChangeDecoder::new();
            let mut out = Vec::with_capacity(1);
            for event in &stream.events {
                if let WalEvent::Data { lsn, data } = event {
                    decoder.decode(*lsn, data, &mut out).expect("decoded");
                    for change in out.drain(..) {
                        black_box(change);
                    }
                }
            }
        })
    });
    group.bench_function("changes/pg_walstream", |b| {
        b.iter(|| {
            let mut decoder = pg_walstream::PgOutputDecoder::with_protocol_version(1);
            for event in &stream.events {
                if let WalEvent::Data { lsn, data } = event {
                    black_box(
                        decoder
                            .decode_message(data.clone(), pg_walstream::Lsn::new(lsn.0))
                            .expect("decoded"),
                    );
                }
            }
        })
    });
    group.finish();
}

criterion_group!(decode, benches);
criterion_main!(decode);
