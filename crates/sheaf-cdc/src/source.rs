//! The Postgres source: `pgwire-replication` for the stream, a normal connection (sqlx)
//! for heartbeats. Both honour the connection's `sslmode`: the stream through the bridge
//! in `tls.rs` (Sheaf runs the TLS, the transport sees a local socket), the heartbeat
//! through sqlx's own TLS with the same mode and CA file.
//!
//! Start-up runs on one gated replication session: check (or create) the publication
//! and the slot, then `START_REPLICATION` at 0/0, which resumes from the slot's
//! `confirmed_flush_lsn`. What is checked is exactly what is then streamed from.
//!
//! The transport answers keepalives that request a reply, and sends standby status
//! updates every `status_interval` with the newest position Sheaf confirmed; it never
//! reports anything the consumer has not acknowledged.

use std::sync::Arc;
use std::time::Duration;

use pgwire_replication::{ReplicationClient, ReplicationConfig, ReplicationEvent};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::{CdcConfig, ConnectionSecurity, PublicationTables};
use crate::pgoutput::{Begin, Commit};
use crate::reader::{SourceTask, StreamReader, WalEvent, stream_pair};
use crate::{CdcStream, Error, Lsn, Result, tls};

/// Prefix of the heartbeat's logical decoding message.
pub const HEARTBEAT_PREFIX: &str = "sheaf.heartbeat";

/// Starts reading a slot. See the crate documentation for the whole flow.
#[derive(Debug, Clone, Copy)]
pub struct CdcSource;

impl CdcSource {
    /// Connects, checks or creates the publication and slot, starts streaming from the
    /// slot's confirmed position, and returns the consumer's end. The reader (and the
    /// heartbeat, if configured) run as tasks until [`CdcStream::shutdown`], an error
    /// (then returned by [`CdcStream::recv`]), or the stream being dropped.
    ///
    /// Whether the replication connection is encrypted is logged when it connects, and
    /// kept for the caller in [`CdcStream::replication_security`].
    ///
    /// # Errors
    /// [`Error::Config`], [`Error::Tls`] (the server refuses TLS the `sslmode` requires, or
    /// its certificate is not accepted), [`Error::SlotMissing`], [`Error::PublicationMissing`],
    /// [`Error::SlotUnusable`], [`Error::Transport`], [`Error::Timeout`].
    pub async fn start(config: CdcConfig) -> Result<CdcStream> {
        config.validate()?;
        let (reader, mut stream) = stream_pair(&config.stream)?;
        let (client, security) = tokio::time::timeout(config.connect_timeout, connect(&config))
            .await
            .map_err(|_| Error::Timeout("connecting and starting replication"))??;
        let cancel = CancellationToken::new();
        if let Some(interval) = config.heartbeat_interval {
            tokio::spawn(heartbeat(config.clone(), interval, cancel.child_token()));
        }
        let task = tokio::spawn(run(client, reader, cancel.clone(), config.shutdown_timeout));
        // The caller's stop waits for the reader's own graceful stop, plus slack.
        let stop_timeout = config.shutdown_timeout * 2 + Duration::from_secs(1);
        stream.attach(SourceTask {
            cancel,
            task,
            stop_timeout,
            security,
        });
        Ok(stream)
    }
}

fn transport(e: pgwire_replication::PgWireError) -> Error {
    Error::Transport(Arc::new(e))
}

/// Connects (through a new TLS bridge unless `sslmode=disable`), checks or creates the
/// publication and slot, and starts streaming.
async fn connect(config: &CdcConfig) -> Result<(ReplicationClient, ConnectionSecurity)> {
    let c = &config.connection;
    let link = tls::open(c).await?;
    // The transport's own TLS stays off: a bridge's host is a local socket directory, and
    // `disable` wants none.
    let replication = ReplicationConfig::new(
        link.host.clone(),
        c.user.clone(),
        c.password.clone(),
        c.database.clone(),
        config.slot.clone(),
        config.publication.as_str(),
    )
    .with_port(c.port)
    // 0/0: resume from the slot's confirmed_flush_lsn; nothing before the last
    // acknowledgement is sent again.
    .with_start_lsn(pgwire_replication::Lsn::ZERO)
    .with_status_interval(config.status_interval)
    .with_wakeup_interval(config.status_interval.max(Duration::from_secs(1)))
    .with_application_name(config.application_name.clone());
    let mut client = ReplicationClient::connect_gated(replication)
        .await
        .map_err(transport)?;
    setup(&mut client, config).await?;
    client.start().await.map_err(transport)?;
    client.wait_started().await.map_err(transport)?;
    let security = link.security.clone();
    link.established();
    Ok((client, security))
}

fn literal(s: &str) -> String {
    format!("'{}'", s.replace('\'', "''"))
}

fn identifier(s: &str) -> String {
    format!("\"{}\"", s.replace('"', "\"\""))
}

fn table_name(name: &str) -> String {
    match name.split_once('.') {
        Some((schema, table)) => format!("{}.{}", identifier(schema), identifier(table)),
        None => identifier(name),
    }
}

