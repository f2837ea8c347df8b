//! The adaptive ceiling of one provider: the rate all campaigns on it may send together,
//! lowered when the provider says it is overloaded and raised again while it is not.
//!
//! Pure and clock-free: the scheduler feeds it each answer ([`Ceiling::answer`]) and the
//! time ([`Ceiling::tick`]); it judges each whole second. The law (docs/ADAPTIVE.md):
//! - **Decrease.** A second with a congestion signal sets the ceiling to
//!   `β × min(ceiling, accepted)`, where `accepted` is the rate the provider took in
//!   that second: under a hidden quota that is the quota, so one cut lands just below it
//!   however far above it the campaigns were asking. A lane that sent in bursts has a
//!   lower mean, so the rate accepted between 429s that came close together is taken
//!   when it is higher. W, the rate of the last congestion, is that rate. Never below
//!   the floor.
//! - **Increase.** A clear second moves the ceiling half way back to the rate of the last
//!   congestion (`W`), by at least `α × W`; at `W` it probes upward by `α × W`, doubling
//!   each clear second, so a lifted quota is found in a few seconds. Once the ceiling
//!   reaches the campaigns' summed send_rate it is inactive and costs nothing.
//! - **One cut per round.** Congestion in the second right after a cut holds the
//!   ceiling instead of cutting again: that second still carries what was sent before
//!   the cut.
//! - **Retry-After.** The lane pauses until then (and that second counts as congested).
//! - **Latency.** A second whose p95 is above the target and above twice the lane's
//!   usual p50 is congested: a provider that is always slow is not.

use crate::limiter::{Nanos, NANOS_PER_SEC};
pub use crate::sender::{Signal, SIGNALS};
use std::time::Duration;

/// The law's constants (`providers.<name>.adaptive_*`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CeilingParams {
    /// Multiplicative decrease β, in (0, 1).
    pub beta: f64,
    /// Increase step α, as a fraction of the last congestion rate, in (0, 1].
    pub alpha: f64,
    /// The ceiling never goes below this (sends/s).
    pub floor: f64,
    /// p95 latency above this is a congestion signal (`None`: latency is not watched).
    pub latency_target: Option<Duration>,
}

/// `latency_target` by default: an answer this slow at p95 means the provider is
/// queueing, well before the default 5 s timeout turns answers into retries.
pub const DEFAULT_LATENCY_TARGET: Duration = Duration::from_secs(2);

impl Default for CeilingParams {
    /// β 0.9: the steady state saws between 90% and 100% of a hidden quota, so the
    /// mean goodput stays above 90% of it. α 1%: near the last congestion rate the
    /// probe overshoots by about 1% for one second, which bounds the steady 429s to a
    /// fraction of a percent; doubling reaches 2.5× a quota in 8 clear seconds. Floor 10/s:
    /// a throttled provider still gets probes, at most 10 refusals a second.
    fn default() -> Self {
        Self {
            beta: 0.9,
            alpha: 0.01,
            floor: 10.0,
            latency_target: Some(DEFAULT_LATENCY_TARGET),
        }
    }
}

/// Where the ceiling stands.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum CeilingState {
    /// Inactive: campaigns send at their own rates.
    Clear,
    /// Active at this rate (sends/s).
    BackingOff(f64),
    /// Nothing is sent until this instant (then the ceiling applies).
    Paused { until: Nanos, ceiling: f64 },
}

/// Latency buckets, log-linear in microseconds: 8 per power of two, so a p95 is read to
/// within 12.5%; 27 powers of two reach about 2 minutes. One add per answer.
const SUB_BUCKETS: u64 = 8;
const LATENCY_BUCKETS: usize = 8 + 24 * SUB_BUCKETS as usize;
/// Fewer answers than this in a second are not judged for latency (a p95 of 3 answers
/// is one slow answer).
const MIN_LATENCY_SAMPLES: u32 = 20;
/// Two 429s this close belong to one stretch of refusing: between them the provider took
/// only what its quota let through (a token bucket empty at both, and too short a time
/// to refill past a cap of more than 20 ms of its rate). A longer gap may hold a pause
/// in the sends, over which a bucket refills and the count would say less than the rate.
const REFUSING_GAP: Nanos = NANOS_PER_SEC / 50;
/// The least time spent refusing in a second whose acceptances are read as the quota's
/// rate: answers come back with about a millisecond of jitter, 2% of 50 ms.
const MIN_REFUSING: Nanos = NANOS_PER_SEC / 20;

