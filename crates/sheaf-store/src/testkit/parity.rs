//! The parity property: a batched latest-attempt lookup returns exactly what single lookups
//! would (the claim that lets retries share one lookup without changing any answer), for any
//! history and any key set.
//!
//! Each case generates a small history (two tenants that share event ids and destination ids,
//! attempts at random times on a minute grid with microsecond edges, ties, rows duplicated within
//! one `insert_many` call and across calls) and a key set (keys exactly at, one microsecond
//! either side of, and minutes around attempt times; keys for absent tenants, events and
//! destinations; repeated keys). It writes the history through [`LogStore::insert_many`] only,
//! so append-only stores run it too, then checks that
//!
//! 1. `latest_attempts(keys)` equals the reference model ([`super::model`]),
//! 2. `latest_attempt(key)` equals the model for every distinct key, and
//! 3. every extra [`ParityLookup`] (e.g. a `LookupCoalescer` in front of the store, with batch
//!    sizes chosen from the case's random `variant`) equals the model.
//!
//! Histories stay at tens of rows because real databases run this. Key times span about 55
//! minutes, so a 15-minute split rule has something to split.
//!
//! # Running and replaying
//!
//! [`run`] drives proptest's `TestRunner` by hand inside the async function: values are generated
//! and shrunk synchronously, and the store is awaited between them. Nothing blocks a runtime
//! thread and no runtime is nested, so it works under any tokio flavour. The case budget and the
//! seed come from [`ParityConfig`]; a failure panics with its RNG seed, the case number and the
//! shrunk scenario, and `SHEAF_PARITY_SEED=<seed>` replays the same sequence of cases.
//!
//! Longer than 600 lines because the generators, the scenario they build, the reference
//! comparison and the runner that shrinks and replays a failure are one property, read together.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};
use rand::Rng;
use serde_json::json;

use super::model;
use crate::{
    Attempt, AttemptId, AttemptKey, AttemptStatus, AttemptTrigger, DestinationId, Event, EventId,
    LogStore, Payload, Result, TenantId, Timestamp,
};

/// The number of cases when `SHEAF_PARITY_CASES` is not set: enough to catch each broken variant
/// tried against the memory backend many times over, few enough for a real database.
pub const DEFAULT_CASES: u32 = 48;
/// How many extra runs shrinking may spend on a failure (each one writes a new history).
pub const DEFAULT_MAX_SHRINK_ITERS: u32 = 128;

/// Case budget and seed of a parity run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParityConfig {
    /// How many generated cases to check.
    pub cases: u32,
    /// The RNG seed of the case generator: the same value generates the same cases.
    pub seed: u64,
    /// How many extra runs shrinking may spend on a failure.
    pub max_shrink_iters: u32,
}

impl ParityConfig {
    /// [`DEFAULT_CASES`] cases from a random seed.
    pub fn new() -> Self {
        ParityConfig {
            cases: DEFAULT_CASES,
            seed: rand::rng().random(),
            max_shrink_iters: DEFAULT_MAX_SHRINK_ITERS,
        }
    }

    /// [`ParityConfig::new`], overridden by `SHEAF_PARITY_CASES` (a number) and
    /// `SHEAF_PARITY_SEED` (hex, with or without `0x`, as printed by a failure).
    ///
    /// # Panics
    ///
    /// If either variable is set to something that does not parse: a replay with a mistyped seed
    /// must not silently run other cases.
    pub fn from_env() -> Self {
        let mut config = Self::new();
        if let Ok(cases) = std::env::var("SHEAF_PARITY_CASES") {
            config.cases = cases
                .trim()
                .parse()
                .unwrap_or_else(|e| panic!("SHEAF_PARITY_CASES={cases:?} is not a number: {e}"));
        }
        if let Ok(seed) = std::env::var("SHEAF_PARITY_SEED") {
            let digits = seed.trim().trim_start_matches("0x");
            config.seed = u64::from_str_radix(digits, 16)
                .unwrap_or_else(|e| panic!("SHEAF_PARITY_SEED={seed:?} is not a hex number: {e}"));
        }
        config
    }
}

impl Default for ParityConfig {
    fn default() -> Self {
        Self::new()
    }
}

