//! A worker's turn with one job: renew a lease more than half spent, resolve what to send
//! (`super::resolve`), shape it with the destination's transformation (`super::transform`),
//! deliver, and hand the job's outcome to the completer. The attempt goes with the outcome
//! when an outbox records both in one commit; without one, the worker writes it to the log
//! store first.

use std::borrow::Cow;
use std::sync::Arc;
use std::time::Duration;

use rand::Rng as _;
use sheaf_store::{
    Attempt, AttemptId, AttemptStatus, AttemptTrigger, ClaimedJob, DeadLetterRequest, Destination,
    Job, Payload, Reschedule, Timestamp, TraceContext,
};
use tokio::sync::{Mutex, mpsc};
use tokio_util::sync::CancellationToken;
use tracing::Instrument as _;

use super::resolve::{Resolved, not_ready, resolve_event, resolve_retry};
use super::span::{attempt_span, stored_attempt_span};
use super::transform::{Shaped, shape};
use super::{Outcome, Turn};
use crate::state::Core;
use crate::state::backoff::Backoff;
use crate::state::handoff::Dispatched;
use crate::state::jobs::is_manual_job;
use crate::state::log_access::LogRecord;
use crate::state::metrics::{AttemptResult, DeliveryOutcome, Metrics};
use crate::state::pacer::Admission;
use crate::state::trace::trace_headers;
use crate::state::turns::TurnReport;
use sheaf_destination::{DestinationType, Message, Report as Delivered, Verdict};

/// The dead-letter reason of a job whose destination was disabled when its turn came (at
/// publish time, or while it waited for a retry).
pub const DESTINATION_DISABLED: &str = "destination disabled";

/// How often a failed attempt write is tried before the worker gives up on logging it.
const ATTEMPT_WRITE_TRIES: u32 = 3;

/// The wait after the attempt write's first failure, doubling for each later one.
const ATTEMPT_WRITE_BACKOFF: Backoff =
    Backoff::new(Duration::from_millis(200), Duration::from_secs(1));

pub(super) async fn run(
    core: Arc<Core>,
    jobs: Arc<Mutex<mpsc::Receiver<Dispatched>>>,
    outcomes: mpsc::Sender<Turn>,
    stop: CancellationToken,
    abort: CancellationToken,
) {
    loop {
        let next = {
            let mut rx = jobs.lock().await;
            tokio::select! {
                biased;
                () = stop.cancelled() => None,
                job = rx.recv() => job,
            }
        };
        let Some(dispatched) = next else { break };
        let ordered = dispatched.claimed.job.order_key.is_some();
        let span = attempt_span(&core, &dispatched).await;
        // Traced, but the publish's context comes with the payload: the span is made then.
        let span_later = core.traces.is_some() && span.is_none();
        let outcome = tokio::select! {
            biased;
            () = abort.cancelled() => break,
            outcome = handle(&core, dispatched, span_later).instrument(span) => outcome,
        };
        if let Some(mut turn) = outcome {
            turn.frees_key = ordered && !matches!(turn.outcome, Outcome::Reschedule(_));
            if outcomes.send(turn).await.is_err() {
                break;
            }
        }
    }
}

/// Held back by the pacer until `wait` from now: rescheduled to its turn, not an attempt.
fn paced(core: &Core, claimed: &ClaimedJob, wait: Duration) -> Outcome {
    core.metrics.delivery(DeliveryOutcome::Paced);
    Outcome::Reschedule(Reschedule {
        lease: claimed.lease,
        due_at: Timestamp::now().saturating_add(wait),
        attempt_number: claimed.job.attempt_number,
        last_attempt_time: claimed.job.last_attempt_time,
    })
}

/// The claim, its lease renewed first when more than half of it is spent (a job waited in the
/// channel); `None` when the lease was lost meanwhile: another worker owns the job now.
async fn renewed_if_half_spent(core: &Core, dispatched: Dispatched) -> Option<ClaimedJob> {
    let mut claimed = dispatched.claimed;
    let lease = core.config.queue_lease;
    if dispatched.claimed_at.elapsed() <= lease / 2 {
        return Some(claimed);
    }
    match core.stores.queue.renew(&[claimed.lease], lease).await {
        Ok(renewed) => match renewed.leases.first() {
            Some(new) => {
                claimed.lease = *new;
                Metrics::inc(&core.metrics.lease_renewals);
            }
            None => {
                Metrics::inc(&core.metrics.leases_lost);
                return None;
            }
        },
        Err(err) => {
            tracing::warn!(error = %err, "lease renewal failed; delivering on the old lease")
        }
    }
    Some(claimed)
}

