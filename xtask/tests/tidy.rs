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
//! - the folders of `crates/sheaf-engine/src/` depend one way, down the ranks of
//!   [`ENGINE_LAYERS`], and name no destination crate (the HTTP layer sees the engine only
//!   through its façade: that boundary is the crate, which the compiler checks);
//! - a Rust file longer than [`LONG_FILE_LINES`] lines says why in its leading comment,
//!   so a long file is a decision rather than an accident.

use std::path::{Path, PathBuf};

/// The folders of `crates/sheaf-engine/src/` and their ranks. A file inside a folder may name
/// (with `crate::<folder>` or `super::…::<folder>`) only folders of a lower rank:
///
/// ```text
/// config (0) <- state (1) <- ingest (2), delivery (2)
/// ```
///
/// `config` is what the engine runs with and names nothing else of the crate; `state` is what
/// the front door and the workers share, built from it; `ingest` (publishing, the CDC source)
/// and `delivery` (dispatcher, workers, completer) both run on that state and never name each
/// other, so either can change without the other. Files directly in `src/` (`lib.rs`,
/// `engine.rs`, `health.rs`, …) wire the folders together and are outside the rule. A new
/// folder gets a rank here before it may exist.
const ENGINE_LAYERS: &[(&str, u32)] =
    &[("config", 0), ("state", 1), ("ingest", 2), ("delivery", 2)];

/// Files longer than this many lines must say why (see [`no_long_files_without_a_reason`]).
const LONG_FILE_LINES: usize = 600;

/// What a long file's leading comment says, on a line of its own: "Longer than 600 lines
/// because …".
const LONG_FILE_REASON: &str = "Longer than 600 lines because";

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// Every file below `root` whose name ends with one of `suffixes`, skipping build output
/// (`target/`, also `fuzz/target/`), VCS data and the fuzzers' corpus and artifacts.
fn files_under(root: &Path, suffixes: &[&str]) -> Vec<PathBuf> {
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
fn shown(path: &Path) -> String {
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

/// The crate's top-level modules that `text` names, with the line of each: `crate::<name>` and
/// `$crate::<name>`, also inside `crate::{…}` groups over several lines, and `super::…::<name>`
/// with at least `depth` `super`s (the number that climbs from the file's module to the crate
/// root; more happen inside inline modules). Comments count too: an intra-doc link to another
/// folder is a dependency of the documentation.
fn named_modules(text: &str, depth: usize) -> Vec<(usize, String)> {
    let bytes = text.as_bytes();
    let is_ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let line_of = |at: usize| text[..at].matches('\n').count() + 1;
    let ident_at = |at: usize| {
        let end = (at..bytes.len())
            .find(|&i| !is_ident(bytes[i]))
            .unwrap_or(bytes.len());
        &text[at..end]
    };
    let skip_space = |mut at: usize| {
        while at < bytes.len() && bytes[at].is_ascii_whitespace() {
            at += 1;
        }
        at
    };
    let mut found = Vec::new();
    // The first segment after a path's root, or the first segment of each item of a group.
    let take_heads = |at: usize, found: &mut Vec<(usize, String)>| {
        let at = skip_space(at);
        if bytes.get(at) != Some(&b'{') {
            let name = ident_at(at);
            if !name.is_empty() {
                found.push((line_of(at), name.to_owned()));
            }
            return;
        }
        let mut level = 0;
        let mut expect_head = true;
        for i in at..bytes.len() {
            match bytes[i] {
                b'{' => {
                    level += 1;
                    expect_head = level == 1;
                }
                b'}' => {
                    level -= 1;
                    if level == 0 {
                        return;
                    }
                }
                b',' => expect_head = level == 1,
                b if b.is_ascii_whitespace() => {}
                b if is_ident(b) && expect_head && !is_ident(bytes[i - 1]) => {
                    found.push((line_of(i), ident_at(i).to_owned()));
                    expect_head = false;
                }
                _ => {
                    if level == 1 {
                        expect_head = false;
                    }
                }
            }
        }
    };
    let crate_root = concat!("crate", "::");
    for (at, _) in text.match_indices(crate_root) {
        if at == 0 || !is_ident(bytes[at - 1]) {
            take_heads(at + crate_root.len(), &mut found);
        }
    }
    let parent = concat!("super", "::");
    for (at, _) in text.match_indices(parent) {
        if at > 0 && (is_ident(bytes[at - 1]) || bytes[at - 1] == b':') {
            continue; // not the start of a `super::` chain
        }
        let mut end = at;
        let mut supers = 0;
        while text[end..].starts_with(parent) {
            end += parent.len();
            supers += 1;
        }
        if supers >= depth {
            take_heads(end, &mut found);
        }
    }
    found.sort();
    found
}

/// How many `super`s climb from `file`'s module to the crate root: `state/mod.rs` is the
/// module `state` (one), `state/core.rs` the module `state::core` (two).
fn module_depth(src: &Path, file: &Path) -> usize {
    let relative = file.strip_prefix(src).unwrap();
    let mut parts: Vec<String> = relative
        .iter()
        .map(|part| part.to_string_lossy().into_owned())
        .collect();
    let last = parts.pop().unwrap();
    let stem = last.strip_suffix(".rs").unwrap_or(&last);
    if stem != "mod" {
        parts.push(stem.to_owned());
    }
    parts.len()
}

/// Every edge against [`ENGINE_LAYERS`] in the folders under `src`, and every folder without
/// a rank. Folders of the table that do not exist are nothing to check.
fn layer_offences(src: &Path) -> Vec<String> {
    let rank = |name: &str| {
        ENGINE_LAYERS
            .iter()
            .find(|(folder, _)| *folder == name)
            .map(|(_, rank)| *rank)
    };
    let mut offences = Vec::new();
    let mut folders: Vec<PathBuf> = std::fs::read_dir(src)
        .unwrap_or_else(|err| panic!("cannot read {}: {err}", src.display()))
        .map(|entry| entry.unwrap().path())
        .filter(|path| path.is_dir())
        .collect();
    folders.sort();
    for folder in folders {
        let from = folder.file_name().unwrap().to_string_lossy().into_owned();
        let Some(from_rank) = rank(&from) else {
            offences.push(format!(
                "{}: folder `{from}` has no rank: add it to ENGINE_LAYERS in xtask/tests/tidy.rs \
                 (and to docs/ARCHITECTURE.md)",
                shown(&folder)
            ));
            continue;
        };
        for file in files_under(&folder, &[".rs"]) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (line, to) in named_modules(&text, module_depth(src, &file)) {
                if to == from {
                    continue;
                }
                if let Some(to_rank) = rank(&to)
                    && to_rank >= from_rank
                {
                    offences.push(format!("{}:{line}: {from} -> {to}", shown(&file)));
                }
            }
        }
    }
    offences.dedup();
    offences
}

#[test]
fn sheaf_engine_layers_depend_one_way() {
    let src = workspace_root().join("crates/sheaf-engine/src");
    let offences = layer_offences(&src);
    assert!(
        offences.is_empty(),
        "sheaf-engine's folders must depend one way, config <- state <- ingest / delivery (a \
         folder names only folders of a lower rank; ingest and delivery never name each \
         other):\n{}",
        offences.join("\n")
    );
}

/// The destination crates: every crate that depends on `sheaf-destination` to implement it (all
/// but the trait crate itself and the service), by their Rust names (`sheaf_webhook`, …).
fn destination_crates() -> Vec<String> {
    let crates = workspace_root().join("crates");
    let mut names = Vec::new();
    for entry in std::fs::read_dir(&crates).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if matches!(
            name.as_str(),
            "sheaf-destination" | "sheaf-engine" | "sheaf-server"
        ) {
            continue;
        }
        let Ok(manifest) = std::fs::read_to_string(dir.join("Cargo.toml")) else {
            continue;
        };
        let dependencies = manifest.split("[dev-dependencies]").next().unwrap_or("");
        if dependencies
            .lines()
            .any(|l| l.trim_start().starts_with("sheaf-destination"))
        {
            names.push(name.replace('-', "_"));
        }
    }
    names.sort();
    names
}

