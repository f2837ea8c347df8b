//! VAPID (RFC 8292): the application server's identity towards every push service.
//!
//! Each request carries `Authorization: vapid t=<JWT>, k=<public key>`, where the JWT is
//! ES256 over `{"aud": <endpoint origin>, "exp": …, "sub": <contact>}`. A push service
//! sees the same JWT for all our requests to its origin, so [`VapidSigner`] keeps one
//! header per origin and re-signs it when a quarter of its lifetime is left; a send
//! costs a map lookup under a briefly held lock. [`verify`] is the push service's side
//! (the mock and `providers check` use it).

use super::subscription::B64URL;
use base64::Engine;
use http::HeaderValue;
use p256::ecdsa::signature::{Signer, Verifier};
use p256::ecdsa::{Signature, SigningKey, VerifyingKey};
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::pkcs8::DecodePrivateKey;
use p256::SecretKey;
use parking_lot::Mutex;
use secrecy::{ExposeSecret, SecretString};
use std::collections::HashMap;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// The longest JWT lifetime push services accept (RFC 8292 section 2).
pub const MAX_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// The default lifetime (`vapid_lifetime`).
pub const DEFAULT_LIFETIME: Duration = Duration::from_secs(12 * 3600);
/// Origins whose header is kept; beyond it the oldest is dropped.
pub const MAX_ORIGINS: usize = 10_000;

/// The JWS header of every VAPID JWT, base64url-encoded (`{"typ":"JWT","alg":"ES256"}`).
const JWT_HEADER_B64: &str = "eyJ0eXAiOiJKV1QiLCJhbGciOiJFUzI1NiJ9";

/// Problems with the VAPID key, subject or a token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VapidError {
    #[error("the VAPID key is neither a PKCS#8 nor a SEC1 P-256 PEM private key")]
    Key,
    #[error("vapid_subject must be a mailto: or https: URI, got {0:?}")]
    Subject(String),
    #[error("vapid_lifetime must be between 1 s and 24 h, got {0:?}")]
    Lifetime(Duration),
    #[error("Authorization is not `vapid t=<JWT>, k=<key>`")]
    Scheme,
    #[error("the k= key is not an uncompressed P-256 public key")]
    PublicKey,
    #[error("the JWT is malformed: {0}")]
    Malformed(&'static str),
    #[error("the JWT's ES256 signature does not verify with the k= key")]
    Signature,
}

/// The claims of a verified VAPID JWT.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
pub struct Claims {
    pub aud: String,
    pub exp: u64,
    #[serde(default)]
    pub sub: Option<String>,
}

/// A verified `Authorization: vapid` header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub claims: Claims,
    /// The `k=` value, base64url of the uncompressed public key.
    pub public_key: String,
}

struct Cached {
    header: HeaderValue,
    /// Re-sign from this instant on (unix ms).
    refresh_at_ms: u64,
    /// Signing order, for evicting the oldest.
    order: u64,
}

#[derive(Default)]
struct Cache {
    map: HashMap<Box<str>, Cached>,
    signed: u64,
}

/// Signs and caches VAPID headers for one key.
pub struct VapidSigner {
    key: SigningKey,
    public_b64: String,
    subject: String,
    lifetime: Duration,
    max_origins: usize,
    cache: Mutex<Cache>,
}

impl std::fmt::Debug for VapidSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VapidSigner")
            .field("public_key", &self.public_b64)
            .field("subject", &self.subject)
            .field("lifetime", &self.lifetime)
            .finish_non_exhaustive()
    }
}

impl VapidSigner {
    /// Loads the key (PKCS#8 or SEC1 PEM) and checks the subject and lifetime.
    pub fn new(
        key_pem: &SecretString,
        subject: &str,
        lifetime: Duration,
    ) -> Result<Self, VapidError> {
        let pem = key_pem.expose_secret();
        let secret = SecretKey::from_pkcs8_pem(pem)
            .or_else(|_| SecretKey::from_sec1_pem(pem))
            .map_err(|_| VapidError::Key)?;
        check_subject(subject)?;
        if lifetime < Duration::from_secs(1) || lifetime > MAX_LIFETIME {
            return Err(VapidError::Lifetime(lifetime));
        }
        let public = secret.public_key().to_encoded_point(false);
        Ok(Self {
            key: SigningKey::from(secret),
            public_b64: B64URL.encode(public.as_bytes()),
            subject: subject.to_string(),
            lifetime,
            max_origins: MAX_ORIGINS,
            cache: Mutex::new(Cache::default()),
        })
    }

    /// A smaller origin bound (tests: eviction without signing 10,000 tokens).
    #[cfg(test)]
    fn with_max_origins(mut self, max_origins: usize) -> Self {
        self.max_origins = max_origins;
        self
    }

