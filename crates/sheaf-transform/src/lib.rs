//! Payload transformations: a jq program, compiled once when a destination is saved, that maps
//! each event to the body its receiver gets, may add headers, or drops the event.
#![doc = include_str!("../README.md")]

use std::time::{Duration, Instant};

use jaq_core::load::{Arena, File, Loader};
use jaq_core::{Compiler, Ctx, Native, Vars, data, unwrap_valr};
use jaq_json::Val;
use jaq_std::ValT as _;

#[cfg(feature = "pool")]
pub mod pool;
pub mod runner;
// Without the pool only the runner's half of the protocol is used.
#[cfg_attr(not(feature = "pool"), allow(dead_code))]
mod wire;

/// The data the interpreter runs on: JSON values and the program's own table.
type Data = data::JustLut<Val>;

/// Definitions every program can use besides jq's standard library.
///
/// `with_headers(h)` turns the body in its input into a body with headers: its output is an
/// object only [`Transform::run`] reads, so a body can never be mistaken for one.
const PRELUDE: &str =
    r#"def with_headers($headers): {"__sheaf_body__": ., "__sheaf_headers__": $headers};"#;
const BODY_KEY: &str = "__sheaf_body__";
const HEADERS_KEY: &str = "__sheaf_headers__";

/// The longest program accepted, in bytes: a transformation reshapes one event, and a bound
/// keeps a destination's record small (and the compiler's stack, below, sufficient).
pub const MAX_SOURCE_BYTES: usize = 16 * 1024;

/// The stack of the thread a program is compiled on. jaq's parser and compiler recurse once per
/// level of nesting and per operator of a chain: on a 2 MiB stack, 1,000 nested parentheses or
/// 2,000 terms joined by `+` or `|` overflow it, and an overflow aborts the whole process. The
/// worst shapes within [`MAX_SOURCE_BYTES`] compile on 64 MiB (measured); four times that is
/// reserved, of which only what is touched is ever backed by memory.
const COMPILE_STACK: usize = 256 << 20;

/// A program that did not compile: what is wrong, and where (1-based line and column, counted
/// in characters).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("line {line}, column {column}: {message}")]
pub struct CompileError {
    /// What is wrong, in words.
    pub message: String,
    /// The line of the first error.
    pub line: usize,
    /// The column of the first error.
    pub column: usize,
}

/// Why a run produced nothing to send, each naming what went wrong. A failed run fails the
/// attempt for good: running the same program on the same event again gives the same result.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RunError {
    /// The program raised an error (`error("…")`, `.a.b` of a number, …).
    #[error("the transformation failed: {0}")]
    Failed(String),
    /// It produced more than one value; a delivery sends one body.
    #[error(
        "the transformation produced more than one value; it must produce one (the body) or none (to drop the event)"
    )]
    SeveralValues,
    /// `with_headers` was given something other than an object of strings.
    #[error("the transformation's headers must be an object of strings, got {0}")]
    Headers(String),
    /// The body is larger than the limit.
    #[error("the transformed body is larger than {limit} bytes")]
    TooLarge {
        /// The limit it passed.
        limit: usize,
    },
    /// The run took longer than the limit.
    #[error("the transformation took {took:?}, more than its {limit:?}")]
    TooSlow {
        /// How long it took.
        took: Duration,
        /// The limit it passed.
        limit: Duration,
    },
}

/// What a run made of an event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Output {
    /// Send this body (JSON) with these headers besides the destination's own.
    Send {
        /// The body, serialized JSON.
        body: Vec<u8>,
        /// Headers the program added (`with_headers`), in the order the object gave them.
        headers: Vec<(String, String)>,
    },
    /// The program produced no value (`empty`, a `select` that failed): no delivery.
    Drop,
}

/// The bounds of one run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// The largest body a run may produce.
    pub max_body_bytes: usize,
    /// The longest a run may take. jq has no way to stop an evaluation midway, so a run is
    /// measured as a whole: one that takes longer fails once it ends (see [`Transform::run`]).
    pub max_time: Duration,
}

impl Default for Limits {
    /// 1 MiB and 10 ms.
    fn default() -> Self {
        Self {
            max_body_bytes: 1024 * 1024,
            max_time: Duration::from_millis(10),
        }
    }
}

