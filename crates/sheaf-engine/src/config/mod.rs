//! What the engine runs with: one [`EngineConfig`], built by whoever embeds the engine. The
//! `sheaf` binary builds it from its `SHEAF_*` settings (the service's `settings` folder checks
//! every value and names the setting at fault); the field docs name those settings.
//!
//! - [`secrets_key`]: the key that seals destination secrets, and the one being rotated out.
//! - [`cdc`]: the CDC source's tables, tenants and `sheaf-cdc` configuration.

pub mod cdc;
pub mod secrets_key;

use std::path::PathBuf;
use std::time::Duration;

use sheaf_coalesce::{LookupConfig, WriteConfig};

use crate::backends::StoreConfig;

/// The retry policy.
#[derive(Debug, Clone, PartialEq)]
pub struct RetryConfig {
    /// Delay before retry n (1-based) is `schedule[min(n, len) - 1]`.
    pub schedule: Vec<Duration>,
    /// Attempts before dead-lettering.
    pub max_attempts: u32,
    /// Jitter, in percent of each delay, either way.
    pub jitter_percent: u32,
    /// Wait of a retry that found its previous attempt not logged yet.
    pub not_ready_delay: Duration,
    /// Bound on a destination's `Retry-After`.
    pub retry_after_max: Duration,
}

impl RetryConfig {
    /// The delay before the retry that follows failed attempt `attempt_number` (1-based), before jitter.
    pub fn base_delay(&self, attempt_number: u32) -> Duration {
        let index = usize::try_from(attempt_number.max(1) - 1).unwrap_or(usize::MAX);
        self.schedule
            .get(index)
            .or(self.schedule.last())
            .copied()
            .unwrap_or(Duration::from_secs(60))
    }
}

/// The process that runs destinations' transformations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransformRunner {
    /// This process's own executable, run as `<executable> transform-runner`: the `sheaf`
    /// binary, or a program embedding the engine whose `main` hands that argument to
    /// `sheaf_transform::runner::serve_stdio`.
    ThisExecutable,
    /// Another command (`sheaf-transform-runner`, say).
    Command(sheaf_transform::pool::RunnerCommand),
}

/// How transformations run (`SHEAF_TRANSFORM_*`). Programs are tenants' code: they run in
/// runner processes (`sheaf_transform::pool`), never in the engine's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransformConfig {
    /// `SHEAF_TRANSFORM_RUNNER`.
    pub runner: TransformRunner,
    /// `SHEAF_TRANSFORM_RUNNERS`: how many runner processes run at most.
    pub runners: usize,
    /// `SHEAF_MAX_BODY_BYTES`: the largest body a transformation may produce, the largest a
    /// publish may send.
    pub max_body_bytes: usize,
}

/// Where operator events are delivered, and the secret that signs them.
#[derive(Clone)]
pub struct OperatorWebhook {
    /// `SHEAF_OPERATOR_WEBHOOK_URL`.
    pub url: url::Url,
    /// `SHEAF_OPERATOR_WEBHOOK_SECRET`.
    pub secret: sheaf_store::Secret,
}

impl std::fmt::Debug for OperatorWebhook {
    /// The secret as a fingerprint (the first bytes of its SHA-256), never itself: enough to
    /// tell two configurations apart.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        use sha2::Digest as _;
        let digest = sha2::Sha256::digest(self.secret.expose().as_bytes());
        let fingerprint: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        f.debug_struct("OperatorWebhook")
            .field("url", &self.url.as_str())
            .field("secret_sha256_prefix", &fingerprint)
            .finish()
    }
}

