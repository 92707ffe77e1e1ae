//! Configuration: every `SHEAF_*` setting, defined once in [`SETTINGS`], read from the
//! environment and an optional TOML file (the environment wins).
//!
//! The table drives everything a person reads about a setting: `sheaf --help` prints it,
//! a test checks that `docs/configuration.md` has one row per entry, and [`Config::load`]
//! reads each value through it, so a setting cannot exist in the code without its name,
//! default and meaning. An invalid value is refused with the setting's name.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use sheaf_cdc::{BatchingPolicy, CdcConfig, ConnectionConfig, PublicationTables, StreamOptions};
use sheaf_coalesce::{LookupConfig, WriteConfig};

use crate::cdc::{CdcSettings, TableTenants};
use crate::secrets::SecretsKey;
use crate::tokens::TokenKey;

/// One setting: its variable name, default, what it means and which values it accepts.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The environment variable, e.g. `SHEAF_LISTEN`. In the TOML file the same setting is
    /// the name without `SHEAF_`, lower-case (`listen`).
    pub name: &'static str,
    /// The default as written in the docs; `None` means unset.
    pub default: Option<&'static str>,
    /// What it does, one sentence.
    pub meaning: &'static str,
    /// What it accepts.
    pub valid: &'static str,
}

impl Setting {
    /// The key that sets it in the TOML file.
    pub fn file_key(&self) -> String {
        self.name
            .strip_prefix("SHEAF_")
            .unwrap_or(self.name)
            .to_ascii_lowercase()
    }
}

