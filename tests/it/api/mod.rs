//! The HTTP API, metrics and CLI: every endpoint against a real server on port 0 with a
//! fresh database; `/metrics` against a real worker (null sender, real broker); the
//! `campaign` and `stats` commands run as the real binary against a running server.
//!
//! This file holds the shared harness (the app, its requests, seeding, the binary); the
//! tests are in the files below, by topic.

mod auth;
mod campaigns;
mod commands;
mod dead_letters;
mod health;
mod metrics;
mod series;

use crate::harness::TestWorker;
use crate::helpers::{brokers, fresh_database, pushpace_bin, test_settings, unique_name};
use chrono::{DateTime, TimeZone, Utc};
use pushpace::api::WorkerView;
use pushpace::limiter::Algorithm;
use pushpace::startup::{AppDeps, Application, RunningApplication};
use pushpace::tools::produce::ProducePlan;
use pushpace::worker::Worker;
use serde_json::Value;
use sqlx::PgPool;

pub const TOKEN: &str = "test-admin-token-0123456789";

/// A running API (no worker unless one is given) over a fresh database.
pub struct TestApp {
    pub app: RunningApplication,
    pub pool: PgPool,
    pub db_url: String,
    pub http: reqwest::Client,
}

pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    pub body: Value,
    pub text: String,
}

/// Status, headers and body (as JSON when it parses) of an answer.
async fn reply(res: reqwest::Response) -> Reply {
    let status = res.status().as_u16();
    let headers = res.headers().clone();
    let text = res.text().await.unwrap();
    let body = serde_json::from_str(&text).unwrap_or(Value::Null);
    Reply {
        status,
        headers,
        body,
        text,
    }
}

impl TestApp {
    pub fn url(&self, path: &str) -> String {
        format!("{}{path}", self.app.url())
    }

    pub async fn request(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<&str>,
        auth: Option<&str>,
    ) -> Reply {
        let mut req = self.http.request(method, self.url(path));
        if let Some(b) = body {
            req = req
                .header("content-type", "application/json")
                .body(b.to_string());
        }
        if let Some(a) = auth {
            req = req.header("authorization", a);
        }
        reply(req.send().await.expect("request reaches the server")).await
    }

    pub async fn get(&self, path: &str) -> Reply {
        self.request(reqwest::Method::GET, path, None, None).await
    }

    /// A GET with the admin token, for the reads that need it.
    pub async fn read(&self, path: &str) -> Reply {
        let auth = format!("Bearer {TOKEN}");
        self.request(reqwest::Method::GET, path, None, Some(&auth))
            .await
    }

    /// A GET naming `host` in its `Host` header instead of the address connected to.
    pub async fn get_with_host(&self, path: &str, host: &str) -> Reply {
        let res = self
            .http
            .get(self.url(path))
            .header(reqwest::header::HOST, host)
            .send()
            .await
            .expect("request reaches the server");
        reply(res).await
    }

    pub async fn put(&self, path: &str, body: &str) -> Reply {
        let auth = format!("Bearer {TOKEN}");
        self.request(reqwest::Method::PUT, path, Some(body), Some(&auth))
            .await
    }

    pub async fn post(&self, path: &str) -> Reply {
        let auth = format!("Bearer {TOKEN}");
        self.request(reqwest::Method::POST, path, None, Some(&auth))
            .await
    }
}

/// Settings for an API under test: port 0, the given token, database and broker.
pub fn app_settings(
    token: &str,
    db_url: &str,
    extra: &[(&str, String)],
) -> pushpace::config::Settings {
    let mut o = vec![
        ("http.bind", "127.0.0.1:0".to_string()),
        ("http.admin_token", token.to_string()),
        ("database.url", db_url.to_string()),
        ("kafka.brokers", brokers()),
    ];
    o.extend(extra.iter().cloned());
    test_settings(&o)
}

pub async fn spawn_app_on(
    pool: PgPool,
    db_url: String,
    token: &str,
    worker: Option<WorkerView>,
    bootstrap: Option<String>,
    extra: &[(&str, String)],
) -> TestApp {
    let settings = app_settings(token, &db_url, extra);
    let app = Application::build(
        &settings,
        AppDeps {
            pool: pool.clone(),
            worker,
            bootstrap,
        },
    )
    .await
    .expect("build the application")
    .spawn();
    TestApp {
        app,
        pool,
        db_url,
        http: reqwest::Client::new(),
    }
}

/// The API alone, with [`TOKEN`], over a fresh database.
pub async fn spawn_app() -> TestApp {
    let (pool, url) = fresh_database().await;
    spawn_app_on(pool, url, TOKEN, None, None, &[]).await
}

/// A worker with the null sender on the real broker, its jobs already produced, and the
/// API next to it. The metrics recorder is installed first, as `pushpace run` does.
pub struct WorkerApp {
    pub api: TestApp,
    pub worker: Option<Worker>,
    pub plan: ProducePlan,
}

pub async fn spawn_worker_app(campaigns: &[(f64, usize)]) -> WorkerApp {
    pushpace::metrics::install().expect("install the metrics recorder");
    let run_id = unique_name("api");
    let plan = ProducePlan::with_rates(&run_id, campaigns, 250, Some(Algorithm::Gcra)).unwrap();
    let mut tw = TestWorker::options()
        .partitions(2)
        .null_sender()
        .api()
        .spawn_with_plan(&plan)
        .await;
    WorkerApp {
        api: tw.take_api(),
        worker: Some(tw.take_worker()),
        plan,
    }
}

impl WorkerApp {
    pub async fn stop(mut self) {
        if let Some(w) = self.worker.take() {
            w.shutdown().await.expect("worker shutdown");
        }
        self.api.app.stop().await.expect("server stops");
    }
}

/// Adds per-second counts for a campaign straight into `delivery_seconds`.
pub async fn seed_seconds(pool: &PgPool, campaign: &str, rows: &[(DateTime<Utc>, i64, i64)]) {
    for (t, sent, failed) in rows {
        sqlx::query(
            "INSERT INTO delivery_seconds (campaign_id, second, sent, failed, retried) \
             VALUES ($1, $2, $3, $4, 0)",
        )
        .bind(campaign)
        .bind(t)
        .bind(sent)
        .bind(failed)
        .execute(pool)
        .await
        .unwrap();
    }
}

pub async fn recorded_sent(pool: &PgPool, campaign: &str) -> i64 {
    sqlx::query_scalar::<_, Option<i64>>(
        "SELECT sum(sent)::int8 FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(campaign)
    .fetch_one(pool)
    .await
    .unwrap()
    .unwrap_or(0)
}

fn second_now() -> DateTime<Utc> {
    Utc.timestamp_opt(Utc::now().timestamp(), 0).unwrap()
}

/// Runs the binary (blocking) off the async workers.
pub async fn cli(args: Vec<String>, env: Vec<(&'static str, String)>) -> (bool, String, String) {
    tokio::task::spawn_blocking(move || {
        let mut cmd = pushpace_bin();
        cmd.args(&args)
            .env_remove("PUSHPACE_ADMIN_TOKEN")
            .env_remove("PUSHPACE_API");
        for (k, v) in env {
            cmd.env(k, v);
        }
        crate::helpers::run_output(&mut cmd)
    })
    .await
    .unwrap()
}

pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}