/// Everything the engine runs with: stores, delivery, retries, coalescing, bounds, operator
/// events, the CDC source. The HTTP front door's settings are not here.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// `SHEAF_SECRETS_KEY`: destination secrets (and passwords in `config.url`) are sealed with
    /// it in every entity store; with `SHEAF_SECRETS_KEY_PREVIOUS` beside it, values sealed
    /// with that one still open.
    pub secrets_key: Option<secrets_key::SecretsKey>,
    /// Which stores run (`SHEAF_LOG_STORE`, `SHEAF_QUEUE`), and each backend's settings.
    pub stores: StoreConfig,
    /// `SHEAF_RETRY_*` except the lookup.
    pub retry: RetryConfig,
    /// `SHEAF_RETRY_LOOKUP_*`: the coalescer in front of `LogStore::latest_attempts`.
    pub retry_lookup: LookupConfig,
    /// `SHEAF_EVENT_LOOKUP_BATCH_SIZE`: the coalescer in front of `LogStore::get_events`.
    pub event_lookup: LookupConfig,
    /// `SHEAF_FRESH_EVENT_CACHE`.
    pub fresh_event_cache: u64,
    /// `SHEAF_DELIVERY_WORKERS`; 0: this process delivers nothing (it only takes publishes).
    pub delivery_workers: usize,
    /// `SHEAF_DELIVERY_TIMEOUT`.
    pub delivery_timeout: Duration,
    /// `SHEAF_QUEUE_LEASE`.
    pub queue_lease: Duration,
    /// `SHEAF_QUEUE_POLL_INTERVAL`.
    pub queue_poll_interval: Duration,
    /// `SHEAF_COMPLETER_FLUSH_INTERVAL`.
    pub completer_flush_interval: Duration,
    /// `SHEAF_COMPLETER_MAX_BATCH`.
    pub completer_max_batch: usize,
    /// `SHEAF_LOG_WRITE_*`.
    pub log_write: WriteConfig,
    /// `SHEAF_LOG_SHIP_INTERVAL`.
    pub log_ship_interval: Duration,
    /// `SHEAF_MAX_PUBLISHES_IN_FLIGHT`.
    pub max_publishes_in_flight: usize,
    /// `SHEAF_MEMORY_LOG_*`: what the memory log keeps besides the events still owed a delivery.
    pub memory_log_retention: sheaf_memory::LogRetention,
    /// `SHEAF_MEMORY_MAX_PENDING_EVENTS`.
    pub memory_max_pending_events: u64,
    /// `SHEAF_MEMORY_MAX_PENDING_BYTES`.
    pub memory_max_pending_bytes: u64,
    /// `SHEAF_OUTBOX_MAX_EVENTS`.
    pub outbox_max_events: u64,
    /// `SHEAF_IDEMPOTENCY_WINDOW`.
    pub idempotency_window: Duration,
    /// `SHEAF_ALLOW_PRIVATE_DESTINATIONS`.
    pub allow_private_destinations: bool,
    /// `SHEAF_SECRET_ROTATION_GRACE`.
    pub secret_rotation_grace: Duration,
    /// `SHEAF_ENTITY_CACHE_TTL`.
    pub entity_cache_ttl: Duration,
    /// `SHEAF_SHUTDOWN_TIMEOUT`.
    pub shutdown_timeout: Duration,
    /// `SHEAF_EGRESS_PROXY`: the proxy webhook deliveries go through.
    pub egress_proxy: Option<url::Url>,
    /// `SHEAF_TLS_CA_FILE`: CA certificates every TLS connection trusts besides the roots.
    pub tls_ca_file: Option<PathBuf>,
    /// Whether trace spans are exported (`SHEAF_OTLP_ENDPOINT` is set): publishes then keep
    /// their trace context for their deliveries' spans.
    pub traces: bool,
    /// `SHEAF_DESTINATION_DISABLE_AFTER_FAILURES`; 0 = never.
    pub disable_after_failures: u32,
    /// `SHEAF_OPERATOR_WEBHOOK_URL` and `SHEAF_OPERATOR_WEBHOOK_SECRET`: where operator events go.
    pub operator_webhook: Option<OperatorWebhook>,
    /// `SHEAF_CDC_*`: the CDC source, when `SHEAF_CDC_ENABLED=true`.
    pub cdc: Option<cdc::CdcSettings>,
    /// `SHEAF_TRANSFORM_*`: where destinations' transformations run.
    pub transforms: TransformConfig,
}

/// The embedded default: the embedded stores ([`StoreConfig::default`]), 32 workers, the retry
/// schedule 5 s, 1 min, 10 min, 1 h, 6 h. The same values as the `sheaf` binary's settings when none is set (its tests check that they agree).
impl Default for EngineConfig {
    fn default() -> Self {
        let secs = Duration::from_secs;
        Self {
            secrets_key: None,
            stores: StoreConfig::default(),
            retry: RetryConfig {
                schedule: [5, 60, 600, 3600, 21600].map(secs).to_vec(),
                max_attempts: 6,
                jitter_percent: 20,
                not_ready_delay: secs(1),
                retry_after_max: secs(3600),
            },
            retry_lookup: LookupConfig {
                max_batch: 50,
                max_wait: Duration::from_millis(50),
                adaptive: false,
                // A retry can wait the batch's 50 ms under load (it is due seconds after its
                // failure), so adaptive retries gather like the fixed mode then.
                gather_under_load: true,
                ..LookupConfig::default()
            },
            // Event reads are adaptive: a first delivery on a quiet service reads its payload
            // at once, and batches grow only while a read is already in flight; 20 ms bounds
            // the gathering, since that wait is publish-to-delivery latency.
            event_lookup: LookupConfig {
                max_batch: 100,
                max_wait: Duration::from_millis(20),
                adaptive: true,
                ..LookupConfig::default()
            },
            fresh_event_cache: 10_000,
            delivery_workers: 32,
            delivery_timeout: secs(15),
            queue_lease: secs(30),
            queue_poll_interval: Duration::from_millis(100),
            completer_flush_interval: Duration::from_millis(5),
            completer_max_batch: 256,
            log_write: WriteConfig {
                max_records: 10_000,
                max_bytes: 16 * 1024 * 1024,
                max_wait: Duration::ZERO,
                ..WriteConfig::default()
            },
            log_ship_interval: secs(1),
            max_publishes_in_flight: 1024,
            memory_log_retention: sheaf_memory::LogRetention {
                max_age: Some(secs(3 * 24 * 3600)),
                max_events: 25_000,
                max_attempts: 100_000,
            },
            memory_max_pending_events: 100_000,
            memory_max_pending_bytes: 128 * 1024 * 1024,
            outbox_max_events: 10_000_000,
            idempotency_window: secs(24 * 3600),
            allow_private_destinations: false,
            secret_rotation_grace: secs(24 * 3600),
            entity_cache_ttl: secs(5),
            shutdown_timeout: secs(20),
            egress_proxy: None,
            tls_ca_file: None,
            traces: false,
            disable_after_failures: 0,
            operator_webhook: None,
            cdc: None,
            transforms: TransformConfig {
                runner: TransformRunner::ThisExecutable,
                runners: 2,
                max_body_bytes: 1024 * 1024,
            },
        }
    }
}
