//! One module per scenario (docs/benchmarks.md has a section for each), in the order they are
//! run by `all`.

mod burst;
mod cdc;
mod clickhouse_insert;
mod delivery;
mod destinations;
mod lookup;
mod memory;
mod parts;
mod queue;

use crate::context::Ctx;
use crate::report::Report;

/// Every scenario, in the order `all` runs them (the list xtask checks names against).
pub use sheaf_testenv::scenarios::BENCH as NAMES;

/// Runs the scenario `name`.
pub async fn run(name: &str, ctx: &Ctx) -> anyhow::Result<Report> {
    match name {
        "lookup" => lookup::run(ctx).await,
        "parts" => parts::run(ctx).await,
        "queue" => queue::run(ctx).await,
        "delivery" => delivery::run(ctx).await,
        "burst" => burst::run(ctx).await,
        "cdc" => cdc::run(ctx).await,
        "destinations" => Box::pin(destinations::run(ctx)).await,
        "memory" => memory::run(ctx).await,
        "clickhouse-insert" => clickhouse_insert::run(ctx).await,
        other => anyhow::bail!("unknown scenario `{other}`"),
    }
}
