//! The provider fields of a job (`provider`, `priority`, `collapse_id`, `expiration`,
//! `ttl_s`, `push_type`), Web Push subscription devices, and each provider kind's rules
//! as `Providers::resolve` applies them at intake (null senders of each kind: the rules
//! need no network).

use super::{base, rejects, with, INVALID};
use base64::Engine;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use pushpace::job::{decode, Job, Priority, PushType, Subscription};
use pushpace::provider::{Provider, ProviderKind, Providers};
use pushpace::sender::{AnySender, NullSender};
use serde_json::json;
use std::sync::Arc;

const TOKEN: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60718293a4b5c6d7e8f90";

fn b64(bytes: &[u8]) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(bytes)
}

/// A subscription as a browser gives it, with a real P-256 key and a 16-byte secret.
fn subscription(endpoint: &str) -> serde_json::Value {
    let key = p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng);
    let point = key.public_key().to_encoded_point(false);
    let auth: [u8; 16] = std::array::from_fn(|i| i as u8 * 7);
    json!({
        "endpoint": endpoint,
        "expirationTime": null,
        "keys": {"auth": b64(&auth), "p256dh": b64(point.as_bytes())},
    })
}

/// A job message from `base()` with `fields` set.
fn job_with(fields: serde_json::Value) -> Vec<u8> {
    let mut v = base();
    for (k, val) in fields.as_object().unwrap() {
        v[k] = val.clone();
    }
    serde_json::to_vec(&v).unwrap()
}

fn providers() -> Providers {
    let p = |name: &str, kind| Provider {
        name: Arc::from(name),
        kind,
        max_rate: None,
        max_in_flight: None,
        adaptive: None,
        sender: AnySender::Null(NullSender),
    };
    Providers::new(
        vec![
            p("webhook", ProviderKind::Webhook),
            p("ios", ProviderKind::Apns),
            p("android", ProviderKind::Fcm),
            p("browser", ProviderKind::WebPush),
        ],
        "webhook",
    )
    .unwrap()
}

/// Decodes `fields` over `base()` and resolves the job; the error text if refused.
fn resolve(fields: serde_json::Value) -> Result<Job, String> {
    let mut job = decode(&job_with(fields)).map_err(|e| format!("decode: {e}"))?;
    match providers().resolve(&mut job) {
        Ok(()) => Ok(job),
        Err(e) => {
            assert_eq!(e.kind(), INVALID, "{e}");
            assert!(e.field().is_some(), "{e}");
            Err(e.to_string())
        }
    }
}

#[test]
fn every_provider_field_decodes() {
    let job = decode(&job_with(json!({
        "provider": "ios-prod_2",
        "priority": "low",
        "collapse_id": "score-update",
        "expiration": 1_900_000_000,
        "push_type": "background",
    })))
    .unwrap();
    assert_eq!(job.provider.as_deref(), Some("ios-prod_2"));
    assert_eq!(job.options.priority, Some(Priority::Low));
    assert_eq!(job.options.collapse_id.as_deref(), Some("score-update"));
    assert_eq!(job.options.expiration, Some(1_900_000_000));
    assert_eq!(job.options.ttl_s, None);
    assert_eq!(job.options.push_type, Some(PushType::Background));

    for (v, p) in [
        (json!("high"), Priority::High),
        (json!(10), Priority::High),
        (json!("normal"), Priority::Normal),
        (json!(5), Priority::Normal),
        (json!(1), Priority::Low),
    ] {
        let job = decode(&with("priority", v)).unwrap();
        assert_eq!(job.options.priority, Some(p));
    }
    for t in PushType::ALL {
        let job = decode(&with("push_type", json!(t.as_str()))).unwrap();
        assert_eq!(job.options.push_type, Some(t));
    }
    let job = decode(&with("ttl_s", json!(2_419_200))).unwrap();
    assert_eq!(job.options.ttl_s, Some(2_419_200));
    assert_eq!(
        decode(&with("expiration", json!(0)))
            .unwrap()
            .options
            .expiration,
        Some(0)
    );
    // null counts as absent, as for send_rate.
    let job = decode(&job_with(
        json!({"provider": null, "priority": null, "ttl_s": null}),
    ))
    .unwrap();
    assert_eq!(job.provider, None);
    assert_eq!(job.options, Default::default());
}

