//! A strict FCM HTTP v1 mock over TLS and HTTP/2: the OAuth token endpoint and
//! `messages:send`, on [`MockServer`].
//!
//! It makes its own service account (an RSA 2048 key, or one it is given):
//! [`FcmMock::service_account_json`] points `token_uri` at `https://127.0.0.1:PORT/token`.
//!
//! `POST /token` checks the form (`grant_type`, the RS256 assertion's signature, `iss`,
//! `scope`, `aud` = token_uri, `exp - iat` ≤ 3600, not expired) and grants a random
//! access token living `expires_in` (settable). `POST /v1/projects/<id>/messages:send`
//! checks the bearer token (known, unexpired, not revoked: else 401 UNAUTHENTICATED),
//! the content type, and the body: `{"message": {...}}` with exactly one target, a
//! `token`; known fields only; `data` values all strings; `android.ttl` as "Ns" and
//! `android.priority` HIGH/NORMAL; the message at most 4096 bytes (else 400
//! INVALID_ARGUMENT with a field violation, as FCM answers).
//!
//! Device tokens that map to errors (the prefix decides):
//!
//! | prefix | answer |
//! |---|---|
//! | `unreg-` | 404 UNREGISTERED |
//! | `quota-` | 429 QUOTA_EXCEEDED, `retry-after: 120` |
//! | `unavail-` | 503 UNAVAILABLE, `retry-after: 7` |
//! | `internal-` | 500 INTERNAL |
//! | `mismatch-` | 403 SENDER_ID_MISMATCH |
//! | `badtoken-` | 400 INVALID_ARGUMENT, field violation on `message.token` |
//! | `thirdparty-` | 401 THIRD_PARTY_AUTH_ERROR |
//!
//! [`FcmMock::force_error`] answers every send with one of these;
//! [`FcmMock::set_token_endpoint_down`] makes `/token` answer 503;
//! [`FcmMock::revoke_tokens`] forgets every access token granted so far;
//! [`FcmMock::set_deny_all_tokens`] answers 401 to every send.

use super::h2server::{Handler, Knobs, MockServer};
use super::tls::TestCa;
use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, LineEnding};
use rules::check_body;
use serde::Deserialize;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

mod rules;

/// FCM's OAuth scope.
pub const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
const FCM_ERROR: &str = "type.googleapis.com/google.firebase.fcm.v1.FcmError";
const BAD_REQUEST: &str = "type.googleapis.com/google.rpc.BadRequest";
/// FCM's limit on a message.
pub const MAX_MESSAGE_BYTES: usize = 4096;

/// An error answer of `messages:send`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FcmError {
    Unregistered,
    QuotaExceeded,
    Unavailable,
    Internal,
    SenderIdMismatch,
    BadToken,
    ThirdPartyAuth,
}

impl FcmError {
    /// The error a device token asks for by its prefix.
    pub fn for_token(token: &str) -> Option<FcmError> {
        const PREFIXES: [(&str, FcmError); 7] = [
            ("unreg-", FcmError::Unregistered),
            ("quota-", FcmError::QuotaExceeded),
            ("unavail-", FcmError::Unavailable),
            ("internal-", FcmError::Internal),
            ("mismatch-", FcmError::SenderIdMismatch),
            ("badtoken-", FcmError::BadToken),
            ("thirdparty-", FcmError::ThirdPartyAuth),
        ];
        PREFIXES
            .iter()
            .find(|(p, _)| token.starts_with(p))
            .map(|(_, e)| *e)
    }

    fn response(self) -> Response<Bytes> {
        let (status, grpc, code, message, retry_after) = match self {
            FcmError::Unregistered => (
                404,
                "NOT_FOUND",
                "UNREGISTERED",
                "Requested entity was not found.",
                None,
            ),
            FcmError::QuotaExceeded => (
                429,
                "RESOURCE_EXHAUSTED",
                "QUOTA_EXCEEDED",
                "Quota exceeded.",
                Some("120"),
            ),
            FcmError::Unavailable => (
                503,
                "UNAVAILABLE",
                "UNAVAILABLE",
                "The service is currently unavailable.",
                Some("7"),
            ),
            FcmError::Internal => (
                500,
                "INTERNAL",
                "INTERNAL",
                "Internal error encountered.",
                None,
            ),
            FcmError::SenderIdMismatch => (
                403,
                "PERMISSION_DENIED",
                "SENDER_ID_MISMATCH",
                "SenderId mismatch",
                None,
            ),
            FcmError::BadToken => {
                return invalid_argument(
                    "The registration token is not a valid FCM registration token",
                    "message.token",
                )
            }
            FcmError::ThirdPartyAuth => (
                401,
                "UNAUTHENTICATED",
                "THIRD_PARTY_AUTH_ERROR",
                "Auth error from APNS or Web Push Service",
                None,
            ),
        };
        let details = json!([{ "@type": FCM_ERROR, "errorCode": code }]);
        let mut r = error_response(status, grpc, message, details);
        if let Some(secs) = retry_after {
            r.headers_mut().insert(
                http::header::RETRY_AFTER,
                http::HeaderValue::from_static(secs),
            );
        }
        r
    }
}

