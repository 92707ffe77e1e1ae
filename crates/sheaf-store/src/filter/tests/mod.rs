//! The filter language case by case: each operator, missing fields, arrays, type mismatches,
//! logical operators at every level, every error with its path, serde, and the negation laws
//! checked over generated filters and documents.

use serde_json::{Value, json};

use super::{Filter, FilterError, MAX_CONDITIONS, MAX_DEPTH, MAX_LIST};
use crate::ErrorKind;

const TOPIC: &str = "order.paid";

fn parse(source: Value) -> Filter {
    Filter::parse(source.clone()).unwrap_or_else(|e| panic!("{source} should parse: {e}"))
}

/// Whether `filter` matches an event of topic [`TOPIC`] with `data`.
fn matches(filter: Value, data: Value) -> bool {
    parse(filter).matches(TOPIC, &data)
}

/// Asserts that `filter` matches each of `yes` and none of `no`.
fn check(filter: Value, yes: &[Value], no: &[Value]) {
    let compiled = parse(filter.clone());
    for data in yes {
        assert!(
            compiled.matches(TOPIC, data),
            "{filter} should match {data}"
        );
    }
    for data in no {
        assert!(
            !compiled.matches(TOPIC, data),
            "{filter} should not match {data}"
        );
    }
}

/// The message of the error `filter` is refused with.
fn refused(filter: Value) -> String {
    Filter::parse(filter.clone())
        .map(|_| ())
        .expect_err(&format!("{filter} should be refused"))
        .to_string()
}

mod equality {
    use super::*;

    #[test]
    fn a_plain_value_is_equality_at_its_path() {
        check(
            json!({"data": {"type": "order.paid"}}),
            &[
                json!({"type": "order.paid"}),
                json!({"type": "order.paid", "x": 1}),
            ],
            &[
                json!({"type": "order.refunded"}),
                json!({"kind": "order.paid"}),
                json!({}),
            ],
        );
        check(
            json!({"data": {"ok": true}}),
            &[json!({"ok": true})],
            &[json!({"ok": false})],
        );
        check(
            json!({"data": {"n": 3}}),
            &[json!({"n": 3})],
            &[json!({"n": "3"})],
        );
    }

    #[test]
    fn nested_objects_descend() {
        check(
            json!({"data": {"customer": {"tier": "gold", "country": "DE"}}}),
            &[json!({"customer": {"tier": "gold", "country": "DE", "id": 7}})],
            &[
                json!({"customer": {"tier": "gold"}}),
                json!({"customer": {"tier": "gold", "country": "FR"}}),
                json!({"customer": "gold"}),
                json!({"tier": "gold", "country": "DE"}),
            ],
        );
    }

    #[test]
    fn the_data_itself_can_be_compared() {
        check(
            json!({"data": 5}),
            &[json!(5), json!(5.0)],
            &[json!("5"), json!({"x": 5})],
        );
        check(
            json!({"data": {"$eq": {}}}),
            &[json!({})],
            &[json!({"x": 1}), json!(null)],
        );
    }

    #[test]
    fn numbers_compare_as_f64() {
        check(
            json!({"data": {"n": 1}}),
            &[json!({"n": 1.0}), json!({"n": 1})],
            &[json!({"n": 1.5})],
        );
        check(
            json!({"data": {"n": 1.0}}),
            &[json!({"n": 1})],
            &[json!({"n": -1})],
        );
        check(
            json!({"data": {"n": {"$eq": [1, {"x": 2}]}}}),
            &[json!({"n": [1.0, {"x": 2.0}]})],
            &[json!({"n": [1.0, {"x": 3}]})],
        );
    }

    #[test]
    fn null_is_a_value_and_missing_is_not() {
        check(
            json!({"data": {"x": null}}),
            &[json!({"x": null}), json!({"x": [1, null]})],
            &[json!({}), json!({"x": 0})],
        );
    }

    #[test]
    fn eq_matches_objects_and_arrays_whole() {
        check(
            json!({"data": {"meta": {"$eq": {"a": 1, "b": [true]}}}}),
            &[json!({"meta": {"b": [true], "a": 1}})],
            &[
                json!({"meta": {"a": 1}}),
                json!({"meta": {"a": 1, "b": [true], "c": 0}}),
            ],
        );
        check(
            json!({"data": {"tags": {"$eq": ["new", "vip"]}}}),
            &[
                json!({"tags": ["new", "vip"]}),
                json!({"tags": [["new", "vip"], "x"]}),
            ],
            &[
                json!({"tags": ["vip", "new"]}),
                json!({"tags": ["new"]}),
                json!({"tags": "new"}),
            ],
        );
    }