    /// The application server key browsers subscribe with (`applicationServerKey`).
    pub fn public_key_b64(&self) -> &str {
        &self.public_b64
    }

    /// The `Authorization` header for `origin` (`https://host[:port]`), cached.
    pub fn authorization(&self, origin: &str) -> HeaderValue {
        let now_ms = unix_ms();
        if let Some(c) = self.cache.lock().map.get(origin) {
            if now_ms < c.refresh_at_ms {
                return c.header.clone();
            }
        }
        let (header, exp) = self.sign(origin, now_ms);
        // Re-sign when a quarter of the lifetime is left, so a token in flight is valid.
        let margin_ms = self.lifetime.as_millis() as u64 / 4;
        let mut cache = self.cache.lock();
        cache.signed += 1;
        let entry = Cached {
            header: header.clone(),
            refresh_at_ms: (exp * 1000).saturating_sub(margin_ms),
            order: cache.signed,
        };
        if cache.map.len() >= self.max_origins && !cache.map.contains_key(origin) {
            evict_oldest(&mut cache.map);
        }
        cache.map.insert(origin.into(), entry);
        header
    }

    /// Origins with a cached header.
    pub fn cached_origins(&self) -> usize {
        self.cache.lock().map.len()
    }

    /// A fresh header for `origin` and its `exp`.
    fn sign(&self, origin: &str, now_ms: u64) -> (HeaderValue, u64) {
        let exp = now_ms / 1000 + self.lifetime.as_secs();
        let claims = serde_json::json!({"aud": origin, "exp": exp, "sub": self.subject});
        let mut token = String::with_capacity(320);
        token.push_str(JWT_HEADER_B64);
        token.push('.');
        B64URL.encode_string(claims.to_string(), &mut token);
        let signature: Signature = self.key.sign(token.as_bytes());
        token.push('.');
        B64URL.encode_string(signature.to_bytes(), &mut token);
        let text = format!("vapid t={token}, k={}", self.public_b64);
        // Base64url, digits, letters and `=, .` only: always a valid header value.
        let mut header = HeaderValue::from_str(&text).unwrap_or(HeaderValue::from_static(""));
        header.set_sensitive(true);
        (header, exp)
    }
}

fn evict_oldest(cache: &mut HashMap<Box<str>, Cached>) {
    let oldest = cache
        .iter()
        .min_by_key(|(_, c)| c.order)
        .map(|(k, _)| k.clone());
    if let Some(k) = oldest {
        cache.remove(&k);
    }
}

/// Checks a `sub` claim: `mailto:` with an address, or an https URL.
pub fn check_subject(subject: &str) -> Result<(), VapidError> {
    let ok = if let Some(addr) = subject.strip_prefix("mailto:") {
        addr.contains('@') && !addr.contains(char::is_whitespace)
    } else {
        subject.starts_with("https:")
            && url::Url::parse(subject).is_ok_and(|u| u.host_str().is_some())
    };
    if ok {
        Ok(())
    } else {
        Err(VapidError::Subject(subject.to_string()))
    }
}

/// Verifies an `Authorization: vapid t=…, k=…` value: the ES256 signature with the
/// given key. Checking `aud`, `exp` and `sub` is the caller's business.
pub fn verify(authorization: &str) -> Result<Verified, VapidError> {
    let rest = authorization
        .strip_prefix("vapid ")
        .ok_or(VapidError::Scheme)?;
    let (mut token, mut key) = (None, None);
    for part in rest.split(',') {
        let part = part.trim();
        if let Some(t) = part.strip_prefix("t=") {
            token = Some(t);
        } else if let Some(k) = part.strip_prefix("k=") {
            key = Some(k);
        }
    }
    let (token, key) = token.zip(key).ok_or(VapidError::Scheme)?;
    let key_bytes = B64URL.decode(key).map_err(|_| VapidError::PublicKey)?;
    let verifying = VerifyingKey::from_sec1_bytes(&key_bytes).map_err(|_| VapidError::PublicKey)?;
    let (signed, sig_b64) = token
        .rsplit_once('.')
        .ok_or(VapidError::Malformed("no signature"))?;
    let (header_b64, claims_b64) = signed
        .split_once('.')
        .ok_or(VapidError::Malformed("not three parts"))?;
    let header: serde_json::Value = decode_json(header_b64)?;
    if header.get("alg").and_then(|a| a.as_str()) != Some("ES256") {
        return Err(VapidError::Malformed("alg is not ES256"));
    }
    let sig_bytes = B64URL
        .decode(sig_b64)
        .map_err(|_| VapidError::Malformed("signature is not base64url"))?;
    let signature = Signature::from_slice(&sig_bytes).map_err(|_| VapidError::Signature)?;
    verifying
        .verify(signed.as_bytes(), &signature)
        .map_err(|_| VapidError::Signature)?;
    let claims: Claims = decode_json(claims_b64)?;
    Ok(Verified {
        claims,
        public_key: key.to_string(),
    })
}