/// Another way of answering latest-attempt keys that must agree with the model, such as a
/// `LookupCoalescer` in front of the store.
///
/// ```text
/// struct ThroughCoalescer;
///
/// #[async_trait]
/// impl ParityLookup for ThroughCoalescer {
///     fn name(&self) -> String { "LookupCoalescer".into() }
///     async fn lookup(&self, store: Arc<dyn LogStore>, keys: Vec<AttemptKey>, variant: u64)
///         -> Result<HashMap<AttemptKey, Attempt>>
///     {
///         // Pick the batch size (and anything else) from `variant`, so a failure replays.
///         let coalescer = LookupCoalescer::new(batch_size_from(variant), split_at_15_minutes, store);
///         let answers = join_all(keys.iter().map(|k| coalescer.lookup(k.clone()))).await;
///         // Collect the `Some` answers into a map keyed by key; return the first error.
///     }
/// }
///
/// parity::run(store, &ParityConfig::from_env(), &[&ThroughCoalescer]).await;
/// ```
#[async_trait]
pub trait ParityLookup: Send + Sync {
    /// A name for failure messages.
    fn name(&self) -> String;

    /// Answers every key: an entry for each key with a latest attempt, none for the others.
    /// `variant` is a random number drawn with the case (so it replays with the run's seed) for the
    /// lookup to choose batch sizes, orders or delays from.
    async fn lookup(
        &self,
        store: Arc<dyn LogStore>,
        keys: Vec<AttemptKey>,
        variant: u64,
    ) -> Result<HashMap<AttemptKey, Attempt>>;
}

/// Tenants with attempts; key specs may also name one more, which has none.
const TENANTS: usize = 2;
/// Event ids per tenant with attempts (the same ids in each tenant); keys may name one more.
const EVENTS: usize = 2;
/// Destinations with attempts (the same ids in each tenant); keys may name one more.
const DESTINATIONS: usize = 2;
/// Attempt times fall on this many minutes after the run's base time.
const MINUTES: i64 = 40;
/// How many `insert_many` calls a history is written in.
const INSERT_CALLS: usize = 3;

/// Where within its minute a time falls: the microsecond edges are where truncation and `>=`
/// versus `>` bugs show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Jitter {
    /// On the minute.
    None,
    /// One microsecond past it.
    OneMicro,
    /// One microsecond short of the next second.
    AlmostSecond,
}

impl Jitter {
    fn micros(self) -> i64 {
        match self {
            Jitter::None => 0,
            Jitter::OneMicro => 1,
            Jitter::AlmostSecond => 999_999,
        }
    }
}

/// When a generated attempt happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TimeSpec {
    /// `minute` minutes after the base time, plus the jitter.
    Minute(i64, Jitter),
    /// The same time as an earlier attempt of the history (index modulo its position), so that
    /// ties happen.
    SameAsEarlier(usize),
}

/// One generated attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AttemptSpec {
    /// Index of its tenant.
    pub tenant: usize,
    /// Index of its event within the tenant.
    pub event: usize,
    /// Index of its destination.
    pub destination: usize,
    /// When it happened.
    pub time: TimeSpec,
    /// Whether it succeeded.
    pub success: bool,
    /// Which `insert_many` call writes each copy of the row; two copies in one call are a
    /// duplicate within the call.
    pub copies: Vec<usize>,
}

/// How a key's bound relates to the attempt it was made from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shift {
    /// Exactly the attempt's time: the carried time of a retry.
    Exact,
    /// One microsecond before it.
    MicroBefore,
    /// One microsecond after it.
    MicroAfter,
    /// Whole minutes before (negative) or after it.
    Minutes(i64),
}

/// One generated key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KeySpec {
    /// The triple of a history attempt (index modulo the history's length) with a bound near its
    /// time.
    FromAttempt(usize, Shift),
    /// Any triple, including the tenant, event or destination no attempt has, with a bound on the
    /// minute grid (possibly before or after every attempt).
    Free {
        /// Index of the tenant (`TENANTS` is one without attempts).
        tenant: usize,
        /// Index of the event (`EVENTS` is one without attempts).
        event: usize,
        /// Index of the destination (`DESTINATIONS` is one without attempts).
        destination: usize,
        /// Minutes after the base time.
        minute: i64,
        /// Where within the minute.
        jitter: Jitter,
    },
    /// The same key as an earlier one (index modulo its position).
    Repeat(usize),
}

