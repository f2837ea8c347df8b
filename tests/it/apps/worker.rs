//! Jobs that name their app, through the real worker (broker, PostgreSQL, the APNs mock
//! over TLS, trusted through `apps.ca_file`). Each mock stands for one customer's team:
//! it accepts only JWTs signed with that team's key, so a device it accepted was sent
//! with its own app's credentials.
//!
//! - Two apps with different keys and teams each deliver their own devices, once each.
//! - An app registered while its jobs wait starts sending within 1 s of its PUT, with no
//!   restart; meanwhile its campaign shows `waiting for app X`.
//! - A key the provider refuses halts that app only (its campaign is not halted, the
//!   other app keeps sending); a PUT of the right key resumes it, nothing lost or sent
//!   twice.
//! - A deleted app's job is dead-lettered as `unknown_app`, the job kept whole.
//! - No secret in any answer of the API or in /metrics.

use super::{p256_pem, public_pem};
use crate::api::TestApp;
use crate::harness::{Producer, TestWorker};
use crate::helpers::wait_for;
use pushpace::apps::MasterKey;
use pushpace::job::Job;
use pushpace::limiter::Rate;
use pushpace::tools::mock::apns::{ApnsMock, MockApnsConfig};
use pushpace::tools::mock::tls::TestCa;
use serde_json::{json, Value};
use std::time::{Duration, Instant};

const TOPIC: &str = "com.example.shop";

/// PUT to first send: the issue's bound (the watcher sees the change within a second of
/// its commit, through LISTEN; measured well under 10 ms, docs/BENCHMARKS.md).
const PUT_TO_FIRST_SEND: Duration = Duration::from_secs(1);

/// A team's APNs: its mock, and the key and ids it trusts.
pub(super) struct Team {
    pub mock: ApnsMock,
    pub key: String,
    team_id: &'static str,
    key_id: &'static str,
}

impl Team {
    pub(super) fn start(ca: &TestCa, team_id: &'static str, key_id: &'static str) -> Team {
        let key = p256_pem();
        let config = MockApnsConfig::new(team_id, key_id, &public_pem(&key), TOPIC);
        let mock = ApnsMock::start(ca, config).expect("APNs mock");
        Team {
            mock,
            key,
            team_id,
            key_id,
        }
    }

    /// A PUT body for this team, signing with `key`.
    pub(super) fn body_with(&self, key: &str) -> String {
        json!({"apns": {"key": key, "key_id": self.key_id, "team_id": self.team_id,
                        "topic": TOPIC, "environment": "sandbox",
                        "endpoint": self.mock.url()}})
        .to_string()
    }

    pub(super) fn body(&self) -> String {
        self.body_with(&self.key)
    }

    /// Accepted notifications per token, and the most any token got.
    pub(super) fn delivered(&self) -> (usize, u32) {
        let tokens = self.mock.controls().delivered_tokens();
        (tokens.len(), tokens.values().copied().max().unwrap_or(0))
    }
}

pub(super) struct Rig {
    pub ca: TestCa,
    _dir: tempfile::TempDir,
    pub worker: TestWorker,
    pub api: TestApp,
    producer: Producer,
}

async fn rig() -> Rig {
    let key = MasterKey::generate().to_base64().to_string();
    rig_with(&[("apps.master_key", key)]).await
}

/// A worker with the API, trusting the mocks' CA for the apps, with `extra` settings
/// (its master keys among them).
pub(super) async fn rig_with(extra: &[(&str, String)]) -> Rig {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.ca_pem()).unwrap();
    let mut settings = vec![("apps.ca_file", ca_file.display().to_string())];
    settings.extend(extra.iter().cloned());
    let mut worker = TestWorker::options()
        .api()
        .settings(&settings)
        .spawn()
        .await;
    let api = worker.take_api();
    Rig {
        ca,
        _dir: dir,
        worker,
        api,
        producer: Producer::new(),
    }
}

