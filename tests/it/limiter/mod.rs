//! The rate limiters' properties, under the virtual clock, for every algorithm: the
//! window bound (and the documented exceptions, measured), the long-run rate, exact
//! `WaitUntil`, `set_rate`, no starvation; the GCRA stress test on real threads; the
//! hierarchical limiter's semantics; and the `simulate` experiment.
//!
//! Windows are half-open, `[t, t + w)`, and are checked at every send instant, which is
//! where the largest count of any window starts.
//!
//! This file holds the subjects, the measures and the demand strategies; the tests are in
//! the files below, by property.

mod bounds;
mod factory;
mod hierarchical;
mod simulate;
mod waits;

use std::sync::Arc;

use proptest::prelude::*;
use pushpace::limiter::{
    build, window_for, Algorithm, Decision, DynLimiter, HierarchicalLimiter, Nanos, Rate,
    RateLimiter, FP_ONE, NANOS_PER_SEC,
};

const SEC: Nanos = NANOS_PER_SEC;

/// What is tested: every algorithm from the factory, plus a campaign under a hierarchical
/// limiter whose global cap never binds (so the campaign's own bounds are visible).
#[derive(Debug, Clone, Copy, PartialEq)]
enum Subject {
    Alg(Algorithm),
    Hierarchical,
}

const SUBJECTS: [Subject; 8] = [
    Subject::Alg(Algorithm::LeakyBucket),
    Subject::Alg(Algorithm::TokenBucket),
    Subject::Alg(Algorithm::FixedWindow),
    Subject::Alg(Algorithm::SlidingLog),
    Subject::Alg(Algorithm::SlidingWindow),
    Subject::Alg(Algorithm::Gcra),
    Subject::Alg(Algorithm::Governor),
    Subject::Hierarchical,
];

impl Subject {
    fn make(self, rate: Rate, burst: u32) -> DynLimiter {
        match self {
            Subject::Alg(a) => build(a, rate, burst),
            Subject::Hierarchical => {
                // 10 M/s with 0.1 s of tolerance: never the constraint for one campaign
                // of up to 7 M/s.
                let global = HierarchicalLimiter::new(r(10_000_000.0), 1_000_000);
                Arc::new(global.campaign(Algorithm::Gcra, rate, burst))
            }
        }
    }

    fn windowed(self) -> bool {
        matches!(
            self,
            Subject::Alg(Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow)
        )
    }

    /// The documented bound on the permits in any window `[t, t + w)`.
    ///
    /// Smooth algorithms: `ceil(w / T) + burst`, T being the interval the limiter really
    /// uses (the fixed-point `interval_fp`, within 0.002% of 1/rate; governor's whole
    /// nanoseconds). That is `rate × w + burst` rounded up to whole permits.
    /// Window algorithms (window W, limit L from `window_for`): fixed-window and
    /// sliding-window `(ceil(w / W) + 1) × L`, sliding-log `ceil(w / W) × L`.
    fn window_bound(self, rate: Rate, burst: u32, w: Nanos) -> u64 {
        let b = u64::from(burst);
        match self {
            Subject::Alg(Algorithm::Governor) => b + w.div_ceil(rate.interval_nanos()),
            Subject::Alg(Algorithm::FixedWindow | Algorithm::SlidingWindow) => {
                let win = window_for(rate, burst);
                (w.div_ceil(win.length) + 1) * win.limit
            }
            Subject::Alg(Algorithm::SlidingLog) => {
                let win = window_for(rate, burst);
                w.div_ceil(win.length) * win.limit
            }
            _ => {
                let ticks = u128::from(w) * u128::from(FP_ONE);
                b + ticks.div_ceil(u128::from(rate.interval_fp())) as u64
            }
        }
    }

    /// The largest batch that the window bound covers (bigger ones are documented to
    /// exceed it): the burst capacity, or a whole window.
    fn batch_cap(self, rate: Rate, burst: u32) -> u32 {
        if self.windowed() {
            u32::try_from(window_for(rate, burst).limit).unwrap_or(u32::MAX)
        } else {
            burst + 1
        }
    }

    /// How long the limiter may keep a saturating caller waiting right after a
    /// `set_rate`: one new interval, or one new window for the window algorithms.
    fn max_stall_after_set_rate(self, rate: Rate, burst: u32) -> Nanos {
        if self.windowed() {
            window_for(rate, burst).length
        } else {
            rate.interval_nanos() + 1
        }
    }
}

fn r(per_second: f64) -> Rate {
    Rate::per_second(per_second).expect("valid test rate")
}

/// Sends as `(instant, count)`, in order of time.
type Sends = Vec<(Nanos, u64)>;

