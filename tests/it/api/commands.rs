//! The `campaign` and `stats` commands, run as the real binary against a running server.

use super::{args, cli, recorded_sent, second_now, seed_seconds, spawn_app, TOKEN};
use crate::helpers::free_port;
use chrono::{DateTime, Duration as ChronoDuration, Utc};
use serde_json::Value;

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
