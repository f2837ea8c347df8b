//! The provider-level priority follows the campaign's class through the real worker
//! (issue 56): jobs produced to the real broker, the class stored through the API, and
//! the strict loopback mocks (TLS, ALPN h2) recording the `apns-priority` header, the
//! FCM body's `android.priority` and the Web Push `Urgency` header they received.
//!
//! A `critical` campaign sends with 10 / HIGH / high, a `bulk` one with 5 / NORMAL /
//! normal, a job's own `priority` wins over its class, and a `normal` campaign (stored
//! so, or never set) sends as before classes: no header, no `android` block.

use crate::api::TestApp;
use crate::harness::{Producer, Record, TestWorker};
use crate::helpers::unique_name;
use crate::providers_e2e::{wait_until, GROUP_JOIN};
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use pushpace::provider::apns::ApnsSender;
use pushpace::provider::fcm::FcmSender;
use pushpace::provider::settings::{ApnsEnvironment, ApnsSpec, CommonSpec, FcmSpec, WebPushSpec};
use pushpace::provider::webpush::{vapid, WebPushSender};
use pushpace::provider::{Provider, ProviderKind, Providers};
use pushpace::sender::{AnySender, Sender};
use pushpace::tools::mock::apns::{ApnsMock, MockApnsConfig};
use pushpace::tools::mock::fcm::FcmMock;
use pushpace::tools::mock::tls::TestCa;
use pushpace::tools::mock::webpush::WebPushMock;
use secrecy::SecretString;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

const TEAM: &str = "TEAM123456";
const KEY_ID: &str = "KEY1234567";
const TOPIC: &str = "com.example.app";
/// Devices per job: more than one, so that every send of a job is checked.
const DEVICES: usize = 3;

/// One campaign's class (stored through the API; `None`: never set) and its jobs' own
/// `priority`, with what each provider must receive.
struct Case {
    name: &'static str,
    class: Option<&'static str>,
    job_priority: Option<&'static str>,
    apns: Option<&'static str>,
    fcm: Option<&'static str>,
    urgency: Option<&'static str>,
}

const CASES: [Case; 5] = [
    Case {
        name: "critical",
        class: Some("critical"),
        job_priority: None,
        apns: Some("10"),
        fcm: Some("HIGH"),
        urgency: Some("high"),
    },
    Case {
        name: "bulk",
        class: Some("bulk"),
        job_priority: None,
        apns: Some("5"),
        fcm: Some("NORMAL"),
        urgency: Some("normal"),
    },
    Case {
        name: "bulk-own-high",
        class: Some("bulk"),
        job_priority: Some("high"),
        apns: Some("10"),
        fcm: Some("HIGH"),
        urgency: Some("high"),
    },
    Case {
        name: "normal",
        class: Some("normal"),
        job_priority: None,
        apns: None,
        fcm: None,
        urgency: None,
    },
    // A campaign the worker creates from its first job: the default class.
    Case {
        name: "unset",
        class: None,
        job_priority: None,
        apns: None,
        fcm: None,
        urgency: None,
    },
];

/// The three mocks, and the providers (`apns`, `fcm`, `webpush`) sending to them.
struct Mocks {
    _ca: TestCa,
    apns: ApnsMock,
    fcm: FcmMock,
    webpush: WebPushMock,
}

fn provider(name: &str, kind: ProviderKind, sender: impl Sender + 'static) -> Provider {
    Provider {
        name: Arc::from(name),
        kind,
        max_rate: None,
        max_in_flight: None,
        adaptive: Some(pushpace::provider::ceiling::CeilingParams::default()),
        sender: AnySender::Provider(Arc::new(sender)),
    }
}

