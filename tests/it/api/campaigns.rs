//! Campaigns through the API: create and update naming the bad field, list, show, pause
//! and resume, the id rule, and the migration behind the rate and burst bounds.

use super::{second_now, seed_seconds, spawn_app, TOKEN};
use crate::helpers::{pg_server, unique_name};
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use serde_json::json;
use std::time::Duration;

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
