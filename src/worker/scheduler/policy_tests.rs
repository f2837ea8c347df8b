//! The delivery policy on a virtual clock: priority classes under a shared cap, the
//! critical overdraft, the ramp-up's curve, its restart, the start jitter, finish-by
//! plans and the class's provider priority.

use super::ramp::start_jitter_ms;
use super::*;
use crate::job::{Priority, PriorityClass};
use crate::limiter::Algorithm;
use crate::provider::{Provider, ProviderKind};
use crate::sender::{AnySender, NullSender};

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;
/// The scheduler's clock starts well past 0, as the worker's does; the wall clock's
/// seconds start with it.
const START: Nanos = 100 * SEC;

fn scheduler(cap: Option<f64>, policy: PolicyDefaults) -> Scheduler {
    let provider = Provider {
        name: Arc::from("p"),
        kind: ProviderKind::Null,
        max_rate: cap.map(|r| Rate::per_second(r).unwrap()),
        max_in_flight: None,
        adaptive: None,
        sender: AnySender::Null(NullSender),
    };
    let providers = Providers::new(vec![provider], "p").unwrap();
    let (completions, _) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 1000,
            max_in_flight: 100_000,
            policy,
            ..SchedulerConfig::default()
        },
        Arc::new(providers),
        StatsRecorder::new(),
        completions,
        events,
    );
    s.set_wall(START, 0);
    s
}

fn settings(id: &str, rate: f64, class: PriorityClass) -> CampaignSettings {
    CampaignSettings {
        priority: class,
        ..CampaignSettings::active(id, Rate::per_second(rate).unwrap(), Algorithm::Gcra)
    }
}

/// `jobs` jobs of 10,000 devices for the campaign of `s`, taken at `now`.
fn add(sch: &mut Scheduler, s: &CampaignSettings, jobs: usize, now: Nanos) -> Arc<Job> {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let mut last = None;
    for j in 0..jobs {
        let devices = (0..10_000).map(|d| format!("{}-{j}-{d}", s.id)).collect();
        let job = Job::new(format!("{}-{j}", s.id), &*s.id, devices, payload.clone()).unwrap();
        let incoming = IncomingJob::fresh(job, 0, j as i64, s.clone());
        last = Some(Arc::clone(&incoming.job));
        sch.add_job(incoming, now);
    }
    last.expect("a job")
}

/// Sends of each campaign in each `bucket` from `from` to `until`, by id; rounds run
/// as the driver runs them, each wake-up late by 0–1 ms (seeded).
fn drive(s: &mut Scheduler, from: Nanos, until: Nanos, bucket: Nanos) -> HashMap<String, Vec<u64>> {
    let mut out: HashMap<String, Vec<u64>> = HashMap::new();
    let mut before: HashMap<String, u64> = s
        .stats()
        .campaigns
        .iter()
        .map(|c| (c.id.to_string(), c.sent))
        .collect();
    let (mut now, mut b, mut seed) = (from, 0, 0x9E37_79B9_7F4A_7C15u64);
    while now < until {
        let at = (now - from) / bucket;
        if at != b {
            // Sends so far were made in bucket `b`; a sleep over several left them empty.
            for c in s.stats().campaigns.iter() {
                let was = before.insert(c.id.to_string(), c.sent).unwrap_or(0);
                let v = out.entry(c.id.to_string()).or_default();
                v.push(c.sent - was);
                v.extend(std::iter::repeat_n(0, (at - b - 1) as usize));
            }
            b = at;
        }
        s.set_wall(now, u128::from(now - START));
        let wake = s.run_round(now, (now - START) / SEC);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        now = s.next_round_at(now, wake).max(now) + 1 + seed % MS;
    }
    out
}

#[test]
fn a_critical_campaign_behind_ten_bulk_ones_gets_its_rate_at_once() {
    let mut s = scheduler(Some(1000.0), PolicyDefaults::default());
    for i in 0..10 {
        let bulk = settings(&format!("bulk{i}"), 1000.0, PriorityClass::Bulk);
        add(&mut s, &bulk, 1, START);
    }
    let warm = drive(&mut s, START, START + 3 * SEC, SEC);
    let total = |per: &HashMap<String, Vec<u64>>, k: usize| -> u64 {
        per.values().map(|v| v.get(k).copied().unwrap_or(0)).sum()
    };
    assert!(
        (990..=1010).contains(&total(&warm, 1)),
        "saturated: {warm:?}"
    );
    let critical = settings("critical", 300.0, PriorityClass::Critical);
    let t = START + 3 * SEC;
    add(&mut s, &critical, 1, t);
    let after = drive(&mut s, t, t + 4 * SEC, SEC);
    // Its first second already holds its rate (to a send either end of the second).
    let c = &after["critical"];
    assert!(c.iter().all(|n| (298..=302).contains(n)), "critical {c:?}");
    for k in 0..4 {
        // The cap passes its rate plus one quantum_min of sends (10 ms: 10) once.
        assert!(total(&after, k) <= 1010, "second {k}: {after:?}");
    }
    // The bulk ones share the 700 left equally, within ±5%, from the second second on.
    for i in 0..10 {
        let b = &after[&format!("bulk{i}")];
        assert!(
            b[1..].iter().all(|n| (66..=74).contains(n)),
            "bulk{i}: {b:?}"
        );
    }
    let live = s.stats();
    let bulk0 = live.campaigns.iter().find(|c| &*c.id == "bulk0").unwrap();
    assert_eq!(bulk0.starved_ms, None, "70/s of 1000/s is a share");
}