/// What a program reads: the event as `.` (and as `$event`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event<'a> {
    /// The event's id.
    pub id: &'a str,
    /// Its topic.
    pub topic: &'a str,
    /// Its `data`, serialized JSON as published.
    pub data: &'a [u8],
    /// The tenant it belongs to (`.metadata.tenant_id`).
    pub tenant_id: &'a str,
}

/// A compiled transformation.
pub struct Transform {
    filter: jaq_core::compile::Filter<Native<Data>>,
}

impl std::fmt::Debug for Transform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transform").finish_non_exhaustive()
    }
}

impl Transform {
    /// Parses and compiles `source`, with jq's standard library, `$event` and `with_headers`,
    /// on a thread of its own with a stack large enough for any program of at most
    /// [`MAX_SOURCE_BYTES`] (see `COMPILE_STACK`), so a deeply nested one is compiled or refused,
    /// never a crash.
    pub fn compile(source: &str) -> Result<Self, CompileError> {
        let at_start = |message: String| CompileError {
            message,
            line: 1,
            column: 1,
        };
        if source.len() > MAX_SOURCE_BYTES {
            return Err(at_start(format!(
                "the program is longer than {MAX_SOURCE_BYTES} bytes"
            )));
        }
        let source = source.to_owned();
        std::thread::Builder::new()
            .name("sheaf-transform-compile".to_owned())
            .stack_size(COMPILE_STACK)
            .spawn(move || Self::compile_here(&source))
            .map_err(|e| at_start(format!("cannot start the compiler's thread: {e}")))?
            .join()
            .unwrap_or_else(|_| Err(at_start("the compiler panicked".to_owned())))
    }

    /// [`Transform::compile`] on the caller's thread.
    fn compile_here(source: &str) -> Result<Self, CompileError> {
        let code = format!("{PRELUDE}\n{source}");
        // Positions are reported in the user's source: the prelude is one line before it.
        let at = |part: &str| position(&code, part, PRELUDE.len() + 1);
        let defs = jaq_core::defs()
            .chain(jaq_std::defs())
            .chain(jaq_json::defs());
        // `env` would hand a program the environment of the process running it, secrets
        // included: it does not exist here.
        let funs = jaq_core::funs()
            .chain(jaq_std::funs().filter(|(name, _, _)| *name != "env"))
            .chain(jaq_json::funs());
        let arena = Arena::default();
        let modules = Loader::new(defs)
            .load(
                &arena,
                File {
                    code: &code,
                    path: (),
                },
            )
            .map_err(|errors| {
                let (_, error) = errors.into_iter().next().expect("an error");
                match error {
                    jaq_core::load::Error::Io(e) => {
                        let (part, message) = e.into_iter().next().expect("an error");
                        at(part).with(message)
                    }
                    jaq_core::load::Error::Lex(e) => {
                        let (expect, part) = e.into_iter().next().expect("an error");
                        at(part).with(format!("expected {}", expect.as_str()))
                    }
                    jaq_core::load::Error::Parse(e) => {
                        let (expect, part) = e.into_iter().next().expect("an error");
                        let found = if part.is_empty() {
                            "the end of the program".to_owned()
                        } else {
                            format!("{part:?}")
                        };
                        at(part).with(format!("expected {}, found {found}", expect.as_str()))
                    }
                }
            })?;
        let filter = Compiler::default()
            .with_funs(funs)
            .with_global_vars(["$event"])
            .compile(modules)
            .map_err(|errors| {
                let (_, undefined) = errors.into_iter().next().expect("an error");
                let (part, what) = undefined.into_iter().next().expect("an error");
                at(part).with(format!("undefined {} {part}", what.as_str()))
            })?;
        Ok(Self { filter })
    }

