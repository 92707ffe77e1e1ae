//! The suites that decide whether a backend is correct, written once and run by every backend.
//!
//! - [`conformance`]: one `pub async fn` per behaviour of [`LogStore`](crate::LogStore),
//!   [`JobQueue`](crate::JobQueue), [`EntityStore`](crate::EntityStore), [`Outbox`](crate::Outbox)
//!   and [`ReplayStore`](crate::ReplayStore), plus `run_*` functions that call them all.
//! - [`parity`]: a property test that `latest_attempts(keys)` equals the single lookups key by key
//!   and equals the plain reference model in [`model`], over random histories and key sets; other
//!   lookup paths (e.g. a `LookupCoalescer` in front of the store) plug in through
//!   [`parity::ParityLookup`].
//!   [`coalesced::ThroughCoalescer`] is always one of them: every backend's parity run also goes
//!   through a `LookupCoalescer` with random batch sizes and the 15-minute split rule.
//! - [`fixtures`]: builders for test records and unique tenant ids.
//!
//! # Calling the suites from a backend
//!
//! ```text
//! // crates/sheaf-<backend>/tests/main.rs, with sheaf-store's `testkit` feature in dev-dependencies
//! #[tokio::test(flavor = "multi_thread")]
//! async fn conformance() {
//!     let (log, queue, entities) = fresh_stores().await; // a new schema / database per run
//!     sheaf_store::testkit::conformance::run_all(&*log, &*queue, &*entities).await;
//! }
//!
//! #[tokio::test(flavor = "multi_thread")]
//! async fn parity() {
//!     let log: Arc<dyn LogStore> = fresh_log_store().await;
//!     let config = sheaf_store::testkit::parity::ParityConfig::from_env();
//!     sheaf_store::testkit::parity::run(log, &config, &[]).await;
//! }
//! ```
//!
//! # Isolation
//!
//! Log and entity cases make their own tenants with a random suffix ([`fixtures::unique_tenant`]),
//! so they can share one store with each other and with earlier runs. Queue cases cannot: a claim
//! takes any due job, whatever its tenant. They must run one at a time on a queue nobody else uses
//! (a fresh store, schema or database); each case checks that the queue is idle when it starts and
//! purges its tenants when it ends.
//!
//! # Time
//!
//! The queue runs on its own clock (the database server's, for Postgres), so the queue cases use
//! real, short leases (a few hundred milliseconds) and bounded waits. Run them on a real-time
//! runtime: paused tokio time would not move the store's clock.

pub mod coalesced;
pub mod conformance;
pub mod fixtures;
pub mod model;
pub mod parity;
