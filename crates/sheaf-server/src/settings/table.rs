//! The table of every `SHEAF_*` setting: name, default, meaning and [`Kind`], defined once.
//!
//! Each setting is a `const` the parser reads through ([`super::values::Values`] takes the
//! bounds from the setting itself), so a range is written in exactly one place: here. The
//! validation message, `sheaf --help` and the generated table in `docs/configuration.md`
//! (`cargo xtask codegen`) all render it from the same value.
//!
//! Comments above a setting give the why of its default.
//!
//! Longer than 600 lines because it is the table: one entry per setting, each with its reason,
//! and a reader looking for a setting wants them all in one place. Not split by area (stores,
//! delivery, API) because `SETTINGS` at the end must list every one in the order
//! `docs/configuration.md` shows them, and one file keeps that list next to the entries. Past
//! 800 lines for the same reason: each setting added (the memory log's retention, the
//! pending-work bounds) is one more entry with its why, not a new responsibility.

use std::time::Duration;

/// What values a setting accepts. The parser enforces it and [`Kind::describe`] says it in
/// words, so the two cannot drift apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// `true` or `false` (`1`/`0`, `yes`/`no`, `on`/`off` also read).
    Bool,
    /// A whole number in `min..=max`.
    Integer {
        /// The smallest accepted value.
        min: u64,
        /// The largest accepted value.
        max: u64,
    },
    /// A duration with a unit (`500ms`, `5s`, `1m`, `2h`, `1d`) in `min..=max`.
    Duration {
        /// The shortest accepted duration.
        min: Duration,
        /// The longest accepted duration.
        max: Duration,
    },
    /// `0s` (off), or a duration in `min..=max`.
    DurationOrOff {
        /// The shortest accepted duration other than `0s`.
        min: Duration,
        /// The longest accepted duration.
        max: Duration,
    },
    /// A comma-separated list of durations, each in `min..=max`.
    DurationList {
        /// The shortest accepted entry.
        min: Duration,
        /// The longest accepted entry.
        max: Duration,
    },
    /// One of these words.
    OneOf(&'static [&'static str]),
    /// Text its own parser checks (an address, a URL, a key, a map); the string says what it
    /// accepts.
    Text(&'static str),
}

/// One setting.
#[derive(Debug, Clone, Copy)]
pub struct Setting {
    /// The environment variable, e.g. `SHEAF_LISTEN`. In the TOML file the same setting is
    /// the name without `SHEAF_`, lower-case (`listen`).
    pub name: &'static str,
    /// The default as written in the docs; `None` means unset.
    pub default: Option<&'static str>,
    /// What it does.
    pub meaning: &'static str,
    /// What values it accepts.
    pub kind: Kind,
    /// A rule beyond the kind that involves another setting (checked by the parser too).
    pub also: Option<&'static str>,
}

impl Setting {
    /// The key that sets it in the TOML file.
    pub fn file_key(&self) -> String {
        file_key_of(self.name)
    }

    /// What it accepts, in words: the kind's description and the extra rule, if any.
    pub fn valid(&self) -> String {
        match self.also {
            Some(also) => format!("{}; {also}", self.kind.describe()),
            None => self.kind.describe(),
        }
    }
}

impl Kind {
    /// The accepted values in words, as `--help` and `docs/configuration.md` print them.
    pub fn describe(&self) -> String {
        use super::values::format_duration as d;
        match self {
            Kind::Bool => "`true`, `false`".to_owned(),
            Kind::Integer { min, max } => format!("{min}..={max}"),
            Kind::Duration { min, max } => format!("a duration, {}..{}", d(*min), d(*max)),
            Kind::DurationOrOff { min, max } => {
                format!("`0s`, or a duration {}..{}", d(*min), d(*max))
            }
            Kind::DurationList { min, max } => format!(
                "comma-separated durations (`500ms`, `5s`, `1m`, `2h`, `1d`), each {}..{}",
                d(*min),
                d(*max)
            ),
            Kind::OneOf(words) => words
                .iter()
                .map(|w| format!("`{w}`"))
                .collect::<Vec<_>>()
                .join(", "),
            Kind::Text(text) => (*text).to_owned(),
        }
    }
}

const SECOND: Duration = Duration::from_secs(1);
const MINUTE: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);
const fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

const fn setting(
    name: &'static str,
    default: Option<&'static str>,
    kind: Kind,
    meaning: &'static str,
) -> Setting {
    Setting {
        name,
        default,
        meaning,
        kind,
        also: None,
    }
}

const fn with_rule(setting: Setting, also: &'static str) -> Setting {
    Setting {
        also: Some(also),
        ..setting
    }
}

