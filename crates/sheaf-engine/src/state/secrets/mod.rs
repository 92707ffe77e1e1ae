//! Destination credentials encrypted at rest: [`SecretsKey`] (AES-256-GCM, from
//! `SHEAF_SECRETS_KEY`, with `SHEAF_SECRETS_KEY_PREVIOUS` as a decrypt-only second key while the
//! key is rotated) and [`SealedEntityStore`], the `EntityStore` wrapper that every backend sits
//! behind, so memory, Postgres and any future store hold only ciphertext.
//!
//! The wrapper works at the store boundary because that is the one place every credential
//! crosses on its way to storage: the handlers and the delivery engine keep working with
//! plaintext `Destination`s, and no backend needs to know about keys. It seals three values of
//! a destination: its signing secret, its previous secret, and the password of its
//! `config.url` (a broker URL's `user:password@`, see [`crate::state::url_password`]; the rule is
//! the same for every destination type, so the engine still names none).
//!
//! Stored form, chosen so that a value says which key sealed it:
//!
//! - `enc:v2:<key id>:` then the URL-safe base64 (no padding) of a fresh 96-bit random nonce and
//!   the ciphertext with its 128-bit tag. The key id is 8 hex digits derived from the key
//!   ([`SecretsKey`]); the alphabet has no `/`, `@`, `?` or `#`, so a sealed password sits in a
//!   URL's userinfo as it is. Every write uses this form, with the current key.
//! - `enc:v1:` then the standard base64 of the same: what was written before key ids. It names
//!   no key, so it is tried with the current key, then the previous one.
//!
//! The associated data binds a ciphertext to its destination and to what it is (`sheaf
//! destination secret v1` or `sheaf destination url password v1`, the tenant id and the
//! destination id), so a ciphertext copied into another destination's row, or from the secret
//! into the URL, does not decrypt. A secret's plaintext is `whsec_…` and a password is what the
//! tenant wrote, never `enc:…` in practice, so the prefix tells sealed from plain:
//!
//! - values written before a key was configured (plaintext) still read; a rotation seals the new
//!   secret, and the old plaintext one stays as the previous secret until its grace ends or
//!   `sheaf secrets reseal` seals it;
//! - an `enc:` value read without a key, or under a key id that is neither key, is an error
//!   that names the settings and the key ids; deliveries to that destination wait (they are
//!   retried) rather than go out unsigned.
//!
//! Rotating `SHEAF_SECRETS_KEY` itself: processes restarted with the new key and the old one as
//! `SHEAF_SECRETS_KEY_PREVIOUS` read everything and write only under the new key;
//! [`SealedEntityStore::reseal`] (`sheaf secrets reseal`) then re-seals what is left under the
//! old key, in pages and by compare-and-set, while servers keep running (`docs/operations.md`).

use std::sync::Arc;

use aes_gcm::Nonce;
use aes_gcm::aead::{Aead, Payload};
use async_trait::async_trait;
use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD as BASE64, URL_SAFE_NO_PAD as BASE64_URL};
use sheaf_store::{
    CredentialsSwap, DeliveryHealth, Destination, DestinationId, DestinationPatch, EntityStore,
    Error, HealthChange, PreviousSecret, Result, Secret, StoredCredentials, Tenant, TenantId,
    TenantUpsert, Timestamp,
};

use crate::config::secrets_key::SealingKey;
pub use crate::config::secrets_key::SecretsKey;
use crate::state::url_password;

/// The prefix of every sealed value, whatever its version.
const SEALED: &str = "enc:";
/// The prefix of a value sealed before key ids, with the version of that format.
pub const SEALED_PREFIX_V1: &str = "enc:v1:";
/// The prefix of a value sealed with a key id (`enc:v2:<key id>:`), the form every write uses.
pub const SEALED_PREFIX: &str = "enc:v2:";

/// What a sealed value is, which the associated data says so it cannot be moved to another use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sealed {
    Secret,
    UrlPassword,
}

impl Sealed {
    fn label(self) -> &'static [u8] {
        match self {
            Sealed::Secret => b"sheaf destination secret v1\0",
            Sealed::UrlPassword => b"sheaf destination url password v1\0",
        }
    }

    fn what(self) -> &'static str {
        match self {
            Sealed::Secret => "signing secret",
            Sealed::UrlPassword => "config.url password",
        }
    }
}

/// Which key a stored value is under, for the re-sealing pass.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SealedUnder {
    /// Not sealed: written before a key was configured.
    Nothing,
    /// The current key: nothing to do.
    Current,
    /// Another key: the previous one, an older one, or (`enc:v1:`) whichever opens it.
    Other,
}

fn aad(what: Sealed, tenant: &TenantId, id: &DestinationId) -> Vec<u8> {
    let mut aad = what.label().to_vec();
    aad.extend_from_slice(tenant.as_str().as_bytes());
    aad.push(0);
    aad.extend_from_slice(id.as_uuid().as_bytes());
    aad
}