    /// Runs the program on `event`. One value is the body (with the headers of
    /// `with_headers`, if it was used); no value drops the event; more than one, an error, a
    /// body past `limits.max_body_bytes` or a run past `limits.max_time` fail.
    ///
    /// The run happens on the caller's thread and cannot be interrupted: a program that loops
    /// forever keeps the thread. Worse, jaq bounds neither recursion nor the depth of the values
    /// a program builds: `def f: 1 + f; f` recurses until the thread's stack overflows, and a
    /// stack overflow aborts the whole process. **Run programs you do not trust in a process
    /// that may crash**, not in a service's own.
    pub fn run(&self, event: &Event<'_>, limits: &Limits) -> Result<Output, RunError> {
        let started = Instant::now();
        let input = event_value(event)?;
        let ctx = Ctx::<Data>::new(&self.filter.lut, Vars::new([input.clone()]));
        let mut outputs = self.filter.id.run((ctx, input)).map(unwrap_valr);
        let first = outputs.next();
        let second = first.is_some().then(|| outputs.next()).flatten();
        let took = started.elapsed();
        if took > limits.max_time {
            return Err(RunError::TooSlow {
                took,
                limit: limits.max_time,
            });
        }
        let value = match (first, second) {
            (None, _) => return Ok(Output::Drop),
            (Some(_), Some(_)) => return Err(RunError::SeveralValues),
            (Some(Err(e)), None) => {
                // `error("text")` is the text itself; any other error value, as JSON.
                let value = e.into_val();
                let message = match value.as_utf8_bytes() {
                    Some(text) => String::from_utf8_lossy(text).into_owned(),
                    None => value.to_string(),
                };
                return Err(RunError::Failed(message));
            }
            (Some(Ok(value)), None) => value,
        };
        let (body, headers) = split_headers(value)?;
        // Written as bytes, not through `Display` (which checks every string's UTF-8 again).
        let mut body_bytes = Vec::new();
        jaq_json::write::write(&mut body_bytes, &jaq_json::write::Pp::default(), 0, &body)
            .map_err(|e| RunError::Failed(format!("the body cannot be written: {e}")))?;
        let body = body_bytes;
        if body.len() > limits.max_body_bytes {
            return Err(RunError::TooLarge {
                limit: limits.max_body_bytes,
            });
        }
        Ok(Output::Send { body, headers })
    }
}

/// `{"id", "topic", "data", "metadata": {"tenant_id"}}`.
fn event_value(event: &Event<'_>) -> Result<Val, RunError> {
    let data = jaq_json::read::parse_single(event.data)
        .map_err(|e| RunError::Failed(format!("the event's data is not JSON: {e}")))?;
    let text = |s: &str| Val::utf8_str(s.to_owned());
    let object =
        |pairs: Vec<(&str, Val)>| Val::obj(pairs.into_iter().map(|(k, v)| (text(k), v)).collect());
    let metadata = object(vec![("tenant_id", text(event.tenant_id))]);
    Ok(object(vec![
        ("id", text(event.id)),
        ("topic", text(event.topic)),
        ("data", data),
        ("metadata", metadata),
    ]))
}

/// The body and headers of a `with_headers` value, or the value itself as the body.
fn split_headers(value: Val) -> Result<(Val, Vec<(String, String)>), RunError> {
    let Val::Obj(object) = &value else {
        return Ok((value, Vec::new()));
    };
    let key = |k: &str| Val::utf8_str(k.to_owned());
    let (Some(body), Some(headers)) = (object.get(&key(BODY_KEY)), object.get(&key(HEADERS_KEY)))
    else {
        return Ok((value, Vec::new()));
    };
    let Val::Obj(pairs) = headers else {
        return Err(RunError::Headers(headers.to_string()));
    };
    let mut out = Vec::with_capacity(pairs.len());
    for (name, value) in pairs.iter() {
        match (name.as_utf8_bytes(), value.as_utf8_bytes()) {
            (Some(name), Some(value)) => out.push((
                String::from_utf8_lossy(name).into_owned(),
                String::from_utf8_lossy(value).into_owned(),
            )),
            _ => return Err(RunError::Headers(headers.to_string())),
        }
    }
    Ok((body.clone(), out))
}

/// Where `part` (a slice of `code`) starts in the user's source, which begins at byte `skip`.
fn position(code: &str, part: &str, skip: usize) -> Position {
    let start = jaq_core::load::span(code, part).start;
    let before = &code[skip.min(start)..start];
    let line = before.matches('\n').count() + 1;
    let column = before.rsplit('\n').next().unwrap_or("").chars().count() + 1;
    Position { line, column }
}

struct Position {
    line: usize,
    column: usize,
}

impl Position {
    fn with(self, message: impl Into<String>) -> CompileError {
        CompileError {
            message: message.into(),
            line: self.line,
            column: self.column,
        }
    }
}

#[cfg(test)]
mod tests;
