//! Destination signing secrets encrypted at rest: [`SecretsKey`] (AES-256-GCM, from
//! `SHEAF_SECRETS_KEY`) and [`SealedEntityStore`], the `EntityStore` wrapper that every backend
//! sits behind, so memory, Postgres and any future store hold only ciphertext.
//!
//! The wrapper works at the store boundary because that is the one place every secret crosses on
//! its way to storage: the handlers and the delivery engine keep working with plaintext
//! `Destination`s, and no backend needs to know about keys.
//!
//! Stored form: `enc:v1:` followed by the base64 of a fresh 96-bit random nonce and the
//! ciphertext with its 128-bit tag. The associated data binds a ciphertext to its destination
//! (`sheaf destination secret v1`, the tenant id and the destination id), so a ciphertext copied
//! into another destination's row does not decrypt. A secret's plaintext is `whsec_…`, never
//! `enc:…`, so the prefix tells the two apart:
//!
//! - rows written before a key was configured (plaintext) still read; a rotation seals the new
//!   secret, and the old plaintext one stays as the previous secret until its grace ends (the
//!   store moves the stored value as it is, and `EntityStore` has no call that rewrites it);
//! - an `enc:` value read without a key, or with another key, is an error that names
//!   `SHEAF_SECRETS_KEY`; deliveries to that destination wait (they are retried) rather than go
//!   out unsigned.
//!
//! Not done yet (future work, see `docs/security.md`): rotating `SHEAF_SECRETS_KEY` itself. It
//! needs a second, decrypt-only key and a pass that re-seals every destination; the `v1` in the
//! prefix leaves room for a key id.

use std::sync::Arc;

use aes_gcm::Nonce;
use aes_gcm::aead::{Aead, Payload};
use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use sheaf_store::{
    DeliveryHealth, Destination, DestinationId, DestinationPatch, EntityStore, Error, HealthChange,
    PreviousSecret, Result, Secret, Tenant, TenantId, TenantUpsert, Timestamp,
};

pub use crate::settings::SecretsKey;

/// The prefix of a sealed secret, with the format's version.
pub const SEALED_PREFIX: &str = "enc:v1:";

impl SecretsKey {
    fn aad(tenant: &TenantId, id: &DestinationId) -> Vec<u8> {
        let mut aad = b"sheaf destination secret v1\0".to_vec();
        aad.extend_from_slice(tenant.as_str().as_bytes());
        aad.push(0);
        aad.extend_from_slice(id.as_uuid().as_bytes());
        aad
    }

    /// Encrypts `secret` for the destination `(tenant, id)`.
    pub fn seal(&self, tenant: &TenantId, id: &DestinationId, secret: &Secret) -> Result<Secret> {
        let nonce_bytes: [u8; 12] = rand::random();
        let nonce = Nonce::from(nonce_bytes);
        let aad = Self::aad(tenant, id);
        let sealed = self
            .cipher
            .encrypt(
                &nonce,
                Payload {
                    msg: secret.expose().as_bytes(),
                    aad: &aad,
                },
            )
            .map_err(|_| backend("could not encrypt a destination secret"))?;
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&sealed);
        Secret::new(format!("{SEALED_PREFIX}{}", BASE64.encode(out)))
    }

    /// Decrypts a sealed secret of the destination `(tenant, id)`.
    fn open(&self, tenant: &TenantId, id: &DestinationId, sealed: &str) -> Result<Secret> {
        let wrong = || {
            backend(format!(
                "the signing secret of destination {id} does not decrypt with SHEAF_SECRETS_KEY (another key, or a damaged row)"
            ))
        };
        let bytes = BASE64.decode(sealed).map_err(|_| wrong())?;
        if bytes.len() < 12 + 16 {
            return Err(wrong());
        }
        let (nonce, ciphertext) = bytes.split_at(12);
        let nonce: [u8; 12] = nonce.try_into().map_err(|_| wrong())?;
        let aad = Self::aad(tenant, id);
        let plain = self
            .cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad: &aad,
                },
            )
            .map_err(|_| wrong())?;
        let text = String::from_utf8(plain).map_err(|_| wrong())?;
        Secret::new(text)
    }
}

fn backend(message: impl Into<String>) -> Error {
    Error::Backend {
        message: message.into(),
        source: None,
    }
}

/// An `EntityStore` that seals secrets on the way in and opens them on the way out. Without a
/// key it passes plaintext through, and refuses to hand out sealed values it cannot open.
#[derive(Debug)]
pub struct SealedEntityStore {
    inner: Arc<dyn EntityStore>,
    key: Option<SecretsKey>,
}

impl SealedEntityStore {
    /// Wraps `inner`; `key` is `SHEAF_SECRETS_KEY`, if set.
    pub fn new(inner: Arc<dyn EntityStore>, key: Option<SecretsKey>) -> Self {
        Self { inner, key }
    }

    /// The store this one wraps (for tests that read what a backend really holds).
    pub fn inner(&self) -> &Arc<dyn EntityStore> {
        &self.inner
    }

    fn seal(&self, tenant: &TenantId, id: &DestinationId, secret: &Secret) -> Result<Secret> {
        match &self.key {
            Some(key) => key.seal(tenant, id, secret),
            None => Ok(secret.clone()),
        }
    }

