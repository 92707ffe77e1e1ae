//! What the security tests share: the fixture a route walk fills paths and bodies from, the
//! victim's state the walk must leave alone, the forms a secret may leak in, and deliveries to
//! destinations written past the API's guard.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_server::http::routes::Route;
use sheaf_server::{Config, Stores};
use sheaf_store::{Destination, DestinationId, TenantId, Timestamp, Topics};
use sheaf_testenv::receiver::Receiver;

use crate::support::{Answer, Client, env_with};

/// Everything a walk needs to fill a route's path and body for one tenant.
pub(super) struct Fixture {
    pub(super) tenant: String,
    pub(super) destination: String,
    pub(super) event: String,
    pub(super) attempt: String,
    pub(super) receiver_url: String,
}

impl Fixture {
    pub(super) fn path(&self, route: &Route) -> String {
        route
            .path
            .replace("{tenant_id}", &self.tenant)
            .replace("{destination_id}", &self.destination)
            .replace("{event_id}", &self.event)
            .replace("{attempt_id}", &self.attempt)
    }

    /// A valid body for the route's request schema. A new schema in the route table fails
    /// here until it has an example, so a new route cannot be walked without a body.
    pub(super) fn body(&self, route: &Route) -> Option<Value> {
        let schema = route.request?;
        Some(match schema {
            "TenantInput" => json!({ "metadata": { "changed": "by-the-walk" } }),
            "TokenInput" => json!({ "ttl_seconds": 600 }),
            "DestinationInput" => json!({
                "type": "webhook", "topics": ["*"], "config": { "url": self.receiver_url }
            }),
            "DestinationPatch" => json!({ "enabled": false, "topics": ["walk.changed"] }),
            "PublishInput" => json!({
                "tenant_id": self.tenant, "topic": "walk.published", "data": { "walk": true }
            }),
            "TryTransformation" => json!({
                "transform": "{walked: .data}", "event": { "topic": "walk.tried", "data": {} }
            }),
            "RetryInput" => json!({ "event_id": self.event, "destination_id": self.destination }),
            "ReplayInput" => json!({
                "status": "any", "since": "2026-01-01T00:00:00Z", "until": "2026-01-02T00:00:00Z"
            }),
            other => panic!(
                "route {} {} takes a {other} body: add an example to Fixture::body",
                route.method, route.path
            ),
        })
    }
}

/// Creates `tenant` with a destination at `receiver`, publishes one event and waits for its
/// delivery, so the walk has a real destination, event and attempt to name.
pub(super) async fn fixture(admin: &Client, tenant: &str, receiver: &Receiver) -> Fixture {
    let destination = admin.tenant_with_destination(tenant, &receiver.url()).await;
    let event = format!("{tenant}-event");
    assert_eq!(
        admin
            .publish(tenant, &event, json!({ "n": 1 }))
            .await
            .status,
        202
    );
    let ids: HashSet<String> = [event.clone()].into();
    assert!(receiver.delivers_all(&ids, Duration::from_secs(20)).await);
    // The attempt is logged just after the receiver answered: wait for it (bounded).
    let mut attempts = Vec::new();
    for _ in 0..100 {
        attempts = admin.attempts_of(tenant, &event).await;
        if !attempts.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!attempts.is_empty(), "the delivery's attempt is logged");
    Fixture {
        tenant: tenant.to_owned(),
        destination: destination["id"].as_str().unwrap().to_owned(),
        event,
        attempt: attempts[0]["id"].as_str().unwrap().to_owned(),
        receiver_url: receiver.url(),
    }
}

pub(super) async fn send(client: &Client, route: &Route, fixture: &Fixture) -> Answer {
    client
        .send(
            route.method.as_str(),
            &fixture.path(route),
            fixture.body(route),
        )
        .await
}

pub(super) async fn issue_token(admin: &Client, tenant: &str, ttl: u64) -> Answer {
    admin
        .send(
            "POST",
            &format!("/api/v1/tenants/{tenant}/tokens"),
            Some(json!({ "ttl_seconds": ttl })),
        )
        .await
}

