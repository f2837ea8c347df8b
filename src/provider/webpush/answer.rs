//! The Web Push answer classes (RFC 8030 section 5 and the push services' practice):
//! each status maps to one [`SendOutcome`] and a bounded reason code for metrics.
//!
//! 401, 403 and 413 are [`HaltScope::Majority`]: push services give them per
//! subscription (one made under an older VAPID key: FCM's web endpoint answers 403,
//! Mozilla 401 errno 109; any https host an end user registers), so the scheduler halts
//! a campaign only when most of its recent answers from one [`Origin`] carry them.

use crate::provider::ceiling::Signal;
use crate::sender::{parse_retry_after, HaltScope, SendOutcome};
use http::{HeaderMap, StatusCode};
use std::time::{Duration, SystemTime};

/// Longest part of an error body kept in a reason.
const SNIPPET_CHARS: usize = 200;

/// The outcome of a push service's answer and its reason code.
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    body: &[u8],
) -> (SendOutcome, &'static str) {
    let code = status.as_u16();
    if status.is_success() {
        return (SendOutcome::Delivered, "ok");
    }
    let reason = |what: &str| {
        let snippet = snippet(body);
        if snippet.is_empty() {
            format!("HTTP {code}: {what}")
        } else {
            format!("HTTP {code}: {what}: {snippet}")
        }
    };
    match code {
        404 | 410 => (
            SendOutcome::DeadToken {
                reason: reason("the subscription is gone"),
            },
            if code == 404 { "not_found" } else { "gone" },
        ),
        413 => (
            SendOutcome::Halt {
                scope: HaltScope::Majority,
                reason: reason("payload too large for the push service"),
            },
            "payload_too_large",
        ),
        429 => (
            SendOutcome::RetryProvider {
                after: retry_after(headers),
                reason: reason("rate limited by the push service"),
                signal: Some(Signal::Throttled),
            },
            "rate_limited",
        ),
        401 | 403 => (
            SendOutcome::Halt {
                scope: HaltScope::Majority,
                reason: reason(
                    "the push service refused the VAPID authorization for this subscription \
                     (made under another key, or our key, subject or token refused)",
                ),
            },
            "vapid",
        ),
        400 => (
            SendOutcome::Rejected {
                status: Some(code),
                reason: reason("the push service rejected the request"),
            },
            "bad_request",
        ),
        500..=599 => (
            SendOutcome::RetryProvider {
                after: retry_after(headers),
                reason: reason("push service error"),
                signal: Some(Signal::Unavailable),
            },
            "server_error",
        ),
        _ => (
            SendOutcome::Rejected {
                status: Some(code),
                reason: reason("unexpected answer"),
            },
            "other",
        ),
    }
}

fn retry_after(headers: &HeaderMap) -> Option<Duration> {
    headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()))
}

/// The first characters of an error body on one line, controls replaced.
fn snippet(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(body);
    let text = text.trim();
    let mut out: String = text
        .chars()
        .take(SNIPPET_CHARS)
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if text.chars().nth(SNIPPET_CHARS).is_some() {
        out.push('…');
    }
    out
}

/// Longest origin kept (a longer one is cut there: still one key).
const MAX_ORIGIN: usize = 128;

/// A subscription's push-service origin: the endpoint's `scheme://host[:port]`,
/// lowercased, `:443` of https left out. Read from the device text without parsing it
/// whole and without allocating: the scheduler asks for it on each answer of a campaign
/// that has had a 401/403/413.
pub struct Origin {
    buf: [u8; MAX_ORIGIN],
    len: usize,
}

