//! The secret keys among the settings: the admin key, the tenant-token signing key and the key
//! that seals destination secrets. Each is read and checked here; what is done with it lives
//! with its user (`http::tokens` signs with [`TokenKey`], `state::secrets` seals with
//! [`SecretsKey`], with the decrypt-only key of a rotation beside it). `Debug` never prints a key, so neither does a `Config`.

use std::fmt;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;

pub use sheaf_engine::SecretsKey;

use super::ConfigError;
use super::table as s;
use super::values::Values;

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

/// `SHEAF_SECRETS_KEY`, with `SHEAF_SECRETS_KEY_PREVIOUS` added to it. The previous key needs
/// the current one: a key that only opens is of use only beside one that seals.
pub(super) fn parse_secrets_key(values: &Values) -> Result<Option<SecretsKey>, ConfigError> {
    let current = values
        .optional(&s::SECRETS_KEY)
        .map(|k| SecretsKey::from_base64(&k))
        .transpose()
        .map_err(|m| ConfigError::new(s::SECRETS_KEY.name, m))?;
    let name = s::SECRETS_KEY_PREVIOUS.name;
    match (values.optional(&s::SECRETS_KEY_PREVIOUS), current) {
        (None, current) => Ok(current),
        (Some(_), None) => Err(ConfigError::new(
            name,
            format!(
                "needs {}: the previous key only opens values, and the current one seals them",
                s::SECRETS_KEY.name
            ),
        )),
        (Some(raw), Some(current)) => current
            .with_previous(&raw)
            .map(Some)
            .map_err(|m| ConfigError::new(name, m)),
    }
}

fn decode(raw: &str) -> Result<Vec<u8>, String> {
    STANDARD
        .decode(raw.trim())
        .map_err(|_| "is not valid base64 (standard alphabet, with padding)".to_owned())
}
