//! A strict loopback APNs: HTTP/2 over TLS (ALPN h2 only), checking every request as
//! Apple's provider API does, so that the adapter's tests fail where Apple would.
//!
//! Checks, in order (after the forced provider-wide answer, if one is set): `POST`,
//! path `/3/device/<64–200 hex digits>`, `authorization: bearer <JWT>` (ES256, `kid`,
//! `iss`, signature, `iat` neither older than `max_jwt_age` nor in the future),
//! `apns-topic` (the configured topic, or `<topic>.voip` for VoIP), `apns-push-type`,
//! `apns-priority` (10, 5 or 1; 5 for background), `apns-collapse-id` (≤ 64 bytes),
//! `apns-expiration` (an integer), `apns-id` (a UUID), and the body (non-empty JSON,
//! ≤ 4096 bytes, 5120 for VoIP). A valid request answers 200 with `apns-id`.
//!
//! Device tokens whose hex starts with a marker get an error on demand (after
//! baobabus/go-apnsmock):
//!
//! | prefix | answer |
//! |---|---|
//! | `410a` | 410 `Unregistered` (with `timestamp`) |
//! | `410e` | 410 `ExpiredToken` |
//! | `400b` | 400 `BadDeviceToken` |
//! | `400d` | 400 `DeviceTokenNotForTopic` |
//! | `429c` | 429 `TooManyRequests` (`retry-after: 1`) for the first `too_many_attempts` sends of that token, then 200 |
//! | `5000` | 500 `InternalServerError` |
//! | `5030` | 503 `ServiceUnavailable` (`retry-after: 2`) |
//! | `5031` | 503 `Shutdown` |
//!
//! Provider-wide answers are switched on with [`ApnsControls::set_forced_reason`];
//! [`ApnsControls::expire_seen_jwts`] makes every JWT seen so far answer `403
//! ExpiredProviderToken`, as Apple does with a token it considers too old.

use super::h2server::{Handler, Knobs, MockServer};
use super::tls::TestCa;
use bytes::Bytes;
use http::{HeaderMap, Method, Response, StatusCode};
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// Apple's payload limits.
pub const MAX_PAYLOAD: usize = 4096;
pub const MAX_VOIP_PAYLOAD: usize = 5120;

/// What the mock accepts.
#[derive(Debug, Clone)]
pub struct MockApnsConfig {
    pub team_id: String,
    pub key_id: String,
    /// The provider key's public half, SPKI PEM (`-----BEGIN PUBLIC KEY-----`).
    pub public_key_pem: String,
    /// The bundle id (`apns-topic`).
    pub topic: String,
    /// Older JWTs answer `403 ExpiredProviderToken` (Apple: 60 minutes).
    pub max_jwt_age: Duration,
    /// Sends of one `429c…` token that answer 429 before it is accepted.
    pub too_many_attempts: u32,
    /// Keep counts only, not each accepted notification (bench volumes).
    pub count_only: bool,
    /// Where to listen (default 127.0.0.1, a free port).
    pub bind: Option<std::net::SocketAddr>,
}

impl MockApnsConfig {
    /// Apple's rules for `team_id`/`key_id`/`topic`, verifying with `public_key_pem`.
    pub fn new(team_id: &str, key_id: &str, public_key_pem: &str, topic: &str) -> Self {
        Self {
            team_id: team_id.into(),
            key_id: key_id.into(),
            public_key_pem: public_key_pem.into(),
            topic: topic.into(),
            max_jwt_age: Duration::from_secs(3600),
            too_many_attempts: 1,
            count_only: false,
            bind: None,
        }
    }
}

/// One accepted notification, as the mock read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SeenPush {
    pub token: String,
    pub topic: String,
    pub push_type: Option<String>,
    pub priority: Option<String>,
    pub expiration: Option<i64>,
    pub collapse_id: Option<String>,
    pub content_type: Option<String>,
    pub apns_id: String,
    pub body: Bytes,
}

/// One distinct JWT the mock was shown.
#[derive(Debug, Clone)]
pub struct SeenJwt {
    /// Its `iat` claim (0 when it had none).
    pub iat: u64,
    /// When the mock first saw it.
    pub first_seen: Instant,
}

/// Switches and counters, shared with the test.
#[derive(Debug, Default)]
pub struct ApnsControls {
    requests: AtomicU64,
    forced: Mutex<Option<(u16, String)>>,
    state: Mutex<State>,
}

#[derive(Debug, Default)]
struct State {
    delivered: Vec<SeenPush>,
    /// Every distinct JWT, in the order first seen.
    jwts: Vec<(String, SeenJwt)>,
    expired: HashSet<String>,
    attempts: HashMap<String, u32>,
    /// Answers by reason (`"ok"` for 200).
    answers: HashMap<String, u64>,
}

