//! The scheduler itself on a virtual clock (`pushpace simulate --campaigns N`): N
//! campaigns at issue 24's long-tailed rates, every job held from the start, rounds
//! driven as the async driver drives them, each wake-up late by a seeded amount up to
//! `--lateness-ms` (the timer's granularity). Sends are counted per campaign and
//! per second as the stats recorder counts them (the round's second), and judged as the
//! `pacing-1000` bench phase judges them. No broker, no database, no other load: an
//! error seen here is the algorithm's.

use crate::job::Job;
use crate::limiter::{Algorithm, Nanos, Rate, NANOS_PER_SEC};
use crate::sender::{AnySender, NullSender};
use crate::stats::StatsRecorder;
use crate::tools::bench::{long_tail_rates, pacing_1000_figures, Pacing1000Result};
use crate::worker::scheduler::{CampaignSettings, IncomingJob, Scheduler, SchedulerConfig};
use std::collections::HashMap;

/// One run's shape.
#[derive(Debug, Clone)]
pub struct PacingSim {
    pub campaigns: usize,
    /// Summed rate the long-tailed mix is scaled to.
    pub total_rate: f64,
    pub seconds: u64,
    pub job_size: usize,
    /// Each wake-up comes this late at most (uniform, seeded).
    pub max_lateness: Nanos,
    /// Where the unix second starts on the monotonic clock.
    pub second_offset: Nanos,
    pub max_in_flight: usize,
    pub seed: u64,
    /// The scheduler's `wake_slack`.
    pub wake_slack: std::time::Duration,
    /// The scheduler's `second_edge`.
    pub second_edge: std::time::Duration,
}

impl Default for PacingSim {
    fn default() -> Self {
        Self {
            campaigns: 1000,
            total_rate: 50_000.0,
            seconds: 30,
            job_size: 500,
            max_lateness: 1_000_000,
            second_offset: 370_000_000,
            max_in_flight: 1024,
            seed: 24,
            wake_slack: std::time::Duration::from_millis(
                crate::worker::scheduler::DEFAULT_WAKE_SLACK_MS,
            ),
            second_edge: std::time::Duration::from_millis(
                crate::worker::scheduler::DEFAULT_SECOND_EDGE_MS,
            ),
        }
    }
}

/// What a run gives: the bench phase's figures, and how many rounds and turns it took.
#[derive(Debug, Clone)]
pub struct PacingSimReport {
    pub figures: Pacing1000Result,
    pub rounds: u64,
    pub turns: u64,
    /// Wall time spent in rounds (the scheduler's own CPU), per send.
    pub ns_per_send: f64,
    pub rates: Vec<f64>,
    /// Rows as `delivery_seconds` holds them: (campaign, second, sent).
    pub rows: Vec<(String, i64, i64)>,
}

/// The simulated wall clock's nanoseconds at the unix second 0 of the run.
const WALL_EPOCH: u128 = 1_700_000_000 * 1_000_000_000;

/// A small deterministic generator (xorshift64*).
struct Lcg(u64);

impl Lcg {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % n.max(1)
    }
}

fn scheduler(sim: &PacingSim) -> Scheduler {
    let (completions, _) = tokio::sync::mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: sim.campaigns.max(1),
            max_in_flight: sim.max_in_flight,
            wake_slack: sim.wake_slack,
            second_edge: sim.second_edge,
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions,
        events,
    )
}

/// Every campaign's devices for `seconds` at its rate, in jobs of `job_size`.
fn add_jobs(s: &mut Scheduler, sim: &PacingSim, rates: &[f64]) {
    let payload = serde_json::value::RawValue::from_string("{}".into()).expect("json");
    for (i, &rate) in rates.iter().enumerate() {
        let id = format!("c{i:04}");
        let devices = (rate * sim.seconds as f64).round().max(1.0) as usize;
        let settings =
            CampaignSettings::active(&id, Rate::per_second(rate).expect("rate"), Algorithm::Gcra);
        let mut offset = 0;
        while offset < devices {
            let n = sim.job_size.min(devices - offset);
            let list = (0..n).map(|d| format!("d{}", offset + d)).collect();
            let job = Job::new(format!("{id}-{offset}"), &id, list, payload.clone()).expect("job");
            s.add_job(
                IncomingJob::fresh(job, 0, (i * 100_000 + offset) as i64, settings.clone()),
                0,
            );
            offset += n;
        }
    }
}

