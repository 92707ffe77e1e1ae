//! A `sheaf serve` process for the service scenarios: started from the binary `cargo xtask bench`
//! built, configured through its environment like any deployment, driven over its HTTP API on
//! loopback, measured through `/proc/<pid>/status` and `/metrics`, and stopped with SIGTERM (a
//! graceful stop) by its PID, SIGKILL only if it does not stop in time.

use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

/// A running `sheaf serve`.
#[derive(Debug)]
pub struct SheafProcess {
    child: Option<Child>,
    pub pid: u32,
    pub addr: SocketAddr,
    http: reqwest::Client,
    log: std::path::PathBuf,
}

impl SheafProcess {
    /// Starts `bin serve` with `env` (and no other `SHEAF_*` variable), its output in `log`, and
    /// waits (at most 60 s) until `/healthz` answers.
    pub async fn start(bin: &Path, env: &[(&str, String)], log: &Path) -> anyhow::Result<Self> {
        let port = std::net::TcpListener::bind(("127.0.0.1", 0))
            .and_then(|l| l.local_addr())
            .context("find a free loopback port")?
            .port();
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        if let Some(dir) = log.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let out =
            std::fs::File::create(log).with_context(|| format!("create {}", log.display()))?;
        let mut cmd = Command::new(bin);
        cmd.arg("serve")
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out);
        for (name, _) in std::env::vars() {
            if name.starts_with("SHEAF_") {
                cmd.env_remove(name);
            }
        }
        cmd.env("SHEAF_LISTEN", addr.to_string())
            .env("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true")
            .env("SHEAF_LOG", "warn");
        for (name, value) in env {
            cmd.env(name, value);
        }
        let child = cmd
            .spawn()
            .with_context(|| format!("start {}", bin.display()))?;
        let pid = child.id();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .pool_max_idle_per_host(256)
            .build()?;
        let mut process = SheafProcess {
            child: Some(child),
            pid,
            addr,
            http,
            log: log.to_path_buf(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(child) = process.child.as_mut()
                && let Some(status) = child.try_wait()?
            {
                bail!(
                    "sheaf exited during start-up ({status}): {}",
                    process.log_tail()
                );
            }
            let ok = process
                .http
                .get(process.url("/healthz"))
                .send()
                .await
                .is_ok_and(|r| r.status().is_success());
            if ok {
                return Ok(process);
            }
            if Instant::now() >= deadline {
                bail!(
                    "sheaf did not answer /healthz within 60 s: {}",
                    process.log_tail()
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    /// The last lines of the process's output, for error messages.
    pub fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(15)..].join("\n")
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
        let body = serde_json::json!({
            "type": "webhook",
            "topics": ["*"],
            "config": { "url": url },
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
                "create destination: {} {}",
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
        crate::proc::peak_rss_kib(Some(self.pid))
    }

    /// Current resident set in KiB.
    pub fn rss_kib(&self) -> Option<u64> {
        crate::proc::rss_kib(Some(self.pid))
    }

    /// SIGTERM, then up to 30 s for a graceful stop, then SIGKILL.
    pub async fn stop(mut self) -> anyhow::Result<()> {
        let Some(mut child) = self.child.take() else {
            return Ok(());
        };
        let _ = Command::new("kill")
            .args(["-TERM", &self.pid.to_string()])
            .status();
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if child.try_wait()?.is_some() {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        child.kill()?;
        child.wait()?;
        bail!("sheaf did not stop within 30 s of SIGTERM; killed it")
    }
}

impl Drop for SheafProcess {
    fn drop(&mut self) {
        // Only reached when a scenario failed before `stop`: the process must not outlive it.
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
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
        let body = serde_json::json!({
            "tenant_id": self.tenant,
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
    page.lines()
        .find_map(|line| {
            let (key, value) = line.rsplit_once(' ')?;
            (key == wanted).then(|| value.parse().ok())?
        })
        .unwrap_or(0.0)
}
