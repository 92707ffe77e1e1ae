//! Tests of sealing and opening with the current and the previous key, both formats, URL
//! passwords through the store wrapper, and the swap a re-seal makes.

use super::*;
use sheaf_memory::MemoryEntityStore;
use sheaf_store::{DestinationKind, Topics};

const A: [u8; 32] = [7u8; 32];
const B: [u8; 32] = [8u8; 32];

fn key_of(bytes: [u8; 32]) -> SecretsKey {
    SecretsKey::from_base64(&BASE64.encode(bytes)).unwrap()
}

fn key() -> SecretsKey {
    key_of(A)
}

/// B seals, A only opens: the second step of a rotation from A to B.
fn rotated() -> SecretsKey {
    key_of(B).with_previous(&BASE64.encode(A)).unwrap()
}

fn secret() -> Secret {
    Secret::new("whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=").unwrap()
}

/// A value in the format written before key ids, as the previous version sealed it.
fn sealed_v1(key: &SecretsKey, tenant: &TenantId, id: &DestinationId, plain: &str) -> String {
    let bytes = key
        .current
        .seal_bytes(plain.as_bytes(), &aad(Sealed::Secret, tenant, id))
        .unwrap();
    format!("{SEALED_PREFIX_V1}{}", BASE64.encode(bytes))
}

#[test]
fn keys_must_be_32_bytes_of_base64() {
    assert!(SecretsKey::from_base64("not base64!").is_err());
    assert!(
        SecretsKey::from_base64(&BASE64.encode([1u8; 16]))
            .unwrap_err()
            .contains("16 bytes")
    );
    assert!(format!("{:?}", key()).contains("redacted"));
    assert!(format!("{:?}", rotated()).contains("redacted"));
}

#[test]
fn a_key_id_is_eight_hex_digits_of_the_key_and_the_previous_key_must_differ() {
    assert_eq!(key().id().len(), 8);
    assert!(key().id().bytes().all(|b| b.is_ascii_hexdigit()));
    assert_eq!(key().id(), key_of(A).id(), "the id follows from the key");
    assert_ne!(key().id(), key_of(B).id());
    assert_eq!(rotated().id(), key_of(B).id());
    assert_eq!(rotated().previous_id(), Some(key().id()));
    let same = key().with_previous(&BASE64.encode(A)).unwrap_err();
    assert!(same.contains("same key as SHEAF_SECRETS_KEY"), "{same}");
    assert!(
        key()
            .with_previous("c2hvcnQ=")
            .unwrap_err()
            .contains("bytes")
    );
}

#[test]
fn sealed_secrets_open_only_for_their_destination_and_key() {
    let tenant = TenantId::new("acme").unwrap();
    let id = DestinationId::generate();
    let a = key().seal(&tenant, &id, &secret()).unwrap();
    let b = key().seal(&tenant, &id, &secret()).unwrap();
    assert_ne!(a, b, "a fresh nonce each time");
    let prefix = format!("{SEALED_PREFIX}{}:", key().id());
    assert!(a.expose().starts_with(&prefix), "{}", a.expose());
    assert!(!a.expose().contains("c2VjcmV0"));
    assert_eq!(key().open(&tenant, &id, a.expose()).unwrap(), secret());
    // Another destination, another tenant: refused.
    assert!(
        key()
            .open(&tenant, &DestinationId::generate(), a.expose())
            .is_err()
    );
    assert!(
        key()
            .open(&TenantId::new("other").unwrap(), &id, a.expose())
            .is_err()
    );
    // Another key: refused, naming both key ids and the settings.
    let err = key_of(B).open(&tenant, &id, a.expose()).unwrap_err();
    let message = err.to_string();
    assert!(message.contains(key().id()), "{message}");
    assert!(message.contains(key_of(B).id()), "{message}");
    assert!(
        message.contains("SHEAF_SECRETS_KEY_PREVIOUS (unset)"),
        "{message}"
    );
    // Damaged: no key id, bad base64, too short, a forged key id.
    for damaged in [
        "enc:v2:AAAA".to_owned(),
        format!("{prefix}!!!"),
        format!("{prefix}AAAA"),
        "enc:v9:whatever".to_owned(),
    ] {
        assert!(key().open(&tenant, &id, &damaged).is_err(), "{damaged}");
    }
    let relabelled = a.expose().replace(key().id(), key_of(B).id());
    let err = key_of(B).open(&tenant, &id, &relabelled).unwrap_err();
    assert!(err.to_string().contains("does not decrypt"), "{err}");
}

