//! Security: tenant tokens reach their own tenant only (every route walked from the route
//! table), destination secrets are sealed in every store and never logged, the private-address
//! guard holds at connect time (through the egress proxy too), redirects are not followed,
//! receivers and the OTLP collector behind a private CA are reached only when that CA is
//! trusted, and `SHEAF_SECRETS_KEY` rotates under deliveries (`rotation`).

use std::collections::{BTreeSet, HashSet};
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};
use sheaf_server::http::auth::Access;
use sheaf_server::http::routes::{Route, routes};
use sheaf_server::settings::TokenKey;
use sheaf_server::{Config, Stores};
use sheaf_store::{DestinationId, TenantId, Topics};
use sheaf_testenv::receiver::{Failing, Receiver};

use crate::support::{Client, env_with, spawn_sheaf, start_server, stop_clean};

mod rotation;
mod tls;
mod walk;

use walk::{
    deliver_past_the_api, fixture, forms, issue_token, secrets_of, send, stored_destination,
    victim_state,
};

const KEY: &str = "security-admin-key-0123456789";
/// 32 bytes, base64: the token signing key of these tests.
const SIGNING_KEY: &str = "dG9rZW4tc2lnbmluZy1rZXktZm9yLXRoZS10ZXN0cyE=";
/// 32 bytes, base64: the secrets key of these tests.
const SECRETS_KEY: &str = "c2VjcmV0cy1rZXktZm9yLXRoZS10ZXN0cy0wMTIzNDU=";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenant_token_reaches_its_own_tenant_only_on_every_route() {
    let server = start_server(env_with(&[
        ("SHEAF_API_KEY", KEY),
        ("SHEAF_TOKEN_SIGNING_KEY", SIGNING_KEY),
        ("SHEAF_TOKEN_MAX_TTL", "1d"),
    ]))
    .await;
    let admin = Client::new(server.addr).with_key(KEY);
    let victim_receiver = Receiver::start().await.expect("the receiver binds");
    let intruder_receiver = Receiver::start().await.expect("the receiver binds");
    let victim = fixture(&admin, "victim", &victim_receiver).await;
    let intruder = fixture(&admin, "intruder", &intruder_receiver).await;

    // Issuing: admin only, bounded lifetime, the tenant must exist.
    let issued = issue_token(&admin, "intruder", 3600).await;
    assert_eq!(issued.status, 201, "{issued:?}");
    let token = issued.body["token"].as_str().unwrap().to_owned();
    assert!(token.starts_with("sheaf_tt1_"));
    assert_eq!(issued.body["tenant_id"], "intruder");
    for ttl in [59, 86_401] {
        let refused = issue_token(&admin, "intruder", ttl).await;
        assert_eq!(refused.status, 400, "ttl {ttl}: {refused:?}");
    }
    assert_eq!(issue_token(&admin, "nobody", 600).await.status, 404);
    let with_token = Client::new(server.addr).with_key(&token);

    let table = routes();
    let protected: Vec<&Route> = table.iter().filter(|r| r.access != Access::Open).collect();
    assert_eq!(
        protected.len() + 4,
        table.len(),
        "everything but healthz, readyz, metrics and the document is protected"
    );

    // 1. Another tenant's token, on every protected route naming the victim: 403 or 404, and
    //    nothing about the victim changes.
    let before = victim_state(&admin, &victim, &victim_receiver).await;
    let mut statuses = BTreeSet::new();
    for route in &protected {
        let answer = send(&with_token, route, &victim).await;
        assert!(
            answer.status == 403 || answer.status == 404,
            "{} {} with another tenant's token answered {answer:?}",
            route.method,
            route.path
        );
        assert!(
            matches!(answer.error_code(), "forbidden" | "not_found"),
            "{answer:?}"
        );
        statuses.insert(answer.status);
    }
    println!(
        "another tenant's token on {} routes: statuses {statuses:?}",
        protected.len()
    );
    // Let anything the walk might have queued run before comparing.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let after = victim_state(&admin, &victim, &victim_receiver).await;
    assert_eq!(before, after, "the walk changed nothing about the victim");

    // 2. The same token on its own tenant: admin routes refuse it with 403, every other route
    //    lets it through (whatever the handler then answers, it is not 401 or 403).
    for route in &protected {
        let answer = send(&with_token, route, &intruder).await;
        match route.access {
            Access::Admin => {
                assert_eq!(
                    answer.status, 403,
                    "{} {}: {answer:?}",
                    route.method, route.path
                );
                assert_eq!(answer.error_code(), "forbidden");
            }
            _ => assert!(
                answer.status != 401 && answer.status != 403 && answer.status < 500,
                "{} {} with the tenant's own token answered {answer:?}",
                route.method,
                route.path
            ),
        }
    }

    // 3. No credentials, a forged token, an expired token, a token of another server's key:
    //    401 on every protected route.
    let key = TokenKey::from_base64(SIGNING_KEY).unwrap();
    let now = chrono::Utc::now().timestamp();
    let tenant = TenantId::new("victim").unwrap();
    let (expired, _) = key.issue(&tenant, Duration::from_secs(60), now - 3600);
    let other_key = TokenKey::from_base64(&BASE64.encode([9u8; 32])).unwrap();
    let (foreign, _) = other_key.issue(&tenant, Duration::from_secs(600), now);
    let (claims_part, _) = token.rsplit_once('.').unwrap();
    let forged = format!("{claims_part}.{}", "A".repeat(43));
    let anonymous = Client::new(server.addr);
    for (label, client) in [
        ("no credentials", anonymous),
        ("expired", Client::new(server.addr).with_key(&expired)),
        ("foreign key", Client::new(server.addr).with_key(&foreign)),
        (
            "forged signature",
            Client::new(server.addr).with_key(&forged),
        ),
    ] {
        for route in &protected {
            let answer = send(&client, route, &victim).await;
            assert_eq!(
                answer.status, 401,
                "{label} on {} {}: {answer:?}",
                route.method, route.path
            );
            assert_eq!(answer.error_code(), "unauthorized");
        }
    }
    let expired_answer = Client::new(server.addr)
        .with_key(&expired)
        .get("/api/v1/tenants/victim")
        .await;
    assert!(
        expired_answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("expired"),
        "{expired_answer:?}"
    );
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_signing_key_no_token_is_issued_or_accepted() {
    let server = start_server(env_with(&[("SHEAF_API_KEY", KEY)])).await;
    let admin = Client::new(server.addr).with_key(KEY);
    assert_eq!(
        admin.send("PUT", "/api/v1/tenants/t", None).await.status,
        201
    );
    let refused = issue_token(&admin, "t", 600).await;
    assert_eq!(refused.status, 400);
    assert_eq!(refused.error_code(), "tokens_disabled");
    let key = TokenKey::from_base64(SIGNING_KEY).unwrap();
    let (token, _) = key.issue(
        &TenantId::new("t").unwrap(),
        Duration::from_secs(600),
        chrono::Utc::now().timestamp(),
    );
    let answer = Client::new(server.addr)
        .with_key(&token)
        .get("/api/v1/tenants/t")
        .await;
    assert_eq!(answer.status, 401, "{answer:?}");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secrets_are_sealed_in_the_memory_store_and_plaintext_rows_still_read() {
    let stores = Stores::memory();
    let raw = stores.entities.clone();
    let config = Config::load(env_with(&[("SHEAF_SECRETS_KEY", SECRETS_KEY)])).unwrap();
    let server = sheaf_server::start_with(config, stores).await.unwrap();
    let client = Client::new(server.addr);
    let receiver = Receiver::start().await.expect("the receiver binds");
    let created = client
        .tenant_with_destination("sealed", &receiver.url())
        .await;
    let id: DestinationId = created["id"].as_str().unwrap().parse().unwrap();
    let tenant = TenantId::new("sealed").unwrap();
    let rotated = client
        .send(
            "POST",
            &format!("/api/v1/tenants/sealed/destinations/{id}/rotate-secret"),
            None,
        )
        .await
        .body;
    let secrets = secrets_of(&rotated);
    assert_eq!(secrets.len(), 2);
    let stored = raw.get_destination(&tenant, &id).await.unwrap().unwrap();
    let previous = stored.previous_secret.as_ref().unwrap();
    for value in [stored.secret.expose(), previous.secret.expose()] {
        assert!(value.starts_with("enc:v2:"), "{value}");
        for secret in &secrets {
            for form in forms(secret) {
                assert!(
                    !value.contains(&form),
                    "the store holds a secret in the clear"
                );
            }
        }
    }

    // A destination written before a key was configured (plaintext) still reads and signs.
    let legacy_secret = "whsec_bGVnYWN5LXNlY3JldC1rZXktMDEyMzQ1Njc4OWFi";
    let legacy = stored_destination(&tenant, receiver.url(), Topics::All, legacy_secret);
    let legacy_id = legacy.id;
    raw.create_destination(&legacy).await.unwrap();
    let read = client
        .get(&format!("/api/v1/tenants/sealed/destinations/{legacy_id}"))
        .await;
    assert_eq!(read.status, 200, "{read:?}");
    assert_eq!(read.body["credentials"]["secret"], legacy_secret);
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_rows_hold_no_plaintext_secret_and_a_wrong_key_is_named() {
    let postgres = sheaf_testenv::require_postgres!("postgres_rows_hold_no_plaintext_secret");
    let schema = sheaf_testenv::unique_name("sec");
    let base = [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_ENTITY_CACHE_TTL", "0s"),
    ];
    let mut with_key = base.to_vec();
    with_key.push(("SHEAF_SECRETS_KEY", SECRETS_KEY));
    let server = start_server(env_with(&with_key)).await;
    let client = Client::new(server.addr);
    let receiver = Receiver::start().await.expect("the receiver binds");
    let created = client
        .tenant_with_destination("pgsealed", &receiver.url())
        .await;
    let id = created["id"].as_str().unwrap().to_owned();
    let rotated = client
        .send(
            "POST",
            &format!("/api/v1/tenants/pgsealed/destinations/{id}/rotate-secret"),
            None,
        )
        .await
        .body;
    let secrets = secrets_of(&rotated);
    assert_eq!(secrets.len(), 2);
    // Deliveries still sign with the plaintext the API showed.
    assert_eq!(
        client
            .publish("pgsealed", "sealed-1", json!({}))
            .await
            .status,
        202
    );
    let ids: HashSet<String> = ["sealed-1".to_owned()].into();
    assert!(receiver.delivers_all(&ids, Duration::from_secs(20)).await);
    server.shutdown().await;

    let pool = sqlx::PgPool::connect(&postgres).await.unwrap();
    let row: (String, Option<String>) = sqlx::query_as(&format!(
        "SELECT secret, previous_secret FROM {schema}.destinations WHERE id = $1::uuid"
    ))
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    let whole_row: String = sqlx::query_scalar(&format!(
        "SELECT row_to_json(d)::text FROM {schema}.destinations d WHERE id = $1::uuid"
    ))
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("raw destination row: {whole_row}");
    assert!(row.0.starts_with("enc:v2:"), "{}", row.0);
    assert!(row.1.as_deref().unwrap().starts_with("enc:v2:"));
    for secret in &secrets {
        for form in forms(secret) {
            assert!(
                !whole_row.contains(&form),
                "the row holds a secret in the clear"
            );
        }
    }

    // Another key: reading the destination fails, naming the setting, instead of handing out
    // garbage or signing with it.
    let mut other_key = base.to_vec();
    let wrong = BASE64.encode([3u8; 32]);
    other_key.push(("SHEAF_SECRETS_KEY", wrong.as_str()));
    let server = start_server(env_with(&other_key)).await;
    let answer = Client::new(server.addr)
        .get(&format!("/api/v1/tenants/pgsealed/destinations/{id}"))
        .await;
    assert_eq!(answer.status, 500, "{answer:?}");
    assert!(
        answer.body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("SHEAF_SECRETS_KEY")
    );
    server.shutdown().await;
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_logs_at_debug_level() {
    // The real binary, logging everything at debug (its own lines, sqlx's statements, hyper's
    // and reqwest's), through a full run: create a destination, fail a delivery, retry it,
    // rotate the secret, deliver with both, retry by hand, issue and use a token. Without
    // SHEAF_SECRETS_KEY, so the plaintext goes all the way to the store.
    let postgres = sheaf_testenv::postgres_url("no_secret_reaches_the_logs (postgres part)");
    let schema = sheaf_testenv::unique_name("logs");
    let mut env: Vec<(&str, &str)> = vec![
        ("SHEAF_LOG", "debug"),
        ("SHEAF_API_KEY", KEY),
        ("SHEAF_TOKEN_SIGNING_KEY", SIGNING_KEY),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_RETRY_SCHEDULE", "1s"),
        ("SHEAF_RETRY_JITTER_PERCENT", "0"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "10"),
        ("SHEAF_QUEUE_POLL_INTERVAL", "50ms"),
    ];
    if let Some(url) = &postgres {
        env.extend([
            ("SHEAF_QUEUE", "postgres"),
            ("SHEAF_LOG_STORE", "postgres"),
            ("SHEAF_POSTGRES_URL", url.as_str()),
            ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ]);
    }
    let sheaf = spawn_sheaf(&env).await;
    let admin = Client::new(sheaf.addr).with_key(KEY);
    let receiver = Receiver::builder()
        .failing(Failing::ForAfterFirst(Duration::from_millis(1500)))
        .start()
        .await
        .expect("the receiver binds");
    let created = admin
        .tenant_with_destination("logged", &receiver.url())
        .await;
    let id = created["id"].as_str().unwrap().to_owned();
    let mut secrets = secrets_of(&created);

    assert_eq!(
        admin
            .publish("logged", "log-1", json!({"a": 1}))
            .await
            .status,
        202
    );
    let first: HashSet<String> = ["log-1".to_owned()].into();
    assert!(receiver.delivers_all(&first, Duration::from_secs(30)).await);
    assert!(
        receiver.deliveries().iter().any(|d| d.status == 503),
        "a delivery failed and was retried"
    );

    let rotated = admin
        .send(
            "POST",
            &format!("/api/v1/tenants/logged/destinations/{id}/rotate-secret"),
            None,
        )
        .await
        .body;
    secrets.extend(secrets_of(&rotated));
    assert_eq!(
        admin
            .publish("logged", "log-2", json!({"b": 2}))
            .await
            .status,
        202
    );
    let retried = admin
        .send(
            "POST",
            "/api/v1/tenants/logged/retry",
            Some(json!({ "event_id": "log-1", "destination_id": id })),
        )
        .await;
    assert_eq!(retried.status, 202, "{retried:?}");
    let both: HashSet<String> = ["log-1".to_owned(), "log-2".to_owned()].into();
    assert!(receiver.delivers_all(&both, Duration::from_secs(30)).await);
    let token = issue_token(&admin, "logged", 600).await.body["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let tenant_client = Client::new(sheaf.addr).with_key(&token);
    assert_eq!(
        tenant_client
            .get("/api/v1/tenants/logged/destinations")
            .await
            .status,
        200
    );
    // Wait (bounded) for the manual retry's delivery too.
    for _ in 0..100 {
        if receiver
            .deliveries()
            .iter()
            .filter(|d| d.id == "log-1" && d.status == 200)
            .count()
            >= 2
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let log = sheaf.log();
    stop_clean(sheaf).await;

    let debug_lines = log.lines().filter(|l| l.contains("DEBUG")).count();
    println!(
        "captured {} log lines ({debug_lines} at debug) from a run on {}",
        log.lines().count(),
        if postgres.is_some() {
            "postgres"
        } else {
            "memory"
        }
    );
    assert!(debug_lines > 10, "the log really is at debug level:\n{log}");
    let mut needles: Vec<String> = secrets.iter().flat_map(|s| forms(s)).collect();
    needles.extend([KEY.to_owned(), SIGNING_KEY.to_owned(), token]);
    for needle in &needles {
        assert!(
            !log.contains(needle.as_str()),
            "a secret ({}…) is in the log",
            &needle[..8]
        );
    }
    if let Some(url) = &postgres {
        let pool = sqlx::PgPool::connect(url).await.unwrap();
        sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_guard_refuses_loopback_at_connect_time() {
    let receiver = Receiver::start().await.expect("the receiver binds");
    let port = receiver.addr.port();
    let targets = [
        ("name", format!("http://localhost:{port}/hook")),
        ("literal", format!("http://127.0.0.1:{port}/hook")),
        ("mapped", format!("http://[::ffff:127.0.0.1]:{port}/hook")),
    ];
    for (name, attempt) in deliver_past_the_api(&[], &targets).await {
        assert_eq!(attempt["status"], "failed", "{name}: {attempt}");
        let error = attempt["error"].as_str().unwrap_or_default();
        assert!(error.contains("not a public address"), "{name}: {error}");
        println!("{name}: {error}");
    }
    assert!(
        receiver.deliveries().is_empty(),
        "nothing reached the loopback receiver"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redirects_are_not_followed() {
    let target = Receiver::start().await.expect("the receiver binds");
    let redirector = Receiver::builder()
        .redirect_to(target.url())
        .start()
        .await
        .expect("the redirecting receiver binds");
    let server = start_server(env_with(&[("SHEAF_RETRY_MAX_ATTEMPTS", "1")])).await;
    let client = Client::new(server.addr);
    client
        .tenant_with_destination("redirected", &redirector.url())
        .await;
    assert_eq!(
        client.publish("redirected", "r-1", json!({})).await.status,
        202
    );
    let mut attempt = Value::Null;
    for _ in 0..100 {
        if let Some(first) = client.attempts_of("redirected", "r-1").await.first() {
            attempt = first.clone();
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(attempt["status"], "failed", "{attempt}");
    assert_eq!(attempt["response_code"], 307);
    assert!(
        attempt["error"]
            .as_str()
            .unwrap()
            .contains("redirects are not followed")
    );
    assert!(
        target.deliveries().is_empty(),
        "the redirect was not followed"
    );
    server.shutdown().await;
}
