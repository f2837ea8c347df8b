//! A ramp-up: the fraction of its full rate a campaign may send at, climbing from a
//! start fraction to 1 geometrically, so that every second's target is the same
//! multiple of the one before (docs/ALGORITHMS.md, "Ramp-up").
//!
//! The curve is `f(t) = from × k^t` (t in seconds since the start), with
//! `k = (1 / from)^(1 / secs)`. A constant ratio is the smoothest climb that never steps
//! by more than `k` from one second to the next; a linear climb from 10% would step by
//! 1 + 0.9 / (0.1 × secs) in its first second. When `k` would exceed
//! [`RAMP_MAX_STEP`], the ramp is lengthened until it does not (`from` = 0.1: at least
//! 24.2 s).

use crate::job::policy::RAMP_MAX_STEP;
use crate::limiter::{Nanos, NANOS_PER_SEC};

/// How often a ramping campaign's rate is set anew: 10 steps a second keep each 100 ms
/// within 1% of the curve (k^0.1 ≤ 1.0096).
pub const RAMP_TICK: Nanos = NANOS_PER_SEC / 10;

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Ramp {
    /// When it started, on the scheduler's clock.
    start: Nanos,
    /// The fraction at `start`.
    from: f64,
    /// ln(k): the curve's growth per second.
    growth: f64,
}

impl Ramp {
    /// A ramp from `from` to 1 over `secs` (lengthened to keep each second's step at
    /// most [`RAMP_MAX_STEP`]); `None` when there is nothing to climb.
    pub fn new(start: Nanos, from: f64, secs: f64) -> Option<Ramp> {
        if secs.is_nan() || secs <= 0.0 || from.is_nan() || from <= 0.0 || from >= 1.0 {
            return None;
        }
        let span = (1.0 / from).ln();
        let growth = (span / secs).min(RAMP_MAX_STEP.ln());
        Some(Ramp {
            start,
            from,
            growth,
        })
    }

    /// The same curve's climb, from `from` at `start` (a ramp restarted part way: after
    /// an adaptive ceiling lifts, from the rate it held).
    pub fn resumed(&self, start: Nanos, from: f64) -> Option<Ramp> {
        (from < 1.0).then_some(Ramp {
            start,
            from: from.max(f64::MIN_POSITIVE),
            growth: self.growth,
        })
    }

    /// The fraction of the full rate allowed at `now`, in (0, 1].
    pub fn fraction(&self, now: Nanos) -> f64 {
        let t = now.saturating_sub(self.start) as f64 / NANOS_PER_SEC as f64;
        (self.from * (self.growth * t).exp()).min(1.0)
    }

    /// When it reaches the full rate.
    pub fn end(&self) -> Nanos {
        self.start + (self.seconds() * NANOS_PER_SEC as f64).ceil() as Nanos
    }

    /// Seconds from start to the full rate.
    pub fn seconds(&self) -> f64 {
        (1.0 / self.from).ln() / self.growth
    }
}

/// A deterministic delay of up to `max_ms` for a campaign's scheduled start, the same
/// on every worker (FNV-1a of its id), so that campaigns due at one instant spread out.
pub fn start_jitter_ms(campaign: &str, max_ms: u64) -> i64 {
    if max_ms == 0 {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in campaign.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % (max_ms + 1)) as i64
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: Nanos = NANOS_PER_SEC;

    #[test]
    fn climbs_geometrically_from_its_start_to_the_full_rate() {
        let r = Ramp::new(0, 0.1, 60.0).unwrap();
        assert!((r.fraction(0) - 0.1).abs() < 1e-12);
        assert!((r.fraction(30 * S) - 0.1f64.sqrt()).abs() < 1e-9);
        assert_eq!(r.fraction(60 * S), 1.0);
        assert_eq!(r.fraction(61 * S), 1.0);
        assert!(r.end().abs_diff(60 * S) <= 1);
    }

    #[test]
    fn no_second_steps_more_than_the_maximum_and_short_ramps_are_lengthened() {
        for secs in [1.0, 10.0, 24.0, 30.0, 600.0] {
            let r = Ramp::new(0, 0.1, secs).unwrap();
            // Each second's target is the curve's integral over it.
            let target = |k: u64| -> f64 {
                (0..1000)
                    .map(|i| r.fraction(k * S + i * S / 1000 + S / 2000))
                    .sum::<f64>()
                    / 1000.0
            };
            for k in 1..(r.seconds().ceil() as u64 + 2) {
                let step = target(k) / target(k - 1);
                assert!(step <= RAMP_MAX_STEP + 1e-9, "{secs} s: step {step} at {k}");
            }
            assert!(r.seconds() >= secs - 1e-9);
            assert!(r.seconds() >= 0.1f64.recip().ln() / RAMP_MAX_STEP.ln() - 1e-9);
        }
    }

    #[test]
    fn nothing_to_climb_is_no_ramp() {
        assert_eq!(Ramp::new(0, 0.1, 0.0), None);
        assert_eq!(Ramp::new(0, 1.0, 60.0), None);
        let r = Ramp::new(0, 0.1, 60.0).unwrap();
        assert_eq!(r.resumed(5 * S, 1.0), None);
        let half = r.resumed(5 * S, 0.5).unwrap();
        assert_eq!(half.fraction(5 * S), 0.5);
        assert!(half.end() < r.end() + 5 * S);
    }

    #[test]
    fn jitter_is_stable_and_spread() {
        assert_eq!(start_jitter_ms("a", 0), 0);
        assert_eq!(start_jitter_ms("a", 1000), start_jitter_ms("a", 1000));
        let distinct: std::collections::HashSet<i64> = (0..50)
            .map(|i| start_jitter_ms(&format!("campaign-{i}"), 60_000))
            .collect();
        assert!(distinct.len() >= 45, "{}", distinct.len());
        assert!(distinct.iter().all(|&j| (0..=60_000).contains(&j)));
    }
}
