//! The message brokers: the shared ones `cargo xtask services up` runs let the suites in
//! (RabbitMQ's `guest` on the default vhost, NATS with JetStream), and a test's own (the
//! `brokers` feature) stop, crash and come back on the same port with their JetStream streams
//! and durable queues.
//!
//! The brokers are spoken to with the few frames of their wire protocols these checks need,
//! written out below, so this crate's tests need no broker client.

use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::time::Duration;

/// The parts of a `scheme://user:password@host:port/path` URL these tests use.
struct Url {
    user: String,
    password: String,
    port: u16,
    path: String,
}

fn parse_url(url: &str) -> Url {
    let rest = url.split_once("://").expect("a scheme").1;
    let (authority, path) = rest.split_once('/').unwrap_or((rest, ""));
    let (userinfo, host_port) = authority.rsplit_once('@').unwrap_or(("", authority));
    let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
    let port = host_port
        .rsplit_once(':')
        .expect("a port")
        .1
        .parse()
        .expect("a numeric port");
    Url {
        user: user.to_owned(),
        password: password.to_owned(),
        port,
        path: path.replace("%2f", "/").replace("%2F", "/"),
    }
}

fn other(message: String) -> std::io::Error {
    std::io::Error::other(message)
}

/// An AMQP 0-9-1 connection with channel 1 open: just enough of the protocol to log in and
/// declare a queue.
struct Amqp {
    stream: TcpStream,
}

fn shortstr(buf: &mut Vec<u8>, text: &str) {
    buf.push(u8::try_from(text.len()).expect("a short string"));
    buf.extend_from_slice(text.as_bytes());
}

impl Amqp {
    /// Logs in with PLAIN on `vhost`, and opens channel 1.
    fn connect(port: u16, user: &str, password: &str, vhost: &str) -> std::io::Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut amqp = Self { stream };
        amqp.stream.write_all(b"AMQP\x00\x00\x09\x01")?;
        amqp.expect(0, (10, 10), "connection.start")?;
        // Start-Ok: no client properties, PLAIN, "\0user\0password", locale.
        let mut args = 0u32.to_be_bytes().to_vec();
        shortstr(&mut args, "PLAIN");
        let response = format!("\0{user}\0{password}");
        args.extend_from_slice(&u32::try_from(response.len()).unwrap().to_be_bytes());
        args.extend_from_slice(response.as_bytes());
        shortstr(&mut args, "en_US");
        amqp.send(0, (10, 11), &args)?;
        // Tune-Ok with the server's channel-max and frame-max, and no heartbeats.
        let tune = amqp.expect(0, (10, 30), "connection.tune (was the login refused?)")?;
        let mut tune_ok = tune
            .get(..6)
            .ok_or_else(|| other("short tune".into()))?
            .to_vec();
        tune_ok.extend_from_slice(&[0, 0]);
        amqp.send(0, (10, 31), &tune_ok)?;
        let mut open = Vec::new();
        shortstr(&mut open, vhost);
        shortstr(&mut open, "");
        open.push(0);
        amqp.send(0, (10, 40), &open)?;
        amqp.expect(0, (10, 41), "connection.open-ok")?;
        amqp.send(1, (20, 10), &[0])?;
        amqp.expect(1, (20, 11), "channel.open-ok")?;
        Ok(amqp)
    }

    /// Declares `queue` on channel 1 (`passive`: only if it exists); `Err` with the server's
    /// reason when it closes the channel instead.
    fn declare_queue(
        &mut self,
        queue: &str,
        passive: bool,
        durable: bool,
        exclusive: bool,
    ) -> std::io::Result<()> {
        let mut args = vec![0, 0];
        shortstr(&mut args, queue);
        args.push(u8::from(passive) | u8::from(durable) << 1 | u8::from(exclusive) << 2);
        args.extend_from_slice(&0u32.to_be_bytes());
        self.send(1, (50, 10), &args)?;
        self.expect(1, (50, 11), "queue.declare-ok").map(|_| ())
    }

    /// Closes the connection politely (so the broker logs no warning about it).
    fn close(mut self) -> std::io::Result<()> {
        let mut args = 200u16.to_be_bytes().to_vec();
        shortstr(&mut args, "bye");
        args.extend_from_slice(&[0, 0, 0, 0]);
        self.send(0, (10, 50), &args)?;
        self.expect(0, (10, 51), "connection.close-ok").map(|_| ())
    }

    fn send(
        &mut self,
        channel: u16,
        (class, method): (u16, u16),
        args: &[u8],
    ) -> std::io::Result<()> {
        let mut payload = class.to_be_bytes().to_vec();
        payload.extend_from_slice(&method.to_be_bytes());
        payload.extend_from_slice(args);
        let mut frame = vec![1];
        frame.extend_from_slice(&channel.to_be_bytes());
        frame.extend_from_slice(&u32::try_from(payload.len()).unwrap().to_be_bytes());
        frame.extend_from_slice(&payload);
        frame.push(0xCE);
        self.stream.write_all(&frame)
    }

    /// The next method frame's arguments, which must be `want` on `channel`; a
    /// `connection.close` or `channel.close` becomes an error with its reply code and text.
    fn expect(&mut self, channel: u16, want: (u16, u16), what: &str) -> std::io::Result<Vec<u8>> {
        loop {
            let mut head = [0u8; 7];
            self.stream.read_exact(&mut head)?;
            let size = u32::from_be_bytes(head[3..7].try_into().unwrap()) as usize;
            let mut payload = vec![0u8; size + 1];
            self.stream.read_exact(&mut payload)?;
            if head[0] != 1 {
                continue; // not a method frame (a heartbeat)
            }
            let got_channel = u16::from_be_bytes([head[1], head[2]]);
            let class = u16::from_be_bytes([payload[0], payload[1]]);
            let method = u16::from_be_bytes([payload[2], payload[3]]);
            let args = payload[4..size].to_vec();
            if (class, method) == want && got_channel == channel {
                return Ok(args);
            }
            if matches!((class, method), (10, 50) | (20, 40)) && args.len() >= 3 {
                let code = u16::from_be_bytes([args[0], args[1]]);
                let len = usize::from(args[2]);
                let text = String::from_utf8_lossy(&args[3..(3 + len).min(args.len())]);
                return Err(other(format!(
                    "expected {what}, the server closed: {code} {text}"
                )));
            }
            return Err(other(format!(
                "expected {what}, got method {class}.{method} on channel {got_channel}"
            )));
        }
    }
}