/// Every setting the service reads. Defaults cite where they come from; `Config::load` reads
/// each of these names and no other.
pub const SETTINGS: &[Setting] = &[
    Setting {
        name: "SHEAF_CONFIG_FILE",
        default: None,
        meaning: "Path of a TOML file that sets any other setting by its name without `SHEAF_`, lower-case (`listen = \"127.0.0.1:8470\"`); environment variables win over it. Environment only.",
        valid: "a readable file path",
    },
    Setting {
        name: "SHEAF_LISTEN",
        default: Some("127.0.0.1:8470"),
        meaning: "Address the HTTP API listens on.",
        valid: "`ip:port`",
    },
    Setting {
        name: "SHEAF_API_KEY",
        default: None,
        meaning: "Admin bearer token (`Authorization: Bearer <key>`) for everything under `/api/v1` except the OpenAPI document; tenant tokens (below) reach a part of it. Unset: the API is open, which is only allowed when `SHEAF_LISTEN` is a loopback address (start-up refuses otherwise and the log says so).",
        valid: "at least 16 characters",
    },
    // Its own key, not one derived from SHEAF_API_KEY: rotating the admin key must not silently
    // revoke every tenant token, and a leak of one must not be a leak of both.
    Setting {
        name: "SHEAF_TOKEN_SIGNING_KEY",
        default: None,
        meaning: "Key that signs tenant-scoped API tokens (HMAC-SHA256). Set: the admin route `POST /api/v1/tenants/{tenant_id}/tokens` issues tokens that reach only that tenant's routes and its publishes. Unset: no token is issued or accepted. Changing it revokes every token issued with the old key. Needs `SHEAF_API_KEY` (with an open admin API a token would restrict nothing).",
        valid: "standard base64 of at least 32 bytes (`head -c 32 /dev/urandom | base64`)",
    },
    // Tokens cannot be revoked one by one, so their lifetime is what bounds a leaked one; a month
    // covers a monthly rotation in a deploy pipeline.
    Setting {
        name: "SHEAF_TOKEN_MAX_TTL",
        default: Some("30d"),
        meaning: "Longest lifetime a tenant token may be issued with (`ttl_seconds` above it is refused).",
        valid: "a duration, 1m..365d",
    },
    Setting {
        name: "SHEAF_LOG_STORE",
        default: Some("memory"),
        meaning: "Where events and attempts are recorded.",
        valid: "`memory`, `postgres`, `clickhouse`",
    },
    Setting {
        name: "SHEAF_QUEUE",
        default: Some("memory"),
        meaning: "Where pending deliveries wait. Several processes share work only through `postgres`. Tenants and destinations live in Postgres whenever the queue or the log store does, in memory otherwise.",
        valid: "`memory`, `postgres`",
    },
    Setting {
        name: "SHEAF_POSTGRES_URL",
        default: None,
        meaning: "Postgres connection URL; required when the queue or the log store is `postgres`.",
        valid: "`postgres://user:password@host:port/database`",
    },
    Setting {
        name: "SHEAF_CLICKHOUSE_URL",
        default: None,
        meaning: "ClickHouse HTTP URL; required when the log store is `clickhouse`.",
        valid: "`http://[user[:password]@]host:port`",
    },
    Setting {
        name: "SHEAF_POSTGRES_SCHEMA",
        default: Some("sheaf"),
        meaning: "Postgres schema that holds Sheaf's tables; processes that should share work must use the same one.",
        valid: "lower-case letters, digits and `_`, not starting with a digit, at most 63 bytes",
    },
    Setting {
        name: "SHEAF_CLICKHOUSE_DATABASE",
        default: Some("sheaf"),
        meaning: "ClickHouse database that holds the log's tables (created at start).",
        valid: "ASCII letters, digits and `_`, not starting with a digit, at most 64 bytes",
    },
    // Five retries spread over about seven hours ride out a deploy or a short outage without
    // hammering a receiver; seed 000's reproduction used a similar climb (1 s, 5 s, 5 min,
    // 30 min). The span stays well inside the memory log's three days of retention, so a
    // retry always finds its previous attempt.
    Setting {
        name: "SHEAF_RETRY_SCHEDULE",
        default: Some("5s,1m,10m,1h,6h"),
        meaning: "Delays before each retry of a failed delivery: the first retry waits the first delay, and so on; past the end of the list the last delay repeats. Each delay gets the jitter below.",
        valid: "comma-separated durations (`500ms`, `5s`, `1m`, `2h`, `1d`), each 100ms..7d",
    },
    // The first delivery plus one retry per entry of the default schedule.
    Setting {
        name: "SHEAF_RETRY_MAX_ATTEMPTS",
        default: Some("6"),
        meaning: "Attempts (the first delivery included) before a delivery is dead-lettered.",
        valid: "1..=100",
    },
    Setting {
        name: "SHEAF_RETRY_JITTER_PERCENT",
        default: Some("20"),
        meaning: "Each retry delay is moved by a random amount within plus or minus this share of it, so retries of one outage do not come back in lockstep.",
        valid: "0..=100",
    },
    Setting {
        name: "SHEAF_RETRY_NOT_READY_DELAY",
        default: Some("1s"),
        meaning: "How long a retry waits when its previous attempt is not logged yet (or the lookup failed) before it looks again; such a wait does not count as an attempt.",
        valid: "a duration, 10ms..10m",
    },
    Setting {
        name: "SHEAF_RETRY_AFTER_MAX",
        default: Some("1h"),
        meaning: "Longest `Retry-After` a destination can ask for; longer values are cut to it, and values under 1s are raised to 1s.",
        valid: "a duration, 1s..7d",
    },
    // Seed 000's measured setting: 50 keys with a 50 ms wait turned 8,416 single lookups into
    // 1,286 batch queries and cut ClickHouse's mean CPU from 73 % to 29 %. The seed shipped it off
    // by default only because its CI ClickHouse lacked the lazy-materialization setting; Sheaf's
    // stores all batch (BRIEF), so coalescing is on. 100 is the seed's upper limit (~1 ms of CPU
    // per key at 100 against ~14 ms one by one).
    Setting {
        name: "SHEAF_RETRY_LOOKUP_BATCH_SIZE",
        default: Some("50"),
        meaning: "Retries due together share one latest-attempt query of up to this many keys; 0 turns coalescing off (one query per retry).",
        valid: "0..=100",
    },
    Setting {
        name: "SHEAF_RETRY_LOOKUP_BATCH_WAIT_MS",
        default: Some("50"),
        meaning: "How long a retry lookup batch gathers after its first key before it is sent anyway.",
        valid: "0..=10000",
    },
    // Off: the fixed wait is what seed 000 measured. A retry waits seconds by design, so 50 ms
    // of gathering costs nothing a user sees.
    Setting {
        name: "SHEAF_RETRY_LOOKUP_ADAPTIVE",
        default: Some("false"),
        meaning: "Adaptive retry lookup batching: send at once while no lookup query is in flight and gather only while one is, so a quiet service adds no wait.",
        valid: "`true`, `false`",
    },
    // First deliveries read their payload on the publish path's heels, where latency matters;
    // adaptive batching adds no wait at low load and grows batches only while a read is in flight.
    Setting {
        name: "SHEAF_EVENT_LOOKUP_BATCH_SIZE",
        default: Some("100"),
        meaning: "First deliveries whose payload is not in the fresh-event cache, and publishes checking whether their id is known, read events in batches of up to this many keys (adaptive: no added wait when the store is idle).",
        valid: "1..=1000",
    },
    // At BRIEF's ~2 KB payloads, 10,000 events are ~20 MB of JSON (a few times that parsed):
    // several seconds of backlog at thousands of publishes a second.
    Setting {
        name: "SHEAF_FRESH_EVENT_CACHE",
        default: Some("10000"),
        meaning: "Freshly published events kept in memory so their first delivery needs no read of the log store; also remembers recently accepted ids for idempotent publishing.",
        valid: "0..=10000000",
    },
    // Deliveries wait on the network, not the CPU: 32 concurrent requests keep a 2-core
    // machine busy with receivers answering in tens of milliseconds. The channel holds as many
    // jobs as there are workers (seed 002), so claimed-but-unstarted work stays bounded by it.
    Setting {
        name: "SHEAF_DELIVERY_WORKERS",
        default: Some("32"),
        meaning: "Concurrent webhook deliveries per process; also the capacity of the channel from the dispatcher to the workers. 0 runs no dispatcher and no workers: the process serves the API (and the CDC source) and leaves every delivery to other processes sharing a `postgres` queue (with the `memory` queue nothing delivers, which only tests want).",
        valid: "0..=4096",
    },
    // Long enough for a slow receiver, short enough that a hung one ties up a worker for
    // seconds, not minutes; the lease (below) must outlast it.
    Setting {
        name: "SHEAF_DELIVERY_TIMEOUT",
        default: Some("15s"),
        meaning: "How long one webhook request may take (connect, send, answer) before the attempt fails.",
        valid: "a duration, 100ms..10m; shorter than `SHEAF_QUEUE_LEASE`",
    },
    // Seed 002 leased for 10 s because its work took ~25 ms; a delivery may take up to the 15 s
    // timeout, so the lease is twice that. A crashed process's jobs come back after it.
    Setting {
        name: "SHEAF_QUEUE_LEASE",
        default: Some("30s"),
        meaning: "How long a claim on a job holds; a process that dies leaves its jobs to others after this. A worker renews a lease more than half spent before delivering.",
        valid: "a duration, 1s..1h; longer than `SHEAF_DELIVERY_TIMEOUT`",
    },
    // Bounds how late a due retry is picked up; an idle process then sends ten cheap claim
    // queries a second (one per process, not per worker: seed 002).
    Setting {
        name: "SHEAF_QUEUE_POLL_INTERVAL",
        default: Some("100ms"),
        meaning: "How long the dispatcher sleeps after a claim found fewer due jobs than it had room for (new publishes in this process wake it at once).",
        valid: "a duration, 1ms..1m",
    },
    // BRIEF "Queue designs measured here": one commit per job is WAL-bound (2,800 jobs/s at 4
    // clients against 7,000 batched); a few milliseconds of gathering is invisible next to a
    // webhook's round trip and makes one statement out of every worker's outcomes.
    Setting {
        name: "SHEAF_COMPLETER_FLUSH_INTERVAL",
        default: Some("5ms"),
        meaning: "How long the completer gathers job outcomes (complete, reschedule, dead-letter) from all workers before writing them as one statement per kind.",
        valid: "a duration, 0ms..1s",
    },
    // Eight times the default workers: a full flush carries every worker's outcome several
    // times over, and a statement of a few hundred ids stays small.
    Setting {
        name: "SHEAF_COMPLETER_MAX_BATCH",
        default: Some("256"),
        meaning: "Outcomes that make the completer write at once, without waiting for the interval.",
        valid: "1..=10000",
    },
    // The write coalescer's defaults (`WriteConfig::default`, sized for ClickHouse parts, seed 001).
    Setting {
        name: "SHEAF_LOG_WRITE_MAX_RECORDS",
        default: Some("10000"),
        meaning: "Most events and attempts in one log store write.",
        valid: "1..=1000000",
    },
    Setting {
        name: "SHEAF_LOG_WRITE_MAX_BYTES",
        default: Some("16777216"),
        meaning: "Most bytes (JSON size of the records) in one log store write.",
        valid: "1024..=1073741824",
    },
    // Seed 001 kept its wait at 0 so nothing changed without an operator's decision; it
    // recommends 1-2 s for hot ClickHouse tables, at the cost of that much publish latency.
    Setting {
        name: "SHEAF_LOG_WRITE_MAX_WAIT_MS",
        default: Some("0"),
        meaning: "How long an under-filled log write waits for more records once nothing else is queued; 0 writes at once.",
        valid: "0..=10000",
    },
    // Webhook payloads are small JSON documents; 1 MiB is generous and bounds a request's memory.
    Setting {
        name: "SHEAF_MAX_BODY_BYTES",
        default: Some("1048576"),
        meaning: "Largest accepted request body; larger ones get 413.",
        valid: "1024..=104857600",
    },
    Setting {
        name: "SHEAF_ALLOW_PRIVATE_DESTINATIONS",
        default: Some("false"),
        meaning: "Allow destination URLs whose host is or resolves to a loopback, private, link-local, unspecified or otherwise non-public address. `false` checks the URL when a destination is created or changed, and again at every delivery's connection (the resolved addresses, so a name that later resolves inside the network is refused); deliveries then use no HTTP proxy.",
        valid: "`true`, `false`",
    },
    Setting {
        name: "SHEAF_SECRETS_KEY",
        default: None,
        meaning: "Key that encrypts destination signing secrets at rest (AES-256-GCM), in every entity store: rows hold `enc:v1:…`, never the secret. Secrets stored before it was set still read and are encrypted when next written (rotated). Unset: secrets are stored as they are, and the log warns at start when they live in Postgres. Losing it makes every encrypted secret unreadable; rotating it is not supported yet.",
        valid: "standard base64 of exactly 32 bytes (`head -c 32 /dev/urandom | base64`)",
    },
    // A day gives receivers time to deploy the new secret.
    Setting {
        name: "SHEAF_SECRET_ROTATION_GRACE",
        default: Some("24h"),
        meaning: "How long a rotated-out signing secret keeps signing deliveries next to the new one.",
        valid: "a duration, 0s..30d",
    },
    // Destinations change rarely; 5 s bounds how long another process keeps delivering to an
    // old URL while costing each process one read per tenant every 5 s.
    Setting {
        name: "SHEAF_ENTITY_CACHE_TTL",
        default: Some("5s"),
        meaning: "How long tenants and destinations stay cached; changes made through this process apply at once, changes made through another process within this time.",
        valid: "a duration, 0s..10m",
    },
    // Longer than the 15 s delivery timeout, so an in-flight delivery normally finishes; well
    // under the usual 30 s a supervisor waits before SIGKILL.
    Setting {
        name: "SHEAF_SHUTDOWN_TIMEOUT",
        default: Some("20s"),
        meaning: "On SIGTERM or ctrl-c, how long in-flight deliveries may take to finish before they are abandoned (their jobs come back when their lease ends).",
        valid: "a duration, 0s..10m",
    },
    Setting {
        name: "SHEAF_CDC_ENABLED",
        default: Some("false"),
        meaning: "Run the CDC source: every committed change of the published tables in the application's Postgres becomes an event (topic `<schema>.<table>.<insert|update|delete|truncate>`), published like any other and acknowledged to the replication slot only once durable.",
        valid: "`true`, `false`",
    },
    Setting {
        name: "SHEAF_CDC_POSTGRES_URL",
        default: None,
        meaning: "The application's database, read through logical replication (may differ from `SHEAF_POSTGRES_URL`); required when the CDC source is enabled. The role needs `LOGIN REPLICATION`, and to create the publication it must own the tables. Plain TCP with SCRAM or password authentication; query parameters are ignored.",
        valid: "`postgres://user:password@host:port/database`",
    },
    Setting {
        name: "SHEAF_CDC_SLOT",
        default: Some("sheaf_cdc"),
        meaning: "The logical replication slot (plugin `pgoutput`); a restart resumes from its confirmed position. Postgres lets one connection read a slot at a time: other processes given the same slot keep trying (every 30 s at most) and take over when it is free. Event ids start with `cdc-<slot>-`.",
        valid: "1 to 63 lower-case letters, digits and `_`",
    },
    Setting {
        name: "SHEAF_CDC_PUBLICATION",
        default: Some("sheaf_cdc"),
        meaning: "The publication whose tables are read.",
        valid: "a non-empty name",
    },
    Setting {
        name: "SHEAF_CDC_CREATE_MISSING",
        default: Some("false"),
        meaning: "`false`: the slot and the publication must exist (a missing one is reported and retried). `true`: create what is missing, the publication `FOR TABLE` the tables named in `SHEAF_CDC_TENANTS`.",
        valid: "`true`, `false`; `true` needs `SHEAF_CDC_TENANTS` to name tables",
    },
    Setting {
        name: "SHEAF_CDC_TENANTS",
        default: None,
        meaning: "Which tables feed which tenant: one tenant id for every published table (`acme`), or a comma-separated map `schema.table=tenant`, optionally with `*=tenant` for every other table. Changes of tables the map does not cover are dropped and still acknowledged; `*` never covers the tables in `SHEAF_POSTGRES_SCHEMA`. Required when the CDC source is enabled; the tenants must exist (until one does, its changes wait and are retried).",
        valid: "a tenant id, or `schema.table=tenant,…[,*=tenant]`",
    },
    // Off by default, as in sheaf-cdc and seed 004: a multi-row message changes the unit of
    // failure (one failed write fails the whole transaction's events).
    Setting {
        name: "SHEAF_CDC_BATCH_TRANSACTIONS",
        default: Some("false"),
        meaning: "Publish each replicated transaction as one batch (one log write, one enqueue, one acknowledgement) instead of one message per row. It changes the unit of failure: a failed publish retries the whole transaction's events. Transactions over the row cap (`SHEAF_CDC_CHECKPOINT_LIMIT` / 2, at most 1000) or 4 MiB of WAL still arrive in several batches. Cannot be combined with `SHEAF_CDC_BATCH_SIZE`.",
        valid: "`true`, `false`",
    },
    Setting {
        name: "SHEAF_CDC_BATCH_SIZE",
        default: Some("0"),
        meaning: "A batching policy instead: publish up to this many rows (possibly of several transactions) as one batch, waiting at most `SHEAF_CDC_BATCH_WAIT` for them; 0 = no policy (one row per message, or one transaction with `SHEAF_CDC_BATCH_TRANSACTIONS`).",
        valid: "0..=10000",
    },
    Setting {
        name: "SHEAF_CDC_BATCH_WAIT",
        default: Some("20ms"),
        meaning: "Longest wait for more rows once a policy batch (`SHEAF_CDC_BATCH_SIZE`) has its first.",
        valid: "a duration, 0ms..10s",
    },
    // sheaf-cdc's default (seed 004: row cap min(1000, limit / 2), 512 by default).
    Setting {
        name: "SHEAF_CDC_CHECKPOINT_LIMIT",
        default: Some("1024"),
        meaning: "Most rows read from the slot and not yet acknowledged; the reader waits beyond it. Reader batches hold at most half of it (and at most 1000 rows).",
        valid: "1..=1000000",
    },
    // Each message's publish waits on the log write and the enqueue; a few in flight let the
    // log write coalescer and the event lookup coalescer gather them (seed 001), while the
    // checkpoint limit still bounds the rows held.
    Setting {
        name: "SHEAF_CDC_MAX_IN_FLIGHT",
        default: Some("16"),
        meaning: "Messages from the slot being published at once; each is acknowledged on its own once durable, and the slot advances over the acknowledged prefix only. 1 publishes strictly one after another.",
        valid: "1..=1024",
    },
    Setting {
        name: "SHEAF_CDC_HEARTBEAT_INTERVAL",
        default: Some("0s"),
        meaning: "When above 0, a logical decoding message is written to the application's database on this interval, so the slot keeps advancing when the published tables are idle; 0s = off (keepalives already advance it when other databases write WAL).",
        valid: "`0s`, or a duration 1s..1h",
    },
    Setting {
        name: "SHEAF_LOG",
        default: Some("info"),
        meaning: "Log filter for the service's own log lines (tracing `EnvFilter` syntax).",
        valid: "e.g. `info`, `sheaf_server=debug,info`",
    },
];

