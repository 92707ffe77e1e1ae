//! Trace context, W3C `traceparent` (with `SHEAF_OTLP_ENDPOINT` set): read from a publish's
//! request, kept for the events it published, and written into every webhook attempt.
//!
//! A delivery runs long after its publish, in a worker, so its span cannot simply be a child
//! of the request's. The publish's context is kept in [`EventTraces`] under the event's key, in
//! this process's memory and bounded like the fresh-event cache, and the attempt's span is made
//! its child. A delivery made by another process sharing the queue, or after the context was
//! evicted or the process restarted, starts a trace of its own: the context is not stored with
//! the event.
//!
//! Without an endpoint nothing here runs: [`EventTraces`] is absent and no span is exported.

use std::time::Duration;

use moka::future::Cache;
use opentelemetry::propagation::{Extractor, Injector, TextMapPropagator as _};
use opentelemetry::trace::TraceContextExt as _;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use reqwest::header::{HeaderMap, HeaderName};
use sheaf_store::EventKey;
use tracing_opentelemetry::OpenTelemetrySpanExt as _;

/// Contexts are dropped after this long even if the cache has room: a delivery that late is a
/// retry hours later, which is better shown as a trace of its own.
const KEEP_FOR: Duration = Duration::from_secs(15 * 60);

/// The trace contexts of events published by this process, for their deliveries' spans.
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

    /// Makes `span` a child of the context kept for `key`, if one is.
    pub async fn continue_in(&self, key: &EventKey, span: &tracing::Span) {
        if let Some(context) = self.contexts.get(key).await {
            let _ = span.set_parent(context);
        }
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

struct HeaderOut(Vec<(String, String)>);

impl Injector for HeaderOut {
    fn set(&mut self, key: &str, value: String) {
        self.0.push((key.to_owned(), value));
    }
}
