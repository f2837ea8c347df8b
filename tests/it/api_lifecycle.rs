//! The lifecycle through the API and PostgreSQL: start and expiry fields, cancel (final),
//! and the settings history with who made each change.

use crate::api::spawn_app;

#[tokio::test]
async fn start_and_expiry_are_set_validated_and_cleared() {
    let app = spawn_app().await;
    let r = app
        .put(
            "/api/campaigns/launch",
            r#"{"send_rate": 50, "start_at": "2030-01-01T09:00:00Z", "expires_at": 1893492000}"#,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["start_at"], "2030-01-01T09:00:00Z");
    assert_eq!(r.body["expires_at"], "2030-01-01T10:00:00Z");
    assert_eq!(r.body["scheduled"], true);

    // Each bad value names its field and changes nothing.
    for (body, field) in [
        (r#"{"start_at": "next monday"}"#, "start_at"),
        (r#"{"start_at": -5}"#, "start_at"),
        (r#"{"expires_at": true}"#, "expires_at"),
        (r#"{"expires_at": 1e15}"#, "expires_at"),
        // Ends before it starts.
        (r#"{"expires_at": "2029-12-31T00:00:00Z"}"#, "expires_at"),
    ] {
        let r = app.put("/api/campaigns/launch", body).await;
        assert_eq!(r.status, 422, "{body}: {}", r.text);
        assert_eq!(r.body["field"], field, "{body}: {}", r.text);
    }
    let r = app
        .put(
            "/api/campaigns/launch",
            r#"{"start_at": null, "expires_at": null}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.body["start_at"].is_null() && r.body["expires_at"].is_null());
    assert_eq!(r.body["scheduled"], false);
}

#[tokio::test]
async fn cancel_is_final_and_every_change_is_in_the_history() {
    let app = spawn_app().await;
    assert_eq!(
        app.put("/api/campaigns/spring", r#"{"send_rate": 100}"#)
            .await
            .status,
        201
    );
    assert_eq!(
        app.put("/api/campaigns/spring", r#"{"weight": 3}"#)
            .await
            .status,
        200
    );
    // Cancel needs the admin token.
    let r = app
        .request(
            reqwest::Method::POST,
            "/api/campaigns/spring/cancel",
            None,
            None,
        )
        .await;
    assert_eq!(r.status, 401, "{}", r.text);
    let r = app.post("/api/campaigns/spring/cancel").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["status"], "cancelled");
    // Again: no change, no error.
    assert_eq!(app.post("/api/campaigns/spring/cancel").await.status, 200);
    // Final: neither resume nor a settings change takes.
    let r = app.post("/api/campaigns/spring/resume").await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert!(r.text.contains("cancel is final"), "{}", r.text);
    let r = app
        .put("/api/campaigns/spring", r#"{"send_rate": 5}"#)
        .await;
    assert_eq!(r.status, 422, "{}", r.text);
    let r = app.get("/api/campaigns/spring").await;
    assert_eq!(
        (r.body["status"].as_str(), r.body["send_rate"].as_f64()),
        (Some("cancelled"), Some(100.0))
    );
    assert_eq!(app.post("/api/campaigns/nope/cancel").await.status, 404);

    let r = app.get("/api/campaigns/spring/events").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let events: Vec<(String, String, Option<String>, Option<String>)> = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["actor"].as_str().unwrap().to_string(),
                e["field"].as_str().unwrap().to_string(),
                e["old"].as_str().map(str::to_string),
                e["new"].as_str().map(str::to_string),
            )
        })
        .collect();
    let has = |field: &str, old: Option<&str>, new: &str| {
        events.iter().any(|(actor, f, o, n)| {
            actor == "api" && f == field && o.as_deref() == old && n.as_deref() == Some(new)
        })
    };
    assert!(has("send_rate", None, "100"), "{events:?}");
    assert!(has("weight", Some("1"), "3"), "{events:?}");
    assert!(has("status", Some("active"), "cancelled"), "{events:?}");
    // The refused changes left no event.
    assert!(!events
        .iter()
        .any(|(_, f, _, n)| f == "send_rate" && n.as_deref() == Some("5")));
    // Creation, then the one cancel (the second cancel changed nothing).
    assert_eq!(
        events.iter().filter(|(_, f, _, _)| f == "status").count(),
        2,
        "{events:?}"
    );
}

#[tokio::test]
async fn a_named_actor_is_recorded_and_a_bad_one_refused() {
    let app = spawn_app().await;
    let put = |actor: &'static str| {
        app.http
            .put(app.url("/api/campaigns/named"))
            .header("authorization", format!("Bearer {}", crate::api::TOKEN))
            .header("x-pushpace-actor", actor)
            .header("content-type", "application/json")
            .body(r#"{"send_rate": 7}"#)
            .send()
    };
    assert_eq!(put("ops:alice").await.unwrap().status(), 201);
    let bad = put("alice; drop table").await.unwrap();
    assert_eq!(bad.status(), 422);
    let r = app.get("/api/campaigns/named/events").await;
    let actors: Vec<&str> = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["actor"].as_str().unwrap())
        .collect();
    assert!(
        !actors.is_empty() && actors.iter().all(|a| *a == "ops:alice"),
        "{actors:?}"
    );
}

/// The lifecycle commands through the real binary and a running server: set-start,
/// set-expiry, show, cancel (refused without --yes when there is no terminal to ask
/// on), and the history naming the CLI.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_start_and_expiry_cancels_and_shows_the_history() {
    use crate::api::{args, cli, TOKEN};
    let app = spawn_app().await;
    let api = app.app.url();
    let token = || vec![("PUSHPACE_ADMIN_TOKEN", TOKEN.to_string())];
    let run = |list: &[&str]| {
        let mut a = args(list);
        a.extend(["--api".to_string(), api.clone()]);
        cli(a, token())
    };
    let (ok, out, err) = run(&["campaign", "set-start", "cli-l", "2030-01-01T09:00:00Z"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("start_at 2030-01-01T09:00:00+00:00"), "{out}");
    let (ok, out, err) = run(&["campaign", "set-expiry", "cli-l", "1893492000"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("expires_at 2030-01-01T10:00:00+00:00"),
        "{out}"
    );
    let (ok, _, err) = run(&["campaign", "set-expiry", "cli-l", "soon"]).await;
    assert!(!ok);
    assert!(err.contains("422") && err.contains("expires_at"), "{err}");
    let (ok, out, err) = run(&["campaign", "show", "cli-l"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("start_at    2030-01-01T09:00:00+00:00"),
        "{out}"
    );
    assert!(out.contains("eta"), "{out}");

    let (ok, _, err) = run(&["campaign", "cancel", "cli-l"]).await;
    assert!(!ok);
    assert!(err.contains("--yes"), "{err}");
    assert_eq!(
        app.get("/api/campaigns/cli-l").await.body["status"],
        "active"
    );
    let (ok, out, err) = run(&["campaign", "cancel", "cli-l", "--yes"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("campaign cli-l: cancelled"), "{out}");

    let (ok, out, err) = run(&["campaign", "events", "cli-l"]).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    for (field, new) in [
        ("start_at", "2030-01-01T09:00:00Z"),
        ("expires_at", "2030-01-01T10:00:00Z"),
        ("status", "cancelled"),
    ] {
        assert!(
            lines
                .iter()
                .any(|l| l.contains(" cli ") && l.contains(field) && l.ends_with(new)),
            "{field} → {new} by cli in:\n{out}"
        );
    }
}