/// The setting named `name`. Panics on a name not in [`SETTINGS`]: that is a bug in this file.
fn setting(name: &str) -> &'static Setting {
    SETTINGS
        .iter()
        .find(|s| s.name == name)
        .unwrap_or_else(|| panic!("{name} is not in SETTINGS"))
}

/// A refused configuration: which setting, and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {setting}: {message}")]
pub struct ConfigError {
    /// The setting at fault (`SHEAF_…`).
    pub setting: String,
    /// What is wrong with it, lower-case.
    pub message: String,
}

impl ConfigError {
    fn new(setting: &str, message: impl Into<String>) -> Self {
        Self {
            setting: setting.to_owned(),
            message: message.into(),
        }
    }
}

/// Where the log store lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogStoreKind {
    /// In this process (the default).
    Memory,
    /// Postgres (`SHEAF_POSTGRES_URL`).
    Postgres,
    /// ClickHouse (`SHEAF_CLICKHOUSE_URL`).
    ClickHouse,
}

/// Where the job queue lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueKind {
    /// In this process (the default).
    Memory,
    /// Postgres (`SHEAF_POSTGRES_URL`), shared by every process that points at it.
    Postgres,
}

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

/// The admin key (`SHEAF_API_KEY`). `Debug` never prints it, so neither does a `Config`.
#[derive(Clone, PartialEq, Eq)]
pub struct AdminKey(String);

impl AdminKey {
    /// The key itself, for the constant-time comparison with a presented one.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdminKey(<redacted>)")
    }
}

