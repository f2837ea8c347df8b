//! The Web Push answer classes (RFC 8030 section 5 and the push services' practice):
//! each status maps to one [`SendOutcome`] and a bounded reason code for metrics.

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
                scope: HaltScope::Campaign,
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
                scope: HaltScope::Provider,
                reason: reason(
                    "the push service refused our VAPID authorization (key, subject or token)",
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

#[cfg(test)]
mod tests {
    use super::*;

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
        assert!(matches!(
            class(413, &none, "").0,
            SendOutcome::Halt {
                scope: HaltScope::Campaign,
                ..
            }
        ));
        for code in [401, 403] {
            assert!(matches!(
                class(code, &none, "").0,
                SendOutcome::Halt {
                    scope: HaltScope::Provider,
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
