//! The decoder on bytes captured from Postgres 15 (every message type, NULLs, unchanged
//! TOAST, multi-byte text, both old-tuple kinds) and on malformed bytes.

use bytes::Bytes;
use serde_json::json;
use sheaf_cdc::change::{Decoded, OldKind, type_oid};
use sheaf_cdc::encode::{self, ColumnSpec};
use sheaf_cdc::pgoutput::{self, PgOutputMessage, TupleValue};
use sheaf_cdc::{Cell, Change, ChangeDecoder, Error, Lsn, Op};

use crate::support::{ITEMS, captured, items_relation};

fn decode_all() -> (Vec<Decoded>, Vec<Change>, ChangeDecoder) {
    let mut decoder = ChangeDecoder::new();
    let mut kinds = Vec::new();
    let mut changes = Vec::new();
    for (i, (lsn, data)) in captured().into_iter().enumerate() {
        let decoded = decoder
            .decode(lsn, &data, &mut changes)
            .unwrap_or_else(|e| panic!("message {i}: {e}"));
        kinds.push(decoded);
    }
    (kinds, changes, decoder)
}

#[test]
fn every_captured_message_type_decodes_in_order() {
    let tags: String = captured()
        .iter()
        .map(|(_, data)| char::from(data[0]))
        .collect();
    assert_eq!(tags, "BYRICBICBUCBUCBRICBUCBDCBDCBYRRTCBMCMBORIC");
    let (kinds, changes, decoder) = decode_all();
    assert_eq!(kinds.len(), 42);
    assert!(!decoder.in_transaction());
    assert_eq!(decoder.relations().len(), 2);
    // The enum's OID is whatever the server gave it: find it through its column.
    let cap_t = decoder
        .relations()
        .iter()
        .find(|r| r.table == "cap_t")
        .unwrap();
    let mood = cap_t.columns.iter().find(|c| c.name == "mood").unwrap();
    assert_eq!(
        decoder.relations().type_name(mood.type_oid),
        Some(("public", "cap_mood"))
    );
    let ops: Vec<(Op, &str)> = changes
        .iter()
        .map(|c| (c.op, c.relation.table.as_str()))
        .collect();
    assert_eq!(
        ops,
        [
            (Op::Insert, "cap_t"),
            (Op::Insert, "cap_t"),
            (Op::Update, "cap_t"),
            (Op::Update, "cap_t"),
            (Op::Insert, "cap_full"),
            (Op::Update, "cap_full"),
            (Op::Delete, "cap_full"),
            (Op::Delete, "cap_t"),
            (Op::Truncate, "cap_t"),
            (Op::Truncate, "cap_full"),
            (Op::Insert, "cap_full"),
        ]
    );
    // Messages: transactional inside its transaction, the other alone.
    let messages: Vec<_> = kinds
        .iter()
        .filter_map(|k| match k {
            Decoded::Message {
                transactional,
                prefix,
                content,
                ..
            } => Some((*transactional, prefix.clone(), content.to_vec())),
            _ => None,
        })
        .collect();
    assert_eq!(
        messages,
        [
            (true, "cap.tx".into(), b"hello".to_vec()),
            (false, "cap.nontx".into(), vec![0, 0xff])
        ]
    );
}

#[test]
fn values_become_json_by_type_including_multibyte_text() {
    let (_, changes, _) = decode_all();
    let first = &changes[0];
    assert_eq!(first.topic(), "public.cap_t.insert");
    let payload = first.to_json().unwrap();
    let new = &payload["new"];
    assert_eq!(new["id"], json!(1));
    assert_eq!(new["small"], json!(7));
    assert_eq!(new["n"], json!(-42));
    assert_eq!(new["flag"], json!(true));
    assert_eq!(new["price"], json!(1234.5));
    assert_eq!(new["ratio"], json!(0.25));
    assert_eq!(new["doc"], json!({"a": [1, "x"]}));
    assert_eq!(new["note"], json!("grüße, 世界 🚀"));
    assert_eq!(new["mood"], json!("happy"));
    assert_eq!(new["big"].as_str().map(str::len), Some(4800));
    assert_eq!(payload["op"], json!("insert"));
    assert_eq!(payload["old"], json!(null));
    assert_eq!(payload["unchanged_toast"], json!([]));
}