/// Everything the service runs with. Built by [`Config::load`]; tests build it from a map.
#[derive(Debug, Clone)]
pub struct Config {
    /// `SHEAF_LISTEN`.
    pub listen: SocketAddr,
    /// `SHEAF_API_KEY`.
    pub api_key: Option<AdminKey>,
    /// `SHEAF_TOKEN_SIGNING_KEY`: tenant tokens are issued and accepted only with it.
    pub token_signing_key: Option<TokenKey>,
    /// `SHEAF_TOKEN_MAX_TTL`.
    pub token_max_ttl: Duration,
    /// `SHEAF_SECRETS_KEY`: destination secrets are sealed with it in every entity store.
    pub secrets_key: Option<SecretsKey>,
    /// `SHEAF_LOG_STORE`.
    pub log_store: LogStoreKind,
    /// `SHEAF_QUEUE`.
    pub queue: QueueKind,
    /// `SHEAF_POSTGRES_URL`.
    pub postgres_url: Option<String>,
    /// `SHEAF_CLICKHOUSE_URL`.
    pub clickhouse_url: Option<String>,
    /// `SHEAF_POSTGRES_SCHEMA`.
    pub postgres_schema: String,
    /// `SHEAF_CLICKHOUSE_DATABASE`.
    pub clickhouse_database: String,
    /// `SHEAF_RETRY_*` except the lookup.
    pub retry: RetryConfig,
    /// `SHEAF_RETRY_LOOKUP_*`: the coalescer in front of `LogStore::latest_attempts`.
    pub retry_lookup: LookupConfig,
    /// `SHEAF_EVENT_LOOKUP_BATCH_SIZE`: the coalescer in front of `LogStore::get_events`.
    pub event_lookup: LookupConfig,
    /// `SHEAF_FRESH_EVENT_CACHE`.
    pub fresh_event_cache: u64,
    /// `SHEAF_DELIVERY_WORKERS`.
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
    /// `SHEAF_MAX_BODY_BYTES`.
    pub max_body_bytes: usize,
    /// `SHEAF_ALLOW_PRIVATE_DESTINATIONS`.
    pub allow_private_destinations: bool,
    /// `SHEAF_SECRET_ROTATION_GRACE`.
    pub secret_rotation_grace: Duration,
    /// `SHEAF_ENTITY_CACHE_TTL`.
    pub entity_cache_ttl: Duration,
    /// `SHEAF_SHUTDOWN_TIMEOUT`.
    pub shutdown_timeout: Duration,
    /// `SHEAF_LOG`.
    pub log_filter: String,
    /// `SHEAF_CDC_*`: the CDC source, when `SHEAF_CDC_ENABLED=true`.
    pub cdc: Option<CdcSettings>,
}

/// The raw values of one load: file values overlaid by the environment, and which names
/// were read (a test checks every entry of [`SETTINGS`] is).
struct Raw {
    values: HashMap<String, String>,
    read: Mutex<BTreeSet<&'static str>>,
}

impl Raw {
    /// The value of `name`, or its default; `None` when unset without a default.
    fn get(&self, name: &str) -> Option<String> {
        let setting = setting(name);
        if let Ok(mut read) = self.read.lock() {
            read.insert(setting.name);
        }
        match self.values.get(name) {
            Some(value) => Some(value.trim().to_owned()),
            None => setting.default.map(str::to_owned),
        }
    }

    /// A value that has a default.
    fn value(&self, name: &str) -> String {
        self.get(name).unwrap_or_default()
    }

    fn optional(&self, name: &str) -> Option<String> {
        self.get(name).filter(|v| !v.is_empty())
    }

    fn bool(&self, name: &str) -> Result<bool, ConfigError> {
        let raw = self.value(name);
        match raw.to_ascii_lowercase().as_str() {
            "true" | "1" | "yes" | "on" => Ok(true),
            "false" | "0" | "no" | "off" => Ok(false),
            _ => Err(ConfigError::new(
                name,
                format!("{raw:?} is not a boolean (use true or false)"),
            )),
        }
    }

    fn int(&self, name: &str, min: u64, max: u64) -> Result<u64, ConfigError> {
        let raw = self.value(name);
        let n: u64 = raw.parse().map_err(|_| {
            ConfigError::new(name, format!("{raw:?} is not a whole non-negative number"))
        })?;
        if n < min {
            return Err(ConfigError::new(
                name,
                format!("{n} is below the minimum of {min}"),
            ));
        }
        if n > max {
            return Err(ConfigError::new(
                name,
                format!("{n} is above the maximum of {max}"),
            ));
        }
        Ok(n)
    }

    fn usize(&self, name: &str, min: u64, max: u64) -> Result<usize, ConfigError> {
        let n = self.int(name, min, max)?;
        usize::try_from(n).map_err(|_| ConfigError::new(name, format!("{n} is too large")))
    }

    fn duration(&self, name: &str, min: Duration, max: Duration) -> Result<Duration, ConfigError> {
        let raw = self.value(name);
        let d = parse_duration(&raw).map_err(|m| ConfigError::new(name, m))?;
        check_range(name, &raw, d, min, max)?;
        Ok(d)
    }
}

fn check_range(
    name: &str,
    raw: &str,
    d: Duration,
    min: Duration,
    max: Duration,
) -> Result<(), ConfigError> {
    if d < min {
        return Err(ConfigError::new(
            name,
            format!("{raw} is below the minimum of {}", format_duration(min)),
        ));
    }
    if d > max {
        return Err(ConfigError::new(
            name,
            format!("{raw} is above the maximum of {}", format_duration(max)),
        ));
    }
    Ok(())
}

/// Parses `500ms`, `5s`, `1m`, `2h`, `1d`.
pub fn parse_duration(raw: &str) -> Result<Duration, String> {
    let raw = raw.trim();
    let split = raw
        .find(|c: char| !c.is_ascii_digit())
        .ok_or_else(|| format!("{raw:?} has no unit (write e.g. 500ms, 5s, 1m, 2h or 1d)"))?;
    let (digits, unit) = raw.split_at(split);
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("{raw:?} is not a duration such as 500ms, 5s, 1m, 2h or 1d"))?;
    let unit_ms: u64 = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => {
            return Err(format!(
                "{raw:?} has an unknown unit {unit:?} (use ms, s, m, h or d)"
            ));
        }
    };
    n.checked_mul(unit_ms)
        .map(Duration::from_millis)
        .ok_or_else(|| format!("{raw:?} is too long"))
}

/// The shortest exact spelling of `d` that [`parse_duration`] reads back.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    for (unit, size) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1_000),
    ] {
        if ms >= size && ms.is_multiple_of(size) {
            return format!("{}{unit}", ms / size);
        }
    }
    format!("{ms}ms")
}

/// Reads the TOML file into setting names and string values.
fn read_file(path: &PathBuf) -> Result<HashMap<String, String>, ConfigError> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        ConfigError::new(
            "SHEAF_CONFIG_FILE",
            format!("cannot read {}: {e}", path.display()),
        )
    })?;
    let table: toml::Table = toml::from_str(&text).map_err(|e| {
        ConfigError::new(
            "SHEAF_CONFIG_FILE",
            format!("{} is not valid TOML: {e}", path.display()),
        )
    })?;
    let by_key: BTreeMap<String, &'static Setting> =
        SETTINGS.iter().map(|s| (s.file_key(), s)).collect();
    let mut values = HashMap::new();
    for (key, value) in table {
        let setting = by_key.get(&key).ok_or_else(|| {
            ConfigError::new(
                "SHEAF_CONFIG_FILE",
                format!("{} sets unknown key {key:?}", path.display()),
            )
        })?;
        if setting.name == "SHEAF_CONFIG_FILE" {
            return Err(ConfigError::new(
                "SHEAF_CONFIG_FILE",
                "the file cannot name another file",
            ));
        }
        let text = match value {
            toml::Value::String(s) => s,
            toml::Value::Integer(i) => i.to_string(),
            toml::Value::Boolean(b) => b.to_string(),
            toml::Value::Array(items) => items
                .iter()
                .map(|v| match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(i) => i.to_string(),
                    other => format!("{other:?}"),
                })
                .collect::<Vec<_>>()
                .join(","),
            other => {
                return Err(ConfigError::new(
                    setting.name,
                    format!(
                        "{} in {} is not a string, number or boolean",
                        other.type_str(),
                        path.display()
                    ),
                ));
            }
        };
        values.insert(setting.name.to_owned(), text);
    }
    Ok(values)
}

