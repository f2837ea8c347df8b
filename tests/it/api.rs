//! The HTTP API, metrics and CLI: every endpoint against a real server on port 0 with a
//! fresh database; `/metrics` against a real worker (null sender, real broker); the
//! `campaign` and `stats` commands run as the real binary against a running server.

use crate::harness::TestWorker;
use crate::helpers::{
    brokers, free_port, fresh_database, pg_server, pushpace_bin, test_settings, unique_name,
};
use chrono::{DateTime, Duration as ChronoDuration, TimeZone, Utc};
use pushpace::api::WorkerView;
use pushpace::limiter::Algorithm;
use pushpace::startup::{AppDeps, Application, RunningApplication};
use pushpace::store::{DeadLetter, DeadLetterKind};
use pushpace::tools::produce::ProducePlan;
use pushpace::worker::Worker;
use serde_json::{json, Value};
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::{Duration, Instant};

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_and_readiness_report_each_check_by_name() {
    let app = spawn_app().await;
    let r = app.get("/healthz").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "ok");

    let r = app.get("/readyz").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["ready"], true);
    for check in ["broker", "postgres", "migrations"] {
        assert_eq!(r.body["checks"][check]["ok"], true, "{check}: {}", r.text);
    }
    let n = pushpace::store::MIGRATOR.iter().count();
    assert_eq!(
        r.body["checks"]["migrations"]["detail"],
        format!("{n} of {n} applied")
    );

    // A broker nobody listens on: not ready, and the broker check says why.
    let (pool, url) = fresh_database().await;
    let dead = format!("127.0.0.1:{}", free_port());
    let lonely = spawn_app_on(pool, url, TOKEN, None, Some(dead), &[]).await;
    let r = lonely.get("/readyz").await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.body["ready"], false);
    assert_eq!(r.body["checks"]["broker"]["ok"], false);
    assert!(!r.body["checks"]["broker"]["detail"]
        .as_str()
        .unwrap()
        .is_empty());
    assert_eq!(r.body["checks"]["postgres"]["ok"], true);
    assert_eq!(r.body["checks"]["migrations"]["ok"], true);

    // A database that was never migrated.
    let url = format!("{}/{}", pg_server(), unique_name("pushpace_unmigrated"));
    pushpace::store::ensure_database(&url).await.unwrap();
    let pool = pushpace::store::connect(&url, 2, Duration::from_secs(5))
        .await
        .unwrap();
    let bare = spawn_app_on(pool.clone(), url, TOKEN, None, None, &[]).await;
    let r = bare.get("/readyz").await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.body["checks"]["migrations"]["ok"], false);
    assert!(
        r.body["checks"]["migrations"]["detail"]
            .as_str()
            .unwrap()
            .contains("pushpace migrate"),
        "{}",
        r.text
    );
    // Half migrated: the missing versions are named.
    let first = pushpace::store::MIGRATOR.iter().next().unwrap();
    sqlx::raw_sql(&first.sql).execute(&pool).await.unwrap();
    sqlx::query(
        "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
         checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, $2, true, $3, 0)",
    )
    .bind(first.version)
    .bind(&*first.description)
    .bind(&*first.checksum)
    .execute(&pool)
    .await
    .unwrap();
    let r = bare.get("/readyz").await;
    assert_eq!(r.status, 503);
    let detail = r.body["checks"]["migrations"]["detail"].as_str().unwrap();
    let last = pushpace::store::MIGRATOR.iter().last().unwrap();
    assert!(detail.starts_with("not applied: "), "{detail}");
    assert!(detail.contains(&last.version.to_string()), "{detail}");
    assert!(!detail.contains(&format!("{},", first.version)), "{detail}");

    for a in [app, lonely, bare] {
        a.app.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_need_the_admin_token() {
    let app = spawn_app().await;
    let body = r#"{"send_rate": 10}"#;
    let put = |auth: Option<&'static str>| {
        let app = &app;
        async move {
            app.request(
                reqwest::Method::PUT,
                "/api/campaigns/guarded",
                Some(body),
                auth,
            )
            .await
        }
    };
    let r = put(None).await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert!(r.body["error"].as_str().unwrap().contains("Bearer"));
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    let r = put(Some("Basic dGVzdDp0ZXN0")).await;
    assert_eq!(r.status, 401);
    let r = put(Some("Bearer not-the-token")).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.body["error"].as_str().unwrap().contains("does not match"));
    // Same length, one byte off.
    let mut wrong = TOKEN.to_string();
    wrong.pop();
    wrong.push('X');
    let r = app
        .request(
            reqwest::Method::PUT,
            "/api/campaigns/guarded",
            Some(body),
            Some(&format!("Bearer {wrong}")),
        )
        .await;
    assert_eq!(r.status, 403);
    for path in [
        "/api/campaigns/guarded/pause",
        "/api/campaigns/guarded/resume",
    ] {
        let r = app.request(reqwest::Method::POST, path, None, None).await;
        assert_eq!(r.status, 401, "{path}");
        let r = app
            .request(reqwest::Method::POST, path, None, Some("Bearer nope"))
            .await;
        assert_eq!(r.status, 403, "{path}");
    }
    // Nothing was written by the refused requests.
    assert_eq!(app.get("/api/campaigns/guarded").await.status, 404);
    let r = app.put("/api/campaigns/guarded", body).await;
    assert_eq!(r.status, 201, "{}", r.text);

    // No token configured: every change is refused, saying how to set one.
    let (pool, url) = fresh_database().await;
    let open = spawn_app_on(pool, url, "", None, None, &[]).await;
    for auth in [
        None,
        Some(format!("Bearer {TOKEN}")),
        Some("Bearer ".into()),
    ] {
        let r = open
            .request(
                reqwest::Method::PUT,
                "/api/campaigns/x",
                Some(body),
                auth.as_deref(),
            )
            .await;
        assert_eq!(r.status, 403, "{}", r.text);
        let msg = r.body["error"].as_str().unwrap();
        assert!(msg.contains("PUSHPACE__HTTP__ADMIN_TOKEN"), "{msg}");
        assert!(msg.contains("http.admin_token"), "{msg}");
    }
    // Reads need no token, except the dead letters, which are refused like changes.
    assert_eq!(open.get("/api/campaigns").await.status, 200);
    let r = open.get("/api/dead-letters").await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.body["error"]
        .as_str()
        .unwrap()
        .contains("http.admin_token"));
    app.app.stop().await.unwrap();
    open.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_creates_then_updates_and_names_the_bad_field() {
    let app = spawn_app().await;
    let r = app
        .put(
            "/api/campaigns/spring-sale",
            r#"{"send_rate": 750, "algorithm": "token-bucket", "burst": 10}"#,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["id"], "spring-sale");
    assert_eq!(r.body["send_rate"], 750.0);
    assert_eq!(r.body["algorithm"], "token-bucket");
    assert_eq!(r.body["burst"], 10);
    assert_eq!(r.body["weight"], 1.0, "the default weight");
    assert_eq!(r.body["status"], "active");
    assert_eq!(r.body["active"], false, "no worker in this process");
    assert!(r.body["live"].is_null());

    // Fields left out keep their values.
    let r = app
        .put("/api/campaigns/spring-sale", r#"{"send_rate": 500.5}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["send_rate"], 500.5);
    assert_eq!(r.body["algorithm"], "token-bucket");
    assert_eq!(r.body["burst"], 10);
    let r = app.put("/api/campaigns/spring-sale", "{}").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["send_rate"], 500.5);
    let r = app
        .put("/api/campaigns/spring-sale", r#"{"weight": 3}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["weight"], 3.0);
    assert_eq!(r.body["send_rate"], 500.5, "a weight alone keeps the rate");
    // A new campaign with nothing given takes the configured defaults.
    let r = app.put("/api/campaigns/plain", "").await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["send_rate"], 100.0);
    assert_eq!(r.body["algorithm"], "gcra");

    let bad: &[(&str, &str)] = &[
        (r#"{"send_rate": 0}"#, "send_rate"),
        (r#"{"send_rate": -5}"#, "send_rate"),
        (r#"{"send_rate": 1e12}"#, "send_rate"),
        (r#"{"send_rate": "fast"}"#, "send_rate"),
        (r#"{"send_rate": null}"#, "send_rate"),
        (r#"{"algorithm": "magic"}"#, "algorithm"),
        (r#"{"algorithm": 3}"#, "algorithm"),
        (r#"{"burst": -1}"#, "burst"),
        (r#"{"burst": 1.5}"#, "burst"),
        (r#"{"burst": 1099511627776}"#, "burst"),
        (r#"{"burst": 10001}"#, "burst"),
        (r#"{"burst": 2147483647}"#, "burst"),
        (r#"{"send_rate": 0.0009}"#, "send_rate"),
        (r#"{"send_rate": 1e-300}"#, "send_rate"),
        (r#"{"sendrate": 10}"#, "sendrate"),
        (r#"{"weight": 0}"#, "weight"),
        (r#"{"weight": 0.009}"#, "weight"),
        (r#"{"weight": 100.5}"#, "weight"),
        (r#"{"weight": "heavy"}"#, "weight"),
        (r#"{"weight": null}"#, "weight"),
        (r#"[750]"#, "body"),
        (r#"{"send_rate": 10"#, "body"),
    ];
    for (body, field) in bad {
        let r = app.put("/api/campaigns/spring-sale", body).await;
        assert_eq!(r.status, 422, "{body}: {}", r.text);
        assert_eq!(r.body["field"], *field, "{body}: {}", r.text);
        let msg = r.body["error"].as_str().unwrap();
        assert!(msg.contains(field), "{body}: {msg}");
    }
    let long_id = "x".repeat(129);
    let r = app
        .put(&format!("/api/campaigns/{long_id}"), r#"{"send_rate": 5}"#)
        .await;
    assert_eq!(r.status, 400, "{}", r.text);
    assert_eq!(r.body["field"], "id");
    // The bounds themselves are accepted.
    let r = app
        .put(
            "/api/campaigns/edges",
            r#"{"send_rate": 0.001, "burst": 10000, "weight": 0.01}"#,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["send_rate"], 0.001);
    assert_eq!(r.body["burst"], 10000);
    assert_eq!(r.body["weight"], 0.01);
    let r = app.put("/api/campaigns/edges", r#"{"weight": 100}"#).await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["weight"], 100.0);
    // Too large a body.
    let huge = format!(r#"{{"send_rate": 5, "pad": "{}"}}"#, "x".repeat(20_000));
    let r = app.put("/api/campaigns/spring-sale", &huge).await;
    assert_eq!(r.status, 413, "{}", r.text);
    assert!(r.body["error"].as_str().unwrap().contains("16384"));

    // None of the refused requests changed anything.
    let r = app.get("/api/campaigns/spring-sale").await;
    assert_eq!(r.body["send_rate"], 500.5);
    assert_eq!(r.body["algorithm"], "token-bucket");
    assert_eq!(r.body["burst"], 10);
    assert_eq!(r.body["weight"], 3.0);
    let ids: Vec<String> = sqlx::query_scalar("SELECT id FROM campaigns ORDER BY id")
        .fetch_all(&app.pool)
        .await
        .unwrap();
    assert_eq!(ids, ["edges", "plain", "spring-sale"]);
    app.app.stop().await.unwrap();
}

/// The migration that sets the rate minimum and the burst maximum moves rows stored
/// outside them to the nearest bound, then refuses such values from then on.
#[tokio::test]
async fn the_rate_minimum_migration_raises_old_rows_then_holds() {
    let url = format!("{}/{}", pg_server(), unique_name("pushpace_minrate"));
    pushpace::store::ensure_database(&url).await.unwrap();
    let pool = pushpace::store::connect(&url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    const VERSION: i64 = 20261125000300;
    // The migrations' own SQL, run in order: those before it, some rows, then it.
    let sql_of = |keep: &dyn Fn(i64) -> bool| -> Vec<String> {
        pushpace::store::MIGRATOR
            .iter()
            .filter(|m| !m.migration_type.is_down_migration() && keep(m.version))
            .map(|m| m.sql.to_string())
            .collect()
    };
    for sql in sql_of(&|v| v < VERSION) {
        sqlx::raw_sql(&sql).execute(&pool).await.unwrap();
    }
    for (id, rate, burst) in [
        ("tiny", 1e-300, 0),
        ("slow", 0.0005, 2_147_483_647),
        ("fine", 0.25, 10),
    ] {
        sqlx::query(
            "INSERT INTO campaigns (id, send_rate, algorithm, burst) VALUES ($1, $2, 'gcra', $3)",
        )
        .bind(id)
        .bind(rate)
        .bind(burst)
        .execute(&pool)
        .await
        .unwrap();
    }
    let this = sql_of(&|v| v == VERSION);
    assert_eq!(this.len(), 1, "the migration is embedded");
    sqlx::raw_sql(&this[0]).execute(&pool).await.unwrap();
    let rows: Vec<(String, f64, i32)> =
        sqlx::query_as("SELECT id, send_rate, burst FROM campaigns ORDER BY id")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(
        rows,
        [
            ("fine".to_string(), 0.25, 10),
            ("slow".to_string(), 0.001, 10_000),
            ("tiny".to_string(), 0.001, 0),
        ]
    );
    // Every stored rate is now one the code accepts.
    for (_, rate, _) in &rows {
        pushpace::limiter::Rate::per_second(*rate).unwrap();
    }
    for (rate, burst, field) in [(0.0009, 0, "send_rate"), (1.0, 10_001, "burst")] {
        let err: pushpace::store::StoreError = sqlx::query(
            "INSERT INTO campaigns (id, send_rate, algorithm, burst) VALUES ('x', $1, 'gcra', $2)",
        )
        .bind(rate)
        .bind(burst)
        .execute(&pool)
        .await
        .unwrap_err()
        .into();
        assert_eq!(err.field(), Some(field), "{rate}/{burst}: {err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_show_pause_resume_and_unknown_campaigns() {
    let app = spawn_app().await;
    for (id, rate) in [("b-camp", 20), ("a-camp", 10)] {
        let r = app
            .put(
                &format!("/api/campaigns/{id}"),
                &json!({ "send_rate": rate }).to_string(),
            )
            .await;
        assert_eq!(r.status, 201);
    }
    // Counts: 30 sends in the last 10 complete seconds, and older ones.
    let now = second_now();
    let mut rows: Vec<(DateTime<Utc>, i64, i64)> = (1..=3)
        .map(|i| (now - ChronoDuration::seconds(i), 10, 1))
        .collect();
    rows.push((now - ChronoDuration::hours(2), 70, 4));
    seed_seconds(&app.pool, "a-camp", &rows).await;

    let r = app.get("/api/campaigns").await;
    assert_eq!(r.status, 200);
    let list = r.body.as_array().unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0]["id"], "a-camp", "sorted by id");
    let a = &list[0];
    assert_eq!(a["send_rate"], 10.0);
    assert_eq!(a["algorithm"], "gcra");
    assert_eq!(a["status"], "active");
    assert_eq!(a["sent"], 100);
    assert_eq!(a["failed"], 7);
    assert_eq!(a["rate_10s"], 3.0);
    assert_eq!(a["active"], false);
    assert_eq!(list[1]["sent"], 0);

    let r = app.get("/api/campaigns/a-camp").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["sent"], 100);
    assert_eq!(r.body["rate_10s"], 3.0);

    let r = app.post("/api/campaigns/a-camp/pause").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["status"], "paused");
    assert_eq!(
        app.get("/api/campaigns/a-camp").await.body["status"],
        "paused"
    );
    let r = app.post("/api/campaigns/a-camp/resume").await;
    assert_eq!(r.body["status"], "active");

    for r in [
        app.get("/api/campaigns/nope").await,
        app.post("/api/campaigns/nope/pause").await,
        app.post("/api/campaigns/nope/resume").await,
        app.get("/api/campaigns/nope/series").await,
    ] {
        assert_eq!(r.status, 404, "{}", r.text);
        assert!(r.body["error"].as_str().unwrap().contains("\"nope\""));
    }
    let r = app.get("/api/nothing-here").await;
    assert_eq!(r.status, 404);
    assert!(r.body["error"]
        .as_str()
        .unwrap()
        .contains("/api/nothing-here"));
    // The longest and the most varied ids the job format allows work in a path.
    for id in ["a.b_c:d-E9".to_string(), "x".repeat(128)] {
        let r = app.put(&format!("/api/campaigns/{id}"), "{}").await;
        assert_eq!(r.status, 201, "{id}: {}", r.text);
        assert_eq!(r.body["id"], id.as_str());
    }
    app.app.stop().await.unwrap();
}

/// Campaign ids follow the job format's rule everywhere the API takes one: anything else
/// (a space, a slash, NUL, non-ASCII, too long, bad escapes) is a 400 that names the id,
/// never a 500, and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_ids_follow_the_job_format_rule() {
    let app = spawn_app().await;
    let long = "x".repeat(129);
    let bad = [
        "odd%20id",
        "odd%2Fx",
        "nul%00byte",
        "%00",
        "caf%C3%A9",
        "%FF",
        "semi%3Bcolon",
        long.as_str(),
    ];
    for id in bad {
        let base = format!("/api/campaigns/{id}");
        for r in [
            app.get(&base).await,
            app.get(&format!("{base}/series")).await,
            app.put(&base, r#"{"send_rate": 5}"#).await,
            app.post(&format!("{base}/pause")).await,
            app.post(&format!("{base}/resume")).await,
        ] {
            assert_eq!(r.status, 400, "{id}: {}", r.text);
            assert_eq!(r.body["field"], "id", "{id}: {}", r.text);
            let msg = r.body["error"].as_str().unwrap();
            assert!(msg.starts_with("invalid id: "), "{id}: {msg}");
            assert!(!msg.chars().any(char::is_control), "{id}: {msg:?}");
        }
    }
    for q in ["a%00b", "a%20b", "%C3%A9", long.as_str()] {
        let r = app
            .request(
                reqwest::Method::GET,
                &format!("/api/dead-letters?campaign={q}"),
                None,
                Some(&format!("Bearer {TOKEN}")),
            )
            .await;
        assert_eq!(r.status, 400, "{q}: {}", r.text);
        assert_eq!(r.body["field"], "campaign", "{q}");
    }
    let count: i64 = sqlx::query_scalar("SELECT count(*) FROM campaigns")
        .fetch_one(&app.pool)
        .await
        .unwrap();
    assert_eq!(count, 0, "nothing written");
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_fills_gaps_with_zeros_and_bounds_the_range() {
    let app = spawn_app().await;
    assert_eq!(app.put("/api/campaigns/s1", "{}").await.status, 201);
    let t0 = Utc.with_ymd_and_hms(2026, 1, 5, 12, 0, 0).unwrap();
    seed_seconds(
        &app.pool,
        "s1",
        &[
            (t0 + ChronoDuration::seconds(1), 7, 1),
            (t0 + ChronoDuration::seconds(3), 9, 0),
        ],
    )
    .await;
    let r = app
        .get("/api/campaigns/s1/series?from=2026-01-05T12:00:00Z&to=2026-01-05T12:00:05Z")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let points = r.body.as_array().unwrap();
    let sent: Vec<i64> = points.iter().map(|p| p["sent"].as_i64().unwrap()).collect();
    let failed: Vec<i64> = points
        .iter()
        .map(|p| p["failed"].as_i64().unwrap())
        .collect();
    assert_eq!(sent, [0, 7, 0, 9, 0]);
    assert_eq!(failed, [0, 1, 0, 0, 0]);
    let times: Vec<DateTime<Utc>> = points
        .iter()
        .map(|p| p["t"].as_str().unwrap().parse().unwrap())
        .collect();
    for (i, t) in times.iter().enumerate() {
        assert_eq!(*t, t0 + ChronoDuration::seconds(i as i64));
    }
    // Another time zone and a sub-second start mean the same seconds.
    let r = app
        .get(
            "/api/campaigns/s1/series?from=2026-01-05T13:00:01.500%2B01:00&to=2026-01-05T12:00:04Z",
        )
        .await;
    let sent: Vec<i64> = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["sent"].as_i64().unwrap())
        .collect();
    assert_eq!(sent, [7, 0, 9]);

    // `last` ends now; the current second is left out.
    let now = second_now();
    seed_seconds(&app.pool, "s1", &[(now - ChronoDuration::seconds(2), 4, 0)]).await;
    let r = app.get("/api/campaigns/s1/series?last=10s").await;
    let points = r.body.as_array().unwrap();
    assert!((10..=11).contains(&points.len()), "{}", points.len());
    assert_eq!(
        points
            .iter()
            .map(|p| p["sent"].as_i64().unwrap())
            .sum::<i64>(),
        4
    );
    // The default is the last 5 minutes.
    let r = app.get("/api/campaigns/s1/series").await;
    assert!((300..=301).contains(&r.body.as_array().unwrap().len()));

    let bad: &[(&str, &str)] = &[
        // Longer than 24 h is read in minute steps, up to 400 days.
        ("from=2024-01-04T12:00:00Z&to=2026-01-05T12:00:01Z", "to"),
        ("from=2026-01-05T12:00:05Z&to=2026-01-05T12:00:00Z", "from"),
        ("from=yesterday", "from"),
        ("to=2026-13-01T00:00:00Z", "to"),
        ("last=401d", "to"),
        ("last=5parsecs", "last"),
        ("last=5m&from=2026-01-05T12:00:00Z", "last"),
        ("form=2026-01-05T12:00:00Z", "form"),
    ];
    for (q, field) in bad {
        let r = app.get(&format!("/api/campaigns/s1/series?{q}")).await;
        assert_eq!(r.status, 422, "{q}: {}", r.text);
        assert_eq!(r.body["field"], *field, "{q}: {}", r.text);
    }
    // Exactly 24 h is allowed.
    let r = app
        .get("/api/campaigns/s1/series?from=2026-01-04T12:00:00Z&to=2026-01-05T12:00:00Z&step=1")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.as_array().unwrap().len(), 86_400);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_newest_first_in_pages() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let campaign = if i % 2 == 0 { "dl-a" } else { "dl-b" };
        let raw = format!("{{\"job\": {i}}}");
        let letter = DeadLetter {
            kind: if i == 4 {
                DeadLetterKind::MalformedJob
            } else {
                DeadLetterKind::Undeliverable
            },
            topic: "pushpace.jobs",
            partition: 1,
            kafka_offset: 100 + i,
            campaign_id: Some(campaign),
            job_id: Some("j-1"),
            device_token: Some("tok"),
            reason: "permanent failure (HTTP 410)",
            raw: raw.as_bytes(),
            key: None,
            device: None,
        };
        ids.push(
            pushpace::store::dead_letters::insert(&app.pool, &letter)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let big = vec![b'z'; 5000];
    let id_big = pushpace::store::dead_letters::insert(
        &app.pool,
        &DeadLetter {
            kind: DeadLetterKind::MalformedJob,
            topic: "pushpace.jobs",
            partition: 0,
            kafka_offset: 7,
            campaign_id: None,
            job_id: None,
            device_token: None,
            reason: "not JSON",
            raw: &big,
            key: None,
            device: None,
        },
    )
    .await
    .unwrap()
    .unwrap();

    // Dead letters hold device tokens and payloads: the admin token is needed.
    let r = app.get("/api/dead-letters").await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    assert!(r.body.get("items").is_none(), "{}", r.text);
    let r = app
        .request(
            reqwest::Method::GET,
            "/api/dead-letters",
            None,
            Some("Bearer not-the-token"),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(!r.text.contains("device_token"), "{}", r.text);
    let r = app.read("/api/dead-letters").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let items = r.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 6);
    assert_eq!(items[0]["id"], id_big);
    assert_eq!(items[0]["raw_len"], 5000);
    assert_eq!(items[0]["raw_truncated"], true);
    assert_eq!(items[0]["raw"].as_str().unwrap().len(), 1024);
    assert!(r.body["next_before"].is_null());

    let r = app.read("/api/dead-letters?campaign=dl-a&limit=2").await;
    let items = r.body["items"].as_array().unwrap();
    let got: Vec<i64> = items.iter().map(|d| d["id"].as_i64().unwrap()).collect();
    assert_eq!(got, [ids[4], ids[2]]);
    assert_eq!(items[0]["kind"], "malformed_job");
    assert_eq!(items[1]["kind"], "undeliverable");
    assert_eq!(items[1]["raw"], "{\"job\": 2}");
    assert_eq!(items[1]["reason"], "permanent failure (HTTP 410)");
    assert_eq!(items[1]["kafka_offset"], 102);
    let next = r.body["next_before"].as_i64().unwrap();
    assert_eq!(next, ids[2]);
    let r = app
        .read(&format!(
            "/api/dead-letters?campaign=dl-a&limit=2&before={next}"
        ))
        .await;
    let got: Vec<i64> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, [ids[0]]);
    assert!(r.body["next_before"].is_null());
    assert_eq!(
        app.read("/api/dead-letters?campaign=none").await.body["items"],
        json!([])
    );

    for (q, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("before=x", "before"),
        ("campaing=dl-a", "campaing"),
    ] {
        let r = app.read(&format!("/api/dead-letters?{q}")).await;
        assert_eq!(r.status, 422, "{q}: {}", r.text);
        assert_eq!(r.body["field"], field, "{q}");
    }
    app.app.stop().await.unwrap();
}

/// A request must name this server in its `Host` (DNS rebinding: a page on another site
/// that resolves its own name to 127.0.0.1 must not read the API), for the API, the
/// dashboard and unknown paths alike; the bound address and `http.allowed_hosts` pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_known_hosts_are_served() {
    let (pool, url) = fresh_database().await;
    let extra = [(
        "http.allowed_hosts",
        "pushpace.test, ops.example:9000".to_string(),
    )];
    let app = spawn_app_on(pool, url, TOKEN, None, None, &extra).await;
    let port = app.app.port;
    for path in [
        "/api/campaigns",
        "/",
        "/healthz",
        "/assets/dashboard.js",
        "/nowhere",
    ] {
        for host in [
            "evil.example".to_string(),
            format!("evil.example:{port}"),
            format!("127.0.0.1.evil.example:{port}"),
            format!("localhost:{}", port.wrapping_add(1)),
            "ops.example:9001".to_string(),
        ] {
            let r = app.get_with_host(path, &host).await;
            assert_eq!(r.status, 421, "{path} as {host}: {}", r.text);
            assert!(
                r.body["error"]
                    .as_str()
                    .unwrap()
                    .contains("http.allowed_hosts"),
                "{}",
                r.text
            );
        }
    }
    // Refused before the token is looked at, and nothing is written.
    let res = app
        .http
        .put(app.url("/api/campaigns/rebound"))
        .header(reqwest::header::HOST, "evil.example")
        .bearer_auth(TOKEN)
        .body(r#"{"send_rate": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 421);
    assert_eq!(app.get("/api/campaigns/rebound").await.status, 404);

    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("[::1]:{port}"),
        "pushpace.test".to_string(),
        "pushpace.test:8443".to_string(),
        "ops.example:9000".to_string(),
    ] {
        let r = app.get_with_host("/api/campaigns", &host).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
        let r = app.get_with_host("/", &host).await;
        assert_eq!(r.status, 200, "dashboard as {host}");
    }
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_its_assets_come_from_the_binary() {
    let app = spawn_app().await;
    let r = app.get("/").await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = r.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(r
        .text
        .contains(r#"<script src="/assets/uPlot.iife.min.js">"#));
    assert!(
        !r.text.contains("http://") && !r.text.contains("https://"),
        "no CDN"
    );
    for (path, kind, needle) in [
        ("/assets/uPlot.iife.min.js", "text/javascript", "uPlot"),
        ("/assets/uPlot.min.css", "text/css", ".uplot"),
        ("/assets/dashboard.js", "text/javascript", "sessionStorage"),
        ("/assets/dashboard.css", "text/css", "#charts"),
        ("/assets/uPlot.LICENSE", "text/plain", "The MIT License"),
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind),
            "{path}"
        );
        assert!(r.text.contains(needle), "{path}");
    }
    app.app.stop().await.unwrap();
}

/// One sample of the exposition text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parses Prometheus text format 0.0.4 strictly enough to catch malformed output: every
/// line is blank, a comment, or `name{label="value",…} number`; every sample's family
/// has one `# TYPE`. Returns the types by family and the samples.
pub fn parse_exposition(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut types = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            assert!(valid_name(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "two TYPE lines for {name}"
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut labels = Vec::new();
                let mut chars = body.chars().peekable();
                while chars.peek().is_some() {
                    let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
                    assert!(valid_name(&key), "label {key:?} in {line:?}");
                    assert_eq!(chars.next(), Some('"'), "{line}");
                    let mut v = String::new();
                    loop {
                        match chars.next().expect("unterminated label value") {
                            '\\' => match chars.next() {
                                Some('n') => v.push('\n'),
                                Some(c) => v.push(c),
                                None => panic!("{line}"),
                            },
                            '"' => break,
                            c => v.push(c),
                        }
                    }
                    labels.push((key, v));
                    if chars.peek() == Some(&',') {
                        chars.next();
                    }
                }
                (name, labels)
            }
        };
        assert!(valid_name(name), "{line}");
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    for s in &samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                s.name.strip_suffix(suffix).filter(|f| {
                    types
                        .get(*f)
                        .is_some_and(|t| t == "histogram" || t == "summary")
                })
            })
            .unwrap_or(&s.name);
        assert!(types.contains_key(family), "{} has no # TYPE", s.name);
    }
    (types, samples)
}

fn sends(samples: &[Sample], campaign: &str, outcome: &str) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == "sends_total"
                && s.labels.contains(&("campaign".into(), campaign.into()))
                && s.labels.contains(&("outcome".into(), outcome.into()))
        })
        .map(|s| s.value)
}

async fn scrape(app: &TestApp) -> (HashMap<String, String>, Vec<Sample>) {
    let r = app.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    parse_exposition(&r.text)
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_count_the_sends_of_a_real_worker() {
    // A: 1500 devices at 150/s (10 s of work); B: 30 devices, done at once.
    let run = spawn_worker_app(&[(150.0, 1500), (1000.0, 30)]).await;
    let app = &run.api;
    let a = run.plan.campaigns[0].id.clone();
    let b = run.plan.campaigns[1].id.clone();

    wait_for("A to send 150", Duration::from_secs(60), || async {
        sends(&scrape(app).await.1, &a, "sent").unwrap_or(0.0) >= 150.0
    })
    .await;
    // Pausing is a delay: sends stop within a quantum, the jobs stay.
    let r = app.post(&format!("/api/campaigns/{a}/pause")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let end = Instant::now() + Duration::from_secs(15);
    let mut last = -1.0;
    let counted = loop {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let now = sends(&scrape(app).await.1, &a, "sent").unwrap_or(0.0);
        if now == last {
            break now;
        }
        assert!(Instant::now() < end, "A's sends did not stop: {now}");
        last = now;
    };
    assert!(counted < 1500.0, "A stopped before the end: {counted}");
    // The flusher has the same count in the table, and the API says the same.
    wait_for(
        "the flush of A's sends",
        Duration::from_secs(10),
        || async { recorded_sent(&app.pool, &a).await as f64 == counted },
    )
    .await;
    let r = app.get(&format!("/api/campaigns/{a}")).await;
    assert_eq!(r.body["sent"].as_f64(), Some(counted), "{}", r.text);
    assert_eq!(r.body["live"]["sent"].as_f64(), Some(counted));
    assert_eq!(r.body["live"]["paused"], true, "held, paused: {}", r.text);
    assert_eq!(r.body["status"], "paused");

    // B is done: its 30 sends are in the table and its series are gone.
    wait_for("B's 30 sends recorded", Duration::from_secs(30), || async {
        recorded_sent(&app.pool, &b).await == 30
    })
    .await;
    let (types, samples) = scrape(app).await;
    assert_eq!(
        sends(&samples, &b, "sent"),
        None,
        "an ended campaign keeps no series"
    );
    assert_eq!(sends(&samples, &a, "sent"), Some(counted));
    assert_eq!(sends(&samples, &a, "failed"), Some(0.0));
    for (family, kind) in [
        ("sends_total", "counter"),
        ("retries_total", "counter"),
        ("dead_letters_total", "counter"),
        ("limiter_wait_seconds", "histogram"),
        ("stats_flush_seconds", "histogram"),
        ("active_campaigns", "gauge"),
        ("buffered_jobs", "gauge"),
        ("buffered_devices", "gauge"),
        ("paused_partitions", "gauge"),
    ] {
        assert_eq!(
            types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    let value = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name && s.labels.is_empty())
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let listed = app.get("/api/campaigns").await.body;
    let active = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["active"] == true)
        .count();
    assert_eq!(value("active_campaigns"), active as f64);
    assert!(
        value("buffered_devices") >= 1500.0 - counted,
        "A's unsent devices are held"
    );
    assert!(value("buffered_jobs") >= 1.0);
    assert_eq!(value("paused_partitions"), 0.0);
    // The lean scrape (the bench's, every 20 ms) leaves out only the per-campaign family.
    let lean = app.get("/metrics?per_campaign=false").await;
    assert_eq!(lean.status, 200);
    let (lean_types, lean_samples) = parse_exposition(&lean.text);
    assert!(sends(&samples, &a, "sent").is_some(), "A is held");
    assert!(lean_samples.iter().all(|s| s.name != "sends_total"));
    assert!(!lean_types.contains_key("sends_total"));
    assert!(lean_samples
        .iter()
        .any(|s| s.name == "delivered_total" && s.labels.is_empty()));
    assert_eq!(app.get("/metrics?per_campaign=maybe").await.status, 400);
    assert_eq!(value("retries_total"), 0.0, "the null sender never fails");
    assert!(value("limiter_wait_seconds_count") > 0.0);
    assert!(value("stats_flush_seconds_count") > 0.0);
    let buckets: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "limiter_wait_seconds_bucket")
        .collect();
    assert!(buckets
        .iter()
        .any(|s| s.labels.contains(&("le".into(), "+Inf".into()))));
    for kind in ["malformed_job", "invalid_job", "undeliverable"] {
        assert!(
            samples.iter().any(|s| s.name == "dead_letters_total"
                && s.labels == [("kind".to_string(), kind.to_string())]),
            "dead_letters_total{{kind={kind}}}"
        );
    }
    // librdkafka reports the lag every 5 s.
    wait_for("consumer_lag", Duration::from_secs(15), || async {
        let (types, samples) = scrape(app).await;
        types.get("consumer_lag").is_some_and(|t| t == "gauge")
            && samples
                .iter()
                .any(|s| s.name == "consumer_lag" && s.labels[0].0 == "partition")
    })
    .await;

    // Resume at a higher rate through the API: the change reaches the limiter and A
    // finishes; every device is counted once and its series disappear.
    let r = app
        .put(&format!("/api/campaigns/{a}"), r#"{"send_rate": 3000}"#)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        app.post(&format!("/api/campaigns/{a}/resume")).await.status,
        200
    );
    wait_for(
        "A's 1500 sends recorded",
        Duration::from_secs(30),
        || async { recorded_sent(&app.pool, &a).await == 1500 },
    )
    .await;
    wait_for("A's series to go", Duration::from_secs(10), || async {
        sends(&scrape(app).await.1, &a, "sent").is_none()
    })
    .await;
    let (_, samples) = scrape(app).await;
    assert!(
        samples.iter().all(|s| s.name != "sends_total"),
        "no campaign is held"
    );
    run.stop().await;
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
        let out = cmd.output().expect("run pushpace");
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    })
    .await
    .unwrap()
}

pub fn args(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn campaign_and_stats_commands_work_through_a_running_server() {
    let app = spawn_app().await;
    let api = app.app.url();
    let token = || vec![("PUSHPACE_ADMIN_TOKEN", TOKEN.to_string())];

    let (ok, _, err) = cli(
        args(&["campaign", "set-rate", "cli-a", "250", "--api", &api]),
        vec![],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("PUSHPACE_ADMIN_TOKEN"), "{err}");
    let (ok, _, err) = cli(
        args(&["campaign", "set-rate", "cli-a", "250", "--api", &api]),
        vec![("PUSHPACE_ADMIN_TOKEN", "wrong".into())],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("403") && err.contains("does not match"),
        "{err}"
    );

    let (ok, out, err) = cli(
        args(&["campaign", "set-rate", "cli-a", "250", "--api", &api]),
        token(),
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains("campaign cli-a: send_rate 250/s (gcra, active)"),
        "{out}"
    );
    let (ok, _, err) = cli(
        args(&["campaign", "set-rate", "cli-b", "0.5", "--api", &api]),
        token(),
    )
    .await;
    assert!(ok, "{err}");
    let (ok, _, err) = cli(
        args(&["campaign", "set-rate", "cli-a", "-3", "--api", &api]),
        token(),
    )
    .await;
    assert!(!ok);
    assert!(err.contains("422") && err.contains("send_rate"), "{err}");

    let (ok, out, err) = cli(args(&["campaign", "list", "--api", &api]), vec![]).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert!(
        lines[0].starts_with("ID     STATUS  ALGORITHM  SEND_RATE"),
        "{out}"
    );
    assert!(
        lines[1].starts_with("cli-a  active  gcra             250"),
        "{out}"
    );
    assert!(
        lines[2].starts_with("cli-b  active  gcra             0.5"),
        "{out}"
    );

    let (ok, out, err) = cli(
        args(&["campaign", "list", "--api", &api, "--format", "json"]),
        vec![],
    )
    .await;
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(list[1]["id"], "cli-b");
    assert_eq!(list[1]["send_rate"], 0.5);

    let (ok, out, _) = cli(
        args(&["campaign", "pause", "cli-a", "--api", &api]),
        token(),
    )
    .await;
    assert!(ok);
    assert_eq!(out, "campaign cli-a: paused\n");
    let (ok, out, _) = cli(args(&["campaign", "show", "cli-a", "--api", &api]), vec![]).await;
    assert!(ok);
    assert!(out.contains("status      paused\n"), "{out}");
    assert!(out.contains("send_rate   250/s\n"), "{out}");
    assert!(out.contains("worker      not held\n"), "{out}");
    let (ok, out, _) = cli(
        args(&["campaign", "resume", "cli-a", "--api", &api]),
        token(),
    )
    .await;
    assert!(ok);
    assert_eq!(out, "campaign cli-a: active\n");
    let (ok, _, err) = cli(args(&["campaign", "show", "nope", "--api", &api]), vec![]).await;
    assert!(!ok);
    assert!(err.contains("404") && err.contains("not found"), "{err}");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let (ok, _, err) = cli(args(&["campaign", "list", "--api", &dead]), vec![]).await;
    assert!(!ok);
    assert!(err.contains("cannot reach the API"), "{err}");

    // stats: 20 seconds with sends (10/s with a 2 s gap), within the last minute.
    let now = second_now();
    let rows: Vec<(DateTime<Utc>, i64, i64)> = (2..22)
        .filter(|i| !(10..12).contains(i))
        .map(|i| {
            (
                now - ChronoDuration::seconds(i),
                10 + i % 3,
                i64::from(i == 5),
            )
        })
        .collect();
    let total: i64 = rows.iter().map(|r| r.1).sum();
    seed_seconds(&app.pool, "cli-a", &rows).await;
    let (ok, out, err) = cli(
        args(&["stats", "cli-a", "--last", "60s", "--api", &api]),
        vec![],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with("SECOND (UTC)         SENT  FAILED  RETRIED\n"),
        "{out}"
    );
    let table_rows = out.lines().skip(1).take_while(|l| !l.is_empty()).count();
    assert!((60..=61).contains(&table_rows), "{table_rows} rows\n{out}");
    assert!(
        out.contains(&format!("total {total}; send_rate 250/s")),
        "{out}"
    );
    let spark = out.lines().last().unwrap();
    assert!(spark.chars().any(|c| ('▁'..='█').contains(&c)), "{spark:?}");
    assert!(spark.contains("  "), "the gap shows: {spark:?}");

    let svg = tempfile::NamedTempFile::new().unwrap();
    let (ok, out, err) = cli(
        args(&[
            "stats",
            "cli-a",
            "--last",
            "1m",
            "--format",
            "json",
            "--svg",
            svg.path().to_str().unwrap(),
            "--api",
            &api,
        ]),
        vec![],
    )
    .await;
    assert!(ok, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["send_rate"], 250.0);
    let points = v["points"].as_array().unwrap();
    assert_eq!(
        points
            .iter()
            .map(|p| p["sent"].as_i64().unwrap())
            .sum::<i64>(),
        total
    );
    let drawn = std::fs::read_to_string(svg.path()).unwrap();
    assert!(
        drawn.starts_with("<svg"),
        "{}",
        &drawn[..80.min(drawn.len())]
    );
    assert!(drawn.contains("cli-a: sends per second, send_rate 250/s"));
    assert!(drawn.contains("<polyline"), "a line is drawn");

    let (ok, _, err) = cli(
        args(&["stats", "cli-a", "--last", "2y", "--api", &api]),
        vec![],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("--last"), "{err}");

    // Retention straight against the database.
    seed_seconds(
        &app.pool,
        "cli-b",
        &[(now - ChronoDuration::days(40), 5, 0)],
    )
    .await;
    let (ok, out, err) = cli(
        args(&[
            "stats",
            "prune",
            "--older-than",
            "30d",
            "--database-url",
            &app.db_url,
        ]),
        vec![],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("1 per-second rows"), "{out}");
    assert_eq!(recorded_sent(&app.pool, "cli-b").await, 0);
    assert_eq!(recorded_sent(&app.pool, "cli-a").await, total);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_once_the_consumer_thread_has_stopped() {
    let mut app = spawn_worker_app(&[(100.0, 10)]).await;
    let r = app.api.get("/readyz").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["checks"]["consumer"]["ok"], true);
    // The consumer thread ends (here at shutdown; in production on its own, when the
    // process then exits non-zero): readiness must say so, not look healthy.
    let worker = app.worker.take().unwrap();
    let mut running = worker.consumer_running.clone();
    worker.shutdown().await.expect("worker shutdown");
    assert!(!*running.borrow_and_update());
    let r = app.api.get("/readyz").await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.body["checks"]["consumer"]["ok"], false);
    app.stop().await;
}