fn start_mocks() -> (Mocks, Providers) {
    let ca = TestCa::new();
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let config = MockApnsConfig::new(TEAM, KEY_ID, &pair.public_key_pem(), TOPIC);
    let apns = ApnsMock::start(&ca, config).expect("APNs mock");
    let apns_spec = ApnsSpec {
        name: "apns".into(),
        team_id: TEAM.into(),
        key_id: KEY_ID.into(),
        key_pem: SecretString::from(pair.serialize_pem()),
        topic: TOPIC.into(),
        environment: ApnsEnvironment::Sandbox,
        endpoint: apns.url(),
        connections: 1,
        token_refresh: Duration::from_secs(50 * 60),
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let fcm = FcmMock::start(&ca).expect("FCM mock");
    let fcm_spec = FcmSpec {
        name: "fcm".into(),
        service_account: SecretString::from(fcm.service_account_json()),
        endpoint: fcm.url(),
        connections: 1,
        token_refresh_margin: Duration::from_secs(300),
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let webpush = WebPushMock::start(&ca).expect("Web Push mock");
    let key = p256::SecretKey::random(&mut aes_gcm::aead::OsRng);
    let pem = key.to_pkcs8_pem(LineEnding::LF).expect("pem").to_string();
    let webpush_spec = WebPushSpec {
        name: "webpush".into(),
        vapid_key_pem: SecretString::from(pem),
        vapid_subject: "mailto:ops@example.com".into(),
        vapid_lifetime: vapid::DEFAULT_LIFETIME,
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let providers = Providers::new(
        vec![
            provider(
                "apns",
                ProviderKind::Apns,
                ApnsSender::new(&apns_spec).expect("APNs sender"),
            ),
            provider(
                "fcm",
                ProviderKind::Fcm,
                FcmSender::new(&fcm_spec).expect("FCM sender"),
            ),
            provider(
                "webpush",
                ProviderKind::WebPush,
                WebPushSender::new(&webpush_spec).expect("Web Push sender"),
            ),
        ],
        "apns",
    )
    .expect("providers");
    let mocks = Mocks {
        _ca: ca,
        apns,
        fcm,
        webpush,
    };
    (mocks, providers)
}

/// A 64-hex-digit APNs token (`f0…` is none of the mock's error markers).
fn apns_token() -> String {
    format!(
        "f0{:032x}{:030x}",
        fastrand::u128(..),
        fastrand::u128(..) >> 8
    )
}

/// The devices of one case's jobs, and the keys the mocks record them under.
struct CaseDevices {
    apns: Vec<String>,
    fcm: Vec<String>,
    /// (subscription JSON, the mock's subscription id).
    webpush: Vec<(String, String)>,
}

impl CaseDevices {
    fn new(mocks: &Mocks, name: &str) -> Self {
        CaseDevices {
            apns: (0..DEVICES).map(|_| apns_token()).collect(),
            fcm: (0..DEVICES)
                .map(|i| format!("fcm-{name}-{i}-{:08x}", fastrand::u32(..)))
                .collect(),
            webpush: (0..DEVICES).map(|_| mocks.webpush.subscribe()).collect(),
        }
    }
}

/// A job of `campaign` for `provider`, with the case's own `priority` if it has one.
fn job(campaign: &str, provider: &str, devices: Vec<Value>, case: &Case) -> Value {
    let payload = match provider {
        "apns" => json!({"aps": {"alert": "hi"}}),
        "fcm" => json!({"data": {"k": "v"}}),
        _ => json!("hi"),
    };
    let mut job = json!({
        "job_id": format!("{campaign}-j"),
        "campaign_id": campaign,
        "provider": provider,
        "send_rate": 50,
        "devices": devices,
        "payload": payload,
    });
    if let Some(p) = case.job_priority {
        job["priority"] = json!(p);
    }
    job
}

/// Stores the case's class for `campaign` through `PUT /api/campaigns/{id}`, before any
/// job of it is produced, and checks the store kept it.
async fn store_class(api: &TestApp, campaign: &str, class: &str) {
    let body = json!({"send_rate": 50, "priority": class}).to_string();
    let r = api.put(&format!("/api/campaigns/{campaign}"), &body).await;
    assert_eq!(r.status, 201, "PUT {campaign}: {}", r.text);
    assert_eq!(r.body["priority"], class, "the stored class: {}", r.text);
}

/// What each mock received, by device.
struct Seen {
    apns: HashMap<String, Option<String>>,
    fcm: HashMap<String, Option<String>>,
    urgency: HashMap<String, Option<String>>,
}

fn seen(mocks: &Mocks) -> Seen {
    let apns = mocks.apns.controls().delivered();
    let apns = apns.into_iter().map(|p| (p.token, p.priority)).collect();
    let fcm = mocks
        .fcm
        .bodies()
        .into_iter()
        .map(|b| {
            let m = &b["message"];
            let token = m["token"].as_str().unwrap_or_default().to_string();
            let p = m["android"]["priority"].as_str().map(str::to_string);
            (token, p)
        })
        .collect();
    let urgency = mocks.webpush.requests();
    let urgency = urgency
        .into_iter()
        .filter(|r| r.status < 300)
        .map(|r| (r.id, r.urgency))
        .collect();
    Seen { apns, fcm, urgency }
}

fn all_received(seen: &Seen, devices: &[CaseDevices]) -> bool {
    devices.iter().all(|d| {
        d.apns.iter().all(|t| seen.apns.contains_key(t))
            && d.fcm.iter().all(|t| seen.fcm.contains_key(t))
            && d.webpush
                .iter()
                .all(|(_, id)| seen.urgency.contains_key(id))
    })
}

/// Every send of `case` carried the priority its class (or its job) asks for.
fn assert_case(seen: &Seen, case: &Case, devices: &CaseDevices) {
    let name = case.name;
    for t in &devices.apns {
        let got = seen.apns[t].as_deref();
        assert_eq!(got, case.apns, "{name}: apns-priority for {t}");
    }
    for t in &devices.fcm {
        let got = seen.fcm[t].as_deref();
        assert_eq!(got, case.fcm, "{name}: FCM android.priority for {t}");
    }
    for (_, id) in &devices.webpush {
        let got = seen.urgency[id].as_deref();
        assert_eq!(got, case.urgency, "{name}: Web Push Urgency for {id}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_provider_priority_follows_the_campaign_class() {
    let (mocks, providers) = start_mocks();
    let mut tw = TestWorker::options()
        .providers(providers)
        .api()
        .spawn()
        .await;
    let api = tw.take_api();
    let producer = Producer::new();
    let run = unique_name("prio").replace('_', "-");
    let mut all = Vec::new();
    for case in &CASES {
        let devices = CaseDevices::new(&mocks, case.name);
        let subscriptions = devices.webpush.iter().map(|(sub, _)| {
            let sub: Value = serde_json::from_str(sub).expect("subscription JSON");
            sub
        });
        let lists: [(&str, Vec<Value>); 3] = [
            ("apns", devices.apns.iter().map(|t| json!(t)).collect()),
            ("fcm", devices.fcm.iter().map(|t| json!(t)).collect()),
            ("webpush", subscriptions.collect()),
        ];
        for (provider, list) in lists {
            let campaign = format!("{run}-{}-{provider}", case.name);
            if let Some(class) = case.class {
                store_class(&api, &campaign, class).await;
            }
            let text = job(&campaign, provider, list, case).to_string();
            producer.send(&tw.topic, Record::of(text.as_bytes())).await;
        }
        all.push(devices);
    }
    wait_until("every device received", GROUP_JOIN, || {
        let done = all_received(&seen(&mocks), &all);
        async move { done }
    })
    .await;
    let seen = seen(&mocks);
    for (case, devices) in CASES.iter().zip(&all) {
        assert_case(&seen, case, devices);
    }
    api.app.stop().await.expect("API stops");
    tw.stop().await;
}
