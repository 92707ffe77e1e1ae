//! Signatures checked by the `standardwebhooks` package from PyPI (xtask's virtual
//! environment), including during a secret rotation.

use std::collections::HashSet;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::Duration;

use serde_json::json;
use sheaf_testenv::receiver::{Delivery, Receiver};

use crate::support::{Client, env_with, start_server};

const VERIFY: &str = r#"
import json, sys
from standardwebhooks.webhooks import Webhook
case = json.load(sys.stdin)
try:
    Webhook(case["secret"]).verify(case["body"], case["headers"])
    print("verified")
except Exception as e:
    print("refused:", type(e).__name__, e)
"#;

/// Whether `standardwebhooks` accepts the delivery under `secret`.
pub(crate) fn verifies(python: &str, secret: &str, delivery: &Delivery) -> bool {
    let headers: serde_json::Map<String, serde_json::Value> = delivery
        .headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("webhook-"))
        .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or(""))))
        .collect();
    let case = json!({
        "secret": secret,
        "body": String::from_utf8(delivery.body.to_vec()).unwrap(),
        "headers": headers,
    });
    let mut child = Command::new(python)
        .arg("-c")
        .arg(VERIFY)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(case.to_string().as_bytes())
        .unwrap();
    let output = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    println!("standardwebhooks: {}", stdout.trim());
    stdout.trim() == "verified"
}

async fn delivered(receiver: &Receiver, id: &str) -> Delivery {
    let ids: HashSet<String> = [id.to_owned()].into();
    assert!(receiver.delivers_all(&ids, Duration::from_secs(10)).await);
    receiver
        .deliveries()
        .into_iter()
        .find(|d| d.id == id)
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn standard_webhooks_verifies_signatures_including_during_rotation() {
    let python = sheaf_testenv::require_python!(
        "standard_webhooks_verifies_signatures_including_during_rotation"
    );
    let receiver = Receiver::start().await.expect("the receiver binds");
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    let destination = client
        .tenant_with_destination("signed", &receiver.url())
        .await;
    let id = destination["id"].as_str().unwrap();
    let old_secret = destination["credentials"]["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(old_secret.starts_with("whsec_"));

    let data = json!({ "order": 42, "items": ["a", "ü"], "nested": { "ok": true } });
    assert_eq!(
        client.publish("signed", "sig-1", data.clone()).await.status,
        202
    );
    let first = delivered(&receiver, "sig-1").await;
    assert_eq!(first.header("content-type"), "application/json");
    assert_eq!(
        serde_json::from_slice::<serde_json::Value>(&first.body).unwrap(),
        data
    );
    assert!(first.header("webhook-signature").starts_with("v1,"));
    assert!(
        verifies(&python, &old_secret, &first),
        "the current secret verifies"
    );

    let rotated = client
        .send(
            "POST",
            &format!("/api/v1/tenants/signed/destinations/{id}/rotate-secret"),
            None,
        )
        .await;
    assert_eq!(rotated.status, 200, "{rotated:?}");
    let new_secret = rotated.body["credentials"]["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(new_secret, old_secret);
    assert_eq!(
        rotated.body["credentials"]["previous_secret"]["secret"],
        old_secret.as_str()
    );

    assert_eq!(
        client
            .publish("signed", "sig-2", json!([1, 2, 3]))
            .await
            .status,
        202
    );
    let second = delivered(&receiver, "sig-2").await;
    let signatures: Vec<&str> = second.header("webhook-signature").split(' ').collect();
    assert_eq!(signatures.len(), 2, "both secrets sign during the rotation");
    assert!(
        verifies(&python, &new_secret, &second),
        "a receiver with only the new secret verifies"
    );
    assert!(
        verifies(&python, &old_secret, &second),
        "a receiver with only the old secret verifies"
    );
    let stranger = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    assert!(
        !verifies(&python, stranger, &second),
        "another secret does not verify"
    );
    server.shutdown().await;
}
