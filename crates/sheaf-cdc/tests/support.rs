//! Helpers shared by the test modules: captured fixture bytes and synthetic streams.

use bytes::Bytes;
use sheaf_cdc::encode;
use sheaf_cdc::pgoutput::TupleValue;
use sheaf_cdc::{Lsn, WalEvent};

/// Bytes captured from Postgres 15.18 with `pg_logical_slot_peek_binary_changes`
/// (`proto_version 1`, `messages true`): `lsn<TAB>hex` per message. The session that
/// produced them (run as `postgres` so it could set a replication origin):
///
/// ```sql
/// create type cap_mood as enum ('happy', 'sad');
/// create table cap_t(id int8 primary key, small int2, n int4, flag bool, price numeric(12,2),
///   ratio float8, doc jsonb, note text, mood cap_mood, big text);
/// alter table cap_t alter column big set storage external;
/// create table cap_full(id int4, v text);
/// alter table cap_full replica identity full;
/// create publication cap_pub for table cap_t, cap_full;
/// insert into cap_t select 1, 7, -42, true, 1234.50, 0.25, '{"a": [1, "x"]}', 'grüße, 世界 🚀',
///   'happy', string_agg(md5(g::text), '') from generate_series(1,150) g;
/// insert into cap_t (id) values (2);
/// update cap_t set note = 'updated' where id = 1;        -- big: unchanged TOAST
/// update cap_t set id = 3 where id = 2;                  -- old key
/// insert into cap_full values (1, 'one');
/// update cap_full set v = 'uno' where id = 1;            -- old row (FULL)
/// delete from cap_full where id = 1;
/// delete from cap_t where id = 3;
/// truncate cap_t, cap_full;
/// select pg_logical_emit_message(true, 'cap.tx', 'hello');
/// select pg_logical_emit_message(false, 'cap.nontx', '\x00ff'::bytea);
/// select pg_replication_origin_create('cap_origin');
/// select pg_replication_origin_session_setup('cap_origin');
/// insert into cap_full values (9, 'from origin');
/// ```
pub const CAPTURE: &str = include_str!("fixtures/pgoutput_capture.tsv");

/// The captured messages as (LSN, bytes).
pub fn captured() -> Vec<(Lsn, Bytes)> {
    CAPTURE
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|line| {
            let (lsn, hex) = line.split_once('\t').expect("lsn<TAB>hex");
            (lsn.parse().expect("lsn"), Bytes::from(unhex(hex)))
        })
        .collect()
}

fn unhex(hex: &str) -> Vec<u8> {
    (0..hex.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).expect("hex"))
        .collect()
}

/// Relation 16_384, `public.items(id int8 key, payload text)`, and its `Relation` message: the
/// table of the synthetic streams, shared with the other suites that build them.
pub use sheaf_testenv::pgoutput::{ITEMS, items_relation};

/// A synthetic transaction as pgoutput would send it: Begin, `rows` inserts into
/// [`ITEMS`] with ids from `first_id` and `payload_len`-byte payloads, Commit. Row `i`
/// sits at `start + 1 + i * 100`; the commit record at `start + 1 + rows * 100`, ending
/// 48 bytes later. Returns the events and the commit's end LSN.
pub fn transaction(
    start: u64,
    xid: u32,
    first_id: i64,
    rows: usize,
    payload_len: usize,
) -> (Vec<WalEvent>, Lsn) {
    let commit_lsn = Lsn(start + 1 + rows as u64 * 100);
    let end = Lsn(commit_lsn.0 + 48);
    let payload = "p".repeat(payload_len);
    let mut events = vec![WalEvent::Data {
        lsn: Lsn(start),
        data: encode::begin(commit_lsn, 0, xid).into(),
    }];
    for i in 0..rows {
        let id = (first_id + i as i64).to_string();
        let data = encode::insert(
            ITEMS,
            &[
                TupleValue::Text(id.as_bytes()),
                TupleValue::Text(payload.as_bytes()),
            ],
        );
        events.push(WalEvent::Data {
            lsn: Lsn(start + 1 + i as u64 * 100),
            data: data.into(),
        });
    }
    events.push(WalEvent::Data {
        lsn: end,
        data: encode::commit(commit_lsn, end, 0).into(),
    });
    (events, end)
}