fn decode_json<T: serde::de::DeserializeOwned>(b64: &str) -> Result<T, VapidError> {
    let bytes = B64URL
        .decode(b64)
        .map_err(|_| VapidError::Malformed("part is not base64url"))?;
    serde_json::from_slice(&bytes)
        .map_err(|_| VapidError::Malformed("part is not the JSON expected"))
}

/// Now, in unix milliseconds.
pub(crate) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use aes_gcm::aead::OsRng;
    use p256::pkcs8::{EncodePrivateKey, LineEnding};

    /// A fresh PKCS#8 PEM key (never a file).
    pub(crate) fn pem_key() -> SecretString {
        let key = SecretKey::random(&mut OsRng);
        let pem = key.to_pkcs8_pem(LineEnding::LF).expect("encode");
        SecretString::from(pem.to_string())
    }

    fn signer(lifetime: Duration) -> VapidSigner {
        VapidSigner::new(&pem_key(), "mailto:ops@example.com", lifetime).expect("signer")
    }

    #[test]
    fn signs_a_token_push_services_accept() {
        let s = signer(DEFAULT_LIFETIME);
        let h = s.authorization("https://push.example.net");
        assert!(h.is_sensitive());
        let v = verify(h.to_str().expect("ascii")).expect("verifies");
        assert_eq!(v.claims.aud, "https://push.example.net");
        assert_eq!(v.claims.sub.as_deref(), Some("mailto:ops@example.com"));
        assert_eq!(v.public_key, s.public_key_b64());
        let now = unix_ms() / 1000;
        assert!(v.claims.exp > now + 11 * 3600 && v.claims.exp <= now + 12 * 3600);
        assert_eq!(B64URL.decode(s.public_key_b64()).expect("b64").len(), 65);
    }

    #[test]
    fn caches_per_origin_and_bounds_the_map() {
        let s = signer(DEFAULT_LIFETIME).with_max_origins(3);
        let a = s.authorization("https://a.example");
        assert_eq!(a, s.authorization("https://a.example"), "reused");
        let b = s.authorization("https://b.example:8443");
        assert_ne!(a, b);
        let vb = verify(b.to_str().expect("ascii")).expect("ok");
        assert_eq!(vb.claims.aud, "https://b.example:8443");
        let c = s.authorization("https://c.example");
        assert_eq!(s.cached_origins(), 3);
        // A fourth origin evicts the oldest (a), keeping b and c as they were.
        s.authorization("https://d.example");
        assert_eq!(s.cached_origins(), 3);
        assert_eq!(b, s.authorization("https://b.example:8443"));
        assert_eq!(c, s.authorization("https://c.example"));
        assert_eq!(s.cached_origins(), 3);
    }

    #[test]
    fn a_changed_token_or_key_fails() {
        let s = signer(DEFAULT_LIFETIME);
        let h = s.authorization("https://a.example");
        let text = h.to_str().expect("ascii");
        let other = signer(DEFAULT_LIFETIME);
        let swapped = text.replace(s.public_key_b64(), other.public_key_b64());
        assert_eq!(verify(&swapped), Err(VapidError::Signature));
        assert_eq!(verify("Bearer x"), Err(VapidError::Scheme));
        assert_eq!(verify("vapid t=a.b.c"), Err(VapidError::Scheme));
    }

    #[test]
    fn loads_sec1_and_checks_settings() {
        let key = SecretKey::random(&mut OsRng);
        let sec1 = key.to_sec1_pem(LineEnding::LF).expect("encode");
        let pem = SecretString::from(sec1.to_string());
        assert!(VapidSigner::new(&pem, "https://example.com/contact", DEFAULT_LIFETIME).is_ok());
        let bad =
            SecretString::from("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----");
        assert_eq!(
            VapidSigner::new(&bad, "mailto:a@b", DEFAULT_LIFETIME).err(),
            Some(VapidError::Key)
        );
        for sub in [
            "ops@example.com",
            "mailto:",
            "http://example.com",
            "https://",
        ] {
            assert!(check_subject(sub).is_err(), "{sub}");
        }
        let long = Duration::from_secs(24 * 3600 + 1);
        assert_eq!(
            VapidSigner::new(&pem, "mailto:a@b", long).err(),
            Some(VapidError::Lifetime(long))
        );
        let dbg = format!(
            "{:?}",
            VapidSigner::new(&pem, "mailto:a@b", DEFAULT_LIFETIME)
        );
        assert!(!dbg.contains("PRIVATE"), "{dbg}");
    }
}