/// One provider's ceiling.
#[derive(Debug, Clone)]
pub struct Ceiling {
    params: CeilingParams,
    /// `None`: inactive.
    ceiling: Option<f64>,
    /// The ceiling (or accepted rate) at the last congestion: `W`.
    last_congestion: f64,
    /// Clear seconds spent probing above `W`.
    probes: u32,
    /// The second whose congestion last cut the ceiling, and when it was judged.
    last_cut: Option<u64>,
    cut_at: Nanos,
    /// When the current second's pause was asked for.
    paused_at: Nanos,
    /// The lane's usual p50 latency (see [`Ceiling::slow`]).
    usual_p50: Option<Duration>,
    paused_until: Nanos,
    /// The second being counted (index since the clock's start).
    second: u64,
    signals: [u32; SIGNALS],
    accepted: u32,
    latency: [u32; LATENCY_BUCKETS],
    answers: u32,
    /// The first answer of the second: counts are turned into rates over the part of
    /// the second that had traffic (a worker that starts or resumes mid-second).
    first_answer: Nanos,
    /// The second's last refusal (429) with `accepted` then, and the time spent
    /// refusing ([`REFUSING_GAP`]) and the answers accepted in it.
    last_refusal: Option<(Nanos, u32)>,
    refusing: Nanos,
    accepted_refusing: u32,
    /// Totals per signal, for the metric.
    totals: [u64; SIGNALS],
}

/// What [`Ceiling::tick`] decided about the second that ended.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Judged {
    /// The ceiling changed (the caller re-shares the campaigns' rates).
    pub changed: bool,
    /// The signals of the second, each counted once.
    pub signals: [bool; SIGNALS],
    /// Its p95 latency, when it had enough answers.
    pub p95: Option<Duration>,
    /// Answers without a congestion signal in it.
    pub accepted: u32,
}

impl Ceiling {
    pub fn new(params: CeilingParams) -> Self {
        Self {
            params,
            ceiling: None,
            last_congestion: 0.0,
            probes: 0,
            last_cut: None,
            cut_at: 0,
            paused_at: 0,
            usual_p50: None,
            paused_until: 0,
            second: 0,
            signals: [0; SIGNALS],
            accepted: 0,
            latency: [0; LATENCY_BUCKETS],
            answers: 0,
            first_answer: 0,
            last_refusal: None,
            refusing: 0,
            accepted_refusing: 0,
            totals: [0; SIGNALS],
        }
    }

    pub fn params(&self) -> &CeilingParams {
        &self.params
    }

    /// The ceiling in sends/s, when active.
    pub fn limit(&self) -> Option<f64> {
        self.ceiling
    }

    pub fn state(&self, now: Nanos) -> CeilingState {
        match self.ceiling {
            _ if now < self.paused_until => CeilingState::Paused {
                until: self.paused_until,
                ceiling: self.ceiling.unwrap_or(f64::INFINITY),
            },
            Some(c) => CeilingState::BackingOff(c),
            None => CeilingState::Clear,
        }
    }

    /// Nothing may be sent before this instant (0: no pause).
    pub fn paused_until(&self) -> Nanos {
        self.paused_until
    }

    /// Signals seen since start, by [`Signal`] index.
    pub fn totals(&self) -> [u64; SIGNALS] {
        self.totals
    }

