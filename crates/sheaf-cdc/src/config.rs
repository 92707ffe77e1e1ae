//! Configuration of the Postgres source.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::reader::StreamOptions;
use crate::{Error, Result};

/// Where and as whom to connect, and how the connections use TLS. The role needs `LOGIN
/// REPLICATION`, and to create a publication it must own the tables (or be superuser for
/// `ALL TABLES`). Passwords go as SCRAM-SHA-256 (or cleartext, if the server asks for it).
///
/// TLS follows the URL's `sslmode` with libpq's meanings (`prefer` when absent): the
/// replication stream and the heartbeat connection both honour it, trusting the bundled
/// public roots plus [`trusted_ca_file`](Self::trusted_ca_file).
#[derive(Clone, PartialEq, Eq)]
pub struct ConnectionConfig {
    /// Host name or address.
    pub host: String,
    /// Port.
    pub port: u16,
    /// Role name.
    pub user: String,
    /// Password.
    pub password: String,
    /// Database whose changes are read.
    pub database: String,
    /// The URL's `sslmode`; [`SslMode::Prefer`](sheaf_tls::SslMode::Prefer) when it has none,
    /// as in libpq.
    #[cfg(feature = "postgres")]
    pub ssl_mode: sheaf_tls::SslMode,
    /// The URL's `sslrootcert`: a PEM file of CA certificates trusted besides the bundled
    /// public roots. Wins over [`ca_file`](Self::ca_file).
    pub ssl_root_cert: Option<PathBuf>,
    /// An operator's CA file (PEM), trusted besides the bundled public roots when the URL
    /// names no `sslrootcert`: the one CA file a service sets for all its connections.
    /// `from_url` leaves it `None`.
    pub ca_file: Option<PathBuf>,
}

impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut s = f.debug_struct("ConnectionConfig");
        s.field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &"***")
            .field("database", &self.database);
        #[cfg(feature = "postgres")]
        s.field("ssl_mode", &self.ssl_mode);
        s.field("ssl_root_cert", &self.ssl_root_cert)
            .field("ca_file", &self.ca_file)
            .finish()
    }
}

impl ConnectionConfig {
    /// Parses `postgres://user:password@host:port/database?sslmode=…&sslrootcert=…`
    /// (`postgresql://` too; percent-encoded parts are decoded; port 5432 and database =
    /// user by default). Of the query parameters, `sslmode` (also spelt `ssl-mode`) and
    /// `sslrootcert` (also `ssl-root-cert`, `ssl-ca`) are read, the spellings sqlx accepts,
    /// so one URL means the same here and in Sheaf's other Postgres connections; the rest
    /// are ignored.
    ///
    /// # Errors
    /// [`Error::Config`] naming what is wrong (never echoing the password), a bad `sslmode`
    /// with the accepted values.
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |what: &str| Error::Config(format!("connection URL: {what}"));
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| bad("must start with postgres:// or postgresql://"))?;
        let rest = rest.split('#').next().unwrap_or_default();
        let (rest, query) = rest.split_once('?').unwrap_or((rest, ""));
        let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
        let (userinfo, hostport) = authority
            .rsplit_once('@')
            .ok_or_else(|| bad("no user (user@host)"))?;
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        let (host, port) = if let Some(v6) = hostport.strip_prefix('[') {
            let (host, after) = v6
                .split_once(']')
                .ok_or_else(|| bad("unclosed [ in host"))?;
            (host, after.strip_prefix(':'))
        } else {
            match hostport.split_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (hostport, None),
            }
        };
        let port = match port {
            Some(p) => p.parse::<u16>().map_err(|_| bad("port is not a number"))?,
            None => 5432,
        };
        if host.is_empty() {
            return Err(bad("no host"));
        }
        let user = percent_decode(user).ok_or_else(|| bad("bad percent-encoding in user"))?;
        if user.is_empty() {
            return Err(bad("no user"));
        }
        let password =
            percent_decode(password).ok_or_else(|| bad("bad percent-encoding in password"))?;
        let database =
            percent_decode(path).ok_or_else(|| bad("bad percent-encoding in database"))?;
        let database = if database.is_empty() {
            user.clone()
        } else {
            database
        };
        let mut ssl_mode = None;
        let mut ssl_root_cert = None;
        for pair in query.split('&').filter(|p| !p.is_empty()) {
            let (key, value) = pair.split_once('=').unwrap_or((pair, ""));
            match key {
                "sslmode" | "ssl-mode" => {
                    ssl_mode = Some(
                        percent_decode(value)
                            .ok_or_else(|| bad("bad percent-encoding in sslmode"))?,
                    );
                }
                "sslrootcert" | "ssl-root-cert" | "ssl-ca" => {
                    let value = percent_decode(value)
                        .ok_or_else(|| bad("bad percent-encoding in sslrootcert"))?;
                    if value.is_empty() {
                        return Err(bad("sslrootcert is empty"));
                    }
                    ssl_root_cert = Some(PathBuf::from(value));
                }
                _ => {}
            }
        }
        #[cfg(feature = "postgres")]
        let ssl_mode = match ssl_mode {
            Some(value) => sheaf_tls::SslMode::parse(&value).map_err(|e| bad(&e))?,
            None => sheaf_tls::SslMode::default(),
        };
        #[cfg(not(feature = "postgres"))]
        let _ = ssl_mode;
        Ok(ConnectionConfig {
            host: host.to_owned(),
            port,
            user,
            password,
            database,
            #[cfg(feature = "postgres")]
            ssl_mode,
            ssl_root_cert,
            ca_file: None,
        })
    }

    /// The CA file the connections trust besides the bundled roots: the URL's
    /// `sslrootcert`, else [`ca_file`](Self::ca_file).
    pub fn trusted_ca_file(&self) -> Option<&Path> {
        self.ssl_root_cert.as_deref().or(self.ca_file.as_deref())
    }

    /// `host:port`, as errors and logs name the server (an IPv6 address in brackets).
    pub fn server(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// Checks that the trusted CA file can be used, so a bad one stops start-up with its
    /// name rather than failing the first connection.
    #[cfg(feature = "postgres")]
    fn validate_tls(&self) -> Result<()> {
        let Some(path) = self.trusted_ca_file() else {
            return Ok(());
        };
        let setting = if self.ssl_root_cert.is_some() {
            "`sslrootcert` of the connection URL"
        } else {
            "`ca_file`"
        };
        sheaf_tls::roots(Some(path))
            .map(|_| ())
            .map_err(|e| Error::Config(format!("{setting}: {e}")))
    }
}

