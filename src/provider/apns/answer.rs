//! Maps an APNs answer (status, `{"reason": "...", "timestamp": ms}`, `retry-after`) to
//! a [`SendOutcome`] class, after Apple's table of reasons (docs/PROVIDERS.md).
//!
//! The reason decides; the status only when the reason is unknown. Errors in the
//! campaign's own request (push type, priority, payload…) halt the campaign; errors in
//! the provider's setup (key, topic, certificate) halt every campaign on the provider,
//! so that a bad configuration does not burn through a campaign's devices.

use crate::provider::ceiling::Signal;
use crate::sender::{parse_retry_after, HaltScope, SendOutcome};
use bytes::Bytes;
use http::{HeaderMap, StatusCode};
use std::time::SystemTime;

/// The reason code that makes the adapter re-sign its token and resend once.
pub const EXPIRED_PROVIDER_TOKEN: &str = "ExpiredProviderToken";

/// The longest provider reason echoed into an outcome.
const MAX_REASON_CHARS: usize = 64;

/// What to do with one reason.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    Dead,
    Mismatch,
    RetryDevice,
    RetryProvider,
    HaltProvider,
    HaltCampaign,
    Rejected,
}

/// Apple's reasons, each with its class. The `&'static str` is also the metric label.
const REASONS: &[(&str, Class)] = &[
    ("Unregistered", Class::Dead),
    ("ExpiredToken", Class::Dead),
    // Wrong app (topic) or environment for this token: not dead, it may work through
    // another provider. Rejected for this campaign, a letter that can be replayed.
    ("DeviceTokenNotForTopic", Class::Rejected),
    ("BadDeviceToken", Class::Mismatch),
    ("TooManyRequests", Class::RetryDevice),
    ("InternalServerError", Class::RetryProvider),
    ("ServiceUnavailable", Class::RetryProvider),
    ("Shutdown", Class::RetryProvider),
    ("IdleTimeout", Class::RetryProvider),
    // Halts only when the one re-sign did not help: the adapter handles the first.
    (EXPIRED_PROVIDER_TOKEN, Class::HaltProvider),
    ("InvalidProviderToken", Class::HaltProvider),
    ("MissingProviderToken", Class::HaltProvider),
    ("BadCertificate", Class::HaltProvider),
    ("BadCertificateEnvironment", Class::HaltProvider),
    ("Forbidden", Class::HaltProvider),
    ("BadTopic", Class::HaltProvider),
    ("MissingTopic", Class::HaltProvider),
    ("TopicDisallowed", Class::HaltProvider),
    ("TooManyProviderTokenUpdates", Class::HaltProvider),
    ("UnrelatedKeyIdInToken", Class::HaltProvider),
    ("BadEnvironmentKeyInToken", Class::HaltProvider),
    // Our request builder or endpoint is wrong: every send would get it.
    ("BadPath", Class::HaltProvider),
    ("MethodNotAllowed", Class::HaltProvider),
    ("DuplicateHeaders", Class::HaltProvider),
    ("BadMessageId", Class::HaltProvider),
    ("InvalidPushType", Class::HaltCampaign),
    ("BadPriority", Class::HaltCampaign),
    ("BadExpirationDate", Class::HaltCampaign),
    ("BadCollapseId", Class::HaltCampaign),
    ("PayloadEmpty", Class::HaltCampaign),
    ("PayloadTooLarge", Class::HaltCampaign),
    ("MissingDeviceToken", Class::Rejected),
];