impl SealingKey {
    fn seal_bytes(&self, plain: &[u8], aad: &[u8]) -> Result<Vec<u8>> {
        let nonce_bytes: [u8; 12] = rand::random();
        let sealed = self
            .cipher
            .encrypt(&Nonce::from(nonce_bytes), Payload { msg: plain, aad })
            .map_err(|_| backend("could not encrypt a destination credential"))?;
        let mut out = nonce_bytes.to_vec();
        out.extend_from_slice(&sealed);
        Ok(out)
    }

    /// The plaintext of nonce ‖ ciphertext ‖ tag, or `None` if it does not open with this key.
    fn open_bytes(&self, bytes: &[u8], aad: &[u8]) -> Option<String> {
        if bytes.len() < 12 + 16 {
            return None;
        }
        let (nonce, ciphertext) = bytes.split_at(12);
        let nonce: [u8; 12] = nonce.try_into().ok()?;
        let plain = self
            .cipher
            .decrypt(
                &Nonce::from(nonce),
                Payload {
                    msg: ciphertext,
                    aad,
                },
            )
            .ok()?;
        String::from_utf8(plain).ok()
    }
}

impl SecretsKey {
    fn seal_text(
        &self,
        what: Sealed,
        tenant: &TenantId,
        id: &DestinationId,
        plain: &str,
    ) -> Result<String> {
        let bytes = self
            .current
            .seal_bytes(plain.as_bytes(), &aad(what, tenant, id))?;
        Ok(format!(
            "{SEALED_PREFIX}{}:{}",
            self.current.id,
            BASE64_URL.encode(bytes)
        ))
    }

    /// Opens a value that starts with `enc:`.
    fn open_text(
        &self,
        what: Sealed,
        tenant: &TenantId,
        id: &DestinationId,
        stored: &str,
    ) -> Result<String> {
        let aad = aad(what, tenant, id);
        let damaged = || {
            backend(format!(
                "the {} of destination {id} is not a sealed value this version reads (a damaged row)",
                what.what()
            ))
        };
        if let Some(body) = stored.strip_prefix(SEALED_PREFIX) {
            let (key_id, body) = body.split_once(':').ok_or_else(damaged)?;
            let key = std::iter::once(&self.current)
                .chain(self.previous.as_ref())
                .find(|k| k.id == key_id)
                .ok_or_else(|| {
                    backend(format!(
                        "the {} of destination {id} is sealed under key {key_id}, which is neither SHEAF_SECRETS_KEY (key {}) nor SHEAF_SECRETS_KEY_PREVIOUS ({})",
                        what.what(),
                        self.current.id,
                        self.previous_id().map_or("unset".to_owned(), |p| format!("key {p}")),
                    ))
                })?;
            let bytes = BASE64_URL.decode(body).map_err(|_| damaged())?;
            return key.open_bytes(&bytes, &aad).ok_or_else(|| {
                backend(format!(
                    "the {} of destination {id} does not decrypt with key {key_id} (a damaged row, or one moved from another destination)",
                    what.what()
                ))
            });
        }
        if let Some(body) = stored.strip_prefix(SEALED_PREFIX_V1) {
            let bytes = BASE64.decode(body).map_err(|_| damaged())?;
            return std::iter::once(&self.current)
                .chain(self.previous.as_ref())
                .find_map(|key| key.open_bytes(&bytes, &aad))
                .ok_or_else(|| {
                    backend(format!(
                        "the {} of destination {id} does not decrypt with SHEAF_SECRETS_KEY or SHEAF_SECRETS_KEY_PREVIOUS (another key, or a damaged row)",
                        what.what()
                    ))
                });
        }
        Err(damaged())
    }

    /// Encrypts `secret` for the destination `(tenant, id)` with the current key.
    pub fn seal(&self, tenant: &TenantId, id: &DestinationId, secret: &Secret) -> Result<Secret> {
        Secret::new(self.seal_text(Sealed::Secret, tenant, id, secret.expose())?)
    }

    /// Decrypts a sealed secret (`enc:v1:…` or `enc:v2:…`) of the destination `(tenant, id)`.
    pub fn open(&self, tenant: &TenantId, id: &DestinationId, sealed: &str) -> Result<Secret> {
        Secret::new(self.open_text(Sealed::Secret, tenant, id, sealed)?)
    }

    /// Which key `stored` is under, from its prefix alone (nothing is decrypted).
    pub fn sealed_under(&self, stored: &str) -> SealedUnder {
        match stored.strip_prefix(SEALED_PREFIX) {
            Some(body)
                if body
                    .split_once(':')
                    .is_some_and(|(k, _)| k == self.current.id) =>
            {
                SealedUnder::Current
            }
            Some(_) => SealedUnder::Other,
            None if stored.starts_with(SEALED) => SealedUnder::Other,
            None => SealedUnder::Nothing,
        }
    }
}

fn backend(message: impl Into<String>) -> Error {
    Error::Backend {
        message: message.into(),
        source: None,
    }
}

/// An `EntityStore` that seals credentials on the way in and opens them on the way out.
/// Without a key it passes plaintext through, and refuses to hand out sealed values it cannot
/// open.
#[derive(Debug)]
pub struct SealedEntityStore {
    inner: Arc<dyn EntityStore>,
    key: Option<SecretsKey>,
}