#[test]
fn bad_provider_fields_name_the_field() {
    let cases = [
        (
            "provider",
            json!("iOS"),
            "must be 1–64 characters from [a-z0-9_-], got \"iOS\"",
        ),
        ("provider", json!(""), "must be 1–64 characters"),
        ("provider", json!("x".repeat(65)), "must be 1–64 characters"),
        (
            "provider",
            json!(3),
            "must be a provider name (a string), got a number",
        ),
        (
            "priority",
            json!(7),
            "must be \"high\", \"normal\" or \"low\" (or APNs 10, 5, 1), got 7",
        ),
        ("priority", json!("urgent"), "got \"urgent\""),
        (
            "collapse_id",
            json!("c".repeat(65)),
            "must be 1–64 bytes, got 65",
        ),
        ("collapse_id", json!(""), "must be 1–64 bytes, got 0"),
        (
            "collapse_id",
            json!("a\nb"),
            "must not contain control characters (byte 0x0a at 1)",
        ),
        (
            "expiration",
            json!(-1),
            "must be unix seconds ≥ 0 (0: do not store), got -1",
        ),
        (
            "expiration",
            json!(1.5),
            "must be a whole number of unix seconds, got 1.5",
        ),
        (
            "expiration",
            json!("soon"),
            "must be a whole number of unix seconds, got a string",
        ),
        (
            "ttl_s",
            json!(2_419_201),
            "must be 0–2419200 seconds (28 days), got 2419201",
        ),
        (
            "push_type",
            json!("banner"),
            "unknown push type \"banner\"; expected one of alert, background, voip",
        ),
        (
            "push_type",
            json!(["alert"]),
            "must be a string, got an array",
        ),
    ];
    for (field, value, needle) in cases {
        rejects(&with(field, value), INVALID, Some(field), needle);
    }
    // A 64-byte collapse id of multi-byte characters is the limit in bytes.
    assert!(decode(&with("collapse_id", json!("é".repeat(32)))).is_ok());
    rejects(
        &with("collapse_id", json!("é".repeat(33))),
        INVALID,
        Some("collapse_id"),
        "got 66",
    );
    rejects(
        &job_with(json!({"expiration": 1, "ttl_s": 60})),
        INVALID,
        Some("ttl_s"),
        "give expiration or ttl_s, not both",
    );
    let twice = br#"{"job_id":"j","campaign_id":"c","provider":"a","provider":"b","devices":["d"],"payload":{}}"#;
    rejects(twice, INVALID, Some("provider"), "appears more than once");
}

#[test]
fn subscription_devices_are_kept_as_compact_json() {
    let sub = subscription("https://push.example.net/wpush/v2/abc?x=1");
    let job = decode(&with("devices", json!([sub, "plain-token"]))).unwrap();
    let want = format!(
        r#"{{"endpoint":"https://push.example.net/wpush/v2/abc?x=1","keys":{{"p256dh":"{}","auth":"{}"}}}}"#,
        sub["keys"]["p256dh"].as_str().unwrap(),
        sub["keys"]["auth"].as_str().unwrap()
    );
    assert_eq!(job.devices, [want.as_str(), "plain-token"]);
    let parsed = Subscription::parse(&job.devices[0]).unwrap();
    assert_eq!(parsed.endpoint, "https://push.example.net/wpush/v2/abc?x=1");
    assert!(Subscription::parse("plain-token").is_none());
}

#[test]
fn bad_subscriptions_name_the_member() {
    let mut sub = subscription("https://push.example.net/x");
    let cases: Vec<(serde_json::Value, &str, &str)> = vec![
        (
            json!({"endpoint": "http://push.example.net/x", "keys": sub["keys"]}),
            "devices[0].endpoint",
            "must be an https:// URL",
        ),
        (
            json!({"endpoint": "https://push.example.net/a b", "keys": sub["keys"]}),
            "devices[0].endpoint",
            "no spaces, quotes or backslashes, found ' '",
        ),
        (
            json!({"endpoint": "https://push.example.net/x"}),
            "devices[0].keys",
            "missing; a subscription is",
        ),
        (
            json!({"keys": sub["keys"]}),
            "devices[0].endpoint",
            "missing; a subscription is",
        ),
        (
            json!({"endpoint": "https://push.example.net/x", "keys": {"p256dh": "BAAA"}}),
            "devices[0].keys.auth",
            "missing",
        ),
        (
            json!({"endpoint": "https://push.example.net/x", "keys": {"p256dh": "BAAA", "auth": 16}}),
            "devices[0].keys.auth",
            "invalid type: integer `16`, expected a string",
        ),
        (
            json!({"endpoint": "https://push.example.net/x", "keys": {"p256dh": "BA+/", "auth": "AAAA"}}),
            "devices[0].keys.p256dh",
            "must be base64url text",
        ),
        (
            json!(12),
            "devices[0]",
            "expected a device token string or a Web Push subscription object",
        ),
    ];
    for (device, field, needle) in cases {
        rejects(
            &with("devices", json!([device])),
            INVALID,
            Some(field),
            needle,
        );
    }
    sub["endpoint"] = json!(5);
    rejects(
        &with("devices", json!(["ok", sub])),
        INVALID,
        Some("devices[1].endpoint"),
        "invalid type: integer `5`",
    );
}

