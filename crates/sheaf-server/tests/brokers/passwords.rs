//! A broker password in `config.url` on the real brokers: RabbitMQ's (the shared test broker)
//! sealed in Postgres, NATS's (a server of the test's own that requires a login) sealed in the
//! memory store; both shown as `***`, kept by an update that sends `***` back for the same
//! broker, and still used to log in and deliver.

use std::time::Duration;

use serde_json::json;

use super::{NatsTarget, RabbitTarget, create, exactly_once};
use crate::support::Client;

/// A RabbitMQ password in `config.url` is sealed in Postgres, shown as `***`, kept when an update
/// sends `***` back for the same broker, and still used for delivery on the real broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_broker_password_is_sealed_at_rest_redacted_in_the_api_and_still_delivers() {
    let test = "a_broker_password_is_sealed_at_rest_redacted_in_the_api";
    let postgres = sheaf_testenv::require_postgres!(test);
    let amqp = sheaf_testenv::require_rabbitmq!(test);
    let password = reqwest::Url::parse(&amqp)
        .unwrap()
        .password()
        .expect("the test broker's URL has a password")
        .to_owned();
    let schema = sheaf_testenv::unique_name("brokerpw");
    let key = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([0x5eu8; 32])
    };
    let server = crate::support::start_server(crate::support::env_with(&[
        ("SHEAF_QUEUE", "postgres"),
        ("SHEAF_LOG_STORE", "postgres"),
        ("SHEAF_POSTGRES_URL", postgres.as_str()),
        ("SHEAF_POSTGRES_SCHEMA", schema.as_str()),
        ("SHEAF_ENTITY_CACHE_TTL", "0s"),
        ("SHEAF_SECRETS_KEY", key.as_str()),
    ]))
    .await;
    let client = Client::new(server.addr);
    let put = client.send("PUT", "/api/v1/tenants/pw", None).await;
    assert_eq!(put.status, 201, "{put:?}");
    let rabbit = RabbitTarget::declare(&amqp).await;
    let created = create(
        &client,
        "pw",
        json!({ "type": "rabbitmq", "topics": ["*"],
                "config": { "url": amqp, "exchange": rabbit.exchange } }),
    )
    .await;
    let id = created["id"].as_str().unwrap().to_owned();
    let shown = created["config"]["url"].as_str().unwrap().to_owned();
    println!("the API shows {shown}");
    assert_eq!(shown, amqp.replace(&format!(":{password}@"), ":***@"));
    let read = client
        .get(&format!("/api/v1/tenants/pw/destinations/{id}"))
        .await;
    assert_eq!(read.body["config"]["url"], shown.as_str());

    let pool = sqlx::PgPool::connect(&postgres).await.unwrap();
    let stored: String = sqlx::query_scalar(&format!(
        "SELECT config->>'url' FROM {schema}.destinations WHERE id = $1::uuid"
    ))
    .bind(&id)
    .fetch_one(&pool)
    .await
    .unwrap();
    println!("Postgres holds {stored}");
    assert!(stored.contains(":enc:v2:"), "{stored}");
    assert!(!stored.contains(&format!(":{password}@")), "{stored}");

    crate::controls::publish(&client, "pw", "pw-1", "t", &json!({})).await;
    assert_eq!(
        rabbit.drain(1, Duration::from_secs(30)).await,
        vec!["pw-1".to_owned()]
    );

    // The redacted URL sent back keeps the stored password; deliveries go on with it.
    let patched = client
        .send(
            "PATCH",
            &format!("/api/v1/tenants/pw/destinations/{id}"),
            Some(json!({ "config": { "url": shown, "exchange": rabbit.exchange } })),
        )
        .await;
    assert_eq!(patched.status, 200, "{patched:?}");
    assert_eq!(patched.body["config"]["url"], shown.as_str());
    crate::controls::publish(&client, "pw", "pw-2", "t", &json!({})).await;
    assert_eq!(
        rabbit.drain(1, Duration::from_secs(30)).await,
        vec!["pw-2".to_owned()]
    );

    // ... but not for another host: the password would go where its writer never sent it.
    let elsewhere = shown.replace("127.0.0.1", "localhost");
    assert_ne!(elsewhere, shown);
    let refused = client
        .send(
            "PATCH",
            &format!("/api/v1/tenants/pw/destinations/{id}"),
            Some(json!({ "config": { "url": elsewhere, "exchange": rabbit.exchange } })),
        )
        .await;
    assert_eq!(refused.status, 400, "{refused:?}");
    assert_eq!(refused.error_code(), "invalid_config");
    server.shutdown().await;
    sqlx::raw_sql(&format!("DROP SCHEMA {schema} CASCADE"))
        .execute(&pool)
        .await
        .unwrap();
}