/// The job's destination as the tenant cache has it, or the turn that ends the job without
/// a delivery: retried shortly when the entity store cannot be read, completed (dropped) when
/// the tenant or the destination is gone.
async fn destination_of(core: &Core, claimed: &ClaimedJob) -> Result<Destination, Turn> {
    let job = &claimed.job;
    let entry = match core.entities.get(&job.tenant_id).await {
        Ok(entry) => entry,
        Err(err) => {
            tracing::warn!(error = %err, "could not read the destination; trying again shortly");
            return Err(not_ready(core, claimed).into());
        }
    };
    match (&entry.tenant, entry.destination(&job.destination_id)) {
        (Some(_), Some(destination)) => Ok(destination.clone()),
        _ => {
            core.metrics.delivery(DeliveryOutcome::Dropped);
            Err(Outcome::Complete(claimed.lease).into())
        }
    }
}

/// A job of a disabled destination is dead-lettered, not skipped: the dead-letter list and
/// its replay find it once the destination is enabled again.
fn dead_letter_disabled(core: &Core, claimed: &ClaimedJob) -> Turn {
    core.metrics.delivery(DeliveryOutcome::DeadLettered);
    // It never holds its key: a disabled destination's every job comes here.
    let outcome = Outcome::DeadLetter(DeadLetterRequest {
        lease: claimed.lease,
        reason: DESTINATION_DISABLED.to_owned(),
        hold_key: false,
    });
    let report = report(core, claimed, None, &outcome);
    Turn {
        outcome,
        attempt: None,
        report,
        frees_key: false,
    }
}

/// One job's turn: returns its outcome for the completer (`None` when the lease is lost), with
/// the attempt when an outbox records it together with the outcome. `span_later`: the turn's
/// span is made once the payload is read (see `span::stored_attempt_span`).
async fn handle(core: &Core, dispatched: Dispatched, span_later: bool) -> Option<Turn> {
    let claimed = renewed_if_half_spent(core, dispatched).await?;
    let job = claimed.job.clone();
    let destination = match destination_of(core, &claimed).await {
        Ok(destination) => destination,
        Err(turn) => return Some(turn),
    };
    if !destination.enabled {
        return Some(dead_letter_disabled(core, &claimed));
    }
    if let Admission::Hold(wait) = core
        .pacer
        .admit(destination.id, job.id, destination.rate_limit)
    {
        return Some(paced(core, &claimed, wait).into());
    }
    let manual = is_manual_job(&job.id) && job.last_attempt_time.is_none();
    let first = job.last_attempt_time.is_none() && (job.attempt_number == 1 || manual);
    let resolved = if first {
        resolve_event(core, &claimed).await
    } else {
        resolve_retry(core, &claimed).await
    };
    let (topic, data, trace) = match resolved {
        Resolved::Deliver { topic, data, trace } => (topic, data, trace),
        Resolved::Done(outcome) => return Some(outcome.into()),
    };
    let span = span_later.then(|| stored_attempt_span(&job, trace.as_ref()));
    let delivery = deliver(core, claimed, destination, manual, topic, data, trace);
    match span {
        Some(span) => delivery.instrument(span).await,
        None => delivery.await,
    }
}