/// `SHEAF_CONFIG_FILE`.
pub const CONFIG_FILE: Setting = setting(
    "SHEAF_CONFIG_FILE",
    None,
    Kind::Text("a readable file path"),
    "Path of a TOML file that sets any other setting by its name without `SHEAF_`, lower-case (`listen = \"127.0.0.1:8470\"`); environment variables win over it. Environment only.",
);
/// `SHEAF_LISTEN`.
pub const LISTEN: Setting = setting(
    "SHEAF_LISTEN",
    Some("127.0.0.1:8470"),
    Kind::Text("`ip:port`"),
    "Address the HTTP API listens on.",
);
/// `SHEAF_API_KEY`.
pub const API_KEY: Setting = setting(
    "SHEAF_API_KEY",
    None,
    Kind::Text("at least 16 characters"),
    "Admin bearer token (`Authorization: Bearer <key>`) for everything under `/api/v1` except the OpenAPI document; tenant tokens (below) reach a part of it. Unset: the API is open, which is only allowed when `SHEAF_LISTEN` is a loopback address (start-up refuses otherwise and the log says so).",
);
// Its own key, not one derived from SHEAF_API_KEY: rotating the admin key must not silently
// revoke every tenant token, and a leak of one must not be a leak of both.
/// `SHEAF_TOKEN_SIGNING_KEY`.
pub const TOKEN_SIGNING_KEY: Setting = setting(
    "SHEAF_TOKEN_SIGNING_KEY",
    None,
    Kind::Text("standard base64 of at least 32 bytes (`head -c 32 /dev/urandom | base64`)"),
    "Key that signs tenant-scoped API tokens (HMAC-SHA256). Set: the admin route `POST /api/v1/tenants/{tenant_id}/tokens` issues tokens that reach only that tenant's routes and its publishes (`docs/security.md`). Unset: no token is issued or accepted. Changing it revokes every token issued with the old key. Its own key, never derived from `SHEAF_API_KEY`. Needs `SHEAF_API_KEY` (with an open admin API a token would restrict nothing).",
);
// Tokens cannot be revoked one by one, so their lifetime is what bounds a leaked one; a month
// covers a monthly rotation in a deploy pipeline.
/// `SHEAF_TOKEN_MAX_TTL`.
pub const TOKEN_MAX_TTL: Setting = setting(
    "SHEAF_TOKEN_MAX_TTL",
    Some("30d"),
    Kind::Duration {
        min: MINUTE,
        max: Duration::from_secs(365 * 86_400),
    },
    "Longest lifetime a tenant token may be issued with (`ttl_seconds` above it is refused). Tokens cannot be revoked one by one, so this bounds a leaked one.",
);
/// `SHEAF_PUBLIC_URL`.
pub const PUBLIC_URL: Setting = setting(
    "SHEAF_PUBLIC_URL",
    None,
    Kind::Text("`http://host[:port]` or `https://host[:port]`"),
    "Where users reach this server, for the links it hands out: `POST /api/v1/tenants/{tenant_id}/portal` answers `<this>/portal/#…`. Unset: the link is built from the request's `Host` header over `http://`, which is right when clients reach the server directly; set it behind a TLS-terminating proxy or load balancer.",
);
/// `SHEAF_LOG_STORE`.
pub const LOG_STORE: Setting = setting(
    "SHEAF_LOG_STORE",
    Some("sqlite"),
    Kind::OneOf(&["sqlite", "memory", "postgres", "clickhouse"]),
    "Where events and attempts are recorded. `sqlite` (the default) is the file `sheaf.db` in `SHEAF_DATA_DIR`, kept across restarts and crashes; `memory` keeps everything in the process (with `SHEAF_QUEUE` unset too: nothing survives a restart), for tests and throwaway runs. With `SHEAF_QUEUE=postgres` it must be `postgres` or `clickhouse`: jobs read their payload from the log store, which must be as durable and as shared as the queue.",
);
/// `SHEAF_QUEUE`.
pub const QUEUE: Setting = setting(
    "SHEAF_QUEUE",
    None,
    Kind::OneOf(&["sqlite", "memory", "postgres", "jetstream"]),
    "Where pending deliveries wait. Unset: `sqlite` when the log store is, else `memory`. `sqlite` (in `SHEAF_DATA_DIR`, kept across restarts) needs `SHEAF_LOG_STORE=sqlite`: the log tables are its outbox. Several processes share work only through `postgres` or `jetstream` (a replicated NATS JetStream bucket, `SHEAF_JETSTREAM_*`, for fleets past one Postgres primary; its log store must be `postgres` or `clickhouse`, and it needs `SHEAF_POSTGRES_URL` for tenants and destinations). Tenants and destinations live in Postgres whenever the queue or the log store does, else in the SQLite file whenever one of them is there, in memory otherwise.",
);
/// `SHEAF_DATA_DIR`.
pub const DATA_DIR: Setting = setting(
    "SHEAF_DATA_DIR",
    Some("sheaf-data"),
    Kind::Text("a directory path, relative to the working directory or absolute"),
    "Where the SQLite store (the default) keeps its file (`sheaf.db`, with its `-wal`, `-shm` and `.lock` files beside it) when `SHEAF_LOG_STORE` or `SHEAF_QUEUE` is `sqlite`; created at start if missing. One process per directory: a second one is refused at start, naming the directory.",
);
/// `SHEAF_SQLITE_SYNC`.
pub const SQLITE_SYNC: Setting = setting(
    "SHEAF_SQLITE_SYNC",
    Some("normal"),
    Kind::OneOf(&["normal", "full"]),
    "When a write to the SQLite file is answered. `normal`: once it is in the write-ahead log, so a crash of the process (kill -9) loses nothing, while a power loss or an operating-system crash may lose the last writes. `full`: once it is fsynced as well, which also survives those and costs a disk flush per group commit.",
);
/// `SHEAF_SQLITE_MAX_SIZE_MIB`.
pub const SQLITE_MAX_SIZE_MIB: Setting = setting(
    "SHEAF_SQLITE_MAX_SIZE_MIB",
    Some("0"),
    Kind::Integer {
        min: 0,
        max: 16 << 20,
    },
    "The largest the SQLite file may grow, in MiB; `0`: as large as the disk allows (a full disk then refuses publishes with 503 until space returns). With a limit, room is kept for every waiting delivery's next attempt records (2 KiB each) and a last eighth for writes in flight: new events are answered `503` with `Retry-After` once the file and that room reach the rest, while deliveries go on recording their attempts; as the file nears the limit, the log drops its oldest delivered events and attempts beyond the `SHEAF_MEMORY_LOG_*` bounds, and publishes are taken again once there is room. Events waiting for delivery are never dropped. At least 1 when set.",
);
/// `SHEAF_POSTGRES_URL`.
pub const POSTGRES_URL: Setting = setting(
    "SHEAF_POSTGRES_URL",
    None,
    Kind::Text("`postgres://user:password@host:port/database[?sslmode=…&sslrootcert=…]`"),
    "Postgres connection URL; required when the queue or the log store is `postgres`. TLS follows libpq's `sslmode`: `disable`, `prefer` (the default: TLS when the server offers it, unverified), `require` (TLS, unverified), `verify-ca` (TLS, a trusted chain), `verify-full` (a trusted chain issued for the host: use it for a database across a network); `sslrootcert` names the CA file to trust. The log says at start whether the connection is encrypted.",
);
/// `SHEAF_CLICKHOUSE_URL`.
pub const CLICKHOUSE_URL: Setting = setting(
    "SHEAF_CLICKHOUSE_URL",
    None,
    Kind::Text("`http[s]://[user[:password]@]host:port`"),
    "ClickHouse HTTP URL; required when the log store is `clickhouse`. `https://` is TLS with the certificate verified against the public roots and `SHEAF_TLS_CA_FILE` (ClickHouse Cloud listens on port 8443).",
);
/// `SHEAF_POSTGRES_SCHEMA`.
pub const POSTGRES_SCHEMA: Setting = setting(
    "SHEAF_POSTGRES_SCHEMA",
    Some("sheaf"),
    Kind::Text("lower-case letters, digits and `_`, not starting with a digit, at most 63 bytes"),
    "Postgres schema that holds Sheaf's tables; processes that should share work must use the same one.",
);
/// `SHEAF_CLICKHOUSE_DATABASE`.
pub const CLICKHOUSE_DATABASE: Setting = setting(
    "SHEAF_CLICKHOUSE_DATABASE",
    Some("sheaf"),
    Kind::Text("ASCII letters, digits and `_`, not starting with a digit, at most 64 bytes"),
    "ClickHouse database that holds the log's tables (created at start).",
);
/// `SHEAF_CLICKHOUSE_CLUSTER`.
pub const CLICKHOUSE_CLUSTER: Setting = setting(
    "SHEAF_CLICKHOUSE_CLUSTER",
    None,
    Kind::Text("a cluster name of the servers' `remote_servers`: ASCII letters, digits and `_`"),
    "Keeps the log on a sharded ClickHouse cluster instead of one server: local tables on every node, `Distributed` tables over them sharded by `(tenant_id, event_id)`, so an event and its attempts share a shard. Needs `SHEAF_CLICKHOUSE_CLUSTER_NODES`; queries go to `SHEAF_CLICKHOUSE_URL` (any node). Unset: one server. `docs/operations.md`, \"A ClickHouse cluster\".",
);
/// `SHEAF_CLICKHOUSE_CLUSTER_NODES`.
pub const CLICKHOUSE_CLUSTER_NODES: Setting = setting(
    "SHEAF_CLICKHOUSE_CLUSTER_NODES",
    None,
    Kind::Text("comma-separated `http[s]://host:port`, every replica of every shard"),
    "Every node of `SHEAF_CLICKHOUSE_CLUSTER`: start-up creates and upgrades the local and distributed tables on each (with `SHEAF_CLICKHOUSE_URL`'s login), so a node that does not answer stops start-up. Required with `SHEAF_CLICKHOUSE_CLUSTER`.",
);
/// `SHEAF_CLICKHOUSE_CLUSTER_REPLICATION`.
pub const CLICKHOUSE_CLUSTER_REPLICATION: Setting = setting(
    "SHEAF_CLICKHOUSE_CLUSTER_REPLICATION",
    Some("distributed"),
    Kind::OneOf(&["distributed", "replicated"]),
    "Who copies a shard's rows to its replicas on `SHEAF_CLICKHOUSE_CLUSTER`. `distributed`: the `Distributed` tables write every replica (the cluster's `internal_replication` off), the local tables are `ReplacingMergeTree` and start-up creates them on every node of `SHEAF_CLICKHOUSE_CLUSTER_NODES`; an insert needs every replica up. `replicated`: the servers replicate (`internal_replication` on), the local tables are `ReplicatedReplacingMergeTree` and start-up creates them with `ON CLUSTER` DDL through `SHEAF_CLICKHOUSE_URL`; needs ClickHouse Keeper and the `{shard}` and `{replica}` macros on every node, and no node list. Not run in Sheaf's own tests (their ClickHouse cannot replicate).",
);
/// `SHEAF_JETSTREAM_URLS`.
pub const JETSTREAM_URLS: Setting = setting(
    "SHEAF_JETSTREAM_URLS",
    None,
    Kind::Text("comma-separated `nats://[user:password@]host:port`"),
    "The NATS servers of `SHEAF_QUEUE=jetstream`; any one of the cluster will do, and naming several lets start-up go on with one of them down. Required with `SHEAF_QUEUE=jetstream`. On nats-server 2.12 and later the bucket is also the outbox (a publish is one atomic batch of its event and jobs, answered once the stream's quorum stored it, and the log store gets events and attempts from the log shipper); on older servers a publish is written to the log store before its jobs are enqueued, which is much slower (a warning at start says so). TLS to these servers is not supported yet.",
);
/// `SHEAF_JETSTREAM_BUCKET`.
pub const JETSTREAM_BUCKET: Setting = setting(
    "SHEAF_JETSTREAM_BUCKET",
    Some("sheaf_jobs"),
    Kind::Text("ASCII letters, digits, `_` and `-`, at most 64 bytes"),
    "The key-value bucket that holds `SHEAF_QUEUE=jetstream`'s jobs (its stream is `KV_<bucket>`), created at start if missing. Processes that share work name the same bucket.",
);
/// `SHEAF_JETSTREAM_REPLICAS`.
pub const JETSTREAM_REPLICAS: Setting = setting(
    "SHEAF_JETSTREAM_REPLICAS",
    Some("3"),
    Kind::Integer { min: 1, max: 5 },
    "How many JetStream servers keep the bucket, when start-up creates it: every write of the queue (an enqueue, a claim, an outcome) is acknowledged once a majority of them stored it, so 3 survive the loss of one server. A cluster with fewer servers refuses the bucket and start-up stops. `1` on a single server. An existing bucket keeps its own.",
);
// Five retries spread over about seven hours ride out a deploy or a short outage without
// hammering a receiver. The span stays well inside the memory log's three days of retention,
// so a retry always finds its previous attempt.
/// `SHEAF_RETRY_SCHEDULE`.
pub const RETRY_SCHEDULE: Setting = setting(
    "SHEAF_RETRY_SCHEDULE",
    Some("5s,1m,10m,1h,6h"),
    Kind::DurationList {
        min: ms(100),
        max: Duration::from_secs(7 * 86_400),
    },
    "Delays before each retry of a failed delivery: the first retry waits the first delay, and so on; past the end of the list the last delay repeats. Each delay gets the jitter below.",
);
// The first delivery plus one retry per entry of the default schedule.
/// `SHEAF_RETRY_MAX_ATTEMPTS`.
pub const RETRY_MAX_ATTEMPTS: Setting = setting(
    "SHEAF_RETRY_MAX_ATTEMPTS",
    Some("6"),
    Kind::Integer { min: 1, max: 100 },
    "Attempts (the first delivery included) before a delivery is dead-lettered.",
);
/// `SHEAF_RETRY_JITTER_PERCENT`.
pub const RETRY_JITTER_PERCENT: Setting = setting(
    "SHEAF_RETRY_JITTER_PERCENT",
    Some("20"),
    Kind::Integer { min: 0, max: 100 },
    "Each retry delay is moved by a random amount within plus or minus this share of it, so retries of one outage do not come back in lockstep.",
);
/// `SHEAF_RETRY_NOT_READY_DELAY`.
pub const RETRY_NOT_READY_DELAY: Setting = setting(
    "SHEAF_RETRY_NOT_READY_DELAY",
    Some("1s"),
    Kind::Duration {
        min: ms(10),
        max: Duration::from_secs(600),
    },
    "How long a retry waits when its previous attempt is not logged yet (or the lookup failed) before it looks again; such a wait does not count as an attempt.",
);
/// `SHEAF_RETRY_AFTER_MAX`.
pub const RETRY_AFTER_MAX: Setting = setting(
    "SHEAF_RETRY_AFTER_MAX",
    Some("1h"),
    Kind::Duration {
        min: SECOND,
        max: Duration::from_secs(7 * 86_400),
    },
    "Longest `Retry-After` a destination can ask for; longer values are cut to it, and values under 1s are raised to 1s.",
);
// On by default here, although `LookupConfig::default()` in sheaf-coalesce leaves coalescing
// off (`max_batch = 0`): the library makes turning it on its caller's choice, and every log
// store Sheaf ships has a batched `latest_attempts`. Retries wait seconds by design, so 50 ms of
// gathering costs nothing a user sees, while one query for many keys costs the store a fraction
// of one query per key (docs/benchmarks.md, `lookup` and `burst`). 100 is the most keys one
// query takes.
/// `SHEAF_RETRY_LOOKUP_BATCH_SIZE`.
pub const RETRY_LOOKUP_BATCH_SIZE: Setting = setting(
    "SHEAF_RETRY_LOOKUP_BATCH_SIZE",
    Some("50"),
    Kind::Integer { min: 0, max: 100 },
    "Retries due together share one latest-attempt query of up to this many keys; 0 turns coalescing off (one query per retry).",
);
/// `SHEAF_RETRY_LOOKUP_BATCH_WAIT`.
pub const RETRY_LOOKUP_BATCH_WAIT: Setting = setting(
    "SHEAF_RETRY_LOOKUP_BATCH_WAIT",
    Some("50ms"),
    Kind::Duration {
        min: Duration::ZERO,
        max: Duration::from_secs(10),
    },
    "How long a retry lookup batch gathers after its first key before it is sent anyway.",
);
// Off by default, as it shipped. Adaptive now batches as the fixed mode does under load (10.4
// retries per query against 10.7, docs/benchmarks.md, `burst`) and adds no wait at idle, so it
// is the candidate default; a retry's 50 ms of gathering is invisible next to its seconds of
// delay either way.
/// `SHEAF_RETRY_LOOKUP_ADAPTIVE`.
pub const RETRY_LOOKUP_ADAPTIVE: Setting = setting(
    "SHEAF_RETRY_LOOKUP_ADAPTIVE",
    Some("false"),
    Kind::Bool,
    "Adaptive retry lookup batching: a retry after a quiet spell (no lookup query in flight and none finished within `SHEAF_RETRY_LOOKUP_BATCH_WAIT`) is looked up at once; under load retries gather as with `false`. A quiet service adds no wait, a busy one batches as much.",
);
// First deliveries read their payload on the publish path's heels, where latency matters;
// adaptive batching adds no wait at low load and grows batches only while a read is in flight.
/// `SHEAF_EVENT_LOOKUP_BATCH_SIZE`.
pub const EVENT_LOOKUP_BATCH_SIZE: Setting = setting(
    "SHEAF_EVENT_LOOKUP_BATCH_SIZE",
    Some("100"),
    Kind::Integer { min: 1, max: 1000 },
    "First deliveries whose payload is not in the fresh-event cache, and publishes checking whether their id is known, read events in batches of up to this many keys (adaptive: no added wait when the store is idle).",
);
// At ~2 KB payloads, 10,000 events are ~20 MB of JSON (a few times that parsed): several
// seconds of backlog at thousands of publishes a second.
/// `SHEAF_FRESH_EVENT_CACHE`.
pub const FRESH_EVENT_CACHE: Setting = setting(
    "SHEAF_FRESH_EVENT_CACHE",
    Some("10000"),
    Kind::Integer {
        min: 0,
        max: 10_000_000,
    },
    "Freshly published events kept in memory so their first delivery needs no read of the log store; also remembers recently accepted ids for idempotent publishing.",
);
// Deliveries wait on the network, not the CPU: 32 concurrent requests keep a 2-core machine
// busy with receivers answering in tens of milliseconds. The channel holds as many jobs as
// there are workers, so claimed-but-unstarted work stays bounded by it.
/// `SHEAF_DELIVERY_WORKERS`.
pub const DELIVERY_WORKERS: Setting = setting(
    "SHEAF_DELIVERY_WORKERS",
    Some("32"),
    Kind::Integer { min: 0, max: 4096 },
    "Concurrent deliveries per process, to destinations of every type; also the capacity of the channel from the dispatcher to the workers. 0 runs no dispatcher and no workers: the process serves the API (and the CDC source) and leaves every delivery to other processes sharing a `postgres` queue (with the `memory` queue nothing delivers, which only tests want; the log warns).",
);
// Long enough for a slow receiver, short enough that a hung one ties up a worker for seconds,
// not minutes; the lease (below) must outlast it.
/// `SHEAF_DELIVERY_TIMEOUT`.
pub const DELIVERY_TIMEOUT: Setting = with_rule(
    setting(
        "SHEAF_DELIVERY_TIMEOUT",
        Some("15s"),
        Kind::Duration {
            min: ms(100),
            max: Duration::from_secs(600),
        },
        "How long one delivery may take, to a destination of any type, before the attempt fails: a webhook's connect, request and answer; a RabbitMQ or NATS connect, publish and confirmation.",
    ),
    "shorter than `SHEAF_QUEUE_LEASE`",
);
// Twice the longest delivery (the 15 s timeout), so a slow delivery never loses its job to
// another claimer; a crashed process's jobs come back after it.
/// `SHEAF_QUEUE_LEASE`.
pub const QUEUE_LEASE: Setting = with_rule(
    setting(
        "SHEAF_QUEUE_LEASE",
        Some("30s"),
        Kind::Duration {
            min: SECOND,
            max: HOUR,
        },
        "How long a claim on a job holds; a process that dies leaves its jobs, and the bulk replays it ran, to others after this. A worker renews a lease more than half spent before delivering.",
    ),
    "longer than `SHEAF_DELIVERY_TIMEOUT`",
);
// Bounds how late a due retry is picked up; an idle process then sends ten cheap claim
// queries a second (one per process, not one per worker).
/// `SHEAF_QUEUE_POLL_INTERVAL`.
pub const QUEUE_POLL_INTERVAL: Setting = setting(
    "SHEAF_QUEUE_POLL_INTERVAL",
    Some("100ms"),
    Kind::Duration {
        min: ms(1),
        max: MINUTE,
    },
    "How long the dispatcher sleeps after a claim found fewer due jobs than it had room for (new publishes in this process wake it at once).",
);
// One commit per job is bound by WAL writes, and batched completions beat it several times over
// (docs/benchmarks.md, `queue`); a few milliseconds of gathering is invisible next to a
// delivery's round trip and makes one statement out of every worker's outcomes.
/// `SHEAF_COMPLETER_FLUSH_INTERVAL`.
pub const COMPLETER_FLUSH_INTERVAL: Setting = setting(
    "SHEAF_COMPLETER_FLUSH_INTERVAL",
    Some("5ms"),
    Kind::Duration {
        min: Duration::ZERO,
        max: SECOND,
    },
    "How long the completer gathers job outcomes (complete, reschedule, dead-letter) from all workers before writing them as one statement per kind.",
);
// Eight times the default workers: a full flush carries every worker's outcome several times
// over, and a statement of a few hundred ids stays small.
/// `SHEAF_COMPLETER_MAX_BATCH`.
pub const COMPLETER_MAX_BATCH: Setting = setting(
    "SHEAF_COMPLETER_MAX_BATCH",
    Some("256"),
    Kind::Integer {
        min: 1,
        max: 10_000,
    },
    "Outcomes that make the completer write at once, without waiting for the interval.",
);
// The write coalescer's own defaults (`WriteConfig::default`), sized for ClickHouse parts.
/// `SHEAF_LOG_WRITE_MAX_RECORDS`.
pub const LOG_WRITE_MAX_RECORDS: Setting = setting(
    "SHEAF_LOG_WRITE_MAX_RECORDS",
    Some("10000"),
    Kind::Integer {
        min: 1,
        max: 1_000_000,
    },
    "Most events and attempts in one log store write.",
);
/// `SHEAF_LOG_WRITE_MAX_BYTES`.
pub const LOG_WRITE_MAX_BYTES: Setting = setting(
    "SHEAF_LOG_WRITE_MAX_BYTES",
    Some("16777216"),
    Kind::Integer {
        min: 1024,
        max: 1 << 30,
    },
    "Most bytes (JSON size of the records) in one log store write.",
);
// 0, as in `WriteConfig::default`: a wait is publish latency, so it is the operator's decision;
// a second or two suits a hot ClickHouse table (docs/benchmarks.md, `parts`).
/// `SHEAF_LOG_WRITE_MAX_WAIT`.
pub const LOG_WRITE_MAX_WAIT: Setting = setting(
    "SHEAF_LOG_WRITE_MAX_WAIT",
    Some("0s"),
    Kind::Duration {
        min: Duration::ZERO,
        max: Duration::from_secs(10),
    },
    "How long an under-filled log write waits for more records once nothing else is queued; `0s` writes at once.",
);
// Once per second per process keeps ClickHouse at about one insert per table per second
// whatever the publish rate (docs/benchmarks.md, `parts`), and bounds how long a published
// event waits to become searchable; a shipper that is behind does not wait at all.
/// `SHEAF_LOG_SHIP_INTERVAL`.
pub const LOG_SHIP_INTERVAL: Setting = setting(
    "SHEAF_LOG_SHIP_INTERVAL",
    Some("1s"),
    Kind::Duration {
        min: Duration::from_millis(1),
        max: MINUTE,
    },
    "With SHEAF_QUEUE=postgres and a log store elsewhere: how often the log shipper moves events and attempts from the Postgres outbox to the log store when it is not behind.",
);
// Publishes past the service's capacity wait inside it, and their latency grows with every one
// let in; a bound on how many are being handled turns the excess into a quick 503 instead. At
// the ~6,000 publishes a second the memory backends take, 1,024 in flight are ~170 ms of work,
// far above the 32 a closed-loop load of 32 clients keeps busy.
/// `SHEAF_MAX_PUBLISHES_IN_FLIGHT`.
pub const MAX_PUBLISHES_IN_FLIGHT: Setting = setting(
    "SHEAF_MAX_PUBLISHES_IN_FLIGHT",
    Some("1024"),
    Kind::Integer {
        min: 1,
        max: 1_000_000,
    },
    "HTTP publishes handled at once by one process; one more is answered `503` with `Retry-After` at once, before its body is read, so an overload is refused quickly instead of queueing inside the process.",
);
// The memory log's retention (`LogRetention::default`): three days, and at ~2 KB payloads some
// 70 MB for 25,000 events with their attempts (docs/benchmarks.md, `memory`).
/// `SHEAF_MEMORY_LOG_MAX_EVENTS`.
pub const MEMORY_LOG_MAX_EVENTS: Setting = setting(
    "SHEAF_MEMORY_LOG_MAX_EVENTS",
    Some("25000"),
    Kind::Integer {
        min: 1,
        max: 100_000_000,
    },
    "With the memory or the SQLite log: how many events it keeps besides those still owed a delivery (which are kept until delivered, whatever this says); the oldest go first.",
);
/// `SHEAF_MEMORY_LOG_MAX_ATTEMPTS`.
pub const MEMORY_LOG_MAX_ATTEMPTS: Setting = setting(
    "SHEAF_MEMORY_LOG_MAX_ATTEMPTS",
    Some("100000"),
    Kind::Integer {
        min: 1,
        max: 400_000_000,
    },
    "With the memory or the SQLite log: how many attempts it keeps besides those of events still owed a delivery; an attempt also goes with its event.",
);
/// `SHEAF_MEMORY_LOG_MAX_AGE`.
pub const MEMORY_LOG_MAX_AGE: Setting = setting(
    "SHEAF_MEMORY_LOG_MAX_AGE",
    Some("3d"),
    Kind::Duration {
        min: MINUTE,
        max: Duration::from_secs(365 * 24 * 3600),
    },
    "With the memory or the SQLite log: events and attempts older than this are dropped (checked every 2 s), except those still owed a delivery.",
);
// What the embedded default may hold for deliveries still owed, beside the log's retention
// (25,000 events, ~70 MB at 2 KB payloads). A held 1 KB event costs about 2 KB of memory all
// told (its payload, its log record and indexes, its job row), so the defaults keep a backlog
// of a few hundred megabytes at most: at the ~6,000 publishes a second the memory backends
// take here, about 15 seconds of a receiver outage before publishers are asked to wait.
/// `SHEAF_MEMORY_MAX_PENDING_EVENTS`.
pub const MEMORY_MAX_PENDING_EVENTS: Setting = setting(
    "SHEAF_MEMORY_MAX_PENDING_EVENTS",
    Some("100000"),
    Kind::Integer {
        min: 1,
        max: 100_000_000,
    },
    "With the memory queue and log: most events accepted and not yet delivered (waiting, being retried or dead-lettered). The log keeps them out of retention's reach; at the bound publishes are answered `503` with `Retry-After` and the CDC source stops reading, and nothing accepted is dropped.",
);
/// `SHEAF_MEMORY_MAX_PENDING_BYTES`.
pub const MEMORY_MAX_PENDING_BYTES: Setting = setting(
    "SHEAF_MEMORY_MAX_PENDING_BYTES",
    Some("134217728"),
    Kind::Integer {
        min: 1024,
        max: 1 << 40,
    },
    "With the memory queue and log: most payload bytes (compact JSON) of the events accepted and not yet delivered; reaching it refuses publishes as `SHEAF_MEMORY_MAX_PENDING_EVENTS` does.",
);
// The outbox grows only while the log store is unreachable or slower than the publishes; at
// ~1.3 KB of Postgres per waiting 1 KB event, ten million are some 13 GB of disk: hours of a
// ClickHouse outage at the measured rates, and a bound that stops a full disk from stopping
// the queue itself.
/// `SHEAF_OUTBOX_MAX_EVENTS`.
pub const OUTBOX_MAX_EVENTS: Setting = setting(
    "SHEAF_OUTBOX_MAX_EVENTS",
    Some("10000000"),
    Kind::Integer {
        min: 1,
        max: 1_000_000_000,
    },
    "With SHEAF_QUEUE=postgres and a log store elsewhere, or SHEAF_QUEUE=jetstream with the bucket's outbox: most events waiting in the outbox (Postgres tables, or the JetStream bucket) for the log store (sampled every 2 s). At the bound publishes are answered `503` with `Retry-After` and the CDC source stops reading until the log store has taken them.",
);
// A day covers any client's retry of a publish by a wide margin; each remembered key costs
// about 100 bytes of Postgres, so a million events a day keep some 100 MB.
/// `SHEAF_IDEMPOTENCY_WINDOW`.
pub const IDEMPOTENCY_WINDOW: Setting = setting(
    "SHEAF_IDEMPOTENCY_WINDOW",
    Some("24h"),
    Kind::Duration {
        min: MINUTE,
        max: Duration::from_secs(90 * 24 * 3600),
    },
    "With SHEAF_QUEUE=postgres and a log store elsewhere: how long an accepted event id is remembered, so publishing it again delivers nothing. With the Postgres log store, ids are remembered as long as the log keeps the event.",
);
// Event payloads are small JSON documents; 1 MiB is generous and bounds a request's memory.
/// `SHEAF_MAX_BODY_BYTES`.
pub const MAX_BODY_BYTES: Setting = setting(
    "SHEAF_MAX_BODY_BYTES",
    Some("1048576"),
    Kind::Integer {
        min: 1024,
        max: 100 << 20,
    },
    "Largest accepted request body; larger ones get 413.",
);
/// `SHEAF_REQUEST_TIMEOUT`.
pub const REQUEST_TIMEOUT: Setting = setting(
    "SHEAF_REQUEST_TIMEOUT",
    Some("30s"),
    Kind::Duration {
        min: SECOND,
        max: Duration::from_secs(600),
    },
    "Longest the API spends on one request, reading its body included; past it the request is answered 503 `request_timeout`. A publish cut off this way may have been accepted already: publishing it again with the same `id` is safe.",
);
/// `SHEAF_ALLOW_PRIVATE_DESTINATIONS`.
pub const ALLOW_PRIVATE_DESTINATIONS: Setting = setting(
    "SHEAF_ALLOW_PRIVATE_DESTINATIONS",
    Some("false"),
    Kind::Bool,
    "Allow destination URLs whose host is or resolves to a loopback, private, link-local, unspecified or otherwise non-public address. `false` checks the URL when a destination is created or changed, and again at every delivery's connection (the resolved addresses, so a name that later resolves inside the network is refused); deliveries then ignore the environment's proxy variables, and go through `SHEAF_EGRESS_PROXY` only, with every destination checked before it is handed to the proxy.",
);
/// `SHEAF_EGRESS_PROXY`.
pub const EGRESS_PROXY: Setting = setting(
    "SHEAF_EGRESS_PROXY",
    None,
    Kind::Text("`http://[user:password@]host:port` (or `https://`)"),
    "HTTP proxy every webhook delivery goes through: `CONNECT` for `https://` destinations, a forwarded request for `http://` ones (static egress addresses, an egress filtering proxy). The proxy itself may be on a private address. With the private-destination guard on, each delivery's destination is still resolved and checked by Sheaf before it is handed to the proxy, so the proxy cannot be used to reach a private address; the proxy resolves the name again, so let it enforce its own egress rules too (`docs/security.md`). Unset: deliveries connect directly (or, with the guard off, through the environment's `HTTPS_PROXY`/`HTTP_PROXY`). RabbitMQ and NATS destinations always connect directly.",
);
/// `SHEAF_TLS_CA_FILE`.
pub const TLS_CA_FILE: Setting = setting(
    "SHEAF_TLS_CA_FILE",
    None,
    Kind::Text("path to a PEM file of one or more CA certificates"),
    "CA certificates trusted besides the public roots by every TLS connection Sheaf makes: Postgres and the replication stream (where the URL names no `sslrootcert` of its own), ClickHouse over `https://`, webhook receivers (which also trust the system's roots) and RabbitMQ and NATS destinations over `amqps://` and `tls://`. Read at start: a file that cannot be read or holds no usable certificate stops start-up.",
);
/// `SHEAF_DESTINATION_DISABLE_AFTER_FAILURES`.
pub const DESTINATION_DISABLE_AFTER_FAILURES: Setting = setting(
    "SHEAF_DESTINATION_DISABLE_AFTER_FAILURES",
    Some("0"),
    Kind::Integer {
        min: 0,
        max: 1_000_000,
    },
    "Consecutive failed attempts (across every delivery to it, in every process) after which a destination is disabled, with an automatic `disabled_reason`; 0 = never. A success resets the count. Re-enabling keeps the count until the next success, so a destination that fails again at once is disabled again by that one failure. Counted once per batch of outcomes (one entity-store statement), not once per attempt.",
);
/// `SHEAF_OPERATOR_WEBHOOK_URL`.
pub const OPERATOR_WEBHOOK_URL: Setting = setting(
    "SHEAF_OPERATOR_WEBHOOK_URL",
    None,
    Kind::Text("an `http://` or `https://` URL"),
    "Where operator events go (`destination.disabled`, `destination.recovered`, `delivery.dead_lettered`), as signed webhooks through the same queue, retries and log as every delivery (tenant `_sheaf`). The private-destination guard applies to it as to any destination. Unset: no operator events.",
);
/// `SHEAF_OPERATOR_WEBHOOK_SECRET`.
pub const OPERATOR_WEBHOOK_SECRET: Setting = setting(
    "SHEAF_OPERATOR_WEBHOOK_SECRET",
    None,
    Kind::Text("`whsec_` and the base64 of 24 to 64 bytes"),
    "The Standard Webhooks secret operator events are signed with. Required with `SHEAF_OPERATOR_WEBHOOK_URL`; changing it takes effect at the next start (the previous one stops signing at once).",
);
/// `SHEAF_SECRETS_KEY`.
pub const SECRETS_KEY: Setting = setting(
    "SHEAF_SECRETS_KEY",
    None,
    Kind::Text("standard base64 of exactly 32 bytes (`head -c 32 /dev/urandom | base64`)"),
    "Key that encrypts destination signing secrets, and the password of a destination's `config.url`, at rest (AES-256-GCM), in every entity store: rows hold `enc:v2:<key id>:…`, never the secret. Values stored before it was set still read, and every write is encrypted with this key. Unset: secrets are stored as they are, and the log warns at start when they live in Postgres. Losing it makes every encrypted value unreadable; to rotate it, see `SHEAF_SECRETS_KEY_PREVIOUS` and `docs/operations.md`.",
);
/// `SHEAF_SECRETS_KEY_PREVIOUS`.
pub const SECRETS_KEY_PREVIOUS: Setting = setting(
    "SHEAF_SECRETS_KEY_PREVIOUS",
    None,
    Kind::Text("standard base64 of exactly 32 bytes, not `SHEAF_SECRETS_KEY`'s"),
    "A second key that only decrypts: values sealed with it (a key id in `enc:v2:<key id>:`, or any `enc:v1:` value) still open while every write is sealed with `SHEAF_SECRETS_KEY`. Set it to the old key while rotating, run `sheaf secrets reseal` once every process runs the new key, then unset it (`docs/operations.md`). Requires `SHEAF_SECRETS_KEY`.",
);
// A day gives receivers time to deploy the new secret.
/// `SHEAF_SECRET_ROTATION_GRACE`.
pub const SECRET_ROTATION_GRACE: Setting = setting(
    "SHEAF_SECRET_ROTATION_GRACE",
    Some("24h"),
    Kind::Duration {
        min: Duration::ZERO,
        max: Duration::from_secs(30 * 86_400),
    },
    "How long a rotated-out signing secret keeps signing deliveries next to the new one.",
);
// Destinations change rarely; 5 s bounds how long another process keeps delivering to an old
// URL while costing each process one read per tenant every 5 s.
/// `SHEAF_ENTITY_CACHE_TTL`.
pub const ENTITY_CACHE_TTL: Setting = setting(
    "SHEAF_ENTITY_CACHE_TTL",
    Some("5s"),
    Kind::Duration {
        min: Duration::ZERO,
        max: Duration::from_secs(600),
    },
    "How long tenants and destinations stay cached; changes made through this process apply at once, changes made through another process within this time.",
);
// Longer than the 15 s delivery timeout, so an in-flight delivery normally finishes; well
// under the usual 30 s a supervisor waits before SIGKILL.
/// `SHEAF_SHUTDOWN_TIMEOUT`.
pub const SHUTDOWN_TIMEOUT: Setting = setting(
    "SHEAF_SHUTDOWN_TIMEOUT",
    Some("20s"),
    Kind::Duration {
        min: Duration::ZERO,
        max: Duration::from_secs(600),
    },
    "On SIGTERM or ctrl-c, how long in-flight deliveries may take to finish before they are abandoned (their jobs come back when their lease ends).",
);
// Tenants' jq programs run in processes of their own (a runaway or a crash costs a runner, not
// the service); `sheaf` itself is the runner unless told otherwise.
/// `SHEAF_TRANSFORM_RUNNER`.
pub const TRANSFORM_RUNNER: Setting = setting(
    "SHEAF_TRANSFORM_RUNNER",
    None,
    Kind::Text("an executable's path, then its arguments, separated by spaces"),
    "The command that starts a transformation runner, the process destinations' transformations run in (it reads requests on its standard input). Unset: this `sheaf` binary as `sheaf transform-runner`. When set, it is started and checked at start-up.",
);
// Two runners keep one slow program from holding up every other; each is a small process.
/// `SHEAF_TRANSFORM_RUNNERS`.
pub const TRANSFORM_RUNNERS: Setting = setting(
    "SHEAF_TRANSFORM_RUNNERS",
    Some("2"),
    Kind::Integer { min: 1, max: 64 },
    "How many transformation runner processes run at most; each is started when first needed. A run that has not answered after a second has its runner stopped and its program refused.",
);
/// `SHEAF_CDC_ENABLED`.
pub const CDC_ENABLED: Setting = setting(
    "SHEAF_CDC_ENABLED",
    Some("false"),
    Kind::Bool,
    "Run the CDC source: every committed change of the published tables in the application's Postgres becomes an event (topic `<schema>.<table>.<insert|update|delete|truncate>`), published like any other and acknowledged to the replication slot only once durable.",
);
/// `SHEAF_CDC_POSTGRES_URL`.
pub const CDC_POSTGRES_URL: Setting = setting(
    "SHEAF_CDC_POSTGRES_URL",
    None,
    Kind::Text("`postgres://user:password@host:port/database[?sslmode=…&sslrootcert=…]`"),
    "The application's database, read through logical replication (may differ from `SHEAF_POSTGRES_URL`); required when the CDC source is enabled. The role needs `LOGIN REPLICATION`, and to create the publication it must own the tables. SCRAM or password authentication; TLS by `sslmode` and `sslrootcert` as in `SHEAF_POSTGRES_URL` (the replication stream included), other query parameters are ignored.",
);
/// `SHEAF_CDC_SLOT`.
pub const CDC_SLOT: Setting = setting(
    "SHEAF_CDC_SLOT",
    Some("sheaf_cdc"),
    Kind::Text("1 to 63 lower-case letters, digits and `_`"),
    "The logical replication slot (plugin `pgoutput`); a restart resumes from its confirmed position. Postgres lets one connection read a slot at a time: other processes given the same slot keep trying (every 30 s at most) and take over when it is free. Event ids start with `cdc-<slot>-`.",
);
/// `SHEAF_CDC_PUBLICATION`.
pub const CDC_PUBLICATION: Setting = setting(
    "SHEAF_CDC_PUBLICATION",
    Some("sheaf_cdc"),
    Kind::Text("a non-empty name"),
    "The publication whose tables are read.",
);
/// `SHEAF_CDC_CREATE_MISSING`.
pub const CDC_CREATE_MISSING: Setting = with_rule(
    setting(
        "SHEAF_CDC_CREATE_MISSING",
        Some("false"),
        Kind::Bool,
        "`false`: the slot and the publication must exist (a missing one is reported and retried). `true`: create what is missing, the publication `FOR TABLE` the tables named in `SHEAF_CDC_TENANTS`.",
    ),
    "`true` needs `SHEAF_CDC_TENANTS` to name tables",
);
/// `SHEAF_CDC_TENANTS`.
pub const CDC_TENANTS: Setting = setting(
    "SHEAF_CDC_TENANTS",
    None,
    Kind::Text("a tenant id, or `schema.table=tenant,…[,*=tenant]`"),
    "Which tables feed which tenant: one tenant id for every published table (`acme`), or a comma-separated map `schema.table=tenant`, optionally with `*=tenant` for every other table. Changes of tables the map does not cover are dropped and still acknowledged; `*` never covers the tables in `SHEAF_POSTGRES_SCHEMA`. Required when the CDC source is enabled; the tenants must exist (until one does, its changes wait and are retried).",
);
// Off by default, as in sheaf-cdc: a multi-row message changes the unit of failure (one failed
// write fails the whole transaction's events).
/// `SHEAF_CDC_BATCH_TRANSACTIONS`.
pub const CDC_BATCH_TRANSACTIONS: Setting = setting(
    "SHEAF_CDC_BATCH_TRANSACTIONS",
    Some("false"),
    Kind::Bool,
    "Publish each replicated transaction as one batch (one log write, one enqueue, one acknowledgement) instead of one message per row. It changes the unit of failure: a failed publish retries the whole transaction's events. Transactions over the row cap (`SHEAF_CDC_CHECKPOINT_LIMIT` / 2, at most 1000) or 4 MiB of WAL still arrive in several batches. Cannot be combined with `SHEAF_CDC_BATCH_SIZE`.",
);
/// `SHEAF_CDC_BATCH_SIZE`.
pub const CDC_BATCH_SIZE: Setting = setting(
    "SHEAF_CDC_BATCH_SIZE",
    Some("0"),
    Kind::Integer {
        min: 0,
        max: 10_000,
    },
    "A batching policy instead: publish up to this many rows (possibly of several transactions) as one batch, waiting at most `SHEAF_CDC_BATCH_WAIT` for them; 0 = no policy (one row per message, or one transaction with `SHEAF_CDC_BATCH_TRANSACTIONS`).",
);
/// `SHEAF_CDC_BATCH_WAIT`.
pub const CDC_BATCH_WAIT: Setting = setting(
    "SHEAF_CDC_BATCH_WAIT",
    Some("20ms"),
    Kind::Duration {
        min: Duration::ZERO,
        max: Duration::from_secs(10),
    },
    "Longest wait for more rows once a policy batch (`SHEAF_CDC_BATCH_SIZE`) has its first.",
);
// sheaf-cdc's own default: reader batches then hold at most 512 rows, half of it.
/// `SHEAF_CDC_CHECKPOINT_LIMIT`.
pub const CDC_CHECKPOINT_LIMIT: Setting = setting(
    "SHEAF_CDC_CHECKPOINT_LIMIT",
    Some("1024"),
    Kind::Integer {
        min: 1,
        max: 1_000_000,
    },
    "Most rows read from the slot and not yet acknowledged; the reader waits beyond it. Reader batches hold at most half of it (and at most 1000 rows).",
);
// Each message's publish waits on its commit (the Postgres outbox's group commit, or the log
// write and the enqueue); the messages in flight are what one group commit can gather, so with
// one row per message this bounds the changes per statement. 64 keeps a commit's statement
// well-filled while the checkpoint limit still bounds the rows held.
/// `SHEAF_CDC_MAX_IN_FLIGHT`.
pub const CDC_MAX_IN_FLIGHT: Setting = setting(
    "SHEAF_CDC_MAX_IN_FLIGHT",
    Some("64"),
    Kind::Integer { min: 1, max: 1024 },
    "Messages from the slot being published at once; each is acknowledged on its own once durable, and the slot advances over the acknowledged prefix only. 1 publishes strictly one after another.",
);
/// `SHEAF_CDC_HEARTBEAT_INTERVAL`.
pub const CDC_HEARTBEAT_INTERVAL: Setting = setting(
    "SHEAF_CDC_HEARTBEAT_INTERVAL",
    Some("0s"),
    Kind::DurationOrOff {
        min: SECOND,
        max: HOUR,
    },
    "When above 0, a logical decoding message is written to the application's database on this interval, so the slot keeps advancing when the published tables are idle; 0s = off (keepalives already advance it when other databases write WAL).",
);
/// `SHEAF_LOG`.
pub const LOG: Setting = setting(
    "SHEAF_LOG",
    Some("info"),
    Kind::Text("e.g. `info`, `sheaf_engine=debug,info`"),
    "Log filter for the service's own log lines (tracing `EnvFilter` syntax).",
);
/// `SHEAF_LOG_FORMAT`.
pub const LOG_FORMAT: Setting = setting(
    "SHEAF_LOG_FORMAT",
    Some("text"),
    Kind::OneOf(&["text", "json"]),
    "How log lines are written to standard error: `text` for people, `json` for log pipelines (one object per line: `timestamp`, `level`, `target`, the message and fields, and `span` with the current span's fields, such as an API request's `request_id`).",
);