/// The same for NATS, on a server of the test's own that requires a login: the memory entity
/// store holds the password sealed, the API shows `***`, and JetStream gets every event before
/// and after an update that sends the redacted URL back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_nats_password_is_sealed_in_the_store_and_still_delivers() {
    let test = "a_nats_password_is_sealed_in_the_store_and_still_delivers";
    if let Err(missing) = sheaf_testenv::brokers::nats_server_binary() {
        assert!(
            !sheaf_testenv::in_ci(),
            "{test}: under CI nats-server must be installed: {missing:#}"
        );
        println!("skipping {test}: {missing:#}");
        return;
    }
    let password = "n4ts-pa55word";
    let server = tokio::task::spawn_blocking(move || {
        sheaf_testenv::brokers::NatsServer::start_with_login("sheaf", password)
    })
    .await
    .unwrap()
    .expect("a NATS server with a login starts");
    let url = server.url_with_login();
    let stores = sheaf_server::Stores::memory();
    let raw = stores.entities.clone();
    let key = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode([0x6au8; 32])
    };
    let config = sheaf_server::Config::load(crate::support::env_with(&[(
        "SHEAF_SECRETS_KEY",
        key.as_str(),
    )]))
    .unwrap();
    let sheaf = sheaf_server::start_with(config, stores).await.unwrap();
    let client = Client::new(sheaf.addr);
    let put = client.send("PUT", "/api/v1/tenants/natspw", None).await;
    assert_eq!(put.status, 201, "{put:?}");
    let admin = async_nats::ConnectOptions::new()
        .user_and_password("sheaf".to_owned(), password.to_owned())
        .connect(server.url())
        .await
        .expect("the test logs in to NATS");
    let stream = NatsTarget::create_on(admin).await;
    let created = create(
        &client,
        "natspw",
        json!({ "type": "nats", "topics": ["*"],
                "config": { "url": url, "subject": stream.subject } }),
    )
    .await;
    let shown = created["config"]["url"].as_str().unwrap().to_owned();
    assert_eq!(shown, url.replace(password, "***"));
    let id: sheaf_store::DestinationId = created["id"].as_str().unwrap().parse().unwrap();
    let tenant = sheaf_store::TenantId::new("natspw").unwrap();
    let stored = raw.get_destination(&tenant, &id).await.unwrap().unwrap();
    let stored_url = stored.config["url"].as_str().unwrap();
    println!("the store holds {stored_url}");
    assert!(
        stored_url.starts_with("nats://sheaf:enc:v2:"),
        "{stored_url}"
    );
    assert!(!stored_url.contains(password), "{stored_url}");

    crate::controls::publish(&client, "natspw", "nats-pw-1", "t", &json!({})).await;
    let patched = client
        .send(
            "PATCH",
            &format!("/api/v1/tenants/natspw/destinations/{id}"),
            Some(json!({ "config": { "url": shown, "subject": stream.subject } })),
        )
        .await;
    assert_eq!(patched.status, 200, "{patched:?}");
    crate::controls::publish(&client, "natspw", "nats-pw-2", "t", &json!({})).await;
    let got = stream.drain(2, Duration::from_secs(30)).await;
    exactly_once(
        "memory",
        "JetStream with a login",
        &got,
        &["nats-pw-1".to_owned(), "nats-pw-2".to_owned()],
    );
    sheaf.shutdown().await;
    drop(server);
}
