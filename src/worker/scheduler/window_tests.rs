//! Recipients' local-time windows in the scheduler, on a virtual clock anchored to real
//! dates, across a DST change (Europe/Madrid moves from CET to CEST on 2026-03-29).

use super::*;
use crate::job::window::{LatePolicy, LocalPolicy, SendWindow, Zone, ALL_DAYS};
use crate::limiter::Algorithm;
use crate::sender::{AnySender, NullSender};
use crate::worker::outcomes::Outcomes;
use chrono::DateTime;

const SEC: Nanos = NANOS_PER_SEC;
/// The virtual clock's start, well past 0 as the worker's is.
const START: Nanos = 100 * SEC;
/// A job's devices at 100/s go out within this of its release: 20 devices take 0.19 s,
/// and a round waits at most one quantum (1 s at this rate) for its wake-up.
const RELEASE_SLACK_MS: i64 = 1_500;

fn unix_ms(rfc3339: &str) -> i64 {
    DateTime::parse_from_rfc3339(rfc3339)
        .expect("instant")
        .timestamp_millis()
}

/// A scheduler whose clock reads `at` (RFC 3339) at [`START`].
fn scheduler(at: &str) -> (Scheduler, std::sync::mpsc::Receiver<Event>, i64) {
    let (completions, _) = mpsc::unbounded_channel();
    let (events, erx) = std::sync::mpsc::channel();
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 10,
            max_in_flight: 10_000,
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions,
        events,
    );
    let t0 = unix_ms(at);
    s.set_wall(START, t0 as u128 * 1_000_000);
    (s, erx, t0)
}

fn local(window: Option<(u16, u16)>, at: Option<u16>, late: LatePolicy) -> LocalPolicy {
    LocalPolicy {
        window: window.map(|(f, t)| SendWindow::new(f, t, ALL_DAYS).expect("window")),
        deliver_at_local: at,
        late,
    }
}

fn settings(local: LocalPolicy) -> CampaignSettings {
    CampaignSettings {
        local,
        ..CampaignSettings::active("c", Rate::per_second(100.0).unwrap(), Algorithm::Gcra)
    }
}

fn add(s: &mut Scheduler, st: &CampaignSettings, offset: i64, zone: &str, devices: usize) {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let devices = (0..devices).map(|d| format!("{zone}-{d}")).collect();
    let job = Job::new(format!("j{offset}"), "c", devices, payload)
        .unwrap()
        .with_zone(Some(Zone::parse(zone).expect("zone")));
    s.add_job(IncomingJob::fresh(job, 0, offset, st.clone()), START);
}

/// Runs rounds as the driver does for `secs`, each at the wake-up it asked for; returns
/// each finished job's offset with the unix ms it finished at, and the sends per
/// virtual second.
fn drive(
    s: &mut Scheduler,
    events: &std::sync::mpsc::Receiver<Event>,
    t0: i64,
    secs: u64,
) -> (Vec<(i64, i64)>, HashMap<i64, u64>) {
    let mut finished = Vec::new();
    let mut per_second: HashMap<i64, u64> = HashMap::new();
    let mut now = START;
    while now < START + secs * SEC {
        let ms = t0 + ((now - START) / 1_000_000) as i64;
        s.set_wall(now, ms as u128 * 1_000_000);
        let before = s.stats().sends;
        let wake = s.run_round(now, (ms / 1000) as u64);
        let sent = s.stats().sends - before;
        if sent > 0 {
            *per_second.entry(ms / 1000).or_default() += sent;
        }
        while let Ok(e) = events.try_recv() {
            let Event::JobFinished { offset, .. } = e;
            finished.push((offset, ms));
        }
        now = s.next_round_at(now, wake).max(now + 1);
    }
    (finished, per_second)
}

fn finished_at(finished: &[(i64, i64)], offset: i64) -> i64 {
    finished
        .iter()
        .find(|(o, _)| *o == offset)
        .map(|(_, t)| *t)
        .unwrap_or_else(|| panic!("job {offset} never finished: {finished:?}"))
}