/// `SHEAF_OTLP_ENDPOINT`.
pub const OTLP_ENDPOINT: Setting = setting(
    "SHEAF_OTLP_ENDPOINT",
    None,
    Kind::Text("`http(s)://host:port` of an OTLP/HTTP collector"),
    "Where OpenTelemetry traces are sent, over OTLP/HTTP with protobuf bodies (to `<endpoint>/v1/traces`, as `OTEL_EXPORTER_OTLP_ENDPOINT` would): a span per API request and publish, per group commit and coalesced log write or lookup (linked from every publish or delivery it served), per delivery attempt and per CDC batch, and a `traceparent` header on every delivery (an HTTP header on a webhook, a message header on RabbitMQ and NATS). A publish's trace context is stored with its events, so their deliveries join its trace in any process, also after a restart. Unset: no spans are exported and nothing is stored or kept for them.",
);

/// `SHEAF_OTLP_SAMPLE_PERCENT`.
pub const OTLP_SAMPLE_PERCENT: Setting = setting(
    "SHEAF_OTLP_SAMPLE_PERCENT",
    Some("100"),
    Kind::Integer { min: 0, max: 100 },
    "With SHEAF_OTLP_ENDPOINT: the share of new traces recorded and exported, chosen by trace id. A request whose `traceparent` says whether its trace is sampled is followed in that; the deliveries of an event follow its publish. Exporting every trace costs about a third of the memory backends' throughput at saturation (docs/benchmarks.md, `delivery`).",
);

