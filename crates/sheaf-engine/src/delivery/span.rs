//! The `deliver` span of a job's turn: made before the payload is read when this process still
//! has the publish's trace context in memory, else once the payload brings the context stored
//! with the event.

use sheaf_store::{EventKey, Job, TraceContext};

use crate::state::Core;
use crate::state::handoff::Dispatched;
use crate::state::trace::{continue_stored, continue_trace, record_ids};

/// The span of one job's turn, while spans are exported and this process still has its
/// publish's context in memory (`state::trace`): a child of the publish's span, made before the
/// payload is read, so its lookups link to the batches that answered them. Otherwise none yet:
/// [`stored_attempt_span`] makes it once the payload brings the context stored with the event.
pub(super) async fn attempt_span(core: &Core, dispatched: &Dispatched) -> tracing::Span {
    let Some(traces) = &core.traces else {
        return tracing::Span::none();
    };
    let job = &dispatched.claimed.job;
    let key = EventKey {
        tenant_id: job.tenant_id.clone(),
        event_id: job.event_id.clone(),
    };
    let Some(publish) = traces.context_of(&key).await else {
        return tracing::Span::none();
    };
    let span = new_attempt_span(job);
    continue_trace(&span, publish);
    record_ids(&span);
    span
}

/// The span of a turn whose publish's context this process did not have: a child of the
/// context stored with the event, if it has one, else the root of a trace of its own. It starts
/// after the payload was read (a span's parent is fixed once it has been entered), so the
/// payload's lookups are not linked to it.
pub(super) fn stored_attempt_span(job: &Job, stored: Option<&TraceContext>) -> tracing::Span {
    let span = new_attempt_span(job);
    if let Some(stored) = stored {
        continue_stored(&span, stored);
    }
    record_ids(&span);
    span
}

fn new_attempt_span(job: &Job) -> tracing::Span {
    tracing::info_span!(
        parent: None,
        "deliver",
        tenant_id = %job.tenant_id,
        event_id = %job.event_id,
        destination_id = %job.destination_id,
        attempt = job.attempt_number,
        http.response.status_code = tracing::field::Empty,
        duration_ms = tracing::field::Empty,
        outcome = tracing::field::Empty,
        trace_id = tracing::field::Empty,
        span_id = tracing::field::Empty,
        otel.kind = "client",
    )
}
