//! A loopback Web Push service, as strict as the real ones: TLS with ALPN h2, one
//! endpoint per subscription (`https://127.0.0.1:PORT/push/<id>`), and for each POST the
//! checks a push service makes (known subscription, `TTL`, `Content-Encoding:
//! aes128gcm`, a VAPID token that verifies, for this origin, not expired and at most
//! 24 h ahead, with a `mailto:`/`https:` subject). It then decrypts the body with the
//! subscription's own private key and auth secret (RFC 8291), as the browser would, and
//! keeps the plaintext, so tests compare what a browser would show with what was sent.
//! A subscription made under another application server key
//! ([`WebPushMock::subscribe_under`]) is answered 403 alone, as real services do.

use crate::provider::webpush::subscription::B64URL;
use crate::provider::webpush::{ece, vapid};
use crate::tools::mock::h2server::{Handler, Knobs, MockServer};
use crate::tools::mock::tls::TestCa;
use aes_gcm::aead::OsRng;
use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Request, Response, StatusCode};
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::SecretKey;
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, OnceLock};

pub use super::seeded::SeededSubscriptions;

/// Largest body a push service takes.
pub const MAX_BODY: usize = 4096;

/// One POST as the mock saw it (whatever it answered).
#[derive(Clone)]
pub struct SeenRequest {
    /// The subscription id from the path.
    pub id: String,
    pub status: u16,
    pub ttl: Option<String>,
    pub urgency: Option<String>,
    pub topic: Option<String>,
    /// The VAPID JWT (`t=`), to see when it was re-signed.
    pub vapid_token: Option<String>,
}

impl std::fmt::Debug for SeenRequest {
    // The JWT stays out of Debug output, as everywhere.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SeenRequest")
            .field("id", &self.id)
            .field("status", &self.status)
            .field("ttl", &self.ttl)
            .field("urgency", &self.urgency)
            .field("topic", &self.topic)
            .finish_non_exhaustive()
    }
}

struct Subscription {
    secret: SecretKey,
    auth: [u8; 16],
    gone: bool,
    received: Vec<Vec<u8>>,
    /// The application server key (`k=`) it was made under, when it is not whatever
    /// key signs (a subscription from before a key rotation).
    made_under: Option<String>,
    /// A status it is answered with once the request is otherwise valid (a test's
    /// choice: Mozilla's 401 errno 109, a 413 of a service with a smaller limit).
    refused_with: Option<u16>,
}

/// An answer forced on the next requests.
#[derive(Clone, Copy)]
struct Forced {
    status: u16,
    retry_after: Option<u64>,
    left: usize,
}

#[derive(Default)]
struct State {
    /// `https://127.0.0.1:PORT`, set once the server listens.
    origin: OnceLock<String>,
    subs: Mutex<HashMap<String, Subscription>>,
    seen: Mutex<Vec<SeenRequest>>,
    forced: Mutex<Option<Forced>>,
    /// The VAPID key (`k=`) subscriptions were made with, when one is required.
    expected_key: Mutex<Option<String>>,
    next_id: Mutex<u64>,
    /// Subscriptions `d<i>` derived from a seed (benchmarks).
    seeded: OnceLock<SeededSubscriptions>,
    /// Keep counts only: no request log, no plaintexts (bench volumes).
    count_only: AtomicBool,
    delivered: AtomicU64,
    /// The last Authorization header that verified, to skip re-verifying its signature.
    verified: Mutex<Option<(String, vapid::Verified)>>,
}

/// The running mock.
pub struct WebPushMock {
    server: MockServer,
    state: Arc<State>,
}

/// SETTINGS_MAX_CONCURRENT_STREAMS, as the real push services advertise about 100 (the
/// HTTP/2 spec's recommended minimum). Unlimited, a client with 1,024 sends in flight
/// left that many small DATA frames waiting on the mock's decrypts, and the `h2`
/// server's framing budget answered with a GOAWAY (ENHANCE_YOUR_CALM,
/// "too_many_data_frames"): every send in flight failed and was retried.
pub const MAX_CONCURRENT_STREAMS: u32 = 100;