impl Config {
    /// Reads the process environment (and the file it names).
    pub fn from_env() -> Result<Self, ConfigError> {
        Self::load(std::env::vars().collect())
    }

    /// Reads settings from `env` (variable name to value) and the TOML file named by its
    /// `SHEAF_CONFIG_FILE`, the environment winning; anything not set takes its default.
    pub fn load(env: HashMap<String, String>) -> Result<Self, ConfigError> {
        Ok(Self::load_tracked(env)?.0)
    }

    /// [`Config::load`], also returning the setting names it read.
    fn load_tracked(
        env: HashMap<String, String>,
    ) -> Result<(Self, BTreeSet<&'static str>), ConfigError> {
        let known: BTreeSet<&str> = SETTINGS.iter().map(|s| s.name).collect();
        let mut values = match env.get("SHEAF_CONFIG_FILE").filter(|p| !p.is_empty()) {
            Some(path) => read_file(&PathBuf::from(path))?,
            None => HashMap::new(),
        };
        for (name, value) in env {
            if known.contains(name.as_str()) {
                values.insert(name, value);
            }
        }
        let raw = Raw {
            values,
            read: Mutex::new(BTreeSet::new()),
        };
        let config = Self::parse(&raw)?;
        let read = raw.read.into_inner().unwrap_or_default();
        Ok((config, read))
    }

    fn parse(raw: &Raw) -> Result<Self, ConfigError> {
        // Read for completeness: the file was already loaded from it.
        let _ = raw.get("SHEAF_CONFIG_FILE");
        let listen_raw = raw.value("SHEAF_LISTEN");
        let listen: SocketAddr = listen_raw.parse().map_err(|_| {
            ConfigError::new(
                "SHEAF_LISTEN",
                format!("{listen_raw:?} is not an ip:port address"),
            )
        })?;
        let api_key = raw.optional("SHEAF_API_KEY");
        if let Some(key) = &api_key
            && key.len() < 16
        {
            return Err(ConfigError::new(
                "SHEAF_API_KEY",
                format!("is {} characters long, at least 16 are needed", key.len()),
            ));
        }
        let api_key = api_key.map(AdminKey);
        let token_signing_key = raw
            .optional("SHEAF_TOKEN_SIGNING_KEY")
            .map(|k| TokenKey::from_base64(&k))
            .transpose()
            .map_err(|m| ConfigError::new("SHEAF_TOKEN_SIGNING_KEY", m))?;
        if token_signing_key.is_some() && api_key.is_none() {
            return Err(ConfigError::new(
                "SHEAF_TOKEN_SIGNING_KEY",
                "is set but SHEAF_API_KEY is not: with an open admin API a tenant token restricts nothing; set SHEAF_API_KEY too",
            ));
        }
        let token_max_ttl = raw.duration(
            "SHEAF_TOKEN_MAX_TTL",
            Duration::from_secs(60),
            Duration::from_secs(365 * 86_400),
        )?;
        let secrets_key = raw
            .optional("SHEAF_SECRETS_KEY")
            .map(|k| SecretsKey::from_base64(&k))
            .transpose()
            .map_err(|m| ConfigError::new("SHEAF_SECRETS_KEY", m))?;
        if api_key.is_none() && !listen.ip().is_loopback() {
            return Err(ConfigError::new(
                "SHEAF_API_KEY",
                format!(
                    "is not set and SHEAF_LISTEN {listen} is not a loopback address; set an admin key, or listen on 127.0.0.1"
                ),
            ));
        }
        let log_store = match raw.value("SHEAF_LOG_STORE").as_str() {
            "memory" => LogStoreKind::Memory,
            "postgres" => LogStoreKind::Postgres,
            "clickhouse" => LogStoreKind::ClickHouse,
            other => {
                return Err(ConfigError::new(
                    "SHEAF_LOG_STORE",
                    format!("{other:?} is not one of memory, postgres, clickhouse"),
                ));
            }
        };
        let queue = match raw.value("SHEAF_QUEUE").as_str() {
            "memory" => QueueKind::Memory,
            "postgres" => QueueKind::Postgres,
            other => {
                return Err(ConfigError::new(
                    "SHEAF_QUEUE",
                    format!("{other:?} is not one of memory, postgres"),
                ));
            }
        };
        let postgres_url = raw.optional("SHEAF_POSTGRES_URL");
        let clickhouse_url = raw.optional("SHEAF_CLICKHOUSE_URL");
        // The stores validate these names themselves when they connect; checked here too so the
        // error names the setting.
        let postgres_schema = raw.value("SHEAF_POSTGRES_SCHEMA");
        let schema_ok = !postgres_schema.is_empty()
            && postgres_schema.len() <= 63
            && postgres_schema
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
            && !postgres_schema.as_bytes()[0].is_ascii_digit();
        if !schema_ok {
            return Err(ConfigError::new(
                "SHEAF_POSTGRES_SCHEMA",
                format!("{postgres_schema:?} is not a plain lower-case identifier"),
            ));
        }
        let clickhouse_database = raw.value("SHEAF_CLICKHOUSE_DATABASE");
        let database_ok = !clickhouse_database.is_empty()
            && clickhouse_database.len() <= 64
            && clickhouse_database
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_')
            && !clickhouse_database.as_bytes()[0].is_ascii_digit();
        if !database_ok {
            return Err(ConfigError::new(
                "SHEAF_CLICKHOUSE_DATABASE",
                format!("{clickhouse_database:?} is not a plain identifier"),
            ));
        }
        if (log_store == LogStoreKind::Postgres || queue == QueueKind::Postgres)
            && postgres_url.is_none()
        {
            return Err(ConfigError::new(
                "SHEAF_POSTGRES_URL",
                "is required when SHEAF_LOG_STORE or SHEAF_QUEUE is postgres",
            ));
        }
        if log_store == LogStoreKind::ClickHouse && clickhouse_url.is_none() {
            return Err(ConfigError::new(
                "SHEAF_CLICKHOUSE_URL",
                "is required when SHEAF_LOG_STORE is clickhouse",
            ));
        }
        // Job rows carry no payload (seed 002): a delivery reads its event from the log store.
        // A durable queue in front of a memory log store loses every pending delivery on a
        // restart, and in a second process finds no event at all (the fault suite saw 2 of 200
        // events dropped that way), so the combination is refused rather than documented.
        if queue == QueueKind::Postgres && log_store == LogStoreKind::Memory {
            return Err(ConfigError::new(
                "SHEAF_LOG_STORE",
                "memory cannot back SHEAF_QUEUE=postgres: queued jobs carry no payload and read it from the log store, which must be as durable and as shared as the queue; use postgres or clickhouse",
            ));
        }

        let schedule_raw = raw.value("SHEAF_RETRY_SCHEDULE");
        let mut schedule = Vec::new();
        for part in schedule_raw.split(',') {
            let part = part.trim();
            if part.is_empty() {
                return Err(ConfigError::new(
                    "SHEAF_RETRY_SCHEDULE",
                    format!("{schedule_raw:?} has an empty entry"),
                ));
            }
            let d =
                parse_duration(part).map_err(|m| ConfigError::new("SHEAF_RETRY_SCHEDULE", m))?;
            check_range(
                "SHEAF_RETRY_SCHEDULE",
                part,
                d,
                Duration::from_millis(100),
                Duration::from_secs(7 * 86_400),
            )?;
            schedule.push(d);
        }
        let retry = RetryConfig {
            schedule,
            max_attempts: u32::try_from(raw.int("SHEAF_RETRY_MAX_ATTEMPTS", 1, 100)?)
                .unwrap_or(100),
            jitter_percent: u32::try_from(raw.int("SHEAF_RETRY_JITTER_PERCENT", 0, 100)?)
                .unwrap_or(100),
            not_ready_delay: raw.duration(
                "SHEAF_RETRY_NOT_READY_DELAY",
                Duration::from_millis(10),
                Duration::from_secs(600),
            )?,
            retry_after_max: raw.duration(
                "SHEAF_RETRY_AFTER_MAX",
                Duration::from_secs(1),
                Duration::from_secs(7 * 86_400),
            )?,
        };
        let retry_lookup = LookupConfig {
            max_batch: raw.usize("SHEAF_RETRY_LOOKUP_BATCH_SIZE", 0, 100)?,
            max_wait: Duration::from_millis(raw.int(
                "SHEAF_RETRY_LOOKUP_BATCH_WAIT_MS",
                0,
                10_000,
            )?),
            adaptive: raw.bool("SHEAF_RETRY_LOOKUP_ADAPTIVE")?,
            ..LookupConfig::default()
        };
        // Event reads are adaptive: a first delivery on a quiet service reads its payload at
        // once, and batches grow only while a read is already in flight (BRIEF, adaptive mode).
        let event_lookup = LookupConfig {
            max_batch: raw.usize("SHEAF_EVENT_LOOKUP_BATCH_SIZE", 1, 1000)?,
            max_wait: Duration::from_millis(20),
            adaptive: true,
            ..LookupConfig::default()
        };
        let fresh_event_cache = raw.int("SHEAF_FRESH_EVENT_CACHE", 0, 10_000_000)?;
        let delivery_workers = raw.usize("SHEAF_DELIVERY_WORKERS", 0, 4096)?;
        let delivery_timeout = raw.duration(
            "SHEAF_DELIVERY_TIMEOUT",
            Duration::from_millis(100),
            Duration::from_secs(600),
        )?;
        let queue_lease = raw.duration(
            "SHEAF_QUEUE_LEASE",
            Duration::from_secs(1),
            Duration::from_secs(3600),
        )?;
        if queue_lease <= delivery_timeout {
            return Err(ConfigError::new(
                "SHEAF_QUEUE_LEASE",
                format!(
                    "{} must be longer than SHEAF_DELIVERY_TIMEOUT ({}), or a slow delivery would lose its job to another worker",
                    format_duration(queue_lease),
                    format_duration(delivery_timeout)
                ),
            ));
        }
        let queue_poll_interval = raw.duration(
            "SHEAF_QUEUE_POLL_INTERVAL",
            Duration::from_millis(1),
            Duration::from_secs(60),
        )?;
        let completer_flush_interval = raw.duration(
            "SHEAF_COMPLETER_FLUSH_INTERVAL",
            Duration::ZERO,
            Duration::from_secs(1),
        )?;
        let completer_max_batch = raw.usize("SHEAF_COMPLETER_MAX_BATCH", 1, 10_000)?;
        let log_write = WriteConfig {
            max_records: raw.usize("SHEAF_LOG_WRITE_MAX_RECORDS", 1, 1_000_000)?,
            max_bytes: raw.usize("SHEAF_LOG_WRITE_MAX_BYTES", 1024, 1 << 30)?,
            max_wait: Duration::from_millis(raw.int("SHEAF_LOG_WRITE_MAX_WAIT_MS", 0, 10_000)?),
            ..WriteConfig::default()
        };
        let max_body_bytes = raw.usize("SHEAF_MAX_BODY_BYTES", 1024, 100 << 20)?;
        let allow_private_destinations = raw.bool("SHEAF_ALLOW_PRIVATE_DESTINATIONS")?;
        let secret_rotation_grace = raw.duration(
            "SHEAF_SECRET_ROTATION_GRACE",
            Duration::ZERO,
            Duration::from_secs(30 * 86_400),
        )?;
        let entity_cache_ttl = raw.duration(
            "SHEAF_ENTITY_CACHE_TTL",
            Duration::ZERO,
            Duration::from_secs(600),
        )?;
        let shutdown_timeout = raw.duration(
            "SHEAF_SHUTDOWN_TIMEOUT",
            Duration::ZERO,
            Duration::from_secs(600),
        )?;
        let log_filter = raw.value("SHEAF_LOG");
        let postgres_stores = log_store == LogStoreKind::Postgres || queue == QueueKind::Postgres;
        let cdc = parse_cdc(raw, postgres_stores.then_some(postgres_schema.as_str()))?;
        Ok(Self {
            listen,
            api_key,
            token_signing_key,
            token_max_ttl,
            secrets_key,
            log_store,
            queue,
            postgres_url,
            clickhouse_url,
            postgres_schema,
            clickhouse_database,
            retry,
            retry_lookup,
            event_lookup,
            fresh_event_cache,
            delivery_workers,
            delivery_timeout,
            queue_lease,
            queue_poll_interval,
            completer_flush_interval,
            completer_max_batch,
            log_write,
            max_body_bytes,
            allow_private_destinations,
            secret_rotation_grace,
            entity_cache_ttl,
            shutdown_timeout,
            log_filter,
            cdc,
        })
    }
}

