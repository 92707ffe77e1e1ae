//! Tidy: house rules checked over every file of the repository.
//!
//! - every `.rs` file starts with a `//!` comment that says what it is for;
//! - no ignored tests and no tests that expect a panic: a test asserts the `Err` it expects,
//!   and a test that cannot run is not a test;
//! - a crate's `tests/` folder is one test binary (`tests/main.rs` with modules), so
//!   a crate that has sibling modules there turns off cargo's auto-discovery, which
//!   would otherwise compile each module a second time as a binary of its own;
//! - no file cites a document a reader of the repository cannot open (design notes kept
//!   elsewhere, numbered write-ups, issue numbers of a tracker): a comment explains the
//!   mechanism in the project's own words, and a measurement is cited from
//!   `docs/benchmarks.md`, where it is written down with what produced it;
//! - a Rust file longer than [`LONG_FILE_LINES`] lines says why in its leading comment,
//!   so a long file is a decision rather than an accident.

use std::path::{Path, PathBuf};

/// Files longer than this many lines must say why (see [`no_long_files_without_a_reason`]).
const LONG_FILE_LINES: usize = 600;

/// What a long file's leading comment says, on a line of its own: "Longer than 600 lines
/// because …".
const LONG_FILE_REASON: &str = "Longer than 600 lines because";

pub(crate) fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file below `root` whose name ends with one of `suffixes`, skipping build output
/// (`target/`, also `fuzz/target/`), VCS data and the fuzzers' corpus and artifacts.
pub(crate) fn files_under(root: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let name = path.file_name().unwrap().to_string_lossy().into_owned();
            if path.is_dir() {
                if !matches!(name.as_str(), "target" | ".git" | "corpus" | "artifacts") {
                    stack.push(path);
                }
            } else if suffixes.iter().any(|suffix| name.ends_with(suffix)) {
                out.push(path);
            }
        }
    }
    out.sort();
    out
}

/// Every `.rs` file of the repository.
fn rust_files() -> Vec<PathBuf> {
    files_under(&workspace_root(), &[".rs"])
}

