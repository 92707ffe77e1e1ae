//! The harness's own proof: the servers `cargo xtask test` starts are the ones the
//! suites need (Postgres with logical replication, a modern ClickHouse).

mod harness;