impl WebPushMock {
    /// Starts a push service on a loopback port with a certificate from `ca` (inside a
    /// tokio runtime).
    pub fn start(ca: &TestCa) -> std::io::Result<Self> {
        Self::start_on(([127, 0, 0, 1], 0).into(), ca)
    }

    /// [`WebPushMock::start`] on a given address.
    pub fn start_on(bind: std::net::SocketAddr, ca: &TestCa) -> std::io::Result<Self> {
        let state = Arc::new(State::default());
        let handler = Arc::new(PushHandler(Arc::clone(&state)));
        let knobs = Knobs {
            max_concurrent_streams: Some(MAX_CONCURRENT_STREAMS),
            ..Knobs::default()
        };
        let server = MockServer::start_on(bind, ca, handler, knobs)?;
        let _ = state.origin.set(server.url());
        Ok(Self { server, state })
    }

    /// Also accepts the subscriptions `d<i>` of `seed` (see [`SeededSubscriptions`]).
    pub fn accept_seeded(&self, seed: [u8; 32]) -> SeededSubscriptions {
        let subs = SeededSubscriptions::new(&self.origin(), seed);
        let _ = self.state.seeded.set(subs.clone());
        subs
    }

    /// Keep counts only (no request log, no plaintexts).
    pub fn set_count_only(&self, on: bool) {
        self.state.count_only.store(on, Relaxed);
    }

    /// Messages decrypted and accepted (201).
    pub fn delivered(&self) -> u64 {
        self.state.delivered.load(Relaxed)
    }

    /// `https://127.0.0.1:PORT`.
    pub fn origin(&self) -> String {
        self.server.url()
    }

    /// The underlying HTTP/2 server (connection and stream counts).
    pub fn server(&self) -> &MockServer {
        &self.server
    }

    /// A new subscription: its JSON (the job's device string) and its id.
    pub fn subscribe(&self) -> (String, String) {
        self.subscribe_with(None)
    }

    /// A subscription made under the application server key `key`: a token signed by
    /// any other key is answered 403 for it alone, as FCM's web endpoint does for a
    /// subscription from before a key rotation.
    pub fn subscribe_under(&self, key: &str) -> (String, String) {
        self.subscribe_with(Some(key.to_string()))
    }

    fn subscribe_with(&self, made_under: Option<String>) -> (String, String) {
        let secret = SecretKey::random(&mut OsRng);
        let mut auth = [0u8; 16];
        aes_gcm::aead::rand_core::RngCore::fill_bytes(&mut OsRng, &mut auth);
        let id = {
            let mut n = self.state.next_id.lock();
            *n += 1;
            format!("s{n}-{:016x}", fastrand::u64(..))
        };
        let p256dh = B64URL.encode(secret.public_key().to_encoded_point(false).as_bytes());
        let json = serde_json::json!({
            "endpoint": format!("{}/push/{id}", self.origin()),
            "keys": {"p256dh": p256dh, "auth": B64URL.encode(auth)},
        })
        .to_string();
        let sub = Subscription {
            secret,
            auth,
            gone: false,
            received: Vec::new(),
            made_under,
            refused_with: None,
        };
        self.state.subs.lock().insert(id.clone(), sub);
        (json, id)
    }

    /// The browser unsubscribed: its endpoint answers 410 from now on.
    pub fn unsubscribe(&self, id: &str) {
        if let Some(s) = self.state.subs.lock().get_mut(id) {
            s.gone = true;
        }
    }

    /// Subscription `id` alone is answered `status` (401, 403, 413…) from now on, once
    /// its request passes every other check.
    pub fn refuse_subscription(&self, id: &str, status: u16) {
        if let Some(s) = self.state.subs.lock().get_mut(id) {
            s.refused_with = Some(status);
        }
    }