/// The most sends in any `[t, t + w)`, with t at a send.
fn max_in_window(sends: &[(Nanos, u64)], w: Nanos) -> u64 {
    let (mut best, mut sum, mut j) = (0, 0, 0);
    for i in 0..sends.len() {
        let end = sends[i].0.saturating_add(w);
        while j < sends.len() && sends[j].0 < end {
            sum += sends[j].1;
            j += 1;
        }
        best = best.max(sum);
        sum -= sends[i].1;
    }
    best
}

fn count_in(sends: &[(Nanos, u64)], from: Nanos, to: Nanos) -> u64 {
    sends
        .iter()
        .filter(|(t, _)| *t >= from && *t < to)
        .map(|(_, c)| c)
        .sum()
}

/// A saturating caller: asks for everything at `now` and sleeps as told, from `from` to
/// `until`. With `quantum`, it sleeps at least that long between calls, as the scheduler
/// does with its time slices (used for the window algorithms at millions per second,
/// which otherwise release one permit per call).
fn saturate(
    lim: &dyn RateLimiter,
    from: Nanos,
    until: Nanos,
    quantum: Option<Nanos>,
    sends: &mut Sends,
) -> Nanos {
    let mut now = from;
    while now < until {
        let g = lim.acquire_up_to(u32::MAX, now);
        if g.granted > 0 {
            sends.push((now, u64::from(g.granted)));
        }
        let next = g.next_at.unwrap_or(now);
        assert!(next > now || g.next_at.is_none(), "WaitUntil in the past");
        now = match quantum {
            Some(q) => next.max(now + q),
            None => next.max(now + 1),
        };
    }
    now
}

// ---------------------------------------------------------------------------------------
// Strategies

fn subject() -> impl Strategy<Value = Subject> {
    proptest::sample::select(SUBJECTS.to_vec())
}

/// Fractional, whole, high and very high rates.
fn any_rate() -> impl Strategy<Value = f64> {
    prop_oneof![
        Just(0.5),
        Just(3.0),
        Just(1000.0),
        Just(7_000_000.0),
        0.1f64..50.0,
        50.0f64..2_000_000.0,
    ]
}

#[derive(Debug, Clone)]
enum Ask {
    One,
    UpTo(u32),
    /// A batch, as a fraction (‰) of the batch cap.
    Batch(u32),
}

/// One step of demand: wait (a fraction of an interval, or an idle spell of up to 4 s, or
/// exactly as the last refusal said), then ask.
#[derive(Debug, Clone)]
struct Step {
    gap_permille: u64,
    idle: bool,
    follow: bool,
    ask: Ask,
}

fn step() -> impl Strategy<Value = Step> {
    (
        0u64..3000,
        prop::bool::weighted(0.05),
        prop::bool::weighted(0.5),
        prop_oneof![
            3 => Just(Ask::One),
            1 => (1u32..5000).prop_map(Ask::UpTo),
            1 => (1u32..=1000).prop_map(Ask::Batch),
        ],
    )
        .prop_map(|(gap_permille, idle, follow, ask)| Step {
            gap_permille,
            idle,
            follow,
            ask,
        })
}

/// Plays `steps` against a limiter; returns the sends and the last instant.
fn play(
    lim: &dyn RateLimiter,
    steps: &[Step],
    cap: u32,
    mut now: Nanos,
    sends: &mut Sends,
) -> Nanos {
    let interval = lim.rate().interval_nanos();
    let mut told: Option<Nanos> = None;
    for s in steps {
        now = match (s.follow, told) {
            (true, Some(t)) => t.max(now),
            _ if s.idle => now + 4 * SEC * s.gap_permille / 3000,
            _ => now + interval * s.gap_permille / 1000,
        };
        told = None;
        match s.ask {
            Ask::One => match lim.try_acquire(now) {
                Decision::Allow => sends.push((now, 1)),
                Decision::WaitUntil(t) => told = Some(t),
            },
            Ask::UpTo(k) => {
                let g = lim.acquire_up_to(k, now);
                if g.granted > 0 {
                    sends.push((now, u64::from(g.granted)));
                }
                assert_eq!(g.granted < k, g.next_at.is_some(), "next_at iff short");
                told = g.next_at;
            }
            Ask::Batch(permille) => {
                let n = (u64::from(cap) * u64::from(permille) / 1000).max(1) as u32;
                match lim.try_acquire_n(n, now) {
                    Decision::Allow => sends.push((now, u64::from(n))),
                    Decision::WaitUntil(t) => told = Some(t),
                }
            }
        }
        if let Some(t) = told {
            assert!(t > now, "WaitUntil({t}) at {now} is not in the future");
        }
    }
    now
}

/// `n` cases, or `PROPTEST_CASES` when set (for a longer soak).
fn cases(n: u32) -> ProptestConfig {
    let n = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(n);
    ProptestConfig {
        cases: n,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}
