//! Tests of the decisions: release, resume and next_windows, across days, zones and DST.

use super::*;
use chrono::DateTime;
use serde_json::json;

/// Unix ms of an RFC 3339 time.
fn t(s: &str) -> i64 {
    DateTime::parse_from_rfc3339(s).unwrap().timestamp_millis()
}

pub(super) fn zone(s: &str) -> Zone {
    Zone::parse(s).unwrap()
}

pub(super) fn window(from: &str, to: &str, days: Option<&[&str]>) -> SendWindow {
    let mut v = json!({"from": from, "to": to});
    if let Some(d) = days {
        v["days"] = json!(d);
    }
    SendWindow::parse_json(&v).unwrap()
}

fn policy(w: Option<SendWindow>, at: Option<&str>, late: LatePolicy) -> LocalPolicy {
    let p = LocalPolicy {
        window: w,
        deliver_at_local: at.map(|s| parse_local_time(s).unwrap()),
        late,
    };
    p.validate().unwrap();
    p
}

fn now_until(close: &str) -> Release {
    Release::Now {
        closes_ms: Some(t(close)),
    }
}

const NOW: Release = Release::Now { closes_ms: None };
const WEEKDAYS: &[&str] = &["mon", "tue", "wed", "thu", "fri"];

#[test]
fn no_policy_sends_now() {
    let p = LocalPolicy::default();
    assert_eq!(
        release(&p, &zone("Europe/Madrid"), t("2026-06-15T03:00:00Z")),
        NOW
    );
    assert!(next_windows(&p, &zone("UTC"), 0, 3).is_empty());
}

#[test]
fn a_madrid_window_opens_holds_and_closes_in_local_time() {
    let madrid = zone("Europe/Madrid");
    let w = Some(window("09:00", "21:00", None));
    let p = policy(w, None, LatePolicy::NextWindow);
    // Summer (CEST, +02:00): 09:00 is 07:00Z. 2026-06-15 is a Monday.
    assert_eq!(
        release(&p, &madrid, t("2026-06-15T06:00:00Z")),
        Release::At(t("2026-06-15T07:00:00Z"))
    );
    assert_eq!(
        release(&p, &madrid, t("2026-06-15T07:00:00Z")),
        now_until("2026-06-15T19:00:00Z")
    );
    assert_eq!(
        release(&p, &madrid, t("2026-06-15T18:59:59Z")),
        now_until("2026-06-15T19:00:00Z")
    );
    // Winter (CET, +01:00): 09:00 is 08:00Z.
    assert_eq!(
        release(&p, &madrid, t("2026-01-15T07:30:00Z")),
        Release::At(t("2026-01-15T08:00:00Z"))
    );
    // Closed (21:00 local): late, per policy.
    let closed = t("2026-06-15T19:00:00Z");
    assert_eq!(
        release(&p, &madrid, closed),
        Release::At(t("2026-06-16T07:00:00Z"))
    );
    let send_now = LocalPolicy {
        late: LatePolicy::SendNow,
        ..p
    };
    assert_eq!(release(&send_now, &madrid, closed), NOW);
    let skip = LocalPolicy {
        late: LatePolicy::Skip,
        ..p
    };
    assert_eq!(release(&skip, &madrid, closed), Release::Skip);
    // Before the opening is never late, whatever the policy.
    assert_eq!(
        release(&skip, &madrid, t("2026-06-15T06:00:00Z")),
        Release::At(t("2026-06-15T07:00:00Z"))
    );
    // 23:30 local (21:30Z): still the 15th there, and late.
    assert_eq!(
        release(&skip, &madrid, t("2026-06-15T21:30:00Z")),
        Release::Skip
    );
    // 00:30 local on the 16th (22:30Z on the 15th) is before the 16th's window.
    assert_eq!(
        release(&skip, &madrid, t("2026-06-15T22:30:00Z")),
        Release::At(t("2026-06-16T07:00:00Z"))
    );
}

