//! The engine's boundaries, checked over its source: what each part of `sheaf-engine` and
//! `sheaf-server` may name.
//!
//! - the folders of `crates/sheaf-engine/src/` depend one way, down the ranks of
//!   [`ENGINE_LAYERS`], and name no destination crate (the HTTP layer sees the engine only
//!   through its façade: that boundary is the crate, which the compiler checks);
//! - a store backend crate is named only in `crates/sheaf-engine/src/backends/`, so adding a
//!   backend touches the engine in that one folder.

use std::path::{Path, PathBuf};

use crate::tidy::{files_under, shown, workspace_root};

/// The folders of `crates/sheaf-engine/src/` and their ranks. A file inside a folder may name
/// (with `crate::<folder>` or `super::…::<folder>`) only folders of a lower rank:
///
/// ```text
/// backends (0) <- config (1) <- state (2) <- ingest (3), delivery (3)
/// ```
///
/// `backends` is the one place that names the store backends (their words, their settings,
/// how each is opened) and names nothing else of the crate; `config` is what the engine runs
/// with, backends chosen among them; `state` is what
/// the front door and the workers share, built from it; `ingest` (publishing, the CDC source)
/// and `delivery` (dispatcher, workers, completer) both run on that state and never name each
/// other, so either can change without the other. Files directly in `src/` (`lib.rs`,
/// `engine.rs`, `health.rs`, …) wire the folders together and are outside the rule. A new
/// folder gets a rank here before it may exist.
const ENGINE_LAYERS: &[(&str, u32)] = &[
    ("backends", 0),
    ("config", 1),
    ("state", 2),
    ("ingest", 3),
    ("delivery", 3),
];

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
        "sheaf-engine's folders must depend one way, backends <- config <- state <- ingest / \
         delivery (a \
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

/// Every line of `files` that names one of `crates`, as `path:line: names crate`.
fn lines_naming(crates: &[String], files: impl Iterator<Item = PathBuf>) -> Vec<String> {
    let mut offences = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for (n, line) in text.lines().enumerate() {
            if let Some(name) = crates.iter().find(|c| line.contains(c.as_str())) {
                offences.push(format!("{}:{}: names {name}", shown(&file), n + 1));
            }
        }
    }
    offences
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
    let folders = ["state", "ingest", "delivery"].map(|folder| engine.join(folder));
    let files = folders
        .iter()
        .chain([&server])
        .flat_map(|folder| files_under(folder, &[".rs"]));
    let offences = lines_naming(&crates, files);
    assert!(
        offences.is_empty(),
        "the engine reaches destination types only through Core::destinations; only \
         sheaf-engine's src/destinations.rs names them, and the service none:\n{}",
        offences.join("\n")
    );
}

/// The store backend crates of the workspace: every crate under `crates/` whose source
/// implements one of `sheaf-store`'s store traits, by their Rust names, except the engine
/// (whose wrappers implement them over a backend) and `sheaf-memory`, the in-process stores
/// every build has, which the engine's bounds read directly.
fn backend_crates() -> Vec<String> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(workspace_root().join("crates")).unwrap() {
        let dir = entry.unwrap().path();
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        if matches!(name.as_str(), "sheaf-engine" | "sheaf-memory") || !dir.join("src").is_dir() {
            continue;
        }
        let implements = files_under(&dir.join("src"), &[".rs"]).iter().any(|file| {
            let text = std::fs::read_to_string(file).unwrap();
            ["LogStore", "JobQueue", "EntityStore"]
                .iter()
                .any(|store| text.contains(&format!("impl {store} for")))
        });
        if implements {
            names.push(name.replace('-', "_"));
        }
    }
    names.sort();
    names
}

/// A store backend is wired in at one place: `crates/sheaf-engine/src/backends/`. The rest of
/// the engine and the whole service reach the stores through `Stores`, and the service hands
/// the store settings to `StoreConfig::from_settings` by name, so neither names a backend crate.
#[test]
fn only_the_engine_s_backends_folder_names_a_backend_crate() {
    let crates = backend_crates();
    assert!(
        ["sheaf_clickhouse", "sheaf_postgres", "sheaf_sqlite"]
            .iter()
            .all(|c| crates.iter().any(|found| found == c)),
        "the backend crates were not found: {crates:?}"
    );
    let engine = workspace_root().join("crates/sheaf-engine/src");
    let backends = engine.join("backends");
    let server = workspace_root().join("crates/sheaf-server/src");
    let files = files_under(&engine, &[".rs"])
        .into_iter()
        .filter(|file| !file.starts_with(&backends))
        .chain(files_under(&server, &[".rs"]));
    let offences = lines_naming(&crates, files);
    assert!(
        offences.is_empty(),
        "only sheaf-engine's src/backends/ names a store backend crate:\n{}",
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
