//! A client for Sheaf's HTTP API, for everything that drives a running `sheaf` from outside:
//! the benchmarks, the fault suite and the server's tests. One [`Api`] talks to any number of
//! processes (each call names the process by its base URL, `http://127.0.0.1:PORT`), with no
//! API key unless [`Api::with_key`] gives one: the processes a harness starts listen on
//! loopback, and the server's tests of authentication set keys of their own.
//!
//! Each call is one request and says what it expects back; an answer it does not expect is an
//! error that names the call, the status and the body, so a failed setup step says which step
//! failed. Publishing comes in three forms, for three kinds of caller: [`Api::publish`] (the
//! status and the parsed body, for checks on `duplicate`), [`Api::publish_answer`] (the status
//! and `Retry-After`, for a load that backs off) and [`Api::publish_status`] (the status only,
//! the body not even read, for a load generator whose own cost is part of what is measured).

use std::time::Duration;

use anyhow::{Context as _, bail};
use serde_json::{Value, json};

/// A client of the API of any `sheaf` process (cheap to clone: clones share the connections).
#[derive(Debug, Clone)]
pub struct Api {
    http: reqwest::Client,
    /// Sent as `Authorization: Bearer …` on every request when set.
    key: Option<String>,
}

/// The body of one publish: `data` as event `id` of `tenant` on `topic`.
pub fn publish_body(tenant: &str, topic: &str, id: &str, data: &Value) -> Value {
    json!({ "tenant_id": tenant, "topic": topic, "id": id, "data": data })
}

impl Api {
    /// A client whose requests give up after `timeout`.
    pub fn new(timeout: Duration) -> anyhow::Result<Self> {
        Ok(Self::with_client(
            reqwest::Client::builder().timeout(timeout).build()?,
        ))
    }

    /// A client over `http`, for a caller that sizes its connection pool itself.
    pub fn with_client(http: reqwest::Client) -> Self {
        Self { http, key: None }
    }

    /// This client, sending `key` as the bearer token of every request (a server started with
    /// `SHEAF_API_KEY`, or a tenant's token for the portal's API).
    pub fn with_key(mut self, key: &str) -> Self {
        self.key = Some(key.to_owned());
        self
    }

    fn request(&self, method: reqwest::Method, url: String) -> reqwest::RequestBuilder {
        let request = self.http.request(method, url);
        match &self.key {
            Some(key) => request.bearer_auth(key),
            None => request,
        }
    }

    async fn send(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        let body = body.map(serde_json::to_vec).transpose()?;
        self.send_bytes(method, url, body).await
    }

