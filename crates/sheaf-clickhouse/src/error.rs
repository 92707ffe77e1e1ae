//! The one place where errors of the `clickhouse` crate become [`sheaf_store::Error`]s.
//!
//! The kind is chosen by what happened, not where: a refused connection or a server that is
//! overloaded is [`ErrorKind::Unavailable`](sheaf_store::ErrorKind::Unavailable) (the caller backs
//! off and retries, and every write is idempotent for that reason); a query the server rejects
//! for what it says, or a row that does not decode, is
//! [`ErrorKind::Backend`](sheaf_store::ErrorKind::Backend).

use std::time::Duration;

use clickhouse::error::Error as DriverError;
use sheaf_store::Error;

/// The setting whose rejection switches the batched lookup to its fallback query.
pub(crate) const LAZY_LIMIT_SETTING: &str = "query_plan_max_limit_for_lazy_materialization";

/// Server error codes that mean "not now" rather than "never": timeouts, overload, too many
/// parts, a replica or table that is temporarily read-only, network trouble between servers.
const TRANSIENT_CODES: &[u32] = &[
    3,   // UNEXPECTED_END_OF_FILE: the connection was cut mid-answer.
    159, // TIMEOUT_EXCEEDED
    160, // TOO_SLOW
    202, // TOO_MANY_SIMULTANEOUS_QUERIES
    203, // NO_FREE_CONNECTION
    209, // SOCKET_TIMEOUT
    210, // NETWORK_ERROR
    236, // ABORTED
    241, // MEMORY_LIMIT_EXCEEDED
    242, // TABLE_IS_READ_ONLY
    252, // TOO_MANY_PARTS
    285, // TOO_FEW_LIVE_REPLICAS
    319, // UNKNOWN_STATUS_OF_INSERT
    394, // QUERY_WAS_CANCELLED
    439, // CANNOT_SCHEDULE_TASK
    999, // KEEPER_EXCEPTION
];

/// Codes with which a server refuses a query-level setting: unknown (servers before the lazy
/// materialization limit existed), read-only (a `readonly` user or profile), or outside the
/// profile's constraints.
const SETTING_REJECTED_CODES: &[u32] = &[
    115, // UNKNOWN_SETTING
    164, // READONLY
    452, // SETTING_CONSTRAINT_VIOLATION
];