/// The turn's delivery of its resolved payload: the attempt, its outcome and its report.
async fn deliver(
    core: &Core,
    claimed: ClaimedJob,
    destination: Destination,
    manual: bool,
    topic: String,
    data: Payload,
    event_trace: Option<TraceContext>,
) -> Option<Turn> {
    let job = claimed.job.clone();
    let body = serde_json::to_vec(data.value()).unwrap_or_else(|_| b"null".to_vec());
    let now = Timestamp::now();
    let span = tracing::Span::current();
    let trace = trace_headers(&span);
    let delivered = match core.destinations.get(destination.kind.as_str()) {
        Some(kind) => match send(
            core,
            kind.as_ref(),
            &destination,
            &job,
            &topic,
            now,
            body,
            &trace,
        )
        .await
        {
            Sent::Report(delivered) => delivered,
            Sent::Filtered(elapsed) => {
                return Some(
                    filtered(
                        core,
                        claimed,
                        manual,
                        topic,
                        data,
                        event_trace,
                        now,
                        elapsed,
                    )
                    .await,
                );
            }
        },
        // A destination of a type this binary lacks (written by a newer version, say): a
        // failed attempt, retried on schedule, so a rolling upgrade loses nothing.
        None => Delivered::retry(
            format!(
                "this process has no destination type {:?}",
                destination.kind.as_str()
            ),
            std::time::Duration::ZERO,
        ),
    };
    core.metrics.attempt_latency(delivered.elapsed);
    if let Verdict::Throttled { after } = delivered.verdict {
        // The destination asked to be left alone: every delivery to it waits, not only this one.
        let pause = after
            .unwrap_or(Duration::from_secs(1))
            .clamp(Duration::from_secs(1), core.config.retry.retry_after_max);
        core.pacer.pause(destination.id, pause);
    }
    if let Some(code) = delivered.code {
        span.record("http.response.status_code", code);
    }
    span.record("duration_ms", delivered.elapsed.as_millis() as u64);
    span.record(
        "outcome",
        if delivered.succeeded() {
            "success"
        } else {
            "failed"
        },
    );
    if job.attempt_number > 1 && !manual {
        Metrics::inc(&core.metrics.retries);
    }
    let status = if delivered.succeeded() {
        AttemptStatus::Success
    } else {
        AttemptStatus::Failed
    };
    let carried = (topic, data, event_trace);
    let mut error = delivered.error.clone();
    if let Some(key) = job
        .order_key
        .as_ref()
        .filter(|_| gives_up(core, &job, &delivered))
    {
        let note = key_note(key, destination.dead_letter_blocks_key);
        error = Some(match error {
            Some(error) => format!("{error}; {note}"),
            None => note,
        });
    }
    let attempt = Attempt {
        response_code: delivered.code,
        response_body: delivered.response.clone(),
        error,
        ..attempt_of(&job, now, manual, status, delivered.elapsed, carried)
    };
    let hold_key = destination.dead_letter_blocks_key;
    let result = if delivered.succeeded() {
        Ok(())
    } else {
        Err(what_it_got(&delivered))
    };
    if core.stores.outbox.is_some() {
        // Committed together with the outcome, by the completer: never dropped.
        let outcome = outcome_of(core, &claimed, &delivered, now, true, hold_key);
        let report = report(core, &claimed, Some(result), &outcome);
        return Some(Turn {
            outcome,
            attempt: Some(attempt),
            report,
            frees_key: false,
        });
    }
    let logged = write_attempt(core, attempt).await;
    let outcome = outcome_of(core, &claimed, &delivered, now, logged, hold_key);
    let report = report(core, &claimed, Some(result), &outcome);
    Some(Turn {
        outcome,
        attempt: None,
        report,
        frees_key: false,
    })
}

/// The record of a turn's attempt made at `now` that took `elapsed`, with the event it carried
/// (its topic, payload and trace context) and no answer yet: the caller adds the receiver's.
fn attempt_of(
    job: &Job,
    now: Timestamp,
    manual: bool,
    status: AttemptStatus,
    elapsed: Duration,
    (topic, data, event_trace): (String, Payload, Option<TraceContext>),
) -> Attempt {
    Attempt {
        tenant_id: job.tenant_id.clone(),
        id: AttemptId::generate(),
        event_id: job.event_id.clone(),
        destination_id: job.destination_id,
        number: job.attempt_number,
        time: now,
        status,
        trigger: if manual {
            AttemptTrigger::Manual
        } else {
            AttemptTrigger::Scheduled
        },
        response_code: None,
        duration_ms: u32::try_from(elapsed.as_millis()).unwrap_or(u32::MAX),
        response_body: None,
        error: None,
        event_topic: topic,
        event_data: data,
        event_trace,
    }
}