/// One request on a NATS server: publishes `payload` to `subject` with a reply inbox and
/// returns the reply's payload (the JetStream API answers this way, and so does a stream with
/// its publish acknowledgement).
fn nats_request(port: u16, subject: &str, payload: &str) -> std::io::Result<String> {
    let stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut reader = BufReader::new(stream.try_clone()?);
    let mut writer = stream;
    let mut line = String::new();
    reader.read_line(&mut line)?;
    if !line.starts_with("INFO ") {
        return Err(other(format!("not a NATS greeting: {line:?}")));
    }
    write!(
        writer,
        "CONNECT {{\"verbose\":false,\"pedantic\":false}}\r\nSUB _INBOX.sheaf 1\r\nPUB {subject} _INBOX.sheaf {}\r\n{payload}\r\n",
        payload.len()
    )?;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            return Err(other("the server closed the connection".into()));
        }
        let words: Vec<&str> = line.split_whitespace().collect();
        match words.as_slice() {
            ["PING"] => writer.write_all(b"PONG\r\n")?,
            ["MSG", _, _, size] => {
                let size: usize = size
                    .parse()
                    .map_err(|_| other(format!("bad MSG line {line:?}")))?;
                let mut body = vec![0u8; size + 2];
                reader.read_exact(&mut body)?;
                body.truncate(size);
                return Ok(String::from_utf8_lossy(&body).into_owned());
            }
            ["-ERR", ..] => return Err(other(format!("the server said {}", line.trim()))),
            _ => {}
        }
    }
}

#[test]
fn the_shared_rabbitmq_lets_the_url_s_user_in_and_declares_a_queue() {
    let test = "the_shared_rabbitmq_lets_the_url_s_user_in_and_declares_a_queue";
    let url = sheaf_testenv::require_rabbitmq!(test);
    let url = parse_url(&url);
    let mut amqp = Amqp::connect(url.port, &url.user, &url.password, &url.path)
        .expect("log in to the shared RabbitMQ with the URL's user on its vhost");
    // Exclusive: the broker removes it with the connection, so the shared node keeps nothing.
    let queue = sheaf_testenv::unique_name("sheaf_harness");
    amqp.declare_queue(&queue, false, false, true)
        .expect("declare a queue");
    amqp.close().expect("close the connection");
}

#[test]
fn the_shared_nats_server_answers_with_jetstream() {
    let test = "the_shared_nats_server_answers_with_jetstream";
    let url = sheaf_testenv::require_nats!(test);
    let port = parse_url(&url).port;
    let account = nats_request(port, "$JS.API.INFO", "").expect("ask JetStream for the account");
    assert!(
        account.contains("io.nats.jetstream.api.v1.account_info_response")
            && !account.contains("\"error\""),
        "JetStream must answer on the shared server: {account}"
    );
}

#[cfg(feature = "brokers")]
mod private {
    //! A test's own brokers stop (gracefully and by a crash) and come back.

    use super::{Amqp, nats_request};
    use sheaf_testenv::brokers::{self, NatsServer, RabbitServer, accepts, nats_info};
    use std::path::PathBuf;
    use std::time::Instant;

