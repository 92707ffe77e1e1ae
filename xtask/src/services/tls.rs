//! The test certificates, made with Debian's `openssl` CLI in `tls/` of the cache folder that
//! also holds the Python environment (`~/.cache/sheaf/tls/`, see `clickhouse::cache_dir`).
//!
//! Machine-wide rather than in `target/xtask/`, because the Postgres cluster they are installed
//! in is machine-wide too: two checkouts on one machine each run their own ClickHouse, but
//! share `15/main`, and with a CA each, every `up` would swap the certificate under the other
//! checkout's verify-full tests.
//!
//! - `ca.pem` (key `ca.key`): the test CA the suites trust;
//! - `server.pem` and `server.key`: signed by that CA for `IP:127.0.0.1` and `DNS:localhost`,
//!   served by Postgres and by the HTTPS front of ClickHouse, and by the suites' own receivers;
//! - `other-ca.pem` (key `other-ca.key`): an unrelated CA, for the tests that must see a
//!   certificate rejected because it was signed by a CA they do not trust.
//!
//! EC P-256 keys and SHA-256 signatures, with the v3 extensions webpki (rustls) requires: the
//! CAs have `basicConstraints CA:TRUE` and `keyUsage keyCertSign`; the server certificate is not
//! a CA and carries `extendedKeyUsage serverAuth` and the subjectAltNames (webpki ignores the
//! common name). They are valid for 30 days; `up` keeps files that verify and stay valid for
//! two more days, and otherwise makes the whole set again, so a server that serves them must
//! pick them up on every `up`.

use crate::process::{apt_install, on_path, run_captured};
use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Command;

/// How long a new certificate is valid.
const VALID_DAYS: &str = "30";
/// Files that expire sooner than this (two days, in seconds) are made again.
const RENEW_BEFORE_SECS: &str = "172800";

/// `openssl req`'s configuration: no prompts, and one section of extensions per kind of
/// certificate. The server certificate's key is EC, so its key usage is signatures only.
const OPENSSL_CNF: &str = "\
# Written by `cargo xtask services up`: the extensions of the test certificates.
[req]
distinguished_name = dn
prompt = no

[dn]
CN = Sheaf test

[ca]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash

[server]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = serverAuth
subjectAltName = IP:127.0.0.1, DNS:localhost
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
";

