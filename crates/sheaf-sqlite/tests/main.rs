//! The SQLite stores against the shared conformance and parity suites, and what only this
//! backend promises. Every test opens its own file under the system's temporary directory, so
//! no server is needed and nothing is skipped.

mod measure;
mod retention;
mod sqlite;
mod suites;
mod support;
