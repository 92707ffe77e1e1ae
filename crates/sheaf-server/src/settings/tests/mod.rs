//! The settings' own tests: defaults, refusals naming their setting, the file, the CDC source.
//!
//! Longer than 600 lines because each rule between settings gets its refusal checked here, next
//! to the samples that make every setting change the configuration; the names' rules are apart
//! in `names.rs`.

use std::collections::HashMap;
use std::time::Duration;

use sheaf_cdc::{BatchingPolicy, PublicationTables};

use sheaf_engine::{EntityHome, LogStoreKind, QueueKind};

use super::*;

mod names;

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

#[test]
fn defaults_load() {
    let config = Config::load(HashMap::new()).unwrap();
    assert_eq!(config.listen.to_string(), "127.0.0.1:8470");
    // Every store in the SQLite file, unless the log store is told otherwise.
    assert_eq!(config.engine.stores.log, LogStoreKind::Sqlite);
    assert_eq!(config.engine.stores.queue, QueueKind::Sqlite);
    assert_eq!(config.engine.stores.entity_home(), EntityHome::Sqlite);
    assert_eq!(
        config.engine.stores.sqlite.max_size, None,
        "no size limit by default"
    );
    let capped = Config::load(env(&[("SHEAF_SQLITE_MAX_SIZE_MIB", "64")])).unwrap();
    assert_eq!(capped.engine.stores.sqlite.max_size, Some(64 << 20));
    assert_eq!(config.engine.retry.schedule.len(), 5);
    // The memory log alone brings the memory queue along; a log on a server keeps it too.
    let memory = Config::load(env(&[("SHEAF_LOG_STORE", "memory")])).unwrap();
    assert_eq!(memory.engine.stores.queue, QueueKind::Memory);
    assert_eq!(memory.engine.stores.entity_home(), EntityHome::Memory);
    let clickhouse = Config::load(env(&[
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_CLICKHOUSE_URL", "http://127.0.0.1:8123"),
    ]))
    .unwrap();
    assert_eq!(clickhouse.engine.stores.queue, QueueKind::Memory);
    // Given empty, the queue is unset and follows the log store.
    let empty = Config::load(env(&[("SHEAF_QUEUE", "")])).unwrap();
    assert_eq!(empty.engine.stores.queue, QueueKind::Sqlite);
    // A Postgres queue needs a shared log store: neither this process's memory nor its file.
    for log_store in ["memory", "sqlite"] {
        let err = Config::load(env(&[
            ("SHEAF_QUEUE", "postgres"),
            ("SHEAF_LOG_STORE", log_store),
            ("SHEAF_POSTGRES_URL", "postgres://sheaf@127.0.0.1/sheaf"),
        ]))
        .unwrap_err();
        assert_eq!(err.setting, "SHEAF_LOG_STORE", "{err}");
        assert!(err.message.starts_with(log_store), "{err}");
    }
}

/// A value other than the default, valid for the setting's kind; text settings have theirs
/// written out, since only their own parser knows what they accept.
fn another_value(setting: &Setting) -> String {
    let other = |min: Duration, max: Duration| {
        let min = format_duration(min);
        if setting.default == Some(min.as_str()) {
            format_duration(max)
        } else {
            min
        }
    };
    match setting.kind {
        Kind::Bool => match setting.default {
            Some("true") => "false".to_owned(),
            _ => "true".to_owned(),
        },
        Kind::Integer { min, max } => {
            if setting.default == Some(min.to_string().as_str()) {
                max.to_string()
            } else {
                min.to_string()
            }
        }
        Kind::Duration { min, max }
        | Kind::DurationOrOff { min, max }
        | Kind::DurationList { min, max } => other(min, max),
        Kind::OneOf(words) => words
            .iter()
            .find(|w| setting.default != Some(**w))
            .map(|w| (*w).to_owned())
            .expect("a choice of one is no choice"),
        Kind::Text(_) => TEXT_SAMPLES
            .iter()
            .find(|(name, _)| *name == setting.name)
            .map(|(_, value)| (*value).to_owned())
            .unwrap_or_else(|| panic!("{} needs a sample in TEXT_SAMPLES", setting.name)),
    }
}