#[test]
fn new_york_and_tokyo_use_their_own_local_day() {
    let ny = zone("America/New_York");
    let p = policy(
        Some(window("09:00", "21:00", None)),
        None,
        LatePolicy::NextWindow,
    );
    assert_eq!(
        release(&p, &ny, t("2026-06-15T12:00:00Z")),
        Release::At(t("2026-06-15T13:00:00Z"))
    );
    // 22:00 EDT on the 15th is 02:00Z on the 16th: late on the 15th there.
    assert_eq!(
        release(&p, &ny, t("2026-06-16T02:00:00Z")),
        Release::At(t("2026-06-16T13:00:00Z"))
    );

    // Tokyo has no DST: 09:00 JST is 00:00Z all year.
    let tokyo = zone("Asia/Tokyo");
    assert_eq!(
        release(&p, &tokyo, t("2026-01-14T23:30:00Z")),
        Release::At(t("2026-01-15T00:00:00Z"))
    );
    assert_eq!(
        release(&p, &tokyo, t("2026-06-15T03:00:00Z")),
        now_until("2026-06-15T12:00:00Z")
    );
    // 23:30Z on Monday the 15th is 08:30 on Tuesday in Tokyo: a Monday-only window waits
    // for the next Monday there.
    let mondays = policy(
        Some(window("09:00", "21:00", Some(&["mon"]))),
        None,
        LatePolicy::Skip,
    );
    assert_eq!(
        release(&mondays, &tokyo, t("2026-06-15T23:30:00Z")),
        Release::At(t("2026-06-22T00:00:00Z"))
    );
}

#[test]
fn a_day_outside_the_mask_waits_without_being_late() {
    let madrid = zone("Europe/Madrid");
    let p = policy(
        Some(window("09:00", "21:00", Some(WEEKDAYS))),
        None,
        LatePolicy::Skip,
    );
    // Saturday 2026-06-20, 10:00 local: inside the hours, not on an allowed day.
    let monday_open = Release::At(t("2026-06-22T07:00:00Z"));
    assert_eq!(release(&p, &madrid, t("2026-06-20T08:00:00Z")), monday_open);
    assert_eq!(release(&p, &madrid, t("2026-06-21T20:00:00Z")), monday_open);
    // Friday after its close is late: skip, or Monday's opening.
    assert_eq!(
        release(&p, &madrid, t("2026-06-19T20:00:00Z")),
        Release::Skip
    );
    let next = LocalPolicy {
        late: LatePolicy::NextWindow,
        ..p
    };
    assert_eq!(
        release(&next, &madrid, t("2026-06-19T20:00:00Z")),
        monday_open
    );
    // A hand-built mask with no day never opens, and the search still ends.
    let never = LocalPolicy {
        window: Some(SendWindow {
            from_min: 540,
            to_min: 1260,
            days: 0,
        }),
        ..p
    };
    assert_eq!(
        release(&never, &madrid, t("2026-06-20T08:00:00Z")),
        Release::Skip
    );
    assert!(next_windows(&never, &madrid, 0, 5).is_empty());
}

#[test]
fn deliver_at_local_goes_out_at_its_hour_or_per_the_late_policy() {
    let madrid = zone("Europe/Madrid");
    let p = policy(None, Some("10:00"), LatePolicy::NextWindow);
    // 10:00 CEST is 08:00Z.
    assert_eq!(
        release(&p, &madrid, t("2026-06-15T07:59:00Z")),
        Release::At(t("2026-06-15T08:00:00Z"))
    );
    assert_eq!(release(&p, &madrid, t("2026-06-15T08:00:00Z")), NOW);
    // Within the grace: on time.
    assert_eq!(release(&p, &madrid, t("2026-06-15T08:00:30Z")), NOW);
    assert_eq!(
        release(&p, &madrid, t("2026-06-15T08:00:00Z") + ON_TIME_GRACE_MS),
        NOW
    );
    let late = t("2026-06-15T08:00:00Z") + ON_TIME_GRACE_MS + 1;
    assert_eq!(
        release(&p, &madrid, late),
        Release::At(t("2026-06-16T08:00:00Z"))
    );
    let send_now = LocalPolicy {
        late: LatePolicy::SendNow,
        ..p
    };
    assert_eq!(release(&send_now, &madrid, late), NOW);
    let skip = LocalPolicy {
        late: LatePolicy::Skip,
        ..p
    };
    assert_eq!(release(&skip, &madrid, late), Release::Skip);
    // Fixed offsets: +05:30's 10:00 is 04:30Z.
    let ist = zone("+05:30");
    assert_eq!(
        release(&p, &ist, t("2026-06-15T04:00:00Z")),
        Release::At(t("2026-06-15T04:30:00Z"))
    );
    assert_eq!(
        release(&skip, &ist, t("2026-06-15T05:00:00Z")),
        Release::Skip
    );
}

