//! Settings: every `SHEAF_*` setting, read from the environment and an optional TOML file (the
//! environment wins), checked, and turned into one [`Config`].
//!
//! This folder is the bottom layer of the crate: it names nothing else of it.
//!
//! - [`table`]: each setting once, with its default, meaning and [`Kind`] (its bounds as a
//!   value). The parser, the validation messages, `sheaf --help` and the generated table in
//!   `docs/configuration.md` all come from it, so a setting cannot exist without its name,
//!   default and meaning, and a range is written in one place.
//! - [`values`]: the raw values of one load and the typed getters that apply a kind.
//! - [`keys`]: the admin key, the token signing key and the secrets key, checked and never
//!   printed.
//! - [`names`]: former names, names set aside for tools, the words of one-of settings, and
//!   the closest setting to an unknown name.
//! - [`cdc`]: the CDC source's settings.
//! - [`docs`]: `--help` and the generated part of `docs/configuration.md`.
//!
//! An invalid value is refused with the setting's name ([`ConfigError`]).

pub mod cdc;
pub mod docs;
pub mod keys;
pub mod names;
pub mod table;
#[cfg(test)]
mod tests;
pub mod values;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use sheaf_coalesce::{LookupConfig, WriteConfig};
use sheaf_engine::{TransformConfig, TransformRunner};

pub use cdc::{CdcSettings, TableTenants};
pub use docs::{settings_help, with_part_between};
pub use keys::{AdminKey, SecretsKey, TokenKey};
pub use sheaf_engine::{EngineConfig, OperatorWebhook, RetryConfig, StoreConfig};
pub use table::{Kind, SETTINGS, Setting};
pub use values::{deprecation_warnings, format_duration, parse_duration};

use table as s;
use values::Values;

/// A refused configuration: which setting, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {message}")]
pub struct ConfigError {
    /// The setting at fault (`SHEAF_…`).
    pub setting: String,
    /// What is wrong with it, lower-case.
    pub message: String,
}

/// A store setting the engine refused ([`StoreConfig::from_settings`]).
impl From<sheaf_engine::SettingError> for ConfigError {
    fn from(e: sheaf_engine::SettingError) -> Self {
        Self {
            setting: e.setting,
            message: e.message,
        }
    }
}

impl ConfigError {
    pub(crate) fn new(setting: &str, message: impl Into<String>) -> Self {
        Self {
            setting: setting.to_owned(),
            message: message.into(),
        }
    }
}

/// How log lines are written (`SHEAF_LOG_FORMAT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// Human-readable lines (the default).
    Text,
    /// One JSON object per line.
    Json,
}

/// Everything the service runs with: the engine's configuration and the HTTP front door's.
/// Built by [`Config::load`]; tests build it from a map.
#[derive(Debug, Clone)]
pub struct Config {
    /// What the engine runs with (stores, delivery, retries, bounds, CDC).
    pub engine: EngineConfig,
    /// `SHEAF_LISTEN`.
    pub listen: SocketAddr,
    /// `SHEAF_API_KEY`.
    pub api_key: Option<AdminKey>,
    /// `SHEAF_TOKEN_SIGNING_KEY`: tenant tokens are issued and accepted only with it.
    pub token_signing_key: Option<TokenKey>,
    /// `SHEAF_TOKEN_MAX_TTL`.
    pub token_max_ttl: Duration,
    /// `SHEAF_PUBLIC_URL`: scheme, host and port, without a trailing slash.
    pub public_url: Option<String>,
    /// `SHEAF_MAX_BODY_BYTES`.
    pub max_body_bytes: usize,
    /// `SHEAF_REQUEST_TIMEOUT`.
    pub request_timeout: Duration,
    /// `SHEAF_LOG`.
    pub log_filter: String,
    /// `SHEAF_LOG_FORMAT`.
    pub log_format: LogFormat,
    /// `SHEAF_OTLP_ENDPOINT`: where traces go; `None`, no traces.
    pub otlp_endpoint: Option<String>,
    /// `SHEAF_OTLP_SAMPLE_PERCENT`.
    pub otlp_sample_percent: u32,
}

