//! Checking a filter's JSON and compiling it into a [`Node`] tree.
//!
//! The parser walks the JSON once, keeping the dotted path of where it is for its errors and a
//! count of the tests so far for [`MAX_CONDITIONS`]. Every level it enters is checked against
//! [`MAX_DEPTH`] before it recurses, so a hostile filter cannot exhaust the stack here either.

use std::fmt::Write as _;

use serde_json::{Map, Value};

use super::eval::{Bound, Node, Operand, Order, Test};
use super::{FilterError, MAX_CONDITIONS, MAX_DEPTH, MAX_LIST};

/// Compiles a whole filter.
pub(super) fn compile(source: &Value) -> Result<Node, FilterError> {
    let mut parser = Parser {
        path: String::new(),
        conditions: 0,
    };
    parser.condition(&Place::Root, source, 1)
}

/// The value operators, for the error that lists them.
const VALUE_OPERATORS: [&str; 9] = [
    "$eq", "$neq", "$gt", "$gte", "$lt", "$lte", "$in", "$nin", "$exists",
];

/// Where a condition applies.
enum Place {
    /// The document `{"topic": …, "data": …}` itself: only fields and logical operators.
    Root,
    /// The topic, a string.
    Topic,
    /// The values this path reaches in the data (the data itself for `[]`).
    Data(Vec<Box<str>>),
}

struct Parser {
    /// Where the parser is, in the form [`FilterError::path`] reports.
    path: String,
    /// The tests compiled so far, weighted as [`Test::weight`] says.
    conditions: usize,
}

impl Parser {
    fn error(&self, message: impl Into<String>) -> FilterError {
        FilterError {
            path: self.path.clone(),
            message: message.into(),
        }
    }

    /// Runs `parse` with `.key` added to the path.
    fn at_key<T>(
        &mut self,
        key: &str,
        parse: impl FnOnce(&mut Self) -> Result<T, FilterError>,
    ) -> Result<T, FilterError> {
        let len = self.path.len();
        if len > 0 {
            self.path.push('.');
        }
        self.path.push_str(key);
        let result = parse(self);
        self.path.truncate(len);
        result
    }

    /// Runs `parse` with `[index]` added to the path.
    fn at_index<T>(
        &mut self,
        index: usize,
        parse: impl FnOnce(&mut Self) -> Result<T, FilterError>,
    ) -> Result<T, FilterError> {
        let len = self.path.len();
        // Writing to a `String` cannot fail.
        let _ = write!(self.path, "[{index}]");
        let result = parse(self);
        self.path.truncate(len);
        result
    }