#[test]
fn nulls_are_json_null() {
    let (_, changes, _) = decode_all();
    let second = changes[1].to_json().unwrap();
    assert_eq!(second["new"]["id"], json!(2));
    for column in [
        "small", "n", "flag", "price", "ratio", "doc", "note", "mood", "big",
    ] {
        assert_eq!(second["new"][column], json!(null), "{column}");
        assert!(second["new"].as_object().unwrap().contains_key(column));
    }
}

#[test]
fn unchanged_toast_is_left_out_and_named() {
    let (_, changes, _) = decode_all();
    let update = &changes[2];
    let big = update
        .relation
        .columns
        .iter()
        .position(|c| c.name == "big")
        .unwrap();
    assert_eq!(
        update.new.as_ref().unwrap().cells()[big],
        Cell::UnchangedToast
    );
    assert_eq!(Cell::UnchangedToast.to_json(type_oid::TEXT).unwrap(), None);
    let payload = update.to_json().unwrap();
    assert_eq!(payload["new"]["note"], json!("updated"));
    assert!(!payload["new"].as_object().unwrap().contains_key("big"));
    assert_eq!(payload["unchanged_toast"], json!(["big"]));
    assert!(
        update.old.is_none(),
        "key unchanged, identity default: no old tuple"
    );
}

#[test]
fn old_keys_and_old_rows() {
    let (_, changes, _) = decode_all();
    let key_change = &changes[3];
    let (kind, old) = key_change.old.as_ref().unwrap();
    assert_eq!(*kind, OldKind::Key);
    assert_eq!(old.cells()[0].as_str(), Some("2"));
    assert_eq!(key_change.to_json().unwrap()["new"]["id"], json!(3));
    assert_eq!(key_change.to_json().unwrap()["old_kind"], json!("key"));

    let full_update = changes[5].to_json().unwrap();
    assert_eq!(full_update["old_kind"], json!("full"));
    assert_eq!(full_update["old"], json!({"id": 1, "v": "one"}));
    assert_eq!(full_update["new"], json!({"id": 1, "v": "uno"}));

    let full_delete = changes[6].to_json().unwrap();
    assert_eq!(full_delete["op"], json!("delete"));
    assert_eq!(full_delete["old"], json!({"id": 1, "v": "uno"}));
    assert_eq!(full_delete["new"], json!(null));

    let key_delete = &changes[7];
    assert_eq!(key_delete.old.as_ref().unwrap().0, OldKind::Key);
    assert_eq!(key_delete.to_json().unwrap()["old"]["id"], json!(3));
}

#[test]
fn truncate_origin_and_event_ids() {
    let (_, changes, _) = decode_all();
    let (a, b) = (&changes[8], &changes[9]);
    assert_eq!(
        (a.topic(), b.topic()),
        (
            "public.cap_t.truncate".into(),
            "public.cap_full.truncate".into()
        )
    );
    assert_eq!(a.commit_lsn, b.commit_lsn);
    assert_eq!((a.position, b.position), (0, 1));
    assert_ne!(a.id(), b.id());
    assert_eq!(
        a.id().to_string(),
        format!("{:016x}-00000000", a.commit_lsn.0)
    );

    let from_origin = &changes[10];
    assert_eq!(from_origin.origin.as_deref(), Some("cap_origin"));
    assert!(changes[..10].iter().all(|c| c.origin.is_none()));

    // The commit LSN of every change is its transaction's (Begin's final LSN).
    let commit_of_first: Lsn = "0/1A100D0".parse().unwrap();
    assert_eq!(changes[0].commit_lsn, commit_of_first);
    assert_eq!(changes[0].lsn, "0/1A0FF68".parse().unwrap());
}

#[test]
fn borrowed_messages_point_into_the_input() {
    let (_, data) = captured().into_iter().nth(3).unwrap();
    let PgOutputMessage::Insert(insert) = pgoutput::decode(&data).unwrap() else {
        panic!("an insert")
    };
    let note = insert.new.iter().nth(7).unwrap();
    let TupleValue::Text(bytes) = note else {
        panic!("text")
    };
    let range = data.as_ptr_range();
    assert!(
        range.contains(&bytes.as_ptr()),
        "zero-copy: the value is a slice of the message"
    );
    assert_eq!(note.as_str().unwrap(), "grüße, 世界 🚀");
}

