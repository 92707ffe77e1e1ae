//! Tidy: house rules checked over every Rust file of the repository.
//!
//! - every `.rs` file starts with a `//!` comment that says what it is for;
//! - no ignored tests and no tests that expect a panic: a test asserts the `Err` it expects,
//!   and a test that cannot run is not a test;
//! - a crate's `tests/` folder is one test binary (`tests/main.rs` with modules), so
//!   a crate that has sibling modules there turns off cargo's auto-discovery, which
//!   would otherwise compile each module a second time as a binary of its own.

use std::path::{Path, PathBuf};

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every `.rs` file below the root, skipping build output and VCS data.
fn rust_files() -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![workspace_root()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "corpus" | "artifacts") {
                    stack.push(path);
                }
            } else if name.ends_with(".rs") {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

#[test]
fn every_rust_file_starts_with_a_module_comment() {
    let files = rust_files();
    assert!(files.len() > 3, "tidy found too few files: {files:?}");
    let missing: Vec<_> = files
        .iter()
        .filter(|path| {
            let text = std::fs::read_to_string(path).unwrap();
            !text.trim_start().starts_with("//!")
        })
        .collect();
    assert!(
        missing.is_empty(),
        "these files do not start with a `//!` comment: {missing:#?}"
    );
}

#[test]
fn no_ignored_or_panic_expecting_tests() {
    // Attributes, not words: prose may talk about them. Spelled in two pieces so
    // this file does not trip its own check.
    let banned = [concat!("#[", "ignore"), concat!("#[", "should", "_panic")];
    let mut offences = Vec::new();
    for path in rust_files() {
        let text = std::fs::read_to_string(&path).unwrap();
        for (number, line) in text.lines().enumerate() {
            if banned.iter().any(|b| line.contains(b)) {
                offences.push(format!(
                    "{}:{}: {}",
                    path.display(),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "ignored or panic-expecting tests:\n{}",
        offences.join("\n")
    );
}

#[test]
fn one_test_binary_per_crate() {
    let root = workspace_root();
    let mut offences = Vec::new();
    let mut manifests = vec![root.join("xtask")];
    for parent in ["crates", "benches"] {
        if let Ok(entries) = std::fs::read_dir(root.join(parent)) {
            manifests.extend(entries.map(|e| e.unwrap().path()));
        }
    }
    for dir in manifests {
        let tests = dir.join("tests");
        if !tests.join("main.rs").is_file() {
            continue;
        }
        let siblings = std::fs::read_dir(&tests)
            .unwrap()
            .map(|e| e.unwrap().path())
            .any(|p| p.extension().is_some_and(|x| x == "rs") && !p.ends_with("main.rs"));
        let manifest = std::fs::read_to_string(dir.join("Cargo.toml")).unwrap_or_default();
        if siblings && !manifest.contains("autotests = false") {
            offences.push(dir.display().to_string());
        }
    }
    assert!(
        offences.is_empty(),
        "these crates have tests/main.rs and sibling modules but not `autotests = false` \
         (add it and a [[test]] named main): {offences:#?}"
    );
}