fn percent_decode(s: &str) -> Option<String> {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while let Some(&b) = bytes.get(i) {
        if b == b'%' {
            let hex = bytes.get(i + 1..i + 3)?;
            let hex = std::str::from_utf8(hex).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// Whether a connection the source opened is encrypted, as decided when it connected: for
/// start-up logs that say which connections are protected.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectionSecurity {
    /// `host:port` of the server.
    pub server: String,
    /// The `sslmode` it was opened with, as libpq spells it.
    pub ssl_mode: &'static str,
    /// The TLS session, or `None` when the connection is plaintext (`sslmode=disable`, or
    /// `prefer` and the server refused TLS).
    pub tls: Option<TlsSession>,
}

/// The negotiated parameters of a TLS session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSession {
    /// The protocol version, e.g. `TLSv1_3`.
    pub protocol: String,
    /// The cipher suite, e.g. `TLS13_AES_256_GCM_SHA384`.
    pub cipher_suite: String,
}

impl ConnectionSecurity {
    /// Whether the connection is encrypted.
    pub fn is_encrypted(&self) -> bool {
        self.tls.is_some()
    }
}

/// A short description: `encrypted (TLSv1_3, TLS13_AES_256_GCM_SHA384, sslmode=verify-full)`
/// or `NOT encrypted (sslmode=prefer, the server refused TLS)`.
impl fmt::Display for ConnectionSecurity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.tls {
            Some(tls) => write!(
                f,
                "encrypted ({}, {}, sslmode={})",
                tls.protocol, tls.cipher_suite, self.ssl_mode
            ),
            None if self.ssl_mode == "disable" => f.write_str("NOT encrypted (sslmode=disable)"),
            None => write!(
                f,
                "NOT encrypted (sslmode={}, the server refused TLS)",
                self.ssl_mode
            ),
        }
    }
}

/// Which tables a publication created by Sheaf covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PublicationTables {
    /// `FOR ALL TABLES` (needs a superuser).
    AllTables,
    /// `FOR TABLE …`, each `schema.table` or `table` (then `public`'s, per `search_path`).
    Tables(Vec<String>),
}