    /// The plaintexts delivered to subscription `id`, in order.
    pub fn received(&self, id: &str) -> Vec<Vec<u8>> {
        self.state
            .subs
            .lock()
            .get(id)
            .map(|s| s.received.clone())
            .unwrap_or_default()
    }

    /// Every POST seen, in order.
    pub fn requests(&self) -> Vec<SeenRequest> {
        self.state.seen.lock().clone()
    }

    /// Requires the VAPID key `k=` (base64url) that the subscriptions were made with;
    /// another key is answered 403, as a push service does for a key mismatch.
    pub fn expect_vapid_key(&self, key: &str) {
        *self.state.expected_key.lock() = Some(key.to_string());
    }

    /// The next `count` requests are answered `status` (429, 503…), with `Retry-After:
    /// <seconds>` when given, before any other check.
    pub fn force(&self, status: u16, retry_after: Option<u64>, count: usize) {
        *self.state.forced.lock() = Some(Forced {
            status,
            retry_after,
            left: count,
        });
    }

    pub fn shutdown(&self) {
        self.server.shutdown();
    }
}

struct PushHandler(Arc<State>);

impl Handler for PushHandler {
    fn handle(
        &self,
        req: Request<Bytes>,
    ) -> impl std::future::Future<Output = Response<Bytes>> + Send {
        let response = self.0.answer(&req);
        std::future::ready(response)
    }
}

fn header(headers: &HeaderMap, name: &str) -> Option<String> {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
}

fn reply(status: u16, message: &str) -> Response<Bytes> {
    let body = serde_json::json!({"code": status, "message": message}).to_string();
    let mut response = Response::new(Bytes::from(body));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    response
}

/// A status and message the mock refuses a request with.
type Refusal = (u16, String);

fn refuse(status: u16, message: &str) -> Refusal {
    (status, message.to_string())
}

impl State {
    fn answer(&self, req: &Request<Bytes>) -> Response<Bytes> {
        let headers = req.headers();
        let id = req
            .uri()
            .path()
            .strip_prefix("/push/")
            .unwrap_or_default()
            .to_string();
        let token = header(headers, "authorization").and_then(|a| {
            a.split(',')
                .find_map(|p| p.trim().trim_start_matches("vapid ").strip_prefix("t="))
                .map(str::to_string)
        });
        let response = self.check_and_deliver(req, &id);
        if self.count_only.load(Relaxed) {
            return response;
        }
        self.seen.lock().push(SeenRequest {
            id,
            status: response.status().as_u16(),
            ttl: header(headers, "ttl"),
            urgency: header(headers, "urgency"),
            topic: header(headers, "topic"),
            vapid_token: token,
        });
        response
    }

    fn check_and_deliver(&self, req: &Request<Bytes>, id: &str) -> Response<Bytes> {
        if let Some(forced) = self.take_forced() {
            let mut r = reply(forced.status, "forced by the test");
            if let Some(secs) = forced.retry_after {
                r.headers_mut()
                    .insert(http::header::RETRY_AFTER, secs.into());
            }
            return r;
        }
        if req.method() != http::Method::POST {
            return reply(405, "POST only");
        }
        let seeded = self.seeded.get().and_then(|s| s.secrets(id));
        let (made_under, refused_with) = match self.subs.lock().get(id) {
            None if seeded.is_none() => return reply(404, "no such subscription"),
            Some(s) if s.gone => return reply(410, "subscription expired"),
            s => (
                s.and_then(|s| s.made_under.clone()),
                s.and_then(|s| s.refused_with),
            ),
        };
        if let Err((status, message)) = check_headers(req.headers()) {
            return reply(status, &message);
        }
        let key = match self.check_vapid(req.headers()) {
            Ok(key) => key,
            Err((status, message)) => return reply(status, &message),
        };
        if made_under.is_some_and(|k| k != key) {
            return reply(
                403,
                "VAPID key differs from the one this subscription was made under",
            );
        }
        if let Some(status) = refused_with {
            return reply(status, "refused for this subscription by the test");
        }
        let body = req.body();
        if body.len() > MAX_BODY {
            return reply(413, "body larger than 4096 bytes");
        }
        if let Some((secret, auth)) = seeded {
            return match ece::decrypt(body, &secret, &auth) {
                Ok(_) => self.created(),
                Err(e) => reply(400, &format!("cannot decrypt: {e}")),
            };
        }
        let mut subs = self.subs.lock();
        let Some(sub) = subs.get_mut(id) else {
            return reply(404, "no such subscription");
        };
        match ece::decrypt(body, &sub.secret, &sub.auth) {
            Ok(plain) => {
                if !self.count_only.load(Relaxed) {
                    sub.received.push(plain);
                }
                self.created()
            }
            Err(e) => reply(400, &format!("cannot decrypt: {e}")),
        }
    }