    async fn send_bytes(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<(u16, Value)> {
        let mut request = self.request(method, url);
        if let Some(body) = body {
            request = request
                .header("content-type", "application/json")
                .body(body);
        }
        let response = request.send().await?;
        let status = response.status().as_u16();
        let bytes = response.bytes().await?;
        let body = serde_json::from_slice(&bytes)
            .unwrap_or_else(|_| Value::String(String::from_utf8_lossy(&bytes).into_owned()));
        Ok((status, body))
    }

    /// Sends any request to a process; the status and the body (JSON, or the text as a JSON
    /// string when it is not JSON).
    pub async fn call(
        &self,
        method: reqwest::Method,
        base: &str,
        path: &str,
        body: Option<&Value>,
    ) -> anyhow::Result<(u16, Value)> {
        self.send(method, format!("{base}{path}"), body).await
    }

    /// [`Api::call`] with a body sent as it is (labelled JSON whatever it holds), for the
    /// checks of what the server makes of malformed or oversized input.
    pub async fn call_raw(
        &self,
        method: reqwest::Method,
        base: &str,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<(u16, Value)> {
        self.send_bytes(method, format!("{base}{path}"), body).await
    }

    /// Creates (or keeps) `tenant`.
    pub async fn tenant(&self, base: &str, tenant: &str) -> anyhow::Result<()> {
        let (status, body) = self
            .send(
                reqwest::Method::PUT,
                format!("{base}/api/v1/tenants/{tenant}"),
                None,
            )
            .await?;
        if status != 200 && status != 201 {
            bail!("creating tenant {tenant} answered {status}: {body}");
        }
        Ok(())
    }

    /// Creates a destination of type `kind` (`webhook`, `rabbitmq`, `nats`, …) with `config` as
    /// its type's configuration, for every topic of an existing `tenant`; returns its id.
    pub async fn destination(
        &self,
        base: &str,
        tenant: &str,
        kind: &str,
        config: Value,
    ) -> anyhow::Result<String> {
        let destination = json!({ "type": kind, "topics": ["*"], "config": config });
        let (status, body) = self
            .send(
                reqwest::Method::POST,
                format!("{base}/api/v1/tenants/{tenant}/destinations"),
                Some(&destination),
            )
            .await?;
        if status != 201 {
            bail!("creating a {kind} destination answered {status}: {body}");
        }
        body["id"]
            .as_str()
            .map(str::to_owned)
            .context("the destination has no id")
    }

    /// Creates `tenant` with one webhook destination for every topic, pointing at `url`;
    /// returns the destination's id.
    pub async fn tenant_with_destination(
        &self,
        base: &str,
        tenant: &str,
        url: &str,
    ) -> anyhow::Result<String> {
        self.tenant(base, tenant).await?;
        self.destination(base, tenant, "webhook", json!({ "url": url }))
            .await
    }

    /// Rotates the signing secret of `tenant`'s destination `id`.
    pub async fn rotate_secret(&self, base: &str, tenant: &str, id: &str) -> anyhow::Result<()> {
        let (status, body) = self
            .send(
                reqwest::Method::POST,
                format!("{base}/api/v1/tenants/{tenant}/destinations/{id}/rotate-secret"),
                None,
            )
            .await?;
        if status != 200 {
            bail!("rotating the secret of destination {id} answered {status}: {body}");
        }
        Ok(())
    }

    /// One publish; the status and the body, or an error when no answer came.
    pub async fn publish(
        &self,
        base: &str,
        tenant: &str,
        topic: &str,
        id: &str,
        data: &Value,
    ) -> anyhow::Result<(u16, Value)> {
        let body = publish_body(tenant, topic, id, data);
        self.send(
            reqwest::Method::POST,
            format!("{base}/api/v1/publish"),
            Some(&body),
        )
        .await
    }

    /// One publish, answered with its status and its `Retry-After` in seconds (when sent); an
    /// error when no answer came.
    pub async fn publish_answer(
        &self,
        base: &str,
        tenant: &str,
        topic: &str,
        id: &str,
        data: &Value,
    ) -> anyhow::Result<(u16, Option<u64>)> {
        let body = publish_body(tenant, topic, id, data);
        let response = self
            .request(reqwest::Method::POST, format!("{base}/api/v1/publish"))
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await?;
        let status = response.status().as_u16();
        let retry_after = response
            .headers()
            .get("retry-after")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        // Read the body so the connection goes back to the pool.
        let _ = response.bytes().await?;
        Ok((status, retry_after))
    }

    /// One publish to the full URL of a process's `/api/v1/publish`, answered with its status
    /// only: the body is neither read nor parsed, so the caller's cost per publish is the
    /// request alone (the benchmarks' publishers, whose figures include it).
    pub async fn publish_status(
        &self,
        publish_url: &str,
        tenant: &str,
        topic: &str,
        id: &str,
        data: &Value,
    ) -> anyhow::Result<u16> {
        let body = publish_body(tenant, topic, id, data);
        let response = self
            .request(reqwest::Method::POST, publish_url.to_owned())
            .header("content-type", "application/json")
            .body(serde_json::to_vec(&body)?)
            .send()
            .await?;
        Ok(response.status().as_u16())
    }

    /// `GET /readyz`: the status and body, or `None` when nothing answered.
    pub async fn readyz(&self, base: &str) -> Option<(u16, Value)> {
        self.send(reqwest::Method::GET, format!("{base}/readyz"), None)
            .await
            .ok()
    }

    /// The `/metrics` page.
    pub async fn metrics(&self, base: &str) -> anyhow::Result<String> {
        match self
            .send(reqwest::Method::GET, format!("{base}/metrics"), None)
            .await?
        {
            (200, Value::String(page)) => Ok(page),
            (status, body) => bail!("/metrics answered {status}: {body}"),
        }
    }

    /// Every item of a listing (`/api/v1/tenants/{t}/events` or `…/attempts`, with any filters
    /// in its query), following cursors; pages of 1,000 unless the query sets a `limit` (a test
    /// of pagination walks small pages).
    pub async fn list_all(&self, base: &str, path: &str) -> anyhow::Result<Vec<Value>> {
        let mut items = Vec::new();
        let mut next: Option<String> = None;
        let query = path.split_once('?').map_or("", |(_, query)| query);
        let sets_limit = query.split('&').any(|pair| pair.starts_with("limit="));
        // At most 1,000 pages (of 1,000 items unless the path sets less): beyond any harness.
        for _ in 0..1_000 {
            let mut url = format!("{base}{path}");
            if !sets_limit {
                url.push(if path.contains('?') { '&' } else { '?' });
                url.push_str("limit=1000");
            }
            if let Some(cursor) = &next {
                url.push_str(&format!("&next={cursor}"));
            }
            let (status, body) = self.send(reqwest::Method::GET, url, None).await?;
            if status != 200 {
                bail!("{path} answered {status}: {body}");
            }
            items.extend(body["items"].as_array().cloned().unwrap_or_default());
            match body["next"].as_str() {
                Some(cursor) => next = Some(cursor.to_owned()),
                None => return Ok(items),
            }
        }
        bail!("{path} has more than 1,000 pages")
    }
}
