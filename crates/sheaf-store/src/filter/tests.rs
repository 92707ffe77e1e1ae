//! Longer than 600 lines because it holds every case of the language in one place, where a
//! reader checks the module documentation against them: rustfmt gives most cases six lines.
//!
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

mod errors {
    use super::*;

    #[test]
    fn the_top_level_is_an_object_of_topic_data_and_logical_operators() {
        assert_eq!(
            refused(json!({})),
            "filter: a filter needs at least one condition"
        );
        assert_eq!(
            refused(json!("a")),
            "filter: a filter must be an object of conditions, got a string"
        );
        assert_eq!(
            refused(json!([{"topic": "a"}])),
            "filter: a filter must be an object of conditions, got an array"
        );
        assert_eq!(
            refused(json!({"topic": "a", "payload": 1})),
            "filter.payload: unknown field: the document a filter matches has only \"topic\" and \"data\""
        );
        assert_eq!(
            refused(json!({"data.type": "a"})),
            "filter.data.type: unknown field: the document a filter matches has only \"topic\" and \"data\""
        );
        assert_eq!(
            refused(json!({"$eq": {"topic": "a"}})),
            "filter.$eq: tests a value, and the top level is the whole document: put it under \"topic\" or \"data\""
        );
        assert_eq!(
            refused(json!({"$or": ["a"]})),
            "filter.$or[0]: a filter must be an object of conditions, got a string"
        );
        assert_eq!(
            refused(json!({"$not": true})),
            "filter.$not: a filter must be an object of conditions, got a boolean"
        );
        assert_eq!(
            refused(json!({"$and": [{"topic": "a"}, {}]})),
            "filter.$and[1]: a filter needs at least one condition"
        );
    }

    #[test]
    fn unknown_operators_are_named_with_their_path() {
        let list = "the operators are $eq, $neq, $gt, $gte, $lt, $lte, $in, $nin, $exists, $and, $or and $not";
        assert_eq!(
            refused(json!({"data": {"name": {"$regex": "^a"}}})),
            format!("filter.data.name.$regex: unknown operator \"$regex\"; {list}")
        );
        assert_eq!(
            refused(json!({"$foo": 1})),
            format!("filter.$foo: unknown operator \"$foo\"; {list}")
        );
        assert_eq!(
            refused(json!({"$or": [{"topic": "a"}, {"data": {"kind": {"$ne": 1}}}]})),
            format!("filter.$or[1].data.kind.$ne: unknown operator \"$ne\"; {list}")
        );
        assert_eq!(
            refused(json!({"data": {"x": {"$foo": 1, "y": 2}}})),
            format!("filter.data.x.$foo: unknown operator \"$foo\"; {list}")
        );
    }

    #[test]
    fn fields_and_value_operators_do_not_mix() {
        assert_eq!(
            refused(json!({"data": {"total": {"$gte": 100, "currency": "EUR"}}})),
            "filter.data.total: \"$gte\" and the field \"currency\" are in one object: an object holds \
             either operators on the value here or conditions on its fields (to match an object as a \
             whole, use $eq)"
        );
        assert!(
            refused(json!({"topic": {"$eq": "a", "x": 1}}))
                .starts_with("filter.topic: \"$eq\" and the field \"x\"")
        );
    }

    #[test]
    fn empty_objects_are_refused_everywhere() {
        let message =
            "an empty object is no condition; to match an empty object, use {\"$eq\": {}}";
        assert_eq!(
            refused(json!({"data": {}})),
            format!("filter.data: {message}")
        );
        assert_eq!(
            refused(json!({"data": {"meta": {}}})),
            format!("filter.data.meta: {message}")
        );
        assert_eq!(
            refused(json!({"data": {"x": {"$not": {}}}})),
            format!("filter.data.x.$not: {message}")
        );
        assert_eq!(
            refused(json!({"data": {"$or": [1, {}]}})),
            format!("filter.data.$or[1]: {message}")
        );
    }