    #[test]
    fn neq_is_true_for_missing_fields_and_other_values() {
        check(
            json!({"data": {"type": {"$neq": "order.paid"}}}),
            &[
                json!({"type": "order.refunded"}),
                json!({}),
                json!({"type": 1}),
                json!(null),
            ],
            &[json!({"type": "order.paid"})],
        );
    }
}

mod order {
    use super::*;

    #[test]
    fn numbers_compare_with_numbers() {
        let at = |n: Value| json!({"total": n});
        check(
            json!({"data": {"total": {"$gt": 100}}}),
            &[at(json!(100.5))],
            &[at(json!(100)), at(json!(7))],
        );
        check(
            json!({"data": {"total": {"$gte": 100}}}),
            &[at(json!(100.0)), at(json!(101))],
            &[at(json!(99.9))],
        );
        check(
            json!({"data": {"total": {"$lt": 0}}}),
            &[at(json!(-1))],
            &[at(json!(0)), at(json!(1))],
        );
        check(
            json!({"data": {"total": {"$lte": 0.5}}}),
            &[at(json!(0.5)), at(json!(-3))],
            &[at(json!(1))],
        );
    }

    #[test]
    fn strings_compare_bytewise() {
        let at = |s: &str| json!({"v": s});
        check(
            json!({"data": {"v": {"$gt": "b"}}}),
            &[at("c"), at("ba")],
            &[at("b"), at("B"), at("a")],
        );
        check(
            json!({"data": {"v": {"$lt": "a"}}}),
            &[at("B"), at("Z"), at("")],
            &[at("a"), at("é")],
        );
        check(
            json!({"data": {"v": {"$gte": "2024-01-01"}}}),
            &[at("2024-01-01"), at("2024-06-30")],
            &[at("2023-12-31")],
        );
        check(
            json!({"data": {"v": {"$lte": "m"}}}),
            &[at("m"), at("abc")],
            &[at("n")],
        );
    }

    #[test]
    fn other_types_are_neither_greater_nor_smaller() {
        for op in ["$gt", "$gte", "$lt", "$lte"] {
            let numeric = json!({"data": {"v": {op: 5}}});
            let textual = json!({"data": {"v": {op: "5"}}});
            for value in [
                json!("5"),
                json!(true),
                json!(null),
                json!({"a": 5}),
                json!([]),
            ] {
                assert!(
                    !matches(numeric.clone(), json!({"v": value})),
                    "{op} 5 on {value}"
                );
            }
            for value in [json!(5), json!(false), json!(null), json!({})] {
                assert!(
                    !matches(textual.clone(), json!({"v": value})),
                    "{op} \"5\" on {value}"
                );
            }
            assert!(!matches(numeric, json!({})), "{op} on a missing field");
        }
    }

    #[test]
    fn comparisons_combine_in_one_object() {
        check(
            json!({"data": {"total": {"$gte": 10, "$lt": 20}}}),
            &[json!({"total": 10}), json!({"total": 19.99})],
            &[json!({"total": 20}), json!({"total": 9})],
        );
    }
}

mod membership {
    use super::*;

    #[test]
    fn in_and_nin() {
        let filter = |op: &str| json!({"data": {"currency": {op: ["EUR", "USD", 1, null]}}});
        let listed = [
            json!({"currency": "EUR"}),
            json!({"currency": 1.0}),
            json!({"currency": null}),
        ];
        let unlisted = [
            json!({"currency": "GBP"}),
            json!({"currency": "eur"}),
            json!({"currency": 2}),
        ];
        check(filter("$in"), &listed, &unlisted);
        check(filter("$nin"), &unlisted, &listed);
        assert!(!matches(filter("$in"), json!({})), "$in on a missing field");
        assert!(
            matches(filter("$nin"), json!({})),
            "$nin on a missing field"
        );
    }

    #[test]
    fn in_with_arrays() {
        check(
            json!({"data": {"tags": {"$in": ["vip", ["a", "b"]]}}}),
            &[
                json!({"tags": ["new", "vip"]}),
                json!({"tags": ["a", "b"]}),
                json!({"tags": "vip"}),
            ],
            &[
                json!({"tags": ["a"]}),
                json!({"tags": []}),
                json!({"tags": ["b", "a"]}),
            ],
        );
        check(
            json!({"data": {"tags": {"$nin": ["vip", "blocked"]}}}),
            &[json!({"tags": ["new"]}), json!({"tags": []}), json!({})],
            &[json!({"tags": ["new", "vip"]}), json!({"tags": "blocked"})],
        );
    }

    #[test]
    fn an_empty_in_matches_nothing() {
        assert!(!matches(
            json!({"data": {"x": {"$in": []}}}),
            json!({"x": 1})
        ));
        assert!(matches(
            json!({"data": {"x": {"$nin": []}}}),
            json!({"x": 1})
        ));
    }