impl ApnsControls {
    /// Every request from now on answers `status` with `reason`; `None` restores
    /// normal answers.
    pub fn set_forced_reason(&self, forced: Option<(u16, &str)>) {
        *self.forced.lock() = forced.map(|(s, r)| (s, r.to_string()));
    }

    /// Every JWT seen so far answers `403 ExpiredProviderToken` from now on.
    pub fn expire_seen_jwts(&self) {
        let mut st = self.state.lock();
        let seen: Vec<String> = st.jwts.iter().map(|(j, _)| j.clone()).collect();
        st.expired.extend(seen);
    }

    /// Requests received.
    pub fn requests(&self) -> u64 {
        self.requests.load(Ordering::Relaxed)
    }

    /// The accepted notifications, in order.
    pub fn delivered(&self) -> Vec<SeenPush> {
        self.state.lock().delivered.clone()
    }

    /// Accepted notifications per device token (more than 1: a duplicate).
    pub fn delivered_tokens(&self) -> HashMap<String, u32> {
        let mut out = HashMap::new();
        for p in &self.state.lock().delivered {
            *out.entry(p.token.clone()).or_insert(0) += 1;
        }
        out
    }

    /// The distinct JWTs seen (iat and first sight), in order.
    pub fn jwts(&self) -> Vec<SeenJwt> {
        self.state
            .lock()
            .jwts
            .iter()
            .map(|(_, s)| s.clone())
            .collect()
    }

    /// Answers given with `reason` (`"ok"` for 200).
    pub fn answers(&self, reason: &str) -> u64 {
        self.state.lock().answers.get(reason).copied().unwrap_or(0)
    }
}

/// A running APNs mock; stops on [`ApnsMock::shutdown`] or drop.
pub struct ApnsMock {
    server: MockServer,
    controls: Arc<ApnsControls>,
}

impl ApnsMock {
    /// Listens on 127.0.0.1 with a certificate from `ca`. Must be called inside a tokio
    /// runtime.
    pub fn start(ca: &TestCa, config: MockApnsConfig) -> std::io::Result<ApnsMock> {
        let rules = ApnsRules::new(config)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        let controls = rules.controls();
        let bind = rules.config.bind.unwrap_or(([127, 0, 0, 1], 0).into());
        let server =
            MockServer::start_on(bind, ca, Arc::new(ApnsHandler(rules)), Knobs::default())?;
        Ok(ApnsMock { server, controls })
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        self.server.url()
    }

    pub fn addr(&self) -> std::net::SocketAddr {
        self.server.addr()
    }

    /// The APNs switches and counters.
    pub fn controls(&self) -> &Arc<ApnsControls> {
        &self.controls
    }

    /// The HTTP/2 server underneath (connections, streams, GOAWAY).
    pub fn server(&self) -> &MockServer {
        &self.server
    }

    pub fn shutdown(&self) {
        self.server.shutdown();
    }
}

struct ApnsHandler(ApnsRules);

impl Handler for ApnsHandler {
    fn handle(
        &self,
        req: http::Request<Bytes>,
    ) -> impl std::future::Future<Output = Response<Bytes>> + Send {
        std::future::ready(self.0.answer(&req))
    }
}

/// The checking half of the mock: one request in, Apple's answer out.
pub struct ApnsRules {
    config: MockApnsConfig,
    key: DecodingKey,
    controls: Arc<ApnsControls>,
}

