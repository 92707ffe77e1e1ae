//! A `sheaf serve` process for the service scenarios (the shared child process of
//! `sheaf_testenv::process`): started from the binary `cargo xtask bench` built, configured
//! through its environment like any deployment, driven over its HTTP API on loopback, measured
//! through `/proc/<pid>/status` and `/metrics`, and stopped with SIGTERM (a graceful stop) by its
//! PID, SIGKILL only if it does not stop in time.

use std::path::Path;
use std::time::Duration;

use anyhow::bail;
use sheaf_testenv::process::{SheafCommand, SheafProcess, metric_sample};

/// A running `sheaf serve` and the client the scenario drives it with.
#[derive(Debug)]
pub struct Sheaf {
    process: SheafProcess,
    http: reqwest::Client,
}

impl Sheaf {
    /// Starts `bin serve` with `env` (and no other `SHEAF_*` variable), its output in `log`, and
    /// waits (at most 60 s) until it listens. Loopback receivers are allowed and the service
    /// logs warnings only, but for its own start-up line, which is how it is seen to listen.
    pub async fn start(bin: &Path, env: &[(&str, String)], log: &Path) -> anyhow::Result<Self> {
        let process = SheafCommand::new(bin)
            .env("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true")
            .env("SHEAF_LOG", "warn,sheaf=info")
            .envs(env.iter().map(|(name, value)| (*name, value.as_str())))
            .log_file(log)
            .start_timeout(Duration::from_secs(60))
            .start()
            .await?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build()?;
        Ok(Sheaf { process, http })
    }

    /// The URL of `path` on its HTTP API.
    pub fn url(&self, path: &str) -> String {
        self.process.url(path)
    }

    /// Creates (or keeps) the tenant.
    pub async fn add_tenant(&self, tenant: &str) -> anyhow::Result<()> {
        let put = self
            .http
            .put(self.url(&format!("/api/v1/tenants/{tenant}")))
            .header("content-type", "application/json")
            .body("{}")
            .send()
            .await?;
        if !put.status().is_success() {
            bail!(
                "create tenant: {} {}",
                put.status(),
                put.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }

    /// Creates the tenant and one webhook destination for every topic pointing at `url`.
    pub async fn add_destination(&self, tenant: &str, url: &str) -> anyhow::Result<()> {
        self.add_tenant(tenant).await?;
        self.add_typed_destination(tenant, "webhook", serde_json::json!({ "url": url }))
            .await
    }

    /// Creates one destination of type `kind` (`webhook`, `rabbitmq`, `nats`, …) for every topic
    /// of an existing tenant, with `config` as its type's configuration.
    pub async fn add_typed_destination(
        &self,
        tenant: &str,
        kind: &str,
        config: serde_json::Value,
    ) -> anyhow::Result<()> {
        let body = serde_json::json!({
            "type": kind,
            "topics": ["*"],
            "config": config,
        });
        let post = self
            .http
            .post(self.url(&format!("/api/v1/tenants/{tenant}/destinations")))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await?;
        if !post.status().is_success() {
            bail!(
                "create {kind} destination: {} {}",
                post.status(),
                post.text().await.unwrap_or_default()
            );
        }
        Ok(())
    }

    /// A client for publishing (cheap to clone).
    pub fn publisher(&self, tenant: &str) -> Publisher {
        Publisher {
            http: self.http.clone(),
            url: self.url("/api/v1/publish"),
            tenant: tenant.to_owned(),
        }
    }

    /// The `/metrics` page.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        Ok(self
            .http
            .get(self.url("/metrics"))
            .send()
            .await?
            .text()
            .await?)
    }

    /// Peak resident set in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        self.process.peak_rss_kib()
    }

    /// Current resident set in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        self.process.rss_kib()
    }

    /// SIGTERM, then up to 30 s for a graceful stop, then SIGKILL and an error.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.process.stop(Duration::from_secs(30)).await?;
        Ok(())
    }
}

/// Publishes events for one tenant.
#[derive(Debug, Clone)]
pub struct Publisher {
    http: reqwest::Client,
    url: String,
    tenant: String,
}

impl Publisher {
    /// Publishes `{"seq": seq, "pad": pad}` with topic `bench.event`; `Ok(false)` when the service
    /// refused it (not 202).
    pub async fn publish(&self, seq: u64, pad: &str) -> anyhow::Result<bool> {
        // A publisher-chosen id, as clients that retry publishes send: the path that checks
        // idempotency.
        let body = serde_json::json!({
            "tenant_id": self.tenant,
            "id": format!("bench-{seq}"),
            "topic": "bench.event",
            "data": { "seq": seq, "pad": pad },
        });
        let response = self
            .http
            .post(&self.url)
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await?;
        Ok(response.status().as_u16() == 202)
    }
}

/// The value of a Prometheus sample `name` (with `labels` inside the braces, or none), 0 if absent.
pub fn metric(page: &str, name: &str, labels: &str) -> f64 {
    let wanted = if labels.is_empty() {
        name.to_owned()
    } else {
        format!("{name}{{{labels}}}")
    };
    metric_sample(page, &wanted).unwrap_or(0.0)
}