/// Every setting the service reads, in the order `--help` and the docs list them.
pub const SETTINGS: &[Setting] = &[
    CONFIG_FILE,
    LISTEN,
    API_KEY,
    TOKEN_SIGNING_KEY,
    TOKEN_MAX_TTL,
    PUBLIC_URL,
    LOG_STORE,
    QUEUE,
    DATA_DIR,
    SQLITE_SYNC,
    SQLITE_MAX_SIZE_MIB,
    POSTGRES_URL,
    CLICKHOUSE_URL,
    POSTGRES_SCHEMA,
    CLICKHOUSE_DATABASE,
    CLICKHOUSE_CLUSTER,
    CLICKHOUSE_CLUSTER_NODES,
    CLICKHOUSE_CLUSTER_REPLICATION,
    JETSTREAM_URLS,
    JETSTREAM_BUCKET,
    JETSTREAM_REPLICAS,
    RETRY_SCHEDULE,
    RETRY_MAX_ATTEMPTS,
    RETRY_JITTER_PERCENT,
    RETRY_NOT_READY_DELAY,
    RETRY_AFTER_MAX,
    RETRY_LOOKUP_BATCH_SIZE,
    RETRY_LOOKUP_BATCH_WAIT,
    RETRY_LOOKUP_ADAPTIVE,
    EVENT_LOOKUP_BATCH_SIZE,
    FRESH_EVENT_CACHE,
    DELIVERY_WORKERS,
    DELIVERY_TIMEOUT,
    QUEUE_LEASE,
    QUEUE_POLL_INTERVAL,
    COMPLETER_FLUSH_INTERVAL,
    COMPLETER_MAX_BATCH,
    LOG_WRITE_MAX_RECORDS,
    LOG_WRITE_MAX_BYTES,
    LOG_WRITE_MAX_WAIT,
    LOG_SHIP_INTERVAL,
    MAX_PUBLISHES_IN_FLIGHT,
    MEMORY_LOG_MAX_EVENTS,
    MEMORY_LOG_MAX_ATTEMPTS,
    MEMORY_LOG_MAX_AGE,
    MEMORY_MAX_PENDING_EVENTS,
    MEMORY_MAX_PENDING_BYTES,
    OUTBOX_MAX_EVENTS,
    IDEMPOTENCY_WINDOW,
    MAX_BODY_BYTES,
    REQUEST_TIMEOUT,
    ALLOW_PRIVATE_DESTINATIONS,
    EGRESS_PROXY,
    TLS_CA_FILE,
    SECRETS_KEY,
    SECRETS_KEY_PREVIOUS,
    SECRET_ROTATION_GRACE,
    DESTINATION_DISABLE_AFTER_FAILURES,
    OPERATOR_WEBHOOK_URL,
    OPERATOR_WEBHOOK_SECRET,
    ENTITY_CACHE_TTL,
    SHUTDOWN_TIMEOUT,
    TRANSFORM_RUNNER,
    TRANSFORM_RUNNERS,
    CDC_ENABLED,
    CDC_POSTGRES_URL,
    CDC_SLOT,
    CDC_PUBLICATION,
    CDC_CREATE_MISSING,
    CDC_TENANTS,
    CDC_BATCH_TRANSACTIONS,
    CDC_BATCH_SIZE,
    CDC_BATCH_WAIT,
    CDC_CHECKPOINT_LIMIT,
    CDC_MAX_IN_FLIGHT,
    CDC_HEARTBEAT_INTERVAL,
    LOG,
    LOG_FORMAT,
    OTLP_ENDPOINT,
    OTLP_SAMPLE_PERCENT,
];

