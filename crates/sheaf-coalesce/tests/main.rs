//! The one test binary of sheaf-coalesce; each area is a module.

mod lookup;
mod parity;
mod support;
mod write;
