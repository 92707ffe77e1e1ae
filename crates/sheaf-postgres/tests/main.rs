//! The Postgres stores against a real Postgres 15: the shared conformance and parity suites, and
//! what only this backend promises (queue exclusivity under load, lease expiry on the server's
//! clock, HOT updates, index-probe plans, concurrent delivery-health reports, error kinds,
//! migrations), plus the throughput figures.
//!
//! Every test that needs the server gets its URL from `SHEAF_TEST_POSTGRES_URL` (skipping with a
//! printed line without it, failing under CI) and runs in a schema of its own, dropped after.

mod entity;
mod errors;
mod log;
mod measure;
mod migrations;
mod queue;
mod suites;
mod support;
mod tls;
