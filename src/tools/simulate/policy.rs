//! `pushpace simulate --policy`: the delivery policy's two rate laws through the real
//! [`Scheduler`] on a virtual clock, as `pacing.rs` drives it (null sender, rounds run
//! as the driver runs them, each wake-up late by a seeded 0–1 ms). Deterministic and
//! instant.
//!
//! 1. Ramp-up: one campaign at 1,000/s with `ramp_up_s` = 60 and `ramp_from` = 0.1,
//!    devices for 90 s. Each second's sends against the curve's integral over it.
//! 2. Finish-by: 120,000 devices due 60 s after the start, no send_rate (the largest
//!    rate). This module is the planner: every second it calls
//!    [`planned_rate`]`(remaining, finish_by, now, 1)` with remaining = devices not yet
//!    sent, and hands the plan to [`Scheduler::apply_plan`]. Run twice: as is, and with
//!    the campaign's send_rate set at 30 s to half the plan then (a cap it cannot make
//!    the deadline under), projecting its finish each second as the API does.

use crate::api::lifecycle::BEHIND_SLACK_S;
use crate::job::policy::RAMP_MAX_STEP;
use crate::job::Job;
use crate::limiter::rate::MAX_RATE_PER_SECOND;
use crate::limiter::{Algorithm, Nanos, Rate, NANOS_PER_SEC};
use crate::sender::{AnySender, NullSender};
use crate::stats::StatsRecorder;
use crate::worker::planner::{planned_rate, PLAN_EVERY};
use crate::worker::scheduler::{CampaignSettings, IncomingJob, Scheduler, SchedulerConfig};
use std::sync::Arc;

pub use super::policy_render::{render_svg, table};

const SEC: Nanos = NANOS_PER_SEC;
const BUCKET: Nanos = NANOS_PER_SEC / 10;
/// The scheduler's clock starts well past 0, as the worker's does.
const START: Nanos = 100 * SEC;
/// The wall clock at [`START`] (unix ms), on a whole second.
const WALL_START_MS: i64 = 1_700_000_000_000;
/// Devices per job.
pub(super) const JOB_SIZE: usize = 10_000;

/// The ramp scenario.
pub const RAMP_RATE: f64 = 1_000.0;
pub const RAMP_UP_S: f64 = 60.0;
pub const RAMP_FROM: f64 = 0.1;
pub const RAMP_RUN_S: u64 = 90;
/// 90 s at the full rate: more than the run can send, so the campaign never runs dry.
pub(super) const RAMP_JOBS: usize = 9;

/// The finish-by scenario.
pub const FB_JOBS: usize = 12;
pub const FB_DEVICES: u64 = (FB_JOBS * JOB_SIZE) as u64;
pub const FB_DEADLINE_S: u64 = 60;
/// When the halving run's send_rate becomes half the plan.
pub const HALVE_AT_S: u64 = 30;
/// The projection reported against the actual end.
pub const PROJECT_AT_S: u64 = 35;
/// A run that has not finished by then is cut (the halved one needs about 90 s).
const FB_MAX_S: u64 = 150;

/// Seconds whose target is below this are left out of the ramp's error: at a few sends
/// a second, the one send either end of a second is more than 2% by itself.
pub const MIN_JUDGED_TARGET: f64 = 100.0;

/// A deterministic generator (xorshift64*) for the wake-ups' lateness.
struct Lateness(u64);

impl Lateness {
    /// Up to 1 ms, the timer's granularity.
    fn next(&mut self) -> Nanos {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) % 1_000_000
    }
}

/// A scheduler on the virtual clock, with one campaign.
struct Sim {
    s: Scheduler,
    now: Nanos,
    sent: u64,
    late: Lateness,
}

impl Sim {
    fn new(settings: &CampaignSettings, jobs: usize) -> Sim {
        let (completions, _) = tokio::sync::mpsc::unbounded_channel();
        let (events, _) = std::sync::mpsc::channel();
        let mut s = Scheduler::new(
            SchedulerConfig::default(),
            AnySender::Null(NullSender),
            StatsRecorder::new(),
            completions,
            events,
        );
        s.set_wall(START, wall_ns(START));
        let payload = serde_json::value::RawValue::from_string("{}".into()).expect("json");
        for j in 0..jobs {
            let devices = (0..JOB_SIZE).map(|d| format!("d{j}-{d}")).collect();
            let job = Job::new(
                format!("{}-{j}", settings.id),
                &*settings.id,
                devices,
                payload.clone(),
            )
            .expect("job");
            s.add_job(
                IncomingJob::fresh(job, 0, j as i64, settings.clone()),
                START,
            );
        }
        Sim {
            s,
            now: START,
            sent: 0,
            late: Lateness(0x9E37_79B9_7F4A_7C15),
        }
    }