/// One generated case: a history, a key set, and a random number for extra lookups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scenario {
    /// The attempts, in generation order.
    pub attempts: Vec<AttemptSpec>,
    /// The keys, in the order they are asked.
    pub keys: Vec<KeySpec>,
    /// Passed to every [`ParityLookup`].
    pub variant: u64,
}

fn jitter() -> impl Strategy<Value = Jitter, Tree: Send> {
    prop_oneof![
        Just(Jitter::None),
        Just(Jitter::OneMicro),
        Just(Jitter::AlmostSecond)
    ]
}

fn time_spec() -> impl Strategy<Value = TimeSpec, Tree: Send> {
    prop_oneof![
        4 => (0..MINUTES, jitter()).prop_map(|(minute, jitter)| TimeSpec::Minute(minute, jitter)),
        1 => (0..64usize).prop_map(TimeSpec::SameAsEarlier),
    ]
}

fn attempt_spec() -> impl Strategy<Value = AttemptSpec, Tree: Send> {
    (
        0..TENANTS,
        0..EVENTS,
        0..DESTINATIONS,
        time_spec(),
        any::<bool>(),
        prop::collection::vec(0..INSERT_CALLS, 1..=3),
    )
        .prop_map(
            |(tenant, event, destination, time, success, copies)| AttemptSpec {
                tenant,
                event,
                destination,
                time,
                success,
                copies,
            },
        )
}

fn shift() -> impl Strategy<Value = Shift, Tree: Send> {
    prop_oneof![
        3 => Just(Shift::Exact),
        1 => Just(Shift::MicroBefore),
        1 => Just(Shift::MicroAfter),
        2 => (-20..=20i64).prop_map(Shift::Minutes),
    ]
}

fn key_spec() -> impl Strategy<Value = KeySpec, Tree: Send> {
    prop_oneof![
        5 => (0..64usize, shift()).prop_map(|(attempt, shift)| KeySpec::FromAttempt(attempt, shift)),
        3 => (0..=TENANTS, 0..=EVENTS, 0..=DESTINATIONS, -5..MINUTES + 10, jitter()).prop_map(
            |(tenant, event, destination, minute, jitter)| KeySpec::Free {
                tenant,
                event,
                destination,
                minute,
                jitter,
            }
        ),
        1 => (0..64usize).prop_map(KeySpec::Repeat),
    ]
}

/// The generator of [`Scenario`]s.
pub fn scenario() -> impl Strategy<Value = Scenario, Tree: Send> {
    (
        prop::collection::vec(attempt_spec(), 0..=24),
        prop::collection::vec(key_spec(), 1..=20),
        any::<u64>(),
    )
        .prop_map(|(attempts, keys, variant)| Scenario {
            attempts,
            keys,
            variant,
        })
}

impl fmt::Display for TimeSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            TimeSpec::Minute(minute, jitter) => {
                write!(f, "minute {minute} + {}µs", jitter.micros())
            }
            TimeSpec::SameAsEarlier(index) => {
                write!(f, "same time as earlier #{index} (mod position)")
            }
        }
    }
}

impl fmt::Display for Scenario {
    /// One line per attempt and key, in the scenario's own terms (indexes of tenants, events and
    /// destinations, minutes after the base time), for failure messages.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "attempts:")?;
        for (i, a) in self.attempts.iter().enumerate() {
            let status = if a.success { "success" } else { "failed" };
            writeln!(
                f,
                "  #{i}: t{} e{} d{} at {}, {status}, written in calls {:?}",
                a.tenant, a.event, a.destination, a.time, a.copies
            )?;
        }
        writeln!(f, "keys:")?;
        for (i, k) in self.keys.iter().enumerate() {
            match k {
                KeySpec::FromAttempt(index, shift) => {
                    writeln!(f, "  #{i}: attempt #{index} (mod length), bound {shift:?}")?
                }
                KeySpec::Free {
                    tenant,
                    event,
                    destination,
                    minute,
                    jitter,
                } => writeln!(
                    f,
                    "  #{i}: t{tenant} e{event} d{destination}, bound minute {minute} + {}µs",
                    jitter.micros()
                )?,
                KeySpec::Repeat(index) => {
                    writeln!(f, "  #{i}: repeat of key #{index} (mod position)")?
                }
            }
        }
        write!(f, "variant: {}", self.variant)
    }
}

