//! What an operator follows a request by: its `x-request-id`, the request timeout's answer, and
//! JSON log lines that carry the request's span.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::support::{Client, env_with, spawn_sheaf, start_server, stop_clean};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn request_ids_are_echoed_and_made_up_when_absent() {
    let running = start_server(env_with(&[])).await;
    let http = reqwest::Client::new();
    let base = format!("http://{}", running.addr);

    let given = http
        .get(format!("{base}/healthz"))
        .header("x-request-id", "caller-chose-this-1")
        .send()
        .await
        .unwrap();
    assert_eq!(given.status(), 200);
    assert_eq!(given.headers()["x-request-id"], "caller-chose-this-1");

    // Made up when absent, on errors too (an unknown route).
    for path in ["/healthz", "/api/v1/no-such-route"] {
        let answer = http.get(format!("{base}{path}")).send().await.unwrap();
        let id = answer.headers()["x-request-id"]
            .to_str()
            .unwrap()
            .to_owned();
        uuid::Uuid::parse_str(&id)
            .unwrap_or_else(|e| panic!("{path}: x-request-id {id:?} is not a UUID: {e}"));
    }
    let one = http.get(format!("{base}/healthz")).send().await.unwrap();
    let two = http.get(format!("{base}/healthz")).send().await.unwrap();
    assert_ne!(
        one.headers()["x-request-id"],
        two.headers()["x-request-id"],
        "each request gets its own id"
    );
    running.shutdown().await;
}

/// A client that sends its headers and then only part of the body it announced: the handler
/// waits for the rest, and the timeout answers instead.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_past_the_timeout_gets_503_in_the_error_shape() {
    let running = start_server(env_with(&[("SHEAF_REQUEST_TIMEOUT", "1s")])).await;
    let mut stream = TcpStream::connect(running.addr).await.unwrap();
    stream
        .write_all(
            b"POST /api/v1/publish HTTP/1.1\r\nhost: sheaf\r\ncontent-type: application/json\r\n\
              content-length: 200\r\nx-request-id: slow-client-7\r\n\r\n{\"tenant_id\":",
        )
        .await
        .unwrap();
    let mut answer = Vec::new();
    let mut buf = [0u8; 4096];
    // Bounded: the answer comes after ~1 s; past 15 s the test fails instead of hanging.
    let read = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            let n = stream.read(&mut buf).await.unwrap();
            answer.extend_from_slice(&buf[..n]);
            let text = String::from_utf8_lossy(&answer);
            if n == 0 || text.contains("\"message\"") && text.ends_with('}') {
                break;
            }
        }
    })
    .await;
    assert!(
        read.is_ok(),
        "no answer within 15 s: {:?}",
        String::from_utf8_lossy(&answer)
    );
    let text = String::from_utf8_lossy(&answer).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").expect("a whole response");
    assert!(head.starts_with("HTTP/1.1 503"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("x-request-id: slow-client-7"),
        "{head}"
    );
    let body: Value = serde_json::from_str(body).expect("the error shape is JSON");
    assert_eq!(body["error"]["code"], "request_timeout", "{body}");

    // A request within the timeout is answered as usual.
    let client = Client::new(running.addr);
    assert_eq!(client.get("/healthz").await.status, 200);
    running.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_parse_and_carry_the_request_span() {
    let sheaf = spawn_sheaf(&[
        ("SHEAF_LOG_FORMAT", "json"),
        // tower-http's per-request lines, written inside the request's span.
        ("SHEAF_LOG", "info,tower_http=debug"),
    ])
    .await;
    let answer = reqwest::Client::new()
        .get(sheaf.url("/healthz"))
        .header("x-request-id", "json-log-request-3")
        .send()
        .await
        .unwrap();
    assert_eq!(answer.status(), 200);
    // The response line is written as the answer leaves; give the log a moment to arrive.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !sheaf.log().contains("json-log-request-3") && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let log = sheaf.log();
    let lines: Vec<Value> = log
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert!(
        lines.iter().any(|l| l["level"] == "INFO"
            && l["message"]
                .as_str()
                .is_some_and(|m| m.contains("is listening on"))),
        "the start-up line is there as JSON:\n{log}"
    );
    let in_request: Vec<&Value> = lines
        .iter()
        .filter(|l| l["span"]["request_id"] == "json-log-request-3")
        .collect();
    assert!(
        !in_request.is_empty(),
        "no line carries the request's span:\n{log}"
    );
    for line in in_request {
        assert_eq!(line["span"]["path"], "/healthz", "{line}");
        assert!(line["timestamp"].is_string(), "{line}");
    }
    stop_clean(sheaf).await;
}
