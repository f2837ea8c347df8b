//! The PUT body's checks (each bad field named, no secret echoed) and the fingerprints.

use super::model::{apns_fingerprint, vapid_public_key, Credentials};
use super::{parse_app, AppKind};
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use secrecy::{ExposeSecret, SecretString};
use serde_json::{json, Value};

fn p256_pem() -> String {
    let key = p256::SecretKey::random(&mut aes_gcm::aead::OsRng);
    key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
}

fn rsa_pem() -> String {
    use rsa::pkcs8::EncodePrivateKey;
    // 1024 bits: unit tests only, for speed.
    let key = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 1024).unwrap();
    key.to_pkcs8_pem(LineEnding::LF).unwrap().to_string()
}

fn good_body(apns_key: &str, rsa_key: &str, vapid: &str) -> Value {
    json!({
        "apns": {"key": apns_key, "key_id": "ABC123DEFG", "team_id": "TEAM123456",
                 "topic": "com.example.app", "environment": "sandbox", "max_rate": 500},
        "fcm": {"service_account": {
            "type": "service_account", "project_id": "example-app",
            "client_email": "push@example-app.iam.gserviceaccount.com",
            "private_key": rsa_key, "token_uri": "https://oauth2.googleapis.com/token"},
            "max_in_flight": 50},
        "webpush": {"vapid_key": vapid, "subject": "mailto:ops@example.com",
                    "adaptive": false},
    })
}

fn parse(v: &Value) -> Result<super::AppInput, super::FieldError> {
    parse_app(v.to_string().as_bytes())
}

#[test]
fn a_good_body_gives_each_kind_with_its_settings_and_fingerprint() {
    let (apns_key, rsa_key, vapid) = (p256_pem(), rsa_pem(), p256_pem());
    let app = parse(&good_body(&apns_key, &rsa_key, &vapid)).unwrap();
    let kinds: Vec<AppKind> = app.kinds().map(Credentials::kind).collect();
    assert_eq!(kinds, AppKind::ALL);
    let apns = app.apns.as_ref().unwrap();
    assert_eq!(apns.limits().max_rate, Some(500.0));
    let fp = apns.fingerprint();
    assert!(fp.starts_with("ABC123DEFG:sha256:"), "{fp}");
    assert_eq!(fp.len(), "ABC123DEFG:sha256:".len() + 16);
    let fcm = app.fcm.as_ref().unwrap();
    assert_eq!(
        fcm.fingerprint(),
        "push@example-app.iam.gserviceaccount.com"
    );
    assert_eq!(fcm.limits().max_in_flight, Some(50));
    let wp = app.webpush.as_ref().unwrap();
    let public = base64::Engine::decode(
        &base64::engine::general_purpose::URL_SAFE_NO_PAD,
        wp.fingerprint(),
    )
    .unwrap();
    assert_eq!((public.len(), public[0]), (65, 4), "an uncompressed point");
    // No Debug, fingerprint or stored setting holds a secret.
    for c in app.kinds() {
        let shown = format!("{c:?} {} {}", c.fingerprint(), c.settings_json());
        for secret in [&apns_key, &rsa_key, &vapid] {
            let body = secret.lines().nth(1).unwrap();
            assert!(!shown.contains(body), "{shown}");
        }
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    }
    // Stored parts read back into the same credentials.
    for c in app.kinds() {
        let back =
            Credentials::from_stored(c.kind(), &c.settings_json(), c.secret().clone()).unwrap();
        assert_eq!(back.fingerprint(), c.fingerprint());
        assert_eq!(back.settings_json(), c.settings_json());
    }
}

#[test]
fn fingerprints_are_stable_and_tell_keys_apart() {
    let (a, b) = (
        SecretString::from(p256_pem()),
        SecretString::from(p256_pem()),
    );
    let fa = apns_fingerprint("ABC123DEFG", &a).unwrap();
    assert_eq!(fa, apns_fingerprint("ABC123DEFG", &a).unwrap());
    assert_ne!(fa, apns_fingerprint("ABC123DEFG", &b).unwrap());
    // The same key in SEC1 PEM has the same VAPID public key.
    use p256::pkcs8::DecodePrivateKey;
    let key = p256::SecretKey::from_pkcs8_pem(a.expose_secret()).unwrap();
    let sec1 = SecretString::from(key.to_sec1_pem(LineEnding::LF).unwrap().to_string());
    assert_eq!(
        vapid_public_key("k", &a).unwrap(),
        vapid_public_key("k", &sec1).unwrap()
    );
}

/// Sets `path` (dotted) in `v` to `value` (`Value::Null` removes it).
fn set(v: &mut Value, path: &str, value: Value) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap();
    let mut at = v;
    for p in parts {
        at = at.get_mut(p).unwrap();
    }
    let map = at.as_object_mut().unwrap();
    if value.is_null() {
        map.remove(last);
    } else {
        map.insert(last.to_string(), value);
    }
}

