//! The harness's own proof: the servers `cargo xtask test` starts are the ones the suites need
//! (Postgres with logical replication and TLS, a Postgres with TLS off, a modern ClickHouse,
//! also over HTTPS, RabbitMQ and NATS with JetStream), and the pieces behind features do what
//! the suites rely on (run them with `--all-features`; the workspace's test run enables them
//! through the crates that use them).

mod brokers;
mod harness;
#[cfg(feature = "receiver")]
mod receiver;
#[cfg(feature = "postgres")]
mod slots;
mod tls;
