//! The APNs provider token: an ES256 JWT (`kid` = key id, `iss` = team id, `iat`) signed
//! with the `.p8` key, sent as `authorization: bearer <JWT>`.
//!
//! Apple wants the token re-signed at least hourly and at most every 20 minutes (more
//! often answers `429 TooManyProviderTokenUpdates`), so one token is signed and shared
//! by every send. The current token sits behind a `parking_lot` lock held only to clone
//! its `HeaderValue` (a reference-count bump). When it is due, the one send that wins an
//! atomic flag signs the next token (tens of microseconds) while the others keep using
//! the old one, which is still valid. The single exception to the 20-minute floor is
//! `403 ExpiredProviderToken`: [`TokenSigner::on_expired`] re-signs once.
//!
//! The clock is injectable ([`Clock`]) so tests can run time forward.

use crate::provider::ProviderError;
use http::HeaderValue;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use parking_lot::RwLock;
use secrecy::{ExposeSecret, SecretString};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Apple's floor between two re-signs.
pub const MIN_REFRESH: Duration = Duration::from_secs(20 * 60);
/// Apple rejects tokens older than an hour.
pub const MAX_REFRESH: Duration = Duration::from_secs(60 * 60);

/// Unix seconds, from the system clock or a test's.
#[derive(Clone)]
pub struct Clock(Arc<dyn Fn() -> u64 + Send + Sync>);

impl Clock {
    /// The system clock.
    pub fn system() -> Self {
        Clock(Arc::new(unix_now))
    }

    /// A clock that reads `f` (tests).
    pub fn from_fn(f: impl Fn() -> u64 + Send + Sync + 'static) -> Self {
        Clock(Arc::new(f))
    }

    #[inline]
    pub fn now(&self) -> u64 {
        (self.0)()
    }
}

impl std::fmt::Debug for Clock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Clock")
    }
}

/// The system clock in unix seconds.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// One signed token: the whole `authorization` value, when it was signed, and a
/// generation number so that concurrent `ExpiredProviderToken` answers re-sign once.
#[derive(Clone)]
pub struct Token {
    /// `bearer <JWT>`, marked sensitive.
    pub header: HeaderValue,
    pub iat: u64,
    pub generation: u64,
    /// Signed because Apple answered `ExpiredProviderToken`, not on schedule.
    forced: bool,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("iat", &self.iat)
            .field("generation", &self.generation)
            .finish_non_exhaustive()
    }
}

#[derive(serde::Serialize)]
struct Claims<'a> {
    iss: &'a str,
    iat: u64,
}

/// Signs and caches the provider token.
pub struct TokenSigner {
    key: EncodingKey,
    header: Header,
    team_id: String,
    refresh_s: u64,
    clock: Clock,
    current: RwLock<Token>,
    refreshing: AtomicBool,
}

impl std::fmt::Debug for TokenSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let t = self.current.read();
        f.debug_struct("TokenSigner")
            .field("team_id", &self.team_id)
            .field("key_id", &self.header.kid)
            .field("refresh_s", &self.refresh_s)
            .field("iat", &t.iat)
            .field("generation", &t.generation)
            .finish_non_exhaustive()
    }
}

impl TokenSigner {
    /// Reads the key and signs the first token. `refresh` is clamped to Apple's
    /// 20–60 minutes.
    pub fn new(
        provider: &str,
        team_id: &str,
        key_id: &str,
        key_pem: &SecretString,
        refresh: Duration,
        clock: Clock,
    ) -> Result<Self, ProviderError> {
        let key_err = |problem: String| ProviderError::Key {
            provider: provider.to_string(),
            what: "the APNs .p8 key",
            problem,
        };
        // The error text of jsonwebtoken names the kind of failure, never the key.
        let key = EncodingKey::from_ec_pem(key_pem.expose_secret().as_bytes())
            .map_err(|e| key_err(format!("not a PKCS#8 P-256 key in PEM ({e})")))?;
        let mut header = Header::new(Algorithm::ES256);
        header.typ = None;
        header.kid = Some(key_id.to_string());
        let refresh = refresh.clamp(MIN_REFRESH, MAX_REFRESH);
        let mut signer = Self {
            key,
            header,
            team_id: team_id.to_string(),
            refresh_s: refresh.as_secs(),
            clock,
            current: RwLock::new(Token {
                header: HeaderValue::from_static(""),
                iat: 0,
                generation: 0,
                forced: false,
            }),
            refreshing: AtomicBool::new(false),
        };
        let first = signer
            .sign(signer.clock.now(), 1, false)
            .map_err(|e| key_err(format!("cannot sign with it ({e})")))?;
        *signer.current.get_mut() = first;
        Ok(signer)
    }

