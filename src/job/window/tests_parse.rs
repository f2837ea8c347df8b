//! Tests of parsing and validation: zones, windows, local times, policies, a job's `tz`.

use super::tests_release::{window, zone};
use super::*;
use serde_json::json;

#[test]
fn zones_parse_iana_names_and_offsets_to_a_canonical_form() {
    for name in [
        "Europe/Madrid",
        "America/New_York",
        "Asia/Tokyo",
        "UTC",
        "Etc/GMT+5",
    ] {
        assert_eq!(zone(name).to_string(), name);
    }
    for (input, canonical) in [
        ("+02:00", "+02:00"),
        ("+0200", "+02:00"),
        ("+02", "+02:00"),
        ("-05:30", "-05:30"),
        ("-0530", "-05:30"),
        ("+14:00", "+14:00"),
        ("-00:00", "+00:00"),
        ("Z", "+00:00"),
    ] {
        let z = zone(input);
        assert_eq!(z.to_string(), canonical, "{input}");
        assert_eq!(zone(canonical), z, "the canonical form parses back");
    }
    let z = zone("-05:30");
    assert_eq!(serde_json::to_string(&z).unwrap(), "\"-05:30\"");
    assert_eq!(serde_json::from_str::<Zone>("\"-05:30\"").unwrap(), z);
    assert!(serde_json::from_str::<Zone>("\"Mars/Olympus\"").is_err());
}

#[test]
fn bad_zones_say_why_and_echo_a_short_escaped_input() {
    let e = Zone::parse("Mars/Olympus").unwrap_err();
    assert!(e.contains("unknown time zone \"Mars/Olympus\""), "{e}");
    let e = Zone::parse("europe/madrid").unwrap_err();
    assert!(e.contains("case matters"), "{e}");
    for bad in [
        "",
        "+15:00",
        "-14:01",
        "+02:60",
        "+2:00",
        "+02:0",
        "+02-00",
        "+٠٢:٠٠",
        "+",
        "UTC+2",
    ] {
        assert!(Zone::parse(bad).is_err(), "{bad:?} is refused");
    }
    let e = Zone::parse("+15:00").unwrap_err();
    assert!(e.contains("within ±14:00"), "{e}");
    let e = Zone::parse("Europe/\u{0}Madrid\n").unwrap_err();
    assert!(
        e.contains("\\0") && !e.contains('\u{0}') && !e.contains('\n'),
        "{e}"
    );
    let long = "A".repeat(65);
    let e = Zone::parse(&long).unwrap_err();
    assert!(e.contains("at most 64 characters, got 65"), "{e}");
    assert!(!e.contains(&"A".repeat(49)), "the echo is cut: {e}");
    // 64 characters is not refused for its length (only as unknown).
    assert!(Zone::parse(&"A".repeat(64))
        .unwrap_err()
        .contains("unknown time zone"));
}

#[test]
fn windows_read_and_write_their_json_form() {
    let w = window("09:00", "21:00", None);
    assert_eq!(
        w,
        SendWindow {
            from_min: 540,
            to_min: 1260,
            days: ALL_DAYS
        }
    );
    let w = window("00:00", "24:00", Some(&["sun", "mon"]));
    assert_eq!((w.from_min, w.to_min, w.days), (0, 1440, 0b100_0001));
    let text = serde_json::to_value(w).unwrap();
    assert_eq!(
        text,
        json!({"from": "00:00", "to": "24:00", "days": ["mon", "sun"]})
    );
    assert_eq!(serde_json::from_value::<SendWindow>(text).unwrap(), w);
    let null_days = json!({"from": "09:00", "to": "10:00", "days": null});
    assert_eq!(SendWindow::parse_json(&null_days).unwrap().days, ALL_DAYS);
    assert!(w.allows(chrono::Weekday::Sun) && !w.allows(chrono::Weekday::Tue));
}

#[test]
fn bad_windows_name_their_field() {
    let cases = [
        (
            json!({"from": "21:00", "to": "09:00"}),
            "send_window.to",
            "to must be after from",
        ),
        (
            json!({"from": "09:00", "to": "09:00"}),
            "send_window.to",
            "to must be after from",
        ),
        (
            json!({"from": "9:00", "to": "21:00"}),
            "send_window.from",
            "\"HH:MM\"",
        ),
        (
            json!({"from": "09:60", "to": "21:00"}),
            "send_window.from",
            "\"09:60\"",
        ),
        (
            json!({"from": "24:00", "to": "24:00"}),
            "send_window.from",
            "23:59",
        ),
        (
            json!({"from": "09:00", "to": "24:01"}),
            "send_window.to",
            "24:00",
        ),
        (
            json!({"from": "09:00", "to": "21:00:00"}),
            "send_window.to",
            "HH:MM",
        ),
        (
            json!({"from": 9, "to": "21:00"}),
            "send_window.from",
            "got a number",
        ),
        (json!({"to": "21:00"}), "send_window.from", "missing"),
        (json!({"from": "09:00"}), "send_window.to", "missing"),
        (
            json!({"from": "09:00", "to": "21:00", "days": []}),
            "send_window.days",
            "at least one day",
        ),
        (
            json!({"from": "09:00", "to": "21:00", "days": ["mon", "funday"]}),
            "send_window.days",
            "element 1: unknown day \"funday\"",
        ),
        (
            json!({"from": "09:00", "to": "21:00", "days": ["Mon"]}),
            "send_window.days",
            "unknown day",
        ),
        (
            json!({"from": "09:00", "to": "21:00", "days": [1]}),
            "send_window.days",
            "unknown day a number",
        ),
        (
            json!({"from": "09:00", "to": "21:00", "days": ["tue", "tue"]}),
            "send_window.days",
            "tue appears more than once",
        ),
        (
            json!({"from": "09:00", "to": "21:00", "days": "mon"}),
            "send_window.days",
            "an array",
        ),
        (
            json!({"form": "09:00", "to": "21:00"}),
            "send_window",
            "unknown member \"form\"",
        ),
        (json!("09:00-21:00"), "send_window", "must be an object"),
    ];
    for (v, field, problem) in cases {
        let e = SendWindow::parse_json(&v).unwrap_err();
        assert_eq!(e.field, field, "{v}: {e}");
        assert!(e.problem.contains(problem), "{v}: {e}");
        assert!(e.to_string().starts_with(&format!("{field}: ")));
    }
    assert!(SendWindow::new(600, 600, ALL_DAYS).is_err());
    assert_eq!(
        SendWindow::new(600, 660, 0).unwrap_err().field,
        "send_window.days"
    );
    assert_eq!(
        SendWindow::new(600, 660, 0x80).unwrap_err().field,
        "send_window.days"
    );
}