/// Everything the Postgres source needs.
#[derive(Debug, Clone)]
pub struct CdcConfig {
    /// Server and role.
    pub connection: ConnectionConfig,
    /// The logical replication slot (plugin `pgoutput`): lower-case letters, digits and
    /// `_`, at most 63 characters. Its `confirmed_flush_lsn` is where a restart resumes.
    pub slot: String,
    /// The publication whose tables are read.
    pub publication: String,
    /// `None` (default): the slot and the publication must exist, and a missing one is
    /// an error naming it. `Some(tables)`: create what is missing, the publication for
    /// these tables.
    pub create_missing: Option<PublicationTables>,
    /// Batching, output shape, filter and in-flight limit.
    pub stream: StreamOptions,
    /// When set, `pg_logical_emit_message` is called on this interval over a normal
    /// connection, so the stream carries a transaction even when the published tables
    /// are idle and the slot keeps advancing (an idle slot retains WAL). Default `None`.
    pub heartbeat_interval: Option<Duration>,
    /// How soon an acknowledged position is reported to the server. Default 1 s: a
    /// standby status update is a few bytes, and a shorter wait means less is replayed
    /// after a crash (pg_recvlogical uses 10 s).
    pub status_interval: Duration,
    /// Budget for connecting, checking or creating the slot and publication, and
    /// starting the stream. Default 30 s.
    pub connect_timeout: Duration,
    /// Budget for a graceful stop, including reporting the last confirmed position.
    /// Default 5 s.
    pub shutdown_timeout: Duration,
    /// `application_name` of both connections (shown in `pg_stat_replication`).
    /// Default `sheaf-cdc`.
    pub application_name: String,
}

impl CdcConfig {
    /// A configuration with the defaults above, requiring an existing slot and publication.
    pub fn new(
        connection: ConnectionConfig,
        slot: impl Into<String>,
        publication: impl Into<String>,
    ) -> Self {
        CdcConfig {
            connection,
            slot: slot.into(),
            publication: publication.into(),
            create_missing: None,
            stream: StreamOptions::default(),
            heartbeat_interval: None,
            status_interval: Duration::from_secs(1),
            connect_timeout: Duration::from_secs(30),
            shutdown_timeout: Duration::from_secs(5),
            application_name: "sheaf-cdc".into(),
        }
    }