fn text(row: &[Option<bytes::Bytes>], i: usize) -> String {
    row.get(i)
        .and_then(|v| v.as_ref())
        .map(|b| String::from_utf8_lossy(b).into_owned())
        .unwrap_or_default()
}

/// Whether a server error says the object exists already (another process created it
/// between our check and our create).
fn already_exists(e: &pgwire_replication::PgWireError) -> bool {
    e.is_server() && e.to_string().contains("already exists")
}

async fn setup(client: &mut ReplicationClient, config: &CdcConfig) -> Result<()> {
    let rows = client
        .simple_query(&format!(
            "SELECT 1 FROM pg_catalog.pg_publication WHERE pubname = {}",
            literal(&config.publication)
        ))
        .await
        .map_err(transport)?;
    if rows.is_empty() {
        let Some(tables) = &config.create_missing else {
            return Err(Error::PublicationMissing {
                publication: config.publication.clone(),
            });
        };
        let target = match tables {
            PublicationTables::AllTables => "ALL TABLES".to_owned(),
            PublicationTables::Tables(tables) => {
                format!(
                    "TABLE {}",
                    tables
                        .iter()
                        .map(|t| table_name(t))
                        .collect::<Vec<_>>()
                        .join(", ")
                )
            }
        };
        let sql = format!(
            "CREATE PUBLICATION {} FOR {target}",
            identifier(&config.publication)
        );
        match client.simple_query(&sql).await {
            Ok(_) => tracing::info!(publication = %config.publication, "created publication"),
            Err(e) if already_exists(&e) => {}
            Err(e) => return Err(transport(e)),
        }
    }

    let rows = client
        .simple_query(&format!(
            "SELECT plugin, slot_type, database, current_database() FROM pg_catalog.pg_replication_slots \
             WHERE slot_name = {}",
            literal(&config.slot)
        ))
        .await
        .map_err(transport)?;
    match rows.first() {
        Some(row) => {
            let (plugin, kind, database, current) =
                (text(row, 0), text(row, 1), text(row, 2), text(row, 3));
            let unusable = |reason: String| Error::SlotUnusable {
                slot: config.slot.clone(),
                reason,
            };
            if kind != "logical" || plugin != "pgoutput" {
                return Err(unusable(format!(
                    "it is a {kind} slot with plugin {plugin:?}, not logical pgoutput"
                )));
            }
            if database != current {
                return Err(unusable(format!(
                    "it belongs to database {database:?}, not {current:?}"
                )));
            }
        }
        None => {
            if config.create_missing.is_none() {
                return Err(Error::SlotMissing {
                    slot: config.slot.clone(),
                });
            }
            // Slot names are validated to [a-z0-9_], which needs no quoting.
            let sql = format!(
                "CREATE_REPLICATION_SLOT {} LOGICAL pgoutput NOEXPORT_SNAPSHOT",
                config.slot
            );
            match client.simple_query(&sql).await {
                Ok(_) => tracing::info!(slot = %config.slot, "created replication slot"),
                Err(e) if already_exists(&e) => {}
                Err(e) => return Err(transport(e)),
            }
        }
    }
    Ok(())
}

fn lsn(l: pgwire_replication::Lsn) -> Lsn {
    Lsn(l.as_u64())
}

fn translate(event: ReplicationEvent) -> Option<WalEvent> {
    Some(match event {
        ReplicationEvent::KeepAlive { wal_end, .. } => WalEvent::KeepAlive {
            wal_end: lsn(wal_end),
        },
        ReplicationEvent::Begin {
            final_lsn,
            xid,
            commit_time_micros,
        } => WalEvent::Begin(Begin {
            final_lsn: lsn(final_lsn),
            commit_time: commit_time_micros,
            xid,
        }),
        ReplicationEvent::Commit {
            lsn: commit_lsn,
            end_lsn,
            commit_time_micros,
        } => WalEvent::Commit(Commit {
            flags: 0,
            commit_lsn: lsn(commit_lsn),
            end_lsn: lsn(end_lsn),
            commit_time: commit_time_micros,
        }),
        ReplicationEvent::XLogData {
            wal_start, data, ..
        } => WalEvent::Data {
            lsn: lsn(wal_start),
            data,
        },
        ReplicationEvent::Message {
            transactional,
            lsn: at,
            ..
        } => WalEvent::Message {
            transactional,
            lsn: lsn(at),
        },
        // Sheaf never sets a stop LSN.
        ReplicationEvent::StoppedAt { .. } => return None,
    })
}

fn report(client: &ReplicationClient, confirmed: &mut watch::Receiver<Lsn>) {
    let at = *confirmed.borrow_and_update();
    if !at.is_zero() {
        client.update_applied_lsn(pgwire_replication::Lsn::from_u64(at.0));
    }
}

