//! The one place where driver errors become store errors.
//!
//! The kind is chosen by what happened, not by where (sheaf_store's `Error`): anything that says
//! "the server could not be reached, went away, or did not answer in time" is
//! [`Error::Unavailable`], which callers retry with backoff; what the server rejected because of
//! the data is [`Error::InvalidInput`], [`Error::Conflict`] or [`Error::NotFound`]; the rest is
//! [`Error::Backend`].

use sheaf_store::Error;

/// Converts a driver error met while `doing` something (lower case, e.g. "claiming jobs").
pub(crate) fn from_sqlx(doing: &str, error: sqlx::Error) -> Error {
    let kind = classify(&error);
    // A handshake that failed is a setting to fix, not an outage: say what went wrong. sqlx
    // reports a refused certificate as an I/O error and a server without TLS as a TLS error.
    let message = match (sheaf_tls::tls_cause(&error), &error) {
        (Some(cause), _) => format!("{doing}: TLS: {cause}"),
        (None, sqlx::Error::Tls(source)) => format!("{doing}: TLS: {source}"),
        _ => doing.to_owned(),
    };
    match kind {
        Kind::Unavailable => Error::unavailable(message, error),
        Kind::Backend => Error::backend(message, error),
        Kind::Conflict => Error::conflict(format!("{doing}: {error}")),
        Kind::NotFound => Error::not_found(format!("{doing}: {error}")),
        Kind::InvalidInput => Error::invalid_input(format!("{doing}: {error}")),
    }
}

/// A decoding failure: the row did not have the shape this crate wrote.
pub(crate) fn decode(doing: &str, detail: impl std::fmt::Display) -> Error {
    Error::Backend {
        message: format!("{doing}: {detail}"),
        source: None,
    }
}

enum Kind {
    Unavailable,
    Backend,
    Conflict,
    NotFound,
    InvalidInput,
}

fn classify(error: &sqlx::Error) -> Kind {
    match error {
        // The connection or the pool failed: nothing says the statement was wrong.
        sqlx::Error::Io(_)
        | sqlx::Error::Tls(_)
        | sqlx::Error::Protocol(_)
        | sqlx::Error::PoolTimedOut
        | sqlx::Error::PoolClosed
        | sqlx::Error::WorkerCrashed
        | sqlx::Error::BeginFailed => Kind::Unavailable,
        sqlx::Error::Database(db) => classify_sqlstate(db.code().as_deref().unwrap_or("")),
        sqlx::Error::Encode(_) | sqlx::Error::InvalidArgument(_) => Kind::InvalidInput,
        _ => Kind::Backend,
    }
}

/// By SQLSTATE (Postgres manual, appendix A).
fn classify_sqlstate(code: &str) -> Kind {
    match code {
        // Unique violation: the identity is taken.
        "23505" => Kind::Conflict,
        // Foreign key violation: the row it refers to (a tenant) does not exist.
        "23503" => Kind::NotFound,
        // Query canceled (statement_timeout), lock not available, serialization failure and
        // deadlock: the statement did not finish in time or lost a race; a retry can succeed.
        "57014" | "55P03" | "40001" | "40P01" => Kind::Unavailable,
        // A read-only transaction: we are talking to a standby (a failover in progress).
        "25006" => Kind::Unavailable,
        // Other integrity violations (not null, check) and data exceptions (values out of range,
        // characters the encoding cannot hold): the input cannot be stored.
        _ if code.starts_with("23") || code.starts_with("22") => Kind::InvalidInput,
        // Connection exceptions (08), operator intervention (57: admin or crash shutdown,
        // cannot connect now), insufficient resources (53: too many connections, out of memory
        // or disk) and system errors (58: I/O).
        _ if ["08", "57", "53", "58"]
            .iter()
            .any(|class| code.starts_with(class)) =>
        {
            Kind::Unavailable
        }
        _ => Kind::Backend,
    }
}
