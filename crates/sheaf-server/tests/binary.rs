//! The `sheaf` binary itself: `--help` lists every setting, `--version`, an invalid setting stops
//! start-up with its name, and `docs/configuration.md` has a row for every setting.

use std::process::Command;

use sheaf_server::SETTINGS;

/// The binary with only what each test sets: no `SHEAF_*` from the environment running the tests.
fn sheaf() -> Command {
    sheaf_testenv::sheaf_command(env!("CARGO_BIN_EXE_sheaf"))
}

#[test]
fn help_lists_every_setting_and_version_prints() {
    let output = sheaf().arg("--help").output().unwrap();
    assert!(output.status.success());
    let help = String::from_utf8(output.stdout).unwrap();
    for setting in SETTINGS {
        assert!(
            help.contains(setting.name),
            "--help does not mention {}",
            setting.name
        );
    }
    assert!(help.contains("serve") && help.contains("migrate"));
    let version = sheaf().arg("--version").output().unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8(version.stdout).unwrap().trim(),
        format!("sheaf {}", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn an_invalid_setting_stops_start_up_and_names_the_setting() {
    for (name, value, expected) in [
        (
            "SHEAF_RETRY_LOOKUP_BATCH_SIZE",
            "101",
            "invalid SHEAF_RETRY_LOOKUP_BATCH_SIZE: 101 is above the maximum of 100",
        ),
        (
            "SHEAF_RETRY_SCHEDULE",
            "5s,soon",
            "invalid SHEAF_RETRY_SCHEDULE",
        ),
        ("SHEAF_LOG_STORE", "cassandra", "invalid SHEAF_LOG_STORE"),
        (
            "SHEAF_OTLP_ENDPOINT",
            "grpc://collector:4317",
            "invalid SHEAF_OTLP_ENDPOINT: \"grpc://collector:4317\" must be an http:// or https:// URL",
        ),
        ("SHEAF_LOG_FORMAT", "xml", "invalid SHEAF_LOG_FORMAT"),
        (
            "SHEAF_ALLOW_PRIVATE_DESTINATIONS",
            "maybe",
            "invalid SHEAF_ALLOW_PRIVATE_DESTINATIONS",
        ),
        // 31 bytes: one short. The message names the setting, never the value.
        (
            "SHEAF_SECRETS_KEY",
            "c2VjcmV0LXZhbHVlLW5ldmVyLXByaW50ZWQtMDEyMw==",
            "invalid SHEAF_SECRETS_KEY",
        ),
        // Valid, but without SHEAF_API_KEY a tenant token would restrict nothing.
        (
            "SHEAF_TOKEN_SIGNING_KEY",
            "c2VjcmV0LXZhbHVlLW5ldmVyLXByaW50ZWQtMDEyMzQ=",
            "invalid SHEAF_TOKEN_SIGNING_KEY",
        ),
    ] {
        let output = sheaf()
            .arg("serve")
            .env(name, value)
            .env("SHEAF_LISTEN", "127.0.0.1:0")
            .output()
            .unwrap();
        assert!(
            !output.status.success(),
            "{name}={value} must stop start-up"
        );
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains(expected),
            "{name}={value}: stderr was {stderr:?}"
        );
        if name.ends_with("_KEY") {
            assert!(
                !stderr.contains(value),
                "a key is never printed: {stderr:?}"
            );
        }
    }
    // Without an admin key the service refuses a non-loopback address, and says why.
    let output = sheaf()
        .arg("serve")
        .env("SHEAF_LISTEN", "0.0.0.0:0")
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("SHEAF_API_KEY"), "{stderr:?}");
}

#[test]
fn the_configuration_reference_has_a_row_for_every_setting() {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../docs/configuration.md");
    let doc = std::fs::read_to_string(path).unwrap();
    for setting in SETTINGS {
        let row = doc
            .lines()
            .find(|line| line.starts_with(&format!("| `{}` |", setting.name)))
            .unwrap_or_else(|| panic!("docs/configuration.md has no row for {}", setting.name));
        let default = setting
            .default
            .map_or("unset".to_owned(), |d| format!("`{d}`"));
        assert!(
            row.contains(&default),
            "the row of {} does not give its default {default}: {row}",
            setting.name
        );
    }
}

#[test]
fn invalid_cdc_settings_stop_start_up_and_name_the_settings() {
    // Port 1: should a case pass validation by mistake, it must not reach a real database.
    let enabled = [
        ("SHEAF_CDC_ENABLED", "true"),
        (
            "SHEAF_CDC_POSTGRES_URL",
            "postgres://app:pw@127.0.0.1:1/app",
        ),
        ("SHEAF_CDC_TENANTS", "public.orders=acme"),
    ];
    // (settings over `enabled`, texts the error must contain)
    type Case = (Vec<(&'static str, &'static str)>, Vec<&'static str>);
    let cases: Vec<Case> = vec![
        (
            vec![
                ("SHEAF_CDC_BATCH_TRANSACTIONS", "true"),
                ("SHEAF_CDC_BATCH_SIZE", "100"),
            ],
            vec![
                "invalid SHEAF_CDC_BATCH_TRANSACTIONS",
                "SHEAF_CDC_BATCH_SIZE",
                "`batch_transactions`",
                "`batching`",
            ],
        ),
        (
            vec![("SHEAF_CDC_SLOT", "Not-A-Slot")],
            vec!["invalid SHEAF_CDC_SLOT"],
        ),
        (
            vec![("SHEAF_CDC_POSTGRES_URL", "mysql://app@127.0.0.1/app")],
            vec!["invalid SHEAF_CDC_POSTGRES_URL"],
        ),
        (
            vec![("SHEAF_CDC_POSTGRES_URL", "")],
            vec!["invalid SHEAF_CDC_POSTGRES_URL", "required"],
        ),
        (
            vec![("SHEAF_CDC_TENANTS", "orders=acme")],
            vec!["invalid SHEAF_CDC_TENANTS"],
        ),
        (
            vec![
                ("SHEAF_CDC_TENANTS", "acme"),
                ("SHEAF_CDC_CREATE_MISSING", "true"),
            ],
            vec!["invalid SHEAF_CDC_CREATE_MISSING"],
        ),
        (
            vec![("SHEAF_CDC_CHECKPOINT_LIMIT", "0")],
            vec!["invalid SHEAF_CDC_CHECKPOINT_LIMIT"],
        ),
        (
            vec![("SHEAF_CDC_HEARTBEAT_INTERVAL", "10ms")],
            vec!["invalid SHEAF_CDC_HEARTBEAT_INTERVAL"],
        ),
        (
            vec![("SHEAF_CDC_MAX_IN_FLIGHT", "many")],
            vec!["invalid SHEAF_CDC_MAX_IN_FLIGHT"],
        ),
    ];
    for (overrides, expected) in cases {
        let mut command = sheaf();
        command
            .arg("serve")
            .env("SHEAF_LISTEN", "127.0.0.1:0")
            .envs(enabled)
            .envs(overrides.iter().copied());
        let output = command.output().unwrap();
        assert!(!output.status.success(), "{overrides:?} must stop start-up");
        let stderr = String::from_utf8_lossy(&output.stderr);
        for text in expected {
            assert!(
                stderr.contains(text),
                "{overrides:?}: {text:?} not in {stderr:?}"
            );
        }
        assert!(
            !stderr.contains(":pw@"),
            "the password is never printed: {stderr:?}"
        );
    }
}