impl Config {
    /// Reads the process environment (and the file it names).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::load(std::env::vars().collect())
    }

    /// Reads settings from `env` (variable name to value) and the TOML file named by its
    /// `SHEAF_CONFIG_FILE`, the environment winning; anything not set takes its default.
    pub fn load(env: HashMap<String, String>) -> Result<Self, ConfigError> {
        let values = Values::gather(env)?;
        let listen = parse_listen(&values)?;
        let api_key = values
            .optional(&s::API_KEY)
            .map(AdminKey::new)
            .transpose()
            .map_err(|m| ConfigError::new(s::API_KEY.name, m))?;
        let token_signing_key = values
            .optional(&s::TOKEN_SIGNING_KEY)
            .map(|k| TokenKey::from_base64(&k))
            .transpose()
            .map_err(|m| ConfigError::new(s::TOKEN_SIGNING_KEY.name, m))?;
        check_admin_access(listen, api_key.as_ref(), token_signing_key.is_some())?;
        let secrets_key = keys::parse_secrets_key(&values)?;
        let stores = StoreConfig::from_settings(&values)?;
        let delivery_timeout = values.duration(&s::DELIVERY_TIMEOUT)?;
        let queue_lease = values.duration(&s::QUEUE_LEASE)?;
        check_lease(queue_lease, delivery_timeout)?;
        let tls_ca_file = parse_tls_ca_file(&values)?;
        let cdc = cdc::parse_cdc(
            &values,
            stores.postgres_schema_in_use(),
            tls_ca_file.as_deref(),
        )?;
        let otlp_endpoint = parse_otlp_endpoint(&values)?;
        let engine = EngineConfig {
            secrets_key,
            stores,
            retry: parse_retry(&values)?,
            retry_lookup: LookupConfig {
                max_batch: values.usize(&s::RETRY_LOOKUP_BATCH_SIZE)?,
                max_wait: values.duration(&s::RETRY_LOOKUP_BATCH_WAIT)?,
                adaptive: values.bool(&s::RETRY_LOOKUP_ADAPTIVE)?,
                // A retry can wait the batch's 50 ms under load (it is due seconds after its
                // failure), so adaptive retries gather like the fixed mode then, and only a
                // retry after a quiet spell goes at once (docs/benchmarks.md, `burst`).
                gather_under_load: true,
                ..LookupConfig::default()
            },
            // Event reads are adaptive: a first delivery on a quiet service reads its payload at
            // once, and batches grow only while a read is already in flight.
            event_lookup: LookupConfig {
                max_batch: values.usize(&s::EVENT_LOOKUP_BATCH_SIZE)?,
                max_wait: EVENT_LOOKUP_MAX_WAIT,
                adaptive: true,
                ..LookupConfig::default()
            },
            fresh_event_cache: values.int(&s::FRESH_EVENT_CACHE)?,
            delivery_workers: values.usize(&s::DELIVERY_WORKERS)?,
            delivery_timeout,
            queue_lease,
            queue_poll_interval: values.duration(&s::QUEUE_POLL_INTERVAL)?,
            completer_flush_interval: values.duration(&s::COMPLETER_FLUSH_INTERVAL)?,
            completer_max_batch: values.usize(&s::COMPLETER_MAX_BATCH)?,
            log_write: WriteConfig {
                max_records: values.usize(&s::LOG_WRITE_MAX_RECORDS)?,
                max_bytes: values.usize(&s::LOG_WRITE_MAX_BYTES)?,
                max_wait: values.duration(&s::LOG_WRITE_MAX_WAIT)?,
                ..WriteConfig::default()
            },
            log_ship_interval: values.duration(&s::LOG_SHIP_INTERVAL)?,
            max_publishes_in_flight: values.usize(&s::MAX_PUBLISHES_IN_FLIGHT)?,
            memory_log_retention: sheaf_memory::LogRetention {
                max_age: Some(values.duration(&s::MEMORY_LOG_MAX_AGE)?),
                max_events: values.usize(&s::MEMORY_LOG_MAX_EVENTS)?,
                max_attempts: values.usize(&s::MEMORY_LOG_MAX_ATTEMPTS)?,
            },
            memory_max_pending_events: values.int(&s::MEMORY_MAX_PENDING_EVENTS)?,
            memory_max_pending_bytes: values.int(&s::MEMORY_MAX_PENDING_BYTES)?,
            outbox_max_events: values.int(&s::OUTBOX_MAX_EVENTS)?,
            idempotency_window: values.duration(&s::IDEMPOTENCY_WINDOW)?,
            allow_private_destinations: values.bool(&s::ALLOW_PRIVATE_DESTINATIONS)?,
            egress_proxy: parse_egress_proxy(&values)?,
            tls_ca_file,
            secret_rotation_grace: values.duration(&s::SECRET_ROTATION_GRACE)?,
            entity_cache_ttl: values.duration(&s::ENTITY_CACHE_TTL)?,
            shutdown_timeout: values.duration(&s::SHUTDOWN_TIMEOUT)?,
            disable_after_failures: values.u32(&s::DESTINATION_DISABLE_AFTER_FAILURES)?,
            operator_webhook: parse_operator_webhook(&values)?,
            traces: otlp_endpoint.is_some(),
            cdc,
            transforms: TransformConfig {
                runner: parse_transform_runner(&values),
                runners: values.usize(&s::TRANSFORM_RUNNERS)?,
                max_body_bytes: values.usize(&s::MAX_BODY_BYTES)?,
            },
        };
        Ok(Self {
            engine,
            listen,
            api_key,
            token_signing_key,
            token_max_ttl: values.duration(&s::TOKEN_MAX_TTL)?,
            public_url: parse_public_url(&values)?,
            max_body_bytes: values.usize(&s::MAX_BODY_BYTES)?,
            request_timeout: values.duration(&s::REQUEST_TIMEOUT)?,
            log_filter: values.get(&s::LOG).unwrap_or_default(),
            log_format: values.choice_of(&s::LOG_FORMAT, names::LOG_FORMAT_WORDS)?,
            otlp_endpoint,
            otlp_sample_percent: values.u32(&s::OTLP_SAMPLE_PERCENT)?,
        })
    }
}

