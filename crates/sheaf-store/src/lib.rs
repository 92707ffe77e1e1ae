//! Sheaf's domain types and the three storage traits every backend implements.
//!
//! - [`LogStore`]: the record of events and delivery attempts, payloads included, with the
//!   batched latest-attempt lookup that retries coming due together share.
//! - [`JobQueue`]: minimal job rows with leases instead of held transactions and savepoints.
//! - [`EntityStore`]: tenants and destinations.
//! - [`ReplayStore`]: bulk replays' progress and ownership, so any process reads a replay and
//!   another resumes it when its owner stops.
//!
//! The traits are object-safe (`#[async_trait]`, `Send + Sync + 'static`) because the service
//! picks backends at run time: `Arc<dyn LogStore>` is the currency. Each method's documentation
//! says what a backend must guarantee; the `testkit` feature holds the suites that check it
//! ([`testkit::conformance`] and [`testkit::parity`]), written once and run by every backend.
//!
//! # Decisions every backend shares
//!
//! - **Time** is [`Timestamp`]: UTC, truncated to microseconds when made, because Postgres
//!   `timestamptz` and ClickHouse `DateTime64(6)` keep microseconds and a round trip must compare
//!   equal.
//! - **Ids** ([`ids`]): tenant and event ids are validated strings chosen by users (an event id is
//!   the publisher's idempotency key, or generated); destination, attempt and job ids are UUIDv7,
//!   generated, and sort by creation time. All ids compare bytewise, and so must the backends.
//! - **Identity**: an event is `(tenant, event id)`, an attempt `(tenant, attempt id)`. Writes of
//!   an identity already stored are dropped, so every write can be retried whole.
//! - **Listings** ([`page`]) are newest first by `(time, id)` with keyset cursors: paging never
//!   skips or repeats an item while inserts go on.
//! - **Latest attempt**: for a key `(tenant, event, destination, attempt_time)`, the attempt with
//!   the greatest `(time, id)` among those of that triple with `time >= attempt_time`.
//! - **Leases** ([`queue`]): a claim is identified by `(job id, claimed_until)`; an operation with a
//!   lease that no longer matches is reported lost and changes nothing.
//! - **Trace context** ([`trace`]): an event keeps its publish's W3C `traceparent` (and
//!   `tracestate`), or `None`; its attempts carry it as they carry its topic and data.
//! - **Errors**: one [`Error`] enum, `Clone`, whose [`ErrorKind`]s the suites assert on.
//!
//! This crate has no driver dependency: backends live in their own crates.

pub mod entity;
mod error;
pub mod filter;
pub mod ids;
pub mod log;
pub mod outbox;
pub mod page;
pub mod queue;
pub mod replay;
mod time;
pub mod trace;

#[cfg(feature = "testkit")]
pub mod testkit;

pub use entity::{
    CredentialsSwap, DeliveryHealth, Destination, DestinationKind, DestinationPatch,
    DisabledReason, EntityStore, HealthChange, PreviousSecret, RateLimit, Secret,
    StoredCredentials, Tenant, TenantUpsert, Topics, validate_health_reports,
};
pub use error::{Error, ErrorKind, Result, SharedSource};
pub use filter::{Filter, FilterError};
pub use ids::{AttemptId, DestinationId, EventId, JobId, TenantId};
pub use log::{
    Attempt, AttemptCounts, AttemptFilter, AttemptKey, AttemptStatus, AttemptTrigger, Buckets,
    Event, EventFilter, EventKey, LogStore, Payload, TimeRange, validate_topic,
};
pub use outbox::{
    Accepted, Intake, LeaseOffer, Outbox, OutboxBacklog, Settlement, Shipment, validate_intakes,
};
pub use page::{Cursor, MAX_PAGE_LIMIT, Page, PageRequest};
pub use queue::{
    ClaimedJob, DeadLetter, DeadLetterRequest, Job, JobQueue, Lease, QueueDepth, Renewed,
    Reschedule, validate_job, validate_lease,
};
pub use replay::{
    NewReplay, Replay, ReplayLease, ReplayPage, ReplayProgress, ReplaySaved, ReplayState,
    ReplayStep, ReplayStore, validate_replay_step,
};
pub use time::{Timestamp, truncate_to_micros};
pub use trace::TraceContext;
