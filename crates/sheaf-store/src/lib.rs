//! Sheaf's domain types, the storage traits every backend implements, and the suites that check them.
#![doc = include_str!("../README.md")]

pub mod counts;
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

pub use counts::{AttemptCounts, Buckets};
pub use entity::{
    CredentialsSwap, DeliveryHealth, Destination, DestinationKind, DestinationPatch,
    DisabledReason, EntityStore, HealthChange, PreviousSecret, RateLimit, Secret,
    StoredCredentials, Tenant, TenantUpsert, Topics, validate_health_reports,
};
pub use error::{Error, ErrorKind, Result, SharedSource};
pub use filter::{Filter, FilterError};
pub use ids::{AttemptId, DestinationId, EventId, JobId, TenantId};
pub use log::{
    Attempt, AttemptFilter, AttemptKey, AttemptStatus, AttemptTrigger, Event, EventFilter,
    EventKey, LogStore, Payload, TimeRange, validate_topic,
};
pub use outbox::{
    Accepted, Intake, LeaseOffer, Outbox, OutboxBacklog, Settlement, Shipment, validate_intakes,
};
pub use page::{Cursor, MAX_PAGE_LIMIT, Page, PageRequest};
pub use queue::{
    ClaimedJob, DeadLetter, DeadLetterRequest, Job, JobQueue, Lease, MAX_ORDER_KEY_LEN, QueueDepth,
    Renewed, Reschedule, validate_job, validate_lease,
};
pub use replay::{
    NewReplay, Replay, ReplayLease, ReplayPage, ReplayProgress, ReplaySaved, ReplayState,
    ReplayStep, ReplayStore, validate_replay_step,
};
pub use time::{Timestamp, truncate_to_micros};
pub use trace::TraceContext;