    /// One answer at `now`: its congestion signal, if any, and how long it took. An
    /// answer to a send dispatched before the last cut is left out: it tells of the rate
    /// before the cut, which has already been judged.
    pub fn answer(&mut self, signal: Option<Signal>, latency_ns: u64, now: Nanos) {
        if now.saturating_sub(latency_ns) < self.cut_at {
            return;
        }
        if self.answers == 0 {
            self.first_answer = now;
        }
        self.answers += 1;
        match signal {
            Some(s) => self.signals[s as usize] += 1,
            None => self.accepted += 1,
        }
        if signal == Some(Signal::Throttled) {
            if let Some((t, a)) = self.last_refusal {
                if now.saturating_sub(t) <= REFUSING_GAP {
                    self.refusing += now.saturating_sub(t);
                    self.accepted_refusing += self.accepted - a;
                }
            }
            self.last_refusal = Some((now, self.accepted));
        }
        self.latency[bucket(latency_ns / 1000).min(LATENCY_BUCKETS - 1)] += 1;
    }

    /// The provider asked, at `now`, for a pause: nothing is sent before `until`.
    pub fn pause(&mut self, now: Nanos, until: Nanos) {
        if self.signals[Signal::RetryAfter as usize] == 0 {
            self.paused_at = now;
        }
        self.signals[Signal::RetryAfter as usize] += 1;
        self.paused_until = self.paused_until.max(until);
    }

    /// Judges the second that ended before `now`. `demand` is the summed send_rate of the
    /// campaigns on the provider, `sent` what was dispatched to it since the last tick.
    /// Returns `None` while the same second goes on.
    pub fn tick(&mut self, now: Nanos, demand: f64, sent: f64) -> Option<Judged> {
        let second = now / NANOS_PER_SEC;
        if second == self.second {
            return None;
        }
        let judged = self.second;
        self.second = second;
        let (p50, p95) = (self.quantile(50), self.quantile(95));
        let mut signals = [false; SIGNALS];
        for (i, n) in self.signals.iter().enumerate() {
            signals[i] = *n > 0;
            self.totals[i] += u64::from(*n > 0);
        }
        if self.slow(p50, p95) {
            signals[Signal::Latency as usize] = true;
            self.totals[Signal::Latency as usize] += 1;
        }
        let before = self.ceiling;
        let accepted = self.accepted;
        if signals.iter().any(|s| *s) {
            // One cut per round: the second after a cut still carries what was sent
            // before it (answers in flight, a quota's emptied bucket), so it holds.
            if self.last_cut.map(|s| s + 1) != Some(judged) {
                let paused = signals[Signal::RetryAfter as usize];
                self.decrease(sent, demand, paused, now);
                self.last_cut = Some(judged);
                self.cut_at = now;
            }
        } else if now >= self.paused_until && sent > 0.0 {
            // Only a lane that sends learns anything: an idle one keeps its ceiling.
            self.increase(demand);
        }
        self.signals = [0; SIGNALS];
        self.accepted = 0;
        self.latency = [0; LATENCY_BUCKETS];
        self.answers = 0;
        self.last_refusal = None;
        self.refusing = 0;
        self.accepted_refusing = 0;
        Some(Judged {
            changed: before != self.ceiling,
            signals,
            p95,
            accepted,
        })
    }

    /// Whether the second's latency is congestion: its p95 above the target and above
    /// twice the lane's usual p50 (a provider that is always slow is not congested).
    /// The usual p50 follows a lower p50 at once and a higher one by 5% a second.
    fn slow(&mut self, p50: Option<Duration>, p95: Option<Duration>) -> bool {
        let (Some(p50), Some(p95)) = (p50, p95) else {
            return false;
        };
        let usual = self.usual_p50.map_or(p50, |u| p50.min(u.mul_f64(1.05)));
        self.usual_p50 = Some(usual);
        self.params
            .latency_target
            .is_some_and(|t| p95 > t && p95 > usual * 2)
    }