/// Where the test certificates are.
#[derive(Debug, Clone)]
pub struct Files {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub other_ca: PathBuf,
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl Files {
    /// The paths, whether or not the files exist yet.
    pub fn in_cache_dir() -> Self {
        let dir = super::clickhouse::cache_dir().join("tls");
        Self {
            ca: dir.join("ca.pem"),
            other_ca: dir.join("other-ca.pem"),
            cert: dir.join("server.pem"),
            key: dir.join("server.key"),
            dir,
        }
    }

    /// The server certificate's SHA-256 fingerprint, so that what serves it can tell when it
    /// was made again.
    pub fn fingerprint(&self) -> anyhow::Result<String> {
        let out = run_captured(
            openssl(&["x509", "-noout", "-fingerprint", "-sha256", "-in"]).arg(&self.cert),
        )?;
        Ok(out.trim().rsplit('=').next().unwrap_or_default().to_owned())
    }

    /// Whether every file is there, the server certificate verifies against the CA and matches
    /// its key, and no certificate expires within [`RENEW_BEFORE_SECS`].
    fn usable(&self) -> bool {
        let lasts = |cert: &Path| {
            run_captured(
                openssl(&["x509", "-noout", "-checkend", RENEW_BEFORE_SECS, "-in"]).arg(cert),
            )
            .is_ok()
        };
        let verifies = || {
            run_captured(
                openssl(&["verify", "-CAfile"])
                    .arg(&self.ca)
                    .arg(&self.cert),
            )
            .is_ok()
        };
        let key_matches = || {
            let from_cert =
                run_captured(openssl(&["x509", "-noout", "-pubkey", "-in"]).arg(&self.cert));
            let from_key = run_captured(openssl(&["pkey", "-pubout", "-in"]).arg(&self.key));
            matches!((from_cert, from_key), (Ok(a), Ok(b)) if a == b)
        };
        [&self.ca, &self.other_ca, &self.cert]
            .into_iter()
            .all(|c| lasts(c))
            && verifies()
            && key_matches()
    }
}

fn openssl(args: &[&str]) -> Command {
    let mut cmd = Command::new("openssl");
    cmd.args(args);
    cmd
}

/// The test certificates: the ones there when they are still good, else a new set.
pub fn ensure() -> anyhow::Result<Files> {
    if !on_path("openssl") {
        apt_install(&["openssl"]).context("openssl is missing and installing it failed")?;
    }
    let files = Files::in_cache_dir();
    if files.usable() {
        return Ok(files);
    }
    println!(
        "xtask: making test certificates (valid {VALID_DAYS} days) in {}",
        files.dir.display()
    );
    std::fs::create_dir_all(&files.dir)?;
    let cnf = files.dir.join("openssl.cnf");
    std::fs::write(&cnf, OPENSSL_CNF)?;
    new_ca(&cnf, &files.ca, "Sheaf test CA")?;
    new_ca(&cnf, &files.other_ca, "Sheaf unrelated test CA")?;

    let csr = files.dir.join("server.csr");
    run_captured(
        new_key_and_request(&cnf, &files.key, "localhost")
            .arg("-out")
            .arg(&csr),
    )?;
    run_captured(
        openssl(&["x509", "-req", "-sha256", "-days", VALID_DAYS])
            .arg("-in")
            .arg(&csr)
            .arg("-CA")
            .arg(&files.ca)
            .arg("-CAkey")
            .arg(key_of(&files.ca))
            .arg("-extfile")
            .arg(&cnf)
            .args(["-extensions", "server", "-out"])
            .arg(&files.cert),
    )
    .context("cannot sign the server certificate")?;
    let _ = std::fs::remove_file(&csr);
    // openssl already writes keys 0600; the servers' copies are made from this one, so make sure.
    for key in [
        key_of(&files.ca),
        key_of(&files.other_ca),
        files.key.clone(),
    ] {
        std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
    }
    anyhow::ensure!(
        files.usable(),
        "the new test certificates in {} do not verify",
        files.dir.display()
    );
    Ok(files)
}

/// `ca.pem` -> `ca.key`.
fn key_of(cert: &Path) -> PathBuf {
    cert.with_extension("key")
}

/// `openssl req` that makes a new P-256 key (unencrypted, mode 0600) for `common_name`.
fn new_key_and_request(cnf: &Path, key: &Path, common_name: &str) -> Command {
    let mut cmd = openssl(&["req", "-new", "-config"]);
    cmd.arg(cnf)
        .args([
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-noenc",
        ])
        .arg("-keyout")
        .arg(key)
        .args(["-subj", &format!("/CN={common_name}")]);
    cmd
}

/// A self-signed CA certificate at `cert`, its key beside it.
fn new_ca(cnf: &Path, cert: &Path, common_name: &str) -> anyhow::Result<()> {
    run_captured(
        new_key_and_request(cnf, &key_of(cert), common_name)
            .args(["-x509", "-sha256", "-days", VALID_DAYS, "-extensions", "ca"])
            .arg("-out")
            .arg(cert),
    )
    .with_context(|| format!("cannot make the CA {}", cert.display()))?;
    Ok(())
}

pub fn status() -> anyhow::Result<()> {
    let files = Files::in_cache_dir();
    let until = run_captured(openssl(&["x509", "-noout", "-enddate", "-in"]).arg(&files.cert));
    match until {
        Ok(until) => println!(
            "tls:        test CA and server certificate in {}, {}",
            files.dir.display(),
            until.trim().replace("notAfter=", "valid until ")
        ),
        _ => println!("tls:        no test certificates yet"),
    }
    Ok(())
}
