//! schemathesis (PyPI, pinned in xtask's `PYTHON_REQUIREMENTS`) against the OpenAPI document of
//! a server in this process: a bounded number of generated requests per operation, valid and
//! invalid, in its coverage, fuzzing and stateful phases, with every check on. The run fails on
//! any 5xx, any response that does not match the document (the error shape included), any
//! undocumented status or content type, and any request the auth scheme should refuse.
//!
//! Two checks are relaxed where JSON Schema cannot state the server's rule, and only there:
//! - `positive_data_acceptance` accepts a 400 on the three listings: `next` is an opaque cursor,
//!   so a generated one is rightly refused (bad cursors have their own test in `bad_input`);
//! - `positive_data_acceptance` also accepts a 400 where a request carries a transformation
//!   (creating and patching a destination, trying a program): `transform` is a jq program, and a
//!   generated string is rarely one (the compiler's errors have their own tests in `transforms`);
//! - `negative_data_rejection` is off for creating and patching destinations: the schema's URL
//!   pattern is a strict subset of the URLs the server takes (any `http(s)` URL with a host),
//!   so "invalid" URLs it generates are often valid ones.
//!
//! The server runs with no delivery workers and with private destinations allowed, so the URLs
//! the generator invents are neither resolved nor contacted: the run sends nothing anywhere but
//! to the server on loopback.

use std::io::Read as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support::{Client, env_with, start_server};

const KEY: &str = "schemathesis-admin-key-0123456789";
const SIGNING_KEY: &str = "dG9rZW4tc2lnbmluZy1rZXktZm9yLXRoZS10ZXN0cyE=";

/// Test cases per operation and phase: about a minute on two cores.
const MAX_EXAMPLES: &str = "25";
/// Fixed, so a run in CI is reproducible; change it to explore other inputs.
const SEED: &str = "20261130";
/// The whole run's bound.
const RUN_TIMEOUT: Duration = Duration::from_secs(300);

/// Per operation: the listings and the replay take schema-valid input that is still wrong in a
/// way JSON Schema cannot say (a cursor from another listing, a replay window that ends before it
/// starts or spans more than 7 days), so 400 is an expected answer there; so is a PATCH's
/// `config`, which must fit the destination's type, and the document cannot say which type the
/// destination in the path has, and any `transform`, which must be a jq program that compiles.
const CONFIG: &str = r#"
[[operations]]
include-path-regex = "/(events|attempts|dead-letters|replay)$"
checks.positive_data_acceptance.expected-statuses = ["2XX", "400", "401", "403", "404"]

[[operations]]
include-operation-id-regex = "^(updateDestination|createDestination|tryTransformation)$"
checks.positive_data_acceptance.expected-statuses = ["2XX", "400", "401", "403", "404"]

[[operations]]
include-operation-id-regex = "^(createDestination|updateDestination)$"
checks.negative_data_rejection.enabled = false
"#;

/// Runs schemathesis's CLI. Hypothesis describes its strategies by parsing lambda sources with
/// `ast`, which on CPython 3.11.7 (the machine's) can fail at random with "AST constructor
/// recursion depth mismatch" (a CPython bug, fixed in later releases); the description is
/// cosmetic, so it is replaced by a fixed one.
const RUNNER: &str = r#"
import sys
import hypothesis.internal.lambda_sources as sources
sources._lambda_description = lambda f, *args, **kwargs: "lambda: <unknown>"
import schemathesis.cli
sys.argv[0] = "st"
sys.exit(schemathesis.cli.schemathesis())
"#;

/// Whether xtask's Python has schemathesis; under CI it must (the run must not skip), outside CI
/// a missing package skips with a printed line.
fn has_schemathesis(python: &str) -> bool {
    let has_it = Command::new(python)
        .args(["-c", "import schemathesis"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    match has_it {
        true => true,
        false if sheaf_testenv::in_ci() => {
            panic!("{python} has no schemathesis, and under CI the run must not skip")
        }
        false => {
            println!(
                "skipping schemathesis: {python} cannot import it (`cargo xtask services up` installs xtask's PYTHON_REQUIREMENTS)"
            );
            false
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn schemathesis_finds_no_server_error_and_no_response_off_the_document() {
    let python = sheaf_testenv::require_python!(
        "schemathesis_finds_no_server_error_and_no_response_off_the_document"
    );
    if !has_schemathesis(&python) {
        return;
    }
    let server = start_server(env_with(&[
        ("SHEAF_API_KEY", KEY),
        ("SHEAF_TOKEN_SIGNING_KEY", SIGNING_KEY),
        ("SHEAF_DELIVERY_WORKERS", "0"),
        ("SHEAF_ALLOW_PRIVATE_DESTINATIONS", "true"),
        ("SHEAF_LOG", "error"),
    ]))
    .await;
    // Something to list, so the listings' item schemas are checked too.
    let admin = Client::new(server.addr).with_key(KEY);
    admin
        .tenant_with_destination("st", "http://receiver.invalid/hook")
        .await;
    for i in 0..3 {
        let published = admin
            .publish("st", &format!("st-{i}"), json!({ "i": i }))
            .await;
        assert_eq!(published.status, 202);
    }

    let dir = std::env::temp_dir().join(sheaf_testenv::unique_name("schemathesis"));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("schemathesis.toml"), CONFIG).unwrap();
    std::fs::write(dir.join("run.py"), RUNNER).unwrap();
    let schema_url = format!("http://{}/api/v1/openapi.json", server.addr);
    let mut child = Command::new(&python)
        .current_dir(&dir)
        .arg("run.py")
        .args(["--config-file", "schemathesis.toml", "--no-color", "run"])
        .arg(&schema_url)
        .args(["--header", &format!("Authorization: Bearer {KEY}")])
        .args(["--checks", "all", "--max-examples", MAX_EXAMPLES])
        .args(["--seed", SEED, "--workers", "2", "--request-timeout", "20"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python starts");
    // Both pipes drained while it runs, so neither can fill up and stall it.
    let mut stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut out = String::new();
        let _ = stdout.read_to_string(&mut out);
        out
    });
    let err_reader = std::thread::spawn(move || {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        err
    });
    let started = Instant::now();
    let status = tokio::task::spawn_blocking(move || {
        loop {
            if let Ok(Some(status)) = child.try_wait() {
                return Some(status);
            }
            if started.elapsed() > RUN_TIMEOUT {
                // Ends the child this test started, by its PID.
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    })
    .await
    .unwrap();
    let output = reader.join().unwrap() + &err_reader.join().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    // The summary: phases, failures and the number of test cases.
    let summary = output
        .rfind("SUMMARY")
        .map_or(output.as_str(), |at| &output[at..]);
    println!(
        "schemathesis ({:.0?}, seed {SEED}, {MAX_EXAMPLES} examples):\n{summary}",
        started.elapsed()
    );
    let Some(status) = status else {
        panic!("schemathesis did not finish within {RUN_TIMEOUT:?}:\n{output}");
    };
    assert!(status.success(), "schemathesis found problems:\n{output}");
    assert!(
        output.contains("passed"),
        "schemathesis ran no test case:\n{output}"
    );
    server.shutdown().await;
}