/// The `SHEAF_CDC_*` settings. Every value is checked whether or not the source is enabled;
/// the URL and the tenants are required only when it is. `sheaf_schema` is
/// `SHEAF_POSTGRES_SCHEMA` when a store lives in Postgres: its tables never feed the source.
fn parse_cdc(raw: &Raw, sheaf_schema: Option<&str>) -> Result<Option<CdcSettings>, ConfigError> {
    let enabled = raw.bool("SHEAF_CDC_ENABLED")?;
    let url = raw.optional("SHEAF_CDC_POSTGRES_URL");
    let slot = raw.value("SHEAF_CDC_SLOT");
    let publication = raw.value("SHEAF_CDC_PUBLICATION");
    let create_missing = raw.bool("SHEAF_CDC_CREATE_MISSING")?;
    let tenants = raw
        .optional("SHEAF_CDC_TENANTS")
        .map(|t| TableTenants::parse(&t))
        .transpose()
        .map_err(|m| ConfigError::new("SHEAF_CDC_TENANTS", m))?;
    let batch_transactions = raw.bool("SHEAF_CDC_BATCH_TRANSACTIONS")?;
    let batch_size = raw.usize("SHEAF_CDC_BATCH_SIZE", 0, 10_000)?;
    let batch_wait = raw.duration(
        "SHEAF_CDC_BATCH_WAIT",
        Duration::ZERO,
        Duration::from_secs(10),
    )?;
    let checkpoint_limit = raw.usize("SHEAF_CDC_CHECKPOINT_LIMIT", 1, 1_000_000)?;
    let max_in_flight = raw.usize("SHEAF_CDC_MAX_IN_FLIGHT", 1, 1024)?;
    let heartbeat = raw.duration(
        "SHEAF_CDC_HEARTBEAT_INTERVAL",
        Duration::ZERO,
        Duration::from_secs(3600),
    )?;
    if !heartbeat.is_zero() && heartbeat < Duration::from_secs(1) {
        return Err(ConfigError::new(
            "SHEAF_CDC_HEARTBEAT_INTERVAL",
            format!(
                "{} is below the minimum of 1s (0s turns the heartbeat off)",
                format_duration(heartbeat)
            ),
        ));
    }
    let stream = StreamOptions {
        checkpoint_limit,
        batch_transactions,
        batching: (batch_size > 0).then_some(BatchingPolicy {
            count: batch_size,
            max_wait: batch_wait,
        }),
        filter: None,
    };
    // sheaf-cdc names the fields in conflict; the error names the settings too.
    stream.validate().map_err(|e| cdc_error(&e, batch_size))?;
    if !enabled {
        return Ok(None);
    }
    let url = url.ok_or_else(|| {
        ConfigError::new(
            "SHEAF_CDC_POSTGRES_URL",
            "is required when SHEAF_CDC_ENABLED is true",
        )
    })?;
    let connection = ConnectionConfig::from_url(&url)
        .map_err(|e| ConfigError::new("SHEAF_CDC_POSTGRES_URL", e.to_string()))?;
    let mut tenants = tenants.ok_or_else(|| {
        ConfigError::new(
            "SHEAF_CDC_TENANTS",
            "is required when SHEAF_CDC_ENABLED is true (a tenant id, or schema.table=tenant,…)",
        )
    })?;
    if let Some(schema) = sheaf_schema {
        if tenants.schemas().contains(schema) {
            return Err(ConfigError::new(
                "SHEAF_CDC_TENANTS",
                format!(
                    "names a table in {schema:?}, the schema of Sheaf's own tables (SHEAF_POSTGRES_SCHEMA): its changes would feed Sheaf its own writes"
                ),
            ));
        }
        tenants.exclude_schema(schema);
    }
    let mut source = CdcConfig::new(connection, slot, publication);
    if create_missing {
        let tables = tenants.tables();
        if tables.is_empty() {
            return Err(ConfigError::new(
                "SHEAF_CDC_CREATE_MISSING",
                "is true but SHEAF_CDC_TENANTS names no table to publish; name them (schema.table=tenant,…) or create the publication yourself",
            ));
        }
        source.create_missing = Some(PublicationTables::Tables(tables));
    }
    source.stream = stream;
    source.heartbeat_interval = (!heartbeat.is_zero()).then_some(heartbeat);
    source.application_name = "sheaf".to_owned();
    source.validate().map_err(|e| cdc_error(&e, batch_size))?;
    Ok(Some(CdcSettings {
        source,
        tenants,
        max_in_flight,
    }))
}

