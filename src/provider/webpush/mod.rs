//! Web Push (RFC 8030 delivery, RFC 8291 encryption, RFC 8292 VAPID).
//!
//! A Web Push device is a browser subscription: its endpoint is a URL on whichever
//! push service the browser uses (Google, Mozilla, Apple, Microsoft…), so unlike APNs
//! and FCM there is no single host. [`WebPushSender`] therefore sends through one
//! pooled `reqwest` client (rustls, HTTP/2 when the service offers it, connections
//! kept per host), encrypts each message for its subscription ([`ece`]) and signs one
//! VAPID token per push-service origin ([`vapid`]).
//!
//! Request headers:
//! - `TTL`: the job's `ttl_s`; else the seconds left until its `expiration` (0 when it
//!   has passed: deliver only to a browser online now); else [`DEFAULT_TTL_S`] (28
//!   days, the longest most push services keep a message).
//! - `Urgency`: from `priority` (high, normal, low; `very-low` is never sent), else from
//!   the campaign's class. Omitted without either: the service's default is `normal`.
//! - `Topic`: the job's `collapse_id` when it is at most 32 base64url characters (RFC
//!   8030 section 5.4); any other collapse id is left out rather than refused, because
//!   the message is still worth delivering without replacement.
//!
//! The answer classes are in [`answer`].

pub mod answer;
pub mod ece;
pub use crate::job::webpush_subscription as subscription;
pub mod vapid;

use answer::Origin;

use crate::job::{Job, PushOptions};
use crate::provider::ceiling::Signal;
use crate::provider::settings::WebPushSpec;
use crate::provider::{AnswerMetrics, ProviderError};
use crate::sender::{HaltScope, SendFuture, SendOutcome, Sender};
use http::header::{AUTHORIZATION, CONTENT_ENCODING, CONTENT_TYPE};
use http::{HeaderName, HeaderValue};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use vapid::VapidSigner;

/// `TTL` when the job gives neither `ttl_s` nor `expiration`: 28 days.
pub const DEFAULT_TTL_S: u32 = 28 * 24 * 3600;
/// Longest `Topic` (RFC 8030 section 5.4).
pub const MAX_TOPIC_CHARS: usize = 32;
/// An error body is read up to this many bytes, for the reason.
const MAX_ERROR_BODY: usize = 4096;
/// The origin `check` signs a sample token for (nothing is sent to it).
const SAMPLE_ORIGIN: &str = "https://push.example.invalid";

static TTL: HeaderName = HeaderName::from_static("ttl");
static URGENCY: HeaderName = HeaderName::from_static("urgency");
static TOPIC: HeaderName = HeaderName::from_static("topic");

/// The Web Push adapter.
#[derive(Clone)]
pub struct WebPushSender {
    inner: Arc<Inner>,
}

struct Inner {
    client: reqwest::Client,
    vapid: VapidSigner,
    metrics: AnswerMetrics,
}

impl std::fmt::Debug for WebPushSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WebPushSender")
            .field("vapid", &self.inner.vapid)
            .finish_non_exhaustive()
    }
}

impl WebPushSender {
    /// Loads the VAPID key and builds the client. Nothing is sent.
    pub fn new(spec: &WebPushSpec) -> Result<Self, ProviderError> {
        let vapid = signer(spec)?;
        let client = client(spec)?;
        let name: Arc<str> = Arc::from(spec.name.as_str());
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                vapid,
                metrics: AnswerMetrics::new(&name),
            }),
        })
    }

    /// The application server key browsers must subscribe with.
    pub fn public_key_b64(&self) -> &str {
        self.inner.vapid.public_key_b64()
    }
}

impl Sender for WebPushSender {
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        let inner = Arc::clone(&self.inner);
        let job = Arc::clone(job);
        SendFuture::boxed(async move {
            let (outcome, code) = inner.send_one(&job, device_index).await;
            inner.metrics.record(&outcome, code);
            outcome
        })
    }

    fn name(&self) -> &'static str {
        "webpush"
    }
}