/// The adaptive event lookup's bound on gathering; it only gathers while a read is in flight,
/// so this is reached only under load. Shorter than `LookupConfig::default()`'s 50 ms, which
/// suits the fixed mode of retries: a first delivery's wait is publish-to-delivery latency.
const EVENT_LOOKUP_MAX_WAIT: Duration = Duration::from_millis(20);

fn parse_listen(values: &Values) -> Result<SocketAddr, ConfigError> {
    let raw = values.get(&s::LISTEN).unwrap_or_default();
    raw.parse()
        .map_err(|_| ConfigError::new(s::LISTEN.name, format!("{raw:?} is not an ip:port address")))
}

/// An open admin API is allowed on loopback only, and a token key without an admin key would
/// restrict nothing.
fn check_admin_access(
    listen: SocketAddr,
    api_key: Option<&AdminKey>,
    token_key: bool,
) -> Result<(), ConfigError> {
    if token_key && api_key.is_none() {
        return Err(ConfigError::new(
            s::TOKEN_SIGNING_KEY.name,
            "is set but SHEAF_API_KEY is not: with an open admin API a tenant token restricts nothing; set SHEAF_API_KEY too",
        ));
    }
    if api_key.is_none() && !listen.ip().is_loopback() {
        return Err(ConfigError::new(
            s::API_KEY.name,
            format!(
                "is not set and SHEAF_LISTEN {listen} is not a loopback address; set an admin key, or listen on 127.0.0.1"
            ),
        ));
    }
    Ok(())
}

