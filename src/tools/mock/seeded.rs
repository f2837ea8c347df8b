//! Deterministic Web Push subscriptions for benchmarks: subscription `i` of a seed has
//! the endpoint `<origin>/push/d<i>`, one of [`SEEDED_KEYS`] P-256 key pairs derived
//! from the seed, and its own auth secret derived from the seed and `i`. A producer
//! holding the seed makes millions of valid subscriptions without asking the mock, and
//! the mock (given the same seed) decrypts what is sent to them. Sharing key pairs
//! costs the sender nothing: it does one ECDH per message whatever the key.

use crate::provider::webpush::subscription::B64URL;
use base64::Engine;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::SecretKey;
use sha2::{Digest, Sha256};
use std::sync::Arc;

/// Distinct key pairs per seed (deriving a public key is a scalar multiplication).
pub const SEEDED_KEYS: usize = 256;

/// The subscriptions of one seed at one push-service origin.
#[derive(Clone)]
pub struct SeededSubscriptions {
    origin: String,
    seed: [u8; 32],
    /// Secret key and its public key (base64url, uncompressed point).
    keys: Arc<Vec<(SecretKey, String)>>,
}

impl std::fmt::Debug for SeededSubscriptions {
    // The seed yields every subscription's secrets: it stays out of Debug output.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeededSubscriptions")
            .field("origin", &self.origin)
            .finish_non_exhaustive()
    }
}

impl SeededSubscriptions {
    /// The scheme for `origin` (`https://127.0.0.1:PORT`) and `seed`.
    pub fn new(origin: &str, seed: [u8; 32]) -> Self {
        let keys = (0..SEEDED_KEYS as u32)
            .map(|k| {
                let secret = derive_key(&seed, k);
                let public = secret.public_key().to_encoded_point(false);
                (secret, B64URL.encode(public.as_bytes()))
            })
            .collect();
        Self {
            origin: origin.trim_end_matches('/').to_string(),
            seed,
            keys: Arc::new(keys),
        }
    }

    /// A fresh random seed.
    pub fn random_seed() -> [u8; 32] {
        let mut seed = [0u8; 32];
        aes_gcm::aead::rand_core::RngCore::fill_bytes(&mut aes_gcm::aead::OsRng, &mut seed);
        seed
    }

    /// Subscription `i` as a job's device string (compact JSON).
    pub fn subscription(&self, i: u64) -> String {
        let (_, public) = &self.keys[i as usize % SEEDED_KEYS];
        format!(
            r#"{{"endpoint":"{}/push/d{i}","keys":{{"p256dh":"{public}","auth":"{}"}}}}"#,
            self.origin,
            B64URL.encode(self.auth(i))
        )
    }

    /// The secrets of the subscription whose path id is `id` (`d<i>`), if it is one.
    pub fn secrets(&self, id: &str) -> Option<(SecretKey, [u8; 16])> {
        let i: u64 = id.strip_prefix('d')?.parse().ok()?;
        let (secret, _) = &self.keys[i as usize % SEEDED_KEYS];
        Some((secret.clone(), self.auth(i)))
    }

    fn auth(&self, i: u64) -> [u8; 16] {
        let digest = Sha256::new()
            .chain_update(self.seed)
            .chain_update(b"auth")
            .chain_update(i.to_be_bytes())
            .finalize();
        let mut auth = [0u8; 16];
        auth.copy_from_slice(&digest[..16]);
        auth
    }
}

/// Key pair `k` of `seed`: the first hash of (seed, k, counter) that is a valid scalar.
fn derive_key(seed: &[u8; 32], k: u32) -> SecretKey {
    (0u32..)
        .find_map(|counter| {
            let digest = Sha256::new()
                .chain_update(seed)
                .chain_update(b"key")
                .chain_update(k.to_be_bytes())
                .chain_update(counter.to_be_bytes())
                .finalize();
            SecretKey::from_slice(&digest).ok()
        })
        .expect("some hash is a valid P-256 scalar")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seeded_subscription_decrypts_with_its_derived_secrets() {
        let subs = SeededSubscriptions::new("https://127.0.0.1:1", [7u8; 32]);
        let json = subs.subscription(300);
        let sub = crate::provider::webpush::subscription::parse(&json).expect("valid");
        assert_eq!(sub.endpoint.as_str(), "https://127.0.0.1:1/push/d300");
        let body = crate::provider::webpush::ece::encrypt(b"hello", &sub.p256dh, &sub.auth)
            .expect("encrypt");
        let (secret, auth) = subs.secrets("d300").expect("a seeded id");
        let plain = crate::provider::webpush::ece::decrypt(&body, &secret, &auth).expect("decrypt");
        assert_eq!(plain, b"hello");
        assert!(subs.secrets("s1-abc").is_none());
    }
}