/// The outcome of one answer and its reason code for [`crate::provider::AnswerMetrics`]
/// (`"ok"` for 200, `"other"` for a reason not in Apple's list).
pub fn classify(
    status: StatusCode,
    headers: &HeaderMap,
    body: &Bytes,
    now: SystemTime,
) -> (SendOutcome, &'static str) {
    if status.is_success() {
        return (SendOutcome::Delivered, "ok");
    }
    let said = reason_of(body);
    let known = said
        .as_deref()
        .and_then(|r| REASONS.iter().find(|(name, _)| *name == r));
    let code = known.map_or("other", |(name, _)| *name);
    let reason = describe(status, said.as_deref());
    let after = || {
        headers
            .get(http::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| parse_retry_after(v, now))
    };
    let class = match known {
        Some((_, class)) => *class,
        None if status.is_server_error() => Class::RetryProvider,
        None if status == StatusCode::TOO_MANY_REQUESTS => Class::RetryProvider,
        None => Class::Rejected,
    };
    let outcome = match class {
        Class::Dead => SendOutcome::DeadToken { reason },
        // A minority of them is settled as rejected, never as a dead token: the token
        // may belong to the other environment, which another provider serves.
        Class::Mismatch => SendOutcome::Mismatch {
            dead_token: false,
            reason,
        },
        Class::RetryDevice => SendOutcome::RetryDevice {
            after: after(),
            reason,
        },
        Class::RetryProvider => {
            let after = after();
            let signal = match after {
                Some(_) => Signal::RetryAfter,
                None if status == StatusCode::TOO_MANY_REQUESTS => Signal::Throttled,
                None => Signal::Unavailable,
            };
            SendOutcome::RetryProvider {
                after,
                reason,
                signal: Some(signal),
            }
        }
        Class::HaltProvider => SendOutcome::Halt {
            scope: HaltScope::Provider,
            reason,
        },
        Class::HaltCampaign => SendOutcome::Halt {
            scope: HaltScope::Campaign,
            reason,
        },
        Class::Rejected => SendOutcome::Rejected {
            status: Some(status.as_u16()),
            reason,
        },
    };
    (outcome, code)
}

/// The `reason` of an error body, if it has one.
fn reason_of(body: &Bytes) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct ErrorBody {
        reason: Option<String>,
    }
    serde_json::from_slice::<ErrorBody>(body).ok()?.reason
}