    fn unix_ms(&self) -> i64 {
        WALL_START_MS + ((self.now - START) / 1_000_000) as i64
    }

    /// One round at `now`; returns its sends. The next round comes when the scheduler
    /// asks, a little late, but no later than `until` (a planner's message wakes the
    /// driver as well).
    fn round(&mut self, until: Nanos) -> u64 {
        self.s.set_wall(self.now, wall_ns(self.now));
        let unix_sec = (wall_ns(self.now) / u128::from(SEC)) as u64;
        let wake = self.s.run_round(self.now, unix_sec);
        let sent = self.s.stats().sends;
        let n = sent - self.sent;
        self.sent = sent;
        let next = self.s.next_round_at(self.now, wake).max(self.now) + 1 + self.late.next();
        self.now = next.min(until).max(self.now + 1);
        n
    }

    /// The campaign's effective rate (what it sends at now).
    fn effective_rate(&self) -> f64 {
        self.s
            .stats()
            .campaigns
            .first()
            .map_or(0.0, |c| c.effective_rate)
    }
}

fn wall_ns(now: Nanos) -> u128 {
    (WALL_START_MS as u128) * 1_000_000 + u128::from(now - START)
}

// --- Ramp-up -------------------------------------------------------------------------

/// The ramp's curve as `worker::scheduler::ramp` defines it: f(t) = from × k^t, k =
/// (1/from)^(1/secs), k lowered to [`RAMP_MAX_STEP`] by lengthening the ramp.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Curve {
    pub from: f64,
    /// k: the curve's ratio from one second to the next.
    pub k: f64,
    /// Seconds from `from` to 1 (`ramp_up_s`, or longer when lengthened).
    pub seconds: f64,
}

impl Curve {
    pub fn new(from: f64, secs: f64) -> Curve {
        let growth = ((1.0 / from).ln() / secs).min(RAMP_MAX_STEP.ln());
        Curve {
            from,
            k: growth.exp(),
            seconds: (1.0 / from).ln() / growth,
        }
    }

    pub fn fraction(&self, t: f64) -> f64 {
        (self.from * self.k.powf(t.max(0.0))).min(1.0)
    }

    /// ∫ f over [a, b], in seconds.
    pub fn integral(&self, a: f64, b: f64) -> f64 {
        let g = self.k.ln();
        let end = self.seconds;
        let climb = if a < end {
            self.from / g * ((g * b.min(end)).exp() - (g * a).exp())
        } else {
            0.0
        };
        climb + (b - a.max(end)).max(0.0)
    }
}

/// One second of the ramp run.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct RampSecond {
    pub second: u64,
    pub sends: u64,
    /// rate × ∫ f over the second.
    pub target: f64,
    /// sends / the previous second's sends.
    pub step: Option<f64>,
}

/// The ramp run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct RampRun {
    pub rate: f64,
    pub ramp_up_s: f64,
    pub ramp_from: f64,
    pub curve: Curve,
    pub seconds: Vec<RampSecond>,
    pub buckets_100ms: Vec<u64>,
    /// The worst |sends − target| / target over seconds with target ≥ 100, and where.
    pub worst_error: f64,
    pub worst_error_at: u64,
    /// The largest sends / previous sends, and where.
    pub max_step: f64,
    pub max_step_at: u64,
    /// The largest 100 ms bucket while the ramp lasts, and rate / 10 × 1.1.
    pub max_bucket_in_ramp: u64,
    pub bucket_bound: f64,
    /// The most any bucket in the ramp went over 1.1 × its own share of the curve, in
    /// sends (a send at a bucket's edge is one).
    pub max_bucket_excess: f64,
    /// The campaign's effective rate at the end of the run (its full rate, once the
    /// ramp has ended, is `rate`).
    pub effective_rate_after: f64,
}

