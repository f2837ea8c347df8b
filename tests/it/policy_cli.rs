//! The delivery-policy commands (`campaign set-priority`, `set-finish-by`, `set-ramp`,
//! `set-window`) and the policy lines of `campaign show`, run as the real binary against
//! a running server over a fresh database: what they set shows, and a value the API
//! refuses prints its field and exits non-zero.

use crate::api::{args, cli, spawn_app, TOKEN};
use chrono::{SecondsFormat, Utc};

/// Runs `pushpace <list> --api <api>` with the admin token.
pub(crate) async fn run(api: &str, list: &[&str]) -> (bool, String, String) {
    let mut a = args(list);
    a.extend(["--api".to_string(), api.to_string()]);
    cli(a, vec![("PUSHPACE_ADMIN_TOKEN", TOKEN.to_string())]).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_class_deadline_and_ramp_and_show_prints_them() {
    let app = spawn_app().await;
    let api = app.app.url();
    let (ok, _, err) = run(&api, &["campaign", "set-rate", "cli-p", "100"]).await;
    assert!(ok, "{err}");

    // The class: set, shown, recorded as the CLI's change.
    let (ok, out, err) = run(&api, &["campaign", "set-priority", "cli-p", "high"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("campaign cli-p: priority high"), "{out}");
    let (ok, out, err) = run(&api, &["campaign", "show", "cli-p"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("\npriority    high\n"), "{out}");
    assert!(out.contains("\nfinish_by   none"), "{out}");
    assert!(
        out.contains("\nramp        default (limiter.ramp_up_s, limiter.ramp_from)\n"),
        "{out}"
    );
    assert_eq!(
        app.get("/api/campaigns/cli-p").await.body["policy"]["priority"],
        "high"
    );

    // A class the API does not know: its 422, naming the field; nothing changed.
    let (ok, out, err) = run(&api, &["campaign", "set-priority", "cli-p", "urgent"]).await;
    assert!(!ok, "{out}");
    assert!(err.contains("422") && err.contains("priority"), "{err}");
    assert!(err.contains("critical, high, normal, bulk"), "{err}");
    assert_eq!(
        app.get("/api/campaigns/cli-p").await.body["policy"]["priority"],
        "high"
    );

    // A deadline in the past is refused, naming finish_by; one ahead is shown; none clears.
    for past in ["1000000000", "2001-09-09T01:46:40Z"] {
        let (ok, out, err) = run(&api, &["campaign", "set-finish-by", "cli-p", past]).await;
        assert!(!ok, "{past}: {out}");
        assert!(err.contains("422") && err.contains("finish_by"), "{err}");
    }
    let (ok, _, err) = run(&api, &["campaign", "set-finish-by", "cli-p", "tonight"]).await;
    assert!(!ok);
    assert!(err.contains("422") && err.contains("finish_by"), "{err}");
    let ahead = Utc::now().timestamp() + 7200;
    let (ok, out, err) = run(
        &api,
        &["campaign", "set-finish-by", "cli-p", &ahead.to_string()],
    )
    .await;
    assert!(ok, "{err}");
    let rfc = chrono::DateTime::from_timestamp(ahead, 0)
        .unwrap()
        .to_rfc3339_opts(SecondsFormat::Secs, false);
    assert!(out.contains(&format!("finish_by {rfc}")), "{rfc} in {out}");
    let (ok, out, err) = run(&api, &["campaign", "show", "cli-p"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("\nfinish_by   {rfc}")),
        "{rfc} in {out}"
    );
    assert!(
        !out.contains("BEHIND"),
        "no devices known, nothing late: {out}"
    );
    let (ok, _, err) = run(&api, &["campaign", "set-finish-by", "cli-p", "none"]).await;
    assert!(ok, "{err}");
    assert!(app.get("/api/campaigns/cli-p").await.body["policy"]["finish_by"].is_null());

    // The ramp: set, refused out of range (naming the field), back to the defaults.
    let (ok, out, err) = run(
        &api,
        &[
            "campaign",
            "set-ramp",
            "cli-p",
            "--seconds",
            "300",
            "--from",
            "0.05",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(out.contains("ramp 300 s from 5% of send_rate"), "{out}");
    let (ok, out, err) = run(&api, &["campaign", "show", "cli-p"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("\nramp        300 s from 5% of send_rate\n"),
        "{out}"
    );
    let (ok, _, err) = run(&api, &["campaign", "set-ramp", "cli-p", "--from", "2"]).await;
    assert!(!ok);
    assert!(err.contains("422") && err.contains("ramp_from"), "{err}");
    let (ok, _, err) = run(
        &api,
        &["campaign", "set-ramp", "cli-p", "--seconds", "90000"],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("422") && err.contains("ramp_up_s"), "{err}");
    let (ok, _, err) = run(&api, &["campaign", "set-ramp", "cli-p"]).await;
    assert!(!ok, "nothing to set is refused before any request");
    assert!(
        err.contains("--seconds") || err.contains("--default"),
        "{err}"
    );
    let (ok, _, err) = run(&api, &["campaign", "set-ramp", "cli-p", "--default"]).await;
    assert!(ok, "{err}");
    let policy = app.get("/api/campaigns/cli-p").await.body["policy"].clone();
    assert!(
        policy["ramp_up_s"].is_null() && policy["ramp_from"].is_null(),
        "{policy}"
    );

    // JSON output is the API's answer as is.
    let (ok, out, err) = run(
        &api,
        &[
            "campaign",
            "set-priority",
            "cli-p",
            "bulk",
            "--format",
            "json",
        ],
    )
    .await;
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["policy"]["priority"], "bulk");

    // The history names the CLI for each change.
    let (ok, out, err) = run(&api, &["campaign", "events", "cli-p"]).await;
    assert!(ok, "{err}");
    assert!(
        out.lines()
            .any(|l| l.contains(" cli ") && l.contains("priority") && l.ends_with("high")),
        "{out}"
    );
}

/// The send window: set, shown, refused with its field, cleared.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_and_clears_a_send_window() {
    let app = spawn_app().await;
    let api = app.app.url();
    let (ok, _, err) = run(&api, &["campaign", "set-rate", "cli-w", "100"]).await;
    assert!(ok, "{err}");
    let (ok, out, err) = run(&api, &["campaign", "show", "cli-w"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("\nwindow      none (any hour)\n"), "{out}");
    assert!(
        !out.contains("late_policy"),
        "no window, no late policy: {out}"
    );
    let (ok, out, err) = run(
        &api,
        &[
            "campaign",
            "set-window",
            "cli-w",
            "--from",
            "09:00",
            "--to",
            "21:00",
            "--days",
            "weekdays",
            "--deliver-at",
            "10:00",
            "--late",
            "next_window",
        ],
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.contains("window 09:00–21:00 local, mon,tue,wed,thu,fri"),
        "{out}"
    );
    let (ok, out, err) = run(&api, &["campaign", "show", "cli-w"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("\nwindow      09:00–21:00 local, mon,tue,wed,thu,fri\n"),
        "{out}"
    );
    assert!(out.contains("\ndeliver_at  10:00 local\n"), "{out}");
    assert!(out.contains("\nlate_policy next_window\n"), "{out}");
    let (ok, _, err) = run(
        &api,
        &[
            "campaign",
            "set-window",
            "cli-w",
            "--from",
            "25:00",
            "--to",
            "21:00",
        ],
    )
    .await;
    assert!(!ok);
    assert!(err.contains("422") && err.contains("send_window"), "{err}");
    // A deliver time outside the window cannot be kept: refused, naming it.
    let (ok, _, err) = run(
        &api,
        &["campaign", "set-window", "cli-w", "--deliver-at", "22:00"],
    )
    .await;
    assert!(!ok);
    assert!(
        err.contains("422") && err.contains("deliver_at_local"),
        "{err}"
    );
    let (ok, out, err) = run(&api, &["campaign", "set-window", "cli-w", "--clear"]).await;
    assert!(ok, "{err}");
    assert!(
        out.contains("window none (any hour), deliver_at none"),
        "{out}"
    );
    let (ok, out, err) = run(&api, &["campaign", "show", "cli-w"]).await;
    assert!(ok, "{err}");
    assert!(out.contains("\nwindow      none (any hour)\n"), "{out}");
    let policy = app.get("/api/campaigns/cli-w").await.body["policy"].clone();
    assert!(
        policy["send_window"].is_null() && policy["deliver_at_local"].is_null(),
        "{policy}"
    );
}
