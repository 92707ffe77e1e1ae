//! Payload filters: which of the events whose topic a destination receives it receives, by their
//! topic and their data.
//!
//! A destination's `filter` is a JSON object matched against the document
//! `{"topic": <the event's topic>, "data": <the event's payload>}`. [`Filter::parse`] checks it
//! once, when it is set or read back from a store, and compiles it into a tree of tests with the
//! paths already split and the operands already sorted by type. [`Filter::matches`] then runs for
//! every event and destination at publish time, and allocates nothing.
//!
//! # The language
//!
//! ```json
//! {
//!   "topic": {"$in": ["order.paid", "order.refunded"]},
//!   "data": {
//!     "total": {"$gte": 100},
//!     "customer": {"tier": "gold"},
//!     "$or": [{"currency": "EUR"}, {"items": {"sku": "A1"}}]
//!   }
//! }
//! ```
//!
//! A filter is an object of conditions, all of which must hold. Each key of an object is one of:
//!
//! - a **field name**: its value is a condition on that field of the value here. At the top level
//!   the fields are `topic` and `data`, nothing else; the topic is a string and has no fields.
//!   Names are taken literally: `"customer.tier"` is one field with a dot in its name, not a path
//!   (nest objects instead: `{"customer": {"tier": "gold"}}`);
//! - a **value operator**, a test of the value here: `$eq`, `$neq`, `$gt`, `$gte`, `$lt`, `$lte`,
//!   `$in`, `$nin`, `$exists` (see the table below);
//! - a **logical operator**: `$and` and `$or` (a non-empty array of conditions) or `$not` (one).
//!
//! What may stand as a condition is the same at every path:
//!
//! - a JSON value that is not an object means equality: `{"data": {"type": "order.paid"}}`;
//! - an object of field names descends: `{"data": {"customer": {"tier": "gold"}}}`;
//! - an object of value operators tests the value at its path: `{"data": {"total": {"$gte": 100}}}`.
//!   Field names and value operators never share an object, since an object could then mean
//!   either a test or a literal; to match an object or an array as a whole, use `$eq` with it;
//! - logical operators may stand beside either kind, and their conditions apply **at the path of
//!   the object they stand in**: `{"data": {"total": {"$or": [{"$lt": 10}, {"$gt": 1000}]}}}`
//!   tests `data.total` twice, `{"data": {"$or": [{"type": "a"}, {"kind": "b"}]}}` tests
//!   `data.type` or `data.kind`, `{"data": {"type": {"$not": "a"}}}` is `data.type` not equal to
//!   `"a"`. At the top level, where there is no value to compare, they take objects of conditions.
//!
//! An empty object is refused (a condition that says nothing is more likely a mistake than a wish
//! to match everything), and so is an unknown operator (`$regex`, `$elemMatch`): a filter Sheaf
//! does not understand fails when it is set, rather than matching nothing or everything later.
//! A [`FilterError`] names the place it is about as a dotted path, `data.total.$gte` or
//! `$or[1].data.kind`.
//!
//! | operator  | operand                 | true when the value here …                          |
//! |-----------|-------------------------|-----------------------------------------------------|
//! | `$eq`     | any JSON value          | equals it                                           |
//! | `$neq`    | any JSON value          | does not equal it; a missing field does not         |
//! | `$gt`     | a number or a string    | is greater: numbers with numbers, strings bytewise  |
//! | `$gte`    | a number or a string    | is greater or equal                                 |
//! | `$lt`     | a number or a string    | is smaller                                          |
//! | `$lte`    | a number or a string    | is smaller or equal                                 |
//! | `$in`     | an array of JSON values | equals one of them                                  |
//! | `$nin`    | an array of JSON values | equals none of them; a missing field does not       |
//! | `$exists` | `true` or `false`       | is there (`null` is there), or is not               |
//! | `$not`    | a condition             | does not satisfy it                                 |
//!
//! # How a filter is evaluated
//!
//! - **A missing value** (a field that is absent, or a step into something that is not an object)
//!   fails every positive test: equality, order, `$in`, `$exists: true`. A JSON `null` is a value:
//!   `{"x": null}` matches `{"x": null}` and not `{}`; `{"x": {"$exists": false}}` matches `{}`.
//! - **Numbers** compare as `f64`, so `1` and `1.0` are equal, also inside arrays and objects
//!   compared whole. Other values are equal when they are the same JSON.
//! - **Order** (`$gt`, `$gte`, `$lt`, `$lte`) is defined between two numbers and between two
//!   strings (by their UTF-8 bytes, not by a locale: `"B" < "a"`). A value of another type is
//!   neither greater nor smaller: the test is false, not an error.
//! - **Arrays.** A test of a value that is an array holds if it holds for any element:
//!   `{"tags": "vip"}` matches `"tags": ["new", "vip"]`. Equality (`$eq`, `$in`) also holds when
//!   the array equals the operand as a whole: `{"tags": {"$eq": ["new", "vip"]}}`. A path goes
//!   through an array into each element's field: `{"items": {"sku": "A1"}}` matches
//!   `"items": [{"sku": "B"}, {"sku": "A1"}]`. Both go one level deep: the elements of an array
//!   inside an array are not looked at, and paths have no indexes.
//! - **Negation is over all the values a path reaches.** A positive test holds if any of them
//!   passes, and `$neq`, `$nin`, `$exists: false` and `$not` are exactly the negation of that:
//!   `{"tags": {"$neq": "vip"}}` holds when no tag is `"vip"` (or there are no tags), not when some
//!   tag is something else.
//! - **Each test follows its own path.** `{"items": {"sku": "A1", "qty": 2}}` holds when an item
//!   has sku `A1` and an item has quantity 2, not necessarily the same one: there is no
//!   `$elemMatch`.
//!
//! # Limits
//!
//! A filter nests at most [`MAX_DEPTH`] levels of objects and arrays (the literals it compares
//! with included) and holds at most [`MAX_CONDITIONS`] tests, where each value listed in `$in` or
//! `$nin` counts as one; one list holds at most [`MAX_LIST`] values. Each test walks at most the values its path reaches in the event, so a
//! filter, whoever wrote it, costs at most [`MAX_CONDITIONS`] walks of one event's data.
//!
//! `parse.rs` checks and compiles a filter; `eval.rs` holds the compiled tree and evaluates it.