fn parse_retry(values: &Values) -> Result<RetryConfig, ConfigError> {
    Ok(RetryConfig {
        schedule: values.durations(&s::RETRY_SCHEDULE)?,
        max_attempts: values.u32(&s::RETRY_MAX_ATTEMPTS)?,
        jitter_percent: values.u32(&s::RETRY_JITTER_PERCENT)?,
        not_ready_delay: values.duration(&s::RETRY_NOT_READY_DELAY)?,
        retry_after_max: values.duration(&s::RETRY_AFTER_MAX)?,
    })
}

/// A lease shorter than a delivery may take would hand a slow delivery's job to another worker.
fn check_lease(queue_lease: Duration, delivery_timeout: Duration) -> Result<(), ConfigError> {
    if queue_lease <= delivery_timeout {
        return Err(ConfigError::new(
            s::QUEUE_LEASE.name,
            format!(
                "{} must be longer than SHEAF_DELIVERY_TIMEOUT ({}), or a slow delivery would lose its job to another worker",
                format_duration(queue_lease),
                format_duration(delivery_timeout)
            ),
        ));
    }
    Ok(())
}

/// `SHEAF_PUBLIC_URL`: an `http` or `https` URL with a host, nothing after it.
fn parse_public_url(values: &Values) -> Result<Option<String>, ConfigError> {
    let Some(raw) = values.optional(&s::PUBLIC_URL) else {
        return Ok(None);
    };
    let fail = |m: &str| ConfigError::new(s::PUBLIC_URL.name, format!("{raw:?} {m}"));
    let url = reqwest::Url::parse(&raw).map_err(|_| fail("is not a URL"))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(fail("must be an http:// or https:// URL with a host"));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(fail(
            "must be only scheme, host and port (no path, query or fragment)",
        ));
    }
    Ok(Some(url.as_str().trim_end_matches('/').to_owned()))
}

/// `SHEAF_EGRESS_PROXY`: an `http` or `https` URL with a host and a port, nothing after it.
/// `SHEAF_TRANSFORM_RUNNER`: an executable and its arguments, split at spaces; unset, this
/// binary. Whether it starts a runner is checked at start-up, when the engine runs.
fn parse_transform_runner(values: &Values) -> TransformRunner {
    let Some(raw) = values.optional(&s::TRANSFORM_RUNNER) else {
        return TransformRunner::ThisExecutable;
    };
    let mut words = raw.split_whitespace();
    match words.next() {
        None => TransformRunner::ThisExecutable,
        Some(program) => TransformRunner::Command(sheaf_transform::pool::RunnerCommand {
            program: program.into(),
            args: words.map(Into::into).collect(),
        }),
    }
}

fn parse_egress_proxy(values: &Values) -> Result<Option<url::Url>, ConfigError> {
    let Some(raw) = values.optional(&s::EGRESS_PROXY) else {
        return Ok(None);
    };
    let fail = |m: String| ConfigError::new(s::EGRESS_PROXY.name, m);
    let url = reqwest::Url::parse(&raw)
        .map_err(|e| fail(format!("{:?} is not a URL: {e}", redact_userinfo(&raw))))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(fail(format!(
            "{:?} must be an http:// or https:// proxy URL with a host",
            redact_userinfo(&raw)
        )));
    }
    if !matches!(url.path(), "" | "/") || url.query().is_some() || url.fragment().is_some() {
        return Err(fail(format!(
            "{:?} must be only scheme, host and port (no path, query or fragment)",
            redact_userinfo(&raw)
        )));
    }
    reqwest::Proxy::all(url.clone()).map_err(|e| fail(format!("is not a usable proxy: {e}")))?;
    Ok(Some(url))
}

