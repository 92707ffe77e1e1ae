//! Bounds on what a destination may carry, shared by the handlers that enforce them and the
//! OpenAPI document that states them.

/// Most custom headers a destination may have.
pub const MAX_CUSTOM_HEADERS: usize = 32;
/// Longest custom header name.
pub const MAX_HEADER_NAME_LEN: usize = 64;
/// Longest custom header value.
pub const MAX_HEADER_VALUE_LEN: usize = 1024;
/// Most topics in a destination's filter.
pub const MAX_TOPICS: usize = 100;
