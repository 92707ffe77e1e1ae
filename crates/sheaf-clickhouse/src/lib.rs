//! Sheaf's LogStore on ClickHouse: the record of events and delivery attempts where it lives at scale.
#![doc = include_str!("../README.md")]

mod config;
mod counts;
mod error;
mod http;
mod latest;
mod migrate;
mod rows;
mod schema;
mod store;
mod tuning;
mod write;

pub use config::{ClickHouseCluster, ClickHouseConfig, ClusterReplication};
pub use store::ClickHouseLogStore;