/// `SHEAF_OPERATOR_WEBHOOK_URL` with its secret: both or neither, an http(s) URL with a host, and a
/// Standard Webhooks secret whose key is 24 to 64 bytes.
fn parse_operator_webhook(values: &Values) -> Result<Option<OperatorWebhook>, ConfigError> {
    let url = values.optional(&s::OPERATOR_WEBHOOK_URL);
    let secret = values.optional(&s::OPERATOR_WEBHOOK_SECRET);
    let (raw, secret) = match (url, secret) {
        (None, None) => return Ok(None),
        (Some(raw), Some(secret)) => (raw, secret),
        (Some(_), None) => {
            return Err(ConfigError::new(
                s::OPERATOR_WEBHOOK_SECRET.name,
                "is required with SHEAF_OPERATOR_WEBHOOK_URL: operator events are signed",
            ));
        }
        (None, Some(_)) => {
            return Err(ConfigError::new(
                s::OPERATOR_WEBHOOK_URL.name,
                "is required with SHEAF_OPERATOR_WEBHOOK_SECRET (or unset the secret)",
            ));
        }
    };
    let url = reqwest::Url::parse(&raw)
        .ok()
        .filter(|u| matches!(u.scheme(), "http" | "https") && u.host_str().is_some())
        .ok_or_else(|| {
            ConfigError::new(
                s::OPERATOR_WEBHOOK_URL.name,
                format!(
                    "{:?} is not an http:// or https:// URL with a host",
                    redact_userinfo(&raw)
                ),
            )
        })?;
    let key = secret
        .strip_prefix("whsec_")
        .and_then(|rest| {
            use base64::Engine as _;
            base64::engine::general_purpose::STANDARD.decode(rest).ok()
        })
        .filter(|key| (24..=64).contains(&key.len()));
    if key.is_none() {
        return Err(ConfigError::new(
            s::OPERATOR_WEBHOOK_SECRET.name,
            "must be whsec_ followed by the standard base64 of 24 to 64 bytes",
        ));
    }
    let secret = sheaf_store::Secret::new(secret)
        .map_err(|e| ConfigError::new(s::OPERATOR_WEBHOOK_SECRET.name, e.to_string()))?;
    Ok(Some(OperatorWebhook { url, secret }))
}

/// The URL with anything before an `@` hidden: a proxy's credentials stay out of messages.
fn redact_userinfo(raw: &str) -> String {
    match (raw.split_once("://"), raw.rsplit_once('@')) {
        (Some((scheme, _)), Some((_, host))) => format!("{scheme}://***@{host}"),
        _ => raw.to_owned(),
    }
}

/// `SHEAF_TLS_CA_FILE`: loaded here, so a file that cannot be used stops start-up by name.
fn parse_tls_ca_file(values: &Values) -> Result<Option<PathBuf>, ConfigError> {
    let Some(raw) = values.optional(&s::TLS_CA_FILE) else {
        return Ok(None);
    };
    let path = PathBuf::from(raw);
    sheaf_tls::roots(Some(&path))
        .map_err(|e| ConfigError::new(s::TLS_CA_FILE.name, e.to_string()))?;
    Ok(Some(path))
}

/// `SHEAF_OTLP_ENDPOINT`: an `http` or `https` URL without a query, kept without its trailing
/// slash (the exporter appends `/v1/traces`).
fn parse_otlp_endpoint(values: &Values) -> Result<Option<String>, ConfigError> {
    let Some(raw) = values.optional(&s::OTLP_ENDPOINT) else {
        return Ok(None);
    };
    let fail = |m: String| ConfigError::new(s::OTLP_ENDPOINT.name, m);
    let url = reqwest::Url::parse(&raw).map_err(|e| fail(format!("{raw:?} is not a URL: {e}")))?;
    if !matches!(url.scheme(), "http" | "https") || url.host_str().is_none() {
        return Err(fail(format!(
            "{raw:?} must be an http:// or https:// URL with a host"
        )));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(fail(format!("{raw:?} must not have a query or a fragment")));
    }
    Ok(Some(raw.trim_end_matches('/').to_owned()))
}
