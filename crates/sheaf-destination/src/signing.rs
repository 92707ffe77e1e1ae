//! Signing keys. Every destination has one (two during a rotation), and its prefix says how it
//! signs, as Standard Webhooks writes them:
//!
//! - `whsec_` and the base64 of a key: HMAC-SHA256, a secret the receiver holds too (signatures
//!   `v1,…`);
//! - `whsk_` and the base64 of a 32-byte Ed25519 seed: the private half of a key pair that never
//!   leaves Sheaf (signatures `v1a,…`). The receiver verifies with the public half, `whpk_` and
//!   the base64 of the 32-byte public key, which may be published: it cannot sign.
//!
//! Keeping the algorithm in the key's own text means every store keeps, seals and rotates both
//! kinds the same way, and a rotation from one algorithm to the other signs with both during
//! its overlap.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use ring::signature::{Ed25519KeyPair, KeyPair as _};
use sheaf_store::Secret;

/// The prefix of an HMAC signing secret.
pub const SECRET_PREFIX: &str = "whsec_";

/// The prefix of an Ed25519 private key.
pub const SIGNING_KEY_PREFIX: &str = "whsk_";

/// The prefix of an Ed25519 public key.
pub const PUBLIC_KEY_PREFIX: &str = "whpk_";

/// How a destination's deliveries are signed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SigningAlgorithm {
    /// HMAC-SHA256 under a shared secret (`v1`); the default.
    HmacSha256,
    /// Ed25519 under a private key that stays in Sheaf (`v1a`).
    Ed25519,
}

impl SigningAlgorithm {
    /// Every algorithm, by its word.
    pub const ALL: [(&'static str, Self); 2] = [
        ("hmac-sha256", Self::HmacSha256),
        ("ed25519", Self::Ed25519),
    ];

    /// Its word in the API: `hmac-sha256` or `ed25519`.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::HmacSha256 => "hmac-sha256",
            Self::Ed25519 => "ed25519",
        }
    }

    /// The algorithm a word names.
    pub fn parse(word: &str) -> Option<Self> {
        Self::ALL.iter().find(|(w, _)| *w == word).map(|(_, a)| *a)
    }

    /// The algorithm `secret` signs with, by its prefix: `whsk_` is Ed25519, anything else
    /// HMAC (a secret without a known prefix is used as raw HMAC key bytes, as the reference
    /// libraries do).
    pub fn of(secret: &Secret) -> Self {
        if secret.expose().starts_with(SIGNING_KEY_PREFIX) {
            Self::Ed25519
        } else {
            Self::HmacSha256
        }
    }

    /// A fresh key of this algorithm: the prefix and the base64 of 32 random bytes (an HMAC key
    /// within Standard Webhooks' 24 to 64 bytes, or an Ed25519 seed).
    pub fn generate(self) -> Secret {
        let bytes: [u8; 32] = rand::random();
        let prefix = match self {
            Self::HmacSha256 => SECRET_PREFIX,
            Self::Ed25519 => SIGNING_KEY_PREFIX,
        };
        Secret::new(format!("{prefix}{}", BASE64.encode(bytes))).expect("a non-empty secret")
    }
}

/// A fresh HMAC signing secret (`whsec_…`), the default every destination gets.
pub fn generate_secret() -> Secret {
    SigningAlgorithm::HmacSha256.generate()
}

/// An Ed25519 key pair read from a `whsk_` key. Building one derives the public key (a scalar
/// multiplication, tens of microseconds), so a signer keeps it rather than reading the key for
/// every message.
pub struct Ed25519Key(Ed25519KeyPair);

impl Ed25519Key {
    /// The key pair of a `whsk_` key; `None` for any other secret, or one whose rest is not the
    /// base64 of 32 bytes.
    pub fn from_secret(secret: &Secret) -> Option<Self> {
        let rest = secret.expose().strip_prefix(SIGNING_KEY_PREFIX)?;
        let seed = BASE64.decode(rest).ok()?;
        if seed.len() != 32 {
            return None;
        }
        Ed25519KeyPair::from_seed_unchecked(&seed).ok().map(Self)
    }

    /// The public key, `whpk_` and the base64 of its 32 bytes.
    pub fn public_key(&self) -> String {
        format!(
            "{PUBLIC_KEY_PREFIX}{}",
            BASE64.encode(self.0.public_key().as_ref())
        )
    }

    /// The 64-byte signature of `message`.
    pub fn sign(&self, message: &[u8]) -> [u8; 64] {
        let signature = self.0.sign(message);
        signature
            .as_ref()
            .try_into()
            .expect("an Ed25519 signature is 64 bytes")
    }
}

impl std::fmt::Debug for Ed25519Key {
    /// The public half only.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Ed25519Key")
            .field(&self.public_key())
            .finish()
    }
}

/// The public key of an Ed25519 secret (`whpk_…`), what the API shows in its place; `None` for
/// an HMAC secret, which is shown as it is.
pub fn public_key(secret: &Secret) -> Option<String> {
    Ed25519Key::from_secret(secret).map(|key| key.public_key())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_algorithm_makes_keys_it_is_read_back_as() {
        for (word, algorithm) in SigningAlgorithm::ALL {
            assert_eq!(SigningAlgorithm::parse(word), Some(algorithm));
            assert_eq!(algorithm.as_str(), word);
            let key = algorithm.generate();
            assert_eq!(SigningAlgorithm::of(&key), algorithm, "{word}");
            assert_ne!(
                key.expose(),
                algorithm.generate().expose(),
                "fresh each time"
            );
        }
        assert_eq!(SigningAlgorithm::parse("rsa"), None);
        // A secret of no known form is an HMAC key, as the reference libraries read it.
        let raw = Secret::new("plain words").unwrap();
        assert_eq!(SigningAlgorithm::of(&raw), SigningAlgorithm::HmacSha256);
    }

    #[test]
    fn the_public_key_is_the_seed_s_and_verifies_its_signatures() {
        // RFC 8032, section 7.1, test 1: the seed, its public key, the signature of "".
        let seed = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";
        let public = "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a";
        let signature = "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e06522490155\
                         5fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b";
        let hex = |s: &str| -> Vec<u8> {
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let secret =
            Secret::new(format!("{SIGNING_KEY_PREFIX}{}", BASE64.encode(hex(seed)))).unwrap();
        let key = Ed25519Key::from_secret(&secret).unwrap();
        assert_eq!(
            key.public_key(),
            format!("{PUBLIC_KEY_PREFIX}{}", BASE64.encode(hex(public)))
        );
        assert_eq!(public_key(&secret), Some(key.public_key()));
        assert_eq!(key.sign(b"").to_vec(), hex(signature));
        let verifier =
            ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, hex(public));
        assert!(verifier.verify(b"message", &key.sign(b"message")).is_ok());
        assert!(verifier.verify(b"other", &key.sign(b"message")).is_err());
    }

    #[test]
    fn only_a_well_formed_private_key_is_read() {
        assert!(public_key(&generate_secret()).is_none(), "an HMAC secret");
        for bad in ["whsk_", "whsk_not base64!", "whsk_AAAA"] {
            assert!(public_key(&Secret::new(bad).unwrap()).is_none(), "{bad}");
        }
        let debug = format!(
            "{:?}",
            Ed25519Key::from_secret(&SigningAlgorithm::Ed25519.generate()).unwrap()
        );
        assert!(
            debug.contains(PUBLIC_KEY_PREFIX) && !debug.contains(SIGNING_KEY_PREFIX),
            "{debug}"
        );
    }
}