    /// The token to send now. Re-signs when the current one is `refresh` old; only one
    /// caller signs, the others keep the old token meanwhile.
    pub fn current(&self) -> Token {
        let token = self.current.read().clone();
        let now = self.clock.now();
        if now < token.iat.saturating_add(self.refresh_s) {
            return token;
        }
        if self
            .refreshing
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_err()
        {
            return token;
        }
        let fresh = {
            let now_token = self.current.read().clone();
            if now_token.generation != token.generation {
                Ok(now_token)
            } else {
                self.sign(now, token.generation + 1, false)
            }
        };
        let out = match fresh {
            Ok(fresh) => {
                *self.current.write() = fresh.clone();
                fresh
            }
            Err(e) => {
                // The key signed before, so this is not expected; keep the old token.
                tracing::warn!(team_id = %self.team_id, "cannot re-sign the APNs token: {e}");
                token
            }
        };
        self.refreshing.store(false, Ordering::Release);
        out
    }

    /// Apple answered `403 ExpiredProviderToken` to a request sent with generation
    /// `rejected`. Returns the token to retry with: the one another send already
    /// re-signed, or a new one; `None` when the rejected token was itself an out-of-turn
    /// re-sign less than 20 minutes old (signing again would not help).
    pub fn on_expired(&self, rejected: u64) -> Option<Token> {
        let mut current = self.current.write();
        if current.generation != rejected {
            return Some(current.clone());
        }
        let now = self.clock.now();
        if current.forced && now < current.iat.saturating_add(MIN_REFRESH.as_secs()) {
            return None;
        }
        match self.sign(now, rejected + 1, true) {
            Ok(fresh) => {
                *current = fresh.clone();
                Some(fresh)
            }
            Err(e) => {
                tracing::warn!(team_id = %self.team_id, "cannot re-sign the APNs token: {e}");
                None
            }
        }
    }

    /// Signs a token with `iat` = `now`.
    fn sign(&self, now: u64, generation: u64, forced: bool) -> Result<Token, String> {
        let claims = Claims {
            iss: &self.team_id,
            iat: now,
        };
        let jwt = jsonwebtoken::encode(&self.header, &claims, &self.key)
            .map_err(|e| format!("{:?}", e.kind()))?;
        let mut header = HeaderValue::try_from(format!("bearer {jwt}"))
            .map_err(|_| "the JWT is not a valid header value".to_string())?;
        header.set_sensitive(true);
        Ok(Token {
            header,
            iat: now,
            generation,
            forced,
        })
    }

    /// The signer's clock, unix seconds.
    pub fn now(&self) -> u64 {
        self.clock.now()
    }

    pub fn team_id(&self) -> &str {
        &self.team_id
    }