impl Inner {
    async fn send_one(&self, job: &Job, device_index: usize) -> (SendOutcome, &'static str) {
        let Some(device) = job.devices.get(device_index) else {
            return rejected("device index out of range".into(), "bad_subscription");
        };
        let sub = match subscription::parse(device) {
            Ok(sub) => sub,
            Err(e) => return rejected(e, "bad_subscription"),
        };
        let body = match plaintext(&job.payload)
            .and_then(|text| ece::encrypt(&text, &sub.p256dh, &sub.auth).map_err(|e| e.to_string()))
        {
            Ok(body) => body,
            Err(reason) => {
                let scope = HaltScope::Campaign;
                return (SendOutcome::Halt { scope, reason }, "payload_too_large");
            }
        };
        let authorization = self
            .vapid
            .authorization(&sub.endpoint[..url::Position::BeforePath]);
        let mut request = self
            .client
            .post(sub.endpoint)
            .header(TTL.clone(), ttl(&job.options, unix_s()))
            .header(CONTENT_ENCODING, HeaderValue::from_static("aes128gcm"))
            .header(
                CONTENT_TYPE,
                HeaderValue::from_static("application/octet-stream"),
            )
            .header(AUTHORIZATION, authorization);
        if let Some(u) = urgency(job) {
            request = request.header(URGENCY.clone(), HeaderValue::from_static(u));
        }
        if let Some(t) = topic(job.options.collapse_id.as_deref()) {
            if let Ok(v) = HeaderValue::from_str(t) {
                request = request.header(TOPIC.clone(), v);
            }
        }
        match request.body(body).send().await {
            Ok(response) => read_answer(response).await,
            Err(e) => (transport_error(e), "transport"),
        }
    }
}

fn rejected(reason: String, code: &'static str) -> (SendOutcome, &'static str) {
    (
        SendOutcome::Rejected {
            status: None,
            reason,
        },
        code,
    )
}

async fn read_answer(mut response: reqwest::Response) -> (SendOutcome, &'static str) {
    let status = response.status();
    let mut body = Vec::new();
    // Read to the end so the stream finishes; keep only the start of an error body.
    while let Ok(Some(chunk)) = response.chunk().await {
        if !status.is_success() && body.len() < MAX_ERROR_BODY {
            let room = MAX_ERROR_BODY - body.len();
            body.extend_from_slice(&chunk[..chunk.len().min(room)]);
        }
    }
    answer::classify(status, response.headers(), &body)
}

fn transport_error(e: reqwest::Error) -> SendOutcome {
    use std::error::Error as _;
    // The endpoint URL is a capability: it stays out of the reason.
    let e = e.without_url();
    let mut reason = if e.is_timeout() {
        "timeout".to_string()
    } else if e.is_connect() {
        "connection error".to_string()
    } else {
        "request error".to_string()
    };
    let mut source = e.source();
    while let Some(cause) = source {
        reason.push_str(": ");
        reason.push_str(&cause.to_string());
        source = cause.source();
    }
    let signal = if e.is_timeout() {
        Signal::Timeout
    } else {
        Signal::Connection
    };
    SendOutcome::RetryProvider {
        after: None,
        reason,
        signal: Some(signal),
    }
}

/// The message a job's payload stands for: a JSON string's contents, or else the JSON
/// text itself.
pub fn plaintext(payload: &RawValue) -> Result<Cow<'_, [u8]>, String> {
    let text = payload.get();
    if !text.starts_with('"') {
        return Ok(Cow::Borrowed(text.as_bytes()));
    }
    if let Ok(s) = serde_json::from_str::<&str>(text) {
        return Ok(Cow::Borrowed(s.as_bytes()));
    }
    serde_json::from_str::<String>(text)
        .map(|s| Cow::Owned(s.into_bytes()))
        .map_err(|_| "payload is not a valid JSON string".to_string())
}

/// Checks that a payload fits one Web Push message (job validation).
pub fn check_payload(payload: &RawValue) -> Result<(), String> {
    let text = plaintext(payload)?;
    if text.len() > ece::MAX_PLAINTEXT {
        return Err(format!(
            "the Web Push message is {} bytes; at most {} fit in one encrypted push",
            text.len(),
            ece::MAX_PLAINTEXT
        ));
    }
    Ok(())
}

/// The `TTL` header value (see the module docs).
pub fn ttl(options: &PushOptions, now_s: i64) -> u32 {
    if let Some(ttl) = options.ttl_s {
        return ttl;
    }
    match options.expiration {
        Some(at) => u32::try_from(at.saturating_sub(now_s).max(0)).unwrap_or(u32::MAX),
        None => DEFAULT_TTL_S,
    }
}

