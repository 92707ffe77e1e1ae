//! What the portal's browser tests need: Debian's Chromium, Node.js, and `playwright-core`
//! installed from the committed lock file into `crates/sheaf-server/portal/test/node_modules`.
//! Nothing here runs in the background; the test starts Chromium itself, headless.

use crate::process::{run_visible, workspace_root};
use anyhow::Context;
use sheaf_testenv::{CHROMIUM_VAR, NODE_VAR};
use std::path::PathBuf;
use std::process::Command;

/// Debian's Chromium: the only browser the tests drive (never one Playwright downloads).
pub const CHROMIUM: &str = "/usr/bin/chromium";
const CHROMIUM_PACKAGE: &str = "chromium";

/// The package to install, if Chromium is missing.
pub fn missing_packages() -> Vec<&'static str> {
    let mut missing = Vec::new();
    if !std::path::Path::new(CHROMIUM).exists() {
        missing.push(CHROMIUM_PACKAGE);
    }
    if !crate::process::on_path("node") {
        missing.extend(["nodejs", "npm"]);
    }
    missing
}

/// The folder of the browser tests and their `package-lock.json`.
fn test_dir() -> PathBuf {
    workspace_root().join("crates/sheaf-server/portal/test")
}

/// Installs the tests' npm packages when the lock file changed since the last install (a copy
/// of it is kept beside them), and answers the variables for the tests.
pub fn up() -> anyhow::Result<Vec<(&'static str, String)>> {
    let dir = test_dir();
    let Ok(lock) = std::fs::read(dir.join("package-lock.json")) else {
        // A checkout without the portal's tests: the tests that need them say so.
        println!(
            "xtask: no {}/package-lock.json: no browser tests",
            dir.display()
        );
        return Ok(Vec::new());
    };
    let stamp = dir.join("node_modules/.sheaf-installed-lock.json");
    if std::fs::read(&stamp).ok().as_deref() != Some(lock.as_slice()) {
        println!("xtask: installing the portal tests' npm packages (npm ci)");
        run_visible(
            Command::new("npm")
                .args(["ci", "--no-audit", "--no-fund"])
                .current_dir(&dir),
        )
        .context("npm ci for the portal's browser tests")?;
        std::fs::write(&stamp, &lock).context("cannot record the installed lock file")?;
    }
    let node = which("node").context("node is not on PATH after installing nodejs")?;
    Ok(vec![(CHROMIUM_VAR, CHROMIUM.to_owned()), (NODE_VAR, node)])
}

fn which(program: &str) -> Option<String> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|p| p.join(program))
            .find(|p| p.is_file())
            .map(|p| p.display().to_string())
    })
}

/// One line for `services status`.
pub fn status() -> anyhow::Result<()> {
    let chromium = if std::path::Path::new(CHROMIUM).exists() {
        CHROMIUM
    } else {
        "not installed"
    };
    let modules = test_dir().join("node_modules/playwright-core").is_dir();
    println!(
        "browser:    chromium {chromium}; playwright-core {}",
        if modules {
            "installed"
        } else {
            "not installed"
        }
    );
    Ok(())
}
