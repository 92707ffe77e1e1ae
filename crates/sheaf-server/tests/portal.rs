//! The web portal: its embedded files and their headers, its links, the per-minute attempt counts
//! its chart draws, the time filters of its listings, and the whole portal driven in Debian's
//! Chromium by Playwright (`crates/sheaf-server/portal/test/portal.test.mjs`).

use std::collections::HashSet;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_testenv::receiver::Receiver;

use crate::support::{Client, env_with, start_server};

const KEY: &str = "portal-admin-key-0123456789";
const SIGNING_KEY: &str = "cG9ydGFsLXRva2VuLXNpZ25pbmcta2V5LWZvci10ZXN0cyE=";

fn portal_env(extra: &[(&str, &str)]) -> std::collections::HashMap<String, String> {
    let mut env = env_with(&[
        ("SHEAF_API_KEY", KEY),
        ("SHEAF_TOKEN_SIGNING_KEY", SIGNING_KEY),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "1"),
    ]);
    for (k, v) in extra {
        env.insert((*k).to_owned(), (*v).to_owned());
    }
    env
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_is_served_from_the_binary_with_a_strict_policy() {
    let server = start_server(portal_env(&[])).await;
    let http = reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap();
    let base = format!("http://{}", server.addr);
    let index = http.get(format!("{base}/portal/")).send().await.unwrap();
    assert_eq!(index.status(), 200);
    let headers = index.headers().clone();
    let csp = headers["content-security-policy"].to_str().unwrap();
    for rule in [
        "default-src 'none'",
        "script-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(rule), "{rule} in {csp}");
    }
    assert!(
        !csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"),
        "{csp}"
    );
    assert_eq!(headers["x-content-type-options"], "nosniff");
    assert_eq!(headers["referrer-policy"], "no-referrer");
    assert!(
        headers["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/html")
    );
    let html = index.text().await.unwrap();
    assert!(
        html.contains("<script") && html.contains("type=\"module\""),
        "{html}"
    );
    assert!(
        !html.contains("sheaf_tt1_") && !html.contains(KEY),
        "no secret in the page"
    );
    // Every file the page names (scripts, style, icon) is served, each with its own type.
    let mut scripts = 0;
    for src in html
        .split("src=\"")
        .chain(html.split("href=\"").skip(1))
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .filter(|s| !s.starts_with('#'))
    {
        let url = if src.starts_with('/') {
            format!("{base}{src}")
        } else {
            format!("{base}/portal/{src}")
        };
        let file = http.get(&url).send().await.unwrap();
        assert_eq!(file.status(), 200, "{url}");
        let kind = file.headers()["content-type"].to_str().unwrap().to_owned();
        let expected = match src.rsplit('.').next() {
            Some("js") => "text/javascript",
            Some("css") => "text/css",
            Some("svg") => "image/svg+xml",
            _ => panic!("the page names {src}, of a kind this test does not know"),
        };
        assert!(kind.starts_with(expected), "{url}: {kind}");
        scripts += usize::from(expected == "text/javascript");
    }
    assert!(scripts >= 1, "the page loads its script: {html}");
    let bare = http.get(format!("{base}/portal")).send().await.unwrap();
    assert_eq!(bare.status(), 308);
    assert_eq!(bare.headers()["location"], "/portal/");
    let missing = http
        .get(format!("{base}/portal/no-such-file.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(missing.status(), 404);
    let body: Value = serde_json::from_str(&missing.text().await.unwrap()).unwrap();
    assert_eq!(body["error"]["code"], "route_not_found");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_portal_link_carries_a_token_for_its_tenant_in_the_fragment() {
    let server = start_server(portal_env(&[(
        "SHEAF_PUBLIC_URL",
        "https://hooks.example.com",
    )]))
    .await;
    let admin = Client::new(server.addr).with_key(KEY);
    assert_eq!(
        admin
            .send("PUT", "/api/v1/tenants/acme co", None)
            .await
            .status,
        400
    );
    assert_eq!(
        admin.send("PUT", "/api/v1/tenants/acme", None).await.status,
        201
    );
    let link = admin
        .send("POST", "/api/v1/tenants/acme/portal", None)
        .await;
    assert_eq!(link.status, 201, "{link:?}");
    let url = link.body["url"].as_str().unwrap();
    let token = link.body["token"].as_str().unwrap();
    let (page, fragment) = url
        .split_once('#')
        .expect("the token rides in the fragment");
    assert_eq!(page, "https://hooks.example.com/portal/");
    let pairs: Vec<(String, String)> = url::form_urlencoded::parse(fragment.as_bytes())
        .into_owned()
        .collect();
    assert_eq!(pairs[0], ("tenant".to_owned(), "acme".to_owned()));
    assert_eq!(pairs[1], ("token".to_owned(), token.to_owned()));
    assert_eq!(pairs[2].0, "expires");
    assert_eq!(pairs[2].1, link.body["expires_at"].as_str().unwrap());
    // An hour by default, and the token reaches its tenant.
    let expires: chrono::DateTime<chrono::Utc> = pairs[2].1.parse().unwrap();
    let left = expires - chrono::Utc::now();
    assert!(
        (3500..=3600).contains(&left.num_seconds()),
        "{left:?} left on a default link"
    );
    let tenant = Client::new(server.addr).with_key(token);
    assert_eq!(tenant.get("/api/v1/tenants/acme/events").await.status, 200);
    // Only the admin issues links, within the token bounds, for tenants that exist.
    assert_eq!(
        tenant
            .send("POST", "/api/v1/tenants/acme/portal", None)
            .await
            .status,
        403
    );
    let short = admin
        .send(
            "POST",
            "/api/v1/tenants/acme/portal",
            Some(json!({ "ttl_seconds": 30 })),
        )
        .await;
    assert_eq!(short.status, 400);
    assert!(
        short.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ttl_seconds")
    );
    assert_eq!(
        admin
            .send("POST", "/api/v1/tenants/nobody/portal", None)
            .await
            .status,
        404
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_public_url_the_link_follows_the_host_the_client_used() {
    let server = start_server(portal_env(&[])).await;
    let admin = Client::new(server.addr).with_key(KEY);
    admin.send("PUT", "/api/v1/tenants/acme", None).await;
    let link = admin
        .send("POST", "/api/v1/tenants/acme/portal", None)
        .await;
    let url = link.body["url"].as_str().unwrap();
    assert!(
        url.starts_with(&format!(
            "http://{}/portal/#tenant=acme&token=sheaf_tt1_",
            server.addr
        )),
        "{url}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_counts_attempts_per_minute_and_listings_filter_by_time() {
    let server = start_server(portal_env(&[])).await;
    let admin = Client::new(server.addr).with_key(KEY);
    let receiver = Receiver::start().await.expect("the receiver binds");
    admin.send("PUT", "/api/v1/tenants/charted", None).await;
    let created = admin
        .send(
            "POST",
            "/api/v1/tenants/charted/destinations",
            Some(
                json!({ "type": "webhook", "topics": ["*"], "config": { "url": receiver.url() } }),
            ),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let publish = |id: String| {
        let admin = &admin;
        async move {
            let answer = admin
                .send(
                    "POST",
                    "/api/v1/publish",
                    Some(json!({ "tenant_id": "charted", "id": id, "topic": "order.created", "data": {} })),
                )
                .await;
            assert_eq!(answer.status, 202, "{answer:?}");
        }
    };
    let ok: Vec<String> = (0..3).map(|i| format!("ok-{i}")).collect();
    for id in &ok {
        publish(id.clone()).await;
    }
    let wanted: HashSet<String> = ok.iter().cloned().collect();
    assert!(
        receiver
            .delivers_all(&wanted, Duration::from_secs(20))
            .await
    );
    receiver.set_failing(true);
    publish("failed-0".to_owned()).await;
    publish("failed-1".to_owned()).await;
    // Counted once their attempts are in the log.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let stats = loop {
        let stats = admin.get("/api/v1/tenants/charted/stats/attempts").await;
        assert_eq!(stats.status, 200, "{stats:?}");
        let total = |field: &str| -> u64 {
            stats.body["buckets"]
                .as_array()
                .unwrap()
                .iter()
                .map(|b| b[field].as_u64().unwrap())
                .sum()
        };
        if (total("success"), total("failed")) == (3, 2) {
            break stats;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "3 successes and 2 failures counted: {:?}",
            stats.body
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let buckets = stats.body["buckets"].as_array().unwrap();
    assert_eq!(buckets.len(), 60, "an hour of minutes");
    assert_eq!(stats.body["bucket_seconds"], 60);
    assert_eq!(stats.body["from"], buckets[0]["start"]);
    let short = admin
        .get("/api/v1/tenants/charted/stats/attempts?minutes=5")
        .await;
    assert_eq!(short.body["buckets"].as_array().unwrap().len(), 5);
    for bad in ["0", "1441", "x"] {
        let refused = admin
            .get(&format!(
                "/api/v1/tenants/charted/stats/attempts?minutes={bad}"
            ))
            .await;
        assert_eq!(refused.status, 400, "minutes={bad}: {refused:?}");
    }

    // The events listing's time window.
    let now = chrono::Utc::now();
    let at = |d: chrono::TimeDelta| (now + d).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let listed = |query: String| {
        let admin = &admin;
        async move {
            let page = admin
                .get(&format!("/api/v1/tenants/charted/events?{query}"))
                .await;
            assert_eq!(page.status, 200, "{query}: {page:?}");
            page.body["items"].as_array().unwrap().len()
        }
    };
    assert_eq!(
        listed(format!("since={}", at(-chrono::TimeDelta::hours(1)))).await,
        5
    );
    assert_eq!(
        listed(format!("since={}", at(chrono::TimeDelta::minutes(1)))).await,
        0
    );
    assert_eq!(
        listed(format!("until={}", at(-chrono::TimeDelta::hours(1)))).await,
        0
    );
    assert_eq!(
        listed(format!(
            "topic=order.created&until={}",
            at(chrono::TimeDelta::minutes(1))
        ))
        .await,
        5
    );
    let attempts = admin
        .get(&format!(
            "/api/v1/tenants/charted/attempts?status=failed&since={}",
            at(-chrono::TimeDelta::hours(1))
        ))
        .await;
    assert_eq!(attempts.body["items"].as_array().unwrap().len(), 2);
    // An empty value is not "unbounded": the document says date-time, and leaving it out is how
    // a client asks for no bound.
    for query in [
        "since=yesterday",
        "since=",
        &format!("since={0}&until={0}", at(chrono::TimeDelta::zero())),
    ] {
        let refused = admin
            .get(&format!("/api/v1/tenants/charted/events?{query}"))
            .await;
        assert_eq!(refused.status, 400, "{query}: {refused:?}");
        assert!(
            refused.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("since"),
            "{refused:?}"
        );
    }
    server.shutdown().await;
}

/// Where the browser test writes its screenshots.
fn screenshots() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("portal-screenshots")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_portal_works_in_a_real_browser() {
    const TEST: &str = "the_portal_works_in_a_real_browser";
    let browser = sheaf_testenv::require_browser!(TEST);
    let server = start_server(portal_env(&[])).await;
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("portal/test");
    let shots = screenshots();
    let _ = std::fs::remove_dir_all(&shots);
    let mut child = tokio::process::Command::new(&browser.node)
        .arg("portal.test.mjs")
        .current_dir(&dir)
        .env("SHEAF_URL", format!("http://{}", server.addr))
        .env("SHEAF_API_KEY", KEY)
        .env("PORTAL_SCREENSHOTS", &shots)
        .env("CHROMIUM", &browser.chromium)
        .stdout(Stdio::inherit())
        .stderr(Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .expect("node starts");
    let status = tokio::time::timeout(Duration::from_secs(240), child.wait())
        .await
        .expect("the browser test ends within 4 minutes")
        .expect("node ran");
    assert!(status.success(), "the browser test failed: {status}");
    let taken: Vec<String> = std::fs::read_dir(&shots)
        .expect("the screenshots folder")
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|n| n.ends_with(".png"))
        .collect();
    assert!(taken.len() >= 6, "a screenshot of each screen: {taken:?}");
    println!("screenshots in {}: {taken:?}", shots.display());
    server.shutdown().await;
}