pub fn run_ramp() -> RampRun {
    let settings = CampaignSettings {
        ramp_up_s: Some(RAMP_UP_S),
        ramp_from: Some(RAMP_FROM),
        ..CampaignSettings::active(
            "ramp",
            Rate::per_second(RAMP_RATE).expect("rate"),
            Algorithm::Gcra,
        )
    };
    let mut sim = Sim::new(&settings, RAMP_JOBS);
    let until = START + RAMP_RUN_S * SEC;
    let mut buckets = vec![0u64; (RAMP_RUN_S * SEC / BUCKET) as usize];
    while sim.now < until {
        let b = ((sim.now - START) / BUCKET) as usize;
        let n = sim.round(until);
        buckets[b] += n;
    }
    let curve = Curve::new(RAMP_FROM, RAMP_UP_S);
    let seconds: Vec<RampSecond> = buckets
        .chunks(10)
        .enumerate()
        .map(|(k, c)| RampSecond {
            second: k as u64,
            sends: c.iter().sum(),
            target: RAMP_RATE * curve.integral(k as f64, k as f64 + 1.0),
            step: None,
        })
        .collect();
    let seconds: Vec<RampSecond> = seconds
        .iter()
        .enumerate()
        .map(|(k, s)| RampSecond {
            step: (k > 0 && seconds[k - 1].sends > 0)
                .then(|| s.sends as f64 / seconds[k - 1].sends as f64),
            ..*s
        })
        .collect();
    let (worst_error, worst_error_at) = seconds
        .iter()
        .filter(|s| s.target >= MIN_JUDGED_TARGET)
        .map(|s| ((s.sends as f64 - s.target).abs() / s.target, s.second))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
    let (max_step, max_step_at) = seconds
        .iter()
        .filter_map(|s| s.step.map(|r| (r, s.second)))
        .fold((0.0, 0), |a, b| if b.0 > a.0 { b } else { a });
    let in_ramp = (curve.seconds * 10.0).floor() as usize;
    let max_bucket_in_ramp = buckets[..in_ramp].iter().copied().max().unwrap_or(0);
    let max_bucket_excess = buckets[..in_ramp]
        .iter()
        .enumerate()
        .map(|(i, &n)| {
            let t = i as f64 / 10.0;
            n as f64 - RAMP_RATE * curve.integral(t, t + 0.1) * RAMP_MAX_STEP
        })
        .fold(f64::NEG_INFINITY, f64::max);
    RampRun {
        rate: RAMP_RATE,
        ramp_up_s: RAMP_UP_S,
        ramp_from: RAMP_FROM,
        curve,
        seconds,
        buckets_100ms: buckets,
        worst_error,
        worst_error_at,
        max_step,
        max_step_at,
        max_bucket_in_ramp,
        bucket_bound: RAMP_RATE / 10.0 * RAMP_MAX_STEP,
        max_bucket_excess,
        effective_rate_after: sim.effective_rate(),
    }
}

// --- Finish-by -----------------------------------------------------------------------

/// One second of a finish-by run, as the planner sees it at the second's start.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct FinishBySecond {
    pub second: u64,
    /// Sends in `[second, second + 1)`.
    pub sends: u64,
    /// Devices not yet sent at the second's start.
    pub remaining: u64,
    /// The plan handed over then; `None` past the deadline (its send_rate).
    pub plan: Option<f64>,
    pub send_rate: f64,
    /// What it sends at: the plan under its send_rate.
    pub effective_rate: f64,
    /// now + remaining / effective rate, in seconds since the start.
    pub projected_finish_s: Option<f64>,
    /// The projection more than `BEHIND_SLACK_S` past the deadline, or the deadline
    /// passed with devices left (the API's rule).
    pub behind: bool,
}

/// A finish-by run's figures.
#[derive(Debug, Clone, serde::Serialize)]
pub struct FinishByRun {
    pub devices: u64,
    pub deadline_s: u64,
    /// The send_rate set at [`HALVE_AT_S`] (half the plan then), when it was.
    pub halved_to: Option<f64>,
    pub seconds: Vec<FinishBySecond>,
    /// The instant of the last send, in seconds since the start.
    pub finished_s: Option<f64>,
    /// The first second that is behind.
    pub behind_from_s: Option<u64>,
    /// The projection at [`PROJECT_AT_S`].
    pub projected_at: Option<f64>,
}