/// How the mock starts.
#[derive(Debug, Clone)]
pub struct FcmMockConfig {
    pub project_id: String,
    pub client_email: String,
    /// Lifetime of the access tokens it grants.
    pub expires_in: Duration,
    /// The service account's key (PKCS#8 PEM); a fresh RSA 2048 key when `None`.
    pub key_pem: Option<String>,
    /// Keep counts only, not per-token counts or bodies (bench volumes).
    pub count_only: bool,
    /// Where to listen (default 127.0.0.1, a free port).
    pub bind: Option<std::net::SocketAddr>,
}

impl Default for FcmMockConfig {
    fn default() -> Self {
        Self {
            project_id: "pushpace-mock".into(),
            client_email: "sender@pushpace-mock.iam.gserviceaccount.com".into(),
            expires_in: Duration::from_secs(3600),
            key_pem: None,
            count_only: false,
            bind: None,
        }
    }
}

/// A fresh RSA 2048 key in PKCS#8 PEM (for [`FcmMockConfig::key_pem`], to share one
/// key between mocks: generating one takes a moment).
pub fn generate_key_pem() -> String {
    let mut rng = rsa::rand_core::OsRng;
    let key = rsa::RsaPrivateKey::new(&mut rng, 2048).expect("RSA key generation");
    key.to_pkcs8_pem(LineEnding::LF)
        .expect("PKCS#8 encoding")
        .to_string()
}

#[derive(Default)]
struct Counters {
    grants: AtomicU64,
    token_refusals: AtomicU64,
    sends: AtomicU64,
    unauthenticated: AtomicU64,
    delivered: Mutex<HashMap<String, u64>>,
    bodies: Mutex<Vec<Value>>,
}

struct State {
    config: FcmMockConfig,
    decoding: DecodingKey,
    /// `https://127.0.0.1:PORT/token`, known once the server listens.
    token_uri: OnceLock<String>,
    expires_in_ms: AtomicU64,
    token_down: AtomicBool,
    /// Every bearer token is refused (401), even fresh ones.
    deny_all: AtomicBool,
    forced: Mutex<Option<FcmError>>,
    tokens: Mutex<HashMap<String, Instant>>,
    counters: Counters,
    changed: Notify,
}

/// A running FCM mock.
pub struct FcmMock {
    server: MockServer,
    state: Arc<State>,
    key_pem: String,
}

impl std::fmt::Debug for FcmMock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FcmMock")
            .field("url", &self.server.url())
            .finish_non_exhaustive()
    }
}

impl FcmMock {
    /// Starts with the default configuration (inside a tokio runtime).
    pub fn start(ca: &TestCa) -> std::io::Result<FcmMock> {
        Self::start_with(ca, FcmMockConfig::default())
    }