    /// `sent` was dispatched over the time the second's answers cover (from its first
    /// answer to `now`, or to the pause); rates are counts over that span, at least
    /// 50 ms, so that a few early answers are not taken for a rate.
    fn decrease(&mut self, sent: f64, demand: f64, paused: bool, now: Nanos) {
        let until = if paused { self.paused_at } else { now };
        let span = if self.answers == 0 {
            1.0
        } else {
            (until.saturating_sub(self.first_answer) as f64 / NANOS_PER_SEC as f64).max(0.05)
        };
        let current = match self.ceiling {
            Some(c) => c,
            // A pause cut the dispatches short: the campaigns' own rates stand for them.
            None if paused => demand,
            None => sent / span,
        };
        // What the provider took: the second's mean, or the rate while it refused when
        // that is higher (sends in bursts with gaps).
        let between = self.rate_while_refusing();
        let taken = (f64::from(self.accepted) / span).max(between.unwrap_or(0.0));
        let base = if self.answers == 0 {
            current
        } else {
            current.min(taken)
        };
        // W: where congestion began. A second with nothing accepted (an outage) says
        // nothing of it: the old W stands, so that recovery heads back there.
        if self.accepted > 0 || self.last_congestion == 0.0 {
            self.last_congestion = base.max(between.unwrap_or(0.0)).max(self.params.floor);
        }
        self.ceiling = Some((base * self.params.beta).max(self.params.floor));
        self.probes = 0;
    }

    /// The rate accepted while the provider was refusing ([`REFUSING_GAP`]). Under a
    /// quota this is its rate however the sends were shaped; the second's mean is not
    /// when the lane sent in bursts with gaps (a lane short of jobs), and a W read from
    /// that would be far low, and the probes back up to the quota would overshoot it by
    /// about as much.
    fn rate_while_refusing(&self) -> Option<f64> {
        (self.refusing >= MIN_REFUSING).then(|| {
            f64::from(self.accepted_refusing) * NANOS_PER_SEC as f64 / self.refusing as f64
        })
    }

    fn increase(&mut self, demand: f64) {
        let Some(c) = self.ceiling else { return };
        let w = self.last_congestion;
        let step = (self.params.alpha * w).max(1.0);
        let next = if c + step < w {
            c + ((w - c) / 2.0).max(step)
        } else {
            let probe = step * f64::from(1u32 << self.probes.min(20));
            self.probes += 1;
            c.max(w) + probe
        };
        self.ceiling = (next < demand).then_some(next);
        if self.ceiling.is_none() {
            self.probes = 0;
        }
    }

    /// The `q`th percentile of the second's latencies (a bucket's upper bound).
    fn quantile(&self, q: u64) -> Option<Duration> {
        if self.answers < MIN_LATENCY_SAMPLES {
            return None;
        }
        let rank = (u64::from(self.answers) * q).div_ceil(100);
        let mut seen = 0u64;
        for (i, n) in self.latency.iter().enumerate() {
            seen += u64::from(*n);
            if seen >= rank {
                return Some(Duration::from_micros(upper_us(i)));
            }
        }
        None
    }
}

/// The bucket of a latency in µs: exact below 8 µs, then 8 per power of two.
fn bucket(us: u64) -> usize {
    if us < SUB_BUCKETS {
        return us as usize;
    }
    let exp = u64::from(u64::BITS - 1 - us.leading_zeros());
    let sub = (us >> (exp - 3)) & (SUB_BUCKETS - 1);
    ((exp - 2) * SUB_BUCKETS + sub) as usize
}

/// The largest latency (µs) bucket `i` holds.
fn upper_us(i: usize) -> u64 {
    let i = i as u64;
    if i < SUB_BUCKETS {
        return i;
    }
    let exp = i / SUB_BUCKETS + 2;
    let sub = i % SUB_BUCKETS;
    ((SUB_BUCKETS + sub + 1) << (exp - 3)) - 1
}

#[cfg(test)]
#[path = "ceiling_tests.rs"]
mod tests;
