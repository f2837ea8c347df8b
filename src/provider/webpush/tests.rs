//! Unit tests of the adapter's request rules and `providers check`.

use super::*;
use crate::job::Priority;
use crate::provider::settings::CommonSpec;
use secrecy::SecretString;

fn spec(key: SecretString, subject: &str) -> WebPushSpec {
    WebPushSpec {
        name: "wp".into(),
        vapid_key_pem: key,
        vapid_subject: subject.into(),
        vapid_lifetime: vapid::DEFAULT_LIFETIME,
        common: CommonSpec {
            ca_pem: None,
            ca_file: None,
            max_rate: None,
            timeout: Duration::from_secs(5),
            max_in_flight: 100,
            adaptive: Some(crate::provider::ceiling::CeilingParams::default()),
            app: None,
        },
    }
}

fn raw(text: &str) -> Box<RawValue> {
    RawValue::from_string(text.to_string()).expect("json")
}

#[test]
fn plaintext_is_a_strings_contents_or_the_json_text() {
    assert_eq!(&*plaintext(&raw(r#""hi there""#)).expect("ok"), b"hi there");
    assert_eq!(&*plaintext(&raw(r#""a\"b\n""#)).expect("ok"), b"a\"b\n");
    assert_eq!(
        &*plaintext(&raw(r#"{"a": 1}"#)).expect("ok"),
        br#"{"a": 1}"#
    );
    assert!(check_payload(&raw(&format!("\"{}\"", "x".repeat(ece::MAX_PLAINTEXT)))).is_ok());
    let err = check_payload(&raw(&format!("\"{}\"", "x".repeat(ece::MAX_PLAINTEXT + 1))));
    assert!(err.expect_err("too large").contains("3993"));
}

#[test]
fn ttl_from_options() {
    let now = 1_000_000;
    let mut o = PushOptions::default();
    assert_eq!(ttl(&o, now), DEFAULT_TTL_S);
    o.expiration = Some(now + 60);
    assert_eq!(ttl(&o, now), 60);
    o.expiration = Some(now - 60);
    assert_eq!(
        ttl(&o, now),
        0,
        "expired: deliver only to an online browser"
    );
    o.ttl_s = Some(5);
    assert_eq!(ttl(&o, now), 5, "ttl_s wins");
}

#[test]
fn topic_only_when_valid() {
    assert_eq!(topic(Some("news-1_A")), Some("news-1_A"));
    assert_eq!(topic(Some(&"a".repeat(32))).map(str::len), Some(32));
    assert_eq!(topic(Some(&"a".repeat(33))), None);
    assert_eq!(topic(Some("has space")), None);
    assert_eq!(topic(Some("")), None);
    assert_eq!(topic(None), None);
    assert_eq!(
        Priority::Low.as_str(),
        "low",
        "Urgency values are the priority names"
    );
}

#[test]
fn urgency_is_the_jobs_priority_else_its_class() {
    let text = br#"{"job_id":"j","campaign_id":"c","devices":["d"],"payload":"hi"}"#;
    let mut job = crate::job::decode(text).expect("job");
    assert_eq!(urgency(&job), None, "no priority, no class: no header");
    job.class_priority.set(Some(Priority::High));
    assert_eq!(urgency(&job), Some("high"));
    job.class_priority.set(Some(Priority::Normal));
    assert_eq!(urgency(&job), Some("normal"));
    job.options.priority = Some(Priority::Low);
    assert_eq!(urgency(&job), Some("low"), "the job's own wins");
    job.class_priority.set(None);
    assert_eq!(urgency(&job), Some("low"));
}

#[tokio::test]
async fn check_signs_and_verifies_without_sending() {
    let s = spec(vapid::tests::pem_key(), "mailto:ops@example.com");
    let report = check(&s).await.expect("check passes");
    assert!(report.contains("applicationServerKey"), "{report}");
    assert!(!report.contains("PRIVATE"), "{report}");
    let sender = WebPushSender::new(&s).expect("builds");
    assert!(report.contains(sender.public_key_b64()), "{report}");
    assert_eq!(sender.name(), "webpush");
}

#[tokio::test]
async fn setup_errors_name_the_problem() {
    let bad_key = spec(SecretString::from("not a key"), "mailto:ops@example.com");
    assert!(matches!(
        check(&bad_key).await,
        Err(ProviderError::Key {
            what: "vapid_key",
            ..
        })
    ));
    let bad_sub = spec(vapid::tests::pem_key(), "ops@example.com");
    let err = WebPushSender::new(&bad_sub).expect_err("subject");
    assert!(err.to_string().contains("vapid_subject"), "{err}");
    let mut bad_ca = spec(vapid::tests::pem_key(), "mailto:ops@example.com");
    bad_ca.common.ca_pem = Some(b"nothing here".to_vec());
    assert!(matches!(
        WebPushSender::new(&bad_ca),
        Err(ProviderError::Tls { .. })
    ));
}

#[tokio::test]
async fn a_bad_subscription_or_payload_is_classified_without_a_request() {
    let sender = WebPushSender::new(&spec(vapid::tests::pem_key(), "mailto:a@b.c")).expect("ok");
    let job = |device: &str, payload: &str| {
        Arc::new(Job {
            job_id: "j".into(),
            campaign_id: "c".into(),
            send_rate: None,
            algorithm: None,
            devices: vec![device.to_string()],
            payload: raw(payload),
            provider: None,
            app_id: None,
            provider_slot: 0,
            options: PushOptions::default(),
            lifecycle: Default::default(),
            class_priority: Default::default(),
            zone: None,
        })
    };
    let out = sender.send(&job("nope", r#"{"a":1}"#), 0).await;
    assert!(
        matches!(out, SendOutcome::Rejected { status: None, .. }),
        "{out:?}"
    );
    let out = sender.send(&job("nope", r#"{"a":1}"#), 3).await;
    assert!(matches!(out, SendOutcome::Rejected { .. }), "{out:?}");
    let sub = r#"{"endpoint":"https://127.0.0.1:9/x","keys":{"p256dh":"BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4","auth":"BTBZMqHH6r4Tts7J_aSIgg"}}"#;
    let big = format!("\"{}\"", "x".repeat(ece::MAX_PLAINTEXT + 1));
    let out = sender.send(&job(sub, &big), 0).await;
    assert!(
        matches!(
            out,
            SendOutcome::Halt {
                scope: HaltScope::Campaign,
                ..
            }
        ),
        "{out:?}"
    );
}