/// A `sheaf-cdc` configuration error as a [`ConfigError`] naming the setting of the field it
/// names (`sheaf-cdc` writes field names in backquotes).
fn cdc_error(error: &sheaf_cdc::Error, batch_size: usize) -> ConfigError {
    let text = error.to_string();
    if text.contains("`batch_transactions`") {
        return ConfigError::new(
            "SHEAF_CDC_BATCH_TRANSACTIONS",
            format!(
                "true cannot be combined with SHEAF_CDC_BATCH_SIZE={batch_size} (a batching policy): {text}"
            ),
        );
    }
    let setting = [
        ("`slot`", "SHEAF_CDC_SLOT"),
        ("`publication`", "SHEAF_CDC_PUBLICATION"),
        ("`checkpoint_limit`", "SHEAF_CDC_CHECKPOINT_LIMIT"),
        ("`batching", "SHEAF_CDC_BATCH_SIZE"),
        ("`create_missing`", "SHEAF_CDC_CREATE_MISSING"),
        ("`heartbeat_interval`", "SHEAF_CDC_HEARTBEAT_INTERVAL"),
        ("connection URL", "SHEAF_CDC_POSTGRES_URL"),
    ]
    .into_iter()
    .find(|(field, _)| text.contains(field))
    .map_or("SHEAF_CDC_ENABLED", |(_, setting)| setting);
    ConfigError::new(setting, text)
}