#[test]
fn deliver_at_local_inside_a_window_keeps_the_windows_end_and_days() {
    let madrid = zone("Europe/Madrid");
    let w = Some(window("09:00", "21:00", Some(WEEKDAYS)));
    let p = policy(w, Some("10:00"), LatePolicy::SendNow);
    assert_eq!(
        release(&p, &madrid, t("2026-06-15T08:00:10Z")),
        now_until("2026-06-15T19:00:00Z")
    );
    // Late but inside the window: sent now, until the window's end.
    assert_eq!(
        release(&p, &madrid, t("2026-06-15T12:00:00Z")),
        now_until("2026-06-15T19:00:00Z")
    );
    // Late and after the window: send now means now.
    assert_eq!(release(&p, &madrid, t("2026-06-15T20:00:00Z")), NOW);
    let next = LocalPolicy {
        late: LatePolicy::NextWindow,
        ..p
    };
    assert_eq!(
        release(&next, &madrid, t("2026-06-15T12:00:00Z")),
        Release::At(t("2026-06-16T08:00:00Z"))
    );
    // Friday late: Monday at 10:00. Saturday: Monday too, not late.
    assert_eq!(
        release(&next, &madrid, t("2026-06-19T12:00:00Z")),
        Release::At(t("2026-06-22T08:00:00Z"))
    );
    let skip = LocalPolicy {
        late: LatePolicy::Skip,
        ..p
    };
    assert_eq!(
        release(&skip, &madrid, t("2026-06-20T12:00:00Z")),
        Release::At(t("2026-06-22T08:00:00Z"))
    );
    assert_eq!(
        next_windows(&p, &madrid, t("2026-06-19T12:00:00Z"), 2),
        vec![
            (t("2026-06-19T08:00:00Z"), t("2026-06-19T19:00:00Z")),
            (t("2026-06-22T08:00:00Z"), t("2026-06-22T19:00:00Z"))
        ]
    );
}

#[test]
fn madrid_spring_forward_opens_a_skipped_time_at_the_gaps_end() {
    // 2026-03-29 (a Sunday): 02:00 CET becomes 03:00 CEST at 01:00Z.
    let madrid = zone("Europe/Madrid");
    let p = policy(
        Some(window("02:30", "21:00", None)),
        None,
        LatePolicy::NextWindow,
    );
    // 01:45 CET: waits for 02:30, which the clocks skip: it opens at 03:00 CEST.
    assert_eq!(
        release(&p, &madrid, t("2026-03-29T00:45:00Z")),
        Release::At(t("2026-03-29T01:00:00Z"))
    );
    assert_eq!(
        release(&p, &madrid, t("2026-03-29T01:00:00Z")),
        now_until("2026-03-29T19:00:00Z")
    );
    // The day before, in CET, it opened at 01:30Z and closed at 20:00Z.
    assert_eq!(
        release(&p, &madrid, t("2026-03-28T20:00:00Z")),
        Release::At(t("2026-03-29T01:00:00Z"))
    );
    // A 09:00 window moves from 08:00Z to 07:00Z across the change.
    let nine = policy(
        Some(window("09:00", "21:00", None)),
        None,
        LatePolicy::NextWindow,
    );
    assert_eq!(
        release(&nine, &madrid, t("2026-03-28T20:00:00Z")),
        Release::At(t("2026-03-29T07:00:00Z"))
    );
    assert_eq!(
        next_windows(&nine, &madrid, t("2026-03-28T12:00:00Z"), 3),
        vec![
            (t("2026-03-28T08:00:00Z"), t("2026-03-28T20:00:00Z")),
            (t("2026-03-29T07:00:00Z"), t("2026-03-29T19:00:00Z")),
            (t("2026-03-30T07:00:00Z"), t("2026-03-30T19:00:00Z")),
        ]
    );
    // A window wholly in the gap opens at its end for its usual half hour.
    let gap = policy(Some(window("02:00", "02:30", None)), None, LatePolicy::Skip);
    assert_eq!(
        release(&gap, &madrid, t("2026-03-29T00:30:00Z")),
        Release::At(t("2026-03-29T01:00:00Z"))
    );
    assert_eq!(
        release(&gap, &madrid, t("2026-03-29T01:00:00Z")),
        now_until("2026-03-29T01:30:00Z")
    );
    // deliver_at_local in the gap: the gap's end.
    let at = policy(None, Some("02:30"), LatePolicy::Skip);
    assert_eq!(
        release(&at, &madrid, t("2026-03-29T00:59:59Z")),
        Release::At(t("2026-03-29T01:00:00Z"))
    );
    assert_eq!(release(&at, &madrid, t("2026-03-29T01:00:30Z")), NOW);
}

