//! Signatures checked by libraries that are not Sheaf's, in xtask's Python environment:
//! HMAC (`v1`) by the `standardwebhooks` package, Ed25519 (`v1a`) by `cryptography`'s
//! verifier with the public key alone; both during a rotation too.

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
    let stdout = run_python(python, VERIFY, json!({ "secret": secret }), delivery);
    println!("standardwebhooks: {}", stdout.trim());
    stdout.trim() == "verified"
}

/// Runs `script` with `case`, the delivery's body and its `webhook-*` headers as JSON on its
/// standard input; returns what it printed.
fn run_python(
    python: &str,
    script: &str,
    mut case: serde_json::Value,
    delivery: &Delivery,
) -> String {
    let headers: serde_json::Map<String, serde_json::Value> = delivery
        .headers
        .iter()
        .filter(|(k, _)| k.as_str().starts_with("webhook-"))
        .map(|(k, v)| (k.as_str().to_owned(), json!(v.to_str().unwrap_or(""))))
        .collect();
    case["body"] = json!(String::from_utf8(delivery.body.to_vec()).unwrap());
    case["headers"] = json!(headers);
    let mut child = Command::new(python)
        .arg("-c")
        .arg(script)
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
    assert!(
        output.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

const VERIFY_ED25519: &str = r#"
import base64, json, sys
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
case = json.load(sys.stdin)
headers = case["headers"]
content = (headers["webhook-id"] + "." + headers["webhook-timestamp"] + ".").encode() + case["body"].encode()
signatures = [base64.b64decode(s[4:]) for s in headers["webhook-signature"].split(" ") if s.startswith("v1a,")]
def verifies(public_key):
    key = Ed25519PublicKey.from_public_bytes(base64.b64decode(public_key.removeprefix("whpk_")))
    for signature in signatures:
        try:
            key.verify(signature, content)
            return True
        except InvalidSignature:
            pass
    return False
print(json.dumps([verifies(k) for k in case["public_keys"]]))
"#;

/// For each public key (`whpk_…`), whether `cryptography` verifies one of the delivery's `v1a`
/// signatures with it.
fn ed25519_verifies(python: &str, public_keys: &[&str], delivery: &Delivery) -> Vec<bool> {
    let stdout = run_python(
        python,
        VERIFY_ED25519,
        json!({ "public_keys": public_keys }),
        delivery,
    );
    serde_json::from_str(&stdout).expect("a list of booleans")
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

/// An Ed25519 destination: its deliveries carry `v1a` signatures that its public key alone
/// verifies, the API never shows the private key, a rotation signs with both keys, and a
/// switch back to HMAC signs `v1` beside the old `v1a` for the overlap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ed25519_signatures_verify_with_the_public_key_alone_including_during_rotation() {
    let python = sheaf_testenv::require_python!(
        "ed25519_signatures_verify_with_the_public_key_alone_including_during_rotation"
    );
    let receiver = Receiver::start().await.expect("the receiver binds");
    let server = start_server(env_with(&[])).await;
    let client = Client::new(server.addr);
    assert_eq!(
        client.send("PUT", "/api/v1/tenants/ed", None).await.status,
        201
    );
    let created = client
        .send(
            "POST",
            "/api/v1/tenants/ed/destinations",
            Some(json!({
                "type": "webhook",
                "topics": ["*"],
                "config": { "url": receiver.url() },
                "signing": { "algorithm": "ed25519" },
            })),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let credentials = &created.body["credentials"];
    assert_eq!(credentials["algorithm"], "ed25519");
    assert_eq!(
        credentials["secret"],
        serde_json::Value::Null,
        "{credentials}"
    );
    let first_key = credentials["public_key"].as_str().unwrap().to_owned();
    assert!(first_key.starts_with("whpk_"), "{first_key}");
    assert!(
        !created.body.to_string().contains("whsk_"),
        "no private key shown"
    );
    let id = created.body["id"].as_str().unwrap().to_owned();

    let data = json!({ "order": 7, "note": "ü and \"quotes\"" });
    assert_eq!(client.publish("ed", "ed-1", data.clone()).await.status, 202);
    let first = delivered(&receiver, "ed-1").await;
    assert!(
        first.header("webhook-signature").starts_with("v1a,"),
        "{}",
        first.header("webhook-signature")
    );
    let stranger = "whpk_11qYAYKxCrfVS/7TyWQHOg7hcvPapiMlrwIaaPcHURo=";
    assert_eq!(
        ed25519_verifies(&python, &[&first_key, stranger], &first),
        [true, false],
        "its public key verifies, another does not"
    );

    // A rotation keeps the old key signing beside the new one.
    let rotated = client
        .send(
            "POST",
            &format!("/api/v1/tenants/ed/destinations/{id}/rotate-secret"),
            None,
        )
        .await;
    assert_eq!(rotated.status, 200, "{rotated:?}");
    let second_key = rotated.body["credentials"]["public_key"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_ne!(second_key, first_key);
    assert_eq!(
        rotated.body["credentials"]["previous_secret"]["public_key"],
        first_key.as_str()
    );
    assert_eq!(
        client.publish("ed", "ed-2", json!([1, 2])).await.status,
        202
    );
    let second = delivered(&receiver, "ed-2").await;
    assert_eq!(second.header("webhook-signature").split(' ').count(), 2);
    assert_eq!(
        ed25519_verifies(&python, &[&second_key, &first_key], &second),
        [true, true],
        "a receiver with either public key verifies"
    );

    // Back to HMAC: a fresh secret signs v1, the Ed25519 key v1a beside it.
    let switched = client
        .send(
            "PATCH",
            &format!("/api/v1/tenants/ed/destinations/{id}"),
            Some(json!({ "signing": { "algorithm": "hmac-sha256" } })),
        )
        .await;
    assert_eq!(switched.status, 200, "{switched:?}");
    let secret = switched.body["credentials"]["secret"]
        .as_str()
        .unwrap()
        .to_owned();
    assert!(secret.starts_with("whsec_"), "{secret}");
    assert_eq!(
        switched.body["credentials"]["previous_secret"]["public_key"],
        second_key.as_str()
    );
    assert_eq!(client.publish("ed", "ed-3", json!({})).await.status, 202);
    let third = delivered(&receiver, "ed-3").await;
    assert!(
        verifies(&python, &secret, &third),
        "the new HMAC secret verifies"
    );
    assert_eq!(
        ed25519_verifies(&python, &[&second_key], &third),
        [true],
        "the previous public key still verifies during the overlap"
    );

    let refused = client
        .send(
            "PATCH",
            &format!("/api/v1/tenants/ed/destinations/{id}"),
            Some(json!({ "signing": { "algorithm": "rsa" } })),
        )
        .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert!(
        refused.body.to_string().contains("signing.algorithm"),
        "{refused:?}"
    );
    server.shutdown().await;
}
