//! [`PostgresConfig`]: where the database is, which schema holds Sheaf's tables, and the pool's
//! bounds and timeouts.

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use sheaf_store::{Error, Result};
use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The schema Sheaf's tables live in unless configured otherwise.
pub const DEFAULT_SCHEMA: &str = "sheaf";

/// How to reach Postgres and how to use it.
///
/// Every field has a default except the URL; [`PostgresConfig::new`] fills them in.
#[derive(Clone, PartialEq, Eq)]
pub struct PostgresConfig {
    /// A libpq-style URL, `postgres://user:password@host:port/database?...`. Its `sslmode`
    /// (`disable`, `prefer` (the default), `require`, `verify-ca`, `verify-full`) and
    /// `sslrootcert` (a PEM file of CAs) choose TLS, with libpq's meanings.
    pub url: String,
    /// CA certificates (PEM) trusted besides the bundled public roots when the URL names no
    /// `sslrootcert` of its own: an operator's one CA file for every connection.
    pub ca_file: Option<PathBuf>,
    /// The schema that holds Sheaf's tables; [`crate::PostgresStores::migrate`] creates it.
    /// Lower-case letters, digits and `_`, starting with a letter or `_`, at most 63 bytes.
    /// Tests give each run its own.
    pub schema: String,
    /// Most connections the pool opens.
    pub max_connections: u32,
    /// Connections the pool keeps open when idle.
    pub min_connections: u32,
    /// How long an operation waits for a free connection before it fails as
    /// [`Error::Unavailable`].
    pub acquire_timeout: Duration,
    /// The server cancels any statement running longer (it fails as [`Error::Unavailable`]);
    /// `None` keeps the server's setting.
    pub statement_timeout: Option<Duration>,
}

impl PostgresConfig {
    /// The defaults for everything but the URL.
    ///
    /// - `schema`: [`DEFAULT_SCHEMA`].
    /// - `max_connections`: 10. A process runs one queue claimer and writes the log through a
    ///   coalescer, so few statements are in flight at once; on the 2-core machine the queue's
    ///   throughput peaked at 16 clients and fell at 32 (docs/benchmarks.md, "queue", earlier
    ///   measurements), and several processes share one server.
    /// - `min_connections`: 0.
    /// - `acquire_timeout`: 5 s. Callers treat [`Error::Unavailable`] as "retry with backoff";
    ///   waiting much longer for a connection only hides an exhausted pool.
    /// - `statement_timeout`: 30 s. Sheaf's longest statements by design are a 1,000-key
    ///   latest-attempt lookup (20–50 µs per key measured here, so 20–50 ms; docs/benchmarks.md,
    ///   "lookup") and a 1,000-item listing; the bound only stops a runaway statement (a lock
    ///   wait, a bad plan) from holding a pool connection forever.
    pub fn new(url: impl Into<String>) -> Self {
        PostgresConfig {
            url: url.into(),
            ca_file: None,
            schema: DEFAULT_SCHEMA.to_owned(),
            max_connections: 10,
            min_connections: 0,
            acquire_timeout: Duration::from_secs(5),
            statement_timeout: Some(Duration::from_secs(30)),
        }
    }

    /// The same configuration with another schema.
    pub fn with_schema(mut self, schema: impl Into<String>) -> Self {
        self.schema = schema.into();
        self
    }

    /// [`Error::InvalidInput`] naming the first field that cannot work.
    pub fn validate(&self) -> Result<()> {
        validate_schema(&self.schema)?;
        if self.max_connections == 0 {
            return Err(Error::invalid_input("max_connections must be at least 1"));
        }
        if self.min_connections > self.max_connections {
            return Err(Error::invalid_input(format!(
                "min_connections ({}) exceeds max_connections ({})",
                self.min_connections, self.max_connections
            )));
        }
        if self.acquire_timeout.is_zero() {
            return Err(Error::invalid_input("acquire_timeout must be positive"));
        }
        if self.statement_timeout.is_some_and(|t| t.as_millis() == 0) {
            return Err(Error::invalid_input(
                "statement_timeout must be at least 1 ms (or unset)",
            ));
        }
        self.tls()?;
        self.connect_options().map(|_| ())
    }