/// An error answer: status and reason.
type Refusal = (StatusCode, &'static str);

impl ApnsRules {
    pub fn new(config: MockApnsConfig) -> Result<Self, String> {
        let key = DecodingKey::from_ec_pem(config.public_key_pem.as_bytes())
            .map_err(|e| format!("the mock's public key: {e}"))?;
        Ok(Self {
            config,
            key,
            controls: Arc::new(ApnsControls::default()),
        })
    }

    pub fn controls(&self) -> Arc<ApnsControls> {
        Arc::clone(&self.controls)
    }

    /// Apple's answer to `req`.
    pub fn answer(&self, req: &http::Request<Bytes>) -> Response<Bytes> {
        self.controls.requests.fetch_add(1, Ordering::Relaxed);
        let headers = req.headers();
        let apns_id = match header(headers, "apns-id") {
            Some(id) if is_uuid(id) => id.to_string(),
            Some(_) => return self.refuse(StatusCode::BAD_REQUEST, "BadMessageId", None),
            None => fresh_uuid(),
        };
        let forced = self.controls.forced.lock().clone();
        if let Some((status, reason)) = forced {
            let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
            return self.refuse(status, &reason, Some(&apns_id));
        }
        match self.check(req) {
            Ok(token) => self.marked_or_ok(req, token, apns_id),
            Err((status, reason)) => self.refuse(status, reason, Some(&apns_id)),
        }
    }

    /// Every check; the device token when the request is valid.
    fn check<'r>(&self, req: &'r http::Request<Bytes>) -> Result<&'r str, Refusal> {
        if req.method() != Method::POST {
            return Err((StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed"));
        }
        let token = req
            .uri()
            .path()
            .strip_prefix("/3/device/")
            .ok_or((StatusCode::NOT_FOUND, "BadPath"))?;
        if token.is_empty() {
            return Err((StatusCode::BAD_REQUEST, "MissingDeviceToken"));
        }
        if !(64..=200).contains(&token.len()) || !token.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err((StatusCode::BAD_REQUEST, "BadDeviceToken"));
        }
        let headers = req.headers();
        self.check_jwt(headers)?;
        let push_type = header(headers, "apns-push-type");
        let voip = push_type == Some("voip");
        self.check_topic(header(headers, "apns-topic"), voip)?;
        check_options(headers, push_type)?;
        let body = req.body();
        let limit = if voip { MAX_VOIP_PAYLOAD } else { MAX_PAYLOAD };
        if body.is_empty() {
            return Err((StatusCode::BAD_REQUEST, "PayloadEmpty"));
        }
        if body.len() > limit {
            return Err((StatusCode::PAYLOAD_TOO_LARGE, "PayloadTooLarge"));
        }
        if serde_json::from_slice::<serde_json::Value>(body).is_err() {
            // Apple documents no reason for this; the adapter must treat it as unknown.
            return Err((StatusCode::BAD_REQUEST, "BadPayload"));
        }
        Ok(token)
    }

    fn check_jwt(&self, headers: &HeaderMap) -> Result<(), Refusal> {
        const MISSING: Refusal = (StatusCode::FORBIDDEN, "MissingProviderToken");
        const INVALID: Refusal = (StatusCode::FORBIDDEN, "InvalidProviderToken");
        let auth = header(headers, "authorization").ok_or(MISSING)?;
        let jwt = auth.strip_prefix("bearer ").ok_or(MISSING)?;
        let head = jsonwebtoken::decode_header(jwt).map_err(|_| INVALID)?;
        if head.alg != Algorithm::ES256 || head.kid.as_deref() != Some(&*self.config.key_id) {
            return Err(INVALID);
        }
        // A JWT verified before (the same bytes) needs no second signature check.
        let known = {
            let st = self.controls.state.lock();
            st.jwts.iter().find(|(j, _)| j == jwt).map(|(_, s)| s.iat)
        };
        let iat = match known {
            Some(iat) => iat,
            None => self.verify_jwt(jwt)?,
        };
        self.check_jwt_age(jwt, iat)
    }

    /// The signature and claims of a JWT not seen before; its `iat`.
    fn verify_jwt(&self, jwt: &str) -> Result<u64, Refusal> {
        const INVALID: Refusal = (StatusCode::FORBIDDEN, "InvalidProviderToken");
        let mut v = Validation::new(Algorithm::ES256);
        v.required_spec_claims.clear();
        v.validate_exp = false;
        let data =
            jsonwebtoken::decode::<serde_json::Value>(jwt, &self.key, &v).map_err(|_| INVALID)?;
        if data.claims["iss"].as_str() != Some(&*self.config.team_id) {
            return Err(INVALID);
        }
        data.claims["iat"].as_u64().ok_or(INVALID)
    }

    fn check_jwt_age(&self, jwt: &str, iat: u64) -> Result<(), Refusal> {
        const INVALID: Refusal = (StatusCode::FORBIDDEN, "InvalidProviderToken");
        const EXPIRED: Refusal = (StatusCode::FORBIDDEN, "ExpiredProviderToken");
        {
            let mut st = self.controls.state.lock();
            if !st.jwts.iter().any(|(j, _)| j == jwt) {
                let first_seen = Instant::now();
                st.jwts.push((jwt.to_string(), SeenJwt { iat, first_seen }));
            }
            if st.expired.contains(jwt) {
                return Err(EXPIRED);
            }
        }
        let now = unix_now();
        if iat > now {
            return Err(INVALID);
        }
        if now - iat > self.config.max_jwt_age.as_secs() {
            return Err(EXPIRED);
        }
        Ok(())
    }

    fn check_topic(&self, topic: Option<&str>, voip: bool) -> Result<(), Refusal> {
        let topic = topic.ok_or((StatusCode::BAD_REQUEST, "MissingTopic"))?;
        let want = &self.config.topic;
        let ok = if voip {
            topic.strip_prefix(want.as_str()) == Some(".voip")
        } else {
            topic == want
        };
        match ok {
            true => Ok(()),
            false if topic.starts_with(want.as_str()) => {
                Err((StatusCode::BAD_REQUEST, "TopicDisallowed"))
            }
            false => Err((StatusCode::BAD_REQUEST, "BadTopic")),
        }
    }

    /// The answers on demand for marked tokens, else 200.
    fn marked_or_ok(
        &self,
        req: &http::Request<Bytes>,
        token: &str,
        apns_id: String,
    ) -> Response<Bytes> {
        let prefix = token.get(..4).unwrap_or("").to_ascii_lowercase();
        let refusal: Option<(StatusCode, &'static str, Option<&str>)> = match &*prefix {
            "410a" => Some((StatusCode::GONE, "Unregistered", None)),
            "410e" => Some((StatusCode::GONE, "ExpiredToken", None)),
            "400b" => Some((StatusCode::BAD_REQUEST, "BadDeviceToken", None)),
            "400d" => Some((StatusCode::BAD_REQUEST, "DeviceTokenNotForTopic", None)),
            "5000" => Some((
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalServerError",
                None,
            )),
            "5030" => Some((
                StatusCode::SERVICE_UNAVAILABLE,
                "ServiceUnavailable",
                Some("2"),
            )),
            "5031" => Some((StatusCode::SERVICE_UNAVAILABLE, "Shutdown", None)),
            "429c" => {
                let mut st = self.controls.state.lock();
                let n = st.attempts.entry(token.to_string()).or_insert(0);
                *n += 1;
                (*n <= self.config.too_many_attempts).then_some((
                    StatusCode::TOO_MANY_REQUESTS,
                    "TooManyRequests",
                    Some("1"),
                ))
            }
            _ => None,
        };
        if let Some((status, reason, retry_after)) = refusal {
            let mut resp = self.refuse(status, reason, Some(&apns_id));
            if let Some(secs) = retry_after {
                resp.headers_mut().insert(
                    http::header::RETRY_AFTER,
                    http::HeaderValue::from_static(secs),
                );
            }
            return resp;
        }
        let h = req.headers();
        let seen = SeenPush {
            token: token.to_string(),
            topic: header(h, "apns-topic").unwrap_or("").to_string(),
            push_type: header(h, "apns-push-type").map(str::to_string),
            priority: header(h, "apns-priority").map(str::to_string),
            expiration: header(h, "apns-expiration").and_then(|v| v.parse().ok()),
            collapse_id: header(h, "apns-collapse-id").map(str::to_string),
            content_type: header(h, "content-type").map(str::to_string),
            apns_id: apns_id.clone(),
            body: req.body().clone(),
        };
        let mut st = self.controls.state.lock();
        if !self.config.count_only {
            st.delivered.push(seen);
        }
        *st.answers.entry("ok".into()).or_insert(0) += 1;
        drop(st);
        let mut resp = Response::new(Bytes::new());
        if let Ok(v) = http::HeaderValue::try_from(apns_id) {
            resp.headers_mut().insert("apns-id", v);
        }
        resp
    }

    fn refuse(&self, status: StatusCode, reason: &str, apns_id: Option<&str>) -> Response<Bytes> {
        *self
            .controls
            .state
            .lock()
            .answers
            .entry(reason.to_string())
            .or_insert(0) += 1;
        let body = if status == StatusCode::GONE {
            let ms = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_millis());
            serde_json::json!({ "reason": reason, "timestamp": ms })
        } else {
            serde_json::json!({ "reason": reason })
        };
        let mut resp = Response::new(Bytes::from(body.to_string()));
        *resp.status_mut() = status;
        let headers = resp.headers_mut();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        if let Some(v) = apns_id.and_then(|id| http::HeaderValue::try_from(id).ok()) {
            headers.insert("apns-id", v);
        }
        resp
    }
}