    pub fn key_id(&self) -> &str {
        self.header.kid.as_deref().unwrap_or("")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicU64;

    fn key() -> (SecretString, String) {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
        (
            SecretString::from(pair.serialize_pem()),
            pair.public_key_pem(),
        )
    }

    fn signer(refresh_min: u64) -> (TokenSigner, Arc<AtomicU64>, String) {
        let now = Arc::new(AtomicU64::new(1_700_000_000));
        let clock_now = Arc::clone(&now);
        let (pem, public) = key();
        let clock = Clock::from_fn(move || clock_now.load(Ordering::Relaxed));
        let s = TokenSigner::new(
            "apns",
            "TEAM123456",
            "KEY1234567",
            &pem,
            Duration::from_secs(refresh_min * 60),
            clock,
        )
        .expect("signer");
        (s, now, public)
    }

    fn jwt(t: &Token) -> String {
        let s = t.header.to_str().expect("ascii");
        s.strip_prefix("bearer ").expect("bearer").to_string()
    }

    #[test]
    fn token_has_apples_header_and_claims_and_verifies() {
        let (s, now, public) = signer(50);
        let t = s.current();
        let jwt = jwt(&t);
        let header = jsonwebtoken::decode_header(&jwt).expect("header");
        assert_eq!(header.alg, Algorithm::ES256);
        assert_eq!(header.kid.as_deref(), Some("KEY1234567"));
        let mut v = jsonwebtoken::Validation::new(Algorithm::ES256);
        v.required_spec_claims.clear();
        v.validate_exp = false;
        let key = jsonwebtoken::DecodingKey::from_ec_pem(public.as_bytes()).expect("pub");
        let data = jsonwebtoken::decode::<serde_json::Value>(&jwt, &key, &v).expect("verify");
        assert_eq!(data.claims["iss"], "TEAM123456");
        assert_eq!(data.claims["iat"], now.load(Ordering::Relaxed));
        assert!(t.header.is_sensitive());
    }

    #[test]
    fn reused_until_refresh_then_resigned() {
        let (s, now, _) = signer(50);
        let first = s.current();
        now.fetch_add(49 * 60 + 59, Ordering::Relaxed);
        let same = s.current();
        assert_eq!(same.header, first.header);
        assert_eq!(same.generation, 1);
        now.fetch_add(1, Ordering::Relaxed);
        let next = s.current();
        assert_ne!(next.header, first.header);
        assert_eq!(next.generation, 2);
        assert_eq!(next.iat, first.iat + 50 * 60);
        assert_eq!(s.current().header, next.header);
    }

    #[test]
    fn refresh_is_clamped_to_apples_window() {
        let (s, now, _) = signer(1);
        let first = s.current();
        now.fetch_add(19 * 60, Ordering::Relaxed);
        assert_eq!(
            s.current().generation,
            first.generation,
            "not before 20 min"
        );
        now.fetch_add(60, Ordering::Relaxed);
        assert_eq!(s.current().generation, first.generation + 1);
        let (s, now, _) = signer(600);
        let first = s.current();
        now.fetch_add(60 * 60, Ordering::Relaxed);
        assert_eq!(
            s.current().generation,
            first.generation + 1,
            "at most 60 min"
        );
    }

    #[test]
    fn expired_resigns_once_per_rejected_token() {
        let (s, now, _) = signer(50);
        let first = s.current();
        now.fetch_add(5 * 60, Ordering::Relaxed);
        let again = s.on_expired(first.generation).expect("re-signed");
        assert_eq!(again.generation, first.generation + 1);
        assert_ne!(again.header, first.header);
        // A second send rejected with the old token gets the new one, no new signature.
        let other = s.on_expired(first.generation).expect("current");
        assert_eq!(other.header, again.header);
        // The forced token rejected too: no second out-of-turn signature.
        assert!(s.on_expired(again.generation).is_none());
        assert_eq!(s.current().generation, again.generation);
        // Twenty minutes later a forced re-sign is allowed again.
        now.fetch_add(20 * 60, Ordering::Relaxed);
        assert!(s.on_expired(again.generation).is_some());
    }

    #[test]
    fn debug_hides_the_token_and_bad_keys_are_refused() {
        let (s, _, _) = signer(50);
        let t = s.current();
        let jwt = jwt(&t);
        let shown = format!("{s:?} {t:?}");
        assert!(!shown.contains(&jwt[..20]), "{shown}");
        assert!(shown.contains("TEAM123456"));
        let bad = SecretString::from(
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n".to_string(),
        );
        let err = TokenSigner::new("apns", "T", "K", &bad, MIN_REFRESH, Clock::system())
            .expect_err("bad key");
        assert!(!err.to_string().contains("AAAA"), "{err}");
    }
}