/// What [`send`] did.
enum Sent {
    /// It made an attempt (or the transformation failed it): the attempt's report.
    Report(Delivered),
    /// The destination's transformation dropped the event, after this long.
    Filtered(Duration),
}

/// Shapes the body with the destination's transformation, if it has one, and sends what it
/// made through the destination's type: the transformed body is the one sent and signed.
#[allow(clippy::too_many_arguments)]
async fn send(
    core: &Core,
    kind: &dyn DestinationType,
    destination: &Destination,
    job: &Job,
    topic: &str,
    now: Timestamp,
    body: Vec<u8>,
    trace: &[(String, String)],
) -> Sent {
    let (body, headers) = match &destination.transform {
        None => (body, Cow::Borrowed(&destination.headers)),
        Some(source) => {
            let reserved = kind.reserved_headers();
            match shape(core, source, destination, reserved, job, topic, &body).await {
                Shaped::Send { body, headers } => (body, Cow::Owned(headers)),
                Shaped::Filtered { elapsed } => return Sent::Filtered(elapsed),
                Shaped::Failed(report) => return Sent::Report(report),
            }
        }
    };
    let secrets = destination.signing_secrets(now);
    let message = Message {
        tenant_id: &job.tenant_id,
        destination_id: destination.id,
        event_id: &job.event_id,
        topic,
        timestamp: now,
        payload: &body,
        headers: &headers,
        trace,
        secrets: &secrets,
        attempt: job.attempt_number,
    };
    let delivered = kind.deliver(&destination.config, &message).await;
    core.metrics
        .type_attempt(kind.name(), attempt_result(&delivered), delivered.elapsed);
    Sent::Report(delivered)
}

/// A delivery the destination's transformation dropped: recorded as a filtered attempt, and
/// done (nothing is owed).
#[allow(clippy::too_many_arguments)]
async fn filtered(
    core: &Core,
    claimed: ClaimedJob,
    manual: bool,
    topic: String,
    data: Payload,
    event_trace: Option<TraceContext>,
    now: Timestamp,
    elapsed: Duration,
) -> Turn {
    let job = &claimed.job;
    core.metrics.delivery(DeliveryOutcome::Filtered);
    let carried = (topic, data, event_trace);
    let attempt = attempt_of(job, now, manual, AttemptStatus::Filtered, elapsed, carried);
    let outcome = Outcome::Complete(claimed.lease);
    let report = report(core, &claimed, Some(Ok(())), &outcome);
    if core.stores.outbox.is_some() {
        return Turn {
            outcome,
            attempt: Some(attempt),
            report,
            frees_key: false,
        };
    }
    // Written before the job completes, as every attempt is: a filtered delivery leaves its
    // record behind.
    write_attempt(core, attempt).await;
    Turn {
        outcome,
        attempt: None,
        report,
        frees_key: false,
    }
}

/// The turn's [`TurnReport`], when the process wants reports.
fn report(
    core: &Core,
    claimed: &ClaimedJob,
    attempt: Option<Result<(), String>>,
    outcome: &Outcome,
) -> Option<TurnReport> {
    core.turn_reports.as_ref()?;
    let job = &claimed.job;
    Some(TurnReport {
        tenant_id: job.tenant_id.clone(),
        destination_id: job.destination_id,
        event_id: job.event_id.clone(),
        attempt,
        attempt_number: job.attempt_number,
        dead_lettered: match outcome {
            Outcome::DeadLetter(d) => Some(d.reason.clone()),
            _ => None,
        },
    })
}

/// What a failed attempt got, in words: its status, or the error that kept it from one.
fn what_it_got(delivered: &Delivered) -> String {
    match (delivered.code, &delivered.error) {
        (Some(code), _) => format!("status {code}"),
        (None, Some(error)) => error.clone(),
        (None, None) => "no answer".to_owned(),
    }
}

