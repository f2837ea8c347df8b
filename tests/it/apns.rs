//! The APNs adapter against the strict loopback APNs (real TLS, ALPN h2, HTTP/2): the
//! mock checks every header and the JWT as Apple does, and answers the errors its
//! marked tokens and switches ask for.

use pushpace::job::{Job, Priority, PushOptions, PushType};
use pushpace::provider::apns::jwt::{unix_now, Clock, TokenSigner};
use pushpace::provider::apns::{check, ApnsSender};
use pushpace::provider::settings::{ApnsEnvironment, ApnsSpec, CommonSpec};
use pushpace::sender::{HaltScope, SendOutcome, Sender};
use pushpace::tools::mock::apns::{ApnsMock, MockApnsConfig};
use pushpace::tools::mock::tls::TestCa;
use secrecy::SecretString;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

const TEAM: &str = "TEAM123456";
const KEY_ID: &str = "KEY1234567";
const TOPIC: &str = "com.example.app";
const PAYLOAD: &str = r#"{"aps":{"alert":"hello"}}"#;

/// A fresh provider key: (PKCS#8 PEM, SPKI PEM), as in a `.p8` file.
fn key() -> (String, String) {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    (pair.serialize_pem(), pair.public_key_pem())
}

struct Setup {
    mock: ApnsMock,
    spec: ApnsSpec,
}

