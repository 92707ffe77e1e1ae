//! The one list of benchmark scenarios (`sheaf-bench`) and of fault scenarios (`sheaf-chaos`):
//! xtask checks the names it is given against it before it builds or starts anything, and the
//! binaries run `all` in its order, so a scenario added to a binary is added here once.

/// Every scenario of `sheaf-bench`, in the order `all` runs them (docs/benchmarks.md has a
/// section for each).
pub const BENCH: &[&str] = &[
    "lookup",
    "parts",
    "queue",
    "delivery",
    "burst",
    "cdc",
    "destinations",
    "memory",
    "clickhouse-insert",
];

/// The benchmark scenarios that start `sheaf` processes, for which xtask builds the binary first.
pub const BENCH_SPAWNING_SHEAF: &[&str] = &["delivery", "burst", "cdc", "destinations", "memory"];

/// Every scenario of `sheaf-chaos`, in the order `all` runs them (docs/operations.md).
pub const CHAOS: &[&str] = &[
    "kill",
    "ordering",
    "postgres",
    "clickhouse",
    "clickhouse-replica",
    "nats-node",
    "sheaf-process",
    "shutdown",
    "cdc",
    "broker",
    "outage",
    "disabled",
    "overload",
    "secrets",
    "sqlite",
];
