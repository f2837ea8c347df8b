//! FCM HTTP v1 answers mapped to [`SendOutcome`] classes (docs/PROVIDERS.md).
//!
//! An error body is `{"error":{"code","status","message","details":[...]}}`; the
//! specific code is the `errorCode` of the `details` entry whose `@type` is
//! `type.googleapis.com/google.firebase.fcm.v1.FcmError` (the top-level `status` can be
//! a generic one such as NOT_FOUND). Without it the top-level `status`, then the HTTP
//! status, decide.
//!
//! `INVALID_ARGUMENT` is a dead token only when it is about the token: a field violation
//! on `message.token`, or (no field violations at all) a message that speaks of the
//! registration token. Otherwise the message itself is invalid, which every device of
//! the campaign would get: `Halt{Campaign}`.
//!
//! `THIRD_PARTY_AUTH_ERROR` (the APNs certificate or Web Push key behind the token was
//! refused) can be about one app of the project only, so it is `Halt{Majority}`: the
//! campaign halts when most of its recent answers carry it, else the device is rejected.

use crate::provider::ceiling::Signal;
use crate::sender::{parse_retry_after, HaltScope, SendOutcome};
use http::{HeaderMap, StatusCode};
use serde::Deserialize;
use std::time::{Duration, SystemTime};

/// The `@type` of FCM's own error detail.
pub const FCM_ERROR_TYPE: &str = "type.googleapis.com/google.firebase.fcm.v1.FcmError";
/// The `@type` of field violations.
pub const BAD_REQUEST_TYPE: &str = "type.googleapis.com/google.rpc.BadRequest";
/// Google asks for at least a minute before retrying after QUOTA_EXCEEDED.
pub const QUOTA_MIN_WAIT: Duration = Duration::from_secs(60);
/// Longest provider message kept in a reason.
const MAX_MESSAGE_CHARS: usize = 200;

/// What one answer means to the sender.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Final: record and return it, with its reason code for metrics.
    Done(SendOutcome, &'static str),
    /// 401 on our own access token: refresh it once and resend (the reason is kept for
    /// the halt when the resend gets 401 too).
    Unauthenticated(String),
}

#[derive(Deserialize, Default)]
struct Envelope {
    #[serde(default)]
    error: Option<ErrorBody>,
}

#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    details: Vec<Detail>,
}

#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase")]
struct Detail {
    #[serde(rename = "@type", default)]
    type_url: Option<String>,
    #[serde(default)]
    error_code: Option<String>,
    #[serde(default)]
    field_violations: Vec<FieldViolation>,
}

#[derive(Deserialize, Default)]
struct FieldViolation {
    #[serde(default)]
    field: Option<String>,
}

/// The codes we know, as `&'static str` for the metrics' bounded label set.
const KNOWN: [&str; 10] = [
    "UNREGISTERED",
    "INVALID_ARGUMENT",
    "SENDER_ID_MISMATCH",
    "QUOTA_EXCEEDED",
    "UNAVAILABLE",
    "INTERNAL",
    "THIRD_PARTY_AUTH_ERROR",
    "UNAUTHENTICATED",
    "PERMISSION_DENIED",
    "NOT_FOUND",
];

/// Maps one answer of `messages:send`.
pub fn classify(status: StatusCode, headers: &HeaderMap, body: &[u8]) -> Verdict {
    if status.is_success() {
        return Verdict::Done(SendOutcome::Delivered, "ok");
    }
    // A body that is not Google's error JSON (a proxy's page) leaves the HTTP status.
    let error = serde_json::from_slice::<Envelope>(body)
        .ok()
        .and_then(|e| e.error)
        .unwrap_or_default();
    let code = error
        .details
        .iter()
        .find(|d| d.type_url.as_deref() == Some(FCM_ERROR_TYPE))
        .and_then(|d| d.error_code.as_deref())
        .or(error.status.as_deref())
        .unwrap_or("");
    let known: &'static str = KNOWN
        .iter()
        .find(|k| **k == code)
        .copied()
        .unwrap_or("other");
    let reason = reason_text(status, code, error.message.as_deref(), body);
    let retry_after = headers
        .get(http::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| parse_retry_after(v, SystemTime::now()));
    let outcome = match known {
        "UNREGISTERED" => SendOutcome::DeadToken { reason },
        "INVALID_ARGUMENT" if about_token(&error) => SendOutcome::DeadToken { reason },
        "INVALID_ARGUMENT" => halt(HaltScope::Campaign, reason),
        "SENDER_ID_MISMATCH" => SendOutcome::Mismatch {
            dead_token: false,
            reason,
        },
        "QUOTA_EXCEEDED" => quota(retry_after, reason),
        "UNAVAILABLE" | "INTERNAL" => SendOutcome::RetryProvider {
            after: retry_after,
            reason,
            signal: Some(paused_or(retry_after, Signal::Unavailable)),
        },
        "THIRD_PARTY_AUTH_ERROR" => halt(HaltScope::Majority, reason),
        "PERMISSION_DENIED" => halt(HaltScope::Provider, reason),
        "UNAUTHENTICATED" => return Verdict::Unauthenticated(reason),
        _ => match status.as_u16() {
            401 => return Verdict::Unauthenticated(reason),
            403 => halt(HaltScope::Provider, reason),
            429 => quota(retry_after, reason),
            500..=599 => SendOutcome::RetryProvider {
                after: retry_after,
                reason,
                signal: Some(paused_or(retry_after, Signal::Unavailable)),
            },
            s => SendOutcome::Rejected {
                status: Some(s),
                reason,
            },
        },
    };
    Verdict::Done(outcome, known)
}