    #[test]
    fn operands_are_checked() {
        for op in ["$gt", "$gte", "$lt", "$lte"] {
            assert_eq!(
                refused(json!({"data": {"total": {op: true}}})),
                format!("filter.data.total.{op}: needs a number or a string, got a boolean")
            );
        }
        assert_eq!(
            refused(json!({"data": {"x": {"$gt": null}}})),
            "filter.data.x.$gt: needs a number or a string, got null"
        );
        assert_eq!(
            refused(json!({"data": {"x": {"$lt": [1]}}})),
            "filter.data.x.$lt: needs a number or a string, got an array"
        );
        assert_eq!(
            refused(json!({"data": {"x": {"$in": "a"}}})),
            "filter.data.x.$in: needs an array of values, got a string"
        );
        assert_eq!(
            refused(json!({"topic": {"$nin": {"a": 1}}})),
            "filter.topic.$nin: needs an array of values, got an object"
        );
        assert_eq!(
            refused(json!({"data": {"x": {"$exists": 1}}})),
            "filter.data.x.$exists: needs true or false, got a number"
        );
        assert_eq!(
            refused(json!({"$and": []})),
            "filter.$and: needs a non-empty array of conditions, got an empty array"
        );
        assert_eq!(
            refused(json!({"data": {"x": {"$or": {"$eq": 1}}}})),
            "filter.data.x.$or: needs a non-empty array of conditions, got an object"
        );
    }

    #[test]
    fn the_topic_has_no_fields() {
        assert_eq!(
            refused(json!({"topic": {"name": "a"}})),
            "filter.topic.name: the topic is a string: it has no fields"
        );
        assert_eq!(
            refused(json!({"topic": {"$or": ["a", {"x": 1}]}})),
            "filter.topic.$or[1].x: the topic is a string: it has no fields"
        );
    }

    /// `{"data": {"a": {"a": … leaf …}}}` with `leaf` at nesting level `levels`: inside
    /// `levels - 1` objects.
    fn nested(levels: usize, leaf: Value) -> Value {
        let mut value = leaf;
        for _ in 2..levels {
            value = json!({"a": value});
        }
        json!({"data": value})
    }

    #[test]
    fn depth_is_limited() {
        // 32 objects, the deepest holding a number.
        assert!(Filter::parse(nested(MAX_DEPTH + 1, json!(1))).is_ok());
        let path = format!("data{}", ".a".repeat(MAX_DEPTH - 1));
        assert_eq!(
            refused(nested(MAX_DEPTH + 1, json!({"$eq": 1}))),
            format!("filter.{path}: nested deeper than {MAX_DEPTH} levels")
        );
        // Literals count too, and the arrays of $and and $in are levels of their own.
        let too_deep = |leaf: Value| refused(nested(MAX_DEPTH, leaf));
        assert!(Filter::parse(nested(MAX_DEPTH, json!({"$eq": 1}))).is_ok());
        assert!(too_deep(json!({"$eq": [1]})).ends_with(".$eq: nested deeper than 32 levels"));
        assert!(too_deep(json!({"$eq": {"x": 1}})).ends_with(".$eq: nested deeper than 32 levels"));
        assert!(too_deep(json!({"$and": [1]})).ends_with(".$and: nested deeper than 32 levels"));
        assert!(too_deep(json!({"$in": [1]})).ends_with(".$in: nested deeper than 32 levels"));
        assert!(Filter::parse(nested(MAX_DEPTH - 1, json!({"$in": [1]}))).is_ok());
        assert!(
            refused(nested(MAX_DEPTH - 1, json!({"$in": [[1]]})))
                .ends_with(".$in[0]: nested deeper than 32 levels")
        );
        assert!(Filter::parse(nested(MAX_DEPTH - 2, json!({"$and": [{"$eq": 1}]}))).is_ok());
        assert!(
            refused(nested(MAX_DEPTH - 1, json!({"$and": [{"$eq": 1}]})))
                .ends_with(".$and[0]: nested deeper than 32 levels")
        );
        // Far too deep is refused at the same place, without recursing as deep as the input.
        assert_eq!(
            refused(nested(1_000, json!(1))),
            format!("filter.{path}: nested deeper than {MAX_DEPTH} levels")
        );
    }

