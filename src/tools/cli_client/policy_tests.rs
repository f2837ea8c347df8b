//! The delivery-policy commands' request bodies, argument rules and `campaign show`
//! lines ([`super::policy`]).

use super::policy::*;
use super::{CampaignCommand, CampaignOut, LiveOut, PolicyOut};
use clap::Parser;
use serde_json::{json, Value};

#[derive(Parser)]
struct Cli {
    #[command(subcommand)]
    command: CampaignCommand,
}

fn parse(args: &[&str]) -> Result<CampaignCommand, clap::Error> {
    Cli::try_parse_from(std::iter::once("campaign").chain(args.iter().copied())).map(|c| c.command)
}

fn window(args: &[&str]) -> Value {
    match parse(args).unwrap() {
        CampaignCommand::SetWindow(w) => window_body(&w),
        other => panic!("{other:?}"),
    }
}

fn ramp(args: &[&str]) -> Value {
    match parse(args).unwrap() {
        CampaignCommand::SetRamp(r) => ramp_body(&r).unwrap(),
        other => panic!("{other:?}"),
    }
}

#[test]
fn window_bodies_send_what_was_given() {
    assert_eq!(
        window(&["set-window", "c", "--from", "09:00", "--to", "21:00"]),
        json!({"send_window": {"from": "09:00", "to": "21:00", "days": DAYS}})
    );
    assert_eq!(
        window(&[
            "set-window",
            "c",
            "--from",
            "09:00",
            "--to",
            "17:30",
            "--days",
            "weekdays,Sat,mon",
            "--deliver-at",
            "10:00",
            "--late",
            "next_window",
        ]),
        json!({
            "send_window": {"from": "09:00", "to": "17:30",
                            "days": ["mon", "tue", "wed", "thu", "fri", "sat"]},
            "deliver_at_local": "10:00",
            "late_policy": "next_window",
        })
    );
    assert_eq!(
        window(&["set-window", "c", "--deliver-at", "none"]),
        json!({"deliver_at_local": null})
    );
    assert_eq!(
        window(&["set-window", "c", "--clear"]),
        json!({"send_window": null, "deliver_at_local": null})
    );
    // Nothing to set, half a window, a clear with values, an unknown late policy.
    for bad in [
        &["set-window", "c"][..],
        &["set-window", "c", "--from", "09:00"],
        &["set-window", "c", "--clear", "--late", "skip"],
        &["set-window", "c", "--late", "later"],
        &["set-window", "c", "--days", "mon"],
    ] {
        assert!(parse(bad).is_err(), "{bad:?}");
    }
}

#[test]
fn ramp_bodies_send_what_was_given_or_nulls() {
    assert_eq!(
        ramp(&["set-ramp", "c", "--seconds", "300", "--from", "0.05"]),
        json!({"ramp_up_s": 300.0, "ramp_from": 0.05})
    );
    assert_eq!(
        ramp(&["set-ramp", "c", "--seconds", "0"]),
        json!({"ramp_up_s": 0.0})
    );
    assert_eq!(
        ramp(&["set-ramp", "c", "--default"]),
        json!({"ramp_up_s": null, "ramp_from": null})
    );
    assert!(parse(&["set-ramp", "c"]).is_err());
    assert!(parse(&["set-ramp", "c", "--default", "--seconds", "5"]).is_err());
    let nan = match parse(&["set-ramp", "c", "--seconds", "NaN"]).unwrap() {
        CampaignCommand::SetRamp(r) => ramp_body(&r),
        other => panic!("{other:?}"),
    };
    assert!(nan.is_err());
}

fn policy(v: Value) -> PolicyOut {
    serde_json::from_value(v).unwrap()
}

#[test]
fn policy_lines_read_as_the_operator_needs_them() {
    let p = policy(
        json!({"priority": "bulk", "ramp_up_s": null, "ramp_from": null,
                          "finish_by": null, "behind": false, "projected_finish": null}),
    );
    assert_eq!(
        ramp_text(&p, None),
        "default (limiter.ramp_up_s, limiter.ramp_from)"
    );
    assert_eq!(finish_text(&p), "none");
    assert!(p.send_window.is_none(), "absent is not null");

    let p = policy(
        json!({"priority": "high", "ramp_up_s": 300, "ramp_from": 0.05,
                          "finish_by": "2030-01-01T10:00:00Z", "behind": true,
                          "projected_finish": "2030-01-01T11:00:00Z",
                          "send_window": null}),
    );
    let live: LiveOut = serde_json::from_value(json!({"active": true, "paused": false,
        "sent": 1, "failed": 0, "in_flight": 0, "open_jobs": 1, "ramp": 0.25}))
    .unwrap();
    assert_eq!(
        ramp_text(&p, Some(&live)),
        "300 s from 5% of send_rate; ramping: 25% of send_rate now"
    );
    assert_eq!(
        finish_text(&p),
        "2030-01-01T10:00:00+00:00  BEHIND: projected finish 2030-01-01T11:00:00+00:00"
    );
    assert_eq!(p.send_window, Some(Value::Null));
    assert_eq!(window_text(&Value::Null), "none (any hour)");
    assert_eq!(
        window_text(&json!({"from": "09:00", "to": "21:00", "days": ["mon", "fri"]})),
        "09:00–21:00 local, mon,fri"
    );
    assert_eq!(
        window_text(&json!({"from": "09:00", "to": "21:00", "days": DAYS})),
        "09:00–21:00 local, every day"
    );
    assert_eq!(
        next_window_text(&json!({"zone": "Europe/Paris", "opens": "a", "closes": null})),
        "Europe/Paris: opens a, closes –"
    );
}

fn rows(policy: Value) -> Vec<(&'static str, String)> {
    let c: CampaignOut = serde_json::from_value(json!({
        "id": "c", "send_rate": 10.0, "algorithm": "gcra", "burst": 0,
        "status": "active", "sent": 0, "failed": 0, "retried": 0, "rate_10s": 0.0,
        "active": false, "live": null, "policy": policy,
        "created_at": "2026-01-01T00:00:00Z", "updated_at": "2026-01-01T00:00:00Z",
    }))
    .unwrap();
    policy_rows(&c)
}

fn keys(rows: &[(&'static str, String)]) -> Vec<&'static str> {
    rows.iter().map(|(k, _)| *k).collect()
}

#[test]
fn window_lines_show_only_from_an_api_that_has_windows() {
    let base = json!({"priority": "normal", "behind": false});
    assert_eq!(keys(&rows(base.clone())), ["priority", "ramp", "finish_by"]);
    // Windows known, none set: the line says so; the late policy is left out.
    let mut none = base.clone();
    none["late_policy"] = json!("next_window");
    let r = rows(none);
    assert_eq!(keys(&r), ["priority", "ramp", "finish_by", "window"]);
    assert_eq!(r[3].1, "none (any hour)");
    let mut set = base;
    set["late_policy"] = json!("skip");
    set["send_window"] = json!({"from": "09:00", "to": "21:00", "days": ["sat", "sun"]});
    set["deliver_at_local"] = json!("10:00");
    set["next_windows"] = json!([{"zone": "UTC", "opens": "o", "closes": "c"}]);
    let r = rows(set);
    assert_eq!(
        r[3..],
        [
            ("window", "09:00–21:00 local, sat,sun".to_string()),
            ("deliver_at", "10:00 local".to_string()),
            ("late_policy", "skip".to_string()),
            ("next_window", "UTC: opens o, closes c".to_string()),
        ]
    );
}
