//! A filter serializes as its source and deserializes by parsing it.

use super::*;

#[test]
fn a_filter_serializes_as_its_source() {
    let source =
        json!({"topic": "a", "data": {"total": {"$gte": 1.0}, "$or": [{"x": 1}, {"y": [1, 2]}]}});
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