    #[test]
    fn exists() {
        check(
            json!({"data": {"x": {"$exists": true}}}),
            &[json!({"x": null}), json!({"x": []}), json!({"x": 0})],
            &[json!({}), json!({"y": 1}), json!(5)],
        );
        check(
            json!({"data": {"x": {"$exists": false}}}),
            &[json!({}), json!("x")],
            &[json!({"x": null})],
        );
        check(
            json!({"data": {"items": {"sku": {"$exists": true}}}}),
            &[json!({"items": [{"qty": 1}, {"sku": "A"}]})],
            &[json!({"items": [{"qty": 1}]}), json!({"items": []})],
        );
    }
}

mod arrays {
    use super::*;

    #[test]
    fn a_test_of_an_array_holds_for_any_element() {
        check(
            json!({"data": {"tags": "vip"}}),
            &[json!({"tags": ["new", "vip"]}), json!({"tags": "vip"})],
            &[
                json!({"tags": ["new"]}),
                json!({"tags": []}),
                json!({"tags": [["vip"]]}),
            ],
        );
        check(
            json!({"data": {"scores": {"$gt": 90}}}),
            &[json!({"scores": [10, 95]})],
            &[json!({"scores": [10, 90]}), json!({"scores": [[95]]})],
        );
    }

    #[test]
    fn paths_descend_through_arrays() {
        let data = json!({"items": [{"sku": "B", "qty": 1}, {"sku": "A1", "qty": 2}]});
        assert!(matches(
            json!({"data": {"items": {"sku": "A1"}}}),
            data.clone()
        ));
        assert!(!matches(
            json!({"data": {"items": {"sku": "C"}}}),
            data.clone()
        ));
        // Each test follows its own path: no `$elemMatch`.
        assert!(matches(
            json!({"data": {"items": {"sku": "A1", "qty": 1}}}),
            data.clone()
        ));
        assert!(matches(
            json!({"data": {"items": {"qty": {"$gte": 2}}}}),
            data
        ));
    }

    #[test]
    fn descent_goes_through_nested_arrays_one_level_at_a_time() {
        let data = json!({"orders": [
            {"items": [{"sku": "A"}, {"sku": "B", "tags": ["x", "y"]}]},
            {"items": [{"sku": "C"}]},
        ]});
        check(
            json!({"data": {"orders": {"items": {"sku": "C"}}}}),
            std::slice::from_ref(&data),
            &[],
        );
        check(
            json!({"data": {"orders": {"items": {"tags": "y"}}}}),
            std::slice::from_ref(&data),
            &[],
        );
        check(
            json!({"data": {"orders": {"items": {"sku": "D"}}}}),
            &[],
            &[data],
        );
        // An array inside an array is not looked into.
        check(
            json!({"data": {"a": {"b": 1}}}),
            &[json!({"a": [{"b": 1}]})],
            &[json!({"a": [[{"b": 1}]]})],
        );
        // Paths have no indexes: "0" is a field name.
        check(
            json!({"data": {"a": {"0": 1}}}),
            &[json!({"a": {"0": 1}})],
            &[json!({"a": [1]})],
        );
    }

    #[test]
    fn negations_hold_when_no_value_passes() {
        let data = json!({"tags": ["new", "vip"], "items": [{"sku": "A"}, {"sku": "B"}]});
        let holds = |filter: Value| matches(filter, data.clone());
        assert!(
            !holds(json!({"data": {"tags": {"$neq": "vip"}}})),
            "a tag is vip"
        );
        assert!(holds(json!({"data": {"tags": {"$neq": "old"}}})));
        assert!(
            !holds(json!({"data": {"items": {"sku": {"$neq": "A"}}}})),
            "an item is A"
        );
        assert!(
            !holds(json!({"data": {"items": {"$not": {"sku": "B"}}}})),
            "an item is B"
        );
        assert!(holds(
            json!({"data": {"items": {"sku": {"$nin": ["C", "D"]}}}})
        ));
        assert!(!holds(
            json!({"data": {"tags": {"$not": {"$in": ["x", "new"]}}}})
        ));
        assert!(
            !holds(json!({"data": {"tags": {"$neq": ["new", "vip"]}}})),
            "the array is equal"
        );
    }
}

mod logic {
    use super::*;

    #[test]
    fn and_or_not_at_the_top_level() {
        let paid = json!({"topic": "order.paid"});
        let big = json!({"data": {"total": {"$gte": 100}}});
        let data = |total: i64| json!({"total": total});
        check(json!({"$and": [paid, big]}), &[data(100)], &[data(99)]);
        check(
            json!({"$or": [{"topic": "other"}, big]}),
            &[data(100)],
            &[data(99)],
        );
        check(json!({"$or": [paid, big]}), &[data(1)], &[]);
        check(json!({"$not": big}), &[data(99), json!({})], &[data(100)]);
        check(json!({"$not": {"$not": big}}), &[data(100)], &[data(99)]);
        check(
            json!({"topic": "order.paid", "$not": {"data": {"x": 1}}}),
            &[json!({"x": 2})],
            &[json!({"x": 1})],
        );
    }

