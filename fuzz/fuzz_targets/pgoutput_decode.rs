//! Fuzz target `pgoutput_decode`: arbitrary bytes into Sheaf's pgoutput decoder.
//!
//! Run with `cargo +nightly fuzz run pgoutput_decode` from `fuzz/`. The input is split
//! into messages at each `0xFF 0x00` pair and fed, in order, to a stateful
//! `ChangeDecoder` behind a fixed `Relation` message, so the fuzzer reaches rows, tuples,
//! old keys and the JSON conversion, not only the framing. Every message on its own also
//! goes through the borrowed `pgoutput::decode`. Any panic is a bug: malformed bytes
//! must come back as an `Error`.

#![no_main]

use bytes::Bytes;
use libfuzzer_sys::fuzz_target;
use sheaf_testenv::pgoutput::{self as pgoutput_fixture, Column, type_oid};
use sheaf_cdc::pgoutput::{self, PgOutputMessage};
use sheaf_cdc::{ChangeDecoder, Lsn};

fuzz_target!(|data: &[u8]| {
    let mut decoder = ChangeDecoder::new();
    let mut out = Vec::new();
    let relation = pgoutput_fixture::relation(
        16_384,
        "public",
        "fuzz",
        b'd',
        &[
            Column::key("id", type_oid::INT8),
            Column::value("doc", type_oid::JSONB),
            Column::value("amount", type_oid::NUMERIC),
        ],
    );
    let _ = decoder.decode(Lsn::ZERO, &Bytes::from(relation), &mut out);
    let buffer = Bytes::copy_from_slice(data);
    let mut start = 0;
    let mut lsn = 1u64;
    let mut i = 0;
    while i <= data.len() {
        let end_here = i == data.len() || (data[i] == 0xFF && data.get(i + 1) == Some(&0x00));
        if end_here {
            let message = buffer.slice(start..i);
            if let Ok(decoded) = pgoutput::decode(&message) {
                // Walking a decoded message must not panic either.
                match decoded {
                    PgOutputMessage::Insert(m) => m.new.iter().for_each(|v| drop(v.as_str())),
                    PgOutputMessage::Update(m) => m.new.iter().for_each(|v| drop(v.as_str())),
                    PgOutputMessage::Relation(m) => m.columns.iter().for_each(drop),
                    PgOutputMessage::Truncate(m) => m.relation_ids().for_each(drop),
                    _ => {}
                }
            }
            let _ = decoder.decode(Lsn(lsn), &message, &mut out);
            lsn += 1;
            start = i + 2;
            i += 2;
        } else {
            i += 1;
        }
    }
    for change in &out {
        let _ = change.to_json();
        let _ = change.id().to_string();
    }
});
