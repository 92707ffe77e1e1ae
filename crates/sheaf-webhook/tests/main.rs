//! The webhook destination type's tests: the shared destination suite and what only webhooks do.

mod conformance;
