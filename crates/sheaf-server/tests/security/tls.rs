//! TLS on the delivery side, against real peers on loopback: an HTTPS receiver with a
//! certificate of the test CA that `cargo xtask services up` made (`SHEAF_TEST_TLS_*`), also
//! standing in for an OTLP collector, and a small HTTP `CONNECT` proxy written here.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::{Value, json};
use sheaf_server::Config;
use sheaf_testenv::receiver::Receiver;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

use super::walk::{deliver_past_the_api, first_attempt};
use crate::support::{Client, env_with, spawn_sheaf, start_server, stop_clean};

const CA_VAR: &str = "SHEAF_TEST_TLS_CA_FILE";
const CERT_VAR: &str = "SHEAF_TEST_TLS_CERT_FILE";
const KEY_VAR: &str = "SHEAF_TEST_TLS_KEY_FILE";

/// The test CA, and the server certificate and key it signed (for `127.0.0.1` and `localhost`),
/// or `None` (skip) outside CI.
fn test_pki(test: &str) -> Option<(String, String, String)> {
    Some((
        sheaf_testenv::server_url(CA_VAR, test)?,
        sheaf_testenv::server_url(CERT_VAR, test)?,
        sheaf_testenv::server_url(KEY_VAR, test)?,
    ))
}

/// Reads one HTTP/1.1 request head (and its body, by `content-length`); `None` at end of stream.
async fn read_request<S: AsyncReadExt + Unpin>(stream: &mut S) -> Option<String> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 4096];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 || buf.len() > 64 * 1024 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let length: usize = head
        .lines()
        .find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("content-length")
                .then(|| value.trim().parse().ok())?
        })
        .unwrap_or(0);
    let mut body = buf.len() - head_end;
    while body < length {
        let n = stream.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        body += n;
    }
    Some(head)
}

/// An HTTPS receiver answering every request `200`, counting the requests that got through the
/// handshake.
struct HttpsReceiver {
    addr: SocketAddr,
    requests: Arc<AtomicUsize>,
}