/// Runs the campaigns to their end and judges them.
pub fn run(sim: &PacingSim) -> PacingSimReport {
    let rates = long_tail_rates(sim.campaigns, sim.total_rate);
    let mut s = scheduler(sim);
    s.set_wall(0, u128::from(sim.second_offset) + WALL_EPOCH);
    add_jobs(&mut s, sim, &rates);
    let mut rng = Lcg(sim.seed.max(1));
    let mut sent_before: Vec<u64> = vec![0; rates.len()];
    let mut rows = Vec::new();
    let second_of = |now: Nanos| ((now + sim.second_offset) / NANOS_PER_SEC) as i64;
    let mut now: Nanos = 0;
    let mut current = second_of(0);
    // Every campaign's devices last `seconds`; two more let the last ones finish.
    let until = (sim.seconds + 2) * NANOS_PER_SEC;
    let mut rounds = 0u64;
    let mut in_rounds = std::time::Duration::ZERO;
    while now < until {
        let sec = second_of(now);
        if sec != current {
            collect(&s, current, &mut sent_before, &mut rows);
            current = sec;
        }
        // The wall clock as the driver reads it: the round's second and where it ends.
        s.set_wall(now, u128::from(now + sim.second_offset) + WALL_EPOCH);
        let t0 = std::time::Instant::now();
        let wake = s.run_round(now, sec as u64);
        in_rounds += t0.elapsed();
        rounds += 1;
        let asked = s.next_round_at(now, wake).max(now);
        now = asked + 1 + rng.below(sim.max_lateness);
    }
    collect(&s, current, &mut sent_before, &mut rows);
    rows.sort();
    let rate_of: HashMap<String, f64> = rates
        .iter()
        .enumerate()
        .map(|(i, r)| (format!("c{i:04}"), *r))
        .collect();
    let stats = s.stats();
    let sends = stats.sends.max(1);
    PacingSimReport {
        figures: pacing_1000_figures(&rows, &rate_of),
        rounds,
        turns: stats.turns,
        ns_per_send: in_rounds.as_nanos() as f64 / sends as f64,
        rates,
        rows,
    }
}

/// The sends of `second`: each campaign's count since the last call.
fn collect(s: &Scheduler, second: i64, before: &mut [u64], rows: &mut Vec<(String, i64, i64)>) {
    let stats = s.stats();
    for c in stats.campaigns.iter() {
        let Some(i) = c.id.strip_prefix('c').and_then(|n| n.parse::<usize>().ok()) else {
            continue;
        };
        let n = c.sent - before[i];
        before[i] = c.sent;
        if n > 0 {
            rows.push((c.id.to_string(), second, n as i64));
        }
    }
}

/// The figures as one line, as `pushpace bench` prints them.
pub fn table(sim: &PacingSim, r: &PacingSimReport) -> String {
    let p = &r.figures;
    format!(
        "{} campaigns summing to {:.0}/s, jobs of {}, wake-ups up to {:.1} ms late after a slack of {} ms, second edge {} ms, {} rounds, {} turns, {:.0} ns in rounds per send (wall time, this process)\n\
         ≥ 100/s: {} campaign-seconds, p50 {:.2}% p99 {:.2}% (target ≤ 1%), {} off by more than 1%\n\
         < 100/s: {} campaign-seconds, at most {:.2} send(s) off (target ≤ 1)\n",
        p.campaigns,
        p.total_rate,
        sim.job_size,
        sim.max_lateness as f64 / 1e6,
        sim.wake_slack.as_millis(),
        sim.second_edge.as_millis(),
        r.rounds,
        r.turns,
        r.ns_per_send,
        p.fast_campaign_seconds,
        p.fast_p50 * 100.0,
        p.fast_p99 * 100.0,
        p.fast_over_1pct,
        p.slow_campaign_seconds,
        p.slow_max_sends_off,
    )
}
