//! `pushpace run` as a real process, logging at debug, while apps send: one app with a
//! key its APNs refuses (it halts, then a PUT of the right key resumes it) and one that
//! sends throughout. No secret (an APNs key, the master key) is in any log line of the
//! run, nor in the API's answers about the apps and their campaigns.

use super::worker::{app_job, assert_no_secret, tokens, Team};
use crate::api::TOKEN;
use crate::harness::Producer;
use crate::helpers::{
    free_port, fresh_database, fresh_topic, sigterm_and_wait, spawn_logged, unique_name, wait_for,
    worker_log,
};
use pushpace::apps::MasterKey;
use pushpace::tools::mock::tls::TestCa;
use std::time::{Duration, Instant};

struct Api {
    base: String,
    http: reqwest::Client,
}

impl Api {
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<String>,
    ) -> (u16, String) {
        let mut req = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(TOKEN);
        if let Some(b) = body {
            req = req.header("content-type", "application/json").body(b);
        }
        match req.send().await {
            Ok(r) => {
                let status = r.status().as_u16();
                (status, r.text().await.unwrap_or_default())
            }
            Err(_) => (0, String::new()),
        }
    }

    async fn get(&self, path: &str) -> (u16, String) {
        self.call(reqwest::Method::GET, path, None).await
    }

    async fn put(&self, path: &str, body: String) {
        let (status, text) = self.call(reqwest::Method::PUT, path, Some(body)).await;
        assert!(matches!(status, 200 | 201), "PUT {path}: {status} {text}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_secret_reaches_the_log_of_a_run_with_apps() {
    let ca = TestCa::new();
    let dir = tempfile::tempdir().unwrap();
    let ca_file = dir.path().join("ca.pem");
    std::fs::write(&ca_file, ca.ca_pem()).unwrap();
    let (alpha, beta) = (
        Team::start(&ca, "TEAMAAAAAA", "KEYAAAAAAA"),
        Team::start(&ca, "TEAMBBBBBB", "KEYBBBBBBB"),
    );
    let wrong = super::p256_pem();
    let master = MasterKey::generate().to_base64().to_string();
    let (_pool, db_url) = fresh_database().await;
    let topic = fresh_topic(1).await;
    let port = free_port();
    let bind = format!("127.0.0.1:{port}");
    let ca_path = ca_file.display().to_string();
    let env = [
        ("PUSHPACE__APPS__MASTER_KEY", master.as_str()),
        ("PUSHPACE__APPS__CA_FILE", ca_path.as_str()),
        ("PUSHPACE__HTTP__ADMIN_TOKEN", TOKEN),
        ("PUSHPACE__HTTP__BIND", bind.as_str()),
    ];
    let name = unique_name("apps-run");
    // The static provider is never used: every job names an app.
    let mut child = spawn_logged(
        &topic,
        &unique_name("g"),
        &db_url,
        "http://127.0.0.1:9",
        &env,
        &name,
    );
    let api = Api {
        base: format!("http://{bind}"),
        http: reqwest::Client::new(),
    };
    let end = Instant::now() + Duration::from_secs(60);
    while api.get("/healthz").await.0 != 200 {
        assert!(Instant::now() < end, "pushpace run did not start");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.put("/api/apps/alpha", alpha.body()).await;
    api.put("/api/apps/beta", beta.body_with(&wrong)).await;
    let producer = Producer::new();
    producer
        .job(
            &topic,
            &app_job("ja", "c-a", "alpha", 100.0, tokens("aaaa", 100)),
            None,
        )
        .await;
    producer
        .job(
            &topic,
            &app_job("jb", "c-b", "beta", 100.0, tokens("bbbb", 50)),
            None,
        )
        .await;
    wait_for("alpha's devices", Duration::from_secs(60), || {
        alpha.delivered().0 == 100
    })
    .await;
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, text) = api.get("/api/apps/beta").await;
        if text.contains("\"status\":\"halted\"") {
            break;
        }
        assert!(Instant::now() < end, "beta never halted: {text}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    api.put("/api/apps/beta", beta.body()).await;
    wait_for("beta's devices", Duration::from_secs(30), || {
        beta.delivered().0 == 50
    })
    .await;
    let mut shown = String::new();
    for path in [
        "/api/apps",
        "/api/apps/alpha",
        "/api/apps/beta",
        "/api/campaigns/c-a",
        "/api/campaigns/c-b",
        "/api/providers",
        "/metrics",
    ] {
        let (status, text) = api.get(path).await;
        assert_eq!(status, 200, "{path}: {text}");
        shown.push_str(&text);
    }
    let status = sigterm_and_wait(&mut child);
    assert!(status.success(), "pushpace run exited {status}");
    let log = std::fs::read_to_string(worker_log(&name)).unwrap();
    // The log is the run's: it names the apps' providers and the halt.
    assert!(log.contains("app provider installed"), "{log}");
    assert!(log.contains("app halted"), "{log}");
    for text in [&log, &shown] {
        assert_no_secret(text, &[&alpha.key, &beta.key, &wrong]);
        assert!(!text.contains(&master), "the master key was shown");
    }
}
