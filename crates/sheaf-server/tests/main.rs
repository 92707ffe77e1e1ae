//! The service's tests, one binary: real HTTP receivers on loopback, real stores.
//!
//! - `delivery`: the memory backends through an outage, idempotency, manual retry, dead letters.
//! - `embedded`: the SQLite store through the binary: a restart, kill -9, one process per
//!   data directory.
//! - `api`: authentication, bad input, the private-address guard, the OpenAPI document.
//! - `brokers`: RabbitMQ and NATS JetStream destinations through `sheaf serve`, on real brokers,
//!   and their passwords sealed at rest and redacted in the API.
//! - `controls`: destination controls on every backend (memory, SQLite, Postgres, Postgres +
//!   ClickHouse): payload filters, automatic disabling with operator events, bulk replay (also
//!   resumed by a second process when the first is killed or shut down mid-replay).
//! - `signatures`: Standard Webhooks signatures verified by the `standardwebhooks` package.
//! - `observability`: request ids, the request timeout, JSON logs.
//! - `traces`: OpenTelemetry spans received by an OTLP collector in the test, and `traceparent`.
//! - `binary`: the `sheaf` binary's help, version, configuration errors and the docs' table.
//! - `shared`: Postgres and ClickHouse configurations, and two `sheaf` processes sharing them.
//! - `cdc`: the CDC source on the real Postgres, in process and through the binary killed mid-stream.
//! - `bad_input`: oversized, deep, non-UTF-8 and unknown input, absurd limits and bad cursors.
//! - `schemathesis`: generated requests against the OpenAPI document (PyPI's schemathesis).
//! - `portal`: the web portal's files, links and chart counts, and the portal in Chromium.
//! - `transforms`: destinations' jq transformations on a real receiver (reshaped and signed,
//!   filtered, failed, a runaway and a crash), and the dry run.
//! - `security`: tenant tokens walked over every route, sealed secrets, a `SHEAF_SECRETS_KEY`
//!   rotation with `sheaf secrets reseal` under deliveries, secret-free logs, the connect-time
//!   guard and redirects, TLS to receivers and to the OTLP collector.

mod api;
mod bad_input;
mod binary;
mod brokers;
mod cdc;
mod controls;
mod delivery;
mod embedded;
mod observability;
mod portal;
mod schemathesis;
mod security;
mod shared;
mod signatures;
mod support;
mod traces;
mod transforms;