#[test]
fn each_bad_field_is_named() {
    let (apns_key, rsa_key, vapid) = (p256_pem(), rsa_pem(), p256_pem());
    let rsa_as_apns = rsa_pem();
    let cases: Vec<(&str, Value, &str)> = vec![
        ("apns.key", json!(rsa_as_apns), "apns.key"),
        (
            "apns.key",
            json!("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----"),
            "apns.key",
        ),
        ("apns.key", Value::Null, "apns.key"),
        ("apns.key_id", json!("short"), "apns.key_id"),
        ("apns.team_id", json!(12), "apns.team_id"),
        ("apns.topic", json!("com.example app"), "apns.topic"),
        ("apns.environment", json!("staging"), "apns.environment"),
        (
            "apns.endpoint",
            json!("http://apns.example.com"),
            "apns.endpoint",
        ),
        (
            "apns.endpoint",
            json!("https://apns.example.com/3/device"),
            "apns.endpoint",
        ),
        ("apns.max_rate", json!(0), "apns.max_rate"),
        ("apns.max_rate", json!("fast"), "apns.max_rate"),
        ("apns.colour", json!("red"), "apns.colour"),
        ("fcm.service_account", json!(7), "fcm.service_account"),
        (
            "fcm.service_account",
            json!("{not json"),
            "fcm.service_account",
        ),
        (
            "fcm.service_account.project_id",
            Value::Null,
            "fcm.service_account.project_id",
        ),
        (
            "fcm.service_account.project_id",
            json!("a b"),
            "fcm.service_account.project_id",
        ),
        (
            "fcm.service_account.client_email",
            Value::Null,
            "fcm.service_account.client_email",
        ),
        (
            "fcm.service_account.client_email",
            json!("nobody"),
            "fcm.service_account.client_email",
        ),
        (
            "fcm.service_account.private_key",
            Value::Null,
            "fcm.service_account.private_key",
        ),
        (
            "fcm.service_account.private_key",
            json!(p256_pem()),
            "fcm.service_account.private_key",
        ),
        (
            "fcm.service_account.token_uri",
            Value::Null,
            "fcm.service_account.token_uri",
        ),
        (
            "fcm.service_account.token_uri",
            json!("http://oauth2.example.com/token"),
            "fcm.service_account.token_uri",
        ),
        ("fcm.max_in_flight", json!(0), "fcm.max_in_flight"),
        ("fcm.adaptive_decrease", json!(1.0), "fcm.adaptive_decrease"),
        ("webpush.vapid_key", json!(rsa_pem()), "webpush.vapid_key"),
        (
            "webpush.subject",
            json!("ops@example.com"),
            "webpush.subject",
        ),
        ("webpush.adaptive", json!("no"), "webpush.adaptive"),
        (
            "webpush.latency_target_ms",
            json!(600_001),
            "webpush.latency_target_ms",
        ),
        ("extra", json!({}), "extra"),
    ];
    for (path, value, field) in cases {
        let mut body = good_body(&apns_key, &rsa_key, &vapid);
        let shown_value = value.to_string();
        set(&mut body, path, value);
        let e = parse(&body)
            .err()
            .unwrap_or_else(|| panic!("{path} = {shown_value} accepted"));
        assert_eq!(e.field, field, "{path} = {shown_value}: {e}");
        // No refusal quotes a key.
        for secret in [&apns_key, &rsa_key, &vapid, &rsa_as_apns] {
            let body = secret.lines().nth(1).unwrap();
            assert!(!e.to_string().contains(body), "{e}");
        }
    }
    for (raw, field) in [
        ("[1]", "body"),
        ("{", "body"),
        ("{}", "body"),
        ("{\"apns\": 3}", "apns"),
    ] {
        assert_eq!(parse_app(raw.as_bytes()).unwrap_err().field, field, "{raw}");
    }
}

#[test]
fn stored_parts_that_do_not_match_are_refused() {
    let (apns_key, rsa_key, vapid) = (p256_pem(), rsa_pem(), p256_pem());
    let app = parse(&good_body(&apns_key, &rsa_key, &vapid)).unwrap();
    let wp = app.webpush.as_ref().unwrap();
    // Another VAPID key sealed under this app's public key.
    let e = Credentials::from_stored(
        AppKind::WebPush,
        &wp.settings_json(),
        SecretString::from(p256_pem()),
    )
    .unwrap_err();
    assert_eq!(e.field, "webpush.vapid_key");
    let e = Credentials::from_stored(
        AppKind::Apns,
        &json!({"key_id": 1}),
        SecretString::from(apns_key),
    )
    .unwrap_err();
    assert_eq!(e.field, "settings");
}