impl HttpsReceiver {
    async fn start(bind: &str, cert: &str, key: &str) -> Self {
        let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
            .expect("the test certificate reads")
            .collect::<Result<_, _>>()
            .expect("the test certificate parses");
        let key = PrivateKeyDer::from_pem_file(key).expect("the test key reads");
        let config = rustls::ServerConfig::builder_with_provider(sheaf_tls::provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(chain, key)
            .expect("the test certificate and key match");
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind(bind).await.expect("the receiver binds");
        let addr = listener.local_addr().unwrap();
        let requests = Arc::new(AtomicUsize::new(0));
        let counted = requests.clone();
        tokio::spawn(async move {
            while let Ok((tcp, _)) = listener.accept().await {
                let acceptor = acceptor.clone();
                let counted = counted.clone();
                tokio::spawn(async move {
                    // A client that refuses the certificate ends the handshake: nothing counted.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    while read_request(&mut tls).await.is_some() {
                        counted.fetch_add(1, Ordering::SeqCst);
                        let answer = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok";
                        if tls.write_all(answer.as_bytes()).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        HttpsReceiver { addr, requests }
    }

    fn url(&self) -> String {
        format!("https://{}/hook", self.addr)
    }

    fn requests(&self) -> usize {
        self.requests.load(Ordering::SeqCst)
    }
}

/// An HTTP proxy that tunnels `CONNECT host:port` and refuses anything else, remembering every
/// request line it was sent.
struct ConnectProxy {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<String>>>,
}

impl ConnectProxy {
    async fn start() -> Self {
        let listener = TcpListener::bind("127.0.0.1:0")
            .await
            .expect("the proxy binds");
        let addr = listener.local_addr().unwrap();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let log = seen.clone();
        tokio::spawn(async move {
            while let Ok((mut client, _)) = listener.accept().await {
                let log = log.clone();
                tokio::spawn(async move {
                    let Some(head) = read_request(&mut client).await else {
                        return;
                    };
                    let line = head.lines().next().unwrap_or_default().to_owned();
                    log.lock().unwrap().push(line.clone());
                    let target = line
                        .strip_prefix("CONNECT ")
                        .and_then(|rest| rest.split(' ').next());
                    let upstream = match target {
                        Some(target) => TcpStream::connect(target).await.ok(),
                        None => None,
                    };
                    let Some(mut upstream) = upstream else {
                        let _ = client
                            .write_all(b"HTTP/1.1 502 Bad Gateway\r\ncontent-length: 0\r\n\r\n")
                            .await;
                        return;
                    };
                    if client
                        .write_all(b"HTTP/1.1 200 Connection Established\r\n\r\n")
                        .await
                        .is_ok()
                    {
                        let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
                    }
                });
            }
        });
        ConnectProxy { addr, seen }
    }

    fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    fn seen(&self) -> Vec<String> {
        self.seen.lock().unwrap().clone()
    }
}

/// Publishes one event to `tenant`'s destination at `url` on a server with `env`, and returns
/// its first attempt.
async fn deliver_once(env: &[(&str, &str)], tenant: &str, url: &str) -> Value {
    let mut settings = vec![("SHEAF_RETRY_MAX_ATTEMPTS", "1")];
    settings.extend_from_slice(env);
    let server = start_server(env_with(&settings)).await;
    let client = Client::new(server.addr);
    client.tenant_with_destination(tenant, url).await;
    let published = client.publish(tenant, "tls-1", json!({ "n": 1 })).await;
    assert_eq!(published.status, 202, "{published:?}");
    let attempt = first_attempt(&client, tenant, "tls-1").await;
    server.shutdown().await;
    attempt
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_receiver_behind_a_private_ca_is_reached_only_when_the_ca_is_trusted() {
    let Some((ca, cert, key)) =
        test_pki("a_receiver_behind_a_private_ca_is_reached_only_when_the_ca_is_trusted")
    else {
        return;
    };
    let receiver = HttpsReceiver::start("127.0.0.1:0", &cert, &key).await;

    // The system's and the bundled roots do not know the test CA.
    let refused = deliver_once(&[], "tls-untrusted", &receiver.url()).await;
    println!("without the CA: {refused}");
    assert_eq!(refused["status"], "failed", "{refused}");
    let error = refused["error"].as_str().unwrap_or_default();
    assert!(error.contains("not signed by a trusted CA"), "{error}");
    assert_eq!(receiver.requests(), 0, "no request got past the handshake");

    let delivered = deliver_once(
        &[("SHEAF_TLS_CA_FILE", &ca)],
        "tls-trusted",
        &receiver.url(),
    )
    .await;
    assert_eq!(delivered["status"], "success", "{delivered}");
    assert_eq!(delivered["response_code"], 200, "{delivered}");
    assert_eq!(receiver.requests(), 1);

    // A trusted certificate issued for another host is still refused: this one names
    // 127.0.0.1 and localhost, and the receiver now answers on 127.0.0.2.
    let elsewhere = HttpsReceiver::start("127.0.0.2:0", &cert, &key).await;
    let mismatch = deliver_once(
        &[("SHEAF_TLS_CA_FILE", &ca)],
        "tls-elsewhere",
        &elsewhere.url(),
    )
    .await;
    let error = mismatch["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("not issued for this host name"),
        "{mismatch}"
    );
    assert_eq!(elsewhere.requests(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deliveries_go_through_the_egress_proxy_and_the_guard_still_holds() {
    let Some((ca, cert, key)) =
        test_pki("deliveries_go_through_the_egress_proxy_and_the_guard_still_holds")
    else {
        return;
    };
    let receiver = HttpsReceiver::start("127.0.0.1:0", &cert, &key).await;
    let proxy = ConnectProxy::start().await;

    // Guard off: the delivery is tunnelled through the proxy to the receiver.
    let proxy_url = proxy.url();
    let through = deliver_once(
        &[
            ("SHEAF_EGRESS_PROXY", &proxy_url),
            ("SHEAF_TLS_CA_FILE", &ca),
        ],
        "proxied",
        &receiver.url(),
    )
    .await;
    assert_eq!(through["status"], "success", "{through}");
    assert_eq!(receiver.requests(), 1);
    assert_eq!(
        proxy.seen(),
        vec![format!("CONNECT {} HTTP/1.1", receiver.addr)],
        "the one delivery went through the proxy"
    );

    // Guard on, through the same proxy: destinations on loopback must be refused before the
    // proxy is asked. The proxy itself is on loopback, which is allowed: the operator chose it.
    let port = receiver.addr.port();
    let plain = Receiver::start().await.expect("the receiver binds");
    let targets = [
        ("name", format!("https://localhost:{port}/hook")),
        ("literal", format!("https://127.0.0.1:{port}/hook")),
        (
            "plain",
            format!("http://127.0.0.1:{}/hook", plain.addr.port()),
        ),
    ];
    let env = [
        ("SHEAF_EGRESS_PROXY", proxy_url.as_str()),
        ("SHEAF_TLS_CA_FILE", &ca),
    ];
    for (name, attempt) in deliver_past_the_api(&env, &targets).await {
        assert_eq!(attempt["status"], "failed", "{name}: {attempt}");
        let error = attempt["error"].as_str().unwrap_or_default();
        assert!(
            error.contains("refused before connecting"),
            "{name}: {error}"
        );
        assert!(error.contains("not a public address"), "{name}: {error}");
    }
    assert_eq!(
        proxy.seen().len(),
        1,
        "the proxy was never asked for a private destination"
    );
    assert_eq!(receiver.requests(), 1);
    assert!(plain.deliveries().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_database_certificate_from_another_ca_stops_start_up_in_words() {
    let test = "a_database_certificate_from_another_ca_stops_start_up_in_words";
    let (Some(url), Some(other)) = (
        sheaf_testenv::server_url("SHEAF_TEST_POSTGRES_TLS_URL", test),
        sheaf_testenv::server_url("SHEAF_TEST_TLS_OTHER_CA_FILE", test),
    ) else {
        return;
    };
    let (base, _) = url.split_once('?').unwrap();
    let wrong = format!("{base}?sslmode=verify-full&sslrootcert={other}");
    let config = Config::load(env_with(&[
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", &wrong),
        ("SHEAF_POSTGRES_SCHEMA", &sheaf_testenv::unique_name("tls")),
    ]))
    .unwrap();
    let Err(err) = sheaf_server::start(config).await else {
        panic!("start-up must stop");
    };
    let message = format!("{err:#}");
    println!("{message}");
    assert!(message.contains("SHEAF_POSTGRES_URL"), "{message}");
    assert!(
        message.contains("TLS: the server's certificate is not signed by a trusted CA"),
        "{message}"
    );
}

/// The OTLP exporter of the real binary trusts `SHEAF_TLS_CA_FILE` like every other client: an
/// HTTPS collector behind the test CA gets the spans. (The receiver here only counts requests
/// that got through the handshake; `traces.rs` checks what an export holds.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_otlp_exporter_reaches_a_collector_behind_a_private_ca() {
    let Some((ca, cert, key)) =
        test_pki("the_otlp_exporter_reaches_a_collector_behind_a_private_ca")
    else {
        return;
    };
    let collector = HttpsReceiver::start("127.0.0.1:0", &cert, &key).await;
    let endpoint = format!("https://{}", collector.addr);
    let sheaf = spawn_sheaf(&[
        ("SHEAF_OTLP_ENDPOINT", &endpoint),
        ("SHEAF_TLS_CA_FILE", &ca),
    ])
    .await;
    let client = Client::new(sheaf.addr);
    // A request makes a span; the batch processor exports within its 5 s schedule, and at the
    // latest when the process stops.
    assert_eq!(client.get("/api/v1/tenants/otlp-tls").await.status, 404);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while collector.requests() == 0 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    stop_clean(sheaf).await;
    assert!(
        collector.requests() > 0,
        "no export got through the TLS handshake with the test CA trusted"
    );
}

#[tokio::test]
async fn a_ca_file_that_cannot_be_used_stops_start_up_by_name() {
    let dir = std::env::temp_dir().join(sheaf_testenv::unique_name("sheaf-ca"));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty.pem");
    std::fs::write(&empty, "no certificates here\n").unwrap();
    for (path, problem) in [
        (dir.join("missing.pem"), "cannot be read"),
        (empty, "holds no PEM certificate"),
    ] {
        let err =
            Config::load(env_with(&[("SHEAF_TLS_CA_FILE", path.to_str().unwrap())])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_TLS_CA_FILE");
        assert!(err.message.contains(problem), "{err}");
        assert!(err.message.contains(path.to_str().unwrap()), "{err}");
    }
    std::fs::remove_dir_all(dir).unwrap();
}
