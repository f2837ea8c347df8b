//! Pacing with many campaigns on a virtual clock: each whole second of a campaign must
//! hold its rate to a send, whatever job boundaries, other campaigns and late wake-ups
//! fall in it.

use super::*;
use crate::limiter::Algorithm;
use crate::sender::{AnySender, NullSender};

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;

fn scheduler(max_in_flight: usize) -> Scheduler {
    let (completions, _) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 1000,
            max_in_flight,
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions,
        events,
    )
}

/// `jobs` jobs of `size` devices for campaign `id` at `rate`.
fn add(s: &mut Scheduler, id: &str, rate: f64, jobs: usize, size: usize) {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let settings = CampaignSettings::active(id, Rate::per_second(rate).unwrap(), Algorithm::Gcra);
    for j in 0..jobs {
        let devices = (0..size).map(|d| format!("{id}-{j}-{d}")).collect();
        let job = Job::new(format!("{id}-{j}"), id, devices, payload.clone()).unwrap();
        s.add_job(IncomingJob::fresh(job, 0, j as i64, settings.clone()), 0);
    }
}

/// Drives rounds as the driver does, each wake-up `late` after the instant asked for,
/// until `until`; returns each campaign's sends in every whole second, by id.
fn per_second(s: &mut Scheduler, until: Nanos, late: Nanos) -> HashMap<String, Vec<u64>> {
    let mut out: HashMap<String, Vec<u64>> = HashMap::new();
    let mut before: HashMap<String, u64> = HashMap::new();
    let mut now = 0;
    let mut second = 0;
    while now < until {
        if now / SEC != second {
            for c in s.stats().campaigns.iter() {
                let was = before.insert(c.id.to_string(), c.sent).unwrap_or(0);
                out.entry(c.id.to_string()).or_default().push(c.sent - was);
            }
            second = now / SEC;
        }
        let wake = s.run_round(now, now / SEC);
        let round_end = now + s.quantum().as_nanos() as Nanos;
        now = wake.map_or(round_end, |w| w.min(round_end)).max(now) + late;
    }
    out
}

#[test]
fn a_fast_campaign_keeps_its_rate_across_job_boundaries_among_many() {
    // 600 campaigns share 512 in flight: a share of 1, so a turn near the end of a job
    // sees little work in it.
    let mut s = scheduler(512);
    for i in 0..599 {
        add(&mut s, &format!("slow{i}"), 1.0, 1, 10);
    }
    // 40 job boundaries a second.
    add(&mut s, "fast", 2000.0, 200, 50);
    let seconds = per_second(&mut s, 4 * SEC + MS, MS);
    let fast = &seconds["fast"];
    // Second 0 is the start; 1–3 are whole seconds. A send goes out up to 1 ms after its
    // permit (2 sends at 2,000/s), so either end of a second may move by 2; a permit lost
    // at each job boundary would cost 40–80 a second.
    for (k, n) in fast.iter().enumerate().skip(1) {
        assert!(
            (1996..=2004).contains(n),
            "second {k}: {n} sends ({fast:?})"
        );
    }
    let whole: u64 = fast[1..].iter().sum();
    assert!((5996..=6004).contains(&whole), "{whole} in 3 s ({fast:?})");
    for i in [0, 300, 598] {
        let slow = &seconds[&format!("slow{i}")];
        assert!(slow.iter().skip(1).all(|n| *n == 1), "slow{i}: {slow:?}");
    }
}

