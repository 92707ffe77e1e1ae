//! Tenant-scoped API tokens: signed, expiring bearer tokens that reach one tenant's routes only.
//!
//! An admin issues one with `POST /api/v1/tenants/{tenant_id}/tokens`; its holder presents it as
//! `Authorization: Bearer <token>`. The token carries its claims and their signature, so checking
//! one needs no store:
//!
//! ```text
//! sheaf_tt1_<base64url(claims JSON)>.<base64url(HMAC-SHA256(key, "sheaf tenant token v1." + claims part))>
//! claims: {"v":1,"tenant":"acme","id":"<uuid>","iat":<unix s>,"exp":<unix s>}
//! ```
//!
//! The key is `SHEAF_TOKEN_SIGNING_KEY`, its own setting: deriving it from `SHEAF_API_KEY` would
//! tie the two together, so rotating the admin key would silently revoke every token, and a leak
//! of one would be a leak of both. Without it no token is issued or accepted.
//!
//! The signature is checked (in constant time, `Mac::verify_slice`) before the claims are parsed,
//! so unsigned bytes never reach the JSON parser. Tokens cannot be revoked one by one: they
//! expire (at most `SHEAF_TOKEN_MAX_TTL` after issue), and changing the signing key revokes them
//! all at once.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;
use sheaf_store::TenantId;
use uuid::Uuid;

pub use crate::settings::TokenKey;

/// What every tenant token starts with (`tt`: tenant token, `1`: the format's version).
pub const TOKEN_PREFIX: &str = "sheaf_tt1_";

/// Longest token checked at all; real ones are under 250 bytes.
const MAX_TOKEN_LEN: usize = 1024;

/// Domain separation: a MAC made for anything else with the same key never verifies as a token.
const SIGNING_CONTEXT: &[u8] = b"sheaf tenant token v1.";

/// What a token says, once its signature checked out.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenClaims {
    /// The format's version, 1.
    pub v: u8,
    /// The only tenant the token reaches.
    pub tenant: TenantId,
    /// The token's id, for the operator's records.
    pub id: Uuid,
    /// Issued at, Unix seconds.
    pub iat: i64,
    /// Expires at, Unix seconds: refused from this second on.
    pub exp: i64,
}

/// Why a presented token was refused; the message is safe to answer with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct TokenRefused(pub String);

impl TokenKey {
    fn mac(&self, claims_part: &str) -> Hmac<Sha256> {
        let mut mac =
            Hmac::<Sha256>::new_from_slice(&self.0).expect("HMAC takes keys of any length");
        mac.update(SIGNING_CONTEXT);
        mac.update(claims_part.as_bytes());
        mac
    }

    /// A token for `tenant`, valid from `now` (Unix seconds) for `ttl`.
    pub fn issue(&self, tenant: &TenantId, ttl: Duration, now: i64) -> (String, TokenClaims) {
        let claims = TokenClaims {
            v: 1,
            tenant: tenant.clone(),
            id: Uuid::now_v7(),
            iat: now,
            exp: now.saturating_add(i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX)),
        };
        let json = serde_json::to_vec(&claims).expect("claims serialize");
        let claims_part = URL_SAFE_NO_PAD.encode(json);
        let signature = URL_SAFE_NO_PAD.encode(self.mac(&claims_part).finalize().into_bytes());
        (format!("{TOKEN_PREFIX}{claims_part}.{signature}"), claims)
    }

    /// Checks a presented token at `now` (Unix seconds): its form, its signature, then its
    /// claims and expiry.
    pub fn verify(&self, token: &str, now: i64) -> Result<TokenClaims, TokenRefused> {
        let malformed = || TokenRefused("the token is malformed".to_owned());
        if token.len() > MAX_TOKEN_LEN {
            return Err(malformed());
        }
        let rest = token.strip_prefix(TOKEN_PREFIX).ok_or_else(malformed)?;
        let (claims_part, signature_part) = rest.split_once('.').ok_or_else(malformed)?;
        let signature = URL_SAFE_NO_PAD
            .decode(signature_part)
            .map_err(|_| malformed())?;
        self.mac(claims_part)
            .verify_slice(&signature)
            .map_err(|_| TokenRefused("the token's signature is not valid".to_owned()))?;
        let json = URL_SAFE_NO_PAD
            .decode(claims_part)
            .map_err(|_| malformed())?;
        let claims: TokenClaims = serde_json::from_slice(&json).map_err(|_| malformed())?;
        if claims.v != 1 {
            return Err(malformed());
        }
        if now >= claims.exp {
            return Err(TokenRefused(format!(
                "the token expired at {} (Unix seconds)",
                claims.exp
            )));
        }
        Ok(claims)
    }
}

/// Whether a presented bearer value is meant as a tenant token (rather than the admin key).
pub fn looks_like_token(bearer: &str) -> bool {
    bearer.starts_with(TOKEN_PREFIX)
}

/// The current time in Unix seconds.
pub fn unix_now() -> i64 {
    chrono::Utc::now().timestamp()
}

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;

    fn key(byte: u8) -> TokenKey {
        TokenKey::from_base64(&STANDARD.encode([byte; 32])).unwrap()
    }

    #[test]
    fn a_token_verifies_until_it_expires() {
        let tenant = TenantId::new("acme").unwrap();
        let (token, claims) = key(1).issue(&tenant, Duration::from_secs(60), 1_000);
        assert!(token.starts_with(TOKEN_PREFIX) && looks_like_token(&token));
        assert_eq!(claims.exp, 1_060);
        assert_eq!(key(1).verify(&token, 1_000).unwrap(), claims);
        assert_eq!(key(1).verify(&token, 1_059).unwrap().tenant, tenant);
        assert!(
            key(1)
                .verify(&token, 1_060)
                .unwrap_err()
                .0
                .contains("expired")
        );
    }

    #[test]
    fn forged_and_damaged_tokens_are_refused() {
        let tenant = TenantId::new("acme").unwrap();
        let (token, _) = key(1).issue(&tenant, Duration::from_secs(60), 1_000);
        // Another key.
        assert!(
            key(2)
                .verify(&token, 1_000)
                .unwrap_err()
                .0
                .contains("signature")
        );
        // Claims changed to another tenant, signature kept.
        let (prefix_and_claims, signature) = token.rsplit_once('.').unwrap();
        let claims = prefix_and_claims.strip_prefix(TOKEN_PREFIX).unwrap();
        let mut json: serde_json::Value =
            serde_json::from_slice(&URL_SAFE_NO_PAD.decode(claims).unwrap()).unwrap();
        json["tenant"] = "other".into();
        let forged = format!(
            "{TOKEN_PREFIX}{}.{signature}",
            URL_SAFE_NO_PAD.encode(json.to_string())
        );
        assert!(key(1).verify(&forged, 1_000).is_err());
        for bad in [
            "",
            TOKEN_PREFIX,
            "sheaf_tt1_abc",
            "sheaf_tt1_abc.def",
            "sheaf_tt1_.",
            &format!("{token}x"),
            &"sheaf_tt1_a.b".repeat(200),
        ] {
            assert!(key(1).verify(bad, 1_000).is_err(), "{bad:?}");
        }
        assert!(TokenKey::from_base64(&STANDARD.encode([0u8; 31])).is_err());
        assert!(format!("{:?}", key(1)).contains("redacted"));
    }
}