/// Per-run state: a random prefix so that runs sharing a store never meet, a counter so that
/// every check (shrinking included) writes to tenants of its own, and the base time.
struct RunContext {
    prefix: String,
    checks: AtomicU64,
    base: Timestamp,
}

impl RunContext {
    fn new() -> Self {
        let prefix = format!("parity-{:08x}", rand::rng().random::<u32>());
        // Two hours ago on a whole minute: inside any retention bound, and every generated time
        // (up to 55 minutes later) is in the past.
        let two_hours_ago = Timestamp::now().as_micros() - 2 * 3600 * 1_000_000;
        let base = Timestamp::from_micros(two_hours_ago - two_hours_ago.rem_euclid(60_000_000))
            .expect("now is in range");
        RunContext {
            prefix,
            checks: AtomicU64::new(0),
            base,
        }
    }
}

/// A scenario made concrete: records to write, in calls, and the keys to ask.
struct Built {
    inserts: Vec<(Vec<Event>, Vec<Attempt>)>,
    history: Vec<Attempt>,
    keys: Vec<AttemptKey>,
}

fn at(base: Timestamp, minute: i64, jitter_micros: i64) -> Timestamp {
    Timestamp::from_micros(base.as_micros() + minute * 60_000_000 + jitter_micros)
        .expect("generated times are in range")
}

fn build(ctx: &RunContext, scenario: &Scenario) -> Built {
    let check = ctx.checks.fetch_add(1, Ordering::Relaxed);
    let tenants: Vec<TenantId> = (0..=TENANTS)
        .map(|t| TenantId::new(format!("{}-{check}-t{t}", ctx.prefix)).expect("valid tenant id"))
        .collect();
    let event_ids: Vec<EventId> = (0..=EVENTS)
        .map(|e| EventId::new(format!("e{e}")).expect("valid event id"))
        .collect();
    let destinations: Vec<DestinationId> = (0..=DESTINATIONS)
        .map(|_| DestinationId::generate())
        .collect();
    // The payload names its tenant and event, so a cross-matched attempt never compares equal.
    let events: Vec<Vec<Event>> = (0..TENANTS)
        .map(|t| {
            (0..EVENTS)
                .map(|e| Event {
                    tenant_id: tenants[t].clone(),
                    id: event_ids[e].clone(),
                    topic: format!("parity.topic{e}"),
                    time: ctx.base,
                    data: Payload::new(json!({"tenant": t, "event": e, "check": check})),
                    // Half the events were published traced: the context rides along.
                    trace: (e % 2 == 0)
                        .then(|| crate::testkit::fixtures::trace_context(t * EVENTS + e)),
                })
                .collect()
        })
        .collect();

    let mut inserts: Vec<(Vec<Event>, Vec<Attempt>)> = vec![(Vec::new(), Vec::new()); INSERT_CALLS];
    // Every event goes in the first call, and again in the second: events are idempotent too.
    inserts[0].0 = events.iter().flatten().cloned().collect();
    inserts[1].0 = inserts[0].0.clone();

    let mut history: Vec<Attempt> = Vec::with_capacity(scenario.attempts.len());
    for (index, spec) in scenario.attempts.iter().enumerate() {
        let time = match spec.time {
            TimeSpec::Minute(minute, jitter) => at(ctx.base, minute, jitter.micros()),
            TimeSpec::SameAsEarlier(_) if index == 0 => ctx.base,
            TimeSpec::SameAsEarlier(earlier) => history[earlier % index].time,
        };
        let event = &events[spec.tenant][spec.event];
        let attempt = Attempt {
            tenant_id: event.tenant_id.clone(),
            id: AttemptId::generate(),
            event_id: event.id.clone(),
            destination_id: destinations[spec.destination],
            number: u32::try_from(index + 1).unwrap_or(u32::MAX),
            time,
            status: if spec.success {
                AttemptStatus::Success
            } else {
                AttemptStatus::Failed
            },
            trigger: AttemptTrigger::Scheduled,
            response_code: Some(if spec.success { 200 } else { 500 }),
            duration_ms: 5,
            response_body: None,
            error: None,
            event_topic: event.topic.clone(),
            event_data: event.data.clone(),
            event_trace: event.trace.clone(),
        };
        for &call in &spec.copies {
            inserts[call].1.push(attempt.clone());
        }
        history.push(attempt);
    }

    let mut keys: Vec<AttemptKey> = Vec::with_capacity(scenario.keys.len());
    for spec in &scenario.keys {
        let free = |tenant: usize, event: usize, destination: usize, time: Timestamp| AttemptKey {
            tenant_id: tenants[tenant].clone(),
            event_id: event_ids[event].clone(),
            destination_id: destinations[destination],
            attempt_time: time,
        };
        let key = match *spec {
            KeySpec::FromAttempt(_, _) if history.is_empty() => free(0, 0, 0, ctx.base),
            KeySpec::FromAttempt(index, shift) => {
                let attempt = &history[index % history.len()];
                let delta = match shift {
                    Shift::Exact => 0,
                    Shift::MicroBefore => -1,
                    Shift::MicroAfter => 1,
                    Shift::Minutes(minutes) => minutes * 60_000_000,
                };
                AttemptKey {
                    attempt_time: at(attempt.time, 0, delta),
                    ..attempt.key()
                }
            }
            KeySpec::Free {
                tenant,
                event,
                destination,
                minute,
                jitter,
            } => free(
                tenant,
                event,
                destination,
                at(ctx.base, minute, jitter.micros()),
            ),
            KeySpec::Repeat(_) if keys.is_empty() => free(0, 0, 0, ctx.base),
            KeySpec::Repeat(index) => keys[index % keys.len()].clone(),
        };
        keys.push(key);
    }
    Built {
        inserts,
        history,
        keys,
    }
}