fn halt(scope: HaltScope, reason: String) -> SendOutcome {
    SendOutcome::Halt { scope, reason }
}

/// 429: `retry-after`, but never sooner than Google's minute.
fn quota(retry_after: Option<Duration>, reason: String) -> SendOutcome {
    SendOutcome::RetryProvider {
        after: Some(retry_after.map_or(QUOTA_MIN_WAIT, |d| d.max(QUOTA_MIN_WAIT))),
        reason,
        // Only Google's own Retry-After pauses the lane: the minute's minimum is for
        // the device's retry, while the ceiling slows the rest down.
        signal: Some(paused_or(retry_after, Signal::Throttled)),
    }
}

/// [`Signal::RetryAfter`] when the answer carried a Retry-After, else `otherwise`.
fn paused_or(retry_after: Option<Duration>, otherwise: Signal) -> Signal {
    if retry_after.is_some() {
        Signal::RetryAfter
    } else {
        otherwise
    }
}

/// Whether an INVALID_ARGUMENT is about the registration token.
fn about_token(error: &ErrorBody) -> bool {
    let mut violations = error
        .details
        .iter()
        .filter(|d| d.type_url.as_deref() == Some(BAD_REQUEST_TYPE) || d.type_url.is_none())
        .flat_map(|d| d.field_violations.iter())
        .peekable();
    if violations.peek().is_none() {
        let message = error.message.as_deref().unwrap_or("").to_ascii_lowercase();
        return message.contains("registration token");
    }
    violations.any(|v| v.field.as_deref() == Some("message.token"))
}

