//! Where the service's `tracing` output goes: log lines to standard error (`SHEAF_LOG`,
//! `SHEAF_LOG_FORMAT`), and, with `SHEAF_OTLP_ENDPOINT`, the spans of this crate and the
//! toolkit's to an OTLP/HTTP collector through `tracing-opentelemetry`.
//!
//! The two have filters of their own: `SHEAF_LOG=warn` quiets the log without losing a trace,
//! and the exporter takes the spans of Sheaf's own crates only (not those of sqlx or hyper):
//! the service's at info, the toolkit's batch spans (`coalesced_lookup`, `coalesced_write`,
//! debug spans, so that they add nothing to the log's lines) at debug.
//! Spans are batched and sent in the background by the SDK's batch processor, over the same
//! reqwest client stack the webhooks use, on the service's runtime, trusting `SHEAF_TLS_CA_FILE`
//! besides the system's roots as every other client of the service does (a collector behind a
//! private CA is the usual case inside a cluster).

use std::io::IsTerminal as _;
use std::time::Duration;

use anyhow::Context as _;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::{WithExportConfig as _, WithHttpConfig as _};
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use tracing_subscriber::filter::{LevelFilter, Targets};
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;
use tracing_subscriber::{EnvFilter, Layer as _};

use crate::settings::{Config, LogFormat};

/// How long one export to the collector may take.
const EXPORT_TIMEOUT: Duration = Duration::from_secs(10);

/// Flushes what is left of the traces when the service stops.
#[derive(Debug)]
pub struct Telemetry {
    provider: Option<SdkTracerProvider>,
}

impl Telemetry {
    /// Sends the spans still queued (at most `EXPORT_TIMEOUT`) and stops the exporter.
    pub fn shutdown(self) {
        if let Some(provider) = self.provider
            && let Err(err) = provider.shutdown_with_timeout(EXPORT_TIMEOUT)
        {
            tracing::warn!(error = %err, "could not send the last traces");
        }
    }
}

/// Installs the global subscriber. `runtime` runs the exporter's requests; call it once.
pub fn init(config: &Config, runtime: tokio::runtime::Handle) -> anyhow::Result<Telemetry> {
    let filter = EnvFilter::try_new(&config.log_filter)
        .map_err(|e| anyhow::anyhow!("invalid SHEAF_LOG: {e}"))?;
    let logs = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let logs = match config.log_format {
        LogFormat::Text => logs
            .with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed(),
        // The event's fields at the top level beside the message; `span` holds the innermost
        // span's fields (an API request's method, path, request id and trace id).
        LogFormat::Json => logs
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .with_filter(filter)
            .boxed(),
    };
    let Some(endpoint) = &config.otlp_endpoint else {
        tracing_subscriber::registry().with(logs).init();
        return Ok(Telemetry { provider: None });
    };
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OtlpClient {
            http: otlp_http_client(config.engine.tls_ca_file.as_deref())?,
            runtime,
        })
        .with_endpoint(format!("{endpoint}/v1/traces"))
        .with_timeout(EXPORT_TIMEOUT)
        .build()
        .context("invalid SHEAF_OTLP_ENDPOINT")?;
    // New traces by trace id; a caller's sampling decision, and a publish's for its
    // deliveries, are followed.
    let sampler = Sampler::ParentBased(Box::new(Sampler::TraceIdRatioBased(
        f64::from(config.otlp_sample_percent) / 100.0,
    )));
    let provider = SdkTracerProvider::builder()
        .with_sampler(sampler)
        .with_batch_exporter(exporter)
        .with_resource(
            Resource::builder()
                .with_service_name("sheaf")
                .with_attribute(opentelemetry::KeyValue::new(
                    "service.version",
                    env!("CARGO_PKG_VERSION"),
                ))
                .build(),
        )
        .build();
    // Each span carries the fields Sheaf gives it and nothing per poll: busy and idle time
    // (taken at every enter and exit of an instrumented future), the thread, and the code
    // location would add clock reads and string attributes to every span for little an
    // operator reads.
    let spans = tracing_opentelemetry::layer()
        .with_tracer(provider.tracer("sheaf"))
        .with_tracked_inactivity(false)
        .with_threads(false)
        .with_location(false)
        .with_target(false)
        .with_filter(
            Targets::new()
                .with_target("sheaf_server", LevelFilter::INFO)
                .with_target("sheaf_engine", LevelFilter::INFO)
                .with_target("sheaf_coalesce", LevelFilter::DEBUG)
                .with_target("sheaf_cdc", LevelFilter::INFO),
        );
    tracing_subscriber::registry().with(logs).with(spans).init();
    Ok(Telemetry {
        provider: Some(provider),
    })
}

/// The exporter's reqwest client: bounded by [`EXPORT_TIMEOUT`], trusting the certificates of
/// `ca_file` (`SHEAF_TLS_CA_FILE`) besides the built-in roots, as the webhook client does.
fn otlp_http_client(ca_file: Option<&std::path::Path>) -> anyhow::Result<reqwest::Client> {
    let mut builder = reqwest::Client::builder().timeout(EXPORT_TIMEOUT);
    if let Some(path) = ca_file {
        let certificates = sheaf_tls::load_certificates(path)
            .context("SHEAF_TLS_CA_FILE for the OTLP exporter")?;
        for certificate in certificates {
            builder = builder.add_root_certificate(
                reqwest::Certificate::from_der(&certificate).with_context(|| {
                    format!(
                        "SHEAF_TLS_CA_FILE {}: a certificate reqwest cannot use",
                        path.display()
                    )
                })?,
            );
        }
    }
    builder.build().context("cannot build the OTLP client")
}

/// The exporter's HTTP client: reqwest (rustls), each request run on the service's runtime so
/// the SDK's background thread can wait for it without a runtime of its own.
#[derive(Debug)]
struct OtlpClient {
    http: reqwest::Client,
    runtime: tokio::runtime::Handle,
}

#[async_trait::async_trait]
impl opentelemetry_http::HttpClient for OtlpClient {
    async fn send_bytes(
        &self,
        request: axum::http::Request<axum::body::Bytes>,
    ) -> Result<axum::http::Response<axum::body::Bytes>, opentelemetry_http::HttpError> {
        let request = reqwest::Request::try_from(request)?;
        let http = self.http.clone();
        let answer = self
            .runtime
            .spawn(async move {
                let response = http.execute(request).await?;
                let status = response.status();
                let headers = response.headers().clone();
                let body = response.bytes().await?;
                Ok::<_, reqwest::Error>((status, headers, body))
            })
            .await??;
        let (status, headers, body) = answer;
        let mut response = axum::http::Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = headers;
        Ok(response)
    }
}
