//! Every refusal, with the path and the message it names.

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
    let list =
        "the operators are $eq, $neq, $gt, $gte, $lt, $lte, $in, $nin, $exists, $and, $or and $not";
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
    let message = "an empty object is no condition; to match an empty object, use {\"$eq\": {}}";
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
