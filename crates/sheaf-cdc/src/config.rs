//! Configuration of the Postgres source.

use std::fmt;
use std::time::Duration;

use crate::reader::StreamOptions;
use crate::{Error, Result};

/// Where and as whom to connect. The role needs `LOGIN REPLICATION`, and to create a
/// publication it must own the tables (or be superuser for `ALL TABLES`). Connections
/// are plain TCP with SCRAM-SHA-256 (or cleartext) passwords; TLS is not built in.
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
}

impl fmt::Debug for ConnectionConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ConnectionConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &"***")
            .field("database", &self.database)
            .finish()
    }
}

impl ConnectionConfig {
    /// Parses `postgres://user:password@host:port/database` (`postgresql://` too;
    /// percent-encoded parts are decoded; query parameters are ignored; port 5432 and
    /// database = user by default).
    ///
    /// # Errors
    /// [`Error::Config`] naming what is wrong (never echoing the password).
    pub fn from_url(url: &str) -> Result<Self> {
        let bad = |what: &str| Error::Config(format!("connection URL: {what}"));
        let rest = url
            .strip_prefix("postgres://")
            .or_else(|| url.strip_prefix("postgresql://"))
            .ok_or_else(|| bad("must start with postgres:// or postgresql://"))?;
        let rest = rest.split(['?', '#']).next().unwrap_or_default();
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
        Ok(ConnectionConfig {
            host: host.to_owned(),
            port,
            user,
            password,
            database,
        })
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

    /// Checks the configuration.
    ///
    /// # Errors
    /// [`Error::Config`] naming the field.
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