#[test]
fn local_times_and_late_policies_parse() {
    assert_eq!(parse_local_time("00:00"), Ok(0));
    assert_eq!(parse_local_time("23:59"), Ok(1439));
    for bad in ["24:00", "7:00", "07:5", "07h00", "", "０７:００"] {
        assert!(parse_local_time(bad).is_err(), "{bad:?}");
    }
    assert_eq!(format_local_time(1440), "24:00");
    for p in LatePolicy::ALL {
        assert_eq!(p.as_str().parse::<LatePolicy>(), Ok(p));
        let text = serde_json::to_string(&p).unwrap();
        assert_eq!(text, format!("\"{p}\""));
        assert_eq!(serde_json::from_str::<LatePolicy>(&text).unwrap(), p);
    }
    assert_eq!(LatePolicy::default(), LatePolicy::NextWindow);
    assert!("later"
        .parse::<LatePolicy>()
        .unwrap_err()
        .contains("\"later\""));
}

#[test]
fn policies_read_the_campaign_fields_together() {
    let obj = json!({"send_window": {"from": "09:00", "to": "21:00", "days": ["sat"]},
                     "deliver_at_local": "10:00", "late_policy": "skip", "other": 1});
    let p = LocalPolicy::from_object(obj.as_object().unwrap()).unwrap();
    assert_eq!(p.deliver_at_local, Some(600));
    assert_eq!(p.late, LatePolicy::Skip);
    assert_eq!(p.window.unwrap().days, 1 << 5);
    let back = serde_json::to_value(p).unwrap();
    assert_eq!(serde_json::from_value::<LocalPolicy>(back).unwrap(), p);

    let nulls = json!({"send_window": null, "deliver_at_local": null, "late_policy": null});
    let p = LocalPolicy::from_object(nulls.as_object().unwrap()).unwrap();
    assert!(p.is_empty());
    assert_eq!(p, LocalPolicy::default());

    let bad =
        |obj: serde_json::Value| LocalPolicy::from_object(obj.as_object().unwrap()).unwrap_err();
    let e =
        bad(json!({"send_window": {"from": "09:00", "to": "21:00"}, "deliver_at_local": "08:00"}));
    assert_eq!(e.field, "deliver_at_local");
    assert!(
        e.problem
            .contains("deliver_at_local must fall inside send_window (09:00–21:00)"),
        "{e}"
    );
    // `to` is not part of the window.
    let e =
        bad(json!({"send_window": {"from": "09:00", "to": "21:00"}, "deliver_at_local": "21:00"}));
    assert_eq!(e.field, "deliver_at_local");
    assert_eq!(
        bad(json!({"deliver_at_local": "25:00"})).field,
        "deliver_at_local"
    );
    assert_eq!(
        bad(json!({"deliver_at_local": 600})).field,
        "deliver_at_local"
    );
    assert_eq!(bad(json!({"late_policy": "later"})).field, "late_policy");
    assert_eq!(bad(json!({"late_policy": true})).field, "late_policy");
    assert_eq!(
        bad(json!({"send_window": {"from": "10:00", "to": "09:00"}})).field,
        "send_window.to"
    );
}

#[test]
fn jobs_carry_a_tz_that_round_trips() {
    let msg =
        br#"{"job_id":"j","campaign_id":"c","tz":"Europe/Madrid","devices":["x"],"payload":{}}"#;
    let job = crate::job::decode(msg).unwrap();
    assert_eq!(job.zone, Some(zone("Europe/Madrid")));
    assert_eq!(crate::job::decode(&job.to_json()).unwrap(), job);
    let offset = br#"{"job_id":"j","campaign_id":"c","tz":"+0530","devices":["x"],"payload":{}}"#;
    let job = crate::job::decode(offset).unwrap();
    assert!(String::from_utf8(job.to_json())
        .unwrap()
        .contains(r#""tz":"+05:30""#));
    assert_eq!(crate::job::decode(&job.to_json()).unwrap(), job);
    let none = br#"{"job_id":"j","campaign_id":"c","tz":null,"devices":["x"],"payload":{}}"#;
    assert_eq!(crate::job::decode(none).unwrap().zone, None);
    for (tz, problem) in [
        (r#""Mars/Olympus""#, "unknown time zone \"Mars/Olympus\""),
        ("2", "(a string), got a number"),
        (r#""+15:00""#, "within ±14:00"),
    ] {
        let msg = format!(
            r#"{{"job_id":"j","campaign_id":"c","tz":{tz},"devices":["x"],"payload":{{}}}}"#
        );
        let e = crate::job::decode(msg.as_bytes()).unwrap_err();
        assert_eq!(e.field(), Some("tz"), "{e}");
        assert!(e.to_string().contains(problem), "{e}");
    }
}