    #[test]
    fn the_number_of_conditions_is_limited() {
        let conditions = |n: usize| {
            let entries: Vec<Value> = (0..n).map(|i| json!({"data": {"n": i}})).collect();
            json!({"$or": entries})
        };
        assert!(Filter::parse(conditions(MAX_CONDITIONS)).is_ok());
        assert_eq!(
            refused(conditions(MAX_CONDITIONS + 1)),
            format!(
                "filter.$or[{MAX_CONDITIONS}].data.n: more than {MAX_CONDITIONS} conditions (each value \
                 of $in or $nin counts as one)"
            )
        );
        let values = |n: usize| (0..n).map(|i| i.to_string()).collect::<Vec<_>>();
        // One list is bounded on its own.
        assert!(Filter::parse(json!({"topic": {"$in": values(MAX_LIST)}})).is_ok());
        assert_eq!(
            refused(json!({"topic": {"$in": values(MAX_LIST + 1)}})),
            format!(
                "filter.topic.$in: lists at most {MAX_LIST} values, got {}",
                MAX_LIST + 1
            )
        );
        // Lists count towards the whole filter's bound: two full ones and enough tests beside
        // them reach it, one more test is past it.
        let lists = |extra: usize| {
            let mut data = serde_json::Map::new();
            data.insert("a".into(), json!({"$nin": values(MAX_LIST)}));
            for i in 0..extra {
                data.insert(format!("x{i}"), json!(i));
            }
            json!({"topic": {"$in": values(MAX_LIST)}, "data": data})
        };
        let room = MAX_CONDITIONS - 2 * MAX_LIST;
        assert!(Filter::parse(lists(room)).is_ok());
        assert!(refused(lists(room + 1)).contains("more than 256 conditions"));
    }

    #[test]
    fn errors_convert_to_invalid_input() {
        let error = Filter::parse(json!({}))
            .map(|_| ())
            .expect_err("an empty filter");
        assert_eq!(
            error,
            FilterError {
                path: String::new(),
                message: "a filter needs at least one condition".into()
            }
        );
        let error = crate::Error::from(error);
        assert_eq!(error.kind(), ErrorKind::InvalidInput);
        assert_eq!(
            error.to_string(),
            "invalid input: filter: a filter needs at least one condition"
        );
    }
}

mod serialization {
    use super::*;

    #[test]
    fn a_filter_serializes_as_its_source() {
        let source = json!({"topic": "a", "data": {"total": {"$gte": 1.0}, "$or": [{"x": 1}, {"y": [1, 2]}]}});
        let filter = parse(source.clone());
        assert_eq!(filter.source(), &source);
        let text = serde_json::to_string(&filter).expect("a filter serializes");
        assert_eq!(text, source.to_string());
        assert!(text.contains("1.0"), "{text} keeps 1.0 as written");
        let back: Filter = serde_json::from_str(&text).expect("a filter deserializes");
        assert_eq!(back, filter);
        assert_eq!(back.source(), &source);
        assert!(back.matches("a", &json!({"total": 2, "y": [1, 2]})));
        assert!(!back.matches("a", &json!({"total": 2, "y": 1})));
    }

    #[test]
    fn deserializing_checks_the_filter() {
        let error = serde_json::from_str::<Filter>(r#"{"data": {"x": {"$regex": "a"}}}"#)
            .map(|_| ())
            .expect_err("an unknown operator");
        assert!(
            error
                .to_string()
                .starts_with("filter.data.x.$regex: unknown operator \"$regex\""),
            "{error}"
        );
    }

    #[test]
    fn equality_and_debug_are_about_the_source() {
        let a = parse(json!({"data": {"n": 1}}));
        let b = parse(json!({"data": {"n": 1}}));
        // Equivalent, but not written the same.
        let c = parse(json!({"data": {"n": 1.0}}));
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert_eq!(a.clone(), a);
        assert_eq!(format!("{a:?}"), r#"Filter({"data":{"n":1}})"#);
    }
}

/// The negation laws and the equivalences the module documentation promises, over generated
/// conditions and documents. A failure prints the seed; `SHEAF_FILTER_SEED=<seed>` replays it.
mod laws {
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
}
