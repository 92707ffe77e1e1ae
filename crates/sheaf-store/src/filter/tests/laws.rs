//! The negation laws and the equivalences the module documentation promises, over generated
//! conditions and documents. A failure prints the seed; `SHEAF_FILTER_SEED=<seed>` replays it.

use super::*;

/// What a filter's result must be, from those of `a`, `b`, `$eq: x` and `$exists: true`.
type Law = fn(bool, bool, bool, bool) -> bool;

/// The case budget: each case parses a handful of filters and evaluates them on 8 documents.
const CASES: usize = 2_000;

/// xorshift64*: enough to pick from small vocabularies, and replayable from a printed seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        usize::try_from(self.next() % n as u64).expect("n fits")
    }

    fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())].clone()
    }
}

fn scalar(rng: &mut Rng) -> Value {
    rng.pick(&[
        json!(1),
        json!(1.0),
        json!(2),
        json!("a"),
        json!("b"),
        json!(null),
        json!(true),
    ])
}

/// A value for the field `v` of a document: absent, a scalar, an array of scalars, or an array
/// of objects with a field `v` of their own.
fn field_value(rng: &mut Rng) -> Option<Value> {
    match rng.below(5) {
        0 => None,
        1 | 2 => Some(scalar(rng)),
        3 => Some(Value::Array(
            (0..rng.below(4)).map(|_| scalar(rng)).collect(),
        )),
        _ => Some(Value::Array(
            (0..rng.below(3))
                .map(|_| json!({"v": scalar(rng)}))
                .collect(),
        )),
    }
}

/// A positive condition on a value.
fn condition(rng: &mut Rng) -> Value {
    match rng.below(6) {
        0 => scalar(rng),
        1 => {
            let scalar = scalar(rng);
            json!({"$eq": rng.pick(&[scalar, json!([1, "a"]), json!([])])})
        }
        2 => {
            let operator = rng.pick(&["$gt", "$gte", "$lt", "$lte"]);
            json!({operator: rng.pick(&[json!(1), json!(1.5), json!("a")])})
        }
        3 => json!({"$in": (0..rng.below(4)).map(|_| scalar(rng)).collect::<Vec<_>>()}),
        4 => json!({"$exists": true}),
        _ => json!({"v": scalar(rng)}),
    }
}

fn seed() -> u64 {
    std::env::var("SHEAF_FILTER_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(1, |elapsed| elapsed.as_nanos());
            // Truncating the clock is fine for a seed; xorshift needs it non-zero.
            (nanos as u64) | 1
        })
}

#[test]
fn negations_and_equivalences_hold() {
    let seed = seed();
    let mut rng = Rng(seed);
    for case in 0..CASES {
        let documents: Vec<Value> = (0..8)
            .map(|_| match field_value(&mut rng) {
                Some(value) => json!({"v": value}),
                None => json!({"w": 1}),
            })
            .collect();
        let (a, b) = (condition(&mut rng), condition(&mut rng));
        let x = scalar(&mut rng);
        let at = |condition: Value| parse(json!({"data": {"v": condition}}));
        let (fa, fb) = (at(a.clone()), at(b.clone()));
        let laws: [(&str, Filter, Law); 8] = [
            ("$not", at(json!({"$not": a})), |a, _, _, _| !a),
            ("$and", at(json!({"$and": [a, b]})), |a, b, _, _| a && b),
            ("$or", at(json!({"$or": [a, b]})), |a, b, _, _| a || b),
            (
                "top $or",
                parse(json!({"$or": [{"data": {"v": a}}, {"data": {"v": b}}]})),
                |a, b, _, _| a || b,
            ),
            ("$neq", at(json!({"$neq": x})), |_, _, eq, _| !eq),
            ("$nin", at(json!({"$nin": [x]})), |_, _, eq, _| !eq),
            ("$in", at(json!({"$in": [x]})), |_, _, eq, _| eq),
            (
                "$exists false",
                at(json!({"$exists": false})),
                |_, _, _, exists| !exists,
            ),
        ];
        let (eq, exists) = (at(json!({"$eq": x})), at(json!({"$exists": true})));
        for document in &documents {
            let values = (
                fa.matches(TOPIC, document),
                fb.matches(TOPIC, document),
                eq.matches(TOPIC, document),
                exists.matches(TOPIC, document),
            );
            assert_eq!(
                values.3,
                document.get("v").is_some(),
                "seed {seed}, case {case}: {document}"
            );
            for (name, filter, law) in &laws {
                assert_eq!(
                    filter.matches(TOPIC, document),
                    law(values.0, values.1, values.2, values.3),
                    "seed {seed}, case {case}: {name} with a = {a}, b = {b}, x = {x} on {document}"
                );
            }
        }
    }
}