/// Drives rounds as the driver does, with the wall clock's seconds starting `offset`
/// after the scheduler's 0: each round at the slack's instant, late by a seeded 0–1 ms
/// (the timer's granularity). Returns each campaign's sends in every whole second.
fn per_wall_second(s: &mut Scheduler, secs: u64, offset: Nanos) -> HashMap<String, Vec<u64>> {
    let mut out: HashMap<String, Vec<u64>> = HashMap::new();
    let mut before: HashMap<String, u64> = HashMap::new();
    // The scheduler's clock starts well past 0, as the worker's does.
    const START: Nanos = 100 * SEC;
    let wall = |now: Nanos| now - START + offset;
    let (mut now, mut second, mut seed) = (START, offset / SEC, 0x9E37_79B9_7F4A_7C15u64);
    while wall(now) < secs * SEC {
        let sec = wall(now) / SEC;
        if sec != second {
            for c in s.stats().campaigns.iter() {
                let was = before.insert(c.id.to_string(), c.sent).unwrap_or(0);
                out.entry(c.id.to_string()).or_default().push(c.sent - was);
            }
            second = sec;
        }
        s.set_wall(now, u128::from(wall(now)));
        let wake = s.run_round(now, sec);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        now = s.next_round_at(now, wake).max(now) + 1 + seed % MS;
    }
    out
}