/// "FCM 404 UNREGISTERED: <message, clipped>".
fn reason_text(status: StatusCode, code: &str, message: Option<&str>, body: &[u8]) -> String {
    let text = match message {
        Some(m) => clip(m),
        None => clip(String::from_utf8_lossy(body).trim()),
    };
    let code = if code.is_empty() {
        status.canonical_reason().unwrap_or("")
    } else {
        code
    };
    format!("FCM {} {code}: {text}", status.as_u16())
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn body(status: &str, code: Option<&str>, message: &str, field: Option<&str>) -> Vec<u8> {
        let mut details = Vec::new();
        if let Some(c) = code {
            details.push(serde_json::json!({"@type": FCM_ERROR_TYPE, "errorCode": c}));
        }
        if let Some(f) = field {
            details.push(serde_json::json!({"@type": BAD_REQUEST_TYPE,
                "fieldViolations": [{"field": f, "description": "bad"}]}));
        }
        serde_json::json!({"error": {"code": 400, "status": status, "message": message,
            "details": details}})
        .to_string()
        .into_bytes()
    }

    fn done(v: Verdict) -> (SendOutcome, &'static str) {
        match v {
            Verdict::Done(o, r) => (o, r),
            other => panic!("expected Done, got {other:?}"),
        }
    }

    fn st(code: u16) -> StatusCode {
        StatusCode::from_u16(code).expect("status")
    }

    #[test]
    fn delivered_and_dead_tokens() {
        let h = HeaderMap::new();
        assert_eq!(
            done(classify(st(200), &h, b"{\"name\":\"x\"}")).0,
            SendOutcome::Delivered
        );
        let b = body(
            "NOT_FOUND",
            Some("UNREGISTERED"),
            "Requested entity was not found.",
            None,
        );
        let (o, r) = done(classify(st(404), &h, &b));
        assert_eq!(r, "UNREGISTERED");
        assert_eq!(
            o,
            SendOutcome::DeadToken {
                reason: "FCM 404 UNREGISTERED: Requested entity was not found.".into()
            }
        );
        let b = body(
            "INVALID_ARGUMENT",
            Some("INVALID_ARGUMENT"),
            "bad",
            Some("message.token"),
        );
        assert!(matches!(
            done(classify(st(400), &h, &b)).0,
            SendOutcome::DeadToken { .. }
        ));
        // No field violations, but the message names the token (FCM's usual wording).
        let b = body(
            "INVALID_ARGUMENT",
            Some("INVALID_ARGUMENT"),
            "The registration token is not a valid FCM registration token",
            None,
        );
        assert!(matches!(
            done(classify(st(400), &h, &b)).0,
            SendOutcome::DeadToken { .. }
        ));
    }

    #[test]
    fn invalid_message_halts_the_campaign() {
        let h = HeaderMap::new();
        let b = body(
            "INVALID_ARGUMENT",
            Some("INVALID_ARGUMENT"),
            "Invalid value at 'message.data[0].value'",
            Some("message.data[0].value"),
        );
        let (o, r) = done(classify(st(400), &h, &b));
        assert_eq!(r, "INVALID_ARGUMENT");
        assert!(matches!(
            o,
            SendOutcome::Halt {
                scope: HaltScope::Campaign,
                ..
            }
        ));
    }

    #[test]
    fn mismatch_quota_and_server_errors() {
        let mut h = HeaderMap::new();
        let b = body("PERMISSION_DENIED", Some("SENDER_ID_MISMATCH"), "m", None);
        assert!(matches!(
            done(classify(st(403), &h, &b)).0,
            SendOutcome::Mismatch {
                dead_token: false,
                ..
            }
        ));
        let b = body("RESOURCE_EXHAUSTED", Some("QUOTA_EXCEEDED"), "q", None);
        let (o, _) = done(classify(st(429), &h, &b));
        assert!(
            matches!(o, SendOutcome::RetryProvider { after: Some(a), .. } if a == QUOTA_MIN_WAIT)
        );
        h.insert(http::header::RETRY_AFTER, "90".parse().expect("hv"));
        let (o, _) = done(classify(st(429), &h, &b));
        assert!(
            matches!(o, SendOutcome::RetryProvider { after: Some(a), .. } if a == Duration::from_secs(90))
        );
        let b = body("UNAVAILABLE", Some("UNAVAILABLE"), "u", None);
        let (o, r) = done(classify(st(503), &h, &b));
        assert_eq!(r, "UNAVAILABLE");
        assert!(
            matches!(o, SendOutcome::RetryProvider { after: Some(a), .. } if a == Duration::from_secs(90))
        );
        // A 502 from a proxy, not JSON.
        let (o, r) = done(classify(
            st(502),
            &HeaderMap::new(),
            b"<html>bad gateway</html>",
        ));
        assert_eq!(r, "other");
        assert!(matches!(o, SendOutcome::RetryProvider { after: None, .. }));
    }

    #[test]
    fn auth_errors() {
        let h = HeaderMap::new();
        let b = body(
            "UNAUTHENTICATED",
            Some("THIRD_PARTY_AUTH_ERROR"),
            "apns cert",
            None,
        );
        assert!(matches!(
            done(classify(st(401), &h, &b)).0,
            SendOutcome::Halt {
                scope: HaltScope::Majority,
                ..
            }
        ));
        let b = body(
            "UNAUTHENTICATED",
            None,
            "Request had invalid authentication",
            None,
        );
        assert!(
            matches!(classify(st(401), &h, &b), Verdict::Unauthenticated(r) if r.starts_with("FCM 401 UNAUTHENTICATED"))
        );
        let b = body("PERMISSION_DENIED", None, "denied", None);
        assert!(matches!(
            done(classify(st(403), &h, &b)).0,
            SendOutcome::Halt {
                scope: HaltScope::Provider,
                ..
            }
        ));
    }

    #[test]
    fn other_client_errors_are_rejected_with_a_clipped_reason() {
        let long = "x".repeat(1000);
        let b = body("FAILED_PRECONDITION", None, &long, None);
        let (o, r) = done(classify(st(412), &HeaderMap::new(), &b));
        assert_eq!(r, "other");
        match o {
            SendOutcome::Rejected { status, reason } => {
                assert_eq!(status, Some(412));
                assert!(reason.starts_with("FCM 412 FAILED_PRECONDITION: xxx"));
                assert!(reason.chars().count() < 260, "{}", reason.len());
            }
            other => panic!("{other:?}"),
        }
    }
}
