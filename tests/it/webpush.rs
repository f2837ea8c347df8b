//! Web Push over real TLS and HTTP/2 against the loopback push service
//! (`pushpace::tools::mock::webpush`): the mock decrypts each message with the subscription's
//! own keys, so these tests compare what a browser would read with what the job held.

use p256::pkcs8::{EncodePrivateKey, LineEnding};
use pushpace::job::{Job, Priority, PushOptions};
use pushpace::provider::settings::{CommonSpec, WebPushSpec};
use pushpace::provider::webpush::vapid::VapidSigner;
use pushpace::provider::webpush::{self, WebPushSender, DEFAULT_TTL_S};
use pushpace::sender::{HaltScope, SendOutcome, Sender};
use pushpace::tools::mock::tls::TestCa;
use pushpace::tools::mock::webpush::WebPushMock;
use secrecy::SecretString;
use serde_json::value::RawValue;
use std::sync::Arc;
use std::time::Duration;

/// A fresh VAPID key, generated here (no key files in the repository).
fn vapid_key() -> SecretString {
    let key = p256::SecretKey::random(&mut aes_gcm::aead::OsRng);
    let pem = key.to_pkcs8_pem(LineEnding::LF).expect("encode");
    SecretString::from(pem.to_string())
}

fn spec(ca: &TestCa, key: SecretString, lifetime: Duration) -> WebPushSpec {
    WebPushSpec {
        name: "webpush".into(),
        vapid_key_pem: key,
        vapid_subject: "mailto:ops@example.com".into(),
        vapid_lifetime: lifetime,
        common: CommonSpec::trusting(ca.ca_pem()),
    }
}

fn job(devices: Vec<String>, payload: &str, options: PushOptions) -> Arc<Job> {
    Arc::new(Job {
        job_id: "job-1".into(),
        campaign_id: "camp-1".into(),
        send_rate: None,
        algorithm: None,
        devices,
        payload: RawValue::from_string(payload.to_string()).expect("json"),
        provider: None,
        app_id: None,
        provider_slot: 0,
        options,
        lifecycle: Default::default(),
        class_priority: Default::default(),
        zone: None,
    })
}

struct Setup {
    _ca: TestCa,
    mock: WebPushMock,
    sender: WebPushSender,
}

async fn setup(lifetime: Duration) -> Setup {
    let ca = TestCa::new();
    let mock = WebPushMock::start(&ca).expect("mock starts");
    let sender = WebPushSender::new(&spec(&ca, vapid_key(), lifetime)).expect("sender");
    Setup {
        _ca: ca,
        mock,
        sender,
    }
}

