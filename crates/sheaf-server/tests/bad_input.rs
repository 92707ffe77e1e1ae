//! Bad input, refused with a 4xx in the API's error shape and never a 5xx or a crash:
//! oversized bodies (declared and chunked), deep JSON, invalid UTF-8, huge headers, unknown
//! fields, absurd pagination limits and bad cursors (on every configured log store).

use std::net::SocketAddr;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use crate::support::{Answer, Client, env_with, start_server};

const KEY: &str = "bad-input-admin-key-0123456789";

/// Sends raw bytes as one HTTP/1.1 request and reads the answer until the server closes
/// (`Connection: close` is in every request here), at most 10 s. Returns the status (0 when
/// the server closed without one) and the body.
async fn raw_request(addr: SocketAddr, request: &[u8]) -> (u16, Vec<u8>) {
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    // The server may answer and close before it has read everything (a body over the limit):
    // a failed write is not the test's failure, the answer is.
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    let text = String::from_utf8_lossy(&answer);
    let status = text
        .strip_prefix("HTTP/1.1 ")
        .and_then(|rest| rest.get(..3))
        .and_then(|code| code.parse().ok())
        .unwrap_or(0);
    let body = match answer.windows(4).position(|w| w == b"\r\n\r\n") {
        Some(at) => answer[at + 4..].to_vec(),
        None => Vec::new(),
    };
    (status, body)
}

/// The `code` of an error body, whether sent whole or in one chunk.
fn error_code(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let start = text.find('{').unwrap_or(0);
    let end = text.rfind('}').map_or(text.len(), |e| e + 1);
    serde_json::from_str::<Value>(&text[start..end])
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_owned))
        .unwrap_or_default()
}

fn assert_error(answer: &Answer, status: u16, code: &str) {
    assert_eq!(answer.status, status, "{answer:?}");
    assert_eq!(answer.error_code(), code, "{answer:?}");
    assert!(
        answer.body["error"]["message"].is_string(),
        "the error shape: {answer:?}"
    );
}

