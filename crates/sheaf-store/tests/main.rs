//! Tests of the domain types on their own: validation, time truncation, cursors, serde shapes,
//! and the reference model. The store behaviour is tested by the backends through the suites.

mod ids {
    use sheaf_store::{AttemptId, DestinationId, ErrorKind, EventId, JobId, TenantId};

    #[test]
    fn tenant_ids_accept_the_safe_charset_only() {
        for ok in ["acme", "a", "Acme_Corp-2.eu", &"x".repeat(64)] {
            assert!(TenantId::new(ok).is_ok(), "{ok:?} should be valid");
        }
        for bad in ["", "a b", "a/b", "ü", "a:b", &"x".repeat(65)] {
            let err = TenantId::new(bad).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
    }

    #[test]
    fn event_ids_accept_idempotency_keys_that_are_safe_in_paths() {
        for ok in [
            "order-1",
            "cdc:0/16B3748:3",
            "a~b@c+d=e.f_g",
            &"x".repeat(255),
        ] {
            let ok = ok.replace('/', "_");
            assert!(EventId::new(&ok).is_ok(), "{ok:?} should be valid");
        }
        for bad in ["", "a b", "a/b", "a?b", "a#b", "é", &"x".repeat(256)] {
            assert_eq!(
                EventId::new(bad).expect_err(bad).kind(),
                ErrorKind::InvalidInput,
                "{bad:?}"
            );
        }
    }

    #[test]
    fn generated_ids_sort_by_creation() {
        let events: Vec<EventId> = (0..200).map(|_| EventId::generate()).collect();
        assert!(
            events.windows(2).all(|w| w[0] < w[1]),
            "generated event ids are increasing"
        );
        assert!(events[0].as_str().starts_with("evt_"));
        let attempts: Vec<AttemptId> = (0..200).map(|_| AttemptId::generate()).collect();
        assert!(
            attempts.windows(2).all(|w| w[0] < w[1]),
            "generated attempt ids are increasing"
        );
        // The canonical strings sort like the ids, which is what cursors and SQL rely on.
        let strings: Vec<String> = attempts.iter().map(ToString::to_string).collect();
        assert!(strings.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn uuid_ids_parse_their_display_form_and_reject_garbage() {
        let id = JobId::generate();
        assert_eq!(id.to_string().parse::<JobId>().expect("round trip"), id);
        let err = "not-a-uuid".parse::<DestinationId>().expect_err("garbage");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
    }

    #[test]
    fn ids_serialize_as_plain_strings_and_validate_when_deserialized() {
        let tenant = TenantId::new("acme").expect("valid");
        assert_eq!(
            serde_json::to_string(&tenant).expect("serialize"),
            "\"acme\""
        );
        assert!(serde_json::from_str::<TenantId>("\"a b\"").is_err());
        let id = DestinationId::generate();
        assert_eq!(
            serde_json::to_string(&id).expect("serialize"),
            format!("\"{id}\"")
        );
    }
}

mod time {
    use std::time::Duration;

    use chrono::{DateTime, TimeZone, Utc};
    use sheaf_store::{Timestamp, truncate_to_micros};

    #[test]
    fn construction_truncates_to_microseconds_toward_the_past() {
        let dt = Utc
            .timestamp_opt(1_700_000_000, 123_456_789)
            .single()
            .expect("valid");
        let ts = Timestamp::from(dt);
        assert_eq!(ts.as_micros(), 1_700_000_000_123_456);
        assert_eq!(ts.as_datetime().timestamp_subsec_nanos(), 123_456_000);
        let before_epoch = DateTime::from_timestamp(-1, 999_999_999).expect("valid");
        assert_eq!(
            Timestamp::from(before_epoch).as_micros(),
            -1,
            "floor, not toward zero"
        );
        assert_eq!(truncate_to_micros(dt), ts.as_datetime());
        assert_eq!(
            Timestamp::now().as_datetime().timestamp_subsec_nanos() % 1000,
            0
        );
    }

    #[test]
    fn display_and_parse_round_trip_with_six_digits() {
        let ts = Timestamp::from_micros(1_700_000_000_000_007).expect("in range");
        assert_eq!(ts.to_string(), "2023-11-14T22:13:20.000007Z");
        assert_eq!(ts.to_string().parse::<Timestamp>().expect("parse"), ts);
        let nanos: Timestamp = "2023-11-14T23:13:20.000007999+01:00"
            .parse()
            .expect("parse");
        assert_eq!(
            nanos, ts,
            "other offsets and extra digits are accepted and truncated"
        );
        let json = serde_json::to_string(&ts).expect("serialize");
        assert_eq!(json, "\"2023-11-14T22:13:20.000007Z\"");
        assert_eq!(
            serde_json::from_str::<Timestamp>(&json).expect("deserialize"),
            ts
        );
        assert!("yesterday".parse::<Timestamp>().is_err());
    }

    #[test]
    fn arithmetic_keeps_microseconds_and_saturates() {
        let ts = Timestamp::from_micros(10).expect("in range");
        assert_eq!(
            ts.checked_add(Duration::from_nanos(2_500))
                .expect("add")
                .as_micros(),
            12
        );
        assert_eq!(
            ts.checked_sub(Duration::from_micros(20))
                .expect("sub")
                .as_micros(),
            -10
        );
        assert_eq!(
            ts.saturating_duration_since(Timestamp::UNIX_EPOCH),
            Duration::from_micros(10)
        );
        assert_eq!(
            Timestamp::UNIX_EPOCH.saturating_duration_since(ts),
            Duration::ZERO
        );
        let far = Timestamp::now().saturating_add(Duration::from_secs(u64::MAX));
        assert!(far > Timestamp::now());
        assert_eq!(far.as_datetime().timestamp_subsec_nanos() % 1000, 0);
    }
}

mod page {
    use sheaf_store::{Cursor, ErrorKind, JobId, MAX_PAGE_LIMIT, Page, PageRequest, Timestamp};

    #[test]
    fn an_overfetched_listing_becomes_a_page_with_a_cursor_only_when_more_matched() {
        let time = Timestamp::from_micros(5).expect("in range");
        let position = |n: &u32| Cursor::new(time, n.to_string());
        let page = Page::from_overfetch(vec![9, 8, 7], 2, position);
        assert_eq!(page.items, vec![9, 8]);
        assert_eq!(page.next, Some(Cursor::new(time, "8")));
        let last = Page::from_overfetch(vec![9, 8], 2, position);
        assert_eq!((last.items, last.next), (vec![9, 8], None));
    }

    #[test]
    fn a_cursor_position_parses_its_id_or_says_the_cursor_is_invalid() {
        let time = Timestamp::from_micros(7).expect("in range");
        let job = JobId::generate();
        let request = PageRequest::after(10, Cursor::new(time, job.to_string()));
        let parsed = request
            .cursor_position(|id| id.parse::<JobId>())
            .expect("a job id parses");
        assert_eq!(parsed, Some((time, job)));
        let bad = PageRequest::after(10, Cursor::new(time, "not-a-uuid"));
        let err = bad
            .cursor_position(|id| id.parse::<JobId>())
            .expect_err("a cursor id of the wrong type");
        assert_eq!(err.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            PageRequest::first(10)
                .cursor_position(|id| id.parse::<JobId>())
                .expect("first page"),
            None
        );
    }

    #[test]
    fn cursors_round_trip_through_their_opaque_form() {
        let time = Timestamp::from_micros(-1_234_567).expect("in range");
        for id in [
            "a",
            "order-1",
            "x:y~z@w+v=u",
            "01a2b3c4-0000-7000-8000-000000000000",
            "ab/cd",
        ] {
            let cursor = Cursor::new(time, id);
            let encoded = cursor.encode();
            assert!(
                encoded
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
            );
            let decoded = Cursor::decode(&encoded).expect("decode");
            assert_eq!(decoded, cursor);
            assert_eq!((decoded.time(), decoded.id()), (time, id));
            let json = serde_json::to_string(&cursor).expect("serialize");
            assert_eq!(
                serde_json::from_str::<Cursor>(&json).expect("deserialize"),
                cursor
            );
        }
    }

    #[test]
    fn anything_else_is_not_a_cursor() {
        let valid = Cursor::new(Timestamp::now(), "abc").encode();
        let mut tampered = valid.clone();
        tampered.pop();
        tampered.push('*');
        for bad in ["", "a", "!!!!", "bm9wZQ", &tampered] {
            let err = Cursor::decode(bad).expect_err(bad);
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        // Non-canonical spellings (stray low bits) are refused, so every cursor has one form.
        let two_chars = "YR"; // "a" would be "YQ".
        assert!(Cursor::decode(two_chars).is_err());
    }

    #[test]
    fn page_limits_are_validated() {
        assert!(PageRequest::first(1).validate().is_ok());
        assert!(PageRequest::first(MAX_PAGE_LIMIT).validate().is_ok());
        for limit in [0, MAX_PAGE_LIMIT + 1] {
            let err = PageRequest::first(limit)
                .validate()
                .expect_err("out of range");
            assert_eq!(err.kind(), ErrorKind::InvalidInput);
        }
    }
}

mod domain {
    use std::time::Duration;

    use sheaf_store::testkit::fixtures::{destination, secret, unique_tenant};
    use sheaf_store::{
        AttemptStatus, Error, ErrorKind, PreviousSecret, Secret, Timestamp, Topics, validate_topic,
    };

    #[test]
    fn topics_filters_parse_the_api_list_form() {
        assert_eq!(
            Topics::from_list(vec!["*".into()]).expect("all"),
            Topics::All
        );
        let only = Topics::from_list(vec!["b".into(), "a".into(), "b".into()]).expect("list");
        assert_eq!(
            only,
            Topics::Only(vec!["a".into(), "b".into()]),
            "sorted and deduplicated"
        );
        assert!(only.matches("a") && !only.matches("c") && Topics::All.matches("anything"));
        for bad in [
            vec![],
            vec!["*".to_owned(), "a".to_owned()],
            vec![String::new()],
        ] {
            let err = Topics::from_list(bad.clone()).expect_err("invalid");
            assert_eq!(err.kind(), ErrorKind::InvalidInput, "{bad:?}");
        }
        assert_eq!(
            serde_json::to_string(&Topics::All).expect("serialize"),
            "[\"*\"]"
        );
        let parsed: Topics = serde_json::from_str("[\"order.paid\"]").expect("deserialize");
        assert_eq!(parsed, Topics::Only(vec!["order.paid".into()]));
        assert!(serde_json::from_str::<Topics>("[]").is_err());
        assert!(validate_topic("orders.created").is_ok());
        assert!(validate_topic("*").is_err() && validate_topic("a\nb").is_err());
    }

    #[test]
    fn secrets_never_show_in_debug_output() {
        let s = Secret::new("whsec_topsecret").expect("valid");
        assert!(!format!("{s:?}").contains("topsecret"));
        let d = destination(&unique_tenant("debug"));
        assert!(!format!("{d:?}").contains(d.secret.expose()));
        assert_eq!(
            Secret::new("").expect_err("empty").kind(),
            ErrorKind::InvalidInput
        );
    }

    #[test]
    fn the_previous_secret_signs_until_it_expires() {
        let now = Timestamp::now();
        let mut d = destination(&unique_tenant("signing"));
        assert_eq!(d.signing_secrets(now), vec![&d.secret]);
        let old = secret();
        d.previous_secret = Some(PreviousSecret {
            secret: old.clone(),
            expires_at: now.saturating_add(Duration::from_secs(60)),
        });
        assert_eq!(d.signing_secrets(now), vec![&d.secret, &old]);
        let later = now.saturating_add(Duration::from_secs(61));
        assert_eq!(d.signing_secrets(later), vec![&d.secret]);
    }

    #[test]
    fn errors_are_cloneable_and_keep_their_kind_and_source() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "refused");
        let err = Error::unavailable("connecting to postgres", io);
        let copy = err.clone();
        assert_eq!(copy.kind(), ErrorKind::Unavailable);
        assert_eq!(
            copy.to_string(),
            "store unavailable: connecting to postgres"
        );
        let source = std::error::Error::source(&copy).expect("source kept");
        assert_eq!(source.to_string(), "refused");
        assert_eq!(Error::not_found("tenant acme").kind(), ErrorKind::NotFound);
        assert_eq!(Error::conflict("taken").kind(), ErrorKind::Conflict);
    }

    #[test]
    fn statuses_use_lower_case_names() {
        assert_eq!(
            serde_json::to_string(&AttemptStatus::Success).expect("serialize"),
            "\"success\""
        );
        assert_eq!(
            "failed".parse::<AttemptStatus>().expect("parse"),
            AttemptStatus::Failed
        );
        assert!("FAILED".parse::<AttemptStatus>().is_err());
    }
}

mod model {
    use sheaf_store::testkit::fixtures::{attempt, event, shift, unique_tenant};
    use sheaf_store::testkit::model;
    use sheaf_store::{AttemptId, AttemptKey, DestinationId, Timestamp};

    #[test]
    fn the_reference_model_follows_the_rules() {
        let tenant = unique_tenant("model");
        let t = Timestamp::now();
        let e = event(&tenant, "e", "t", t);
        let (d1, d2) = (DestinationId::generate(), DestinationId::generate());
        let mut ids = [AttemptId::generate(), AttemptId::generate()];
        ids.sort();
        let old = attempt(&e, d1, t);
        let tie_low = sheaf_store::Attempt {
            id: ids[0],
            ..attempt(&e, d1, shift(t, 10))
        };
        let tie_high = sheaf_store::Attempt {
            id: ids[1],
            ..attempt(&e, d1, shift(t, 10))
        };
        let other = attempt(&e, d2, shift(t, 20));
        let history = vec![
            tie_high.clone(),
            old.clone(),
            tie_low,
            other.clone(),
            old.clone(),
        ];

        let key = |d, micros| AttemptKey {
            destination_id: d,
            attempt_time: shift(t, micros),
            ..old.key()
        };
        assert_eq!(
            model::latest_attempt(&history, &key(d1, 0)),
            Some(&tie_high)
        );
        assert_eq!(
            model::latest_attempt(&history, &key(d1, 10)),
            Some(&tie_high),
            "the bound is inclusive"
        );
        assert_eq!(model::latest_attempt(&history, &key(d1, 11)), None);
        assert_eq!(model::latest_attempt(&history, &key(d2, 0)), Some(&other));
        assert_eq!(
            model::latest_attempt(&history, &key(DestinationId::generate(), 0)),
            None
        );
        let all = model::latest_attempts(&history, &[key(d1, 0), key(d1, 11), key(d1, 0)]);
        assert_eq!(all.len(), 1);
    }
}