/// `n` APNs tokens starting with `tag` (4 hex digits), unique per test run.
pub(super) fn tokens(tag: &str, n: usize) -> Vec<String> {
    let run = fastrand::u32(..);
    (0..n).map(|i| format!("{tag}{run:08x}{i:052x}")).collect()
}

pub(super) fn app_job_of(
    kind: &str,
    job_id: &str,
    campaign: &str,
    app: &str,
    rate: f64,
    devices: Vec<String>,
) -> Job {
    let payload = serde_json::value::RawValue::from_string(payload_for(kind).into()).unwrap();
    let mut job = Job::new(job_id, campaign, devices, payload)
        .unwrap()
        .with_app(Some(app.into()));
    job.provider = Some(kind.into());
    job.send_rate = Some(Rate::per_second(rate).unwrap());
    job
}

/// A payload each kind's rules (and its mock) accept.
fn payload_for(kind: &str) -> &'static str {
    match kind {
        "apns" => r#"{"aps":{"alert":"hi"}}"#,
        "fcm" => r#"{"notification":{"title":"hi"},"data":{"k":"v"}}"#,
        _ => r#"{"title":"hi"}"#,
    }
}

pub(super) fn app_job(
    job_id: &str,
    campaign: &str,
    app: &str,
    rate: f64,
    devices: Vec<String>,
) -> Job {
    app_job_of("apns", job_id, campaign, app, rate, devices)
}

impl Rig {
    pub(super) async fn produce(&self, job: &Job) {
        self.producer.job(&self.worker.topic, job, None).await;
    }

    pub(super) async fn put(&self, app: &str, body: &str) {
        let r = self.api.put(&format!("/api/apps/{app}"), body).await;
        assert!(matches!(r.status, 200 | 201), "{}", r.text);
    }

    /// A DELETE with the admin token.
    pub(super) async fn delete(&self, path: &str) -> crate::api::Reply {
        let auth = auth();
        self.api
            .request(reqwest::Method::DELETE, path, None, Some(&auth))
            .await
    }

    /// A GET with the admin token.
    pub(super) async fn get(&self, path: &str) -> crate::api::Reply {
        let auth = auth();
        self.api
            .request(reqwest::Method::GET, path, None, Some(&auth))
            .await
    }

    pub(super) async fn campaign(&self, id: &str) -> Value {
        let r = self.api.get(&format!("/api/campaigns/{id}")).await;
        assert_eq!(r.status, 200, "{}", r.text);
        r.body
    }

    /// Waits until `campaign`'s live view says it waits for its app, with `text` in the
    /// reason (the worker's snapshot is at most 500 ms old).
    pub(super) async fn wait_waiting(&self, campaign: &str, text: &str) {
        let what = format!("{campaign} waiting ({text})");
        wait_until_async(&what, Duration::from_secs(10), || async {
            let c = self.campaign(campaign).await;
            c["live"]["waiting_for_app"]
                .as_str()
                .is_some_and(|w| w.contains(text))
        })
        .await;
    }

    pub(super) async fn letters(&self, kind: &str) -> Vec<(String, Vec<u8>)> {
        sqlx::query_as("SELECT reason, raw FROM dead_letters WHERE kind = $1")
            .bind(kind)
            .fetch_all(&self.worker.pool)
            .await
            .unwrap()
    }

    /// Every text the API shows of the apps and campaigns, and /metrics.
    pub(super) async fn everything_shown(&self, campaigns: &[&str]) -> String {
        let mut all = String::new();
        let mut paths = vec!["/api/apps".to_string(), "/metrics".to_string()];
        for app in ["alpha", "beta"] {
            paths.push(format!("/api/apps/{app}"));
        }
        for c in campaigns {
            paths.push(format!("/api/campaigns/{c}"));
        }
        for p in paths {
            let shown = self.get(&p).await;
            assert_eq!(shown.status, 200, "{p}: {}", shown.text);
            all.push_str(&shown.text);
        }
        all
    }
}