fn nested(depth: usize) -> Vec<u8> {
    let mut body = br#"{"tenant_id":"t1","topic":"deep","data":"#.to_vec();
    body.extend(std::iter::repeat_n(b'[', depth));
    body.extend(std::iter::repeat_n(b']', depth));
    body.push(b'}');
    body
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bodies_too_large_too_deep_or_not_utf8_are_refused() {
    let server = start_server(env_with(&[
        ("SHEAF_API_KEY", KEY),
        ("SHEAF_MAX_BODY_BYTES", "65536"),
    ]))
    .await;
    let admin = Client::new(server.addr).with_key(KEY);
    assert_eq!(
        admin.send("PUT", "/api/v1/tenants/t1", None).await.status,
        201
    );

    // Declared too large: 413 before the body is read.
    let big = json!({ "tenant_id": "t1", "topic": "x", "data": "a".repeat(100_000) });
    assert_error(
        &admin.send("POST", "/api/v1/publish", Some(big)).await,
        413,
        "payload_too_large",
    );
    // Chunked, with no length announced: cut off at the limit, still 413.
    let mut chunked = format!(
        "POST /api/v1/publish HTTP/1.1\r\nHost: sheaf\r\nAuthorization: Bearer {KEY}\r\n\
         Content-Type: application/json\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n"
    )
    .into_bytes();
    let piece = vec![b' '; 16 * 1024];
    for _ in 0..8 {
        chunked.extend(format!("{:x}\r\n", piece.len()).as_bytes());
        chunked.extend(&piece);
        chunked.extend(b"\r\n");
    }
    chunked.extend(b"0\r\n\r\n");
    let (status, body) = raw_request(server.addr, &chunked).await;
    assert_eq!(status, 413, "{}", String::from_utf8_lossy(&body));
    assert_eq!(error_code(&body), "payload_too_large");

    // Deep JSON: serde_json stops at 128 levels with an error, never a stack overflow; 10,000
    // and 30,000 levels (60 KB) are a plain 400.
    for depth in [129, 10_000, 30_000] {
        let answer = admin
            .send_raw("POST", "/api/v1/publish", Some(nested(depth)))
            .await;
        assert_error(&answer, 400, "malformed_json");
        assert!(
            answer.body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("recursion limit"),
            "{answer:?}"
        );
    }
    // Deep JSON where a handler expects something else entirely: the same.
    let mut deep_patch = b"{\"headers\":".to_vec();
    deep_patch.extend(std::iter::repeat_n(b'{', 20_000));
    let answer = admin
        .send_raw("POST", "/api/v1/tenants/t1/destinations", Some(deep_patch))
        .await;
    assert_error(&answer, 400, "malformed_json");
    // 100 levels are data like any other.
    assert_eq!(
        admin
            .send_raw("POST", "/api/v1/publish", Some(nested(100)))
            .await
            .status,
        202
    );

    // Invalid UTF-8 in a string, outside strings, in the path, in the query, in a header.
    for body in [
        b"{\"tenant_id\":\"t1\",\"topic\":\"x\",\"data\":\"\xff\xfe\"}".to_vec(),
        b"{\"tenant_id\":\"t1\",\"topic\":\"x\",\"data\":\xc3\x28}".to_vec(),
        b"\xef\xbb\xbf{}".to_vec(),
    ] {
        let answer = admin.send_raw("POST", "/api/v1/publish", Some(body)).await;
        assert_error(&answer, 400, "malformed_json");
    }
    assert_error(
        &admin.get("/api/v1/tenants/%FF%FE").await,
        400,
        "invalid_request",
    );
    // Query strings are decoded leniently (invalid UTF-8 becomes U+FFFD): a filter on such a
    // topic matches nothing.
    let lenient = admin.get("/api/v1/tenants/t1/events?topic=%FF").await;
    assert_eq!(lenient.status, 200, "{lenient:?}");
    assert_eq!(lenient.body["items"], json!([]));
    let raw = format!(
        "GET /api/v1/tenants/t1 HTTP/1.1\r\nHost: sheaf\r\nAuthorization: Bearer \u{ff}{KEY}\r\nConnection: close\r\n\r\n"
    );
    // U+00FF is two bytes of UTF-8 (not ASCII, so not a header string); a lone 0xFF too.
    let mut lone = raw.clone().into_bytes();
    if let Some(at) = lone.windows(2).position(|w| w == "\u{ff}".as_bytes()) {
        lone.splice(at..at + 2, [0xff]);
    }
    for request in [raw.into_bytes(), lone] {
        let (status, body) = raw_request(server.addr, &request).await;
        assert_eq!(status, 401, "{}", String::from_utf8_lossy(&body));
        assert_eq!(error_code(&body), "unauthorized");
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn huge_headers_are_refused_by_the_http_layer_and_the_server_lives_on() {
    let server = start_server(env_with(&[("SHEAF_API_KEY", KEY)])).await;
    let anonymous = Client::new(server.addr);
    // A large Authorization header the HTTP layer accepts: hashed and compared like any other.
    let long_key = Client::new(server.addr).with_key(&"k".repeat(64 * 1024));
    assert_error(
        &long_key.get("/api/v1/tenants/t1").await,
        401,
        "unauthorized",
    );
    let long_token =
        Client::new(server.addr).with_key(&format!("sheaf_tt1_{}", "a".repeat(64 * 1024)));
    assert_error(
        &long_token.get("/api/v1/tenants/t1").await,
        401,
        "unauthorized",
    );

    // Past hyper's limits (about 400 KiB of head, 100 fields) the request never reaches a
    // route: hyper answers 431 with an empty body and closes. That answer is the HTTP layer's,
    // not the API's, which is why it is not in the JSON shape (docs/api.md says so).
    let mut huge = b"GET /healthz HTTP/1.1\r\nHost: sheaf\r\nConnection: close\r\nX-Big: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 1024 * 1024));
    huge.extend(b"\r\n\r\n");
    let (status, _) = raw_request(server.addr, &huge).await;
    assert!(status == 431 || status == 0, "status {status}");
    let mut many = b"GET /healthz HTTP/1.1\r\nHost: sheaf\r\nConnection: close\r\n".to_vec();
    for i in 0..500 {
        many.extend(format!("X-Field-{i}: v\r\n").as_bytes());
    }
    many.extend(b"\r\n");
    let (status, _) = raw_request(server.addr, &many).await;
    assert!(status == 431 || status == 0, "status {status}");
    println!("1 MiB header and 500 header fields: answered {status} by hyper");
    assert_eq!(anonymous.get("/healthz").await.status, 200, "still serving");
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_fields_are_refused_by_name_and_bodies_must_be_objects() {
    let server = start_server(env_with(&[("SHEAF_API_KEY", KEY)])).await;
    let admin = Client::new(server.addr).with_key(KEY);
    assert_eq!(
        admin.send("PUT", "/api/v1/tenants/t1", None).await.status,
        201
    );
    for (method, path, body, field) in [
        (
            "POST",
            "/api/v1/publish",
            json!({ "tenant_id": "t1", "topic": "x", "data": 1, "idempotency_key": "k" }),
            "idempotency_key",
        ),
        ("PUT", "/api/v1/tenants/t1", json!({ "meta": {} }), "meta"),
        (
            "POST",
            "/api/v1/tenants/t1/retry",
            json!({ "event_id": "e", "destination_id": "d", "force": true }),
            "force",
        ),
    ] {
        let answer = admin.send(method, path, Some(body)).await;
        assert_error(&answer, 400, "invalid_request");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(
            message.contains(&format!("unknown field `{field}`")),
            "{message}"
        );
    }
    // A destination's `config` belongs to its type, which names an unknown field its own way.
    let answer = admin
        .send(
            "POST",
            "/api/v1/tenants/t1/destinations",
            Some(json!({ "type": "webhook", "topics": ["*"], "config": { "url": "http://127.0.0.1:1/", "timeout": 5 } })),
        )
        .await;
    assert_error(&answer, 400, "invalid_config");
    let message = answer.body["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("config.timeout: is not a field of this destination type"),
        "{message}"
    );
    // `null` is not a value for a field the document does not make nullable: refused, not
    // read as "absent" (a PATCH's `filter` is the nullable one: null removes it).
    let created = admin
        .send(
            "POST",
            "/api/v1/tenants/t1/destinations",
            Some(json!({ "type": "webhook", "topics": ["*"], "config": { "url": "http://127.0.0.1:1/" } })),
        )
        .await;
    assert_eq!(created.status, 201, "{created:?}");
    let path = format!(
        "/api/v1/tenants/t1/destinations/{}",
        created.body["id"].as_str().unwrap()
    );
    for (method, path, body) in [
        (
            "POST",
            "/api/v1/tenants/t1/destinations",
            json!({ "type": "webhook", "topics": ["*"], "config": { "url": "http://127.0.0.1:1/" }, "enabled": null }),
        ),
        ("PATCH", path.as_str(), json!({ "enabled": null })),
        ("PATCH", path.as_str(), json!({ "topics": null })),
    ] {
        let answer = admin.send(method, path, Some(body.clone())).await;
        assert_error(&answer, 400, "invalid_request");
        let message = answer.body["error"]["message"].as_str().unwrap();
        assert!(message.contains("invalid type: null"), "{body}: {message}");
    }
    // Inside `config` the destination's type checks: a null URL is no URL.
    let answer = admin
        .send("PATCH", &path, Some(json!({ "config": { "url": null } })))
        .await;
    assert_error(&answer, 400, "invalid_config");
    assert_eq!(
        answer.body["error"]["message"], "config.url: must be a string",
        "{answer:?}"
    );
    // An array of a struct's fields is not an object, even where serde would take it.
    let answer = admin
        .send_raw(
            "PATCH",
            "/api/v1/tenants/t1/destinations/00000000-0000-7000-8000-000000000000",
            Some(b"[null, null]".to_vec()),
        )
        .await;
    assert_error(&answer, 400, "invalid_request");
    // Tenant ids that URL clients fold away as dot segments are refused.
    for id in [".", ".."] {
        let answer = admin
            .send(
                "POST",
                "/api/v1/publish",
                Some(json!({ "tenant_id": id, "topic": "x", "data": 1 })),
            )
            .await;
        assert_error(&answer, 400, "invalid_request");
    }
    // Unknown query parameters are ignored (proxies and caches add their own).
    assert_eq!(
        admin
            .get("/api/v1/tenants/t1/events?cache_buster=1&limit=5")
            .await
            .status,
        200
    );
    server.shutdown().await;
}

/// Pagination limits and cursors that are wrong in every way, on the log store `env` names:
/// always a 400 in the error shape (or a 200 for an empty filter), never a 5xx.
async fn check_pagination(env: std::collections::HashMap<String, String>, label: &str) {
    let server = start_server(env).await;
    let admin = Client::new(server.addr).with_key(KEY);
    assert_eq!(
        admin.send("PUT", "/api/v1/tenants/pg1", None).await.status,
        201
    );
    for i in 0..3 {
        assert_eq!(
            admin
                .publish("pg1", &format!("p-{i}"), json!({}))
                .await
                .status,
            202
        );
    }
    let listings = [
        "/api/v1/tenants/pg1/events",
        "/api/v1/tenants/pg1/attempts",
        "/api/v1/tenants/pg1/dead-letters",
    ];
    for listing in listings {
        for limit in [
            "-1",
            "0",
            "1001",
            "4294967296",
            "99999999999999999999999",
            "1.5",
            "abc",
            "",
        ] {
            let answer = admin.get(&format!("{listing}?limit={limit}")).await;
            assert_error(&answer, 400, "invalid_request");
        }
        assert_eq!(
            admin.get(&format!("{listing}?limit=1000")).await.status,
            200
        );
    }
    // A real cursor of the events listing, to misuse on the others.
    let first = admin.get("/api/v1/tenants/pg1/events?limit=1").await;
    let event_cursor = first.body["next"].as_str().unwrap().to_owned();
    let encode = |raw: &str| {
        use base64::Engine as _;
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(raw)
    };
    let cursors = [
        "zzz".to_owned(),
        "%FF".to_owned(),
        "!!!!".to_owned(),
        encode("no-slash"),
        encode("123/"),
        encode("notanumber/x"),
        encode(&format!("{}/x", i64::MAX)),
        encode(&format!("{}/x", i64::MIN)),
        // In chrono's range, far outside Postgres's and ClickHouse's.
        encode("8000000000000000000/x"),
        encode("-8000000000000000000/x"),
        encode("1700000000000000/\u{0}"),
        "A".repeat(10_000),
    ];
    for listing in listings {
        for cursor in &cursors {
            let answer = admin.get(&format!("{listing}?next={cursor}")).await;
            assert!(
                answer.status == 400 || answer.status == 200,
                "{label} {listing} next={}: {answer:?}",
                &cursor[..cursor.len().min(40)]
            );
            if answer.status == 400 {
                assert_eq!(answer.error_code(), "invalid_request", "{answer:?}");
            }
        }
    }
    // An events cursor on the attempts and dead-letter listings names no attempt or job.
    for listing in &listings[1..] {
        let answer = admin.get(&format!("{listing}?next={event_cursor}")).await;
        assert!(
            answer.status == 400 || answer.status == 200,
            "{label} {listing}: {answer:?}"
        );
    }
    server.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absurd_limits_and_bad_cursors_are_400_on_every_log_store() {
    check_pagination(env_with(&[("SHEAF_API_KEY", KEY)]), "memory").await;
    if let Some(postgres) = sheaf_testenv::postgres_url("bad cursors on postgres") {
        let schema = sheaf_testenv::unique_name("badin");
        check_pagination(
            env_with(&[
                ("SHEAF_API_KEY", KEY),
                ("SHEAF_QUEUE", "postgres"),
                ("SHEAF_LOG_STORE", "postgres"),
                ("SHEAF_POSTGRES_URL", postgres.as_str()),
                ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
            ]),
            "postgres",
        )
        .await;
        let pool = sqlx::PgPool::connect(&postgres).await.unwrap();
        sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
            .execute(&pool)
            .await
            .unwrap();
    }
    if let Some(clickhouse) = sheaf_testenv::clickhouse_url("bad cursors on clickhouse") {
        let database = sheaf_testenv::unique_name("badin");
        check_pagination(
            env_with(&[
                ("SHEAF_API_KEY", KEY),
                ("SHEAF_LOG_STORE", "clickhouse"),
                ("SHEAF_CLICKHOUSE_URL", clickhouse.as_str()),
                ("SHEAF_CLICKHOUSE_DATABASE", database.as_str()),
            ]),
            "clickhouse",
        )
        .await;
    }
}
