//! The app registry (issue 55) against the real PostgreSQL: the store (put, get, page,
//! disable/enable, delete, open, the master-key rotation) and the HTTP API over it.
//!
//! This file holds the shared helpers: real keys made per process, PUT bodies, and the
//! check that a text holds none of a body's secrets.

mod api;
mod check;
mod cli;
mod pools;
mod rotation;
mod run_logs;
mod store;
pub mod views;
mod watcher;
mod worker;
mod worker_changes;

use p256::pkcs8::{EncodePrivateKey, LineEnding};
use pushpace::apps::{Keyring, MasterKey};
use serde_json::{json, Value};
use std::sync::OnceLock;

/// A fresh P-256 key in PKCS#8 PEM (an APNs `.p8`, or a VAPID key).
pub fn p256_pem() -> String {
    let key = p256::SecretKey::random(&mut rand_core());
    key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
}

/// Flips one bit of `app`'s sealed `kind` in place (a corrupted or altered row).
pub async fn flip_a_sealed_bit(pool: &sqlx::PgPool, app: &str, kind: pushpace::apps::AppKind) {
    sqlx::query(
        "UPDATE app_credentials SET ciphertext = set_byte(ciphertext, 3, get_byte(ciphertext, 3) # 1) \
         WHERE app_id = $1 AND kind = $2",
    )
    .bind(app)
    .bind(kind.as_str())
    .execute(pool)
    .await
    .unwrap();
}

/// The app's events, optionally only those of `field` and/or with `new_value`.
pub async fn count_events(
    pool: &sqlx::PgPool,
    app: &str,
    field: Option<&str>,
    new_value: Option<&str>,
) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM app_events WHERE app_id = $1 \
         AND ($2::text IS NULL OR field = $2) AND ($3::text IS NULL OR new_value = $3)",
    )
    .bind(app)
    .bind(field)
    .bind(new_value)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The public half of a P-256 PKCS#8 PEM, as SPKI PEM (what the APNs mock verifies with).
pub fn public_pem(private_pem: &str) -> String {
    use p256::pkcs8::{DecodePrivateKey, EncodePublicKey};
    let key = p256::SecretKey::from_pkcs8_pem(private_pem).unwrap();
    key.public_key().to_public_key_pem(LineEnding::LF).unwrap()
}

fn rand_core() -> rsa::rand_core::OsRng {
    rsa::rand_core::OsRng
}

/// One RSA key per process (1024 bits: the checks only need it to parse).
pub fn rsa_pem() -> &'static str {
    static KEY: OnceLock<String> = OnceLock::new();
    KEY.get_or_init(|| {
        use rsa::pkcs8::EncodePrivateKey;
        let key = rsa::RsaPrivateKey::new(&mut rand_core(), 1024).unwrap();
        key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
    })
}

pub fn ring() -> Keyring {
    Keyring::new(MasterKey::generate(), vec![]).unwrap()
}

/// The secrets of one app: an APNs key, a service account's private key, a VAPID key.
pub struct Secrets {
    pub apns_key: String,
    pub sa_key: String,
    pub vapid_key: String,
}

impl Secrets {
    pub fn new() -> Secrets {
        Secrets {
            apns_key: p256_pem(),
            sa_key: rsa_pem().to_string(),
            vapid_key: p256_pem(),
        }
    }

    /// A PUT body with all three kinds; `email` names the service account.
    pub fn body(&self, email: &str) -> Value {
        json!({
            "apns": {"key": self.apns_key, "key_id": "ABC123DEFG", "team_id": "TEAM123456",
                     "topic": "com.example.app", "environment": "sandbox", "max_rate": 500},
            "fcm": {"service_account": {
                "type": "service_account", "project_id": "example-app",
                "client_email": email, "private_key": self.sa_key,
                "private_key_id": "0123456789abcdef",
                "token_uri": "https://oauth2.googleapis.com/token"},
                "max_in_flight": 50},
            "webpush": {"vapid_key": self.vapid_key, "subject": "mailto:ops@example.com"},
        })
    }

    /// Fails if `text` holds any secret: each key's PEM body lines (any one of them
    /// would leak key material) or the PEM armour itself.
    pub fn assert_absent(&self, text: &str) {
        assert!(!text.contains("-----BEGIN"), "PEM armour in: {text}");
        for pem in [&self.apns_key, &self.sa_key, &self.vapid_key] {
            for line in pem
                .lines()
                .filter(|l| !l.starts_with("-----") && l.len() >= 16)
            {
                assert!(!text.contains(line), "a secret's line {line:?} in: {text}");
            }
        }
    }
}

/// A body with only Web Push (cheap: one P-256 key).
pub fn webpush_body() -> Value {
    json!({"webpush": {"vapid_key": p256_pem(), "subject": "mailto:ops@example.com"}})
}

pub fn parse(v: &Value) -> pushpace::apps::AppInput {
    pushpace::apps::parse_app(v.to_string().as_bytes()).expect("a good body")
}