#[test]
fn a_class_left_nothing_is_shown_starved_and_critical_may_overdraw() {
    let policy = PolicyDefaults {
        critical_overdraft: 0.2,
        ..PolicyDefaults::default()
    };
    let mut s = scheduler(Some(1000.0), policy);
    add(
        &mut s,
        &settings("bulk", 1000.0, PriorityClass::Bulk),
        1,
        START,
    );
    add(
        &mut s,
        &settings("crit", 2000.0, PriorityClass::Critical),
        1,
        START,
    );
    let per = drive(&mut s, START, START + 4 * SEC, SEC);
    let crit = &per["crit"];
    // 1,000/s cap + 20%: the cap's tolerance (10) once, the allowance's (2) once.
    assert!(
        crit[1..].iter().all(|n| (1195..=1205).contains(n)),
        "{crit:?}"
    );
    assert!(per["bulk"][1..].iter().all(|&n| n <= 2), "{per:?}");
    let live = s.stats();
    let bulk = live.campaigns.iter().find(|c| &*c.id == "bulk").unwrap();
    assert!(bulk.starved_ms.is_some_and(|ms| ms >= 3000), "{bulk:?}");
    assert_eq!(bulk.priority, PriorityClass::Bulk);
}

/// Sends the curve allows in `[a, b)` seconds after the start, at `rate`.
fn curve(rate: f64, from: f64, secs: f64, a: f64, b: f64) -> f64 {
    let g = (1.0 / from).ln() / secs;
    let f = |t: f64| (from * (g * t).exp()).min(1.0);
    let n = 1000;
    (0..n)
        .map(|i| f(a + (b - a) * (i as f64 + 0.5) / n as f64))
        .sum::<f64>()
        * (b - a)
        / n as f64
        * rate
}

/// A scheduler whose campaigns ramp over 30 s (from `limiter.ramp_from`'s 0.1), with
/// campaign "r" at 1,000/s holding `jobs` jobs taken at the start.
fn ramping(jobs: usize) -> (Scheduler, CampaignSettings) {
    let policy = PolicyDefaults {
        ramp_up_s: 30.0,
        ..PolicyDefaults::default()
    };
    let mut s = scheduler(None, policy);
    let set = settings("r", 1000.0, PriorityClass::Normal);
    add(&mut s, &set, jobs, START);
    (s, set)
}

#[test]
fn a_ramp_follows_its_curve_each_second_and_each_100_ms() {
    let (mut s, _) = ramping(4);
    let per = drive(&mut s, START, START + 34 * SEC, 100 * MS);
    let buckets = &per["r"];
    // Per second, from 100/s up: within ±2% of the curve's integral (and 1 send).
    for k in 0..33 {
        let n: u64 = buckets[k * 10..k * 10 + 10].iter().sum();
        let want = curve(1000.0, 0.1, 30.0, k as f64, k as f64 + 1.0);
        assert!(
            (n as f64 - want).abs() <= want * 0.02 + 1.0,
            "second {k}: {n} sends, the curve {want:.1}; {:?}",
            (0..33)
                .map(|k| (
                    buckets[k * 10..k * 10 + 10].iter().sum::<u64>(),
                    curve(1000.0, 0.1, 30.0, k as f64, k as f64 + 1.0) as u64
                ))
                .collect::<Vec<_>>()
        );
    }
    // Per 100 ms: never over a tenth of the target rate × 1.1 (plus the one send a
    // bucket's edge may carry).
    for (i, &n) in buckets.iter().enumerate().take(300) {
        let t = i as f64 / 10.0;
        let target = curve(1000.0, 0.1, 30.0, t, t + 0.1) * 10.0;
        assert!(
            n as f64 <= target / 10.0 * 1.1 + 1.0,
            "bucket {i}: {n} sends, target {target:.1}/s"
        );
    }
    let live = s.stats();
    assert_eq!(
        live.campaigns[0].ramp, None,
        "the ramp ended at the full rate"
    );
    assert_eq!(
        live.campaigns[0].effective_rate, 1000.0,
        "back at its full rate"
    );
    let full: u64 = buckets[32 * 10..33 * 10].iter().sum();
    assert!(
        (999..=1001).contains(&full),
        "a second after the ramp: {full}"
    );
}