    fn created(&self) -> Response<Bytes> {
        self.delivered.fetch_add(1, Relaxed);
        let mut r = reply(201, "created");
        *r.body_mut() = Bytes::new();
        r
    }

    fn take_forced(&self) -> Option<Forced> {
        let mut forced = self.forced.lock();
        let f = forced.as_mut()?;
        if f.left == 0 {
            *forced = None;
            return None;
        }
        f.left -= 1;
        Some(*f)
    }

    /// RFC 8292: the token verifies with `k=`, is for this origin, expires in the future
    /// and at most 24 h ahead, and names a contact.
    /// Returns the token's key (`k=`).
    fn check_vapid(&self, headers: &HeaderMap) -> Result<String, Refusal> {
        let auth = header(headers, "authorization")
            .ok_or_else(|| refuse(401, "missing VAPID Authorization"))?;
        let cached = {
            let last = self.verified.lock();
            last.as_ref()
                .filter(|(a, _)| *a == auth)
                .map(|(_, v)| v.clone())
        };
        let v = match cached {
            Some(v) => v,
            None => {
                let v = vapid::verify(&auth).map_err(|e| refuse(401, &e.to_string()))?;
                *self.verified.lock() = Some((auth.clone(), v.clone()));
                v
            }
        };
        let origin = self.origin.get().map_or("", String::as_str);
        if v.claims.aud != origin {
            return Err(refuse(401, "VAPID aud is not this push service's origin"));
        }
        let now = vapid::unix_ms() / 1000;
        if v.claims.exp <= now {
            return Err(refuse(401, "VAPID token expired"));
        }
        if v.claims.exp > now + vapid::MAX_LIFETIME.as_secs() {
            return Err(refuse(401, "VAPID exp more than 24 h ahead"));
        }
        let sub = v.claims.sub.as_deref().unwrap_or_default();
        if vapid::check_subject(sub).is_err() {
            return Err(refuse(401, "VAPID sub is not a mailto: or https: contact"));
        }
        if let Some(expected) = &*self.expected_key.lock() {
            if *expected != v.public_key {
                return Err(refuse(403, "VAPID key differs from the subscription's"));
            }
        }
        Ok(v.public_key)
    }
}

/// `TTL` (required), `Content-Encoding`, and `Urgency`/`Topic` when present.
fn check_headers(headers: &HeaderMap) -> Result<(), Refusal> {
    match header(headers, "ttl").map(|t| t.parse::<u64>()) {
        None => return Err(refuse(400, "missing TTL")),
        Some(Err(_)) => return Err(refuse(400, "TTL is not a number of seconds")),
        Some(Ok(_)) => {}
    }
    if header(headers, "content-encoding").as_deref() != Some("aes128gcm") {
        return Err(refuse(400, "Content-Encoding must be aes128gcm"));
    }
    if let Some(u) = header(headers, "urgency") {
        if !matches!(u.as_str(), "very-low" | "low" | "normal" | "high") {
            return Err(refuse(400, "unknown Urgency"));
        }
    }
    if let Some(t) = header(headers, "topic") {
        let ok = t.len() <= 32
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
        if !ok {
            return Err(refuse(400, "Topic is not at most 32 base64url characters"));
        }
    }
    Ok(())
}