/// The sends of each whole second farthest from the rate, over campaigns at rates
/// just above 100/s (one send there is 1%), with the second's held edge `edge_ms`.
fn worst_second(edge_ms: u64) -> f64 {
    let (completions, _) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    let mut s = Scheduler::new(
        SchedulerConfig {
            second_edge: Duration::from_millis(edge_ms),
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions,
        events,
    );
    let rates = [100.001, 100.02, 100.3, 101.7, 150.2, 333.3];
    for (i, &r) in rates.iter().enumerate() {
        add(&mut s, &format!("c{i}"), r, 4, 1000);
    }
    // The first permits fall 1.5 ms before a second ends, within the slack plus the
    // lateness: the last of each second follows them.
    let seconds = per_wall_second(&mut s, 10, 998 * MS + MS / 2);
    let mut worst: f64 = 0.0;
    for (i, &r) in rates.iter().enumerate() {
        let sent = &seconds[&format!("c{i}")];
        // The first entry is the partial second of the start.
        for &n in &sent[1..] {
            worst = worst.max((n as f64 - r).abs());
        }
    }
    worst
}

#[test]
fn a_second_counts_its_rate_to_under_one_send_when_its_edge_is_held() {
    // A permit due in the last 5 ms leaves at the next second's start: every second
    // then holds the permits of one 1-s window, floor or ceiling of the rate.
    let held = worst_second(5);
    assert!(held < 1.0, "held edge: a second {held:.3} sends off");
    // Without it, the same permits cross a second's end in some seconds and not in
    // others (the slack and the lateness vary), and a second loses or gains one more.
    let free = worst_second(0);
    assert!(free >= 1.0, "no edge: at most {free:.3} sends off");
}

#[test]
fn the_slack_shrinks_only_above_its_sends_per_wake_up() {
    let mut s = scheduler(1024);
    add(&mut s, "a", 10_000.0, 1, 10_000);
    s.run_round(0, 0);
    let full = SchedulerConfig::default().wake_slack.as_nanos() as Nanos;
    assert_eq!(s.slack(), full, "10,000/s: the whole slack");
    add(&mut s, "b", 90_000.0, 1, 10_000);
    s.run_round(MS, 0);
    // 100,000/s: SENDS_PER_WAKE (200) sends' worth.
    assert_eq!(s.slack(), 2 * MS);
}

/// One campaign at 1,000/s, its rounds where the driver asks for them
/// ([`Scheduler::next_round_at`]), each 1 ms late, and once a further `stall` late,
/// for 2 s and a last round; returns its sends, that round's instant and the largest
/// round's sends.
fn slack_run(stall: Nanos) -> (u64, Nanos, u64) {
    let mut s = scheduler(1024);
    add(&mut s, "c", 1_000.0, 10, 500);
    let (mut now, mut stalled, mut largest) = (0, false, 0);
    loop {
        let before = s.stats().sends;
        let wake = s.run_round(now, now / SEC);
        largest = largest.max(s.stats().sends - before);
        if now >= 2 * SEC {
            return (s.stats().sends, now, largest);
        }
        let mut next = s.next_round_at(now, wake).max(now) + MS;
        if !stalled && next >= SEC {
            next += stall;
            stalled = true;
        }
        now = next;
    }
}

#[test]
fn the_slack_does_not_use_up_what_a_late_wake_up_is_made_up_by() {
    // A 9 ms stall puts a permit the slack (4 ms), the timer's 1 ms and the 9 behind: 14
    // ms, past quantum_min. Made up from quantum_min alone, 3 sends were lost.
    for stall in [0, 9 * MS] {
        let (sends, end, largest) = slack_run(stall);
        // The permit at 0 and one a millisecond up to the last round, to a send.
        let want = 1 + end / MS;
        assert!(
            sends.abs_diff(want) <= 1,
            "stall {stall}: {sends} sends, want {want}"
        );
        // One burst of at most rate × (quantum_min + slack), and the send due now.
        assert!(largest <= 15, "a burst of {largest}");
    }
}

/// Ten campaigns asking 500/s under a 1,000/s global cap, joining 37.3 ms apart (so
/// that their permits fall due at different instants), and rounds whenever something
/// wakes the driver: every 0.2 ms to `gap`, at a seeded instant, as sends' answers come
/// in. Returns each campaign's sends in every whole second after the first.
fn capped_run(gap: Nanos) -> Vec<Vec<u64>> {
    let (completions, _) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    let mut s = Scheduler::new(
        SchedulerConfig {
            global_rate: Some(Rate::per_second(1000.0).unwrap()),
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions,
        events,
    );
    let join = |s: &mut Scheduler, i: usize, now: Nanos| {
        let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
        let id = format!("c{i}");
        let rate = Rate::per_second(500.0).unwrap();
        let settings = CampaignSettings::active(&id, rate, Algorithm::Gcra);
        for j in 0..16 {
            let devices = (0..250).map(|d| format!("{id}-{j}-{d}")).collect();
            let job = Job::new(format!("{id}-{j}"), &id, devices, payload.clone()).unwrap();
            s.add_job(IncomingJob::fresh(job, 0, j as i64, settings.clone()), now);
        }
    };
    const START: Nanos = 100 * SEC;
    let mut out: Vec<Vec<u64>> = vec![Vec::new(); 10];
    let mut before = [0u64; 10];
    let (mut now, mut second, mut seed, mut joined) = (START, 100, 0x9E37_79B9_7F4A_7C15u64, 0);
    while now < START + 8 * SEC {
        while joined < 10 && now >= START + joined as u64 * 37_300_000 {
            join(&mut s, joined, now);
            joined += 1;
        }
        if now / SEC != second {
            for c in s.stats().campaigns.iter() {
                let i: usize = c.id[1..].parse().unwrap();
                if second > 100 {
                    out[i].push(c.sent - before[i]);
                }
                before[i] = c.sent;
            }
            second = now / SEC;
        }
        // The wall clock's seconds end 0.3 s after the scheduler's.
        let wall = now - START + 300 * MS;
        s.set_wall(now, u128::from(wall));
        s.run_round(now, wall / SEC);
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        now += 200_000 + seed % gap;
    }
    out
}

#[test]
fn campaigns_filling_a_cap_each_keep_their_share_whenever_rounds_come() {
    // Asked as of the instant its permit fell due while the others were asked as of
    // now, a campaign was refused by the cap it had room in: with rounds up to 6 ms
    // apart two of the ten fell to 91–95 a second and stayed there. Each second holds
    // one 1-s window of permits (the held edge), so its rate to a send.
    for gap in [MS, 3 * MS, 6 * MS, 10 * MS] {
        let out = capped_run(gap);
        for (i, seconds) in out.iter().enumerate() {
            assert!(
                seconds.iter().all(|n| (99..=101).contains(n)),
                "gap {gap}: c{i} sent {seconds:?}"
            );
        }
    }
}
