//! `POST /api/apps/{id}/check` and `pushpace apps check` against the loopback APNs and
//! FCM mocks over real TLS (trusted through `apps.ca_file`): an app with good
//! credentials passes every kind; a wrong service-account key is refused by the token
//! endpoint and an unreachable APNs endpoint fails, each naming why, while the other
//! kinds of the same app still pass. No answer holds a secret.

use super::{rsa_pem, Secrets};
use crate::api::{args, cli, spawn_app_on, TestApp, TOKEN};
use crate::helpers::fresh_database;
use pushpace::apps::MasterKey;
use pushpace::tools::mock::apns::{ApnsMock, MockApnsConfig};
use pushpace::tools::mock::fcm::FcmMock;
use pushpace::tools::mock::tls::TestCa;
use serde_json::{json, Value};

struct Mocks {
    _ca: TestCa,
    _dir: tempfile::TempDir,
    apns: ApnsMock,
    fcm: FcmMock,
    app: TestApp,
}

async fn setup(s: &Secrets) -> Mocks {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.ca_pem()).unwrap();
    let public = super::public_pem(&s.apns_key);
    let apns_config = MockApnsConfig::new("TEAM123456", "ABC123DEFG", &public, "com.example.app");
    let apns = ApnsMock::start(&ca, apns_config).expect("APNs mock");
    let fcm = FcmMock::start(&ca).expect("FCM mock");
    let (pool, url) = fresh_database().await;
    let key = MasterKey::generate().to_base64().to_string();
    let extra = [
        ("apps.master_key", key),
        ("apps.ca_file", ca_file.display().to_string()),
    ];
    let app = spawn_app_on(pool, url, TOKEN, None, None, &extra).await;
    Mocks {
        _ca: ca,
        _dir: dir,
        apns,
        fcm,
        app,
    }
}

fn body(s: &Secrets, apns_endpoint: &str, account: Value, fcm_endpoint: &str) -> String {
    json!({
        "apns": {"key": s.apns_key, "key_id": "ABC123DEFG", "team_id": "TEAM123456",
                 "topic": "com.example.app", "environment": "sandbox",
                 "endpoint": apns_endpoint},
        "fcm": {"service_account": account, "endpoint": fcm_endpoint},
        "webpush": {"vapid_key": s.vapid_key, "subject": "mailto:ops@example.com"},
    })
    .to_string()
}

fn kind<'a>(answer: &'a Value, kind: &str) -> &'a Value {
    answer["kinds"]
        .as_array()
        .and_then(|ks| ks.iter().find(|k| k["kind"] == kind))
        .unwrap_or_else(|| panic!("no {kind} in {answer}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn check_makes_each_kinds_round_trip_and_names_what_fails() {
    let s = Secrets::new();
    let m = setup(&s).await;
    let good_account: Value = serde_json::from_str(&m.fcm.service_account_json()).unwrap();
    let r = m
        .app
        .put(
            "/api/apps/good",
            &body(&s, &m.apns.url(), good_account.clone(), &m.fcm.url()),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);

    let r = m.app.post("/api/apps/good/check").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["ok"], true, "{}", r.text);
    for k in ["apns", "fcm", "webpush"] {
        assert_eq!(kind(&r.body, k)["ok"], true, "{k}: {}", r.text);
    }
    assert!(
        kind(&r.body, "apns")["detail"]
            .as_str()
            .unwrap()
            .contains("team TEAM123456 key ABC123DEFG"),
        "{}",
        r.text
    );
    assert_eq!(m.fcm.grants(), 1, "one OAuth token fetched for the check");
    assert_eq!(
        m.apns.controls().requests(),
        0,
        "a check sends no notification"
    );
    let mut answers = vec![r.text];

    // Another key under the mock's client_email: the token endpoint refuses the
    // assertion. A closed port stands for an APNs endpoint that is down.
    let mut wrong_account = good_account;
    wrong_account["private_key"] = Value::String(rsa_pem().to_string());
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let closed_url = format!("https://127.0.0.1:{}", closed.local_addr().unwrap().port());
    drop(closed);
    let r = m
        .app
        .put(
            "/api/apps/broken",
            &body(&s, &closed_url, wrong_account, &m.fcm.url()),
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = m.app.post("/api/apps/broken/check").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["ok"], false, "{}", r.text);
    let apns = kind(&r.body, "apns");
    assert_eq!(apns["ok"], false, "{}", r.text);
    assert!(
        apns["detail"].as_str().unwrap().contains("127.0.0.1"),
        "{}",
        r.text
    );
    let fcm = kind(&r.body, "fcm");
    assert_eq!(fcm["ok"], false, "{}", r.text);
    assert_eq!(kind(&r.body, "webpush")["ok"], true, "{}", r.text);
    assert_eq!(m.fcm.grants(), 1, "no token granted for the wrong key");
    answers.push(r.text);

    let r = m.app.post("/api/apps/nobody/check").await;
    assert_eq!(r.status, 404, "{}", r.text);
    let r = m
        .app
        .request(reqwest::Method::POST, "/api/apps/good/check", None, None)
        .await;
    assert_eq!(r.status, 401, "{}", r.text);

    let api = m.app.app.url();
    let env = || vec![("PUSHPACE_ADMIN_TOKEN", TOKEN.to_string())];
    let (ok, out, err) = cli(args(&["apps", "check", "good", "--api", &api]), env()).await;
    assert!(ok, "{out}{err}");
    assert!(out.contains("good fcm: ok"), "{out}");
    answers.push(out);
    let (ok, out, err) = cli(args(&["apps", "check", "broken", "--api", &api]), env()).await;
    assert!(!ok, "a failed check exits non-zero: {out}{err}");
    assert!(err.contains("broken apns: FAILED"), "{err}");
    assert!(err.contains("broken webpush: ok"), "{err}");
    answers.push(err);
    for a in &answers {
        s.assert_absent(a);
        assert!(!a.contains(rsa_pem().lines().nth(1).unwrap()), "{a}");
    }
}
