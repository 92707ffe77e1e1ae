//! The names settings answer to: unknown `SHEAF_` variables refused with the closest setting,
//! the names set aside for tools, words bound to variants by name, and the former `_MS` names.

use std::collections::HashMap;
use std::time::Duration;

use sheaf_engine::backends::{ClickHouseReplication, SqliteSync};
use sheaf_engine::{LogStoreKind, QueueKind};

use super::super::*;
use super::env;

/// `SHEAF_LOGSTORE=clickhouse`, one letter off, would otherwise run on the memory log: start-up
/// refuses it by name, with the setting it most likely meant.
#[test]
fn an_unknown_sheaf_variable_is_refused_with_the_closest_setting() {
    let err = Config::load(env(&[("SHEAF_LOGSTORE", "clickhouse")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_LOGSTORE");
    assert_eq!(
        err.to_string(),
        "invalid SHEAF_LOGSTORE: unknown setting; did you mean SHEAF_LOG_STORE?"
    );
    for (typo, meant) in [
        ("SHEAF_DELIVERY_WORKER", "SHEAF_DELIVERY_WORKERS"),
        ("SHEAF_QUEUE_LEASES", "SHEAF_QUEUE_LEASE"),
        ("SHEAF_RETRY_SHCEDULE", "SHEAF_RETRY_SCHEDULE"),
        ("SHEAF_Log_Store", "SHEAF_LOG_STORE"),
        // A typo of a former name is pointed at its successor.
        ("SHEAF_LOG_WRITE_MAX_WAIT_M", "SHEAF_LOG_WRITE_MAX_WAIT"),
    ] {
        let err = Config::load(env(&[(typo, "1")])).unwrap_err();
        assert_eq!(err.setting, typo);
        assert!(
            err.message.ends_with(&format!("did you mean {meant}?")),
            "{typo}: {err}"
        );
    }
    // Nothing near enough: refused all the same, with no misleading guess.
    let err = Config::load(env(&[("SHEAF_FROBNICATE", "1")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_FROBNICATE");
    assert!(!err.message.contains("did you mean"), "{err}");
    // Several unknown names: the first in name order, whatever the map's order.
    let err = Config::load(env(&[("SHEAF_ZZZ", "1"), ("SHEAF_AAA", "1")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_AAA");
}

#[test]
fn variables_without_the_prefix_are_not_settings_and_are_ignored() {
    let config = Config::load(env(&[
        ("PATH", "/usr/bin"),
        ("sheaf_logstore", "clickhouse"),
        ("XSHEAF_LOGSTORE", "clickhouse"),
    ]))
    .unwrap();
    assert_eq!(
        config.engine.stores.log,
        LogStoreKind::Sqlite,
        "the default, untouched"
    );
}

/// The test suites, benchmarks, fault suite and xtask set `SHEAF_` variables of their own that a
/// developer's shell exports beside a hand-started `sheaf`'s settings: those never stop it.
#[test]
fn the_tools_sheaf_variables_are_set_aside() {
    let tools = [
        "SHEAF_TEST_POSTGRES_URL",
        "SHEAF_TEST_TLS_CA_FILE",
        "SHEAF_BENCH_SHEAF_BIN",
        "SHEAF_BENCH_DELIVERY_BACKENDS",
        "SHEAF_CHAOS_SHEAF_BIN",
        "SHEAF_CHAOS_DIR",
        "SHEAF_PARITY_CASES",
        "SHEAF_PARITY_SEED",
        "SHEAF_FILTER_SEED",
        "SHEAF_UPDATE_GENERATED",
        "SHEAF_CACHE_DIR",
        "SHEAF_URL",
    ];
    let pairs: Vec<(&str, &str)> = tools.iter().map(|name| (*name, "x")).collect();
    Config::load(env(&pairs)).unwrap();
    // A whole name sets aside that name only, not the names it starts.
    let err = Config::load(env(&[("SHEAF_URLS", "x")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_URLS");
    // The prefixes are the tools': none of them starts a setting's name.
    for setting in SETTINGS {
        assert!(
            !names::is_not_a_setting(setting.name),
            "{} is set aside for tools",
            setting.name
        );
    }
}

/// A Kubernetes Service named `sheaf` (or `sheaf-…`) gives every pod in its namespace variables
/// that start `SHEAF_`: they never stop start-up, and no setting looks like one.
#[test]
fn kubernetes_service_links_are_not_settings() {
    let links = [
        "SHEAF_SERVICE_HOST",
        "SHEAF_SERVICE_PORT",
        "SHEAF_SERVICE_PORT_HTTP",
        "SHEAF_PORT",
        "SHEAF_PORT_8470_TCP",
        "SHEAF_PORT_8470_TCP_PROTO",
        "SHEAF_PORT_8470_TCP_PORT",
        "SHEAF_PORT_8470_TCP_ADDR",
        "SHEAF_POSTGRES_SERVICE_HOST",
        "SHEAF_POSTGRES_PORT",
        "SHEAF_POSTGRES_PORT_5432_TCP_ADDR",
        "SHEAF_NATS_PORT_4222_UDP",
        "SHEAF_SCTP_PORT_9_SCTP",
    ];
    let pairs: Vec<(&str, &str)> = links.iter().map(|name| (*name, "10.0.0.1")).collect();
    Config::load(env(&pairs)).unwrap();
    for near_miss in [
        "SHEAF_PORT_8470",
        "SHEAF_PORT_TCP",
        "SHEAF_PORT_8470_TCPX",
        "SHEAF_PORT_8470_TCP_HOST",
    ] {
        assert!(!names::is_service_link(near_miss), "{near_miss}");
    }
    for setting in SETTINGS {
        assert!(
            !names::is_service_link(setting.name),
            "{} looks like a Kubernetes service link",
            setting.name
        );
    }
}

/// docs/configuration.md says which names are set aside; it must say the same as the table.
#[test]
fn configuration_md_lists_the_names_set_aside_for_tools() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let doc = std::fs::read_to_string(path).expect("docs/configuration.md reads");
    for entry in names::NOT_SETTINGS {
        let written = if entry.ends_with('_') {
            format!("`{entry}*`")
        } else {
            format!("`{entry}`")
        };
        assert!(
            doc.contains(&written),
            "docs/configuration.md does not name {written}, which start-up sets aside"
        );
    }
}

/// Every `SHEAF_` variable the repository's tools read or set is a setting, a former name, or
/// set aside: otherwise a developer who exports it would find `sheaf` refusing to start.
#[test]
fn every_sheaf_variable_the_repository_names_is_a_setting_or_set_aside() {
    let root = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."));
    // `SHEAF_` strings that are not variables: NATS stream names, and a prefix constant.
    const NOT_VARIABLES: &[&str] = &["SHEAF_RESTART", "SHEAF_CHAOS", "SHEAF_"];
    let mut files = Vec::new();
    for dir in ["crates", "benches", "xtask", "fuzz", ".ci"] {
        collect_sources(&root.join(dir), &mut files);
    }
    assert!(files.len() > 100, "found only {} sources", files.len());
    let mut strays = Vec::new();
    // This file spells unknown names on purpose.
    files.retain(|f| !f.ends_with("sheaf-server/src/settings/tests/names.rs"));
    for file in &files {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for quoted in text.split('"').skip(1).step_by(2) {
            let is_name = quoted.starts_with("SHEAF_")
                && quoted
                    .bytes()
                    .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_');
            // A name ending in `_` is a prefix being built on, not a variable.
            if !is_name || quoted.ends_with('_') || NOT_VARIABLES.contains(&quoted) {
                continue;
            }
            let known = SETTINGS.iter().any(|s| s.name == quoted)
                || names::RENAMED.iter().any(|r| r.old == quoted)
                || names::is_not_a_setting(quoted);
            if !known {
                strays.push(format!("{quoted} in {}", file.display()));
            }
        }
    }
    assert!(
        strays.is_empty(),
        "not settings and not set aside in names::NOT_SETTINGS: {strays:?}"
    );
}

fn collect_sources(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let name = entry.file_name();
        if path.is_dir() {
            if name != "target" && name != "node_modules" {
                collect_sources(&path, out);
            }
        } else if path
            .extension()
            .is_some_and(|e| e == "rs" || e == "mjs" || e == "sh" || e == "toml")
        {
            out.push(path);
        }
    }
}

/// Words are bound to variants by name: each word the table lists maps to a variant, each
/// variant's word is one the table lists, and no two words share a variant, so reordering the
/// table's list (the order the docs show) cannot swap backends.
#[test]
fn every_word_of_a_choice_maps_to_its_variant_by_name() {
    fn check<T: Copy + PartialEq + std::fmt::Debug>(setting: &Setting, variants: &[(&str, T)]) {
        let Kind::OneOf(words) = setting.kind else {
            panic!("{} is not a one-of setting", setting.name);
        };
        let mut listed: Vec<&str> = words.to_vec();
        let mut bound: Vec<&str> = variants.iter().map(|(w, _)| *w).collect();
        listed.sort_unstable();
        bound.sort_unstable();
        assert_eq!(
            listed, bound,
            "{}: the table and the binding differ",
            setting.name
        );
        for (i, (_, a)) in variants.iter().enumerate() {
            for (_, b) in &variants[i + 1..] {
                assert_ne!(a, b, "{}: two words name {a:?}", setting.name);
            }
        }
        for (word, variant) in variants {
            let values = Values::gather(env(&[(setting.name, word)])).unwrap();
            assert_eq!(values.choice_of(setting, variants).unwrap(), *variant);
        }
    }
    check(&table::LOG_STORE, LogStoreKind::WORDS);
    check(&table::QUEUE, QueueKind::WORDS);
    check(&table::LOG_FORMAT, names::LOG_FORMAT_WORDS);
    check(&table::SQLITE_SYNC, SqliteSync::WORDS);
    check(
        &table::CLICKHOUSE_CLUSTER_REPLICATION,
        ClickHouseReplication::WORDS,
    );
    // The store words are read by the engine: each loads as the engine's own variant.
    let servers = [
        ("SHEAF_POSTGRES_URL", "postgres://sheaf@127.0.0.1/sheaf"),
        ("SHEAF_CLICKHOUSE_URL", "http://127.0.0.1:8123"),
    ];
    for (word, log) in LogStoreKind::WORDS {
        let config = Config::load(env(&[
            servers[0],
            servers[1],
            ("SHEAF_LOG_STORE", word),
            ("SHEAF_QUEUE", "memory"),
        ]))
        .unwrap();
        assert_eq!(config.engine.stores.log, *log, "{word}");
    }
    for (word, queue) in QueueKind::WORDS {
        // The JetStream queue has no log store of its own: its jobs' events are in Postgres.
        let log = if *queue == QueueKind::JetStream {
            "postgres"
        } else {
            word
        };
        let config = Config::load(env(&[
            servers[0],
            ("SHEAF_JETSTREAM_URLS", "nats://127.0.0.1:4222"),
            ("SHEAF_LOG_STORE", log),
            ("SHEAF_QUEUE", word),
        ]))
        .unwrap();
        assert_eq!(config.engine.stores.queue, *queue, "{word}");
    }
    for (word, sync) in SqliteSync::WORDS {
        let config = Config::load(env(&[("SHEAF_SQLITE_SYNC", word)])).unwrap();
        assert_eq!(config.engine.stores.sqlite.sync, *sync, "{word}");
    }
    for (word, replication) in ClickHouseReplication::WORDS {
        let config = Config::load(env(&[
            ("SHEAF_CLICKHOUSE_CLUSTER", "c"),
            ("SHEAF_CLICKHOUSE_CLUSTER_NODES", "http://127.0.0.1:8123"),
            ("SHEAF_CLICKHOUSE_CLUSTER_REPLICATION", word),
        ]))
        .unwrap();
        assert_eq!(
            config.engine.stores.clickhouse.cluster_replication, *replication,
            "{word}"
        );
    }
    // Every one-of setting is checked above.
    let choices = SETTINGS
        .iter()
        .filter(|s| matches!(s.kind, Kind::OneOf(_)))
        .count();
    assert_eq!(
        choices, 5,
        "a new one-of setting needs its binding checked here"
    );
}

#[test]
fn a_word_is_read_as_its_own_variant_whatever_the_list_order() {
    let config = Config::load(env(&[
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_CLICKHOUSE_URL", "http://127.0.0.1:8123"),
        ("SHEAF_LOG_FORMAT", "json"),
    ]))
    .unwrap();
    assert_eq!(config.engine.stores.log, LogStoreKind::ClickHouse);
    assert_eq!(config.log_format, LogFormat::Json);
    // The same words against a list in another order: the binding, not the position, decides.
    const REORDERED: Setting = Setting {
        kind: Kind::OneOf(&["clickhouse", "postgres", "memory"]),
        ..table::LOG_STORE
    };
    let values = Values::gather(env(&[("SHEAF_LOG_STORE", "memory")])).unwrap();
    assert_eq!(
        values.choice_of(&REORDERED, LogStoreKind::WORDS).unwrap(),
        LogStoreKind::Memory
    );
    let err = Config::load(env(&[("SHEAF_LOG_STORE", "cassandra")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_LOG_STORE");
    assert!(
        err.message.contains("sqlite, memory, postgres, clickhouse"),
        "{err}"
    );
}

#[test]
fn wait_settings_take_units() {
    let config = Config::load(env(&[
        ("SHEAF_RETRY_LOOKUP_BATCH_WAIT", "2s"),
        ("SHEAF_LOG_WRITE_MAX_WAIT", "250ms"),
    ]))
    .unwrap();
    assert_eq!(config.engine.retry_lookup.max_wait, Duration::from_secs(2));
    assert_eq!(config.engine.log_write.max_wait, Duration::from_millis(250));
    let defaults = Config::load(HashMap::new()).unwrap();
    assert_eq!(
        defaults.engine.retry_lookup.max_wait,
        Duration::from_millis(50)
    );
    assert_eq!(defaults.engine.log_write.max_wait, Duration::ZERO);
    // A plain integer is refused under the new names, as by every other duration.
    let err = Config::load(env(&[("SHEAF_LOG_WRITE_MAX_WAIT", "250")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_LOG_WRITE_MAX_WAIT");
    assert!(err.message.contains("has no unit"), "{err}");
    let err = Config::load(env(&[("SHEAF_RETRY_LOOKUP_BATCH_WAIT", "11s")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_RETRY_LOOKUP_BATCH_WAIT");
}

/// The `_MS` names keep working, as milliseconds, and the load says they are deprecated.
#[test]
fn former_ms_names_still_work_and_warn() {
    let old = env(&[
        ("SHEAF_RETRY_LOOKUP_BATCH_WAIT_MS", "20"),
        ("SHEAF_LOG_WRITE_MAX_WAIT_MS", "1500"),
    ]);
    let config = Config::load(old.clone()).unwrap();
    assert_eq!(
        config.engine.retry_lookup.max_wait,
        Duration::from_millis(20)
    );
    assert_eq!(
        config.engine.log_write.max_wait,
        Duration::from_millis(1500)
    );
    let mut warnings = deprecation_warnings(old);
    warnings.sort();
    assert_eq!(
        warnings,
        [
            "SHEAF_LOG_WRITE_MAX_WAIT_MS is deprecated and will be removed: read as SHEAF_LOG_WRITE_MAX_WAIT=1500ms; set SHEAF_LOG_WRITE_MAX_WAIT instead",
            "SHEAF_RETRY_LOOKUP_BATCH_WAIT_MS is deprecated and will be removed: read as SHEAF_RETRY_LOOKUP_BATCH_WAIT=20ms; set SHEAF_RETRY_LOOKUP_BATCH_WAIT instead",
        ]
    );
    assert!(deprecation_warnings(env(&[("SHEAF_LOG_WRITE_MAX_WAIT", "1s")])).is_empty());
    assert!(deprecation_warnings(HashMap::new()).is_empty());
    // The old bounds still hold, named by the variable that broke them.
    let err = Config::load(env(&[("SHEAF_LOG_WRITE_MAX_WAIT_MS", "10001")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_LOG_WRITE_MAX_WAIT_MS");
    assert!(err.message.contains("above the maximum of 10s"), "{err}");
    let err = Config::load(env(&[("SHEAF_LOG_WRITE_MAX_WAIT_MS", "5ms")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_LOG_WRITE_MAX_WAIT_MS");
    assert!(
        err.message.contains("whole number of milliseconds"),
        "{err}"
    );
}

#[test]
fn a_former_name_beside_its_successor_is_refused_naming_both() {
    let err = Config::load(env(&[
        ("SHEAF_LOG_WRITE_MAX_WAIT_MS", "5"),
        ("SHEAF_LOG_WRITE_MAX_WAIT", "5ms"),
    ]))
    .unwrap_err();
    assert_eq!(err.setting, "SHEAF_LOG_WRITE_MAX_WAIT_MS");
    assert!(err.message.contains("SHEAF_LOG_WRITE_MAX_WAIT,"), "{err}");
}

#[test]
fn the_file_reads_former_names_and_names_the_closest_key() {
    let dir = std::env::temp_dir().join(format!("sheaf-config-names-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sheaf.toml");
    let file_env = || env(&[("SHEAF_CONFIG_FILE", path.to_str().unwrap())]);
    std::fs::write(&path, "log_write_max_wait_ms = 7\n").unwrap();
    assert_eq!(
        Config::load(file_env()).unwrap().engine.log_write.max_wait,
        Duration::from_millis(7)
    );
    assert_eq!(deprecation_warnings(file_env()).len(), 1);
    std::fs::write(&path, "logstore = \"clickhouse\"\n").unwrap();
    let err = Config::load(file_env()).unwrap_err();
    assert_eq!(err.setting, "SHEAF_CONFIG_FILE");
    assert!(
        err.message.ends_with("did you mean \"log_store\"?"),
        "{err}"
    );
    std::fs::write(&path, "log_write_max_wait_m = 7\n").unwrap();
    let err = Config::load(file_env()).unwrap_err();
    assert!(
        err.message
            .ends_with("did you mean \"log_write_max_wait\"?"),
        "{err}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn edit_distance_counts_single_character_edits() {
    use names::edit_distance as d;
    assert_eq!(d("", ""), 0);
    assert_eq!(d("abc", ""), 3);
    assert_eq!(d("", "abc"), 3);
    assert_eq!(d("SHEAF_LOGSTORE", "SHEAF_LOG_STORE"), 1);
    assert_eq!(d("kitten", "sitting"), 3);
    assert_eq!(d("flaw", "lawn"), 2);
}
