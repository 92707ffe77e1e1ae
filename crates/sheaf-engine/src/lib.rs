//! Sheaf's engine: publish, delivery, retries, replays and CDC intake behind one façade.
#![doc = include_str!("../README.md")]

pub mod backends;
mod config;
mod delivery;
mod destinations;
mod engine;
mod health;
mod ingest;
mod state;

pub use backends::{
    EntityHome, LogStoreKind, Migrate, QueueKind, SettingError, SettingSource, StoreConfig, Stores,
    backup,
};
pub use config::cdc::{CdcSettings, TableTenants};
pub use config::secrets_key::SecretsKey;
pub use config::{EngineConfig, OperatorWebhook, RetryConfig, TransformConfig, TransformRunner};
pub use destinations::installed as destination_types;
pub use engine::{Engine, Readiness, Tasks, start};
pub use ingest::{PublishError, Published};

/// The publish body: parsed and checked as a pure function, so a front door (and the fuzzer)
/// can use it without the rest of the engine.
pub mod body {
    pub use crate::ingest::body::{
        BodyError, CDC_ID_PREFIX, PublishRequest, ValidPublish, api_tenant_id, json_error,
        parse_json, parse_publish, validate_publish,
    };
    pub use crate::ingest::order::check_ordering_key;
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
pub use state::turns::OPERATOR_TENANT;
