//! The secret keys among the settings: the admin key, the tenant-token signing key and the key
//! that seals destination secrets. Each is read and checked here; what is done with it lives
//! with its user (`http::tokens` signs with [`TokenKey`], `state::secrets` seals with
//! [`SecretsKey`]). `Debug` never prints a key, so neither does a `Config`.

use std::fmt;

use aes_gcm::Aes256Gcm;
use aes_gcm::aead::KeyInit;
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

/// The admin key (`SHEAF_API_KEY`).
#[derive(Clone, PartialEq, Eq)]
pub struct AdminKey(String);

/// The shortest admin key accepted.
const MIN_ADMIN_KEY_LEN: usize = 16;

impl AdminKey {
    /// Checks the setting's value: at least 16 characters.
    pub fn new(key: String) -> Result<Self, String> {
        if key.len() < MIN_ADMIN_KEY_LEN {
            return Err(format!(
                "is {} characters long, at least {MIN_ADMIN_KEY_LEN} are needed",
                key.len()
            ));
        }
        Ok(Self(key))
    }

    /// The key itself, for the constant-time comparison with a presented one.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for AdminKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("AdminKey(<redacted>)")
    }
}

/// The tenant-token signing key (`SHEAF_TOKEN_SIGNING_KEY`).
#[derive(Clone)]
pub struct TokenKey(pub(crate) Vec<u8>);

impl fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("TokenKey(<redacted>)")
    }
}

impl TokenKey {
    /// Reads the setting's value: standard base64 of at least 32 bytes (HMAC-SHA256's output
    /// size; a shorter key is the weak link).
    pub fn from_base64(raw: &str) -> Result<Self, String> {
        let bytes = decode(raw)?;
        if bytes.len() < 32 {
            return Err(format!(
                "decodes to {} bytes; at least 32 are needed (make one with `head -c 32 /dev/urandom | base64`)",
                bytes.len()
            ));
        }
        Ok(Self(bytes))
    }
}

/// The AES-256-GCM key that seals destination secrets (`SHEAF_SECRETS_KEY`).
#[derive(Clone)]
pub struct SecretsKey {
    pub(crate) cipher: Aes256Gcm,
}

impl fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("SecretsKey(<redacted>)")
    }
}

impl SecretsKey {
    /// Reads the setting's value: the standard base64 of exactly 32 bytes.
    pub fn from_base64(raw: &str) -> Result<Self, String> {
        let bytes = decode(raw)?;
        if bytes.len() != 32 {
            return Err(format!(
                "decodes to {} bytes; AES-256 needs exactly 32 (make one with `head -c 32 /dev/urandom | base64`)",
                bytes.len()
            ));
        }
        let cipher =
            Aes256Gcm::new_from_slice(&bytes).map_err(|_| "is not a 32-byte key".to_owned())?;
        Ok(Self { cipher })
    }
}

fn decode(raw: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(raw.trim())
        .map_err(|_| "is not valid base64 (standard alphabet, with padding)".to_owned())
}