    pub fn start_with(ca: &TestCa, mut config: FcmMockConfig) -> std::io::Result<FcmMock> {
        let key_pem = config.key_pem.take().unwrap_or_else(generate_key_pem);
        let invalid = |e: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, e);
        let key = <rsa::RsaPrivateKey as rsa::pkcs8::DecodePrivateKey>::from_pkcs8_pem(&key_pem)
            .map_err(|e| invalid(format!("key_pem: {e}")))?;
        let public = key
            .to_public_key()
            .to_public_key_pem(LineEnding::LF)
            .map_err(|e| invalid(e.to_string()))?;
        let decoding =
            DecodingKey::from_rsa_pem(public.as_bytes()).map_err(|e| invalid(e.to_string()))?;
        let state = Arc::new(State {
            expires_in_ms: AtomicU64::new(config.expires_in.as_millis() as u64),
            config,
            decoding,
            token_uri: OnceLock::new(),
            token_down: AtomicBool::new(false),
            deny_all: AtomicBool::new(false),
            forced: Mutex::new(None),
            tokens: Mutex::new(HashMap::new()),
            counters: Counters::default(),
            changed: Notify::new(),
        });
        let handler = Arc::new(FcmHandler(Arc::clone(&state)));
        let bind = state.config.bind.unwrap_or(([127, 0, 0, 1], 0).into());
        let server = MockServer::start_on(bind, ca, handler, Knobs::default())?;
        let _ = state.token_uri.set(format!("{}/token", server.url()));
        Ok(FcmMock {
            server,
            state,
            key_pem,
        })
    }

    /// The service account JSON for a provider spec (holds the private key).
    pub fn service_account_json(&self) -> String {
        json!({
            "type": "service_account",
            "project_id": self.state.config.project_id,
            "private_key_id": "mock",
            "private_key": self.key_pem,
            "client_email": self.state.config.client_email,
            "token_uri": self.token_uri(),
        })
        .to_string()
    }

    pub fn token_uri(&self) -> String {
        self.state.token_uri.get().cloned().unwrap_or_default()
    }

    /// `https://127.0.0.1:PORT`: the `messages:send` endpoint for the spec.
    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn server(&self) -> &MockServer {
        &self.server
    }

    pub fn project_id(&self) -> &str {
        &self.state.config.project_id
    }

    /// Lifetime of tokens granted from now on (`expires_in` is whole seconds, at least 1).
    pub fn set_expires_in(&self, d: Duration) {
        self.state.expires_in_ms.store(d.as_millis() as u64, SeqCst);
    }

    /// While down, `/token` answers 503.
    pub fn set_token_endpoint_down(&self, down: bool) {
        self.state.token_down.store(down, SeqCst);
    }

    /// While set, every send is answered 401 UNAUTHENTICATED, fresh tokens too.
    pub fn set_deny_all_tokens(&self, deny: bool) {
        self.state.deny_all.store(deny, SeqCst);
    }

    /// Answers every send with `error` (or stops doing so).
    pub fn force_error(&self, error: Option<FcmError>) {
        *self.state.forced.lock() = error;
    }

    /// Forgets every access token granted so far: their sends get 401.
    pub fn revoke_tokens(&self) {
        self.state.tokens.lock().clear();
    }

    /// Access tokens granted.
    pub fn grants(&self) -> u64 {
        self.state.counters.grants.load(SeqCst)
    }

    /// Token requests refused (bad assertion or endpoint down).
    pub fn token_refusals(&self) -> u64 {
        self.state.counters.token_refusals.load(SeqCst)
    }

    /// `messages:send` requests, whatever their answer.
    pub fn sends(&self) -> u64 {
        self.state.counters.sends.load(SeqCst)
    }

    /// Sends answered 401 UNAUTHENTICATED (unknown, expired or revoked access token).
    pub fn unauthenticated(&self) -> u64 {
        self.state.counters.unauthenticated.load(SeqCst)
    }

    /// Messages accepted for `token`.
    pub fn delivered(&self, token: &str) -> u64 {
        self.state
            .counters
            .delivered
            .lock()
            .get(token)
            .copied()
            .unwrap_or(0)
    }

    /// The accepted request bodies, oldest first (the last 1000).
    pub fn bodies(&self) -> Vec<Value> {
        self.state.counters.bodies.lock().clone()
    }

    /// Waits until `grants() >= n` (false after `timeout`).
    pub async fn wait_grants(&self, n: u64, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        loop {
            let changed = self.state.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if self.grants() >= n {
                return true;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return self.grants() >= n;
            }
        }
    }

    pub fn shutdown(&self) {
        self.server.shutdown();
    }
}

struct FcmHandler(Arc<State>);

impl Handler for FcmHandler {
    fn handle(
        &self,
        req: Request<Bytes>,
    ) -> impl std::future::Future<Output = Response<Bytes>> + Send {
        let response = self.0.route(&req);
        std::future::ready(response)
    }
}

impl State {
    fn route(&self, req: &Request<Bytes>) -> Response<Bytes> {
        let path = req.uri().path();
        let send_path = format!("/v1/projects/{}/messages:send", self.config.project_id);
        if req.method() != Method::POST {
            return error_response(405, "INVALID_ARGUMENT", "POST only", json!([]));
        }
        if path == "/token" {
            let r = self.token(req);
            self.changed.notify_waiters();
            return r;
        }
        if path == send_path {
            self.counters.sends.fetch_add(1, SeqCst);
            return self.send(req);
        }
        error_response(404, "NOT_FOUND", &format!("no such path {path}"), json!([]))
    }

    fn token(&self, req: &Request<Bytes>) -> Response<Bytes> {
        let refuse = |status: u16, error: &str, description: String| {
            self.counters.token_refusals.fetch_add(1, SeqCst);
            let body = json!({"error": error, "error_description": description});
            json_response(status, &body)
        };
        if self.token_down.load(SeqCst) {
            return refuse(503, "unavailable", "the mock token endpoint is down".into());
        }
        let form_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !form_type.starts_with("application/x-www-form-urlencoded") {
            return refuse(
                400,
                "invalid_request",
                format!("content-type {form_type:?}"),
            );
        }
        let form: HashMap<String, String> = url::form_urlencoded::parse(req.body())
            .into_owned()
            .collect();
        if form.get("grant_type").map(String::as_str) != Some(GRANT_TYPE) {
            return refuse(400, "unsupported_grant_type", "bad grant_type".into());
        }
        let Some(assertion) = form.get("assertion") else {
            return refuse(400, "invalid_request", "no assertion".into());
        };
        if let Err(e) = self.check_assertion(assertion) {
            return refuse(400, "invalid_grant", e);
        }
        let access = format!(
            "ya29.mock-{:016x}{:016x}",
            fastrand::u64(..),
            fastrand::u64(..)
        );
        let lifetime = Duration::from_millis(self.expires_in_ms.load(SeqCst));
        let expires_in = lifetime.as_secs().max(1);
        self.tokens.lock().insert(
            access.clone(),
            Instant::now() + Duration::from_secs(expires_in),
        );
        self.counters.grants.fetch_add(1, SeqCst);
        let body =
            json!({"access_token": access, "expires_in": expires_in, "token_type": "Bearer"});
        json_response(200, &body)
    }