pub fn run_finish_by(halve: bool) -> FinishByRun {
    let deadline_ms = WALL_START_MS + (FB_DEADLINE_S * 1000) as i64;
    let mut settings = CampaignSettings {
        ramp_up_s: Some(0.0),
        finish_by_ms: Some(deadline_ms),
        ..CampaignSettings::active(
            "deadline",
            Rate::per_second(MAX_RATE_PER_SECOND).expect("rate"),
            Algorithm::Gcra,
        )
    };
    let mut sim = Sim::new(&settings, FB_JOBS);
    let id: Arc<str> = settings.id.clone();
    let every = PLAN_EVERY.as_nanos() as Nanos;
    let mut seconds = Vec::new();
    let mut halved_to = None;
    let mut finished_s = None;
    let mut k = 0u64;
    while finished_s.is_none() && k < FB_MAX_S {
        // The planner's tick: plan from what is not sent yet.
        let remaining = FB_DEVICES - sim.sent;
        let plan = planned_rate(remaining, deadline_ms, sim.unix_ms(), 1);
        sim.s.apply_plan(id.clone(), plan, sim.now);
        if halve && k == HALVE_AT_S {
            if let Some(p) = plan {
                let half = Rate::per_second(p.as_f64() / 2.0).expect("rate");
                settings.rate = half;
                halved_to = Some(half.as_f64());
                sim.s.apply_settings(settings.clone(), sim.now);
            }
        }
        let effective = sim.effective_rate();
        let projected =
            (remaining > 0 && effective > 0.0).then(|| k as f64 + remaining as f64 / effective);
        let late = projected.is_some_and(|p| p > FB_DEADLINE_S as f64 + BEHIND_SLACK_S);
        let passed = k >= FB_DEADLINE_S && remaining > 0;
        let mut row = FinishBySecond {
            second: k,
            sends: 0,
            remaining,
            plan: plan.map(Rate::as_f64),
            send_rate: settings.rate.as_f64(),
            effective_rate: effective,
            projected_finish_s: projected,
            behind: late || passed,
        };
        let until = START + (k + 1) * every;
        while sim.now < until {
            let at = sim.now;
            let n = sim.round(until);
            row.sends += n;
            if n > 0 && sim.sent == FB_DEVICES {
                finished_s = Some((at - START) as f64 / SEC as f64);
                break;
            }
        }
        seconds.push(row);
        k += 1;
    }
    let behind_from_s = seconds.iter().find(|s| s.behind).map(|s| s.second);
    let projected_at = seconds
        .get(PROJECT_AT_S as usize)
        .and_then(|s| s.projected_finish_s);
    FinishByRun {
        devices: FB_DEVICES,
        deadline_s: FB_DEADLINE_S,
        halved_to,
        seconds,
        finished_s,
        behind_from_s,
        projected_at,
    }
}

// --- Output (drawn by `policy_render.rs`) --------------------------------------------

/// Both scenarios.
#[derive(Debug, Clone, serde::Serialize)]
pub struct PolicyReport {
    pub ramp: RampRun,
    /// Without the halving, then with it.
    pub finish_by: [FinishByRun; 2],
}

pub fn run() -> PolicyReport {
    PolicyReport {
        ramp: run_ramp(),
        finish_by: [run_finish_by(false), run_finish_by(true)],
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scheduler's per-second accuracy on a ramp at 100/s and more, as
    /// `a_ramp_follows_its_curve_each_second_and_each_100_ms` holds it.
    const RAMP_ERROR: f64 = 0.02;
    /// A measured step may exceed the curve's own (1.039×) by a send or two either end of
    /// a second, never the policy's bound.
    const MAX_STEP: f64 = RAMP_MAX_STEP;
    /// A plan aims 1 s early and its last two seconds at the deadline itself; 2 s is
    /// that margin and a second of rounding.
    const FINISH_SLACK_S: f64 = 2.0;
    /// The projection at 35 s assumes the capped rate holds to the end, which it does:
    /// it should miss only by the last plans' rounding.
    const PROJECTION_SLACK_S: f64 = 2.0;

    #[test]
    fn the_ramp_follows_its_curve_and_never_steps_over_the_bound() {
        let r = run_ramp();
        assert!(
            r.worst_error <= RAMP_ERROR,
            "{} at {}",
            r.worst_error,
            r.worst_error_at
        );
        assert!(
            r.max_step <= MAX_STEP,
            "{} at {}",
            r.max_step,
            r.max_step_at
        );
        assert!((r.curve.k - 10f64.powf(1.0 / 60.0)).abs() < 1e-12);
        assert!(r.max_bucket_in_ramp as f64 <= r.bucket_bound + 1.0);
        assert!(r.max_bucket_excess <= 1.0, "{}", r.max_bucket_excess);
    }

    #[test]
    fn a_finish_by_campaign_ends_at_its_deadline_and_a_halved_one_is_seen_behind() {
        let plain = run_finish_by(false);
        let end = plain.finished_s.expect("finished");
        assert!(
            (end - FB_DEADLINE_S as f64).abs() <= FINISH_SLACK_S,
            "{end}"
        );
        assert_eq!(plain.behind_from_s, None, "{:?}", plain.seconds);

        let halved = run_finish_by(true);
        assert!(halved.halved_to.is_some());
        assert_eq!(
            halved.behind_from_s,
            Some(HALVE_AT_S),
            "{:?}",
            halved.seconds
        );
        let end = halved.finished_s.expect("finished");
        assert!(end > FB_DEADLINE_S as f64 + FINISH_SLACK_S, "{end}");
        let projected = halved.projected_at.expect("a projection");
        assert!(
            (projected - end).abs() <= PROJECTION_SLACK_S,
            "{projected} vs {end}"
        );
        let report = PolicyReport {
            ramp: run_ramp(),
            finish_by: [plain, halved],
        };
        assert!(render_svg(&report).unwrap().contains("<svg"));
        assert!(table(&report).contains("behind: from 30 s"));
    }
}