#[test]
fn new_fields_and_subscriptions_round_trip() {
    let msg = job_with(json!({
        "provider": "browser",
        "priority": 10,
        "collapse_id": "news \"today\"",
        "ttl_s": 3600,
        "push_type": "voip",
        "devices": [subscription("https://updates.push.services.mozilla.com/wpush/v2/x"), "tok"],
        "payload": "plain text: \"quoted\" ünïcode",
    }));
    let job = decode(&msg).unwrap();
    let text = job.to_json();
    let back = decode(&text).unwrap();
    assert_eq!(back, job);
    assert_eq!(back.options.priority, Some(Priority::High));
    // The subscription is written back as an object, not as a string.
    let v: serde_json::Value = serde_json::from_slice(&text).unwrap();
    assert!(v["devices"][0]["keys"]["p256dh"].is_string(), "{v}");
    assert_eq!(v["priority"], "high");
    assert_eq!(v["payload"], "plain text: \"quoted\" ünïcode");
}

#[test]
fn an_unknown_provider_is_refused_and_a_known_one_sets_the_slot() {
    let e = resolve(json!({"provider": "huawei"})).unwrap_err();
    assert_eq!(
        e,
        "provider: \"huawei\" is not a configured provider; this worker has: webhook, ios, android, browser"
    );
    let job = resolve(json!({"provider": "android"})).unwrap();
    assert_eq!(job.provider_slot, 2);
    let job = resolve(json!({})).unwrap();
    assert_eq!(job.provider_slot, 0, "the default");
}

#[test]
fn apns_rules() {
    let ok = resolve(json!({"provider": "ios", "devices": [TOKEN, TOKEN.to_uppercase()]}));
    assert_eq!(ok.unwrap().provider_slot, 1);
    // The reason reaches WARN logs and letters: the token is named by a hash prefix.
    let e = resolve(json!({"provider": "ios", "devices": [TOKEN, "tok-b"]})).unwrap_err();
    assert_eq!(
        e,
        "devices[1]: an APNs device token is 64–200 hexadecimal characters, got a token of 5 bytes (sha256 efa1cd32d437…)"
    );
    let long = format!("{}zz", &TOKEN[..60]);
    let e = resolve(json!({"provider": "ios", "devices": [long]})).unwrap_err();
    assert!(
        e.starts_with("devices[0]: an APNs device token is 64–200") && !e.contains(&TOKEN[..8]),
        "{e}"
    );
    let framing = r#"{"aps":{"alert":""}}"#.len();
    let payload = |n: usize| json!({"aps": {"alert": "x".repeat(n - framing)}});
    assert!(
        resolve(json!({"provider": "ios", "devices": [TOKEN], "payload": payload(4096)})).is_ok()
    );
    let e = resolve(json!({"provider": "ios", "devices": [TOKEN], "payload": payload(4097)}))
        .unwrap_err();
    assert_eq!(
        e,
        "payload: APNs allows at most 4096 bytes of JSON, got 4097"
    );
    let voip = |n| json!({"provider": "ios", "push_type": "voip", "devices": [TOKEN], "payload": payload(n)});
    assert!(resolve(voip(5120)).is_ok());
    assert!(
        decode(&job_with(voip(5121))).is_err(),
        "over the decoder's own limit"
    );
    let e = resolve(json!({"provider": "ios", "devices": [TOKEN], "payload": "hi"})).unwrap_err();
    assert!(
        e.starts_with("payload: must be a JSON object for APNs, got a string"),
        "{e}"
    );
}