mod eval;
mod parse;
#[cfg(test)]
mod tests;

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The deepest nesting of objects and arrays a filter may have, the top-level object being level
/// one.
///
/// Real filters nest a few levels: the document, `data`, a field or two, an operator. The bound
/// keeps the recursion of parsing and evaluating shallow whatever a tenant sends.
pub const MAX_DEPTH: usize = 32;

/// The most tests a filter may hold, each value of an `$in` or `$nin` counting as one.
///
/// Evaluating a filter costs about one walk of the event's data per test, and runs for every
/// event and destination. On the project's machine (`benches/benches/filter.rs`, 1 KB payload) a
/// test of one field took 32–42 ns and one through a 20-element array 450 ns, so a filter at the
/// bound costs about 10 µs per event and destination if it tests fields and about 115 µs if
/// every test walks such an array; the filters the bench models have one to five tests.
pub const MAX_CONDITIONS: usize = 256;

/// The most values one `$in` or `$nin` may list (they count towards [`MAX_CONDITIONS`] too).
///
/// A bound of its own so that the API's JSON Schema, which cannot add up a filter's tests, can
/// still state exactly the longest list the service takes.
pub const MAX_LIST: usize = 100;

/// A destination's payload filter, parsed and validated.
///
/// It keeps the JSON it was parsed from, which is what it serializes to and what it compares by,
/// and the compiled tree [`Filter::matches`] evaluates. Cloning it is a reference count increment.
#[derive(Clone)]
pub struct Filter(Arc<Compiled>);

struct Compiled {
    source: Value,
    root: eval::Node,
}

impl Filter {
    /// Checks `source` and compiles it; the module documentation describes the language.
    pub fn parse(source: Value) -> std::result::Result<Filter, FilterError> {
        let root = parse::compile(&source)?;
        Ok(Filter(Arc::new(Compiled { source, root })))
    }

    /// The filter as given (what the API returns and stores persist).
    pub fn source(&self) -> &Value {
        &self.0.source
    }

    /// Whether the document `{"topic": topic, "data": data}` satisfies the filter.
    pub fn matches(&self, topic: &str, data: &Value) -> bool {
        self.0.root.matches(topic, data)
    }
}

impl PartialEq for Filter {
    fn eq(&self, other: &Filter) -> bool {
        self.source() == other.source()
    }
}

impl Eq for Filter {}

impl fmt::Debug for Filter {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // `Value`'s `Display` is compact JSON.
        write!(f, "Filter({})", self.source())
    }
}

impl Serialize for Filter {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        self.source().serialize(serializer)
    }
}

impl<'de> Deserialize<'de> for Filter {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let source = Value::deserialize(deserializer)?;
        Filter::parse(source).map_err(serde::de::Error::custom)
    }
}

/// Why a filter was refused: where, and what.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("filter{}{path}: {message}", if .path.is_empty() { "" } else { "." })]
pub struct FilterError {
    /// Where in the filter, as a dotted path with indexes for arrays: `data.total.$gte`,
    /// `$or[1].data.kind`; empty for the filter as a whole.
    pub path: String,
    /// What is wrong there, in lower case.
    pub message: String,
}

impl From<FilterError> for crate::Error {
    fn from(error: FilterError) -> Self {
        crate::Error::invalid_input(error.to_string())
    }
}