    fn open(&self, tenant: &TenantId, id: &DestinationId, stored: &Secret) -> Result<Secret> {
        let Some(sealed) = stored.expose().strip_prefix(SEALED_PREFIX) else {
            // Written before a key was configured: plaintext.
            return Ok(stored.clone());
        };
        match &self.key {
            Some(key) => key.open(tenant, id, sealed),
            None => Err(backend(format!(
                "the signing secret of destination {id} is encrypted but SHEAF_SECRETS_KEY is not set"
            ))),
        }
    }

    fn seal_destination(&self, d: &Destination) -> Result<Destination> {
        let mut sealed = d.clone();
        sealed.secret = self.seal(&d.tenant_id, &d.id, &d.secret)?;
        if let Some(previous) = &d.previous_secret {
            sealed.previous_secret = Some(PreviousSecret {
                secret: self.seal(&d.tenant_id, &d.id, &previous.secret)?,
                expires_at: previous.expires_at,
            });
        }
        Ok(sealed)
    }

    fn open_destination(&self, mut d: Destination) -> Result<Destination> {
        d.secret = self.open(&d.tenant_id, &d.id, &d.secret)?;
        if let Some(previous) = d.previous_secret.take() {
            d.previous_secret = Some(PreviousSecret {
                secret: self.open(&d.tenant_id, &d.id, &previous.secret)?,
                expires_at: previous.expires_at,
            });
        }
        Ok(d)
    }
}

#[async_trait]
impl EntityStore for SealedEntityStore {
    async fn upsert_tenant(
        &self,
        id: &TenantId,
        metadata: &std::collections::BTreeMap<String, String>,
    ) -> Result<TenantUpsert> {
        self.inner.upsert_tenant(id, metadata).await
    }

    async fn get_tenant(&self, id: &TenantId) -> Result<Option<Tenant>> {
        self.inner.get_tenant(id).await
    }

    async fn delete_tenant(&self, id: &TenantId) -> Result<()> {
        self.inner.delete_tenant(id).await
    }

    async fn create_destination(&self, destination: &Destination) -> Result<()> {
        self.inner
            .create_destination(&self.seal_destination(destination)?)
            .await
    }

    async fn get_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
    ) -> Result<Option<Destination>> {
        self.inner
            .get_destination(tenant, id)
            .await?
            .map(|d| self.open_destination(d))
            .transpose()
    }

    async fn list_destinations(&self, tenant: &TenantId) -> Result<Vec<Destination>> {
        self.inner
            .list_destinations(tenant)
            .await?
            .into_iter()
            .map(|d| self.open_destination(d))
            .collect()
    }

    async fn update_destination(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        patch: &DestinationPatch,
    ) -> Result<Destination> {
        let updated = self.inner.update_destination(tenant, id, patch).await?;
        self.open_destination(updated)
    }

    async fn record_delivery_health(
        &self,
        reports: &[DeliveryHealth],
        disable_after: u32,
    ) -> Result<Vec<HealthChange>> {
        let changes = self
            .inner
            .record_delivery_health(reports, disable_after)
            .await?;
        changes
            .into_iter()
            .map(|change| match change {
                HealthChange::Disabled(d) => self.open_destination(d).map(HealthChange::Disabled),
                HealthChange::Recovered(d) => self.open_destination(d).map(HealthChange::Recovered),
            })
            .collect()
    }

    async fn rotate_secret(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        new_secret: &Secret,
        previous_expires_at: Timestamp,
    ) -> Result<Destination> {
        // The backend moves the stored current value (sealed, or plaintext from before a key)
        // into the previous slot as it is; both open the same way afterwards.
        let sealed = self.seal(tenant, id, new_secret)?;
        let rotated = self
            .inner
            .rotate_secret(tenant, id, &sealed, previous_expires_at)
            .await?;
        self.open_destination(rotated)
    }

    async fn delete_destination(&self, tenant: &TenantId, id: &DestinationId) -> Result<()> {
        self.inner.delete_destination(tenant, id).await
    }

    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> SecretsKey {
        SecretsKey::from_base64(&BASE64.encode([7u8; 32])).unwrap()
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
    }

    #[test]
    fn sealed_secrets_open_only_for_their_destination_and_key() {
        let tenant = TenantId::new("acme").unwrap();
        let id = DestinationId::generate();
        let secret = Secret::new("whsec_c2VjcmV0LXNlY3JldC1zZWNyZXQ=").unwrap();
        let a = key().seal(&tenant, &id, &secret).unwrap();
        let b = key().seal(&tenant, &id, &secret).unwrap();
        assert_ne!(a, b, "a fresh nonce each time");
        assert!(a.expose().starts_with(SEALED_PREFIX));
        assert!(!a.expose().contains("c2VjcmV0"));
        let body = a.expose().strip_prefix(SEALED_PREFIX).unwrap();
        assert_eq!(key().open(&tenant, &id, body).unwrap(), secret);
        // Another destination, another tenant, another key: refused.
        assert!(
            key()
                .open(&tenant, &DestinationId::generate(), body)
                .is_err()
        );
        assert!(
            key()
                .open(&TenantId::new("other").unwrap(), &id, body)
                .is_err()
        );
        let other = SecretsKey::from_base64(&BASE64.encode([8u8; 32])).unwrap();
        let err = other.open(&tenant, &id, body).unwrap_err();
        assert!(err.to_string().contains("SHEAF_SECRETS_KEY"), "{err}");
        assert!(key().open(&tenant, &id, "AAAA").is_err());
    }
}