/// A mock trusting a fresh key, and a spec pointing at it with that key.
fn setup(tune: impl FnOnce(&mut MockApnsConfig)) -> Setup {
    let ca = TestCa::new();
    let (private, public) = key();
    let mut config = MockApnsConfig::new(TEAM, KEY_ID, &public, TOPIC);
    tune(&mut config);
    let mock = ApnsMock::start(&ca, config).expect("mock");
    let spec = ApnsSpec {
        name: "apns".into(),
        team_id: TEAM.into(),
        key_id: KEY_ID.into(),
        key_pem: SecretString::from(private),
        topic: TOPIC.into(),
        environment: ApnsEnvironment::Sandbox,
        endpoint: mock.url(),
        connections: 2,
        token_refresh: Duration::from_secs(50 * 60),
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    Setup { mock, spec }
}

/// A 64-hex-digit token starting with `prefix` (the mock's error markers).
fn token(prefix: &str) -> String {
    let mut t = prefix.to_string();
    while t.len() < 64 {
        t.push(char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'));
    }
    t
}

fn job(devices: &[String], payload: &str, options: PushOptions) -> Arc<Job> {
    let text = serde_json::json!({
        "job_id": format!("j{}", fastrand::u32(..)),
        "campaign_id": "c1",
        "devices": devices,
        "payload": {"aps": {}},
    });
    let mut job = pushpace::job::decode(text.to_string().as_bytes()).expect("job");
    job.payload = serde_json::value::RawValue::from_string(payload.to_string()).expect("json");
    job.options = options;
    Arc::new(job)
}

async fn send_one(sender: &ApnsSender, device: &str, options: PushOptions) -> SendOutcome {
    sender
        .send(&job(&[device.to_string()], PAYLOAD, options), 0)
        .await
}

fn halt(scope: HaltScope, reason: &str) -> SendOutcome {
    SendOutcome::Halt {
        scope,
        reason: reason.into(),
    }
}

#[tokio::test]
async fn delivers_with_every_header_checked() {
    let s = setup(|_| {});
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let devices: Vec<String> = (0..8).map(|_| token("")).collect();
    let options = PushOptions {
        priority: Some(Priority::High),
        collapse_id: Some("news-1".into()),
        expiration: Some(1_900_000_000),
        ttl_s: None,
        push_type: Some(PushType::Alert),
    };
    let batch = job(&devices, PAYLOAD, options);
    // All at once: the pool must keep one stream per connection until one succeeds.
    let sends = (0..devices.len()).map(|i| sender.send(&batch, i));
    for outcome in futures::future::join_all(sends).await {
        assert_eq!(outcome, SendOutcome::Delivered);
    }
    let controls = s.mock.controls();
    let seen = controls.delivered();
    assert_eq!(seen.len(), devices.len());
    for push in &seen {
        assert_eq!(push.topic, TOPIC);
        assert_eq!(push.push_type.as_deref(), Some("alert"));
        assert_eq!(push.priority.as_deref(), Some("10"));
        assert_eq!(push.expiration, Some(1_900_000_000));
        assert_eq!(push.collapse_id.as_deref(), Some("news-1"));
        assert_eq!(push.content_type.as_deref(), Some("application/json"));
        assert_eq!(&push.body[..], PAYLOAD.as_bytes());
        assert_eq!(push.apns_id.len(), 36);
    }
    let per_token = controls.delivered_tokens();
    assert!(
        devices.iter().all(|d| per_token.get(d) == Some(&1)),
        "{per_token:?}"
    );
    assert_eq!(controls.jwts().len(), 1, "one token signed and shared");
    assert!(s.mock.server().controls().max_concurrent_before_ok() <= 1);

    // VoIP: the topic's `.voip` suffix, an expiration from ttl_s, a 5000-byte payload
    // (within VoIP's 5120).
    let voip = PushOptions {
        push_type: Some(PushType::Voip),
        ttl_s: Some(600),
        ..PushOptions::default()
    };
    let big = format!(r#"{{"aps":{{}},"pad":"{}"}}"#, "x".repeat(4970));
    let before = unix_now() as i64;
    let out = sender.send(&job(&[token("")], &big, voip), 0).await;
    assert_eq!(out, SendOutcome::Delivered);
    // Background: priority 5 when the job gives none.
    let background = PushOptions {
        push_type: Some(PushType::Background),
        ..PushOptions::default()
    };
    assert_eq!(
        send_one(&sender, &token(""), background).await,
        SendOutcome::Delivered
    );
    let seen = controls.delivered();
    let (voip, background) = (&seen[seen.len() - 2], &seen[seen.len() - 1]);
    assert_eq!(voip.topic, format!("{TOPIC}.voip"));
    let at = voip.expiration.expect("expiration");
    assert!(
        (before + 600..=unix_now() as i64 + 600).contains(&at),
        "{at}"
    );
    assert_eq!(background.priority.as_deref(), Some("5"));
    assert_eq!(background.push_type.as_deref(), Some("background"));
}

#[tokio::test]
async fn each_answer_maps_to_its_class() {
    let s = setup(|c| c.too_many_attempts = 1);
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let cases = [
        (
            "410a",
            SendOutcome::DeadToken {
                reason: "APNs 410 Unregistered".into(),
            },
        ),
        (
            "410e",
            SendOutcome::DeadToken {
                reason: "APNs 410 ExpiredToken".into(),
            },
        ),
        (
            "400d",
            SendOutcome::Rejected {
                status: Some(400),
                reason: "APNs 400 DeviceTokenNotForTopic".into(),
            },
        ),
        (
            "400b",
            SendOutcome::Mismatch {
                dead_token: false,
                reason: "APNs 400 BadDeviceToken".into(),
            },
        ),
        (
            "5000",
            SendOutcome::RetryProvider {
                after: None,
                reason: "APNs 500 InternalServerError".into(),
                signal: Some(pushpace::sender::Signal::Unavailable),
            },
        ),
        (
            "5030",
            SendOutcome::RetryProvider {
                after: Some(Duration::from_secs(2)),
                reason: "APNs 503 ServiceUnavailable".into(),
                signal: Some(pushpace::sender::Signal::RetryAfter),
            },
        ),
        (
            "5031",
            SendOutcome::RetryProvider {
                after: None,
                reason: "APNs 503 Shutdown".into(),
                signal: Some(pushpace::sender::Signal::Unavailable),
            },
        ),
    ];
    for (prefix, want) in cases {
        let got = send_one(&sender, &token(prefix), PushOptions::default()).await;
        assert_eq!(got, want, "token {prefix}…");
    }
    assert!(s.mock.controls().delivered().is_empty());
}

#[tokio::test]
async fn provider_wide_answers_halt_and_bad_requests_are_refused() {
    let s = setup(|_| {});
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let controls = s.mock.controls();
    // Provider-wide answers, switched on in the mock.
    let forced = [
        (403, "InvalidProviderToken", HaltScope::Provider),
        (403, "BadCertificateEnvironment", HaltScope::Provider),
        (400, "BadTopic", HaltScope::Provider),
        (429, "TooManyProviderTokenUpdates", HaltScope::Provider),
        (400, "InvalidPushType", HaltScope::Campaign),
        (400, "BadExpirationDate", HaltScope::Campaign),
    ];
    for (status, reason, scope) in forced {
        controls.set_forced_reason(Some((status, reason)));
        let got = send_one(&sender, &token(""), PushOptions::default()).await;
        assert_eq!(got, halt(scope, &format!("APNs {status} {reason}")));
    }
    controls.set_forced_reason(Some((400, "SomethingNew")));
    let got = send_one(&sender, &token(""), PushOptions::default()).await;
    assert_eq!(
        got,
        SendOutcome::Rejected {
            status: Some(400),
            reason: "APNs 400 SomethingNew".into()
        }
    );
    controls.set_forced_reason(None);

    // A token that is not hex is refused without a request.
    let requests = controls.requests();
    let got = send_one(&sender, "not-a-token", PushOptions::default()).await;
    assert!(
        matches!(got, SendOutcome::Rejected { status: None, .. }),
        "{got:?}"
    );
    assert_eq!(controls.requests(), requests);
    // The mock's own checks: a collapse id over 64 bytes halts the campaign.
    let long = PushOptions {
        collapse_id: Some("c".repeat(65)),
        ..PushOptions::default()
    };
    let got = send_one(&sender, &token(""), long).await;
    assert_eq!(got, halt(HaltScope::Campaign, "APNs 400 BadCollapseId"));
}

#[tokio::test]
async fn a_device_429_retries_that_device() {
    let s = setup(|c| c.too_many_attempts = 1);
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let device = token("429c");
    let first = send_one(&sender, &device, PushOptions::default()).await;
    assert_eq!(
        first,
        SendOutcome::RetryDevice {
            after: Some(Duration::from_secs(1)),
            reason: "APNs 429 TooManyRequests".into()
        }
    );
    // The adapter did not retry by itself; the scheduler's retry is accepted.
    assert_eq!(s.mock.controls().requests(), 1);
    let again = send_one(&sender, &device, PushOptions::default()).await;
    assert_eq!(again, SendOutcome::Delivered);
    assert_eq!(s.mock.controls().delivered_tokens().get(&device), Some(&1));
}

#[tokio::test]
async fn payload_over_4096_bytes_halts_the_campaign() {
    let s = setup(|_| {});
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let big = format!(r#"{{"aps":{{}},"pad":"{}"}}"#, "x".repeat(4096));
    let out = sender
        .send(&job(&[token("")], &big, PushOptions::default()), 0)
        .await;
    assert_eq!(out, halt(HaltScope::Campaign, "APNs 413 PayloadTooLarge"));
    assert_eq!(s.mock.controls().answers("PayloadTooLarge"), 1);
}

#[tokio::test]
async fn a_jwt_from_another_key_halts_the_provider() {
    let mut s = setup(|_| {});
    s.spec.key_pem = SecretString::from(key().0);
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let out = send_one(&sender, &token(""), PushOptions::default()).await;
    assert_eq!(
        out,
        halt(HaltScope::Provider, "APNs 403 InvalidProviderToken")
    );
    assert!(s.mock.controls().delivered().is_empty());
}

#[tokio::test]
async fn expired_provider_token_is_resigned_once_and_the_send_succeeds() {
    let s = setup(|_| {});
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let controls = s.mock.controls();
    assert_eq!(
        send_one(&sender, &token(""), PushOptions::default()).await,
        SendOutcome::Delivered
    );
    controls.expire_seen_jwts();
    let device = token("");
    let out = send_one(&sender, &device, PushOptions::default()).await;
    assert_eq!(out, SendOutcome::Delivered);
    assert_eq!(controls.answers("ExpiredProviderToken"), 1);
    assert_eq!(controls.jwts().len(), 2, "exactly one re-sign");
    assert_eq!(controls.delivered_tokens().get(&device), Some(&1));
    // The new token rejected too, within 20 minutes: no second re-sign, the provider halts.
    controls.expire_seen_jwts();
    let out = send_one(&sender, &token(""), PushOptions::default()).await;
    assert_eq!(
        out,
        halt(HaltScope::Provider, "APNs 403 ExpiredProviderToken")
    );
    assert_eq!(controls.jwts().len(), 2);
}

#[tokio::test]
async fn a_token_apple_finds_too_old_is_resigned_once_then_halts() {
    let s = setup(|c| c.max_jwt_age = Duration::from_secs(3600));
    // A signer clock two hours behind: every token it signs is too old for the mock.
    let behind = unix_now() - 2 * 3600;
    let sender = ApnsSender::with_clock(&s.spec, Clock::from_fn(move || behind)).expect("sender");
    let out = send_one(&sender, &token(""), PushOptions::default()).await;
    assert_eq!(
        out,
        halt(HaltScope::Provider, "APNs 403 ExpiredProviderToken")
    );
    let controls = s.mock.controls();
    assert_eq!(controls.answers("ExpiredProviderToken"), 2);
    assert_eq!(controls.jwts().len(), 2, "one re-sign, then no more");
}

#[tokio::test]
async fn token_is_resigned_at_the_refresh_interval_and_not_sooner() {
    // The signer's clock starts 3 hours back and is run forward by the test; the mock
    // accepts tokens up to 4 hours old, so only the signer's schedule decides.
    let s = setup(|c| c.max_jwt_age = Duration::from_secs(4 * 3600));
    let start = unix_now() - 3 * 3600;
    let now = Arc::new(AtomicU64::new(start));
    let clock_now = Arc::clone(&now);
    let clock = Clock::from_fn(move || clock_now.load(Ordering::Relaxed));
    let sender = ApnsSender::with_clock(&s.spec, clock).expect("sender");
    let controls = s.mock.controls();
    for minutes in [0, 19, 20, 49] {
        now.store(start + minutes * 60, Ordering::Relaxed);
        let out = send_one(&sender, &token(""), PushOptions::default()).await;
        assert_eq!(out, SendOutcome::Delivered);
        assert_eq!(controls.jwts().len(), 1, "no re-sign at minute {minutes}");
    }
    now.store(start + 50 * 60, Ordering::Relaxed);
    assert_eq!(
        send_one(&sender, &token(""), PushOptions::default()).await,
        SendOutcome::Delivered
    );
    let jwts = controls.jwts();
    assert_eq!(jwts.len(), 2);
    assert_eq!(jwts[0].iat, start);
    assert_eq!(jwts[1].iat, start + 50 * 60);

    // A configured refresh under Apple's 20-minute floor is raised to it.
    let mut short = s.spec.clone();
    short.token_refresh = Duration::from_secs(60);
    now.store(start, Ordering::Relaxed);
    let clock_now = Arc::clone(&now);
    let clock = Clock::from_fn(move || clock_now.load(Ordering::Relaxed));
    let sender = ApnsSender::with_clock(&short, clock).expect("sender");
    let seen = controls.jwts().len();
    for minutes in [0, 5, 19] {
        now.store(start + minutes * 60, Ordering::Relaxed);
        assert_eq!(
            send_one(&sender, &token(""), PushOptions::default()).await,
            SendOutcome::Delivered
        );
    }
    assert_eq!(controls.jwts().len(), seen + 1);
    now.store(start + 20 * 60, Ordering::Relaxed);
    assert_eq!(
        send_one(&sender, &token(""), PushOptions::default()).await,
        SendOutcome::Delivered
    );
    assert_eq!(controls.jwts().len(), seen + 2);
}

#[tokio::test]
async fn debug_output_hides_the_token() {
    let s = setup(|_| {});
    let sender = ApnsSender::new(&s.spec).expect("sender");
    assert_eq!(
        send_one(&sender, &token(""), PushOptions::default()).await,
        SendOutcome::Delivered
    );
    let shown = format!("{sender:?}");
    assert!(shown.contains(TEAM), "{shown}");
    assert!(
        !shown.contains("bearer") && !shown.contains("eyJ"),
        "{shown}"
    );
}

#[tokio::test]
async fn check_signs_and_opens_tls_h2_without_sending() {
    let s = setup(|_| {});
    let summary = check(&s.spec).await.expect("check");
    let port = s.mock.addr().port();
    assert_eq!(
        summary,
        format!(
            "signed an ES256 JWT for team {TEAM} key {KEY_ID}; TLS + h2 to 127.0.0.1:{port} ok"
        )
    );
    assert_eq!(s.mock.controls().requests(), 0);
    assert_eq!(s.mock.server().controls().connections(), 1);

    // A server the client does not trust fails the check.
    let mut untrusted = s.spec.clone();
    untrusted.common.ca_pem = Some(TestCa::new().ca_pem().into_bytes());
    let err = check(&untrusted).await.expect_err("untrusted");
    assert!(err.to_string().contains("TLS"), "{err}");
}

/// The mock's own strictness, with hand-made requests on the adapter's connection pool:
/// what the adapter never sends must still be refused as Apple would.
#[tokio::test]
async fn the_mock_refuses_what_apple_refuses() {
    let s = setup(|_| {});
    let sender = ApnsSender::new(&s.spec).expect("sender");
    let signer = TokenSigner::new(
        "apns",
        TEAM,
        KEY_ID,
        &s.spec.key_pem,
        s.spec.token_refresh,
        Clock::system(),
    )
    .expect("signer");
    let auth = signer.current().header;
    let device = token("");
    let auth = auth.to_str().expect("ascii").to_string();
    let body = bytes::Bytes::from_static(PAYLOAD.as_bytes());
    for (req, body, status, reason) in refusal_cases(&auth, &device) {
        let answer = sender.pool().send(req, body).await.expect("answer");
        let text = String::from_utf8_lossy(&answer.body).to_string();
        assert_eq!(answer.status.as_u16(), status, "{reason}: {text}");
        let json: serde_json::Value = serde_json::from_str(&text).expect("json");
        assert_eq!(json["reason"], reason);
    }
    // A valid request: 200, and its apns-id echoed.
    let id = "123e4567-e89b-12d3-a456-426614174000";
    let valid = http::Request::post(format!("/3/device/{device}"))
        .header("authorization", &auth)
        .header("apns-topic", TOPIC)
        .header("apns-push-type", "alert")
        .header("apns-id", id)
        .body(())
        .expect("request");
    let answer = sender.pool().send(valid, body).await.expect("answer");
    assert_eq!(answer.status.as_u16(), 200);
    assert_eq!(
        answer.headers.get("apns-id").and_then(|v| v.to_str().ok()),
        Some(id)
    );
    assert_eq!(s.mock.controls().delivered().len(), 1);
}

type Case = (http::Request<()>, bytes::Bytes, u16, &'static str);

/// Hand-made requests the mock must refuse, with Apple's status and reason.
fn refusal_cases(auth: &str, device: &str) -> Vec<Case> {
    let request = |method: &str, headers: &[(&str, &str)]| {
        let mut b = http::Request::builder()
            .method(method)
            .uri(format!("/3/device/{device}"));
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).expect("request")
    };
    let good: Vec<(&str, &str)> = vec![
        ("authorization", auth),
        ("apns-topic", TOPIC),
        ("apns-push-type", "alert"),
    ];
    let with = |extra: &[(&'static str, &'static str)]| {
        let mut h = good.clone();
        for (k, v) in extra {
            h.retain(|(name, _)| name != k);
            h.push((k, v));
        }
        h
    };
    let body = bytes::Bytes::from_static(PAYLOAD.as_bytes());
    let cases: Vec<(http::Request<()>, bytes::Bytes, u16, &str)> = vec![
        (request("GET", &good), body.clone(), 405, "MethodNotAllowed"),
        (
            request("POST", &good[1..]),
            body.clone(),
            403,
            "MissingProviderToken",
        ),
        (
            request("POST", &with(&[("apns-topic", "com.other")])),
            body.clone(),
            400,
            "BadTopic",
        ),
        (
            request("POST", &good[..1]),
            body.clone(),
            400,
            "MissingTopic",
        ),
        (
            request("POST", &with(&[("apns-push-type", "banner")])),
            body.clone(),
            400,
            "InvalidPushType",
        ),
        (
            request("POST", &with(&[("apns-priority", "7")])),
            body.clone(),
            400,
            "BadPriority",
        ),
        (
            request(
                "POST",
                &with(&[("apns-push-type", "background"), ("apns-priority", "10")]),
            ),
            body.clone(),
            400,
            "BadPriority",
        ),
        (
            request("POST", &with(&[("apns-expiration", "soon")])),
            body.clone(),
            400,
            "BadExpirationDate",
        ),
        (
            request("POST", &with(&[("apns-id", "not-a-uuid")])),
            body.clone(),
            400,
            "BadMessageId",
        ),
        (
            request("POST", &good),
            bytes::Bytes::new(),
            400,
            "PayloadEmpty",
        ),
        (
            request("POST", &good),
            bytes::Bytes::from_static(b"not json"),
            400,
            "BadPayload",
        ),
    ];
    cases
}