#[test]
fn three_zones_each_start_when_their_window_opens_across_a_dst_change() {
    // 20:00Z on Saturday 2026-03-28: 21:00 in Madrid (its window just closed), 16:00
    // in New York (open), 05:00 on Sunday in Tokyo (not open yet).
    let (mut s, events, t0) = scheduler("2026-03-28T20:00:00Z");
    let st = settings(local(Some((9 * 60, 21 * 60)), None, LatePolicy::NextWindow));
    add(&mut s, &st, 0, "Europe/Madrid", 20);
    add(&mut s, &st, 1, "America/New_York", 20);
    add(&mut s, &st, 2, "Asia/Tokyo", 20);
    let (finished, _) = drive(&mut s, &events, t0, 12 * 3600);
    let within = |offset: i64, opens: &str| {
        let (at, open) = (finished_at(&finished, offset), unix_ms(opens));
        assert!(
            (open..=open + RELEASE_SLACK_MS).contains(&at),
            "job {offset}: finished at {at}, its window opened at {open} ({opens})"
        );
    };
    within(1, "2026-03-28T20:00:00Z");
    // 09:00 JST on the 29th.
    within(2, "2026-03-29T00:00:00Z");
    // 09:00 in Madrid on the 29th is CEST (+02:00) since 02:00 that night: 07:00Z,
    // not the 08:00Z a fixed +01:00 would give.
    within(0, "2026-03-29T07:00:00Z");
    assert_eq!(s.stats().sends, 60);
}

#[test]
fn a_window_that_closes_mid_job_holds_the_rest_until_it_opens_again() {
    // 20:59:50 in UTC: ten seconds of the window left, 20 s of work at 10/s.
    let (mut s, events, t0) = scheduler("2026-03-28T20:59:50Z");
    let mut st = settings(local(Some((9 * 60, 21 * 60)), None, LatePolicy::NextWindow));
    st.rate = Rate::per_second(10.0).unwrap();
    add(&mut s, &st, 0, "UTC", 200);
    let (finished, per_second) = drive(&mut s, &events, t0, 12 * 3600 + 30);
    let close = unix_ms("2026-03-28T21:00:00Z") / 1000;
    let open = unix_ms("2026-03-29T09:00:00Z") / 1000;
    let before: u64 = per_second
        .iter()
        .filter(|(t, _)| **t < close)
        .map(|(_, n)| n)
        .sum();
    let between: u64 = per_second
        .iter()
        .filter(|(t, _)| (close..open).contains(*t))
        .map(|(_, n)| n)
        .sum();
    // The limiter may let one more out in the window's last instant.
    assert!(
        (99..=101).contains(&before),
        "sent before the close: {before}"
    );
    assert_eq!(between, 0, "nothing while the window is closed");
    let at = finished_at(&finished, 0);
    assert!(
        at >= open * 1000 + 9_000,
        "the rest took its 10 s at 10/s: {at}"
    );
}

#[test]
fn late_policy_send_now_next_window_and_skip() {
    // 10:30Z: a 10:00 local deliver time in UTC has passed today.
    for late in [
        LatePolicy::SendNow,
        LatePolicy::NextWindow,
        LatePolicy::Skip,
    ] {
        let (mut s, events, t0) = scheduler("2026-06-01T10:30:00Z");
        let (outcomes, mut letters) = Outcomes::for_test(16);
        s.set_outcomes(outcomes.clone());
        let st = settings(local(None, Some(10 * 60), late));
        add(&mut s, &st, 7, "UTC", 20);
        let secs = if late == LatePolicy::NextWindow {
            24 * 3600
        } else {
            60
        };
        let (finished, _) = drive(&mut s, &events, t0, secs);
        let c = s.stats().campaigns.iter().find(|c| &*c.id == "c").cloned();
        match late {
            LatePolicy::SendNow => {
                assert!(finished_at(&finished, 7) <= t0 + RELEASE_SLACK_MS);
            }
            LatePolicy::NextWindow => {
                // Not today: at 10:00 tomorrow.
                let tomorrow = unix_ms("2026-06-02T10:00:00Z");
                let at = finished_at(&finished, 7);
                assert!(
                    (tomorrow..=tomorrow + RELEASE_SLACK_MS).contains(&at),
                    "{at}"
                );
            }
            LatePolicy::Skip => {
                assert_eq!(s.stats().sends, 0);
                assert_eq!(c.map(|c| c.expired), Some(20));
                let (_, record) = letters.try_recv().expect("one letter");
                let Record::DeadLetter(l) = record else {
                    panic!("a dead letter")
                };
                assert_eq!((l.kind, l.offset), (DeadLetterKind::Expired, 7));
                assert!(
                    l.reason.contains("20 of 20 devices")
                        && l.reason.contains("deliver_at_local 10:00")
                        && l.reason.contains("late_policy is skip"),
                    "{}",
                    l.reason
                );
                assert!(letters.try_recv().is_err(), "one letter per job");
            }
        }
    }
}
