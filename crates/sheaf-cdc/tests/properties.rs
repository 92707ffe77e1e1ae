//! Property tests of the decoder: random and mutated bytes never panic it, and what
//! the encoder writes decodes back to the same values.

use std::hash::BuildHasher;

use bytes::Bytes;
use proptest::prelude::*;
use proptest::test_runner::{Config as ProptestConfig, RngSeed};
use sheaf_cdc::encode::{self, OldKind};
use sheaf_cdc::pgoutput::{self, OldTuple, PgOutputMessage, TupleValue};
use sheaf_cdc::{ChangeDecoder, Lsn};

use crate::support::captured;

/// A case budget that keeps the suite quick; the seed is printed (shown when a test
/// fails) and `PROPTEST_RNG_SEED=<seed>` replays it. Failures are not persisted to files.
fn config(cases: u32, name: &str) -> ProptestConfig {
    let seed = std::env::var("PROPTEST_RNG_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| std::collections::hash_map::RandomState::new().hash_one(name));
    println!("{name} property seed: {seed} (replay with PROPTEST_RNG_SEED={seed})");
    ProptestConfig {
        cases,
        failure_persistence: None,
        rng_seed: RngSeed::Fixed(seed),
        ..ProptestConfig::default()
    }
}

/// Bytes that start with a real tag more often than chance would, so the fields behind
/// each tag get exercised, not only `UnknownTag`.
fn message_like_bytes() -> impl Strategy<Value = Vec<u8>> {
    let tag = prop::sample::select(b"BCORYIUDTMZ".to_vec());
    (tag, prop::collection::vec(any::<u8>(), 0..200)).prop_map(|(tag, mut rest)| {
        rest.insert(0, tag);
        rest
    })
}

/// A captured message with a few bytes overwritten, removed or inserted.
fn mutated_capture() -> impl Strategy<Value = (usize, Vec<(usize, u8, u8)>)> {
    let count = captured().len();
    (
        0..count,
        prop::collection::vec((any::<usize>(), 0u8..3, any::<u8>()), 1..6),
    )
}

fn apply(mut bytes: Vec<u8>, edits: &[(usize, u8, u8)]) -> Vec<u8> {
    for &(at, kind, value) in edits {
        let at = at % (bytes.len() + 1);
        match kind {
            0 if at < bytes.len() => bytes[at] = value,
            1 if at < bytes.len() => {
                bytes.remove(at);
            }
            _ => bytes.insert(at, value),
        }
    }
    bytes
}

fn text_value() -> impl Strategy<Value = Option<Option<String>>> {
    // None: unchanged TOAST; Some(None): NULL; Some(Some(s)): text.
    prop_oneof![
        Just(None),
        Just(Some(None)),
        any::<String>().prop_map(|s| Some(Some(s)))
    ]
}

fn to_values(values: &[Option<Option<String>>]) -> Vec<TupleValue<'_>> {
    values
        .iter()
        .map(|v| match v {
            None => TupleValue::UnchangedToast,
            Some(None) => TupleValue::Null,
            Some(Some(s)) => TupleValue::Text(s.as_bytes()),
        })
        .collect()
}

proptest! {
    #![proptest_config(config(4000, "random_bytes"))]
    #[test]
    fn random_bytes_never_panic_the_decoder(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
        let _ = pgoutput::decode(&bytes);
    }
}

proptest! {
    #![proptest_config(config(4000, "message_like"))]
    #[test]
    fn message_like_bytes_never_panic_the_decoder(bytes in message_like_bytes()) {
        if let Ok(message) = pgoutput::decode(&bytes) {
            // Walking a decoded message must not fail or panic either.
            match message {
                PgOutputMessage::Insert(m) => { let _ = m.new.iter().count(); }
                PgOutputMessage::Update(m) => { let _ = m.new.iter().count(); }
                PgOutputMessage::Relation(m) => { let _ = m.columns.iter().count(); }
                PgOutputMessage::Truncate(m) => { let _ = m.relation_ids().count(); }
                _ => {}
            }
        }
    }
}

proptest! {
    #![proptest_config(config(2000, "mutated_capture"))]
    #[test]
    fn mutated_captured_streams_never_panic_the_stateful_decoder((index, edits) in mutated_capture()) {
        // Feed the captured stream with one message mutated: the decoder must return
        // errors, not panic, and the JSON of whatever decodes must build.
        let mut decoder = ChangeDecoder::new();
        let mut out = Vec::new();
        for (i, (lsn, data)) in captured().into_iter().enumerate() {
            let data = if i == index { Bytes::from(apply(data.to_vec(), &edits)) } else { data };
            let _ = decoder.decode(lsn, &data, &mut out);
        }
        for change in &out {
            let _ = change.to_json();
        }
    }
}

proptest! {
    #![proptest_config(config(500, "round_trip"))]
    #[test]
    fn encoded_rows_decode_to_the_same_values(
        relation_id in any::<u32>(),
        old in prop::option::of(prop::collection::vec(text_value(), 0..8)),
        new in prop::collection::vec(text_value(), 0..8),
        full in any::<bool>(),
    ) {
        let new_values = to_values(&new);
        let old_values = old.as_ref().map(|o| to_values(o));
        let kind = if full { OldKind::Full } else { OldKind::Key };
        let bytes = encode::update(relation_id, old_values.as_deref().map(|v| (kind, v)), &new_values);
        let PgOutputMessage::Update(update) = pgoutput::decode(&bytes).unwrap() else {
            panic!("an update")
        };
        prop_assert_eq!(update.relation_id, relation_id);
        prop_assert_eq!(update.new.iter().collect::<Vec<_>>(), new_values);
        match (update.old, old_values) {
            (None, None) => {}
            (Some(OldTuple::Key(t)), Some(v)) if !full => prop_assert_eq!(t.iter().collect::<Vec<_>>(), v),
            (Some(OldTuple::Full(t)), Some(v)) if full => prop_assert_eq!(t.iter().collect::<Vec<_>>(), v),
            (got, _) => prop_assert!(false, "old tuple {:?}", got),
        }
    }
}

proptest! {
    #![proptest_config(config(500, "message_round_trip"))]
    #[test]
    fn encoded_messages_decode_to_the_same_fields(
        transactional in any::<bool>(),
        lsn in any::<u64>(),
        prefix in "[a-z.]{0,20}",
        content in prop::collection::vec(any::<u8>(), 0..100),
        xid in any::<u32>(),
        time in any::<i64>(),
    ) {
        let bytes = encode::message(transactional, Lsn(lsn), &prefix, &content);
        let PgOutputMessage::Message(m) = pgoutput::decode(&bytes).unwrap() else { panic!("a message") };
        prop_assert_eq!((m.transactional, m.lsn, m.prefix, m.content), (transactional, Lsn(lsn), prefix.as_str(), &content[..]));
        let bytes = encode::begin(Lsn(lsn), time, xid);
        prop_assert_eq!(
            pgoutput::decode(&bytes).unwrap(),
            PgOutputMessage::Begin(pgoutput::Begin { final_lsn: Lsn(lsn), commit_time: time, xid })
        );
    }
}
