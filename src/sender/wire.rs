//! What the three webhook transports share (reqwest's pool, [`super::http1`] and
//! [`super::h2c`]): the per-push headers, the TCP connect, and how a non-2xx answer and
//! its body become a [`SendOutcome`]. The pools import this file and [`super::http`]
//! imports the pools, so the modules do not import each other in a cycle.

use super::retry::parse_retry_after;
use super::Signal;
use super::{HaltScope, SendOutcome};
use reqwest::header::{HeaderValue, RETRY_AFTER};
use std::time::{Duration, SystemTime};

/// How much of an error response's body goes into the reason.
const SNIPPET_BYTES: usize = 200;
pub(super) const USER_AGENT: &str = concat!("pushpace/", env!("CARGO_PKG_VERSION"));

/// The header with the instant the scheduler released a push (unix µs): receivers can
/// tell queueing from pacing, and the test sink measures pacing on it, not on arrival.
pub const SENT_AT: &str = "x-pushpace-sent-at";

/// The per-push headers of a webhook request.
#[derive(Debug, Clone)]
pub(super) struct PushHeaders {
    /// `Idempotency-Key: <job_id>:<device index>`.
    pub key: HeaderValue,
    /// [`SENT_AT`].
    pub sent_at: HeaderValue,
}

impl PushHeaders {
    pub(super) fn insert_into(self, headers: &mut http::HeaderMap) {
        headers.insert("idempotency-key", self.key);
        headers.insert(SENT_AT, self.sent_at);
    }
}
/// The outcome of a non-2xx answer: 429 and 5xx are retried, 410 is a dead token, 401,
/// 403 and 404 halt every campaign on the webhook (its credentials or its URL are wrong:
/// every send would get the same), any other status is rejected.
fn classify_status(code: u16, retry_after: Option<Duration>, snippet: String) -> SendOutcome {
    let reason = if snippet.is_empty() {
        format!("HTTP {code}")
    } else {
        format!("HTTP {code}: {snippet}")
    };
    if code == 429 || (500..600).contains(&code) {
        SendOutcome::RetryProvider {
            after: retry_after,
            reason,
            signal: Some(match (retry_after, code) {
                (Some(_), _) => Signal::RetryAfter,
                (None, 429) => Signal::Throttled,
                (None, _) => Signal::Unavailable,
            }),
        }
    } else if code == 410 {
        // Gone: the webhook's way of saying the token is dead.
        SendOutcome::DeadToken { reason }
    } else if matches!(code, 401 | 403 | 404) {
        SendOutcome::Halt {
            scope: HaltScope::Provider,
            reason: format!("the webhook refused its credentials or path: {reason}"),
        }
    } else {
        SendOutcome::Rejected {
            status: Some(code),
            reason,
        }
    }
}
/// A TCP connection to the provider within `timeout`, with Nagle off (every send is a
/// small request waiting for its answer).
pub(super) async fn connect_tcp(
    address: &str,
    timeout: Duration,
) -> Result<tokio::net::TcpStream, String> {
    let tcp = tokio::time::timeout(timeout, tokio::net::TcpStream::connect(address))
        .await
        .map_err(|_| format!("connect timeout after {} ms", timeout.as_millis()))?
        .map_err(|e| e.to_string())?;
    let _ = tcp.set_nodelay(true);
    Ok(tcp)
}

/// The first [`SNIPPET_BYTES`] of an error body, collected chunk by chunk.
#[derive(Default)]
pub(super) struct Snippet {
    bytes: Vec<u8>,
    longer: bool,
}

impl Snippet {
    /// No more bytes are kept (but whether more came is noted).
    pub(super) fn is_full(&self) -> bool {
        self.longer || self.bytes.len() >= SNIPPET_BYTES
    }

    pub(super) fn push(&mut self, chunk: &[u8]) {
        let room = SNIPPET_BYTES.saturating_sub(self.bytes.len());
        self.bytes
            .extend_from_slice(&chunk[..chunk.len().min(room)]);
        self.longer |= chunk.len() > room;
    }

    /// The outcome of a non-2xx answer with this body, honouring its Retry-After.
    pub(super) fn outcome(&self, status: u16, headers: &http::HeaderMap) -> SendOutcome {
        let retry_after = headers
            .get(RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, SystemTime::now()));
        classify_status(status, retry_after, snippet_text(&self.bytes, self.longer))
    }
}

/// An error body's first bytes as printable text on one line; `…` when it went on.
fn snippet_text(bytes: &[u8], longer: bool) -> String {
    let text = String::from_utf8_lossy(bytes);
    let mut out: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect::<String>()
        .trim()
        .to_string();
    if longer {
        out.push('…');
    }
    out
}