impl SealedEntityStore {
    /// Wraps `inner`; `key` is `SHEAF_SECRETS_KEY` (with `SHEAF_SECRETS_KEY_PREVIOUS`), if set.
    pub fn new(inner: Arc<dyn EntityStore>, key: Option<SecretsKey>) -> Self {
        Self { inner, key }
    }

    /// The store this one wraps (for tests that read what a backend really holds).
    pub fn inner(&self) -> &Arc<dyn EntityStore> {
        &self.inner
    }

    /// The keys it seals and opens with.
    pub(crate) fn key(&self) -> Option<&SecretsKey> {
        self.key.as_ref()
    }

    fn seal_text(
        &self,
        what: Sealed,
        tenant: &TenantId,
        id: &DestinationId,
        plain: &str,
    ) -> Result<String> {
        match &self.key {
            Some(key) => key.seal_text(what, tenant, id, plain),
            None => Ok(plain.to_owned()),
        }
    }

    fn open_text(
        &self,
        what: Sealed,
        tenant: &TenantId,
        id: &DestinationId,
        stored: &str,
    ) -> Result<String> {
        if !stored.starts_with(SEALED) {
            // Written before a key was configured: plaintext.
            return Ok(stored.to_owned());
        }
        match &self.key {
            Some(key) => key.open_text(what, tenant, id, stored),
            None => Err(backend(format!(
                "the {} of destination {id} is encrypted but SHEAF_SECRETS_KEY is not set",
                what.what()
            ))),
        }
    }

    fn seal(&self, tenant: &TenantId, id: &DestinationId, secret: &Secret) -> Result<Secret> {
        Secret::new(self.seal_text(Sealed::Secret, tenant, id, secret.expose())?)
    }

    fn open(&self, tenant: &TenantId, id: &DestinationId, stored: &Secret) -> Result<Secret> {
        Secret::new(self.open_text(Sealed::Secret, tenant, id, stored.expose())?)
    }

    fn seal_config(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        config: &serde_json::Value,
    ) -> Result<serde_json::Value> {
        match url_password::password(config) {
            Some(password) if self.key.is_some() => {
                let sealed = self.seal_text(Sealed::UrlPassword, tenant, id, password)?;
                Ok(url_password::with_password(config, &sealed))
            }
            _ => Ok(config.clone()),
        }
    }

    fn open_config(
        &self,
        tenant: &TenantId,
        id: &DestinationId,
        config: serde_json::Value,
    ) -> Result<serde_json::Value> {
        match url_password::password(&config) {
            Some(stored) if stored.starts_with(SEALED) => {
                let plain = self.open_text(Sealed::UrlPassword, tenant, id, stored)?;
                Ok(url_password::with_password(&config, &plain))
            }
            _ => Ok(config),
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
        sealed.config = self.seal_config(&d.tenant_id, &d.id, &d.config)?;
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
        d.config = self.open_config(&d.tenant_id, &d.id, std::mem::take(&mut d.config))?;
        Ok(d)
    }

    /// Whether every credential `stored` holds (as the backend holds it) is under the current
    /// key; `None` without a key.
    pub(crate) fn fully_sealed(&self, stored: &Destination) -> Option<bool> {
        let key = self.key.as_ref()?;
        let under_current = |value: &str| key.sealed_under(value) == SealedUnder::Current;
        Some(
            under_current(stored.secret.expose())
                && stored
                    .previous_secret
                    .as_ref()
                    .is_none_or(|p| under_current(p.secret.expose()))
                && url_password::password(&stored.config).is_none_or(under_current),
        )
    }

    /// The swap that re-seals `stored` (as the backend holds it) under the current key: each
    /// value opened with whichever key it is under and sealed again.
    pub(crate) fn reseal_swap(&self, stored: &Destination) -> Result<CredentialsSwap> {
        let opened = self.open_destination(stored.clone())?;
        let resealed = self.seal_destination(&opened)?;
        Ok(CredentialsSwap {
            tenant_id: stored.tenant_id.clone(),
            destination_id: stored.id,
            expected: StoredCredentials::of(stored),
            replacement: StoredCredentials::of(&resealed),
        })
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
        let sealed;
        let patch = match &patch.config {
            Some(config) => {
                sealed = DestinationPatch {
                    config: Some(self.seal_config(tenant, id, config)?),
                    ..patch.clone()
                };
                &sealed
            }
            None => patch,
        };
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

    async fn scan_destinations(
        &self,
        after: Option<DestinationId>,
        limit: usize,
    ) -> Result<Vec<Destination>> {
        self.inner
            .scan_destinations(after, limit)
            .await?
            .into_iter()
            .map(|d| self.open_destination(d))
            .collect()
    }

    // `swap_credentials` keeps the default, which refuses: swaps are of stored forms, which
    // this wrapper never hands out; re-sealing goes through `SealedEntityStore::reseal`.

    async fn ping(&self) -> Result<()> {
        self.inner.ping().await
    }
}

#[cfg(test)]
mod tests;