    /// How this configuration's connections use TLS: the URL's `sslmode`, and the CA file they
    /// trust (the URL's `sslrootcert`, else [`ca_file`](Self::ca_file)), each checked, so an
    /// unknown mode or a CA file that cannot be used is named here rather than at the first
    /// connection.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `sslmode` or the CA file.
    pub fn tls(&self) -> Result<PostgresTls> {
        let invalid = |e: &dyn fmt::Display| {
            Error::invalid_input(format!("postgres url {}: {e}", redact(&self.url)))
        };
        let mut tls = PostgresTls {
            mode: sheaf_tls::SslMode::default(),
            ca_file: None,
            ca_file_in_url: false,
        };
        if let Ok(parsed) = url::Url::parse(&self.url) {
            for (key, value) in parsed.query_pairs() {
                match &*key {
                    "sslmode" | "ssl-mode" => {
                        tls.mode = sheaf_tls::SslMode::parse(&value).map_err(|e| invalid(&e))?;
                    }
                    "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                        tls.ca_file = Some(PathBuf::from(&*value));
                        tls.ca_file_in_url = true;
                    }
                    _ => {}
                }
            }
        }
        if tls.ca_file.is_none() {
            tls.ca_file.clone_from(&self.ca_file);
        }
        if let Some(path) = &tls.ca_file {
            sheaf_tls::roots(Some(path)).map_err(|e| invalid(&e))?;
        }
        Ok(tls)
    }

    fn connect_options(&self) -> Result<PgConnectOptions> {
        let options = PgConnectOptions::from_str(&self.url).map_err(|e| {
            // The driver's message may quote the URL, password included: keep only the kind.
            let what = match e {
                sqlx::Error::Configuration(_) => "it does not parse",
                _ => "it is not usable",
            };
            Error::invalid_input(format!(
                "postgres url {} is invalid: {what}",
                redact(&self.url)
            ))
        })?;
        // The URL's own `sslrootcert` wins (sqlx read it already); either file is added to the
        // bundled roots, not put in their place.
        let tls = self.tls()?;
        let options = match &tls.ca_file {
            Some(file) if !tls.ca_file_in_url => options.ssl_root_cert(file),
            _ => options,
        };
        // Startup parameters cost no round trip, and apply to every connection the pool opens,
        // including those that replace a lost one. Tables are schema-qualified in every statement,
        // so no `search_path` is needed.
        Ok(match self.statement_timeout {
            Some(timeout) => options.options([("statement_timeout", timeout.as_millis())]),
            None => options,
        })
    }

    /// A pool that connects on first use: building it does no I/O, so a process can start while
    /// the database is still coming up, and each operation reports [`Error::Unavailable`] until
    /// it answers. Must be called inside a tokio runtime.
    pub(crate) fn pool(&self) -> Result<PgPool> {
        self.validate()?;
        let options = self.connect_options()?;
        Ok(PgPoolOptions::new()
            .max_connections(self.max_connections)
            .min_connections(self.min_connections)
            .acquire_timeout(self.acquire_timeout)
            // sqlx pings every connection when it returns to the pool and drops the broken
            // ones; its default second ping before each acquire put a round trip in front of
            // every statement: 177–245 µs per `SELECT 1` with it against 113–137 µs without,
            // three interleaved runs of 5,000 on this machine. Without it, a connection that
            // died while idle (a server restart) fails one statement as `Unavailable`, which
            // callers retry anyway, and is then discarded.
            .test_before_acquire(false)
            .connect_lazy_with(options))
    }
}

/// What [`PostgresConfig::tls`] found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PostgresTls {
    /// The URL's `sslmode`; `prefer` when it has none, as in libpq.
    pub mode: sheaf_tls::SslMode,
    /// The CA file connections trust besides the bundled roots.
    pub ca_file: Option<PathBuf>,
    /// Whether that file came from the URL's `sslrootcert` (else from `ca_file`).
    pub ca_file_in_url: bool,
}

impl fmt::Debug for PostgresConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PostgresConfig")
            .field("url", &redact(&self.url))
            .field("ca_file", &self.ca_file)
            .field("schema", &self.schema)
            .field("max_connections", &self.max_connections)
            .field("min_connections", &self.min_connections)
            .field("acquire_timeout", &self.acquire_timeout)
            .field("statement_timeout", &self.statement_timeout)
            .finish()
    }
}

/// Schema names are spliced into SQL (quoted), so only a plain identifier is accepted.
fn validate_schema(schema: &str) -> Result<()> {
    let mut bytes = schema.bytes();
    let first_ok = bytes
        .next()
        .is_some_and(|b| b.is_ascii_lowercase() || b == b'_');
    let rest_ok = bytes.all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    // 63 bytes is Postgres's identifier limit (NAMEDATALEN - 1); longer names are truncated.
    if !first_ok || !rest_ok || schema.len() > 63 || schema.starts_with("pg_") {
        return Err(Error::invalid_input(format!(
            "schema {schema:?} must be 1 to 63 lower-case letters, digits or '_', start with a \
             letter or '_', and not start with \"pg_\""
        )));
    }
    Ok(())
}

/// The URL with its password replaced, for messages and `Debug`.
pub(crate) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else {
        return "<unparsed url>".to_owned();
    };
    let (authority, tail) = match rest.find(['/', '?']) {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    // A password may also come as a query parameter.
    let tail = match tail.split_once('?') {
        Some((path, query)) => {
            let pairs: Vec<String> = query
                .split('&')
                .map(|pair| match pair.split_once('=') {
                    Some((key, _)) if key.eq_ignore_ascii_case("password") => format!("{key}=***"),
                    _ => pair.to_owned(),
                })
                .collect();
            format!("{path}?{}", pairs.join("&"))
        }
        None => tail.to_owned(),
    };
    match authority.rsplit_once('@') {
        Some((userinfo, host)) => {
            let user = userinfo.split_once(':').map_or(userinfo, |(user, _)| user);
            let hidden = if userinfo.contains(':') { ":***" } else { "" };
            format!("{scheme}://{user}{hidden}@{host}{tail}")
        }
        None => format!("{scheme}://{authority}{tail}"),
    }
}
