//! The service's tests, one binary: real HTTP receivers on loopback, real stores.
//!
//! - `delivery`: the memory backends through an outage, idempotency, manual retry, dead letters.
//! - `api`: authentication, bad input, the private-address guard, the OpenAPI document.
//! - `signatures`: Standard Webhooks signatures verified by the `standardwebhooks` package.
//! - `binary`: the `sheaf` binary's help, version, configuration errors and the docs' table.
//! - `shared`: Postgres and ClickHouse configurations, and two `sheaf` processes sharing them.
//! - `cdc`: the CDC source on the real Postgres, in process and through the binary killed mid-stream.

mod api;
mod binary;
mod cdc;
mod delivery;
mod shared;
mod signatures;
mod support;
