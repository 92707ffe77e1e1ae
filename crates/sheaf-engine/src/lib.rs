//! Sheaf's engine: events in (publishes, manual retries, bulk replays, the CDC source), deliveries
//! out (workers, retries on a schedule, dead letters), a searchable log of both, with every hot
//! database path coalesced. The `sheaf` binary is this engine behind an HTTP API; a program can
//! embed it the same way.
//!
//! The façade is small: [`start`] builds the engine over its [`Stores`] from an
//! [`EngineConfig`] and returns the [`Engine`] handle (publish, retry, replay, tenant and
//! destination changes that keep the caches consistent themselves, searches, the metrics page)
//! and its [`Tasks`] (graceful stop). Everything else is private.
//!
//! Inside, the modules are in layers, each naming only the ones below it:
//!
//! ```text
//!  config  ←  state  ←  ingest    ←  health.rs, engine.rs (the façade)
//!                    ←  delivery  ←
//! ```
//!
//! - `config`: what the engine runs with.
//! - `state`: what one process shares: the stores, the caches, the coalesced paths to the log
//!   store, sealed secrets, metrics, the backoff rule.
//! - `ingest`: the ways events and jobs come in: publish, manual retry, replay, the CDC source,
//!   the log shipper.
//! - `delivery`: the way they go out: dispatcher, workers, completer, housekeeping.
//! - `health.rs`: destination health and operator events, which join the two halves.
//! - `destinations.rs`: the destination types this build delivers to (cargo features).
//!
//! # Cargo features
//!
//! The memory backends are always there. `postgres` (log store, queue, outbox, tenants),
//! `clickhouse` (log store), `webhook`, `rabbitmq` and `nats` (destination types) are on by
//! default; a program that needs fewer turns the defaults off and links only what it names.

mod config;
mod delivery;
mod destinations;
mod engine;
mod health;
mod ingest;
mod state;

pub use config::cdc::{CdcSettings, TableTenants};
pub use config::secrets_key::SecretsKey;
pub use config::{EngineConfig, LogStoreKind, OperatorWebhook, QueueKind, RetryConfig};
pub use destinations::installed as destination_types;
pub use engine::{Engine, Readiness, Tasks, start};
pub use ingest::{PublishError, Published};
pub use state::stores::{Migrate, Stores};

/// The publish body: parsed and checked as a pure function, so a front door (and the fuzzer)
/// can use it without the rest of the engine.
pub mod body {
    pub use crate::ingest::body::{
        BodyError, CDC_ID_PREFIX, PublishRequest, ValidPublish, api_tenant_id, json_error,
        parse_json, parse_publish, validate_publish,
    };
}

/// Manual retries and bulk replays: what a caller asks for, and what a replay reports.
pub mod requests {
    pub use crate::ingest::replay::ReplayRequest;
    pub use crate::ingest::retry::RetryRequest;
    pub use crate::state::replays::ReplayView;
}

/// The publishes-in-flight bound: a place held while a publish is handled, or why there is none.
pub mod admission {
    pub use crate::state::admission::{InFlight, Refused};
}

/// The one rule for waiting between tries of a failed call, doubling to a ceiling.
pub mod backoff {
    pub use crate::state::backoff::Backoff;
}

/// The engine's counters: the CDC source's state, and reading one sample off a rendered page.
pub mod metrics {
    pub use crate::state::metrics::{CdcMetrics, CdcState, metric_table, sample_value};
}

/// W3C trace context on inbound requests (with traces exported).
pub mod trace {
    pub use crate::state::trace::{continue_from_headers, record_ids};
}

/// The password a destination's `config.url` may carry: found, kept, redacted.
pub mod url_password {
    pub use crate::state::url_password::{
        KeepPasswordError, REDACTED, keep_redacted_password, password, redacted, with_password,
    };
}

/// Re-sealing every stored destination credential under the current secrets key.
pub mod reseal {
    pub use crate::state::reseal::{MAX_BATCH, ResealOptions, reseal_configured};
}

/// Operator events' tenant, reserved: only the engine writes to it.
pub use state::health::OPERATOR_TENANT;
