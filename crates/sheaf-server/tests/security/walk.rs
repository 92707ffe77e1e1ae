//! What the security tests share: the fixture a route walk fills paths and bodies from, the
//! victim's state the walk must leave alone, and the forms a secret may leak in.

use std::collections::HashSet;
use std::time::Duration;

use serde_json::{Value, json};
use sheaf_server::http::routes::Route;
use sheaf_store::{Destination, DestinationId, TenantId, Timestamp, Topics};
use sheaf_testenv::receiver::Receiver;

use crate::support::{Answer, Client};

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
            "RetryInput" => json!({ "event_id": self.event, "destination_id": self.destination }),
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
        kind: sheaf_store::DestinationKind::Webhook,
        url,
        topics,
        headers: Default::default(),
        enabled: true,
        secret: sheaf_store::Secret::new(secret).unwrap(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    }
}