    fn check_assertion(&self, assertion: &str) -> Result<(), String> {
        #[derive(Deserialize)]
        struct Claims {
            scope: String,
            iat: u64,
            exp: u64,
        }
        let token_uri = self.token_uri.get().map_or("", String::as_str);
        let mut v = Validation::new(Algorithm::RS256);
        v.set_audience(&[token_uri]);
        v.set_issuer(&[&self.config.client_email]);
        v.set_required_spec_claims(&["exp", "iat", "iss", "aud"]);
        v.leeway = 0;
        let data = jsonwebtoken::decode::<Claims>(assertion, &self.decoding, &v)
            .map_err(|e| format!("assertion: {e}"))?;
        let c = data.claims;
        if c.scope.split(' ').all(|s| s != SCOPE) {
            return Err(format!("scope {:?} lacks {SCOPE}", c.scope));
        }
        if c.exp <= c.iat || c.exp - c.iat > 3600 {
            return Err("exp must be after iat and at most an hour later".into());
        }
        Ok(())
    }

    fn send(&self, req: &Request<Bytes>) -> Response<Bytes> {
        if !self.authorized(req) {
            self.counters.unauthenticated.fetch_add(1, SeqCst);
            return error_response(
                401,
                "UNAUTHENTICATED",
                "Request had invalid authentication credentials. Expected OAuth 2 access token.",
                json!([]),
            );
        }
        let content_type = req
            .headers()
            .get(http::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("");
        if !content_type.starts_with("application/json") {
            return invalid_argument(&format!("content-type {content_type:?}"), "");
        }
        let (message, token) = match check_body(req.body()) {
            Ok(ok) => ok,
            Err(r) => return invalid_argument(&r.message, &r.field),
        };
        let forced = *self.forced.lock();
        if let Some(error) = forced.or_else(|| FcmError::for_token(&token)) {
            return error.response();
        }
        if self.config.count_only {
            return json_response(
                200,
                &json!({ "name": format!("projects/{}/messages/0", self.config.project_id) }),
            );
        }
        *self.counters.delivered.lock().entry(token).or_insert(0) += 1;
        let mut bodies = self.counters.bodies.lock();
        if bodies.len() >= 1000 {
            bodies.remove(0);
        }
        bodies.push(json!({ "message": message }));
        drop(bodies);
        let name = format!(
            "projects/{}/messages/{:016x}",
            self.config.project_id,
            fastrand::u64(..)
        );
        json_response(200, &json!({ "name": name }))
    }

    fn authorized(&self, req: &Request<Bytes>) -> bool {
        if self.deny_all.load(SeqCst) {
            return false;
        }
        let Some(token) = req
            .headers()
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
        else {
            return false;
        };
        self.tokens
            .lock()
            .get(token)
            .is_some_and(|expiry| *expiry > Instant::now())
    }
}

/// 400 INVALID_ARGUMENT, with a field violation on `field` (none when empty).
fn invalid_argument(message: &str, field: &str) -> Response<Bytes> {
    let mut details = vec![json!({"@type": FCM_ERROR, "errorCode": "INVALID_ARGUMENT"})];
    if !field.is_empty() {
        details.push(json!({"@type": BAD_REQUEST,
            "fieldViolations": [{"field": field, "description": message}]}));
    }
    error_response(400, "INVALID_ARGUMENT", message, Value::Array(details))
}

fn error_response(status: u16, grpc: &str, message: &str, details: Value) -> Response<Bytes> {
    let body = json!({"error": {"code": status, "message": message, "status": grpc,
        "details": details}});
    json_response(status, &body)
}

fn json_response(status: u16, body: &Value) -> Response<Bytes> {
    let mut r = Response::new(Bytes::from(body.to_string()));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/json; charset=UTF-8"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes() {
        assert_eq!(FcmError::for_token("unreg-1"), Some(FcmError::Unregistered));
        assert_eq!(FcmError::for_token("ok-1"), None);
        assert_eq!(FcmError::QuotaExceeded.response().status(), 429);
    }
}
