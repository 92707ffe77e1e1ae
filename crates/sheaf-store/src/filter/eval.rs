//! A compiled filter and its evaluation, which allocates nothing.
//!
//! The tree is a boolean formula whose leaves are tests of one value: the topic, or the values a
//! pre-split path reaches in the data. Negative operators compile to [`Node::Not`] over their
//! positive one, so the "negation is over all the values a path reaches" rule of the module
//! documentation holds by construction.

use std::cmp::Ordering;

use serde_json::Value;

/// A compiled filter or a part of one.
#[derive(Debug)]
pub(super) enum Node {
    /// Every node holds: the keys of one object, or `$and`.
    All(Box<[Node]>),
    /// Some node holds: `$or`.
    Any(Box<[Node]>),
    /// The node does not hold: `$not`, `$neq`, `$nin`, `$exists: false`.
    Not(Box<Node>),
    /// A test of the event's topic.
    Topic(Test),
    /// A test of the values `path` reaches in the event's data (the data itself for `[]`).
    Data { path: Box<[Box<str>]>, test: Test },
}

impl Node {
    pub(super) fn matches(&self, topic: &str, data: &Value) -> bool {
        match self {
            Node::All(nodes) => nodes.iter().all(|node| node.matches(topic, data)),
            Node::Any(nodes) => nodes.iter().any(|node| node.matches(topic, data)),
            Node::Not(node) => !node.matches(topic, data),
            Node::Topic(test) => test.matches_str(topic),
            Node::Data { path, test } => any_at(data, path, test),
        }
    }

    /// Whether this is a test of the topic, the cheapest there is: comparing one short string.
    pub(super) fn is_topic_test(&self) -> bool {
        matches!(self, Node::Topic(_))
    }
}

/// Whether `test` holds for some value `path` reaches from `value`.
///
/// A step into an object takes its field; a step into an array takes the field of each element
/// that is an object. Anything else, or an absent field, reaches nothing.
fn any_at(value: &Value, path: &[Box<str>], test: &Test) -> bool {
    let Some((field, rest)) = path.split_first() else {
        return test.matches(value);
    };
    let field: &str = field;
    match value {
        Value::Object(object) => object
            .get(field)
            .is_some_and(|child| any_at(child, rest, test)),
        Value::Array(items) => items.iter().any(|item| {
            item.as_object()
                .and_then(|object| object.get(field))
                .is_some_and(|child| any_at(child, rest, test))
        }),
        _ => false,
    }
}

/// A test of one value, positive: negative operators are a [`Node::Not`] around one of these.
#[derive(Debug)]
pub(super) enum Test {
    /// `$exists: true`: any value passes.
    Exists,
    /// `$eq`, or a plain value.
    Eq(Operand),
    /// `$in`: equal to one of these.
    In(Box<[Operand]>),
    /// `$gt`, `$gte`, `$lt`, `$lte`: the value compared with the bound.
    Order(Order, Bound),
}

impl Test {
    /// How many conditions this test counts for against [`super::MAX_CONDITIONS`].
    pub(super) fn weight(&self) -> usize {
        match self {
            Test::In(operands) => operands.len().max(1),
            Test::Exists | Test::Eq(_) | Test::Order(..) => 1,
        }
    }

    /// The test of a value in the data; an array passes if it or any element does.
    fn matches(&self, value: &Value) -> bool {
        match self {
            Test::Exists => true,
            Test::Eq(operand) => operand.equals_or_contained(value),
            Test::In(operands) => operands
                .iter()
                .any(|operand| operand.equals_or_contained(value)),
            Test::Order(order, bound) => match value {
                Value::Array(items) => items.iter().any(|item| bound.admits(*order, item)),
                _ => bound.admits(*order, value),
            },
        }
    }

    /// The same test of the topic, a string that is never an array.
    fn matches_str(&self, topic: &str) -> bool {
        match self {
            Test::Exists => true,
            Test::Eq(operand) => operand.equals_str(topic),
            Test::In(operands) => operands.iter().any(|operand| operand.equals_str(topic)),
            Test::Order(order, Bound::String(bound)) => order.admits(topic.cmp(bound)),
            Test::Order(_, Bound::Number(_)) => false,
        }
    }
}

/// Which order comparison a [`Test::Order`] is, with the value on the left: `$gt: 5` is
/// `value > 5`.
#[derive(Debug, Clone, Copy)]
pub(super) enum Order {
    Gt,
    Gte,
    Lt,
    Lte,
}

impl Order {
    fn admits(self, ordering: Ordering) -> bool {
        match self {
            Order::Gt => ordering == Ordering::Greater,
            Order::Gte => ordering != Ordering::Less,
            Order::Lt => ordering == Ordering::Less,
            Order::Lte => ordering != Ordering::Greater,
        }
    }
}

/// The operand of an order comparison: only numbers and strings have an order.
#[derive(Debug)]
pub(super) enum Bound {
    Number(f64),
    String(Box<str>),
}

impl Bound {
    /// Whether `value` stands in `order` to the bound; false for a value of another type.
    fn admits(&self, order: Order, value: &Value) -> bool {
        let ordering = match (self, value) {
            (Bound::Number(bound), Value::Number(number)) => {
                number.as_f64().and_then(|number| number.partial_cmp(bound))
            }
            (Bound::String(bound), Value::String(string)) => Some(string.as_str().cmp(bound)),
            _ => None,
        };
        ordering.is_some_and(|ordering| order.admits(ordering))
    }
}

/// A value to compare for equality, sorted by type when parsed so that the common cases, a
/// number or a string, are one comparison.
#[derive(Debug)]
pub(super) enum Operand {
    Number(f64),
    String(Box<str>),
    /// `null`, a boolean, an array or an object (never a string, and a number only if it has no
    /// `f64` value, which `serde_json` numbers without `arbitrary_precision` always have).
    Other(Value),
}

impl Operand {
    /// Equality with `value`, or with one of its elements if it is an array.
    fn equals_or_contained(&self, value: &Value) -> bool {
        self.equals(value)
            || matches!(value, Value::Array(items) if items.iter().any(|item| self.equals(item)))
    }

    fn equals(&self, value: &Value) -> bool {
        match self {
            Operand::Number(number) => value.as_f64() == Some(*number),
            Operand::String(string) => value.as_str() == Some(string),
            Operand::Other(other) => json_eq(other, value),
        }
    }

    fn equals_str(&self, string: &str) -> bool {
        matches!(self, Operand::String(operand) if **operand == *string)
    }
}

/// JSON equality with numbers compared as `f64`, so that `[1]` equals `[1.0]`.
///
/// The recursion goes no deeper than the shallower of the two values, and the operand is at most
/// [`super::MAX_DEPTH`] deep.
fn json_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(a), Value::Number(b)) => match (a.as_f64(), b.as_f64()) {
            (Some(a), Some(b)) => a == b,
            _ => a == b,
        },
        (Value::Array(a), Value::Array(b)) => {
            a.len() == b.len() && a.iter().zip(b).all(|(a, b)| json_eq(a, b))
        }
        (Value::Object(a), Value::Object(b)) => {
            a.len() == b.len()
                && a.iter()
                    .all(|(key, a)| b.get(key).is_some_and(|b| json_eq(a, b)))
        }
        _ => a == b,
    }
}