impl Origin {
    /// The origin of a device string (`{"endpoint":"https://…",…}`), `None` when it
    /// names no `scheme://` endpoint. `\/` escapes are read as `/`.
    pub fn of(device: &str) -> Option<Origin> {
        let at = device.find("\"endpoint\"")? + "\"endpoint\"".len();
        let rest = device[at..].trim_start().strip_prefix(':')?.trim_start();
        let value = rest.strip_prefix('"')?.as_bytes();
        let mut o = Origin {
            buf: [0; MAX_ORIGIN],
            len: 0,
        };
        let (mut i, mut slashes, mut scheme_done) = (0, 0, false);
        while i < value.len() {
            let mut b = value[i];
            if b == b'\\' {
                i += 1;
                match value.get(i) {
                    Some(b'/') => b = b'/',
                    _ => break,
                }
            }
            if b == b'"' {
                break;
            }
            if scheme_done && matches!(b, b'/' | b'?' | b'#') {
                break;
            }
            if b == b'/' {
                slashes += 1;
                scheme_done = slashes == 2;
            }
            if o.len < MAX_ORIGIN {
                o.buf[o.len] = b.to_ascii_lowercase();
                o.len += 1;
            }
            i += 1;
        }
        if !scheme_done || !o.as_bytes().windows(3).any(|w| w == b"://") {
            return None;
        }
        if o.as_bytes().starts_with(b"https://") && o.as_bytes().ends_with(b":443") {
            o.len -= 4;
        }
        Some(o)
    }

    fn as_bytes(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The origin's text, for a halt's reason.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(self.as_bytes()).into_owned()
    }

    /// A 64-bit key (FNV-1a) the scheduler's windows are keyed by.
    pub fn key(&self) -> u64 {
        self.as_bytes().iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origin_is_scheme_host_and_port() {
        let text = |d: &str| Origin::of(d).map(|o| o.text());
        let d = r#"{"endpoint":"https://FCM.googleapis.com/fcm/send/abc","keys":{}}"#;
        assert_eq!(text(d).as_deref(), Some("https://fcm.googleapis.com"));
        let d = r#"{"endpoint": "https:\/\/push.example:8443\/x?y","keys":{}}"#;
        assert_eq!(text(d).as_deref(), Some("https://push.example:8443"));
        let a = Origin::of(r#"{"endpoint":"https://h:443/a"}"#).expect("origin");
        let b = Origin::of(r#"{"endpoint":"https://h/b"}"#).expect("origin");
        assert_eq!((a.text(), a.key()), (b.text(), b.key()));
        let c = Origin::of(r#"{"endpoint":"https://other/b"}"#).expect("origin");
        assert_ne!(a.key(), c.key());
        assert!(Origin::of(r#"{"endpoint":"nope"}"#).is_none());
        assert!(Origin::of("dev-1").is_none());
    }

    fn class(code: u16, headers: &HeaderMap, body: &str) -> (SendOutcome, &'static str) {
        classify(
            StatusCode::from_u16(code).expect("code"),
            headers,
            body.as_bytes(),
        )
    }

    #[test]
    fn maps_each_status() {
        let none = HeaderMap::new();
        assert_eq!(class(201, &none, "").0, SendOutcome::Delivered);
        assert_eq!(class(202, &none, "").0, SendOutcome::Delivered);
        assert!(matches!(
            class(404, &none, "").0,
            SendOutcome::DeadToken { .. }
        ));
        assert!(matches!(
            class(410, &none, "").0,
            SendOutcome::DeadToken { .. }
        ));
        // Per subscription as well: the scheduler judges them by origin.
        for code in [401, 403, 413] {
            assert!(matches!(
                class(code, &none, "").0,
                SendOutcome::Halt {
                    scope: HaltScope::Majority,
                    ..
                }
            ));
        }
        assert!(matches!(
            class(400, &none, "").0,
            SendOutcome::Rejected {
                status: Some(400),
                ..
            }
        ));
        assert!(matches!(
            class(503, &none, "").0,
            SendOutcome::RetryProvider { after: None, .. }
        ));
        assert!(matches!(
            class(302, &none, "").0,
            SendOutcome::Rejected {
                status: Some(302),
                ..
            }
        ));
    }

    #[test]
    fn honours_retry_after_and_keeps_a_short_body() {
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::RETRY_AFTER,
            http::HeaderValue::from_static("30"),
        );
        let (outcome, code) = class(429, &headers, "slow\ndown");
        assert_eq!(code, "rate_limited");
        let SendOutcome::RetryProvider { after, reason, .. } = outcome else {
            panic!("{outcome:?}");
        };
        assert_eq!(after, Some(Duration::from_secs(30)));
        assert!(reason.contains("slow down"), "{reason}");
        let (outcome, _) = class(400, &HeaderMap::new(), &"x".repeat(1000));
        let SendOutcome::Rejected { reason, .. } = outcome else {
            panic!("{outcome:?}");
        };
        assert!(reason.len() < 300 && reason.ends_with('…'), "{reason}");
    }
}