pub(super) async fn wait_until_async<F, Fut>(what: &str, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) fn assert_no_secret(text: &str, keys: &[&str]) {
    assert!(!text.contains("-----BEGIN"), "PEM armour shown");
    for key in keys {
        for line in key
            .lines()
            .filter(|l| !l.starts_with("-----") && l.len() >= 16)
        {
            assert!(!text.contains(line), "a secret's line {line:?} shown");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_app_sends_with_its_own_key_and_a_new_app_starts_within_a_second() {
    let r = rig().await;
    let ca = &r.ca;
    let alpha = Team::start(ca, "TEAMAAAAAA", "KEYAAAAAAA");
    let beta = Team::start(ca, "TEAMBBBBBB", "KEYBBBBBBB");
    r.put("alpha", &alpha.body()).await;
    let (a_tokens, b_tokens) = (tokens("aaaa", 100), tokens("bbbb", 100));
    r.produce(&app_job("ja", "shop-a", "alpha", 200.0, a_tokens.clone()))
        .await;
    // beta is not registered yet: its job waits for it.
    r.produce(&app_job("jb", "shop-b", "beta", 200.0, b_tokens.clone()))
        .await;
    wait_for("alpha's devices", Duration::from_secs(30), || {
        alpha.delivered().0 == 100
    })
    .await;
    r.wait_waiting("shop-b", "waiting for app beta").await;
    let shown = r.campaign("shop-b").await;
    assert_eq!(shown["live"]["app_id"], "beta", "{shown}");
    assert_eq!(beta.mock.controls().requests(), 0);

    let put_at = Instant::now();
    r.put("beta", &beta.body()).await;
    wait_for("beta's first send", Duration::from_secs(10), || {
        beta.mock.controls().requests() > 0
    })
    .await;
    let first = beta.mock.controls().jwts()[0].first_seen;
    let took = first.saturating_duration_since(put_at);
    eprintln!("PUT to first send through it: {took:?}");
    assert!(took <= PUT_TO_FIRST_SEND, "{took:?}");
    wait_for("beta's devices", Duration::from_secs(30), || {
        beta.delivered().0 == 100
    })
    .await;

    // Each team's mock saw only its own app's devices, each once.
    assert_eq!(alpha.delivered(), (100, 1));
    assert_eq!(beta.delivered(), (100, 1));
    let a_seen = alpha.mock.controls().delivered_tokens();
    assert!(a_tokens.iter().all(|t| a_seen.contains_key(t)));
    let b_seen = beta.mock.controls().delivered_tokens();
    assert!(b_tokens.iter().all(|t| b_seen.contains_key(t)));
    assert_eq!(alpha.mock.controls().answers("InvalidProviderToken"), 0);
    assert_eq!(beta.mock.controls().answers("InvalidProviderToken"), 0);

    let shown = r.everything_shown(&["shop-a", "shop-b"]).await;
    assert!(
        shown.contains("app/alpha/apns"),
        "the metrics name the app's provider"
    );
    assert_no_secret(&shown, &[&alpha.key, &beta.key]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_key_halts_only_its_app_until_its_key_is_fixed() {
    let r = rig().await;
    let ca = &r.ca;
    let alpha = Team::start(ca, "TEAMAAAAAA", "KEYAAAAAAA");
    let beta = Team::start(ca, "TEAMBBBBBB", "KEYBBBBBBB");
    r.put("alpha", &alpha.body()).await;
    // beta's key is well formed, but not the one its team's APNs knows.
    let wrong = p256_pem();
    r.put("beta", &beta.body_with(&wrong)).await;
    let (a_tokens, b_tokens) = (tokens("aaaa", 400), tokens("bbbb", 100));
    r.produce(&app_job("jb", "shop-b", "beta", 100.0, b_tokens))
        .await;
    r.produce(&app_job("ja", "shop-a", "alpha", 100.0, a_tokens))
        .await;
    wait_until_async(
        "beta halted in the registry",
        Duration::from_secs(30),
        || async {
            let a = r.get("/api/apps/beta").await;
            a.body["credentials"]["apns"]["status"] == "halted"
        },
    )
    .await;
    let app = r.get("/api/apps/beta").await;
    let reason = app.body["credentials"]["apns"]["halted_reason"].as_str();
    assert!(
        reason.is_some_and(|r| r.contains("InvalidProviderToken")),
        "{}",
        app.text
    );
    let refusals = beta.mock.controls().answers("InvalidProviderToken");
    assert!(
        (1..=4).contains(&refusals),
        "probes before the halt: {refusals}"
    );
    // The campaign waits for its app (once the worker's snapshot, at most 500 ms old,
    // shows it); it is not halted itself.
    r.wait_waiting("shop-b", "halted").await;
    let c = r.campaign("shop-b").await;
    assert_eq!(c["status"], "active", "{c}");
    assert!(c["halt_reason"].is_null(), "{c}");
    // alpha goes on meanwhile.
    let before = alpha.delivered().0;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(alpha.delivered().0 > before, "alpha kept sending");
    assert_eq!(
        beta.mock.controls().answers("InvalidProviderToken"),
        refusals
    );

    // The right key: beta resumes, every device once, none failed.
    r.put("beta", &beta.body()).await;
    wait_for("beta's devices", Duration::from_secs(30), || {
        beta.delivered().0 == 100
    })
    .await;
    wait_for("alpha's devices", Duration::from_secs(30), || {
        alpha.delivered().0 == 400
    })
    .await;
    assert_eq!(beta.delivered(), (100, 1));
    assert_eq!(alpha.delivered(), (400, 1));
    let failed: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(failed), 0)::int8 FROM delivery_seconds WHERE campaign_id = 'shop-b'",
    )
    .fetch_one(&r.worker.pool)
    .await
    .unwrap();
    assert_eq!(failed, 0);
    assert!(r.letters("undeliverable").await.is_empty());
    assert_no_secret(
        &r.everything_shown(&["shop-a", "shop-b"]).await,
        &[&wrong, &beta.key],
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_apps_job_is_dead_lettered_whole_as_unknown_app() {
    let r = rig().await;
    let alpha = Team::start(&r.ca, "TEAMAAAAAA", "KEYAAAAAAA");
    r.put("alpha", &alpha.body()).await;
    // 10/s: most of it is still unsent when the app goes.
    r.produce(&app_job("ja", "shop-a", "alpha", 10.0, tokens("aaaa", 200)))
        .await;
    wait_for("alpha's first sends", Duration::from_secs(30), || {
        alpha.delivered().0 >= 5
    })
    .await;
    // Refused while its campaign sends through it, once the worker has published that
    // (about once a second).
    wait_until_async(
        "the campaign published",
        Duration::from_secs(10),
        || async {
            let n: i64 = sqlx::query_scalar("SELECT app_sending_campaigns('alpha')")
                .fetch_one(&r.worker.pool)
                .await
                .unwrap();
            n == 1
        },
    )
    .await;
    let d = r.delete("/api/apps/alpha").await;
    assert_eq!(d.status, 409, "{}", d.text);
    assert!(d.text.contains('1'), "names the campaigns: {}", d.text);
    let d = r.delete("/api/apps/alpha?force=true").await;
    assert!(matches!(d.status, 200 | 204), "{}", d.text);
    wait_until_async(
        "the unknown_app letter",
        Duration::from_secs(10),
        || async { !r.letters("unknown_app").await.is_empty() },
    )
    .await;
    let letters = r.letters("unknown_app").await;
    assert_eq!(letters.len(), 1, "one letter for the job");
    let (reason, raw) = &letters[0];
    assert!(reason.starts_with("app \"alpha\" was deleted"), "{reason}");
    let kept = pushpace::job::decode(raw).expect("the job is kept whole");
    assert_eq!(kept.devices.len(), 200);
    assert_eq!(kept.app_id.as_deref(), Some("alpha"));
    let sent = alpha.delivered().0;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(alpha.delivered().0, sent, "nothing sent after the delete");
}

pub(super) fn auth() -> String {
    format!("Bearer {}", crate::api::TOKEN)
}