/// The server's error code in a `Code: N. DB::Exception: …` message, if there is one.
pub(crate) fn server_code(err: &DriverError) -> Option<u32> {
    let DriverError::BadResponse(message) = err else {
        return None;
    };
    let rest = &message[message.find("Code: ")? + "Code: ".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Whether `err` is the server refusing one of `settings` (sent in a query's `SETTINGS`
/// clause). The message must name the setting, so that an unrelated read-only or constraint
/// error is not mistaken for it.
pub(crate) fn rejects_setting(err: &DriverError, settings: &[&str]) -> bool {
    let DriverError::BadResponse(message) = err else {
        return false;
    };
    server_code(err).is_some_and(|code| SETTING_REJECTED_CODES.contains(&code))
        && settings.iter().any(|name| message.contains(name))
}

/// Converts a driver error met while doing `what` (lower case, e.g. "list attempts").
pub(crate) fn from_driver(what: &str, err: DriverError) -> Error {
    let transient = match &err {
        DriverError::Network(_) | DriverError::TimedOut => true,
        DriverError::BadResponse(message) => match server_code(&err) {
            Some(code) => TRANSIENT_CODES.contains(&code),
            // No exception code: the HTTP status stood alone, e.g. a proxy's "502 Bad Gateway"
            // or "503 Service Unavailable" while the server restarts.
            None => ["502", "503", "504"]
                .iter()
                .any(|status| message.starts_with(status)),
        },
        _ => false,
    };
    if let DriverError::Network(source) = &err {
        // A handshake that failed is not an outage to ride out but a setting to fix: say so.
        if let Some(cause) = sheaf_tls::tls_cause(source.as_ref()) {
            return Error::unavailable(format!("{what}: TLS: {cause}"), err);
        }
    }
    if transient {
        Error::unavailable(what, err)
    } else {
        Error::backend(what, err)
    }
}

/// The request did not finish within the configured timeout.
pub(crate) fn timed_out(what: &str, after: Duration) -> Error {
    Error::unavailable(
        format!("{what}: no answer within {} ms", after.as_millis()),
        DriverError::TimedOut,
    )
}

/// The outcome of a coalesced write, as the caller of `insert_many` sees it.
pub(crate) fn from_write(err: sheaf_coalesce::WriteError<Error>) -> Error {
    match err {
        // The writer already produced a store error; every batch in the write shares it.
        sheaf_coalesce::WriteError::Backend(shared) => (*shared).clone(),
        sheaf_coalesce::WriteError::Closed => Error::Unavailable {
            message: "the clickhouse log store is closed".to_owned(),
            source: None,
        },
        other => Error::Unavailable {
            message: format!("insert: {other}"),
            source: None,
        },
    }
}

/// A row the server returned that is not a valid record (a bad id, bad JSON).
pub(crate) fn bad_row(what: &str, problem: impl std::fmt::Display) -> Error {
    Error::Backend {
        message: format!("{what}: the server returned a row that does not decode: {problem}"),
        source: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_store::ErrorKind;

    fn bad(message: &str) -> DriverError {
        DriverError::BadResponse(message.to_owned())
    }

    #[test]
    fn codes_are_read_from_the_message() {
        let err = bad("Code: 452. DB::Exception: Setting x shouldn't be greater than 1.");
        assert_eq!(server_code(&err), Some(452));
        assert_eq!(server_code(&bad("503 Service Unavailable")), None);
        assert_eq!(server_code(&DriverError::TimedOut), None);
    }

    #[test]
    fn a_rejected_setting_is_recognised_only_when_named() {
        let named = format!(
            "Code: 452. DB::Exception: Setting {LAZY_LIMIT_SETTING} shouldn't be greater than 1. (SETTING_CONSTRAINT_VIOLATION)"
        );
        let lazy = &[LAZY_LIMIT_SETTING];
        assert!(rejects_setting(&bad(&named), lazy));
        let unknown = format!(
            "Code: 115. DB::Exception: Setting {LAZY_LIMIT_SETTING} is neither a builtin setting nor started with the prefix 'custom_'"
        );
        assert!(rejects_setting(&bad(&unknown), lazy));
        let other = "Code: 164. DB::Exception: Cannot execute query in readonly mode. (READONLY)";
        assert!(!rejects_setting(&bad(other), lazy));
        let syntax = format!("Code: 62. DB::Exception: Syntax error near {LAZY_LIMIT_SETTING}");
        assert!(!rejects_setting(&bad(&syntax), lazy));
        let readonly = "Code: 164. DB::Exception: Cannot modify 'max_block_size' setting in readonly mode. (READONLY)";
        assert!(rejects_setting(
            &bad(readonly),
            &["read_in_order_use_buffering", "max_block_size"]
        ));
    }

    #[test]
    fn transient_failures_are_unavailable_and_the_rest_backend() {
        let kind = |err| from_driver("test", err).kind();
        assert_eq!(kind(DriverError::TimedOut), ErrorKind::Unavailable);
        assert_eq!(
            kind(bad("Code: 252. DB::Exception: Too many parts")),
            ErrorKind::Unavailable
        );
        assert_eq!(kind(bad("503 Service Unavailable")), ErrorKind::Unavailable);
        assert_eq!(
            kind(bad("Code: 62. DB::Exception: Syntax error")),
            ErrorKind::Backend
        );
        assert_eq!(kind(DriverError::NotEnoughData), ErrorKind::Backend);
        assert_eq!(
            timed_out("test", Duration::from_secs(1)).kind(),
            ErrorKind::Unavailable
        );
    }
}