    /// Checks the configuration, including that the connection's trusted CA file (see
    /// [`ConnectionConfig::trusted_ca_file`]) exists and holds a usable CA certificate.
    ///
    /// # Errors
    /// [`Error::Config`] naming the field (or the CA file).
    pub fn validate(&self) -> Result<()> {
        self.stream.validate()?;
        let slot_ok = !self.slot.is_empty()
            && self.slot.len() <= 63
            && self
                .slot
                .bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
        if !slot_ok {
            return Err(Error::Config(format!(
                "`slot` {:?}: use 1 to 63 lower-case letters, digits and underscores",
                self.slot
            )));
        }
        if self.publication.is_empty() || self.publication.contains('\0') {
            return Err(Error::Config(
                "`publication` must be a non-empty name".into(),
            ));
        }
        if let Some(PublicationTables::Tables(tables)) = &self.create_missing
            && tables.is_empty()
        {
            return Err(Error::Config("`create_missing` lists no table".into()));
        }
        if self.heartbeat_interval.is_some_and(|d| d.is_zero()) {
            return Err(Error::Config(
                "`heartbeat_interval` must be longer than zero".into(),
            ));
        }
        if self.status_interval.is_zero() {
            return Err(Error::Config(
                "`status_interval` must be longer than zero".into(),
            ));
        }
        #[cfg(feature = "postgres")]
        self.connection.validate_tls()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reader::BatchingPolicy;

    #[test]
    fn url_parsing() {
        let c = ConnectionConfig::from_url(
            "postgres://sheaf:p%40ss@127.0.0.1:5433/sheaf_test?sslmode=disable",
        )
        .unwrap();
        assert_eq!(
            (
                c.host.as_str(),
                c.port,
                c.user.as_str(),
                c.password.as_str(),
                c.database.as_str()
            ),
            ("127.0.0.1", 5433, "sheaf", "p@ss", "sheaf_test")
        );
        let c = ConnectionConfig::from_url("postgresql://u@[::1]/").unwrap();
        assert_eq!(
            (c.host.as_str(), c.port, c.database.as_str()),
            ("::1", 5432, "u")
        );
        assert!(ConnectionConfig::from_url("mysql://u@h/d").is_err());
        assert!(ConnectionConfig::from_url("postgres://h/d").is_err());
        assert!(ConnectionConfig::from_url("postgres://u@h:x/d").is_err());
        assert!(!format!("{c:?}").contains("p@ss"));
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn url_tls_parameters_are_read_and_a_bad_sslmode_is_named() {
        let c = ConnectionConfig::from_url(
            "postgres://u:p@db.example:5433/d?application_name=x&sslmode=verify-full&sslrootcert=%2Fetc%2Fca%20bundle.pem",
        )
        .unwrap();
        assert_eq!(c.ssl_mode, sheaf_tls::SslMode::VerifyFull);
        assert_eq!(
            c.ssl_root_cert.as_deref(),
            Some(Path::new("/etc/ca bundle.pem"))
        );
        assert_eq!(c.trusted_ca_file(), Some(Path::new("/etc/ca bundle.pem")));
        assert_eq!(c.server(), "db.example:5433");

        // libpq's default, and the operator's CA file when the URL names none.
        let mut c = ConnectionConfig::from_url("postgres://u@[::1]/d").unwrap();
        assert_eq!(c.ssl_mode, sheaf_tls::SslMode::Prefer);
        assert_eq!(c.trusted_ca_file(), None);
        assert_eq!(c.server(), "[::1]:5432");
        c.ca_file = Some("/srv/ca.pem".into());
        assert_eq!(c.trusted_ca_file(), Some(Path::new("/srv/ca.pem")));
        c.ssl_root_cert = Some("/url/ca.pem".into());
        assert_eq!(c.trusted_ca_file(), Some(Path::new("/url/ca.pem")));

        let c = ConnectionConfig::from_url("postgres://u@h/d?ssl-mode=disable").unwrap();
        assert_eq!(c.ssl_mode, sheaf_tls::SslMode::Disable);

        let err =
            ConnectionConfig::from_url("postgres://u:secret@h/d?sslmode=verify_full").unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Config(_)));
        assert!(
            text.contains("sslmode") && text.contains("verify_full"),
            "{text}"
        );
        assert!(
            text.contains("disable, allow, prefer, require, verify-ca, verify-full"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }

    #[test]
    #[cfg(feature = "postgres")]
    fn validate_names_a_ca_file_that_cannot_be_used() {
        let mut connection = ConnectionConfig::from_url(
            "postgres://u@h/d?sslmode=verify-full&sslrootcert=/nonexistent/url-ca.pem",
        )
        .unwrap();
        let err = CdcConfig::new(connection.clone(), "s", "p")
            .validate()
            .unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Config(_)));
        assert!(
            text.contains("`sslrootcert`") && text.contains("/nonexistent/url-ca.pem"),
            "{text}"
        );

        connection.ssl_root_cert = None;
        connection.ca_file = Some("/nonexistent/operator-ca.pem".into());
        let text = CdcConfig::new(connection, "s", "p")
            .validate()
            .unwrap_err()
            .to_string();
        assert!(
            text.contains("`ca_file`") && text.contains("/nonexistent/operator-ca.pem"),
            "{text}"
        );
    }

    #[test]
    fn security_describes_itself_in_a_few_words() {
        let encrypted = ConnectionSecurity {
            server: "h:5432".into(),
            ssl_mode: "verify-full",
            tls: Some(TlsSession {
                protocol: "TLSv1_3".into(),
                cipher_suite: "TLS13_AES_256_GCM_SHA384".into(),
            }),
        };
        assert!(encrypted.is_encrypted());
        assert_eq!(
            encrypted.to_string(),
            "encrypted (TLSv1_3, TLS13_AES_256_GCM_SHA384, sslmode=verify-full)"
        );
        let refused = ConnectionSecurity {
            server: "h:5432".into(),
            ssl_mode: "prefer",
            tls: None,
        };
        assert_eq!(
            refused.to_string(),
            "NOT encrypted (sslmode=prefer, the server refused TLS)"
        );
    }

    #[test]
    fn batch_transactions_with_a_batching_policy_names_both_fields() {
        let url = ConnectionConfig::from_url("postgres://u:p@h/d").unwrap();
        let mut config = CdcConfig::new(url, "slot_a", "pub_a");
        config.validate().unwrap();
        config.stream.batch_transactions = true;
        config.stream.batching = Some(BatchingPolicy {
            count: 10,
            max_wait: Duration::from_millis(5),
        });
        let err = config.validate().unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, Error::Config(_)));
        assert!(
            text.contains("`batch_transactions`") && text.contains("`batching`"),
            "{text}"
        );
    }

    #[test]
    fn bad_slot_names_are_rejected() {
        let url = ConnectionConfig::from_url("postgres://u:p@h/d").unwrap();
        for slot in ["", "Upper", "with-dash", &"x".repeat(64)] {
            let err = CdcConfig::new(url.clone(), slot, "p")
                .validate()
                .unwrap_err();
            assert!(err.to_string().contains("`slot`"), "{err}");
        }
    }
}