#[test]
fn the_engine_names_no_destination_type() {
    let crates = destination_crates();
    assert!(
        crates.iter().any(|c| c == "sheaf_webhook"),
        "the destination crates were not found: {crates:?}"
    );
    let engine = workspace_root().join("crates/sheaf-engine/src");
    let server = workspace_root().join("crates/sheaf-server/src");
    let mut offences = Vec::new();
    let folders = ["state", "ingest", "delivery"].map(|folder| engine.join(folder));
    for folder in folders.iter().chain([&server]) {
        for file in files_under(folder, &[".rs"]) {
            let text = std::fs::read_to_string(&file).unwrap();
            for (n, line) in text.lines().enumerate() {
                if let Some(name) = crates.iter().find(|c| line.contains(c.as_str())) {
                    offences.push(format!("{}:{}: names {name}", shown(&file), n + 1));
                }
            }
        }
    }
    assert!(
        offences.is_empty(),
        "the engine reaches destination types only through Core::destinations; only \
         sheaf-engine's src/destinations.rs names them, and the service none:\n{}",
        offences.join("\n")
    );
}

#[test]
fn the_layer_check_finds_paths_in_every_form() {
    let sample = concat!(
        "use crate::state::Core;\n",
        "use crate::{\n",
        "    settings::Config,\n",
        "    delivery::{engine, webhook::Signer},\n",
        "};\n",
        "fn f() { crate::http::serve(); super::super::ingest::publish(); }\n",
        "use super::engine; // a sibling module, not a folder\n",
        "macro_rules! m { () => { $crate::settings::X } }\n",
        "use sheaf_crate::http::Nothing;\n",
    );
    let names = |depth| {
        named_modules(sample, depth)
            .into_iter()
            .map(|(line, name)| format!("{line}:{name}"))
            .collect::<Vec<_>>()
    };
    assert_eq!(
        names(2),
        [
            "1:state",
            "3:settings",
            "4:delivery",
            "6:http",
            "6:ingest",
            "8:settings"
        ]
    );
    // From one level deeper, `super::super` stops short of the crate root.
    assert_eq!(
        names(3),
        [
            "1:state",
            "3:settings",
            "4:delivery",
            "6:http",
            "8:settings"
        ]
    );
    // From a folder's own `mod.rs`, one `super` is the crate root.
    assert!(names(1).contains(&"7:engine".to_owned()));
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