#[test]
fn every_truncation_of_every_captured_message_is_an_error() {
    for (_, data) in captured() {
        for cut in 0..data.len() {
            let result = pgoutput::decode(&data[..cut]);
            assert!(
                matches!(result, Err(Error::Malformed { .. })),
                "cut at {cut} of {:?}: {result:?}",
                &data[..]
            );
        }
        let mut longer = data.to_vec();
        longer.push(0);
        assert!(
            matches!(pgoutput::decode(&longer), Err(Error::Malformed { .. })),
            "trailing byte accepted"
        );
    }
}

#[test]
fn bad_tags_markers_and_lengths_are_errors() {
    assert!(matches!(
        pgoutput::decode(b"Z"),
        Err(Error::UnknownTag { tag: b'Z' })
    ));
    // Streaming (protocol 2) tags are not part of version 1.
    assert!(matches!(
        pgoutput::decode(b"S\0\0\0\x01\x01"),
        Err(Error::UnknownTag { tag: b'S' })
    ));

    let good = encode::insert(ITEMS, &[TupleValue::Text(b"1"), TupleValue::Null]);
    let mut bad_marker = good.clone();
    bad_marker[5] = b'X'; // 'N' expected
    assert!(matches!(
        pgoutput::decode(&bad_marker),
        Err(Error::Malformed { offset: 5, .. })
    ));

    let mut bad_kind = good.clone();
    bad_kind[8] = b'q'; // first value kind
    assert!(matches!(
        pgoutput::decode(&bad_kind),
        Err(Error::Malformed { .. })
    ));

    let mut negative_length = good.clone();
    negative_length[9..13].copy_from_slice(&(-5i32).to_be_bytes());
    assert!(matches!(
        pgoutput::decode(&negative_length),
        Err(Error::Malformed { .. })
    ));

    let mut huge_length = good.clone();
    huge_length[9..13].copy_from_slice(&i32::MAX.to_be_bytes());
    assert!(matches!(
        pgoutput::decode(&huge_length),
        Err(Error::Malformed { .. })
    ));

    let mut too_many_columns = good.clone();
    too_many_columns[6..8].copy_from_slice(&3u16.to_be_bytes());
    assert!(matches!(
        pgoutput::decode(&too_many_columns),
        Err(Error::Malformed { .. })
    ));

    let not_utf8 = {
        let mut m = vec![b'I'];
        m.extend_from_slice(&ITEMS.to_be_bytes());
        m.extend_from_slice(b"N\0\x01t\0\0\0\x02\xc3\x28");
        m
    };
    // Value bytes are not read by the decoder; UTF-8 is checked where a value is used.
    let PgOutputMessage::Insert(insert) = pgoutput::decode(&not_utf8).unwrap() else {
        panic!("an insert")
    };
    let value = insert.new.iter().next().unwrap();
    assert!(matches!(value.as_str(), Err(Error::Malformed { what, .. }) if what.contains("UTF-8")));
    let mut decoder = ChangeDecoder::new();
    let mut out = Vec::new();
    let relation = encode::relation(
        ITEMS,
        "public",
        "items",
        b'd',
        &[ColumnSpec {
            key: true,
            name: "id",
            type_oid: 25,
            type_modifier: -1,
        }],
    );
    decoder
        .decode(Lsn::ZERO, &relation.into(), &mut out)
        .unwrap();
    decoder
        .decode(Lsn(1), &encode::begin(Lsn(9), 0, 1).into(), &mut out)
        .unwrap();
    decoder
        .decode(Lsn(2), &Bytes::from(not_utf8), &mut out)
        .unwrap();
    assert!(
        matches!(out[0].to_json(), Err(Error::Malformed { what, .. }) if what.contains("UTF-8"))
    );
    assert_eq!(out[0].new.as_ref().unwrap().cells()[0].as_str(), None);

    let truncate_overflow = {
        let mut m = vec![b'T'];
        m.extend_from_slice(&u32::MAX.to_be_bytes());
        m.push(0);
        m
    };
    assert!(matches!(
        pgoutput::decode(&truncate_overflow),
        Err(Error::Malformed { .. })
    ));

    let unterminated = b"Y\0\0\0\x01public";
    assert!(matches!(
        pgoutput::decode(unterminated),
        Err(Error::Malformed { .. })
    ));
}