/// What the walk must not have changed about the victim: its tenant, destinations (secrets
/// included), events and deliveries.
pub(super) async fn victim_state(admin: &Client, fixture: &Fixture, receiver: &Receiver) -> Value {
    let tenant = &fixture.tenant;
    json!({
        "tenant": admin.get(&format!("/api/v1/tenants/{tenant}")).await.body,
        "destinations": admin.get(&format!("/api/v1/tenants/{tenant}/destinations")).await.body,
        "events": admin.get(&format!("/api/v1/tenants/{tenant}/events")).await.body["items"]
            .as_array().unwrap().iter().map(|e| e["id"].clone()).collect::<Vec<_>>(),
        "attempts": admin.get(&format!("/api/v1/tenants/{tenant}/attempts")).await.body["items"]
            .as_array().unwrap().len(),
        "dead_letters": admin.get(&format!("/api/v1/tenants/{tenant}/dead-letters")).await.body,
        "deliveries": receiver.deliveries().len(),
    })
}

pub(super) fn secrets_of(destination: &Value) -> Vec<String> {
    let mut secrets = vec![
        destination["credentials"]["secret"]
            .as_str()
            .unwrap()
            .to_owned(),
    ];
    if let Some(previous) = destination["credentials"]["previous_secret"]["secret"].as_str() {
        secrets.push(previous.to_owned());
    }
    secrets
}

/// A secret and the base64 key inside it: neither may appear where the secret must not.
pub(super) fn forms(secret: &str) -> [String; 2] {
    [
        secret.to_owned(),
        secret.strip_prefix("whsec_").unwrap().to_owned(),
    ]
}

/// A webhook destination of `tenant` at `url` for `topics`, signed with `secret`, as the entity
/// store holds it: for writing straight into a store, past the API's checks.
pub(super) fn stored_destination(
    tenant: &TenantId,
    url: String,
    topics: Topics,
    secret: &str,
) -> Destination {
    let now = Timestamp::now();
    Destination {
        id: DestinationId::generate(),
        tenant_id: tenant.clone(),
        kind: sheaf_store::DestinationKind::new("webhook").unwrap(),
        config: serde_json::json!({ "url": url }),
        topics,
        filter: None,
        rate_limit: None,
        headers: Default::default(),
        transform: None,
        ordering_key: None,
        dead_letter_blocks_key: false,
        enabled: true,
        disabled_reason: None,
        consecutive_failures: 0,
        secret: sheaf_store::Secret::new(secret).unwrap(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    }
}

/// The first attempt of `event`, waiting up to 10 s for it.
pub(super) async fn first_attempt(client: &Client, tenant: &str, event: &str) -> Value {
    for _ in 0..100 {
        if let Some(first) = client.attempts_of(tenant, event).await.first() {
            return first.clone();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("no attempt of {event} within 10 s");
}

/// Delivers one event to each `(name, url)` on a server with the private-destination guard on
/// (and `env`), and returns each one's first attempt, by name. The destinations are written
/// straight into the store, as if their names had resolved to public addresses when they were
/// created (the API refuses them now): only the delivery itself can refuse them.
pub(super) async fn deliver_past_the_api(
    env: &[(&str, &str)],
    targets: &[(&str, String)],
) -> Vec<(String, Value)> {
    let stores = Stores::memory();
    let raw = stores.entities.clone();
    let mut settings = vec![
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "false"),
        ("SHEAF_RETRY_MAX_ATTEMPTS", "1"),
    ];
    settings.extend_from_slice(env);
    let config = Config::load(env_with(&settings)).unwrap();
    let server = sheaf_server::start_with(config, stores).await.unwrap();
    let client = Client::new(server.addr);
    let put = client.send("PUT", "/api/v1/tenants/guarded", None).await;
    assert_eq!(put.status, 201, "{put:?}");
    let tenant = TenantId::new("guarded").unwrap();
    for (name, url) in targets {
        let topics = Topics::from_list(vec![format!("guard.{name}")]).unwrap();
        let destination = stored_destination(
            &tenant,
            url.clone(),
            topics,
            "whsec_Z3VhcmQtc2VjcmV0LTAxMjM0NTY3ODlhYmNkZWY=",
        );
        raw.create_destination(&destination).await.unwrap();
    }
    // Published after every destination exists: the service caches a tenant's destinations.
    for (name, _) in targets {
        let published = client
            .send(
                "POST",
                "/api/v1/publish",
                Some(
                    json!({ "tenant_id": "guarded", "topic": format!("guard.{name}"),
                             "data": {}, "id": format!("guard-{name}") }),
                ),
            )
            .await;
        assert_eq!(published.status, 202, "{published:?}");
    }
    let mut attempts = Vec::new();
    for (name, _) in targets {
        let attempt = first_attempt(&client, "guarded", &format!("guard-{name}")).await;
        attempts.push(((*name).to_owned(), attempt));
    }
    server.shutdown().await;
    attempts
}