const KEY32: &str = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";
const OTHER_KEY32: &str = "ZmVkY2JhOTg3NjU0MzIxMGZlZGNiYTk4NzY1NDMyMTA=";

const TEXT_SAMPLES: &[(&str, &str)] = &[
    ("SHEAF_DATA_DIR", "/var/lib/sheaf"),
    ("SHEAF_CONFIG_FILE", "/nonexistent/sheaf.toml"),
    ("SHEAF_LISTEN", "127.0.0.1:0"),
    ("SHEAF_API_KEY", "admin-key-0123456789"),
    ("SHEAF_TOKEN_SIGNING_KEY", KEY32),
    ("SHEAF_POSTGRES_URL", "postgres://sheaf@127.0.0.1/sheaf"),
    ("SHEAF_CLICKHOUSE_URL", "http://127.0.0.1:8123"),
    ("SHEAF_POSTGRES_SCHEMA", "other"),
    ("SHEAF_CLICKHOUSE_DATABASE", "other"),
    ("SHEAF_CLICKHOUSE_CLUSTER", "other_cluster"),
    (
        "SHEAF_CLICKHOUSE_CLUSTER_NODES",
        "http://127.0.0.1:8123,http://127.0.0.1:8124",
    ),
    (
        "SHEAF_JETSTREAM_URLS",
        "nats://127.0.0.1:4222,nats://127.0.0.1:4223",
    ),
    ("SHEAF_JETSTREAM_BUCKET", "other_jobs"),
    ("SHEAF_SECRETS_KEY", KEY32),
    ("SHEAF_SECRETS_KEY_PREVIOUS", OTHER_KEY32),
    (
        "SHEAF_CDC_POSTGRES_URL",
        "postgres://app:secret@127.0.0.1:5433/other",
    ),
    ("SHEAF_CDC_SLOT", "other_slot"),
    (
        "SHEAF_TRANSFORM_RUNNER",
        "/usr/local/bin/sheaf-transform-runner",
    ),
    ("SHEAF_CDC_PUBLICATION", "other_pub"),
    ("SHEAF_CDC_TENANTS", "acme"),
    ("SHEAF_LOG", "debug"),
    ("SHEAF_OTLP_ENDPOINT", "http://127.0.0.1:4318"),
    ("SHEAF_EGRESS_PROXY", "http://127.0.0.1:3128"),
    ("SHEAF_PUBLIC_URL", "https://hooks.example.com"),
    // Debian's system bundle (the ca-certificates package): a real file of many CAs.
    ("SHEAF_TLS_CA_FILE", "/etc/ssl/certs/ca-certificates.crt"),
    (
        "SHEAF_OPERATOR_WEBHOOK_URL",
        "https://ops.example.com/sheaf",
    ),
    ("SHEAF_OPERATOR_WEBHOOK_SECRET", OPERATOR_SECRET),
];

const OPERATOR_SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=";