    #[test]
    fn and_or_at_a_field_take_conditions_at_that_field() {
        check(
            json!({"data": {"total": {"$or": [{"$lt": 10}, {"$gt": 1000}]}}}),
            &[json!({"total": 5}), json!({"total": 1001})],
            &[json!({"total": 10}), json!({})],
        );
        check(
            json!({"data": {"$or": [{"type": "a"}, {"kind": "b"}]}}),
            &[json!({"type": "a"}), json!({"kind": "b"})],
            &[json!({"type": "b", "kind": "a"})],
        );
        check(
            json!({"data": {"type": {"$or": ["a", "b"]}}}),
            &[json!({"type": "a"}), json!({"type": "b"})],
            &[json!({"type": "c"})],
        );
        check(
            json!({"data": {"customer": {"$and": [{"tier": "gold"}, {"country": {"$neq": "DE"}}]}}}),
            &[
                json!({"customer": {"tier": "gold", "country": "FR"}}),
                json!({"customer": {"tier": "gold"}}),
            ],
            &[json!({"customer": {"tier": "gold", "country": "DE"}})],
        );
    }

    #[test]
    fn logical_operators_stand_beside_fields_and_value_operators() {
        check(
            json!({"data": {"type": "a", "$or": [{"x": 1}, {"y": 1}]}}),
            &[json!({"type": "a", "y": 1})],
            &[json!({"type": "b", "x": 1}), json!({"type": "a"})],
        );
        check(
            json!({"data": {"total": {"$gte": 1, "$not": {"$eq": 5}}}}),
            &[json!({"total": 4})],
            &[json!({"total": 5}), json!({"total": 0})],
        );
    }

    #[test]
    fn not_takes_an_operator_object_a_plain_value_or_fields() {
        check(
            json!({"data": {"type": {"$not": "a"}}}),
            &[json!({"type": "b"}), json!({})],
            &[json!({"type": "a"})],
        );
        check(
            json!({"data": {"n": {"$not": {"$gt": 5}}}}),
            &[json!({"n": 5}), json!({"n": "9"}), json!({})],
            &[json!({"n": 6})],
        );
        check(
            json!({"data": {"$not": {"type": "a"}}}),
            &[json!({"type": "b"})],
            &[json!({"type": "a"})],
        );
        check(json!({"data": {"$not": 1}}), &[json!(2)], &[json!(1)]);
    }
}

mod topic {
    use super::*;

    fn check_topics(filter: Value, yes: &[&str], no: &[&str]) {
        let compiled = parse(filter.clone());
        for topic in yes {
            assert!(
                compiled.matches(topic, &json!({})),
                "{filter} should match topic {topic}"
            );
        }
        for topic in no {
            assert!(
                !compiled.matches(topic, &json!({})),
                "{filter} should not match topic {topic}"
            );
        }
    }

    #[test]
    fn topic_conditions() {
        check_topics(json!({"topic": "a"}), &["a"], &["b", "a.b"]);
        check_topics(json!({"topic": {"$in": ["a", "b"]}}), &["a", "b"], &["c"]);
        check_topics(json!({"topic": {"$nin": ["a", "b"]}}), &["c"], &["a"]);
        check_topics(json!({"topic": {"$neq": "a"}}), &["b"], &["a"]);
        check_topics(
            json!({"topic": {"$gte": "order.", "$lt": "order/"}}),
            &["order.paid"],
            &["orders", "user.x"],
        );
        check_topics(json!({"topic": {"$exists": true}}), &["a"], &[]);
        check_topics(
            json!({"topic": {"$or": ["a", {"$gt": "x"}]}}),
            &["a", "y"],
            &["b"],
        );
    }

    #[test]
    fn a_topic_is_a_string_and_nothing_else() {
        check_topics(json!({"topic": 1}), &[], &["1"]);
        check_topics(json!({"topic": {"$gt": 1}}), &[], &["2"]);
        check_topics(json!({"topic": {"$eq": ["a"]}}), &[], &["a"]);
        check_topics(json!({"topic": {"$lt": 1}}), &[], &["0"]);
    }

    #[test]
    fn topic_and_data_together() {
        let filter = parse(json!({"topic": "order.paid", "data": {"total": {"$gt": 0}}}));
        assert!(filter.matches("order.paid", &json!({"total": 1})));
        assert!(!filter.matches("order.refunded", &json!({"total": 1})));
        assert!(!filter.matches("order.paid", &json!({"total": 0})));
    }
}

mod errors;
mod laws;
mod serialization;