/// Without an outbox: writes the attempt before the job's outcome is reported. A retry's lookup
/// must find it, and a completed job must leave its attempt behind (publish's repeat check
/// relies on it). After three failed tries the attempt is not logged; the outbox exists so that
/// this never happens where it matters.
async fn write_attempt(core: &Core, attempt: Attempt) -> bool {
    let mut backoff = ATTEMPT_WRITE_BACKOFF;
    for try_number in 1..=ATTEMPT_WRITE_TRIES {
        match core
            .log_writer
            .hand_off(vec![LogRecord::Attempt(attempt.clone())])
            .await
        {
            Ok(()) => return true,
            Err(err) if try_number < ATTEMPT_WRITE_TRIES => {
                tracing::warn!(error = %err, "attempt write failed; trying again");
                tokio::time::sleep(backoff.next_delay()).await;
            }
            Err(err) => {
                tracing::error!(error = %err, tenant = %attempt.tenant_id, event = %attempt.event_id,
                    "could not log the attempt");
            }
        }
    }
    false
}

/// Whether this failed attempt is the job's last: the destination cannot take it, or it was
/// the last allowed. [`outcome_of`] then dead-letters the job.
fn gives_up(core: &Core, job: &Job, delivered: &Delivered) -> bool {
    !delivered.succeeded()
        && (delivered.verdict == Verdict::Permanent
            || job.attempt_number >= core.config.retry.max_attempts)
}

/// What the last attempt of an ordered job says about its key (in the attempt's `error`, so
/// that whoever reads the log sees why a later event of the key arrived without this one).
fn key_note(key: &str, blocks: bool) -> String {
    if blocks {
        format!(
            "dead-lettered: the later events of ordering key {key:?} wait until this dead \
             letter is retried or discarded"
        )
    } else {
        format!("dead-lettered: the later events of ordering key {key:?} go on without it")
    }
}

/// The job's outcome after its attempt; `hold_key`: a dead letter holds the job's order key.
fn outcome_of(
    core: &Core,
    claimed: &ClaimedJob,
    delivered: &Delivered,
    now: Timestamp,
    logged: bool,
    hold_key: bool,
) -> Outcome {
    let job = &claimed.job;
    if delivered.succeeded() {
        core.metrics.delivery(DeliveryOutcome::Success);
        return Outcome::Complete(claimed.lease);
    }
    let retry = &core.config.retry;
    if delivered.verdict == Verdict::Permanent {
        core.metrics.delivery(DeliveryOutcome::DeadLettered);
        return Outcome::DeadLetter(DeadLetterRequest {
            lease: claimed.lease,
            reason: format!(
                "the destination cannot take it as configured (attempt {}): {}",
                job.attempt_number,
                what_it_got(delivered)
            ),
            hold_key,
        });
    }
    if job.attempt_number >= retry.max_attempts {
        core.metrics.delivery(DeliveryOutcome::DeadLettered);
        let last = what_it_got(delivered);
        return Outcome::DeadLetter(DeadLetterRequest {
            lease: claimed.lease,
            reason: format!(
                "gave up after {} attempts; last: {last}",
                job.attempt_number
            ),
            hold_key,
        });
    }
    core.metrics.delivery(DeliveryOutcome::Failed);
    let delay = match delivered.retry_after() {
        Some(asked) => asked.clamp(Duration::from_secs(1), retry.retry_after_max),
        None => jittered(retry.base_delay(job.attempt_number), retry.jitter_percent),
    };
    Outcome::Reschedule(Reschedule {
        lease: claimed.lease,
        due_at: now.saturating_add(delay),
        attempt_number: job.attempt_number.saturating_add(1),
        // An attempt that could not be logged cannot be found by the retry's lookup; the retry
        // then looks without a time bound (a single, unbatched lookup) or reads the event.
        last_attempt_time: logged.then_some(now),
    })
}

/// The `result` label of an attempt.
fn attempt_result(report: &Delivered) -> AttemptResult {
    match report.verdict {
        Verdict::Delivered => AttemptResult::Delivered,
        Verdict::Retry { .. } => AttemptResult::Retry,
        Verdict::Throttled { .. } => AttemptResult::Throttled,
        Verdict::Permanent => AttemptResult::Permanent,
    }
}

/// `delay` moved randomly by up to `percent` of itself, either way.
pub(super) fn jittered(delay: Duration, percent: u32) -> Duration {
    if percent == 0 {
        return delay;
    }
    let spread = delay.as_secs_f64() * f64::from(percent) / 100.0;
    let offset = rand::rng().random_range(-spread..=spread);
    Duration::from_secs_f64((delay.as_secs_f64() + offset).max(0.0))
}