/// A key, short enough for a failure message.
struct ShowKey<'a>(&'a AttemptKey);

impl fmt::Display for ShowKey<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let k = self.0;
        write!(
            f,
            "({}, {}, {}, >= {})",
            k.tenant_id, k.event_id, k.destination_id, k.attempt_time
        )
    }
}

fn show(attempt: Option<&Attempt>) -> String {
    match attempt {
        None => "none".to_owned(),
        Some(a) => format!("attempt {} at {} ({:?})", a.id, a.time, a.status),
    }
}

/// Compares an answer map with the model's, key by key, and describes every difference.
fn compare(
    what: &str,
    keys: &[AttemptKey],
    expected: &HashMap<AttemptKey, Attempt>,
    got: &HashMap<AttemptKey, Attempt>,
) -> Result<(), String> {
    let mut problems = Vec::new();
    let mut reported = std::collections::HashSet::new();
    for key in keys {
        if !reported.insert(key) {
            continue;
        }
        let (e, g) = (expected.get(key), got.get(key));
        if e != g {
            problems.push(format!(
                "  key {}: expected {}, got {}",
                ShowKey(key),
                show(e),
                show(g)
            ));
        }
    }
    for key in got.keys().filter(|k| !keys.contains(k)) {
        problems.push(format!(
            "  answered a key that was not asked: {}",
            ShowKey(key)
        ));
    }
    if problems.is_empty() {
        Ok(())
    } else {
        Err(format!(
            "{what} disagrees with the model:\n{}",
            problems.join("\n")
        ))
    }
}

fn describe_history(history: &[Attempt]) -> String {
    let mut lines: Vec<String> = history
        .iter()
        .map(|a| {
            format!(
                "  ({}, {}, {}) attempt {} at {} ({:?})",
                a.tenant_id, a.event_id, a.destination_id, a.id, a.time, a.status
            )
        })
        .collect();
    lines.sort();
    lines.join("\n")
}