#[test]
fn fcm_rules() {
    let fcm =
        |payload: serde_json::Value| resolve(json!({"provider": "android", "payload": payload}));
    assert!(fcm(json!({"notification": {"title": "Hi"}, "data": {"a": "1"}})).is_ok());
    assert_eq!(
        fcm(json!({"data": {"name": "x", "count": 3}})).unwrap_err(),
        "payload.data.count: FCM data values must be strings, got a number"
    );
    assert_eq!(
        fcm(json!({"data": {"a b": true}})).unwrap_err(),
        "payload.data[\"a b\"]: FCM data values must be strings, got a boolean"
    );
    assert_eq!(
        fcm(json!({"data": ["x"]})).unwrap_err(),
        "payload.data: FCM data must be an object of strings, got an array"
    );
    for key in ["token", "topic", "condition"] {
        let mut m = serde_json::Map::new();
        m.insert(key.to_string(), json!("x"));
        let e = fcm(serde_json::Value::Object(m)).unwrap_err();
        assert_eq!(
            e,
            format!("payload.{key}: pushpace adds the device token; an FCM payload must not hold token, topic or condition")
        );
    }
    // The whole message counts: the payload plus "token":"<longest token>",.
    let token = "t".repeat(150);
    let framing = r#"{"notification":{"body":""}}"#.len();
    let body = |n: usize| json!({"notification": {"body": "x".repeat(n)}});
    let room = 4096 - framing - r#""token":,"#.len() - (token.len() + 2);
    let at = |n| {
        resolve(json!({"provider": "android", "devices": ["short", token], "payload": body(n)}))
    };
    assert!(at(room).is_ok());
    assert_eq!(
        at(room + 1).unwrap_err(),
        "payload: the FCM message (this payload with the longest device token added) must be at most 4096 bytes, got 4097"
    );
    let sub = subscription("https://push.example.net/x");
    let e = resolve(json!({"provider": "android", "devices": ["tok", sub]})).unwrap_err();
    assert_eq!(
        e,
        "devices[1]: is a Web Push subscription; an FCM provider takes registration tokens"
    );
}

#[test]
fn webpush_rules() {
    let sub = subscription("https://push.example.net/x");
    let push = |devices: serde_json::Value, payload: serde_json::Value| {
        resolve(json!({"provider": "browser", "devices": devices, "payload": payload}))
    };
    assert!(push(json!([sub, sub]), json!({"title": "Hi"})).is_ok());
    let e = push(
        json!([sub, "https://push.example.net/secret-path"]),
        json!({}),
    )
    .unwrap_err();
    assert!(
        e.starts_with("devices[1]: a Web Push provider needs a subscription object")
            && !e.contains("secret-path"),
        "{e}"
    );
    let mut bad = sub.clone();
    bad["keys"]["p256dh"] = json!(b64(&[4u8; 33]));
    assert_eq!(
        push(json!([bad]), json!({})).unwrap_err(),
        "devices[0]: keys.p256dh is 33 bytes; an uncompressed P-256 point is 65 bytes starting 0x04"
    );
    let mut off_curve = [0u8; 65];
    off_curve[0] = 4;
    off_curve[1] = 1;
    bad["keys"]["p256dh"] = json!(b64(&off_curve));
    assert_eq!(
        push(json!([bad]), json!({})).unwrap_err(),
        "devices[0]: keys.p256dh is not a point on P-256"
    );
    let mut bad = sub.clone();
    bad["keys"]["auth"] = json!(b64(&[1u8; 12]));
    assert_eq!(
        push(json!([bad]), json!({})).unwrap_err(),
        "devices[0]: keys.auth is 12 bytes; it must be 16"
    );
    // A string payload counts its unescaped contents: 3993 quotes are 7986 bytes of JSON
    // escapes, over the decoder's limit, so use two-byte characters (no escape).
    assert!(push(json!([sub]), json!("é".repeat(3993 / 2))).is_ok());
    let e = push(json!([sub]), json!("é".repeat(1997))).unwrap_err();
    assert_eq!(
        e,
        "payload: Web Push allows at most 3993 bytes of plaintext, got 3994"
    );
    let escaped = json!("\"".repeat(2000));
    assert!(
        push(json!([sub]), escaped).is_ok(),
        "2000 bytes of plaintext"
    );
    let e = push(json!([sub]), json!({"t": "x".repeat(3990)})).unwrap_err();
    assert_eq!(
        e,
        "payload: Web Push allows at most 3993 bytes of plaintext, got 3998"
    );
}

#[test]
fn webhook_rules_are_as_before() {
    let e = resolve(json!({"payload": "text"})).unwrap_err();
    assert!(
        e.starts_with("payload: must be a JSON object for the webhook, got a string"),
        "{e}"
    );
    assert!(resolve(json!({"devices": ["any token at all"]})).is_ok());
}
