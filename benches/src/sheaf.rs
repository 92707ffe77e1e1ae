//! A `sheaf serve` process for the service scenarios (the shared child process of
//! `sheaf_testenv::process`): started from the binary `cargo xtask bench` built, configured
//! through its environment like any deployment, driven over its HTTP API on loopback (the
//! shared client, `sheaf_testenv::api`), measured
//! through `/proc/<pid>/status` and `/metrics`, and stopped with SIGTERM (a graceful stop) by its
//! PID, SIGKILL only if it does not stop in time.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use sheaf_testenv::api::Api;
use sheaf_testenv::process::{SheafCommand, SheafProcess, metric_sample};

/// The topic every event is published with.
pub const TOPIC: &str = "bench.event";

/// A running `sheaf serve` and the client the scenario drives it with.
#[derive(Debug)]
pub struct Sheaf {
    process: SheafProcess,
    api: Api,
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
        Ok(Sheaf {
            process,
            api: Api::with_client(http),
        })
    }

    /// The URL of `path` on its HTTP API.
    pub fn url(&self, path: &str) -> String {
        self.process.url(path)
    }

    /// Creates (or keeps) the tenant.
    pub async fn add_tenant(&self, tenant: &str) -> anyhow::Result<()> {
        self.api.tenant(&self.process.base(), tenant).await
    }

    /// Creates the tenant and one webhook destination for every topic pointing at `url`.
    pub async fn add_destination(&self, tenant: &str, url: &str) -> anyhow::Result<()> {
        self.add_destination_with(tenant, url, serde_json::json!({}))
            .await
            .map(drop)
    }

    /// [`Sheaf::add_destination`], then `settings` (an object of the destination's settings,
    /// `{"transform": …}`, `{"ordering": …}`) applied by a PATCH when not empty; returns the
    /// destination's id.
    pub async fn add_destination_with(
        &self,
        tenant: &str,
        url: &str,
        settings: serde_json::Value,
    ) -> anyhow::Result<String> {
        let base = self.process.base();
        let id = self.api.tenant_with_destination(&base, tenant, url).await?;
        if settings.as_object().is_some_and(|o| !o.is_empty()) {
            let (status, body) = self
                .api
                .call(
                    reqwest::Method::PATCH,
                    &base,
                    &format!("/api/v1/tenants/{tenant}/destinations/{id}"),
                    Some(&settings),
                )
                .await?;
            anyhow::ensure!(
                status == 200,
                "setting {settings} answered {status}: {body}"
            );
        }
        Ok(id)
    }

    /// Creates one destination of type `kind` (`webhook`, `rabbitmq`, `nats`, …) for every topic
    /// of an existing tenant, with `config` as its type's configuration.
    pub async fn add_typed_destination(
        &self,
        tenant: &str,
        kind: &str,
        config: serde_json::Value,
    ) -> anyhow::Result<()> {
        self.api
            .destination(&self.process.base(), tenant, kind, config)
            .await?;
        Ok(())
    }

    /// A client for publishing (cheap to clone).
    pub fn publisher(&self, tenant: &str) -> Publisher {
        Publisher::across(std::slice::from_ref(self), tenant)
    }

    /// The `/metrics` page.
    pub async fn metrics(&self) -> anyhow::Result<String> {
        self.api.metrics(&self.process.base()).await
    }

    /// Peak resident set in KiB.
    pub fn peak_rss_kib(&self) -> Option<u64> {
        self.process.peak_rss_kib()
    }

    /// Current resident set in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        self.process.rss_kib()
    }

    /// The process's id.
    pub fn pid(&self) -> u32 {
        self.process.pid()
    }

    /// CPU time the process and its children (transformation runners) used so far, all
    /// threads.
    pub fn cpu_time(&self) -> Option<Duration> {
        sheaf_testenv::process::tree_cpu_time(self.process.pid())
    }

    /// SIGTERM, then up to 30 s for a graceful stop, then SIGKILL and an error.
    pub async fn stop(self) -> anyhow::Result<()> {
        self.process.stop(Duration::from_secs(30)).await?;
        Ok(())
    }
}

/// Publishes events for one tenant, through one `sheaf` process or spread over several.
#[derive(Debug, Clone)]
pub struct Publisher {
    api: Api,
    /// The publish URL of each process; event `seq` goes to `urls[seq % len]`.
    urls: Arc<[String]>,
    tenant: String,
    topic: String,
    /// Every event's `key`; `None`: one of 1,000 keys, by its seq.
    key: Option<String>,
}

impl Publisher {
    /// A publisher that spreads events over `processes` (at least one) by their seq, as a load
    /// balancer in front of a fleet would: each gets every `processes.len()`-th event.
    pub fn across(processes: &[Sheaf], tenant: &str) -> Publisher {
        Publisher {
            api: processes[0].api.clone(),
            urls: processes.iter().map(|p| p.url("/api/v1/publish")).collect(),
            tenant: tenant.to_owned(),
            topic: TOPIC.to_owned(),
            key: None,
        }
    }

    /// This publisher, publishing on `topic` instead of [`TOPIC`].
    pub fn on_topic(mut self, topic: &str) -> Self {
        self.topic = topic.to_owned();
        self
    }

    /// This publisher, giving every event the same `key` (one hot key).
    pub fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    /// Publishes `{"seq": seq, "key": …, "pad": pad}` with topic [`TOPIC`] (or the one
    /// [`Publisher::on_topic`] set); `Ok(false)` when the service refused it (not 202). The
    /// answer's body is not read: the publisher's own cost is part of what the scenarios
    /// measure.
    pub async fn publish(&self, seq: u64, pad: &str) -> anyhow::Result<bool> {
        // A publisher-chosen id, as clients that retry publishes send: the path that checks
        // idempotency.
        // `key`: one of 1,000 order keys, for the destinations ordered by `/data/key`, unless
        // the publisher has one key for all.
        let data = match &self.key {
            Some(key) => serde_json::json!({ "seq": seq, "key": key, "pad": pad }),
            None => serde_json::json!({ "seq": seq, "key": seq % 1_000, "pad": pad }),
        };
        let id = format!("bench-{seq}");
        let url = &self.urls[(seq % self.urls.len() as u64) as usize];
        let status = self
            .api
            .publish_status(url, &self.tenant, &self.topic, &id, &data)
            .await?;
        Ok(status == 202)
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