async fn check(
    ctx: &RunContext,
    store: &Arc<dyn LogStore>,
    lookups: &[&dyn ParityLookup],
    scenario: &Scenario,
) -> Result<(), String> {
    let built = build(ctx, scenario);
    for (events, attempts) in &built.inserts {
        if events.is_empty() && attempts.is_empty() {
            continue;
        }
        store
            .insert_many(events, attempts)
            .await
            .map_err(|e| format!("insert_many failed: {e}"))?;
    }
    let expected = model::latest_attempts(&built.history, &built.keys);
    let with_history =
        |message: String| format!("{message}\nhistory:\n{}", describe_history(&built.history));

    let batch = store
        .latest_attempts(&built.keys)
        .await
        .map_err(|e| format!("latest_attempts failed: {e}"))?;
    compare("latest_attempts", &built.keys, &expected, &batch).map_err(with_history)?;

    let mut singles = HashMap::new();
    let mut asked = std::collections::HashSet::new();
    for key in &built.keys {
        if !asked.insert(key) {
            continue;
        }
        if let Some(attempt) = store
            .latest_attempt(key)
            .await
            .map_err(|e| format!("latest_attempt failed: {e}"))?
        {
            singles.insert(key.clone(), attempt);
        }
    }
    compare("latest_attempt", &built.keys, &expected, &singles).map_err(with_history)?;

    let built_in: [&dyn ParityLookup; 1] = [&super::coalesced::ThroughCoalescer];
    for lookup in built_in.iter().chain(lookups) {
        let answers = lookup
            .lookup(Arc::clone(store), built.keys.clone(), scenario.variant)
            .await
            .map_err(|e| format!("{} failed: {e}", lookup.name()))?;
        compare(&lookup.name(), &built.keys, &expected, &answers).map_err(with_history)?;
    }
    Ok(())
}

/// Runs the parity property against `store`, the built-in lookup through a `LookupCoalescer`
/// ([`ThroughCoalescer`](super::coalesced::ThroughCoalescer)), and every extra lookup in `lookups`.
///
/// # Panics
///
/// On the first failing case, after shrinking it, with the run's seed to replay it, the shrunk
/// scenario and every key whose answer differs from the model.
pub async fn run(store: Arc<dyn LogStore>, config: &ParityConfig, lookups: &[&dyn ParityLookup]) {
    let ctx = RunContext::new();
    eprintln!(
        "parity: {} cases, seed {:#018x} (replay: SHEAF_PARITY_SEED={:#018x})",
        config.cases, config.seed, config.seed
    );
    let runner_config = Config {
        cases: config.cases,
        max_shrink_iters: config.max_shrink_iters,
        failure_persistence: None,
        ..Config::default()
    };
    let mut seed = [0u8; 32];
    for chunk in seed.chunks_mut(8) {
        chunk.copy_from_slice(&config.seed.to_le_bytes());
    }
    let mut runner = TestRunner::new_with_rng(
        runner_config,
        TestRng::from_seed(RngAlgorithm::ChaCha, &seed),
    );
    let strategy = scenario();

    for case in 1..=config.cases {
        let mut tree = strategy
            .new_tree(&mut runner)
            .expect("the parity generator never rejects");
        let generated = tree.current();
        let Err(failure) = check(&ctx, &store, lookups, &generated).await else {
            continue;
        };

        // Shrink: simplify while the case keeps failing, complicate when a step made it pass.
        let (mut minimal, mut message) = (generated, failure);
        let mut runs = 0;
        if tree.simplify() {
            while runs < config.max_shrink_iters {
                runs += 1;
                let candidate = tree.current();
                match check(&ctx, &store, lookups, &candidate).await {
                    Err(failure) => {
                        (minimal, message) = (candidate, failure);
                        if !tree.simplify() {
                            break;
                        }
                    }
                    Ok(()) => {
                        if !tree.complicate() {
                            break;
                        }
                    }
                }
            }
        }
        panic!(
            "parity failed at case {case} of {} (seed {:#018x}; replay with \
             SHEAF_PARITY_SEED={:#018x}), shrunk in {runs} runs to\n{minimal}\n{message}",
            config.cases, config.seed, config.seed
        );
    }
    eprintln!("parity: {} cases passed", config.cases);
}