/// Settings that act only together with another one.
const COMPANIONS: &[(&str, (&str, &str))] = &[
    (
        "SHEAF_CLICKHOUSE_CLUSTER",
        ("SHEAF_CLICKHOUSE_CLUSTER_NODES", "http://127.0.0.1:8123"),
    ),
    (
        "SHEAF_CLICKHOUSE_CLUSTER_NODES",
        ("SHEAF_CLICKHOUSE_CLUSTER", "sheaf_cluster"),
    ),
    (
        "SHEAF_CLICKHOUSE_CLUSTER_REPLICATION",
        ("SHEAF_CLICKHOUSE_CLUSTER", "sheaf_cluster"),
    ),
    (
        "SHEAF_CLICKHOUSE_CLUSTER_REPLICATION",
        ("SHEAF_CLICKHOUSE_CLUSTER_NODES", "http://127.0.0.1:8123"),
    ),
    ("SHEAF_SECRETS_KEY_PREVIOUS", ("SHEAF_SECRETS_KEY", KEY32)),
    ("SHEAF_CDC_BATCH_WAIT", ("SHEAF_CDC_BATCH_SIZE", "10")),
    (
        "SHEAF_OPERATOR_WEBHOOK_URL",
        ("SHEAF_OPERATOR_WEBHOOK_SECRET", OPERATOR_SECRET),
    ),
    (
        "SHEAF_OPERATOR_WEBHOOK_SECRET",
        (
            "SHEAF_OPERATOR_WEBHOOK_URL",
            "https://ops.example.com/sheaf",
        ),
    ),
];

/// Settings that must not be set alone either: the load starts from this value of theirs (with
/// their companion), so that the sample is a change of value rather than a first setting.
const STARTING_VALUES: &[(&str, &str)] = &[
    // No default of its own (it follows the log store's), so start from the other embedded one.
    ("SHEAF_QUEUE", "memory"),
    ("SHEAF_CLICKHOUSE_CLUSTER", "sheaf_cluster"),
    ("SHEAF_CLICKHOUSE_CLUSTER_NODES", "http://127.0.0.1:8123"),
    (
        "SHEAF_OPERATOR_WEBHOOK_URL",
        "https://before.example.com/sheaf",
    ),
    (
        "SHEAF_OPERATOR_WEBHOOK_SECRET",
        "whsec_YmVmb3JlLWJlZm9yZS1iZWZvcmUtYmVmb3JlLTAx",
    ),
];

/// Every setting is read: given another value, the load either refuses it or yields another
/// configuration. The parser keeps no record of what it read; this asks from outside.
#[test]
fn every_setting_changes_the_configuration_or_is_refused() {
    for setting in SETTINGS {
        // The source's settings matter only when it runs.
        let cdc = setting.name.starts_with("SHEAF_CDC_") && setting.name != "SHEAF_CDC_ENABLED";
        let mut base = if cdc { cdc_env(&[]) } else { HashMap::new() };
        for (name, (companion, value)) in COMPANIONS {
            if *name == setting.name {
                base.insert((*companion).to_owned(), (*value).to_owned());
            }
        }
        for (name, value) in STARTING_VALUES {
            if *name == setting.name {
                base.insert((*name).to_owned(), (*value).to_owned());
            }
        }
        let before = format!("{:?}", Config::load(base.clone()).unwrap());
        base.insert(setting.name.to_owned(), another_value(setting));
        if let Ok(config) = Config::load(base.clone()) {
            assert_ne!(
                format!("{config:?}"),
                before,
                "{} = {:?} changed nothing: is it read?",
                setting.name,
                base[setting.name]
            );
        }
    }
}

