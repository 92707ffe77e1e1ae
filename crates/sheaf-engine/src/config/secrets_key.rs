//! The key that seals destination secrets at rest ([`SecretsKey`]), with the decrypt-only key of
//! a rotation beside it. The service reads both from its settings; the engine's sealing store
//! (`state::secrets`) is their one user. `Debug` never prints a key.

use std::fmt;

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::KeyInit;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use sha2::{Digest as _, Sha256};

/// The AES-256-GCM keys of destination secrets: the one that seals (`SHEAF_SECRETS_KEY`) and,
/// while that key is being rotated, one that only opens (`SHEAF_SECRETS_KEY_PREVIOUS`).
///
/// Each key has an id, the first 8 hex digits of a SHA-256 of the key under a label of its own,
/// which sealed values carry (`enc:v2:<key id>:…`) so a reader knows which key to open them
/// with and a re-sealing pass knows which values still need it. 32 bits of a hash of a 256-bit
/// key say nothing useful about it.
#[derive(Clone)]
pub struct SecretsKey {
    pub(crate) current: SealingKey,
    pub(crate) previous: Option<SealingKey>,
}

/// One AES-256-GCM key and its id.
#[derive(Clone)]
pub(crate) struct SealingKey {
    pub(crate) cipher: Aes256Gcm,
    pub(crate) id: String,
}

/// The key ids are shown (they are in every sealed value anyway), the keys never.
impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "SecretsKey(<redacted>, id {}", self.current.id)?;
        match &self.previous {
            Some(previous) => write!(f, ", previous id {})", previous.id),
            None => f.write_str(")"),
        }
    }
}

impl SealingKey {
    fn from_base64(raw: &str) -> Result<Self, String> {
        let bytes = decode(raw)?;
        if bytes.len() != 32 {
            return Err(format!(
                "decodes to {} bytes; AES-256 needs exactly 32 (make one with `head -c 32 /dev/urandom | base64`)",
                bytes.len()
            ));
        }
        let cipher =
            Aes256Gcm::new_from_slice(&bytes).map_err(|_| "is not a 32-byte key".to_owned())?;
        let digest = Sha256::new()
            .chain_update(b"sheaf secrets key id\0")
            .chain_update(&bytes)
            .finalize();
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        Ok(Self { cipher, id })
    }
}

impl SecretsKey {
    /// Reads a key: the standard base64 of exactly 32 bytes (`SHEAF_SECRETS_KEY`).
    pub fn from_base64(raw: &str) -> Result<Self, String> {
        Ok(Self {
            current: SealingKey::from_base64(raw)?,
            previous: None,
        })
    }

    /// Adds the key being replaced (`SHEAF_SECRETS_KEY_PREVIOUS`), a key that opens values and never seals.
    /// The same key as the current one is refused: it would mean a rotation that rotates
    /// nothing, most likely a mistake in the settings.
    pub fn with_previous(mut self, raw: &str) -> Result<Self, String> {
        let previous = SealingKey::from_base64(raw)?;
        if previous.id == self.current.id {
            return Err(
                "is the same key as SHEAF_SECRETS_KEY; it should hold the key being replaced"
                    .to_owned(),
            );
        }
        self.previous = Some(previous);
        Ok(self)
    }

    /// The id of the key that seals, as sealed values carry it.
    pub fn id(&self) -> &str {
        &self.current.id
    }

    /// The id of the decrypt-only key, if there is one.
    pub fn previous_id(&self) -> Option<&str> {
        self.previous.as_ref().map(|k| k.id.as_str())
    }
}

fn decode(raw: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(raw.trim())
        .map_err(|_| "is not valid base64 (standard alphabet, with padding)".to_owned())
}