    /// Refuses an object or an array at nesting level `depth` (the top-level object is level one)
    /// if that is too deep.
    fn check_depth(&self, depth: usize) -> Result<(), FilterError> {
        if depth > MAX_DEPTH {
            return Err(self.error(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(())
    }

    /// A condition at `place`: the value of a field, the operand of `$not`, an entry of `$and` or
    /// `$or`, or the whole filter. `depth` is the nesting level of `value` if it is an object.
    fn condition(
        &mut self,
        place: &Place,
        value: &Value,
        depth: usize,
    ) -> Result<Node, FilterError> {
        match (value, place) {
            (Value::Object(object), _) => {
                self.check_depth(depth)?;
                self.object(place, object, depth)
            }
            (_, Place::Root) => Err(self.error(format!(
                "a filter must be an object of conditions, got {}",
                kind(value)
            ))),
            _ => {
                let test = Test::Eq(self.operand(value, depth)?);
                self.leaf(place, test)
            }
        }
    }

    /// An object of conditions at `place`, at nesting level `depth`.
    fn object(
        &mut self,
        place: &Place,
        object: &Map<String, Value>,
        depth: usize,
    ) -> Result<Node, FilterError> {
        if object.is_empty() {
            return Err(self.error(match place {
                Place::Root => "a filter needs at least one condition",
                Place::Topic | Place::Data(_) => {
                    "an empty object is no condition; to match an empty object, use {\"$eq\": {}}"
                }
            }));
        }
        // Unknown operators first: a misspelt operator next to a field is a typo, not a mix.
        if let Some(key) = object.keys().find(|key| {
            key.starts_with('$')
                && !VALUE_OPERATORS.contains(&key.as_str())
                && !matches!(key.as_str(), "$and" | "$or" | "$not")
        }) {
            return self.at_key(key, |parser| Err(parser.unknown_operator(key)));
        }
        if !matches!(place, Place::Root) {
            let operator = object
                .keys()
                .find(|key| VALUE_OPERATORS.contains(&key.as_str()));
            let field = object.keys().find(|key| !key.starts_with('$'));
            if let (Some(operator), Some(field)) = (operator, field) {
                return Err(self.error(format!(
                    "{operator:?} and the field {field:?} are in one object: an object holds either \
                     operators on the value here or conditions on its fields (to match an object \
                     as a whole, use $eq)"
                )));
            }
        }
        let mut nodes = Vec::with_capacity(object.len());
        for (key, value) in object {
            let node = self.at_key(key, |parser| match key.as_str() {
                "$and" => Ok(all(parser.entries(place, value, depth + 1)?)),
                "$or" => Ok(any(parser.entries(place, value, depth + 1)?)),
                "$not" => Ok(negate(parser.condition(place, value, depth + 1)?)),
                operator if operator.starts_with('$') => {
                    parser.operator(place, operator, value, depth + 1)
                }
                field => parser.field(place, field, value, depth + 1),
            })?;
            nodes.push(node);
        }
        Ok(all(nodes))
    }

    /// The entries of `$and` or `$or` at `place`; `depth` is the nesting level of the array.
    fn entries(
        &mut self,
        place: &Place,
        value: &Value,
        depth: usize,
    ) -> Result<Vec<Node>, FilterError> {
        self.check_depth(depth)?;
        let entries = match value {
            Value::Array(entries) if !entries.is_empty() => entries,
            _ => {
                return Err(self.error(format!(
                    "needs a non-empty array of conditions, got {}",
                    kind(value)
                )));
            }
        };
        entries
            .iter()
            .enumerate()
            .map(|(index, entry)| {
                self.at_index(index, |parser| parser.condition(place, entry, depth + 1))
            })
            .collect()
    }

    /// The condition `value` on the field `name` of what `place` is about.
    fn field(
        &mut self,
        place: &Place,
        name: &str,
        value: &Value,
        depth: usize,
    ) -> Result<Node, FilterError> {
        let inner = match place {
            Place::Root => match name {
                "topic" => Place::Topic,
                "data" => Place::Data(Vec::new()),
                _ => {
                    return Err(self.error(
                        "unknown field: the document a filter matches has only \"topic\" and \"data\"",
                    ));
                }
            },
            Place::Topic => return Err(self.error("the topic is a string: it has no fields")),
            Place::Data(path) => {
                let mut path = path.clone();
                path.push(name.into());
                Place::Data(path)
            }
        };
        self.condition(&inner, value, depth)
    }

    /// The value operator `operator` with its operand `value`, at nesting level `depth`.
    fn operator(
        &mut self,
        place: &Place,
        operator: &str,
        value: &Value,
        depth: usize,
    ) -> Result<Node, FilterError> {
        if matches!(place, Place::Root) {
            return Err(self.error(
                "tests a value, and the top level is the whole document: put it under \"topic\" or \
                 \"data\"",
            ));
        }
        let (test, negated) = match operator {
            "$eq" => (Test::Eq(self.operand(value, depth)?), false),
            "$neq" => (Test::Eq(self.operand(value, depth)?), true),
            "$gt" => (Test::Order(Order::Gt, self.bound(value)?), false),
            "$gte" => (Test::Order(Order::Gte, self.bound(value)?), false),
            "$lt" => (Test::Order(Order::Lt, self.bound(value)?), false),
            "$lte" => (Test::Order(Order::Lte, self.bound(value)?), false),
            "$in" => (Test::In(self.operands(value, depth)?), false),
            "$nin" => (Test::In(self.operands(value, depth)?), true),
            "$exists" => match value {
                Value::Bool(exists) => (Test::Exists, !exists),
                _ => {
                    return Err(self.error(format!("needs true or false, got {}", kind(value))));
                }
            },
            _ => return Err(self.unknown_operator(operator)),
        };
        let node = self.leaf(place, test)?;
        Ok(if negated { negate(node) } else { node })
    }

    fn unknown_operator(&self, operator: &str) -> FilterError {
        self.error(format!(
            "unknown operator {operator:?}; the operators are {}, $and, $or and $not",
            VALUE_OPERATORS.join(", ")
        ))
    }

    /// The test `test` of what `place` is about, counted against [`MAX_CONDITIONS`].
    fn leaf(&mut self, place: &Place, test: Test) -> Result<Node, FilterError> {
        self.conditions += test.weight();
        if self.conditions > MAX_CONDITIONS {
            return Err(self.error(format!(
                "more than {MAX_CONDITIONS} conditions (each value of $in or $nin counts as one)"
            )));
        }
        match place {
            Place::Topic => Ok(Node::Topic(test)),
            Place::Data(path) => Ok(Node::Data {
                path: path.clone().into_boxed_slice(),
                test,
            }),
            // `condition` and `operator` refuse tests at the top level before they get here.
            Place::Root => Err(self.error("a filter must be an object of conditions")),
        }
    }

    /// A value to compare for equality, at nesting level `depth` if it is an array or an object.
    fn operand(&self, value: &Value, depth: usize) -> Result<Operand, FilterError> {
        // Containers are refused before `depth` passes `MAX_DEPTH + 1`, so this never saturates.
        if nests_deeper_than(value, (MAX_DEPTH + 1).saturating_sub(depth)) {
            return Err(self.error(format!("nested deeper than {MAX_DEPTH} levels")));
        }
        Ok(match value {
            Value::Number(number) => match number.as_f64() {
                Some(number) => Operand::Number(number),
                None => Operand::Other(value.clone()),
            },
            Value::String(string) => Operand::String(string.as_str().into()),
            _ => Operand::Other(value.clone()),
        })
    }

    /// The operand of `$in` or `$nin`, at nesting level `depth`.
    fn operands(&mut self, value: &Value, depth: usize) -> Result<Box<[Operand]>, FilterError> {
        let Value::Array(values) = value else {
            return Err(self.error(format!("needs an array of values, got {}", kind(value))));
        };
        if values.len() > MAX_LIST {
            return Err(self.error(format!(
                "lists at most {MAX_LIST} values, got {}",
                values.len()
            )));
        }
        self.check_depth(depth)?;
        values
            .iter()
            .enumerate()
            .map(|(index, value)| self.at_index(index, |parser| parser.operand(value, depth + 1)))
            .collect()
    }

    /// The operand of an order comparison.
    fn bound(&self, value: &Value) -> Result<Bound, FilterError> {
        match value {
            Value::Number(number) => number.as_f64().map(Bound::Number),
            Value::String(string) => Some(Bound::String(string.as_str().into())),
            _ => None,
        }
        .ok_or_else(|| self.error(format!("needs a number or a string, got {}", kind(value))))
    }
}

/// Whether `value` has more than `levels` levels of arrays and objects (a scalar has none).
fn nests_deeper_than(value: &Value, levels: usize) -> bool {
    match value {
        Value::Array(items) => {
            levels == 0 || items.iter().any(|v| nests_deeper_than(v, levels - 1))
        }
        Value::Object(object) => {
            levels == 0 || object.values().any(|v| nests_deeper_than(v, levels - 1))
        }
        _ => false,
    }
}

/// The conjunction of `nodes`, with the topic tests first: they are the cheapest, and a topic
/// decides most non-matches.
fn all(mut nodes: Vec<Node>) -> Node {
    if nodes.len() == 1 {
        return nodes.remove(0);
    }
    nodes.sort_by_key(|node| !node.is_topic_test());
    Node::All(nodes.into_boxed_slice())
}

fn any(mut nodes: Vec<Node>) -> Node {
    if nodes.len() == 1 {
        return nodes.remove(0);
    }
    Node::Any(nodes.into_boxed_slice())
}

/// The negation of `node`, without a double negation (`$not` of `$neq` is `$eq`).
fn negate(node: Node) -> Node {
    match node {
        Node::Not(inner) => *inner,
        node => Node::Not(Box::new(node)),
    }
}

/// The JSON type of `value`, with its article, for errors.
fn kind(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(items) if items.is_empty() => "an empty array",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}