#[tokio::test]
async fn webpush_delivers_the_plaintext_with_its_headers() {
    let s = setup(webpush::vapid::DEFAULT_LIFETIME).await;
    let (sub_a, id_a) = s.mock.subscribe();
    let (sub_b, id_b) = s.mock.subscribe();
    let options = PushOptions {
        priority: Some(Priority::High),
        collapse_id: Some("news-42".into()),
        ttl_s: Some(60),
        ..PushOptions::default()
    };
    // A JSON string payload: its contents are the message.
    let j = job(vec![sub_a, sub_b], r#""Hi \"there\" \u00e9""#, options);
    assert_eq!(s.sender.send(&j, 0).await, SendOutcome::Delivered);
    assert_eq!(s.sender.send(&j, 1).await, SendOutcome::Delivered);
    assert_eq!(
        s.mock.received(&id_a),
        vec!["Hi \"there\" é".as_bytes().to_vec()]
    );
    assert_eq!(
        s.mock.received(&id_b),
        vec!["Hi \"there\" é".as_bytes().to_vec()]
    );

    // An object payload travels as its JSON text; no options: the defaults.
    let (sub_c, id_c) = s.mock.subscribe();
    let text = r#"{"title":"T","body":"B"}"#;
    let options = PushOptions {
        collapse_id: Some("x".repeat(33)),
        ..PushOptions::default()
    };
    let j = job(vec![sub_c], text, options);
    assert_eq!(s.sender.send(&j, 0).await, SendOutcome::Delivered);
    assert_eq!(s.mock.received(&id_c), vec![text.as_bytes().to_vec()]);

    let seen = s.mock.requests();
    assert_eq!(seen.len(), 3);
    for r in &seen[..2] {
        assert_eq!(r.status, 201);
        assert_eq!(r.ttl.as_deref(), Some("60"));
        assert_eq!(r.urgency.as_deref(), Some("high"));
        assert_eq!(r.topic.as_deref(), Some("news-42"));
    }
    let default_ttl = DEFAULT_TTL_S.to_string();
    assert_eq!(seen[2].ttl.as_deref(), Some(default_ttl.as_str()));
    assert_eq!(seen[2].urgency, None);
    assert_eq!(
        seen[2].topic, None,
        "a collapse id over 32 characters is left out"
    );
    // One pooled HTTP/2 connection (the mock accepts ALPN h2 only) carried all three.
    let controls = s.mock.server().controls();
    assert_eq!((controls.connections(), controls.streams()), (1, 3));
}

#[tokio::test]
async fn webpush_gone_and_unknown_subscriptions_are_dead_tokens() {
    let s = setup(webpush::vapid::DEFAULT_LIFETIME).await;
    let (sub, id) = s.mock.subscribe();
    s.mock.unsubscribe(&id);
    let unknown = sub.replace(&format!("/push/{id}"), "/push/never-subscribed");
    let j = job(vec![sub, unknown], r#"{"a":1}"#, PushOptions::default());
    for i in 0..2 {
        let out = s.sender.send(&j, i).await;
        assert!(matches!(out, SendOutcome::DeadToken { .. }), "{out:?}");
    }
    let statuses: Vec<u16> = s.mock.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![410, 404]);
    assert!(s.mock.received(&id).is_empty());
}

#[tokio::test]
async fn webpush_a_vapid_key_the_service_does_not_expect_is_judged_by_majority() {
    let s = setup(webpush::vapid::DEFAULT_LIFETIME).await;
    // The subscriptions were made with another application server key.
    let other =
        VapidSigner::new(&vapid_key(), "mailto:a@b.c", Duration::from_secs(60)).expect("signer");
    s.mock.expect_vapid_key(other.public_key_b64());
    let (sub, id) = s.mock.subscribe();
    let out = s
        .sender
        .send(&job(vec![sub], "{}", PushOptions::default()), 0)
        .await;
    assert!(
        matches!(
            out,
            SendOutcome::Halt {
                scope: HaltScope::Majority,
                ..
            }
        ),
        "{out:?}"
    );
    assert!(s.mock.received(&id).is_empty());

    // With the expected key the same subscription takes it.
    s.mock.expect_vapid_key(s.sender.public_key_b64());
    let (sub, id) = s.mock.subscribe();
    let out = s
        .sender
        .send(&job(vec![sub], "{}", PushOptions::default()), 0)
        .await;
    assert_eq!(out, SendOutcome::Delivered);
    assert_eq!(s.mock.received(&id), vec![b"{}".to_vec()]);
}

#[tokio::test]
async fn webpush_401_403_413_for_one_subscription_are_judged_by_majority() {
    let s = setup(webpush::vapid::DEFAULT_LIFETIME).await;
    let other =
        VapidSigner::new(&vapid_key(), "mailto:a@b.c", Duration::from_secs(60)).expect("signer");
    let (stale, _) = s.mock.subscribe_under(other.public_key_b64());
    let (mozilla, id_401) = s.mock.subscribe();
    s.mock.refuse_subscription(&id_401, 401);
    let (small, id_413) = s.mock.subscribe();
    s.mock.refuse_subscription(&id_413, 413);
    let (fine, id_ok) = s.mock.subscribe();
    let j = job(
        vec![stale, mozilla, small, fine],
        "{}",
        PushOptions::default(),
    );
    for (i, code) in [(0, "HTTP 403"), (1, "HTTP 401"), (2, "HTTP 413")] {
        let out = s.sender.send(&j, i).await;
        assert!(
            matches!(&out, SendOutcome::Halt { scope: HaltScope::Majority, reason } if reason.starts_with(code)),
            "{out:?}"
        );
    }
    // The same key and service take the other subscription.
    assert_eq!(s.sender.send(&j, 3).await, SendOutcome::Delivered);
    assert_eq!(s.mock.received(&id_ok), vec![b"{}".to_vec()]);
}

#[tokio::test]
async fn webpush_rate_limits_and_errors_are_provider_retries() {
    let s = setup(webpush::vapid::DEFAULT_LIFETIME).await;
    let (sub, id) = s.mock.subscribe();
    let j = job(vec![sub], r#""m""#, PushOptions::default());
    s.mock.force(429, Some(7), 1);
    let out = s.sender.send(&j, 0).await;
    let SendOutcome::RetryProvider { after, .. } = out else {
        panic!("{out:?}");
    };
    assert_eq!(after, Some(Duration::from_secs(7)));
    s.mock.force(503, None, 1);
    let out = s.sender.send(&j, 0).await;
    assert!(
        matches!(out, SendOutcome::RetryProvider { after: None, .. }),
        "{out:?}"
    );
    assert_eq!(s.sender.send(&j, 0).await, SendOutcome::Delivered);
    assert_eq!(s.mock.received(&id), vec![b"m".to_vec()]);
}

#[tokio::test]
async fn webpush_vapid_token_is_reused_then_resigned() {
    // 2 s tokens: re-signed when a quarter (0.5 s) is left, i.e. 0.5–1.5 s after signing
    // (exp has whole-second resolution).
    let s = setup(Duration::from_secs(2)).await;
    let (sub, id) = s.mock.subscribe();
    let j = job(vec![sub], r#""v""#, PushOptions::default());
    assert_eq!(s.sender.send(&j, 0).await, SendOutcome::Delivered);
    assert_eq!(s.sender.send(&j, 0).await, SendOutcome::Delivered);
    // The token's lifetime is wall-clock time: there is no event to await. 1.6 s is past
    // the latest re-sign point (1.5 s).
    tokio::time::sleep(Duration::from_millis(1600)).await;
    assert_eq!(s.sender.send(&j, 0).await, SendOutcome::Delivered);
    let tokens: Vec<String> = s
        .mock
        .requests()
        .into_iter()
        .map(|r| r.vapid_token.expect("token"))
        .collect();
    assert_eq!(tokens.len(), 3);
    assert_eq!(tokens[0], tokens[1], "reused for the same origin");
    assert_ne!(tokens[1], tokens[2], "re-signed before it expired");
    assert_eq!(s.mock.received(&id).len(), 3, "every token was accepted");
}

/// The mock refuses what a push service refuses (so the tests above mean something).
#[tokio::test]
async fn webpush_mock_is_strict() {
    let ca = TestCa::new();
    let mock = WebPushMock::start(&ca).expect("mock");
    let (sub, _) = mock.subscribe();
    let endpoint = serde_json::from_str::<serde_json::Value>(&sub).expect("json")["endpoint"]
        .as_str()
        .expect("endpoint")
        .to_string();
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(ca.ca_pem().as_bytes()).expect("ca"))
        .no_proxy()
        .build()
        .expect("client");
    let signer =
        VapidSigner::new(&vapid_key(), "mailto:a@b.c", Duration::from_secs(600)).expect("signer");
    let good = signer.authorization(&mock.origin());
    let wrong_aud = signer.authorization("https://push.example.net");
    let post = |auth: http::HeaderValue, ttl: bool, body: Vec<u8>| {
        let mut r = client
            .post(&endpoint)
            .header("content-encoding", "aes128gcm")
            .header("authorization", auth)
            .body(body);
        if ttl {
            r = r.header("ttl", "60");
        }
        r.send()
    };
    let status = |r: reqwest::Response| r.status().as_u16();
    assert_eq!(
        status(post(good.clone(), false, vec![0; 100]).await.expect("ok")),
        400
    );
    assert_eq!(
        status(post(wrong_aud, true, vec![0; 100]).await.expect("ok")),
        401
    );
    assert_eq!(
        status(post(good.clone(), true, vec![0; 4097]).await.expect("ok")),
        413
    );
    assert_eq!(
        status(post(good, true, vec![0; 100]).await.expect("ok")),
        400,
        "not decryptable"
    );
}
