//! Rotating `SHEAF_SECRETS_KEY` on real Postgres without stopping deliveries: destinations
//! sealed under key A, a server restarted on key B with A as `SHEAF_SECRETS_KEY_PREVIOUS`, and
//! `sheaf secrets reseal` (the real binary) run while that server delivers to a local receiver
//! and rotates signing secrets. Nothing fails, and no row is left under A.

use std::collections::HashMap;
use std::process::Output;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::json;
use sheaf_server::settings::SecretsKey;
use sheaf_testenv::receiver::Receiver;

use crate::support::{Client, env_with, start_server};

const TENANTS: usize = 24;
const EVENTS_PER_TENANT: usize = 5;

/// Runs `sheaf secrets reseal` with exactly `env` as its settings.
async fn reseal(env: &HashMap<String, String>, args: &[&str]) -> Output {
    tokio::process::Command::new(env!("CARGO_BIN_EXE_sheaf"))
        .args(["secrets", "reseal"])
        .args(args)
        .env_clear()
        .envs(env)
        .env("SHEAF_LOG", "warn")
        .output()
        .await
        .expect("the sheaf binary runs")
}

fn said(output: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    )
}

/// Rows whose secret, previous secret or `config.url` password is not sealed under `key_id`.
async fn rows_not_under(pool: &sqlx::PgPool, schema: &str, key_id: &str) -> i64 {
    let prefix = format!("enc:v2:{key_id}:%");
    sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {schema}.destinations
         WHERE secret NOT LIKE $1
            OR (previous_secret IS NOT NULL AND previous_secret NOT LIKE $1)"
    ))
    .bind(&prefix)
    .fetch_one(pool)
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_secrets_key_rotates_under_deliveries_and_nothing_is_left_under_the_old_key() {
    let postgres = sheaf_testenv::require_postgres!("the_secrets_key_rotates_under_deliveries");
    let schema = sheaf_testenv::unique_name("rot");
    let key_a = BASE64.encode([0xa1u8; 32]);
    let key_b = BASE64.encode([0xb2u8; 32]);
    let id_a = SecretsKey::from_base64(&key_a).unwrap().id().to_owned();
    let id_b = SecretsKey::from_base64(&key_b).unwrap().id().to_owned();
    let base = [
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_ENTITY_CACHE_TTL", "0s"),
    ];
    let with = |extra: &[(&'static str, &str)]| {
        let mut env = base.to_vec();
        env.extend_from_slice(extra);
        env_with(&env)
    };
    let receiver = Receiver::start().await.expect("the receiver binds");

    // Key A: one destination per tenant, half of them rotated (a previous secret under A).
    let on_a = start_server(with(&[("SHEAF_SECRETS_KEY", &key_a)])).await;
    let client = Client::new(on_a.addr);
    let mut destinations = Vec::new();
    for t in 0..TENANTS {
        let tenant = format!("rot{t}");
        let created = client
            .tenant_with_destination(&tenant, &receiver.url())
            .await;
        let id = created["id"].as_str().unwrap().to_owned();
        if t % 2 == 0 {
            let rotated = client
                .send(
                    "POST",
                    &format!("/api/v1/tenants/{tenant}/destinations/{id}/rotate-secret"),
                    None,
                )
                .await;
            assert_eq!(rotated.status, 200, "{rotated:?}");
        }
        destinations.push((tenant, id));
    }
    on_a.shutdown().await;
    let pool = sqlx::PgPool::connect(&postgres).await.unwrap();
    assert_eq!(
        rows_not_under(&pool, &schema, &id_a).await,
        0,
        "everything starts under A"
    );

    // Key B, A only opening: everything still reads and delivers.
    let rotating = with(&[
        ("SHEAF_SECRETS_KEY", &key_b),
        ("SHEAF_SECRETS_KEY_PREVIOUS", &key_a),
    ]);
    let on_b = start_server(rotating.clone()).await;
    let client = Client::new(on_b.addr);
    let before = reseal(&rotating, &["--check"]).await;
    println!("--check before: {}", said(&before));
    assert!(
        !before.status.success(),
        "rows under A remain: {}",
        said(&before)
    );
    assert!(
        said(&before).contains(&format!(
            "{TENANTS} hold a credential not sealed under key {id_b}"
        )),
        "{}",
        said(&before)
    );

    // Deliveries (and secret rotations) go on while the reseal runs, in pages of 5.
    let publishing = {
        let client = client.clone();
        let destinations = destinations.clone();
        tokio::spawn(async move {
            let mut ids = Vec::new();
            for e in 0..EVENTS_PER_TENANT {
                for (t, (tenant, id)) in destinations.iter().enumerate() {
                    let event = format!("{tenant}-e{e}");
                    let answer = client.publish(tenant, &event, json!({ "e": e })).await;
                    assert_eq!(answer.status, 202, "{answer:?}");
                    ids.push(event);
                    if e == 1 && t % 3 == 0 {
                        let path =
                            format!("/api/v1/tenants/{tenant}/destinations/{id}/rotate-secret");
                        assert_eq!(client.send("POST", &path, None).await.status, 200);
                    }
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            ids
        })
    };
    tokio::time::sleep(Duration::from_millis(150)).await;
    let resealed = reseal(&rotating, &["--batch", "5"]).await;
    println!("reseal: {}", said(&resealed));
    assert!(resealed.status.success(), "{}", said(&resealed));
    assert!(
        said(&resealed).contains(&format!(
            "{TENANTS} destinations examined, {TENANTS} re-sealed under key {id_b}"
        )) && said(&resealed).contains("0 remain"),
        "{}",
        said(&resealed)
    );
    let ids = publishing.await.unwrap();
    assert!(receiver.delivers_all(&ids, Duration::from_secs(60)).await);
    let after = reseal(&rotating, &["--check"]).await;
    assert!(after.status.success(), "{}", said(&after));
    assert_eq!(rows_not_under(&pool, &schema, &id_b).await, 0);
    on_b.shutdown().await;

    let (attempts, failed): (i64, i64) = sqlx::query_as(&format!(
        "SELECT count(*), count(*) FILTER (WHERE status <> 'success') FROM {schema}.attempts"
    ))
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("{attempts} attempts during the rotation, {failed} failed");
    assert_eq!(attempts, (TENANTS * EVENTS_PER_TENANT) as i64);
    assert_eq!(failed, 0);

    // Key B alone: A is no longer needed for anything.
    let on_b_only = start_server(with(&[("SHEAF_SECRETS_KEY", &key_b)])).await;
    let client = Client::new(on_b_only.addr);
    for (tenant, id) in &destinations {
        let read = client
            .get(&format!("/api/v1/tenants/{tenant}/destinations/{id}"))
            .await;
        assert_eq!(read.status, 200, "{read:?}");
    }
    let (tenant, _) = &destinations[0];
    assert_eq!(
        client.publish(tenant, "after-a", json!({})).await.status,
        202
    );
    let last = ["after-a".to_owned()];
    assert!(receiver.delivers_all(&last, Duration::from_secs(20)).await);
    on_b_only.shutdown().await;

    // A value under a key neither setting holds: the pass re-seals nothing of it, names the key
    // and fails, so it is never mistaken for done.
    sqlx::query(&format!(
        "UPDATE {schema}.destinations SET secret = 'enc:v2:deadbeef:AAAA' WHERE id = $1::uuid"
    ))
    .bind(&destinations[1].1)
    .execute(&pool)
    .await
    .unwrap();
    let stuck = reseal(&with(&[("SHEAF_SECRETS_KEY", &key_b)]), &[]).await;
    println!("with a foreign key id: {}", said(&stuck));
    assert!(!stuck.status.success());
    assert!(
        said(&stuck).contains("sealed under key deadbeef"),
        "{}",
        said(&stuck)
    );
    assert!(said(&stuck).contains("0 re-sealed"), "{}", said(&stuck));
    assert!(said(&stuck).contains("1 remain"), "{}", said(&stuck));
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

#[tokio::test]
async fn reseal_on_memory_stores_says_there_is_nothing_to_reseal() {
    let env = env_with(&[("SHEAF_SECRETS_KEY", &BASE64.encode([0xa1u8; 32]))]);
    let output = reseal(&env, &[]).await;
    assert!(output.status.success(), "{}", said(&output));
    assert!(
        said(&output).contains("nothing is stored across processes"),
        "{}",
        said(&output)
    );
    let wrong = reseal(&env, &["--batch", "0"]).await;
    assert!(!wrong.status.success());
    assert!(
        said(&wrong).contains("--batch must be 1 to"),
        "{}",
        said(&wrong)
    );
}
