//! Standard Webhooks signatures.
//!
//! `webhook-signature` holds one signature per valid key (the current one, and the previous
//! one during a rotation), space-separated, so a receiver that knows either verifies it. Each
//! signs `{id}.{timestamp}.{body}`:
//!
//! - a `whsec_` secret as `v1,` and the base64 HMAC-SHA256 under the key (the base64 after the
//!   prefix);
//! - a `whsk_` key as `v1a,` and the base64 Ed25519 signature, which the receiver checks with
//!   the public key (`whpk_`) alone.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sheaf_destination::SECRET_PREFIX;
use sheaf_destination::signing::{Ed25519Key, SigningAlgorithm};
use sheaf_store::Secret;

/// The HMAC key of a secret: the base64 after `whsec_` (a secret without the prefix, or
/// whose rest is not base64, is used as raw bytes, as the reference libraries do).
fn secret_key(secret: &Secret) -> Vec<u8> {
    let text = secret.expose();
    let rest = text.strip_prefix(SECRET_PREFIX).unwrap_or(text);
    BASE64
        .decode(rest)
        .unwrap_or_else(|_| rest.as_bytes().to_vec())
}

/// `webhook-signature` for `secrets` (see the module). Reads each Ed25519 key afresh; a sender
/// signs through a [`Signer`], which keeps them.
pub fn sign(secrets: &[&Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    Signer::default().sign(secrets, id, timestamp, body)
}

/// How many Ed25519 keys a [`Signer`] keeps before it starts afresh: far more than the keys in
/// use at once (two per destination during a rotation), and a bound on those of deleted ones.
const KEPT_KEYS: usize = 4096;

/// Signs messages, keeping the Ed25519 key pairs it has read: deriving one costs more than
/// the signature itself.
#[derive(Debug, Default)]
pub struct Signer {
    keys: Mutex<HashMap<String, Arc<Ed25519Key>>>,
}

impl Signer {
    /// `webhook-signature` for `secrets`. A `whsk_` key that does not read as one (Sheaf makes
    /// none such) adds no signature, and is logged.
    pub fn sign(&self, secrets: &[&Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
        // What every signature covers is `{id}.{timestamp}.` then the body; an Ed25519 key needs
        // it in one piece, made once however many keys sign.
        let prefix = format!("{id}.{timestamp}.");
        let mut content: Option<Vec<u8>> = None;
        let mut out = String::with_capacity(secrets.len() * 92);
        for secret in secrets {
            let before = out.len();
            if before > 0 {
                out.push(' ');
            }
            match SigningAlgorithm::of(secret) {
                SigningAlgorithm::HmacSha256 => {
                    let mut mac = Hmac::<Sha256>::new_from_slice(&secret_key(secret))
                        .expect("HMAC takes keys of any length");
                    mac.update(prefix.as_bytes());
                    mac.update(body);
                    out.push_str("v1,");
                    BASE64.encode_string(mac.finalize().into_bytes(), &mut out);
                }
                SigningAlgorithm::Ed25519 => {
                    let Some(key) = self.key(secret) else {
                        tracing::warn!(
                            "a whsk_ signing key does not read as an Ed25519 seed; no v1a signature for it"
                        );
                        out.truncate(before);
                        continue;
                    };
                    let content = content.get_or_insert_with(|| [prefix.as_bytes(), body].concat());
                    out.push_str("v1a,");
                    BASE64.encode_string(key.sign(content), &mut out);
                }
            }
        }
        out
    }

    /// The key pair of `secret`, read once.
    fn key(&self, secret: &Secret) -> Option<Arc<Ed25519Key>> {
        let text = secret.expose();
        if let Some(key) = self.lock().get(text) {
            return Some(Arc::clone(key));
        }
        let key = Arc::new(Ed25519Key::from_secret(secret)?);
        let mut keys = self.lock();
        if keys.len() >= KEPT_KEYS {
            keys.clear();
        }
        keys.insert(text.to_owned(), Arc::clone(&key));
        Some(key)
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Ed25519Key>>> {
        // A panic while holding the map leaves nothing half-written: use it as it is.
        self.keys
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sheaf_destination::generate_secret;

    #[test]
    fn signature_matches_the_standard_webhooks_example() {
        // The example of the Standard Webhooks specification.
        let secret = Secret::new("whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw").unwrap();
        let body = br#"{"test": 2432232314}"#;
        let signature = sign(
            &[&secret],
            "msg_p5jXN8AQM9LWM0D4loKWxJek",
            1_614_265_330,
            body,
        );
        assert_eq!(signature, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
    }

    #[test]
    fn rotation_signs_with_every_secret() {
        let a = generate_secret();
        let b = generate_secret();
        assert!(a.expose().starts_with("whsec_"));
        let both = sign(&[&a, &b], "evt", 1, b"{}");
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2);
        assert_eq!(parts[0], sign(&[&a], "evt", 1, b"{}"));
        assert_eq!(parts[1], sign(&[&b], "evt", 1, b"{}"));
    }

    /// A `whsk_` key signs `v1a`: an Ed25519 signature of the same content, which the public
    /// key verifies (checked here with ring's verifier; the service's tests check it with an
    /// independent library).
    #[test]
    fn an_ed25519_key_signs_v1a_beside_an_hmac_one() {
        use sheaf_destination::signing::{PUBLIC_KEY_PREFIX, public_key};
        let ed = SigningAlgorithm::Ed25519.generate();
        let hmac = generate_secret();
        let signer = Signer::default();
        let both = signer.sign(&[&ed, &hmac], "evt", 1_614_265_330, br#"{"a":1}"#);
        let parts: Vec<&str> = both.split(' ').collect();
        assert_eq!(parts.len(), 2, "{both}");
        assert_eq!(
            parts[1],
            sign(&[&hmac], "evt", 1_614_265_330, br#"{"a":1}"#)
        );
        let signature = BASE64
            .decode(parts[0].strip_prefix("v1a,").unwrap())
            .unwrap();
        let public = public_key(&ed).unwrap();
        let public = BASE64
            .decode(public.strip_prefix(PUBLIC_KEY_PREFIX).unwrap())
            .unwrap();
        let verifier = ring::signature::UnparsedPublicKey::new(&ring::signature::ED25519, public);
        assert!(
            verifier
                .verify(br#"evt.1614265330.{"a":1}"#, &signature)
                .is_ok()
        );
        assert!(
            verifier
                .verify(br#"evt.1614265331.{"a":1}"#, &signature)
                .is_err()
        );
        // The same key signs the same way the second time, from the kept pair.
        assert_eq!(
            signer.sign(&[&ed], "evt", 1, b"{}"),
            sign(&[&ed], "evt", 1, b"{}")
        );
        // A broken key adds no signature rather than a wrong one.
        let broken = Secret::new("whsk_AAAA").unwrap();
        assert_eq!(
            signer.sign(&[&broken, &hmac], "evt", 1, b"{}"),
            sign(&[&hmac], "evt", 1, b"{}")
        );
    }
}
