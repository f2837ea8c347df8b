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