#[test]
fn the_previous_key_opens_and_never_seals() {
    let tenant = TenantId::new("acme").unwrap();
    let id = DestinationId::generate();
    let under_a = key().seal(&tenant, &id, &secret()).unwrap();
    let v1_under_a = sealed_v1(&key(), &tenant, &id, secret().expose());
    let v1_under_b = sealed_v1(&key_of(B), &tenant, &id, secret().expose());
    let keys = rotated();
    for value in [under_a.expose(), &v1_under_a, &v1_under_b] {
        assert_eq!(keys.open(&tenant, &id, value).unwrap(), secret(), "{value}");
    }
    // Writes go under the current key only.
    let under_b = keys.seal(&tenant, &id, &secret()).unwrap();
    assert!(
        under_b
            .expose()
            .starts_with(&format!("{SEALED_PREFIX}{}:", key_of(B).id()))
    );
    assert_eq!(keys.sealed_under(under_b.expose()), SealedUnder::Current);
    assert_eq!(keys.sealed_under(under_a.expose()), SealedUnder::Other);
    assert_eq!(keys.sealed_under(&v1_under_b), SealedUnder::Other);
    assert_eq!(keys.sealed_under(secret().expose()), SealedUnder::Nothing);
    // Once the previous key is dropped, what it sealed no longer opens; a v1 value names
    // both settings.
    assert!(key_of(B).open(&tenant, &id, under_a.expose()).is_err());
    let err = key_of(B).open(&tenant, &id, &v1_under_a).unwrap_err();
    assert!(
        err.to_string().contains("SHEAF_SECRETS_KEY_PREVIOUS"),
        "{err}"
    );
    // The v1 format is the previous version's: a v1 value under A opens with A alone.
    assert_eq!(key().open(&tenant, &id, &v1_under_a).unwrap(), secret());
}

fn broker_destination(tenant: &TenantId, url: &str) -> Destination {
    let now = Timestamp::now();
    Destination {
        id: DestinationId::generate(),
        tenant_id: tenant.clone(),
        kind: DestinationKind::new("rabbitmq").unwrap(),
        config: serde_json::json!({ "url": url, "exchange": "events" }),
        topics: Topics::All,
        filter: None,
        rate_limit: None,
        headers: Default::default(),
        transform: None,
        ordering_key: None,
        dead_letter_blocks_key: false,
        enabled: true,
        disabled_reason: None,
        consecutive_failures: 0,
        secret: secret(),
        previous_secret: None,
        created_at: now,
        updated_at: now,
    }
}

/// An Ed25519 private key (`whsk_…`) is a signing key like an HMAC secret: sealed in the store,
/// current and previous alike, and opened as it was for the signer.
#[tokio::test]
async fn an_ed25519_private_key_is_sealed_like_a_secret() {
    let raw: Arc<dyn EntityStore> = Arc::new(MemoryEntityStore::new());
    let store = SealedEntityStore::new(Arc::clone(&raw), Some(key()));
    let tenant = TenantId::new("acme").unwrap();
    store
        .upsert_tenant(&tenant, &Default::default())
        .await
        .unwrap();
    let private = Secret::new("whsk_nWGxne/9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A=").unwrap();
    let mut d = broker_destination(&tenant, "amqp://127.0.0.1:5672/%2f");
    d.secret = private.clone();
    store.create_destination(&d).await.unwrap();
    let stored = raw.get_destination(&tenant, &d.id).await.unwrap().unwrap();
    assert!(
        stored.secret.expose().starts_with(SEALED_PREFIX),
        "{}",
        stored.secret.expose()
    );
    assert!(!stored.secret.expose().contains("nWGxne"));
    let read = store
        .get_destination(&tenant, &d.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.secret, private);
    // Rotated: the new key and the previous one both sealed, both opened.
    let next = Secret::new("whsk_AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=").unwrap();
    store
        .rotate_secret(&tenant, &d.id, &next, Timestamp::now())
        .await
        .unwrap();
    let stored = raw.get_destination(&tenant, &d.id).await.unwrap().unwrap();
    let previous = stored.previous_secret.as_ref().unwrap();
    assert!(!stored.secret.expose().contains("whsk_"));
    assert!(!previous.secret.expose().contains("whsk_"));
    let read = store
        .get_destination(&tenant, &d.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.secret, next);
    assert_eq!(read.previous_secret.unwrap().secret, private);
}