#[test]
fn new_york_spring_forward() {
    // 2026-03-08: 02:00 EST becomes 03:00 EDT at 07:00Z.
    let ny = zone("America/New_York");
    let p = policy(None, Some("02:30"), LatePolicy::NextWindow);
    assert_eq!(
        release(&p, &ny, t("2026-03-08T06:30:00Z")),
        Release::At(t("2026-03-08T07:00:00Z"))
    );
    // 09:00 EST on the 7th was 14:00Z; 09:00 EDT on the 8th is 13:00Z.
    let nine = policy(
        Some(window("09:00", "17:00", None)),
        None,
        LatePolicy::NextWindow,
    );
    assert_eq!(
        release(&nine, &ny, t("2026-03-07T23:00:00Z")),
        Release::At(t("2026-03-08T13:00:00Z"))
    );
    assert_eq!(
        release(&nine, &ny, t("2026-03-07T13:00:00Z")),
        Release::At(t("2026-03-07T14:00:00Z"))
    );
    // Late on the 8th (02:30 passed): the 9th's 02:30 EDT, 06:30Z.
    assert_eq!(
        release(&p, &ny, t("2026-03-08T12:00:00Z")),
        Release::At(t("2026-03-09T06:30:00Z"))
    );
}

#[test]
fn madrid_fall_back_takes_the_earlier_of_a_repeated_time() {
    // 2026-10-25: 03:00 CEST becomes 02:00 CET at 01:00Z; 02:30 happens twice.
    let madrid = zone("Europe/Madrid");
    let p = policy(None, Some("02:30"), LatePolicy::NextWindow);
    assert_eq!(
        release(&p, &madrid, t("2026-10-25T00:00:00Z")),
        Release::At(t("2026-10-25T00:30:00Z"))
    );
    assert_eq!(release(&p, &madrid, t("2026-10-25T00:30:00Z")), NOW);
    // The second 02:30 (CET, 01:30Z) is an hour late: the next day's 02:30 CET.
    assert_eq!(
        release(&p, &madrid, t("2026-10-25T01:30:00Z")),
        Release::At(t("2026-10-26T01:30:00Z"))
    );
    // 09:00–21:00 that day is in CET: 08:00Z–20:00Z; the day before in CEST.
    let nine = policy(
        Some(window("09:00", "21:00", None)),
        None,
        LatePolicy::NextWindow,
    );
    assert_eq!(
        release(&nine, &madrid, t("2026-10-24T20:00:00Z")),
        Release::At(t("2026-10-25T08:00:00Z"))
    );
    assert_eq!(
        release(&nine, &madrid, t("2026-10-25T19:59:00Z")),
        now_until("2026-10-25T20:00:00Z")
    );
    // A window ending at a repeated time ends at its first pass.
    let early = policy(Some(window("01:00", "02:30", None)), None, LatePolicy::Skip);
    assert_eq!(
        release(&early, &madrid, t("2026-10-25T00:00:00Z")),
        now_until("2026-10-25T00:30:00Z")
    );
    assert_eq!(
        release(&early, &madrid, t("2026-10-25T01:00:00Z")),
        Release::Skip
    );
}

#[test]
fn fixed_offsets_have_no_dst() {
    let p = policy(
        Some(window("09:00", "21:00", None)),
        None,
        LatePolicy::NextWindow,
    );
    let plus2 = zone("+0200");
    for day in ["2026-01-15", "2026-03-29", "2026-06-15", "2026-10-25"] {
        let open = t(&format!("{day}T07:00:00Z"));
        assert_eq!(release(&p, &plus2, open - 1), Release::At(open), "{day}");
    }
    let minus = zone("-05:30");
    assert_eq!(
        release(&p, &minus, t("2026-06-15T14:00:00Z")),
        Release::At(t("2026-06-15T14:30:00Z"))
    );
    assert_eq!(
        release(&p, &minus, t("2026-06-15T15:00:00Z")),
        now_until("2026-06-16T02:30:00Z")
    );
    let utc = zone("Z");
    let all_day = policy(Some(window("00:00", "24:00", None)), None, LatePolicy::Skip);
    assert_eq!(
        release(&all_day, &utc, t("2026-06-15T23:59:59Z")),
        now_until("2026-06-16T00:00:00Z")
    );
}