    /// Whether the broker's binary is there: outside CI a missing one skips the test with a
    /// printed line; under CI it fails it, as a missing server variable does.
    fn available(binary: anyhow::Result<PathBuf>, test: &str) -> bool {
        match binary {
            Ok(_) => true,
            Err(err) if sheaf_testenv::in_ci() => {
                panic!("{test}: {err:#}; under CI a test that needs a broker must not skip")
            }
            Err(err) => {
                println!("skipping {test}: {err:#}");
                false
            }
        }
    }

    const STREAM: &str = "SHEAF_RESTART";

    fn stream_info(nats: &NatsServer) -> String {
        nats_request(nats.port(), &format!("$JS.API.STREAM.INFO.{STREAM}"), "")
            .expect("ask for the stream")
    }

    #[test]
    fn a_private_nats_server_comes_back_on_its_port_with_its_stream() {
        let test = "a_private_nats_server_comes_back_on_its_port_with_its_stream";
        if !available(brokers::nats_server_binary(), test) {
            return;
        }
        let began = Instant::now();
        let mut nats = NatsServer::start().expect("start a NATS server");
        println!("{test}: started in {:?}", began.elapsed());
        let (port, url) = (nats.port(), nats.url());
        let info = nats_info(port).expect("the server greets a client");
        assert!(
            info.contains(r#""jetstream":true"#),
            "JetStream is on: {info}"
        );

        let created = nats_request(
            port,
            &format!("$JS.API.STREAM.CREATE.{STREAM}"),
            &format!(r#"{{"name":"{STREAM}","subjects":["sheaf.restart.>"],"storage":"file"}}"#),
        )
        .expect("create a stream");
        assert!(!created.contains("\"error\""), "{created}");
        let ack = nats_request(port, "sheaf.restart.one", "kept").expect("publish to the stream");
        assert!(ack.contains(&format!(r#""stream":"{STREAM}""#)), "{ack}");

        let began = Instant::now();
        nats.stop().expect("stop the server");
        println!("{test}: stopped in {:?}", began.elapsed());
        assert!(nats.pid().is_none());
        assert!(
            !accepts(port),
            "nothing listens on {port} once the server stopped"
        );

        let began = Instant::now();
        nats.restart().expect("start the server again");
        println!("{test}: restarted in {:?}", began.elapsed());
        assert_eq!(nats.url(), url, "the same URL after a restart");
        let info = stream_info(&nats);
        assert!(
            info.contains(r#""messages":1"#),
            "the stream and its message survive a stop: {info}"
        );

        nats.kill();
        assert!(
            !accepts(port),
            "nothing listens on {port} once the server was killed"
        );
        let began = Instant::now();
        nats.restart()
            .expect("start the server again after a crash");
        println!("{test}: restarted after SIGKILL in {:?}", began.elapsed());
        let info = stream_info(&nats);
        assert!(
            info.contains(&format!(r#""name":"{STREAM}""#)) && !info.contains("\"error\""),
            "the stream survives a crash: {info}"
        );
    }

    #[test]
    fn a_private_rabbitmq_comes_back_on_its_port_with_its_durable_queue() {
        let test = "a_private_rabbitmq_comes_back_on_its_port_with_its_durable_queue";
        if !available(brokers::rabbitmq_server_binary(), test) {
            return;
        }
        let began = Instant::now();
        let mut rabbit = RabbitServer::start().expect("start a RabbitMQ node");
        println!("{test}: {} started in {:?}", rabbit.node(), began.elapsed());
        let (port, url) = (rabbit.port(), rabbit.url());
        let login = || Amqp::connect(port, "guest", "guest", "/");
        let mut amqp = login().expect("log in as guest");
        amqp.declare_queue("sheaf.durable", false, true, false)
            .expect("declare a durable queue");
        amqp.close().expect("close the connection");

        let began = Instant::now();
        rabbit.stop().expect("stop the node");
        println!("{test}: stopped in {:?}", began.elapsed());
        assert!(rabbit.pid().is_none());
        assert!(
            !accepts(port),
            "nothing listens on {port} once the node stopped"
        );

        let began = Instant::now();
        rabbit.restart().expect("start the node again");
        println!("{test}: restarted in {:?}", began.elapsed());
        assert_eq!(rabbit.url(), url, "the same URL after a restart");
        let mut amqp = login().expect("log in again");
        amqp.declare_queue("sheaf.durable", true, true, false)
            .expect("the durable queue survives a stop");
        amqp.close().expect("close the connection");

        rabbit.kill();
        assert!(
            !accepts(port),
            "nothing listens on {port} once the node was killed"
        );
        let began = Instant::now();
        rabbit
            .restart()
            .expect("start the node again after a crash");
        println!("{test}: restarted after SIGKILL in {:?}", began.elapsed());
        let mut amqp = login().expect("log in after the crash");
        amqp.declare_queue("sheaf.durable", true, true, false)
            .expect("the durable queue survives a crash");
        let missing = amqp.declare_queue("sheaf.never_declared", true, true, false);
        assert!(
            missing.is_err_and(|err| err.to_string().contains("404")),
            "a passive declare of a queue nobody declared is refused, so the one above proves something"
        );
    }
}
