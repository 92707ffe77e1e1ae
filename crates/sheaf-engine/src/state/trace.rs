//! Trace context, W3C `traceparent` (with `SHEAF_OTLP_ENDPOINT` set): read from a publish's
//! request, stored with the events it published, and written into every webhook attempt.
//!
//! A delivery runs long after its publish, in a worker, maybe in another process or after a
//! restart, so its span cannot simply be a child of the request's. The publish's context goes
//! two ways:
//!
//! - **With the event** ([`publish_context`]): the publish span's `traceparent` (and
//!   `tracestate`) is stored with each event it published, in every log store and outbox, and
//!   travels with the payload: in the fresh-event cache, through the coalesced event reads, and
//!   in each attempt, where a retry's latest-attempt lookup finds it. So a delivery by any
//!   process sharing the queue, first or retry, after a restart or hours later, continues the
//!   publish's trace, at no extra query. Its span starts once the payload is read
//!   ([`continue_stored`]): a span's parent is fixed once it has been entered, so the lookups
//!   that read the payload are not linked to that span.
//! - **In this process's memory** ([`EventTraces`], bounded like the fresh-event cache, for 15
//!   minutes): the process that took the publish knows the context before it reads the payload,
//!   so its deliveries' spans are made first and the coalesced lookups link to them.
//!
//! Without an endpoint nothing here runs: [`EventTraces`] is absent, no context is stored (an
//! event's is `None`) and no span is exported. A context stored by a traced process is still
//! carried along by an untraced one, as the event's topic is.

use std::time::Duration;

use http::header::{HeaderMap, HeaderName};
use moka::future::Cache;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use sheaf_store::{EventKey, TraceContext};
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Contexts are dropped after this long even if the cache has room: a delivery that late is a
/// retry, which finds the context stored with its event anyway.
const KEEP_FOR: Duration = Duration::from_secs(15 * 60);

/// The trace contexts of events published by this process, so their deliveries' spans can be
/// made before the payload is read.
#[derive(Debug, Clone)]
pub struct EventTraces {
    contexts: Cache<EventKey, opentelemetry::Context>,
}

impl EventTraces {
    /// Room for `capacity` events.
    pub fn new(capacity: u64) -> Self {
        Self {
            contexts: Cache::builder()
                .max_capacity(capacity)
                .time_to_live(KEEP_FOR)
                .build(),
        }
    }

    /// Keeps the current span's context as `key`'s, when it belongs to a trace and `key` has
    /// none yet (a repeated publish does not take over the first one's deliveries).
    pub async fn remember(&self, key: EventKey) {
        let context = tracing::Span::current().context();
        if context.span().span_context().is_valid() {
            self.contexts.entry(key).or_insert(context).await;
        }
    }

    /// The context kept for `key`, if one is.
    pub async fn context_of(&self, key: &EventKey) -> Option<opentelemetry::Context> {
        self.contexts.get(key).await
    }
}

/// The current span's context as it is stored with the events of a publish, when the span
/// belongs to a trace (`None` while nothing is exported: the span is disabled). A `tracestate`
/// too long to store is left out; the `traceparent` alone still joins the trace.
pub fn publish_context() -> Option<TraceContext> {
    let headers = trace_headers(&tracing::Span::current());
    let value = |name: &str| {
        headers
            .iter()
            .find(|(key, _)| key == name)
            .map(|(_, value)| value.as_str())
    };
    let parent = value("traceparent")?;
    TraceContext::new(parent, value("tracestate"))
        .or_else(|_| TraceContext::new(parent, None))
        .ok()
}

/// Makes `span` a child of `context` (a kept publish context), before it is first entered.
pub fn continue_trace(span: &tracing::Span, context: opentelemetry::Context) {
    let _ = span.set_parent(context);
}

/// Makes `span` a child of the publish context stored with an event, before it is first
/// entered; an invalid one changes nothing.
pub fn continue_stored(span: &tracing::Span, stored: &TraceContext) {
    let context = TraceContextPropagator::new().extract(&Stored(stored));
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// Makes `span` continue the trace a request's `traceparent` names (an invalid or absent one
/// changes nothing: the span starts a trace).
pub fn continue_from_headers(span: &tracing::Span, headers: &HeaderMap) {
    let context = TraceContextPropagator::new().extract(&Headers(headers));
    if context.span().span_context().is_valid() {
        let _ = span.set_parent(context);
    }
}

/// The `traceparent` (and `tracestate`, when there is one) naming `span`, for an outgoing
/// request; empty when `span` is not traced.
pub fn trace_headers(span: &tracing::Span) -> Vec<(String, String)> {
    let context = span.context();
    if !context.span().span_context().is_valid() {
        return Vec::new();
    }
    let mut out = HeaderOut(Vec::new());
    TraceContextPropagator::new().inject_context(&context, &mut out);
    out.0
}

/// Records `span`'s trace and span ids in hex in its `trace_id` and `span_id` fields, when it
/// is traced, so the log lines written in it carry them (`SHEAF_LOG_FORMAT=json`: in `span`).
pub fn record_ids(span: &tracing::Span) {
    let context = span.context();
    let ids = context.span().span_context().clone();
    if ids.is_valid() {
        span.record("trace_id", ids.trace_id().to_string());
        span.record("span_id", ids.span_id().to_string());
    }
}

struct Headers<'a>(&'a HeaderMap);

impl Extractor for Headers<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

struct Stored<'a>(&'a TraceContext);

impl Extractor for Stored<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        match key {
            "traceparent" => Some(self.0.traceparent()),
            "tracestate" => self.0.tracestate(),
            _ => None,
        }
    }

    fn keys(&self) -> Vec<&str> {
        vec!["traceparent", "tracestate"]
    }
}

struct HeaderOut(Vec<(String, String)>);

impl Injector for HeaderOut {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}