#[tokio::test]
async fn a_url_password_is_sealed_in_the_store_and_opened_for_the_engine() {
    let raw: Arc<dyn EntityStore> = Arc::new(MemoryEntityStore::new());
    let store = SealedEntityStore::new(Arc::clone(&raw), Some(key()));
    let tenant = TenantId::new("acme").unwrap();
    store
        .upsert_tenant(&tenant, &Default::default())
        .await
        .unwrap();
    let url = "amqp://guest:pa%40ss-w0rd@127.0.0.1:5672/%2f";
    let d = broker_destination(&tenant, url);
    store.create_destination(&d).await.unwrap();
    let stored = raw.get_destination(&tenant, &d.id).await.unwrap().unwrap();
    let stored_url = stored.config["url"].as_str().unwrap();
    println!("stored: {stored_url}");
    assert!(!stored_url.contains("pa%40ss"), "{stored_url}");
    assert!(stored_url.starts_with(&format!("amqp://guest:{SEALED_PREFIX}{}:", key().id())));
    assert!(stored_url.ends_with("@127.0.0.1:5672/%2f"), "{stored_url}");
    assert_eq!(stored.config["exchange"], "events");
    assert_eq!(store.fully_sealed(&stored), Some(true));
    let read = store
        .get_destination(&tenant, &d.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.config, d.config);

    // A patch's config is sealed too.
    let patch = DestinationPatch {
        config: Some(serde_json::json!({ "url": "amqp://guest:n3w@127.0.0.1:5672/%2f" })),
        ..Default::default()
    };
    let updated = store
        .update_destination(&tenant, &d.id, &patch)
        .await
        .unwrap();
    assert_eq!(updated.config, patch.config.clone().unwrap());
    let stored = raw.get_destination(&tenant, &d.id).await.unwrap().unwrap();
    assert!(!stored.config["url"].as_str().unwrap().contains("n3w"));

    // The same sealed password copied into another destination's row does not open there.
    let other = broker_destination(&tenant, "amqp://guest:x@127.0.0.1:5672/%2f");
    let mut moved = other.clone();
    moved.config = stored.config.clone();
    raw.create_destination(&moved).await.unwrap();
    assert!(store.get_destination(&tenant, &other.id).await.is_err());

    // Written before a key (plaintext) still reads; without a key a sealed one is refused
    // by name.
    let legacy = broker_destination(&tenant, "nats://u:plain@127.0.0.1:4222");
    raw.create_destination(&legacy).await.unwrap();
    let read = store
        .get_destination(&tenant, &legacy.id)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read.config, legacy.config);
    assert_eq!(store.fully_sealed(&legacy), Some(false));
    let keyless = SealedEntityStore::new(Arc::clone(&raw), None);
    let err = keyless.get_destination(&tenant, &d.id).await.unwrap_err();
    assert!(
        err.to_string().contains("SHEAF_SECRETS_KEY is not set"),
        "{err}"
    );
    let mut half_sealed = broker_destination(&tenant, "amqp://x@h");
    half_sealed.config = stored.config.clone();
    raw.create_destination(&half_sealed).await.unwrap();
    let err = keyless
        .get_destination(&tenant, &half_sealed.id)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("config.url password"), "{err}");
}

#[tokio::test]
async fn a_reseal_swap_moves_every_credential_to_the_current_key() {
    let raw: Arc<dyn EntityStore> = Arc::new(MemoryEntityStore::new());
    let tenant = TenantId::new("acme").unwrap();
    raw.upsert_tenant(&tenant, &Default::default())
        .await
        .unwrap();
    let old = SealedEntityStore::new(Arc::clone(&raw), Some(key()));
    let d = broker_destination(&tenant, "amqp://guest:s3cret@127.0.0.1:5672/%2f");
    old.create_destination(&d).await.unwrap();
    old.rotate_secret(
        &tenant,
        &d.id,
        &Secret::new("whsec_bmV3").unwrap(),
        Timestamp::now(),
    )
    .await
    .unwrap();
    let stored = raw.get_destination(&tenant, &d.id).await.unwrap().unwrap();

    let new = SealedEntityStore::new(Arc::clone(&raw), Some(rotated()));
    assert_eq!(new.fully_sealed(&stored), Some(false));
    let swap = new.reseal_swap(&stored).unwrap();
    assert_eq!(swap.expected, StoredCredentials::of(&stored));
    let mut resealed = stored.clone();
    resealed.secret = swap.replacement.secret.clone();
    resealed.previous_secret = stored.previous_secret.as_ref().map(|p| PreviousSecret {
        secret: swap.replacement.previous_secret.clone().unwrap(),
        expires_at: p.expires_at,
    });
    resealed.config = swap.replacement.config.clone();
    assert_eq!(new.fully_sealed(&resealed), Some(true));
    // The same plaintext, now opening with B alone.
    let b_only = SealedEntityStore::new(Arc::clone(&raw), Some(key_of(B)));
    let opened = b_only.open_destination(resealed).unwrap();
    assert_eq!(opened, new.open_destination(stored).unwrap());
    assert_eq!(opened.config, d.config);
}