/// The push type, priority, collapse id and expiration headers.
fn check_options(headers: &HeaderMap, push_type: Option<&str>) -> Result<(), Refusal> {
    const BAD: StatusCode = StatusCode::BAD_REQUEST;
    if let Some(t) = push_type {
        if crate::job::PushType::parse(t).is_none() {
            return Err((BAD, "InvalidPushType"));
        }
    }
    match (header(headers, "apns-priority"), push_type) {
        (Some("10" | "1"), Some("background")) => return Err((BAD, "BadPriority")),
        (None | Some("10" | "5" | "1"), _) => {}
        (Some(_), _) => return Err((BAD, "BadPriority")),
    }
    if header(headers, "apns-collapse-id").is_some_and(|c| c.len() > 64) {
        return Err((BAD, "BadCollapseId"));
    }
    if header(headers, "apns-expiration").is_some_and(|e| e.parse::<i64>().is_err()) {
        return Err((BAD, "BadExpirationDate"));
    }
    Ok(())
}

fn header<'h>(headers: &'h HeaderMap, name: &str) -> Option<&'h str> {
    headers.get(name).and_then(|v| v.to_str().ok())
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.bytes().all(|b| b.is_ascii_hexdigit()))
}

fn fresh_uuid() -> String {
    let hex = format!("{:032x}", fastrand::u128(..));
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
