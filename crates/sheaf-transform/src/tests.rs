//! The transformation's tests: compile errors with their positions, what a run makes of an
//! event (a body, headers, a drop), and each way a run fails.

use super::*;

fn event(data: &'static str) -> Event<'static> {
    Event {
        id: "evt_1",
        topic: "order.paid",
        data: data.as_bytes(),
        tenant_id: "acme",
    }
}

const ORDER: &str =
    r#"{"id": "ord_7", "total": 250, "card": "4242", "items": [{"sku": "a"}, {"sku": "b"}]}"#;

fn body(program: &str, data: &'static str) -> String {
    match Transform::compile(program)
        .unwrap()
        .run(&event(data), &Limits::default())
    {
        Ok(Output::Send { body, headers }) => {
            assert!(headers.is_empty(), "{headers:?}");
            String::from_utf8(body).unwrap()
        }
        other => panic!("{program}: {other:?}"),
    }
}

#[test]
fn a_program_reshapes_the_event() {
    assert_eq!(
        body(".data", ORDER),
        r#"{"id":"ord_7","total":250,"card":"4242","items":[{"sku":"a"},{"sku":"b"}]}"#
    );
    // Drop what a receiver must not see.
    assert_eq!(
        body(".data | del(.card, .items)", ORDER),
        r#"{"id":"ord_7","total":250}"#
    );
    // Rename and wrap, with the event's own fields.
    assert_eq!(
        body(
            r#"{order: .data.id, skus: [.data.items[].sku], topic, tenant: .metadata.tenant_id}"#,
            ORDER
        ),
        r#"{"order":"ord_7","skus":["a","b"],"topic":"order.paid","tenant":"acme"}"#
    );
    assert_eq!(body("$event.id", ORDER), r#""evt_1""#);
    // The standard library is there.
    assert_eq!(
        body(
            ".data.items | map(.sku | ascii_upcase) | join(\",\")",
            ORDER
        ),
        r#""A,B""#
    );
}

#[test]
fn no_value_drops_the_event_and_with_headers_adds_headers() {
    let program = Transform::compile(r#"select(.data.total > 1000)"#).unwrap();
    assert_eq!(
        program.run(&event(ORDER), &Limits::default()),
        Ok(Output::Drop)
    );
    let program = Transform::compile("empty").unwrap();
    assert_eq!(
        program.run(&event(ORDER), &Limits::default()),
        Ok(Output::Drop)
    );
    let program = Transform::compile(
        r#"{text: .data.id} | with_headers({"x-topic": $event.topic, "x-total": ($event.data.total | tostring)})"#,
    )
    .unwrap();
    assert_eq!(
        program.run(&event(ORDER), &Limits::default()),
        Ok(Output::Send {
            body: br#"{"text":"ord_7"}"#.to_vec(),
            headers: vec![
                ("x-topic".to_owned(), "order.paid".to_owned()),
                ("x-total".to_owned(), "250".to_owned()),
            ],
        })
    );
    // A body that happens to look like one of the keys is still a body.
    assert_eq!(
        body(r#"{"__sheaf_body__": 1}"#, ORDER),
        r#"{"__sheaf_body__":1}"#
    );
}

#[test]
fn a_program_that_does_not_compile_is_refused_with_its_position() {
    let err = Transform::compile(".data |").unwrap_err();
    assert_eq!((err.line, err.column), (1, 8), "{err}");
    assert!(err.message.contains("expected"), "{err}");
    let err = Transform::compile(".data\n| no_such_function").unwrap_err();
    assert_eq!((err.line, err.column), (2, 3), "{err}");
    assert!(err.message.contains("no_such_function"), "{err}");
    let err = Transform::compile(".data | $nothing").unwrap_err();
    assert_eq!((err.line, err.column), (1, 9), "{err}");
    let err = Transform::compile("\"unclosed").unwrap_err();
    assert_eq!(err.line, 1, "{err}");
    let long = "1 + ".repeat(MAX_SOURCE_BYTES / 4) + "1";
    assert!(
        Transform::compile(&long)
            .unwrap_err()
            .message
            .contains("longer than")
    );
    assert_eq!(
        err.to_string(),
        format!("line {}, column {}: {}", err.line, err.column, err.message)
    );
}

#[test]
fn each_failure_of_a_run_is_named() {
    let limits = Limits::default();
    let run = |program: &str| {
        Transform::compile(program)
            .unwrap()
            .run(&event(ORDER), &limits)
    };
    assert_eq!(
        run(r#"error("no")"#),
        Err(RunError::Failed("no".to_owned()))
    );
    assert!(matches!(run(".data.total.x"), Err(RunError::Failed(_))));
    assert_eq!(run(".data.items[]"), Err(RunError::SeveralValues));
    assert!(matches!(
        run(r#". | with_headers({"x": 1})"#),
        Err(RunError::Headers(_))
    ));
    assert!(matches!(
        run(r#". | with_headers("x")"#),
        Err(RunError::Headers(_))
    ));
    let small = Limits {
        max_body_bytes: 10,
        ..limits
    };
    assert_eq!(
        Transform::compile(".data")
            .unwrap()
            .run(&event(ORDER), &small),
        Err(RunError::TooLarge { limit: 10 })
    );
    let quick = Limits {
        max_time: Duration::from_nanos(1),
        ..limits
    };
    let slow = Transform::compile("[range(100000)] | length").unwrap();
    assert!(matches!(
        slow.run(&event(ORDER), &quick),
        Err(RunError::TooSlow { .. })
    ));
    assert!(matches!(
        Transform::compile(".").unwrap().run(&event("not json"), &limits),
        Err(RunError::Failed(m)) if m.contains("not JSON")
    ));
}

/// Compiled once and shared by the delivery workers.
#[test]
fn a_compiled_program_is_shared_between_threads() {
    fn shared<T: Send + Sync>(_: &T) {}
    let program = Transform::compile(".data.id").unwrap();
    shared(&program);
    let program = std::sync::Arc::new(program);
    let handles: Vec<_> = (0..4)
        .map(|_| {
            let program = std::sync::Arc::clone(&program);
            std::thread::spawn(move || program.run(&event(ORDER), &Limits::default()))
        })
        .collect();
    for handle in handles {
        assert_eq!(
            handle.join().unwrap(),
            Ok(Output::Send {
                body: br#""ord_7""#.to_vec(),
                headers: Vec::new()
            })
        );
    }
}

/// The deepest shapes that fit in the size limit compile (or are refused) without overflowing
/// a stack: on the caller's 2 MiB they would abort the test process.
#[test]
fn the_deepest_programs_that_fit_compile_without_crashing() {
    let n = MAX_SOURCE_BYTES / 2 - 1;
    let shapes = [
        format!("{}1{}", "(".repeat(n), ")".repeat(n)),
        format!("{}1{}", "[".repeat(n), "]".repeat(n)),
        vec!["1"; n].join("+"),
        vec!["."; n].join("|"),
        format!("{}1", "-".repeat(MAX_SOURCE_BYTES - 1)),
    ];
    for source in shapes {
        assert!(source.len() <= MAX_SOURCE_BYTES, "{}", source.len());
        let compiled = Transform::compile(&source);
        println!(
            "{} bytes, {}…: {}",
            source.len(),
            &source[..8],
            compiled.is_ok()
        );
    }
}