#[test]
fn a_ramp_starts_again_after_a_pause() {
    let (mut s, set) = ramping(5);
    drive(&mut s, START, START + 31 * SEC, SEC);
    let t = START + 31 * SEC;
    s.apply_settings(
        CampaignSettings {
            paused: true,
            ..set.clone()
        },
        t,
    );
    drive(&mut s, t, t + 2 * SEC, SEC);
    let t = t + 2 * SEC;
    s.apply_settings(set, t);
    let per = drive(&mut s, t, t + 3 * SEC, SEC);
    let r = &per["r"];
    let first = curve(1000.0, 0.1, 30.0, 0.0, 1.0);
    assert!((r[0] as f64 - first).abs() <= first * 0.02 + 1.0, "{r:?}");
    let ramp = s.stats().campaigns[0].ramp.expect("ramping");
    assert!(ramp > 0.1 && ramp < 0.2, "{ramp}");
}

#[test]
fn a_scheduled_start_is_put_off_by_the_campaigns_own_jitter() {
    let policy = PolicyDefaults {
        start_jitter: Duration::from_secs(10),
        ..PolicyDefaults::default()
    };
    let mut s = scheduler(None, policy);
    let jitter = start_jitter_ms("jit", 10_000);
    assert!(jitter > 0, "this id's jitter is not 0");
    let set = CampaignSettings {
        start_at_ms: Some(2000),
        ..settings("jit", 100.0, PriorityClass::Normal)
    };
    add(&mut s, &set, 1, START);
    let per = drive(&mut s, START, START + 14 * SEC, 100 * MS);
    let first = per["jit"].iter().position(|&n| n > 0).expect("it started") as i64;
    // The first send's bucket is the one its jittered start falls in.
    assert_eq!(first, (2000 + jitter) / 100, "jitter {jitter} ms");
}

#[test]
fn a_plan_sets_the_rate_under_its_send_rate() {
    let mut s = scheduler(None, PolicyDefaults::default());
    add(
        &mut s,
        &settings("f", 500.0, PriorityClass::Normal),
        1,
        START,
    );
    s.apply_plan(
        Arc::from("f"),
        Some(Rate::per_second(200.0).unwrap()),
        START,
    );
    let per = drive(&mut s, START, START + 3 * SEC, SEC);
    assert!(
        per["f"][1..].iter().all(|n| (199..=201).contains(n)),
        "{per:?}"
    );
    // A plan above the send_rate is held to it.
    let t = START + 3 * SEC;
    s.apply_plan(Arc::from("f"), Some(Rate::per_second(5000.0).unwrap()), t);
    let per = drive(&mut s, t, t + 3 * SEC, SEC);
    assert!(
        per["f"][1..].iter().all(|n| (499..=501).contains(n)),
        "{per:?}"
    );
    assert_eq!(s.stats().campaigns[0].effective_rate, 500.0);
}

#[test]
fn jobs_carry_their_class_priority_until_the_class_changes() {
    let mut s = scheduler(None, PolicyDefaults::default());
    let set = settings("c", 10.0, PriorityClass::Critical);
    let job = add(&mut s, &set, 1, START);
    assert_eq!(job.push_priority(), Some(Priority::High));
    s.apply_settings(
        CampaignSettings {
            priority: PriorityClass::Bulk,
            ..set
        },
        START + SEC,
    );
    assert_eq!(job.push_priority(), Some(Priority::Normal));
}

#[test]
fn after_a_ceiling_lifts_the_rate_climbs_from_where_it_was_held() {
    let (mut s, _) = ramping(6);
    // Past its first ramp, at its full rate.
    let t = START + 35 * SEC;
    drive(&mut s, START, t, SEC);
    // An adaptive ceiling held it at 200/s, then lifts (the lanes call this then).
    let slot = *s.by_id.get("r").expect("held");
    s.set_effective_rate(slot, Some(Rate::per_second(200.0).unwrap()), t);
    s.ramp_after_lift(0, t);
    let sent = drive(&mut s, t, t + 30 * SEC, SEC)["r"].clone();
    // From 0.2 on the curve's k = 10^(1/30): about 21 s to the full rate, each second
    // about k times the one before, never a jump.
    assert!((200..=215).contains(&sent[0]), "{sent:?}");
    for w in sent.windows(2).take(20) {
        assert!(
            w[1] as f64 <= w[0] as f64 * 1.1 + 1.0,
            "a step over 1.1x: {sent:?}"
        );
    }
    assert!((999..=1001).contains(&sent[25]), "{sent:?}");
    let live = s.stats();
    assert_eq!(live.campaigns[0].effective_rate, 1000.0);
    assert_eq!(live.campaigns[0].ramp, None);
}