/// `path` relative to the repository's root, for messages.
pub(crate) fn shown(path: &Path) -> String {
    let root = workspace_root();
    path.strip_prefix(&root)
        .unwrap_or(path)
        .display()
        .to_string()
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

/// Why `line` cites a document that is not in the repository, if it does. The phrases are
/// spelled in pieces so that this file does not cite them itself.
fn outside_reference(line: &str) -> Option<&'static str> {
    let lower = line.to_ascii_lowercase();
    let followed_by_digit = |text: &str, prefix: &str| {
        text.match_indices(prefix).any(|(at, _)| {
            text[at + prefix.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
    };
    if followed_by_digit(&lower, concat!("seed", " 0")) {
        return Some("a numbered design note");
    }
    if lower.contains(concat!("seeds", "/")) {
        return Some("the folder of design notes");
    }
    if lower.contains(concat!("shared", "/design")) {
        return Some("the shared design folder");
    }
    let summary = concat!("BRI", "EF");
    let is_word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_');
    if line.match_indices(summary).any(|(at, _)| {
        !is_word(line[..at].chars().next_back())
            && !is_word(line[at + summary.len()..].chars().next())
    }) {
        return Some("the product summary kept outside the repository");
    }
    if line.contains(concat!("STYLE", ".md")) || line.contains(concat!("PEERS", ".md")) {
        return Some("a design document kept outside the repository");
    }
    let issue = concat!("iss", "ue");
    let cites_issue = lower.match_indices(issue).any(|(at, _)| {
        let rest = &lower[at + issue.len()..];
        let starts_a_word = !is_word(lower[..at].chars().next_back());
        let number = |text: &str| text.chars().next().is_some_and(|c| c.is_ascii_digit());
        starts_a_word
            && [" ", "#", " #"]
                .iter()
                .any(|gap| rest.strip_prefix(*gap).is_some_and(number))
    });
    if cites_issue {
        return Some("an issue number of a tracker");
    }
    None
}

#[test]
fn no_references_to_documents_outside_the_repository() {
    let files = files_under(&workspace_root(), &[".rs", ".md", ".toml", ".sql"]);
    assert!(files.len() > 3, "tidy found too few files: {files:?}");
    let mut offences = Vec::new();
    // A migration that has shipped is history: its text is checksummed where it was applied
    // (`sheaf-postgres`'s runner stores an md5 of it), so rewording even a comment in it would
    // make every database migrated by an earlier build refuse to start. New migrations are
    // checked like any other file.
    let shipped_migrations = ["0001_log.sql", "0002_queue.sql", "0003_entities.sql"];
    for path in files.into_iter().filter(|p| {
        !(p.parent()
            .is_some_and(|d| d.ends_with("sheaf-postgres/migrations"))
            && p.file_name()
                .is_some_and(|n| shipped_migrations.iter().any(|m| *m == n)))
    }) {
        let text = std::fs::read_to_string(&path).unwrap();
        for (number, line) in text.lines().enumerate() {
            if let Some(what) = outside_reference(line) {
                offences.push(format!(
                    "{}:{}: cites {what}: {}",
                    shown(&path),
                    number + 1,
                    line.trim()
                ));
            }
        }
    }
    assert!(
        offences.is_empty(),
        "these lines cite documents a reader of the repository cannot open; explain the \
         mechanism in the project's own words, and cite a measurement from docs/benchmarks.md \
         by section (adding it there with what produced it):\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_reference_patterns_catch_what_they_should_and_only_that() {
    let cited = [
        concat!("as seed", " 004 warned"),
        concat!("(Seed", " 000)"),
        concat!("see ../shared/seed", "s/000.txt"),
        concat!("BRI", "EF.md \"JobQueue\""),
        concat!("measured by ", "BRI", "EF"),
        concat!("STYLE", ".md says"),
        concat!("PEERS", ".md"),
        concat!("/work/shared", "/design"),
        concat!("(iss", "ue 9: targets)"),
        concat!("Iss", "ue #12"),
        concat!("iss", "ue#3"),
    ];
    for line in cited {
        assert!(outside_reference(line).is_some(), "not caught: {line}");
    }
    let fine = [
        "the parity seed printed on failure replays it",
        "SHEAF_PARITY_SEED=0x1f",
        "seed {:#018x}",
        concat!("a bri", "ef outage"),
        "payload filters (outpost #492)",
        "the tokens it issues",
        concat!("tiss", "ue 9"),
        "fuzz seeds: one file per message",
    ];
    for line in fine {
        assert_eq!(outside_reference(line), None, "caught by mistake: {line}");
    }
}

/// The lines of a file's leading `//!` comment.
fn leading_doc(text: &str) -> impl Iterator<Item = &str> {
    text.lines()
        .map(str::trim_start)
        .take_while(|line| line.starts_with("//!") || line.is_empty())
}

#[test]
fn no_long_files_without_a_reason() {
    let root = workspace_root();
    let mut offences = Vec::new();
    for path in rust_files() {
        let relative = path.strip_prefix(&root).unwrap();
        if !["crates", "xtask", "benches"]
            .iter()
            .any(|top| relative.starts_with(top))
        {
            continue;
        }
        let text = std::fs::read_to_string(&path).unwrap();
        let lines = text.lines().count();
        if lines > LONG_FILE_LINES
            && !leading_doc(&text).any(|line| line.contains(LONG_FILE_REASON))
        {
            offences.push(format!("{}: {lines} lines", shown(&path)));
        }
    }
    assert!(
        offences.is_empty(),
        "these files are longer than {LONG_FILE_LINES} lines and their leading `//!` comment \
         does not say why: split them, or add a line `//! {LONG_FILE_REASON} …` with the \
         reason:\n{}",
        offences.join("\n")
    );
}