#[test]
fn messages_out_of_order_are_protocol_errors() {
    let mut decoder = ChangeDecoder::new();
    let mut out = Vec::new();
    let insert = Bytes::from(encode::insert(
        ITEMS,
        &[TupleValue::Text(b"1"), TupleValue::Text(b"x")],
    ));
    let begin = Bytes::from(encode::begin(Lsn(500), 0, 7));
    let commit = Bytes::from(encode::commit(Lsn(500), Lsn(548), 0));

    assert!(matches!(
        decoder.decode(Lsn(10), &commit, &mut out),
        Err(Error::Protocol(_))
    ));
    decoder.decode(Lsn(10), &begin, &mut out).unwrap();
    assert!(
        matches!(
            decoder.decode(Lsn(10), &begin, &mut out),
            Err(Error::Protocol(_))
        ),
        "nested begin"
    );
    assert!(
        matches!(decoder.decode(Lsn(11), &insert, &mut out), Err(Error::Protocol(e)) if e.contains("Relation")),
        "row before its relation"
    );
    decoder
        .decode(Lsn::ZERO, &items_relation().into(), &mut out)
        .unwrap();
    let short = Bytes::from(encode::insert(ITEMS, &[TupleValue::Text(b"1")]));
    assert!(
        matches!(decoder.decode(Lsn(11), &short, &mut out), Err(Error::Protocol(e)) if e.contains("columns"))
    );
    decoder.decode(Lsn(12), &insert, &mut out).unwrap();
    let wrong_commit = Bytes::from(encode::commit(Lsn(499), Lsn(548), 0));
    assert!(matches!(
        decoder.decode(Lsn(548), &wrong_commit, &mut out),
        Err(Error::Protocol(_))
    ));
    assert_eq!(out.len(), 1, "failed messages appended nothing");
    assert!(!decoder.in_transaction());
    assert!(
        matches!(decoder.decode(Lsn(12), &insert, &mut out), Err(Error::Protocol(e)) if e.contains("outside"))
    );
}

#[test]
fn json_forms_of_edge_values() {
    let text = |s: &'static str| Cell::Text(Bytes::from_static(s.as_bytes()));
    assert_eq!(
        text("9223372036854775807").to_json(type_oid::INT8).unwrap(),
        Some(json!(i64::MAX))
    );
    assert_eq!(
        text("NaN").to_json(type_oid::FLOAT8).unwrap(),
        Some(json!("NaN"))
    );
    assert_eq!(
        text("-Infinity").to_json(type_oid::FLOAT4).unwrap(),
        Some(json!("-Infinity"))
    );
    assert_eq!(
        text("1.5e+300").to_json(type_oid::FLOAT8).unwrap(),
        Some(json!(1.5e300))
    );
    assert_eq!(
        text("123456789012345678901234567890")
            .to_json(type_oid::NUMERIC)
            .unwrap(),
        Some(json!("123456789012345678901234567890"))
    );
    assert_eq!(
        text("0.1234567890123456789")
            .to_json(type_oid::NUMERIC)
            .unwrap(),
        Some(json!("0.1234567890123456789"))
    );
    assert_eq!(
        text("-0.000123").to_json(type_oid::NUMERIC).unwrap(),
        Some(json!(-0.000123))
    );
    assert_eq!(
        text("100.00").to_json(type_oid::NUMERIC).unwrap(),
        Some(json!(100.0))
    );
    assert_eq!(
        text("NaN").to_json(type_oid::NUMERIC).unwrap(),
        Some(json!("NaN"))
    );
    assert_eq!(
        text("t").to_json(type_oid::BOOL).unwrap(),
        Some(json!(true))
    );
    assert_eq!(
        text("{not json").to_json(type_oid::JSONB).unwrap(),
        Some(json!("{not json"))
    );
    assert_eq!(
        text("2024-01-01").to_json(1082).unwrap(),
        Some(json!("2024-01-01"))
    );
    assert_eq!(
        Cell::Binary(Bytes::from_static(&[0, 255]))
            .to_json(17)
            .unwrap(),
        Some(json!("\\x00ff"))
    );
    assert_eq!(
        Cell::Null.to_json(type_oid::INT4).unwrap(),
        Some(json!(null))
    );
}

#[test]
fn relation_namespace_empty_means_pg_catalog() {
    let mut decoder = ChangeDecoder::new();
    let message = encode::relation(
        42,
        "",
        "pg_thing",
        b'n',
        &[ColumnSpec {
            key: false,
            name: "x",
            type_oid: 23,
            type_modifier: -1,
        }],
    );
    let Decoded::Relation(relation) = decoder
        .decode(Lsn::ZERO, &message.into(), &mut Vec::new())
        .unwrap()
    else {
        panic!("a relation")
    };
    assert_eq!(relation.schema, "pg_catalog");
}
