//! What a destination's payload transformation costs per event: `Transform::run` on a ~1 KB
//! `order.paid` event (an order with a customer, a shipping address and 20 line items), the
//! program compiled once as a destination's is:
//!
//! - `identity`: `.data`, the body as published (the floor: the event is read into jq's values
//!   and the body written back out);
//! - `typical`: drop two fields a receiver must not see, rename three, count the items and add
//!   a header, the shape of most webhook reshaping;
//! - `slack`: a Slack message built from the order, with string interpolation;
//! - `filtered_out`: a `select` that drops the event (no body written).
//!
//! `cargo bench -p sheaf-benches --bench transform -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use sheaf_transform::{Event, Limits, Output, Transform};

/// An `order.paid` payload of about 1 KB.
fn payload() -> String {
    let items: Vec<String> = (1..=20)
        .map(|i| format!(r#"{{"sku":"SKU-{i:02}","qty":{},"price":12.5}}"#, i % 3 + 1))
        .collect();
    let data = format!(
        r#"{{"id":"ord_01J9Z3K4M5N6P7Q8R9S0T1V2W3","type":"order.paid","created_at":"2026-11-30T12:34:56.789Z","total":249.9,"currency":"EUR","customer":{{"id":"cus_8472","tier":"gold","email":"jane.doe@example.org","country":"AT"}},"shipping":{{"method":"express","city":"Wien","postcode":"1010"}},"items":[{}]}}"#,
        items.join(",")
    );
    assert!(
        (900..=1300).contains(&data.len()),
        "the payload is {} bytes",
        data.len()
    );
    data
}

fn per_event(c: &mut Criterion) {
    let data = payload();
    let event = Event {
        id: "evt_01J9Z3K4M5N6P7Q8R9S0T1V2W3",
        topic: "order.paid",
        data: data.as_bytes(),
        tenant_id: "acme",
    };
    let limits = Limits::default();
    let cases = [
        ("identity", ".data", true),
        (
            "typical",
            r#".data | del(.customer.email, .shipping.postcode)
               | {order: .id, amount: .total, currency, customer: .customer.id,
                  lines: (.items | length)}
               | with_headers({"x-order-topic": $event.topic})"#,
            true,
        ),
        (
            "slack",
            r#"{text: "Order \(.data.id) paid: \(.data.total) \(.data.currency), \(.data.items | length) lines, \(.data.customer.tier) customer"}"#,
            true,
        ),
        ("filtered_out", "select(.data.total > 1000)", false),
    ];
    let mut group = c.benchmark_group("transform");
    for (name, source, sends) in cases {
        let program = Transform::compile(source).expect("the bench's programs compile");
        let output = program
            .run(&event, &limits)
            .expect("the bench's programs run");
        assert_eq!(matches!(output, Output::Send { .. }), sends, "{name}");
        group.bench_function(name, |b| {
            b.iter(|| program.run(black_box(&event), &limits));
        });
    }
    group.finish();
}

criterion_group!(benches, per_event);
criterion_main!(benches);