/// The `Urgency` header value: the job's push priority (its own, else its class's).
pub fn urgency(job: &Job) -> Option<&'static str> {
    job.push_priority().map(|p| p.as_str())
}

/// The `Topic` for a collapse id, when it is a valid one.
pub fn topic(collapse_id: Option<&str>) -> Option<&str> {
    collapse_id.filter(|t| {
        !t.is_empty()
            && t.len() <= MAX_TOPIC_CHARS
            && t.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
    })
}

/// The push-service origin of a subscription (scheme, host and port of its endpoint),
/// as a key: the scheduler gives each origin its own lane and adaptive ceiling, so a slow
/// or unreachable push service is paced alone. One parser, [`Origin::of`], serves this,
/// the label and the refusal windows: allocation-free, hosts compared without case, port
/// 443 of https the default. `None` when the device has no endpoint.
pub fn origin_key(device: &str) -> Option<u64> {
    // Odd: an even key is kept for the scheduler's overflow lane.
    Origin::of(device).map(|o| o.key() | 1)
}

/// The origin as text (`https://host[:port]`), for the API and metrics: a push
/// service's name, never the endpoint's path (a capability URL). Allocates: called
/// once per new origin lane.
pub fn origin_label(device: &str) -> Option<String> {
    Origin::of(device).map(|o| o.text())
}

fn unix_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

fn signer(spec: &WebPushSpec) -> Result<VapidSigner, ProviderError> {
    VapidSigner::new(
        &spec.vapid_key_pem,
        &spec.vapid_subject,
        spec.vapid_lifetime,
    )
    .map_err(|e| match e {
        vapid::VapidError::Key => ProviderError::Key {
            provider: spec.name.clone(),
            what: "vapid_key",
            problem: e.to_string(),
        },
        _ => ProviderError::Config {
            provider: spec.name.clone(),
            problem: e.to_string(),
        },
    })
}

fn client(spec: &WebPushSpec) -> Result<reqwest::Client, ProviderError> {
    let tls = |problem: String| ProviderError::Tls {
        provider: spec.name.clone(),
        problem,
    };
    let mut builder = reqwest::Client::builder()
        .use_rustls_tls()
        .timeout(spec.common.timeout)
        .connect_timeout(spec.common.timeout.min(Duration::from_secs(10)))
        // Push services do not redirect; following one would leak the VAPID token.
        .redirect(reqwest::redirect::Policy::none())
        .no_proxy()
        .tcp_nodelay(true)
        .pool_idle_timeout(Duration::from_secs(90))
        .user_agent(concat!("pushpace/", env!("CARGO_PKG_VERSION")));
    if let Some(pem) = &spec.common.ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem)
            .map_err(|e| tls(format!("ca_file is not PEM certificates: {e}")))?;
        if certs.is_empty() {
            return Err(tls("ca_file holds no certificate".into()));
        }
        for cert in certs {
            builder = builder.add_root_certificate(cert);
        }
    }
    builder.build().map_err(|e| tls(e.to_string()))
}

/// `pushpace providers check`: loads the key and the CA, signs a VAPID token for a
/// sample origin and verifies it as a push service would. Sends nothing.
pub async fn check(spec: &WebPushSpec) -> Result<String, ProviderError> {
    let signer = signer(spec)?;
    client(spec)?;
    let config = |problem: String| ProviderError::Config {
        provider: spec.name.clone(),
        problem,
    };
    let header = signer.authorization(SAMPLE_ORIGIN);
    let text = header
        .to_str()
        .map_err(|_| config("the VAPID header is not ASCII".into()))?;
    let verified =
        vapid::verify(text).map_err(|e| config(format!("a signed VAPID token fails: {e}")))?;
    let claims = &verified.claims;
    if claims.aud != SAMPLE_ORIGIN
        || claims.sub.as_deref() != Some(spec.vapid_subject.as_str())
        || verified.public_key != signer.public_key_b64()
    {
        return Err(config("a signed VAPID token does not round-trip".into()));
    }
    let left = claims.exp.saturating_sub(vapid::unix_ms() / 1000);
    Ok(format!(
        "VAPID key loads (applicationServerKey {}); tokens verify, sub {}, valid {} s",
        signer.public_key_b64(),
        spec.vapid_subject,
        left
    ))
}

#[cfg(test)]
mod tests;