#[test]
fn the_operator_webhook_needs_both_settings_and_a_usable_secret() {
    let url = (
        "SHEAF_OPERATOR_WEBHOOK_URL",
        "https://ops.example.com/sheaf",
    );
    let err = Config::load(env(&[url])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_OPERATOR_WEBHOOK_SECRET", "{err}");
    let err = Config::load(env(&[("SHEAF_OPERATOR_WEBHOOK_SECRET", OPERATOR_SECRET)])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_OPERATOR_WEBHOOK_URL", "{err}");
    for secret in [
        "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=",
        "whsec_c2hvcnQ=",
        "whsec_!!",
    ] {
        let err = Config::load(env(&[url, ("SHEAF_OPERATOR_WEBHOOK_SECRET", secret)])).unwrap_err();
        assert_eq!(
            err.setting, "SHEAF_OPERATOR_WEBHOOK_SECRET",
            "{secret}: {err}"
        );
        assert!(
            !err.to_string().contains(secret),
            "the secret stays out of the message"
        );
    }
    let err = Config::load(env(&[
        ("SHEAF_OPERATOR_WEBHOOK_URL", "ftp://ops.example.com/"),
        ("SHEAF_OPERATOR_WEBHOOK_SECRET", OPERATOR_SECRET),
    ]))
    .unwrap_err();
    assert_eq!(err.setting, "SHEAF_OPERATOR_WEBHOOK_URL", "{err}");
    let config = Config::load(env(&[
        url,
        ("SHEAF_OPERATOR_WEBHOOK_SECRET", OPERATOR_SECRET),
    ]))
    .unwrap();
    assert!(
        !format!("{config:?}").contains(OPERATOR_SECRET),
        "Debug hides the secret"
    );
}

#[test]
fn invalid_values_name_their_setting() {
    let err = Config::load(env(&[("SHEAF_RETRY_LOOKUP_BATCH_SIZE", "101")])).unwrap_err();
    assert_eq!(
        err.to_string(),
        "invalid SHEAF_RETRY_LOOKUP_BATCH_SIZE: 101 is above the maximum of 100"
    );
    let err = Config::load(env(&[("SHEAF_RETRY_SCHEDULE", "5s,,1m")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_RETRY_SCHEDULE");
    let err = Config::load(env(&[("SHEAF_DELIVERY_TIMEOUT", "5")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_DELIVERY_TIMEOUT");
    let err = Config::load(env(&[("SHEAF_QUEUE", "postgres")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_POSTGRES_URL");
    let err = Config::load(env(&[
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_POSTGRES_URL", "postgres://sheaf@127.0.0.1/sheaf"),
    ]))
    .unwrap_err();
    assert_eq!(err.setting, "SHEAF_LOG_STORE", "{err}");
    // The SQLite queue's outbox is its own file's log tables.
    for log_store in ["memory", "postgres"] {
        let err = Config::load(env(&[
            ("SHEAF_QUEUE", "sqlite"),
            ("SHEAF_LOG_STORE", log_store),
            ("SHEAF_POSTGRES_URL", "postgres://sheaf@127.0.0.1/sheaf"),
        ]))
        .unwrap_err();
        assert_eq!(err.setting, "SHEAF_LOG_STORE", "{err}");
    }
    // The JetStream queue needs its servers, Postgres for tenants, and a log store on a server;
    // its servers are NATS URLs and its bucket a plain name.
    let jetstream = [
        ("SHEAF_QUEUE", "jetstream"),
        ("SHEAF_LOG_STORE", "clickhouse"),
        ("SHEAF_CLICKHOUSE_URL", "http://127.0.0.1:8123"),
        ("SHEAF_POSTGRES_URL", "postgres://sheaf@127.0.0.1/sheaf"),
        ("SHEAF_JETSTREAM_URLS", "nats://127.0.0.1:4222"),
    ];
    let config = Config::load(env(&jetstream)).unwrap();
    assert_eq!(config.engine.stores.queue, QueueKind::JetStream);
    assert_eq!(config.engine.stores.entity_home(), EntityHome::Postgres);
    for (dropped, named) in [
        ("SHEAF_JETSTREAM_URLS", "SHEAF_JETSTREAM_URLS"),
        ("SHEAF_POSTGRES_URL", "SHEAF_POSTGRES_URL"),
    ] {
        let pairs: Vec<_> = jetstream
            .iter()
            .copied()
            .filter(|(k, _)| *k != dropped)
            .collect();
        let err = Config::load(env(&pairs)).unwrap_err();
        assert_eq!(err.setting, named, "without {dropped}: {err}");
    }
    for (changed, named) in [
        (("SHEAF_LOG_STORE", "memory"), "SHEAF_LOG_STORE"),
        (("SHEAF_LOG_STORE", "sqlite"), "SHEAF_LOG_STORE"),
        (
            ("SHEAF_JETSTREAM_URLS", "127.0.0.1:4222"),
            "SHEAF_JETSTREAM_URLS",
        ),
        (("SHEAF_JETSTREAM_BUCKET", "a.b"), "SHEAF_JETSTREAM_BUCKET"),
        (
            ("SHEAF_JETSTREAM_REPLICAS", "0"),
            "SHEAF_JETSTREAM_REPLICAS",
        ),
        (
            ("SHEAF_JETSTREAM_REPLICAS", "6"),
            "SHEAF_JETSTREAM_REPLICAS",
        ),
    ] {
        let mut pairs: Vec<_> = jetstream
            .iter()
            .copied()
            .filter(|(k, _)| *k != changed.0)
            .collect();
        pairs.push(changed);
        let err = Config::load(env(&pairs)).unwrap_err();
        assert_eq!(err.setting, named, "{changed:?}: {err}");
    }
    // A cluster needs its nodes, the nodes a cluster, each an HTTP(S) URL.
    for (pairs, named) in [
        (
            &[("SHEAF_CLICKHOUSE_CLUSTER", "c")][..],
            "SHEAF_CLICKHOUSE_CLUSTER_NODES",
        ),
        (
            &[("SHEAF_CLICKHOUSE_CLUSTER_NODES", "http://127.0.0.1:8123")][..],
            "SHEAF_CLICKHOUSE_CLUSTER",
        ),
        (
            &[
                ("SHEAF_CLICKHOUSE_CLUSTER", "a-b"),
                ("SHEAF_CLICKHOUSE_CLUSTER_NODES", "http://127.0.0.1:8123"),
            ][..],
            "SHEAF_CLICKHOUSE_CLUSTER",
        ),
        (
            &[
                ("SHEAF_CLICKHOUSE_CLUSTER", "c"),
                (
                    "SHEAF_CLICKHOUSE_CLUSTER_NODES",
                    "http://127.0.0.1:8123,127.0.0.1:9000",
                ),
            ][..],
            "SHEAF_CLICKHOUSE_CLUSTER_NODES",
        ),
    ] {
        let err = Config::load(env(pairs)).unwrap_err();
        assert_eq!(err.setting, named, "{pairs:?}: {err}");
    }
    // Servers that replicate take the schema ON CLUSTER through the URL: no node list.
    Config::load(env(&[
        ("SHEAF_CLICKHOUSE_CLUSTER", "c"),
        ("SHEAF_CLICKHOUSE_CLUSTER_REPLICATION", "replicated"),
    ]))
    .unwrap();
    let err = Config::load(env(&[("SHEAF_SQLITE_SYNC", "off")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_SQLITE_SYNC", "{err}");
    let err = Config::load(env(&[("SHEAF_DATA_DIR", "")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_DATA_DIR", "{err}");
    let err = Config::load(env(&[("SHEAF_LISTEN", "0.0.0.0:8470")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_API_KEY");
    let err = Config::load(env(&[("SHEAF_QUEUE_LEASE", "10s")])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_QUEUE_LEASE");
    for url in [
        "hooks.example.com",
        "ftp://hooks.example.com",
        "https://h.example/sheaf",
    ] {
        let err = Config::load(env(&[("SHEAF_PUBLIC_URL", url)])).unwrap_err();
        assert_eq!(err.setting, "SHEAF_PUBLIC_URL", "{url}: {err}");
    }
    let config = Config::load(env(&[("SHEAF_PUBLIC_URL", "https://h.example:8443/")])).unwrap();
    assert_eq!(config.public_url.as_deref(), Some("https://h.example:8443"));
}

#[test]
fn keys_are_checked_and_never_printed() {
    let key32 = "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY="; // 32 bytes
    let admin = ("SHEAF_API_KEY", "admin-key-0123456789");
    for (pairs, setting) in [
        (
            vec![admin, ("SHEAF_TOKEN_SIGNING_KEY", "c2hvcnQ=")],
            "SHEAF_TOKEN_SIGNING_KEY",
        ),
        (
            vec![admin, ("SHEAF_TOKEN_SIGNING_KEY", "not base64 at all")],
            "SHEAF_TOKEN_SIGNING_KEY",
        ),
        (
            vec![("SHEAF_TOKEN_SIGNING_KEY", key32)],
            "SHEAF_TOKEN_SIGNING_KEY",
        ),
        (
            vec![admin, ("SHEAF_TOKEN_MAX_TTL", "10s")],
            "SHEAF_TOKEN_MAX_TTL",
        ),
        (vec![("SHEAF_SECRETS_KEY", "c2hvcnQ=")], "SHEAF_SECRETS_KEY"),
        (
            vec![(
                "SHEAF_SECRETS_KEY",
                "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWZ4eA==",
            )],
            "SHEAF_SECRETS_KEY",
        ),
        // The decrypt-only key: not alone, not invalid, not the current key again.
        (
            vec![("SHEAF_SECRETS_KEY_PREVIOUS", key32)],
            "SHEAF_SECRETS_KEY_PREVIOUS",
        ),
        (
            vec![
                ("SHEAF_SECRETS_KEY", key32),
                ("SHEAF_SECRETS_KEY_PREVIOUS", "c2hvcnQ="),
            ],
            "SHEAF_SECRETS_KEY_PREVIOUS",
        ),
        (
            vec![
                ("SHEAF_SECRETS_KEY", key32),
                ("SHEAF_SECRETS_KEY_PREVIOUS", key32),
            ],
            "SHEAF_SECRETS_KEY_PREVIOUS",
        ),
    ] {
        let err = Config::load(env(&pairs)).unwrap_err();
        assert_eq!(err.setting, setting, "{pairs:?}: {err}");
    }
    let config = Config::load(env(&[
        admin,
        ("SHEAF_TOKEN_SIGNING_KEY", key32),
        ("SHEAF_SECRETS_KEY", key32),
        ("SHEAF_DELIVERY_WORKERS", "0"),
    ]))
    .unwrap();
    assert!(config.token_signing_key.is_some() && config.engine.secrets_key.is_some());
    assert_eq!(config.token_max_ttl, Duration::from_secs(30 * 86_400));
    assert_eq!(config.engine.delivery_workers, 0);
    let printed = format!("{config:?}");
    assert!(!printed.contains(key32), "keys never appear in Debug");
    assert!(!printed.contains("admin-key-0123456789"), "{printed}");
}

#[test]
fn durations_parse_and_format() {
    assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
    assert_eq!(parse_duration("1m"), Ok(Duration::from_secs(60)));
    assert_eq!(parse_duration("2d"), Ok(Duration::from_secs(172_800)));
    assert!(parse_duration("5").is_err());
    assert!(parse_duration("5w").is_err());
    assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    assert_eq!(format_duration(Duration::from_secs(3600)), "1h");
}

#[test]
fn the_file_sets_values_and_the_environment_wins() {
    let dir = std::env::temp_dir().join(format!("sheaf-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("sheaf.toml");
    std::fs::write(
        &path,
        "retry_schedule = [\"1s\", \"2s\"]\ndelivery_workers = 7\nretry_max_attempts = 3\n",
    )
    .unwrap();
    let config = Config::load(env(&[
        ("SHEAF_CONFIG_FILE", path.to_str().unwrap()),
        ("SHEAF_DELIVERY_WORKERS", "9"),
    ]))
    .unwrap();
    assert_eq!(
        config.engine.retry.schedule,
        vec![Duration::from_secs(1), Duration::from_secs(2)]
    );
    assert_eq!(config.engine.retry.max_attempts, 3);
    assert_eq!(config.engine.delivery_workers, 9);
    std::fs::write(&path, "no_such_setting = 1\n").unwrap();
    let err = Config::load(env(&[("SHEAF_CONFIG_FILE", path.to_str().unwrap())])).unwrap_err();
    assert_eq!(err.setting, "SHEAF_CONFIG_FILE");
    std::fs::remove_dir_all(&dir).unwrap();
}

const CDC_URL: &str = "postgres://app:secret@127.0.0.1:5432/app";

fn cdc_env(extra: &[(&str, &str)]) -> HashMap<String, String> {
    let mut pairs = vec![
        ("SHEAF_CDC_ENABLED", "true"),
        ("SHEAF_CDC_POSTGRES_URL", CDC_URL),
        ("SHEAF_CDC_TENANTS", "public.orders=acme,*=other"),
    ];
    pairs.extend_from_slice(extra);
    env(&pairs)
}

#[test]
fn the_cdc_source_is_off_by_default_and_built_from_its_settings() {
    assert!(Config::load(HashMap::new()).unwrap().engine.cdc.is_none());
    let config = Config::load(cdc_env(&[
        ("SHEAF_CDC_SLOT", "app_slot"),
        ("SHEAF_CDC_PUBLICATION", "app_pub"),
        ("SHEAF_CDC_CREATE_MISSING", "true"),
        ("SHEAF_CDC_BATCH_TRANSACTIONS", "true"),
        ("SHEAF_CDC_CHECKPOINT_LIMIT", "200"),
        ("SHEAF_CDC_HEARTBEAT_INTERVAL", "30s"),
        ("SHEAF_CDC_MAX_IN_FLIGHT", "4"),
    ]))
    .unwrap();
    let cdc = config.engine.cdc.expect("enabled");
    assert_eq!(cdc.source.slot, "app_slot");
    assert_eq!(cdc.source.publication, "app_pub");
    assert_eq!(cdc.source.connection.database, "app");
    assert_eq!(
        cdc.source.create_missing,
        Some(PublicationTables::Tables(vec!["public.orders".into()]))
    );
    assert!(cdc.source.stream.batch_transactions);
    assert_eq!(cdc.source.stream.batching, None);
    assert_eq!(cdc.source.stream.checkpoint_limit, 200);
    assert_eq!(cdc.source.heartbeat_interval, Some(Duration::from_secs(30)));
    assert_eq!(cdc.max_in_flight, 4);
    assert_eq!(
        cdc.tenants.tenant_for("public", "orders").unwrap().as_str(),
        "acme"
    );

    let policy = Config::load(cdc_env(&[
        ("SHEAF_CDC_BATCH_SIZE", "50"),
        ("SHEAF_CDC_BATCH_WAIT", "5ms"),
    ]))
    .unwrap()
    .engine
    .cdc
    .unwrap();
    assert_eq!(
        policy.source.stream.batching,
        Some(BatchingPolicy {
            count: 50,
            max_wait: Duration::from_millis(5)
        })
    );
    assert_eq!(policy.source.heartbeat_interval, None, "0s is off");
}

#[test]
fn batch_transactions_with_a_batch_size_names_both_settings_and_fields() {
    let err = Config::load(cdc_env(&[
        ("SHEAF_CDC_BATCH_TRANSACTIONS", "true"),
        ("SHEAF_CDC_BATCH_SIZE", "100"),
    ]))
    .unwrap_err();
    assert_eq!(err.setting, "SHEAF_CDC_BATCH_TRANSACTIONS");
    let text = err.to_string();
    for name in [
        "SHEAF_CDC_BATCH_TRANSACTIONS",
        "SHEAF_CDC_BATCH_SIZE",
        "`batch_transactions`",
        "`batching`",
    ] {
        assert!(text.contains(name), "{name} missing from {text:?}");
    }
}

#[test]
fn invalid_cdc_values_name_their_setting() {
    for (extra, setting) in [
        (
            vec![("SHEAF_CDC_POSTGRES_URL", "")],
            "SHEAF_CDC_POSTGRES_URL",
        ),
        (
            vec![("SHEAF_CDC_POSTGRES_URL", "mysql://u@h/d")],
            "SHEAF_CDC_POSTGRES_URL",
        ),
        (vec![("SHEAF_CDC_TENANTS", "")], "SHEAF_CDC_TENANTS"),
        (
            vec![("SHEAF_CDC_TENANTS", "orders=acme")],
            "SHEAF_CDC_TENANTS",
        ),
        (vec![("SHEAF_CDC_SLOT", "Bad-Slot")], "SHEAF_CDC_SLOT"),
        (vec![("SHEAF_CDC_PUBLICATION", "")], "SHEAF_CDC_PUBLICATION"),
        (vec![("SHEAF_CDC_ENABLED", "perhaps")], "SHEAF_CDC_ENABLED"),
        (
            vec![("SHEAF_CDC_CHECKPOINT_LIMIT", "0")],
            "SHEAF_CDC_CHECKPOINT_LIMIT",
        ),
        (vec![("SHEAF_CDC_BATCH_SIZE", "x")], "SHEAF_CDC_BATCH_SIZE"),
        (vec![("SHEAF_CDC_BATCH_WAIT", "1h")], "SHEAF_CDC_BATCH_WAIT"),
        (
            vec![("SHEAF_CDC_MAX_IN_FLIGHT", "0")],
            "SHEAF_CDC_MAX_IN_FLIGHT",
        ),
        (
            vec![("SHEAF_CDC_HEARTBEAT_INTERVAL", "500ms")],
            "SHEAF_CDC_HEARTBEAT_INTERVAL",
        ),
        (
            vec![
                ("SHEAF_CDC_TENANTS", "acme"),
                ("SHEAF_CDC_CREATE_MISSING", "true"),
            ],
            "SHEAF_CDC_CREATE_MISSING",
        ),
        (
            vec![
                ("SHEAF_QUEUE", "postgres"),
                ("SHEAF_LOG_STORE", "postgres"),
                ("SHEAF_POSTGRES_URL", CDC_URL),
                ("SHEAF_CDC_TENANTS", "sheaf.events=acme"),
            ],
            "SHEAF_CDC_TENANTS",
        ),
    ] {
        let err = Config::load(cdc_env(&extra)).unwrap_err();
        assert_eq!(err.setting, setting, "{extra:?}: {err}");
        assert!(
            !err.to_string().contains("secret"),
            "never the password: {err}"
        );
    }
    // Without SHEAF_CDC_ENABLED, the URL and the tenants are not required.
    let config = Config::load(env(&[("SHEAF_CDC_SLOT", "other_slot")])).unwrap();
    assert!(config.engine.cdc.is_none());
}

#[test]
fn sheaf_s_own_schema_never_feeds_the_catch_all() {
    let config = Config::load(cdc_env(&[
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", CDC_URL),
        ("SHEAF_POSTGRES_SCHEMA", "sheaf_x"),
    ]))
    .unwrap();
    let tenants = config.engine.cdc.unwrap().tenants;
    assert_eq!(tenants.tenant_for("sheaf_x", "events"), None);
    assert_eq!(tenants.tenant_for("app", "t").unwrap().as_str(), "other");
}

#[test]
fn retry_delays_repeat_the_last_entry() {
    let config = Config::load(env(&[("SHEAF_RETRY_SCHEDULE", "1s,2s")])).unwrap();
    assert_eq!(config.engine.retry.base_delay(1), Duration::from_secs(1));
    assert_eq!(config.engine.retry.base_delay(2), Duration::from_secs(2));
    assert_eq!(config.engine.retry.base_delay(9), Duration::from_secs(2));
}

/// The engine's own defaults (for programs that embed it without settings) are the settings'
/// defaults: written twice, kept equal here.
#[test]
fn the_engine_defaults_are_the_settings_defaults() {
    let from_settings = Config::load(HashMap::new()).unwrap().engine;
    assert_eq!(
        format!("{:?}", sheaf_engine::EngineConfig::default()),
        format!("{from_settings:?}")
    );
}