/// The settings section of `sheaf --help`, from [`SETTINGS`].
pub fn settings_help() -> String {
    let mut out = String::new();
    for s in SETTINGS {
        let default = s
            .default
            .map_or_else(|| "unset".to_owned(), |d| format!("default {d}"));
        out.push_str(&format!("  {}  ({default}; {})\n", s.name, s.valid));
        out.push_str(&format!("      {}\n", s.meaning));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn defaults_load_and_every_setting_is_read() {
        let (config, read) = Config::load_tracked(HashMap::new()).unwrap();
        assert_eq!(config.listen.to_string(), "127.0.0.1:8470");
        assert_eq!(config.log_store, LogStoreKind::Memory);
        assert_eq!(config.retry.schedule.len(), 5);
        let all: BTreeSet<&str> = SETTINGS.iter().map(|s| s.name).collect();
        assert_eq!(read, all, "every entry of SETTINGS is read by Config::load");
    }

    #[test]
    fn invalid_values_name_their_setting() {
        let err = Config::load(env(&[("SHEAF_RETRY_LOOKUP_BATCH_SIZE", "101")])).unwrap_err();
        assert_eq!(
            err.to_string(),
            "invalid SHEAF_RETRY_LOOKUP_BATCH_SIZE: 101 is above the maximum of 100"
        );
        let err = Config::load(env(&[("SHEAF_RETRY_SCHEDULE", "5s,,1m")])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_RETRY_SCHEDULE");
        let err = Config::load(env(&[("SHEAF_DELIVERY_TIMEOUT", "5")])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_DELIVERY_TIMEOUT");
        let err = Config::load(env(&[("SHEAF_QUEUE", "postgres")])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_POSTGRES_URL");
        let err = Config::load(env(&[
            ("SHEAF_QUEUE", "postgres"),
            ("SHEAF_POSTGRES_URL", "postgres://sheaf@127.0.0.1/sheaf"),
        ]))
        .unwrap_err();
        assert_eq!(err.setting, "SHEAF_LOG_STORE", "{err}");
        let err = Config::load(env(&[("SHEAF_LISTEN", "0.0.0.0:8470")])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_API_KEY");
        let err = Config::load(env(&[("SHEAF_QUEUE_LEASE", "10s")])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_QUEUE_LEASE");
    }

    #[test]
    fn keys_are_checked_and_never_printed() {
        let key32 = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
        let admin = ("SHEAF_API_KEY", "admin-key-0123456789");
        for (pairs, setting) in [
            (
                vec![admin, ("SHEAF_TOKEN_SIGNING_KEY", "c2hvcnQ=")],
                "SHEAF_TOKEN_SIGNING_KEY",
            ),
            (
                vec![admin, ("SHEAF_TOKEN_SIGNING_KEY", "not base64 at all")],
                "SHEAF_TOKEN_SIGNING_KEY",
            ),
            (
                vec![("SHEAF_TOKEN_SIGNING_KEY", key32)],
                "SHEAF_TOKEN_SIGNING_KEY",
            ),
            (
                vec![admin, ("SHEAF_TOKEN_MAX_TTL", "10s")],
                "SHEAF_TOKEN_MAX_TTL",
            ),
            (vec![("SHEAF_SECRETS_KEY", "c2hvcnQ=")], "SHEAF_SECRETS_KEY"),
            (
                vec![(
                    "SHEAF_SECRETS_KEY",
                    "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWZ4eA==",
                )],
                "SHEAF_SECRETS_KEY",
            ),
        ] {
            let err = Config::load(env(&pairs)).unwrap_err();
            assert_eq!(err.setting, setting, "{pairs:?}: {err}");
        }
        let config = Config::load(env(&[
            admin,
            ("SHEAF_TOKEN_SIGNING_KEY", key32),
            ("SHEAF_SECRETS_KEY", key32),
            ("SHEAF_DELIVERY_WORKERS", "0"),
        ]))
        .unwrap();
        assert!(config.token_signing_key.is_some() && config.secrets_key.is_some());
        assert_eq!(config.token_max_ttl, Duration::from_secs(30 * 86_400));
        assert_eq!(config.delivery_workers, 0);
        let printed = format!("{config:?}");
        assert!(!printed.contains(key32), "keys never appear in Debug");
        assert!(!printed.contains("admin-key-0123456789"), "{printed}");
    }

    #[test]
    fn durations_parse_and_format() {
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
        assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
        assert!(parse_duration("5").is_err());
        assert!(parse_duration("5w").is_err());
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
        assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
    }

    #[test]
    fn the_file_sets_values_and_the_environment_wins() {
        let dir = std::env::temp_dir().join(format!("sheaf-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sheaf.toml");
        std::fs::write(
            &path,
            "retry_schedule = [\"1s\", \"2s\"]\ndelivery_workers = 7\nretry_max_attempts = 3\n",
        )
        .unwrap();
        let config = Config::load(env(&[
            ("SHEAF_CONFIG_FILE", path.to_str().unwrap()),
            ("SHEAF_DELIVERY_WORKERS", "9"),
        ]))
        .unwrap();
        assert_eq!(
            config.retry.schedule,
            vec![Duration::from_secs(1), Duration::from_secs(2)]
        );
        assert_eq!(config.retry.max_attempts, 3);
        assert_eq!(config.delivery_workers, 9);
        std::fs::write(&path, "no_such_setting = 1\n").unwrap();
        let err = Config::load(env(&[("SHEAF_CONFIG_FILE", path.to_str().unwrap())])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_CONFIG_FILE");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    const CDC_URL: &str = "postgres://app:secret@127.0.0.1:5432/app";

    fn cdc_env(extra: &[(&str, &str)]) -> HashMap<String, String> {
        let mut pairs = vec![
            ("SHEAF_CDC_ENABLED", "true"),
            ("SHEAF_CDC_POSTGRES_URL", CDC_URL),
            ("SHEAF_CDC_TENANTS", "public.orders=acme,*=other"),
        ];
        pairs.extend_from_slice(extra);
        env(&pairs)
    }

    #[test]
    fn the_cdc_source_is_off_by_default_and_built_from_its_settings() {
        assert!(Config::load(HashMap::new()).unwrap().cdc.is_none());
        let config = Config::load(cdc_env(&[
            ("SHEAF_CDC_SLOT", "app_slot"),
            ("SHEAF_CDC_PUBLICATION", "app_pub"),
            ("SHEAF_CDC_CREATE_MISSING", "true"),
            ("SHEAF_CDC_BATCH_TRANSACTIONS", "true"),
            ("SHEAF_CDC_CHECKPOINT_LIMIT", "200"),
            ("SHEAF_CDC_HEARTBEAT_INTERVAL", "30s"),
            ("SHEAF_CDC_MAX_IN_FLIGHT", "4"),
        ]))
        .unwrap();
        let cdc = config.cdc.expect("enabled");
        assert_eq!(cdc.source.slot, "app_slot");
        assert_eq!(cdc.source.publication, "app_pub");
        assert_eq!(cdc.source.connection.database, "app");
        assert_eq!(
            cdc.source.create_missing,
            Some(PublicationTables::Tables(vec!["public.orders".into()]))
        );
        assert!(cdc.source.stream.batch_transactions);
        assert_eq!(cdc.source.stream.batching, None);
        assert_eq!(cdc.source.stream.checkpoint_limit, 200);
        assert_eq!(cdc.source.heartbeat_interval, Some(Duration::from_secs(30)));
        assert_eq!(cdc.max_in_flight, 4);
        assert_eq!(
            cdc.tenants.tenant_for("public", "orders").unwrap().as_str(),
            "acme"
        );

        let policy = Config::load(cdc_env(&[
            ("SHEAF_CDC_BATCH_SIZE", "50"),
            ("SHEAF_CDC_BATCH_WAIT", "5ms"),
        ]))
        .unwrap()
        .cdc
        .unwrap();
        assert_eq!(
            policy.source.stream.batching,
            Some(BatchingPolicy {
                count: 50,
                max_wait: Duration::from_millis(5)
            })
        );
        assert_eq!(policy.source.heartbeat_interval, None, "0s is off");
    }

    #[test]
    fn batch_transactions_with_a_batch_size_names_both_settings_and_fields() {
        let err = Config::load(cdc_env(&[
            ("SHEAF_CDC_BATCH_TRANSACTIONS", "true"),
            ("SHEAF_CDC_BATCH_SIZE", "100"),
        ]))
        .unwrap_err();
        assert_eq!(err.setting, "SHEAF_CDC_BATCH_TRANSACTIONS");
        let text = err.to_string();
        for name in [
            "SHEAF_CDC_BATCH_TRANSACTIONS",
            "SHEAF_CDC_BATCH_SIZE",
            "`batch_transactions`",
            "`batching`",
        ] {
            assert!(text.contains(name), "{name} missing from {text:?}");
        }
    }

    #[test]
    fn invalid_cdc_values_name_their_setting() {
        for (extra, setting) in [
            (
                vec![("SHEAF_CDC_POSTGRES_URL", "")],
                "SHEAF_CDC_POSTGRES_URL",
            ),
            (
                vec![("SHEAF_CDC_POSTGRES_URL", "mysql://u@h/d")],
                "SHEAF_CDC_POSTGRES_URL",
            ),
            (vec![("SHEAF_CDC_TENANTS", "")], "SHEAF_CDC_TENANTS"),
            (
                vec![("SHEAF_CDC_TENANTS", "orders=acme")],
                "SHEAF_CDC_TENANTS",
            ),
            (vec![("SHEAF_CDC_SLOT", "Bad-Slot")], "SHEAF_CDC_SLOT"),
            (vec![("SHEAF_CDC_PUBLICATION", "")], "SHEAF_CDC_PUBLICATION"),
            (vec![("SHEAF_CDC_ENABLED", "perhaps")], "SHEAF_CDC_ENABLED"),
            (
                vec![("SHEAF_CDC_CHECKPOINT_LIMIT", "0")],
                "SHEAF_CDC_CHECKPOINT_LIMIT",
            ),
            (vec![("SHEAF_CDC_BATCH_SIZE", "x")], "SHEAF_CDC_BATCH_SIZE"),
            (vec![("SHEAF_CDC_BATCH_WAIT", "1h")], "SHEAF_CDC_BATCH_WAIT"),
            (
                vec![("SHEAF_CDC_MAX_IN_FLIGHT", "0")],
                "SHEAF_CDC_MAX_IN_FLIGHT",
            ),
            (
                vec![("SHEAF_CDC_HEARTBEAT_INTERVAL", "500ms")],
                "SHEAF_CDC_HEARTBEAT_INTERVAL",
            ),
            (
                vec![
                    ("SHEAF_CDC_TENANTS", "acme"),
                    ("SHEAF_CDC_CREATE_MISSING", "true"),
                ],
                "SHEAF_CDC_CREATE_MISSING",
            ),
            (
                vec![
                    ("SHEAF_QUEUE", "postgres"),
                    ("SHEAF_LOG_STORE", "postgres"),
                    ("SHEAF_POSTGRES_URL", CDC_URL),
                    ("SHEAF_CDC_TENANTS", "sheaf.events=acme"),
                ],
                "SHEAF_CDC_TENANTS",
            ),
        ] {
            let err = Config::load(cdc_env(&extra)).unwrap_err();
            assert_eq!(err.setting, setting, "{extra:?}: {err}");
            assert!(
                !err.to_string().contains("secret"),
                "never the password: {err}"
            );
        }
        // Without SHEAF_CDC_ENABLED, the URL and the tenants are not required.
        let config = Config::load(env(&[("SHEAF_CDC_SLOT", "other_slot")])).unwrap();
        assert!(config.cdc.is_none());
    }

    #[test]
    fn sheaf_s_own_schema_never_feeds_the_catch_all() {
        let config = Config::load(cdc_env(&[
            ("SHEAF_LOG_STORE", "postgres"),
            ("SHEAF_POSTGRES_URL", CDC_URL),
            ("SHEAF_POSTGRES_SCHEMA", "sheaf_x"),
        ]))
        .unwrap();
        let tenants = config.cdc.unwrap().tenants;
        assert_eq!(tenants.tenant_for("sheaf_x", "events"), None);
        assert_eq!(tenants.tenant_for("app", "t").unwrap().as_str(), "other");
    }

    #[test]
    fn retry_delays_repeat_the_last_entry() {
        let config = Config::load(env(&[("SHEAF_RETRY_SCHEDULE", "1s,2s")])).unwrap();
        assert_eq!(config.retry.base_delay(1), Duration::from_secs(1));
        assert_eq!(config.retry.base_delay(2), Duration::from_secs(2));
        assert_eq!(config.retry.base_delay(9), Duration::from_secs(2));
    }
}
