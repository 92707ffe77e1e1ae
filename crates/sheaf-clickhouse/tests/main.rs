//! The ClickHouse log store against a real ClickHouse 26.9 server (`SHEAF_TEST_CLICKHOUSE_URL`,
//! set by `cargo xtask test`): the shared suites, what only this backend has to get right
//! (unmerged duplicates, servers that refuse the lazy-materialization setting, coalesced
//! inserts, migrations), and the cost of a lookup. Each test works in a database of its own.

mod cluster;
mod cost;
mod duplicates;
mod errors;
mod lazy_limit;
mod schema;
mod suites;
mod support;
mod tls;
mod writes;