/// The reader task: events from the transport into the [`StreamReader`], confirmed
/// positions back to the transport, until cancelled or failed.
async fn run(
    mut client: ReplicationClient,
    mut reader: StreamReader,
    cancel: CancellationToken,
    shutdown_timeout: Duration,
) -> Result<()> {
    let mut confirmed = reader.subscribe_confirmed();
    let result: Result<()> = loop {
        tokio::select! {
            biased;
            () = cancel.cancelled() => break Ok(()),
            Ok(()) = confirmed.changed() => report(&client, &mut confirmed),
            event = client.recv() => match event {
                Ok(Some(event)) => {
                    let Some(event) = translate(event) else { continue };
                    let handled = reader.handle(event);
                    tokio::pin!(handled);
                    // The reader may wait for room (acknowledgements) or for the consumer;
                    // keep reporting what gets confirmed meanwhile.
                    let outcome = loop {
                        tokio::select! {
                            biased;
                            // Stopping mid-hand-off drops the batch; it is re-read on restart.
                            () = cancel.cancelled() => break Ok(()),
                            outcome = &mut handled => break outcome,
                            Ok(()) = confirmed.changed() => report(&client, &mut confirmed),
                        }
                    };
                    if outcome.is_err() || cancel.is_cancelled() {
                        break outcome;
                    }
                }
                Ok(None) => break Err(Error::Closed),
                Err(e) => break Err(transport(e)),
            },
        }
    };

    // The heartbeat is a child of this token: it stops with the reader.
    cancel.cancel();
    // Tell the server the last confirmed position before closing, within the budget: an
    // acknowledgement that never reaches the server is replayed after the restart.
    report(&client, &mut confirmed);
    let target = reader.confirmed();
    let metrics = client.metrics();
    let deadline = tokio::time::Instant::now() + shutdown_timeout;
    while !target.is_zero()
        && metrics.last_applied_lsn().as_u64() < target.0
        && client.is_running()
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    client.stop();
    let _ = tokio::time::timeout(shutdown_timeout, client.shutdown()).await;
    if let Err(e) = &result {
        if !matches!(e, Error::Closed) {
            tracing::error!(error = %e, "replication reader stopped");
        }
        reader.fail(e.clone()).await;
    }
    result
}

/// The options of a normal (sqlx) connection to the source's server: the same role,
/// database, `sslmode` and trusted CA file as the replication stream. sqlx adds the CA file
/// to its bundled roots, as the stream's TLS does.
fn pg_connect_options(config: &CdcConfig) -> sqlx::postgres::PgConnectOptions {
    use sheaf_tls::SslMode;
    use sqlx::postgres::PgSslMode;
    let c = &config.connection;
    let ssl_mode = match c.ssl_mode {
        SslMode::Disable => PgSslMode::Disable,
        SslMode::Prefer => PgSslMode::Prefer,
        SslMode::Require => PgSslMode::Require,
        SslMode::VerifyCa => PgSslMode::VerifyCa,
        SslMode::VerifyFull => PgSslMode::VerifyFull,
    };
    let options = sqlx::postgres::PgConnectOptions::new()
        .host(&c.host)
        .port(c.port)
        .username(&c.user)
        .password(&c.password)
        .database(&c.database)
        .application_name(&config.application_name)
        .ssl_mode(ssl_mode);
    match c.trusted_ca_file() {
        Some(file) => options.ssl_root_cert(file),
        None => options,
    }
}

/// Emits a transactional logical decoding message every `interval` until cancelled.
/// Failures are logged and retried on the next tick; they never stop the stream.
async fn heartbeat(config: CdcConfig, interval: Duration, cancel: CancellationToken) {
    use sqlx::Connection as _;
    let options = pg_connect_options(&config);
    // Each network step gets at most one interval (and at least 5 s).
    let budget = interval.max(Duration::from_secs(5));
    let mut connection: Option<sqlx::PgConnection> = None;
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = ticker.tick() => {}
        }
        if connection.is_none() {
            match tokio::time::timeout(budget, sqlx::PgConnection::connect_with(&options)).await {
                Ok(Ok(conn)) => connection = Some(conn),
                Ok(Err(e)) => {
                    // A TLS failure in words, as the stream's own connection reports it.
                    let tls = sheaf_tls::tls_cause(&e);
                    tracing::warn!(
                        server = %config.connection.server(),
                        sslmode = %config.connection.ssl_mode,
                        tls,
                        error = %Error::Heartbeat(Arc::new(e)),
                        "heartbeat connection failed"
                    );
                    continue;
                }
                Err(_) => {
                    tracing::warn!("heartbeat connection timed out");
                    continue;
                }
            }
        }
        let Some(conn) = connection.as_mut() else {
            continue;
        };
        // Transactional, so it arrives as Begin/Message/Commit and the commit's end is
        // confirmed as a row-less checkpoint.
        let query = sqlx::query("SELECT pg_logical_emit_message(true, $1, ''::text)")
            .bind(HEARTBEAT_PREFIX);
        match tokio::time::timeout(budget, query.execute(&mut *conn)).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                tracing::warn!(error = %Error::Heartbeat(Arc::new(e)), "heartbeat failed");
                connection = None;
            }
            Err(_) => {
                tracing::warn!("heartbeat timed out");
                connection = None;
            }
        }
    }
    if let Some(conn) = connection {
        let _ = tokio::time::timeout(Duration::from_secs(1), conn.close()).await;
    }
}
