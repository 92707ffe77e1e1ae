//! Standard Webhooks signatures.
//!
//! `webhook-signature` is `v1,` and the base64 HMAC-SHA256 of `{id}.{timestamp}.{body}` under
//! the secret's key (the base64 after `whsec_`), one such signature per valid secret,
//! space-separated, so a receiver that knows either secret of a rotation verifies it.

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hmac::{Hmac, Mac};
use sha2::Sha256;
use sheaf_destination::SECRET_PREFIX;
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

/// `v1,<base64 signature>` for each secret, space-separated.
pub fn sign(secrets: &[&Secret], id: &str, timestamp: i64, body: &[u8]) -> String {
    let mut out = Vec::with_capacity(secrets.len());
    for secret in secrets {
        let mut mac = Hmac::<Sha256>::new_from_slice(&secret_key(secret))
            .expect("HMAC takes keys of any length");
        mac.update(id.as_bytes());
        mac.update(b".");
        mac.update(timestamp.to_string().as_bytes());
        mac.update(b".");
        mac.update(body);
        out.push(format!("v1,{}", BASE64.encode(mac.finalize().into_bytes())));
    }
    out.join(" ")
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
}