#[test]
fn next_windows_lists_the_days_ahead() {
    let madrid = zone("Europe/Madrid");
    let p = policy(
        Some(window("09:00", "21:00", Some(WEEKDAYS))),
        None,
        LatePolicy::NextWindow,
    );
    // Friday 2026-06-19 at noon: today's (open now), then Monday and Tuesday.
    assert_eq!(
        next_windows(&p, &madrid, t("2026-06-19T10:00:00Z"), 3),
        vec![
            (t("2026-06-19T07:00:00Z"), t("2026-06-19T19:00:00Z")),
            (t("2026-06-22T07:00:00Z"), t("2026-06-22T19:00:00Z")),
            (t("2026-06-23T07:00:00Z"), t("2026-06-23T19:00:00Z")),
        ]
    );
    // After Friday's close, Monday comes first.
    let after = next_windows(&p, &madrid, t("2026-06-19T19:00:00Z"), 1);
    assert_eq!(
        after,
        vec![(t("2026-06-22T07:00:00Z"), t("2026-06-22T19:00:00Z"))]
    );
    assert_eq!(next_windows(&p, &madrid, 0, 1000).len(), MAX_NEXT_WINDOWS);
    let once_a_week = policy(
        Some(window("09:00", "10:00", Some(&["sun"]))),
        None,
        LatePolicy::Skip,
    );
    assert_eq!(
        next_windows(&once_a_week, &madrid, 0, 1000).len(),
        MAX_NEXT_WINDOWS
    );
    // deliver_at_local alone: its minute of grace.
    let at = policy(None, Some("10:00"), LatePolicy::Skip);
    let list = next_windows(&at, &madrid, t("2026-06-15T09:00:00Z"), 1);
    assert_eq!(
        list,
        vec![(t("2026-06-16T08:00:00Z"), t("2026-06-16T08:01:00Z"))]
    );
}

#[test]
fn a_job_paused_at_its_windows_close_resumes_at_the_next_opening_whatever_the_policy() {
    let madrid = zone("Europe/Madrid");
    let w = Some(window("09:00", "21:00", Some(WEEKDAYS)));
    let closed = t("2026-06-19T19:00:00Z"); // Friday 21:00 local
    for late in LatePolicy::ALL {
        for at in [None, Some("10:00")] {
            let p = policy(w, at, late);
            assert_eq!(
                resume(&p, &madrid, closed),
                Release::At(t("2026-06-22T07:00:00Z"))
            );
            let monday = t("2026-06-22T07:00:00Z");
            assert_eq!(
                resume(&p, &madrid, monday),
                now_until("2026-06-22T19:00:00Z")
            );
        }
    }
    let no_window = policy(None, Some("10:00"), LatePolicy::Skip);
    assert_eq!(resume(&no_window, &madrid, closed), NOW);
}

/// Over a year of hours in zones with DST at odd times, every decision is coherent: a
/// wait ends in the future, and at its end the job goes out; a window's end is ahead.
#[test]
fn every_wait_ends_in_a_release_across_dst_changes() {
    let zones = [
        "Europe/Madrid",
        "America/New_York",
        "Asia/Tokyo",
        "America/Santiago",
        "America/Havana",
        "Australia/Lord_Howe",
        "Pacific/Apia",
        "+05:45",
        "-09:30",
    ];
    let policies = [
        policy(
            Some(window("02:30", "03:00", None)),
            None,
            LatePolicy::NextWindow,
        ),
        policy(
            Some(window("00:00", "00:30", Some(&["sun", "sat"]))),
            None,
            LatePolicy::Skip,
        ),
        policy(
            Some(window("09:00", "24:00", Some(WEEKDAYS))),
            Some("23:30"),
            LatePolicy::SendNow,
        ),
        policy(None, Some("00:15"), LatePolicy::NextWindow),
        policy(None, Some("02:30"), LatePolicy::Skip),
    ];
    let start = t("2026-01-01T00:17:00Z");
    for name in zones {
        let z = zone(name);
        for p in &policies {
            for h in (0..366 * 24).step_by(5) {
                let now = start + h * 3_600_000;
                match release(p, &z, now) {
                    Release::At(at) => {
                        assert!(at > now, "{name} {p:?} at {now}: waits until {at}");
                        assert!(
                            at - now <= 9 * 86_400_000,
                            "{name}: within the bounded search"
                        );
                        assert!(
                            matches!(release(p, &z, at), Release::Now { .. }),
                            "{name} {p:?} at {at}"
                        );
                    }
                    Release::Now { closes_ms: Some(c) } => assert!(c > now, "{name} {p:?}"),
                    Release::Now { closes_ms: None } | Release::Skip => {}
                }
            }
        }
    }
}

#[test]
fn extreme_instants_never_panic() {
    let p = policy(
        Some(window("09:00", "21:00", None)),
        Some("10:00"),
        LatePolicy::NextWindow,
    );
    for z in [zone("Europe/Madrid"), zone("+14:00"), zone("-14:00")] {
        for now in [
            i64::MIN,
            i64::MIN / 2,
            -1,
            0,
            i64::MAX / 2,
            i64::MAX,
            253_402_300_799_000,
        ] {
            let _ = release(&p, &z, now);
            let _ = next_windows(&p, &z, now, 3);
        }
    }
}