/// "APNs 410 Unregistered": the provider's reason clipped and stripped of control
/// characters, since it is stored with the device.
fn describe(status: StatusCode, reason: Option<&str>) -> String {
    match reason {
        Some(r) if !r.is_empty() => {
            let clean: String = r
                .chars()
                .filter(|c| !c.is_control())
                .take(MAX_REASON_CHARS)
                .collect();
            format!("APNs {} {clean}", status.as_u16())
        }
        _ => format!("APNs {} (no reason given)", status.as_u16()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn answer(status: u16, reason: &str) -> (SendOutcome, &'static str) {
        answer_with(status, reason, HeaderMap::new())
    }

    fn answer_with(status: u16, reason: &str, headers: HeaderMap) -> (SendOutcome, &'static str) {
        let body = Bytes::from(format!(
            r#"{{"reason":"{reason}","timestamp":1700000000000}}"#
        ));
        let status = StatusCode::from_u16(status).expect("status");
        classify(status, &headers, &body, SystemTime::now())
    }

    fn halt(scope: HaltScope, reason: &str) -> SendOutcome {
        SendOutcome::Halt {
            scope,
            reason: reason.into(),
        }
    }

    #[test]
    fn delivered() {
        let (o, code) = classify(
            StatusCode::OK,
            &HeaderMap::new(),
            &Bytes::new(),
            SystemTime::now(),
        );
        assert_eq!((o, code), (SendOutcome::Delivered, "ok"));
    }

    #[test]
    fn dead_tokens_and_mismatch() {
        for (status, reason) in [(410, "Unregistered"), (410, "ExpiredToken")] {
            let (o, code) = answer(status, reason);
            assert_eq!(
                o,
                SendOutcome::DeadToken {
                    reason: format!("APNs {status} {reason}")
                }
            );
            assert_eq!(code, reason);
        }
        let (o, code) = answer(400, "DeviceTokenNotForTopic");
        assert_eq!(
            o,
            SendOutcome::Rejected {
                status: Some(400),
                reason: "APNs 400 DeviceTokenNotForTopic".into()
            },
            "another app's token is not dead"
        );
        assert_eq!(code, "DeviceTokenNotForTopic");
        let (o, code) = answer(400, "BadDeviceToken");
        assert_eq!(
            o,
            SendOutcome::Mismatch {
                dead_token: false,
                reason: "APNs 400 BadDeviceToken".into()
            }
        );
        assert_eq!(code, "BadDeviceToken");
    }

    #[test]
    fn retries_honour_retry_after() {
        let mut h = HeaderMap::new();
        h.insert(http::header::RETRY_AFTER, "7".parse().expect("value"));
        let (o, code) = answer_with(429, "TooManyRequests", h.clone());
        assert_eq!(
            o,
            SendOutcome::RetryDevice {
                after: Some(Duration::from_secs(7)),
                reason: "APNs 429 TooManyRequests".into()
            }
        );
        assert_eq!(code, "TooManyRequests");
        for (status, reason) in [
            (500, "InternalServerError"),
            (503, "ServiceUnavailable"),
            (503, "Shutdown"),
        ] {
            let (o, code) = answer_with(status, reason, h.clone());
            assert_eq!(
                o,
                SendOutcome::RetryProvider {
                    after: Some(Duration::from_secs(7)),
                    reason: format!("APNs {status} {reason}"),
                    signal: Some(Signal::RetryAfter),
                }
            );
            assert_eq!(code, reason);
        }
        let (o, code) = answer(502, "SomethingNew");
        assert!(
            matches!(o, SendOutcome::RetryProvider { after: None, .. }),
            "{o:?}"
        );
        assert_eq!(code, "other");
    }

    #[test]
    fn provider_configuration_halts_the_provider() {
        for (status, reason) in [
            (403, "ExpiredProviderToken"),
            (403, "InvalidProviderToken"),
            (403, "MissingProviderToken"),
            (403, "BadCertificate"),
            (403, "BadCertificateEnvironment"),
            (403, "Forbidden"),
            (400, "BadTopic"),
            (400, "MissingTopic"),
            (400, "TopicDisallowed"),
            (429, "TooManyProviderTokenUpdates"),
        ] {
            let (o, code) = answer(status, reason);
            let want = format!("APNs {status} {reason}");
            assert_eq!(o, halt(HaltScope::Provider, &want));
            assert_eq!(code, reason);
        }
    }

    #[test]
    fn campaign_request_errors_halt_the_campaign() {
        for (status, reason) in [
            (400, "InvalidPushType"),
            (400, "BadPriority"),
            (400, "BadExpirationDate"),
            (400, "BadCollapseId"),
            (400, "PayloadEmpty"),
            (413, "PayloadTooLarge"),
        ] {
            let (o, code) = answer(status, reason);
            let want = format!("APNs {status} {reason}");
            assert_eq!(o, halt(HaltScope::Campaign, &want));
            assert_eq!(code, reason);
        }
    }

    #[test]
    fn unknown_reasons_and_bodies() {
        let (o, code) = answer(400, "BrandNewReason");
        assert_eq!(
            o,
            SendOutcome::Rejected {
                status: Some(400),
                reason: "APNs 400 BrandNewReason".into()
            }
        );
        assert_eq!(code, "other");
        let body = Bytes::from_static(b"<html>oops</html>");
        let (o, _) = classify(
            StatusCode::NOT_FOUND,
            &HeaderMap::new(),
            &body,
            SystemTime::now(),
        );
        assert_eq!(
            o,
            SendOutcome::Rejected {
                status: Some(404),
                reason: "APNs 404 (no reason given)".into()
            }
        );
        let long = "\\u0007".to_string() + &"x".repeat(500);
        let (o, _) = answer(400, &long);
        let SendOutcome::Rejected { reason, .. } = o else {
            panic!("{o:?}")
        };
        assert_eq!(reason.len(), "APNs 400 ".len() + MAX_REASON_CHARS);
    }
}