/// The TOML key of a variable: its name without `SHEAF_`, lower-case.
pub(super) fn file_key_of(name: &str) -> String {
    name.strip_prefix("SHEAF_")
        .unwrap_or(name)
        .to_ascii_lowercase()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_default_is_valid_for_its_kind() {
        for s in SETTINGS {
            if let Some(default) = s.default {
                super::super::values::check_kind(s, default)
                    .unwrap_or_else(|e| panic!("{}'s default {default:?}: {e}", s.name));
            }
        }
    }

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut names: Vec<&str> = SETTINGS.iter().map(|s| s.name).collect();
        assert!(names.iter().all(|n| n.starts_with("SHEAF_")));
        names.sort_unstable();
        let before = names.len();
        names.dedup();
        assert_eq!(before, names.len(), "a setting is listed twice");
    }

    #[test]
    fn kinds_describe_their_bounds() {
        assert_eq!(RETRY_MAX_ATTEMPTS.valid(), "1..=100");
        assert_eq!(TOKEN_MAX_TTL.valid(), "a duration, 1m..365d");
        assert_eq!(
            DELIVERY_TIMEOUT.valid(),
            "a duration, 100ms..10m; shorter than `SHEAF_QUEUE_LEASE`"
        );
        assert_eq!(
            LOG_STORE.valid(),
            "`sqlite`, `memory`, `postgres`, `clickhouse`"
        );
        assert_eq!(CDC_HEARTBEAT_INTERVAL.valid(), "`0s`, or a duration 1s..1h");
    }
}
