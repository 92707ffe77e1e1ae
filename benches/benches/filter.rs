//! What a destination's payload filter costs per event: `Filter::matches` runs at publish time for
//! every event and every destination whose topics the event has.
//!
//! Every case evaluates one compiled filter against one event, an `order.paid` with a payload of
//! about 1 KB (an order with a customer, a shipping address and 20 line items):
//!
//! - `eq_match`, `eq_miss`: `{"data": {"type": …}}`, the commonest filter, equal and not;
//! - `gte`: `{"data": {"total": {"$gte": 100}}}`;
//! - `and_5`: an `$and` of five conditions that all hold (so all five run), one of them an `$in`
//!   of 10 strings whose match is the last;
//! - `array_any`: `{"data": {"items": {"sku": …}}}` where only the last of the 20 items matches;
//! - `topics_only`: for comparison, the topic filter every destination already has,
//!   `Topics::Only` with three topics, matching.
//!
//! `cargo bench -p sheaf-benches --bench filter -- --warm-up-time 1 --measurement-time 3`

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use serde_json::{Value, json};
use sheaf_store::{Filter, Topics};

const TOPIC: &str = "order.paid";

/// An `order.paid` payload of about 1 KB.
fn payload() -> Value {
    let items: Vec<Value> = (1..=20)
        .map(|i| json!({"sku": format!("SKU-{i:02}"), "qty": i % 3 + 1, "price": 12.5}))
        .collect();
    let data = json!({
        "id": "ord_01J9Z3K4M5N6P7Q8R9S0T1V2W3",
        "type": "order.paid",
        "created_at": "2026-11-30T12:34:56.789Z",
        "total": 249.9,
        "currency": "EUR",
        "customer": {
            "id": "cus_8472",
            "tier": "gold",
            "email": "jane.doe@example.org",
            "country": "AT",
        },
        "shipping": {"method": "express", "city": "Wien", "postcode": "1010"},
        "items": items,
    });
    let size = serde_json::to_vec(&data).expect("JSON serializes").len();
    assert!((900..=1300).contains(&size), "the payload is {size} bytes");
    data
}

fn compile(source: Value) -> Filter {
    Filter::parse(source).expect("a valid filter")
}

fn per_event(c: &mut Criterion) {
    let data = payload();
    let cases = [
        (
            "eq_match",
            compile(json!({"data": {"type": "order.paid"}})),
            true,
        ),
        (
            "eq_miss",
            compile(json!({"data": {"type": "order.refunded"}})),
            false,
        ),
        (
            "gte",
            compile(json!({"data": {"total": {"$gte": 100}}})),
            true,
        ),
        (
            "and_5",
            compile(json!({"$and": [
                {"topic": "order.paid"},
                {"data": {"type": "order.paid"}},
                {"data": {"total": {"$gte": 100}}},
                {"data": {"customer": {"tier": {"$neq": "free"}}}},
                {"data": {"customer": {"country": {"$in": [
                    "DE", "FR", "IT", "ES", "NL", "BE", "PL", "SE", "CH", "AT",
                ]}}}},
            ]})),
            true,
        ),
        (
            "array_any",
            compile(json!({"data": {"items": {"sku": "SKU-20"}}})),
            true,
        ),
    ];
    let mut group = c.benchmark_group("filter");
    for (name, filter, expected) in &cases {
        assert_eq!(filter.matches(TOPIC, &data), *expected, "{name}");
        group.bench_function(*name, |b| {
            b.iter(|| filter.matches(black_box(TOPIC), black_box(&data)));
        });
    }
    let topics = Topics::from_list(vec![
        "order.created".to_owned(),
        "order.paid".to_owned(),
        "order.refunded".to_owned(),
    ])
    .expect("valid topics");
    assert!(matches!(topics, Topics::Only(_)) && topics.matches(TOPIC));
    group.bench_function("topics_only", |b| {
        b.iter(|| topics.matches(black_box(TOPIC)));
    });
    group.finish();
}

criterion_group!(benches, per_event);
criterion_main!(benches);
