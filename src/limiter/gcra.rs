//! `gcra`: the generic cell rate algorithm (earliest departure time), lock-free.
//!
//! The whole mutable state is one `AtomicU64`: the theoretical arrival time (TAT), the
//! instant at which the limiter would be back to its smooth schedule, in the fixed point of
//! [`Rate::interval_fp`] (ns × 2^8) so that even 10 M/s (100 ns per send) keeps its rate
//! to within 0.002%. A decision is one relaxed load; a refusal stops there. A pass while
//! the limiter is busy (TAT ahead of now) is one `fetch_add` of the interval, which never
//! retries under contention; a pass from idle is one compare-and-swap (TAT jumps to now).
//! There is no lock and no division on the hot path: the interval is precomputed, the
//! tolerance is one multiplication.
//!
//! Rule, with interval `T` and tolerance `τ = burst × T`: a permit passes at `now` when
//! `TAT ≤ now + τ`, and then `TAT = max(TAT, now) + T`. So after an idle spell
//! `burst + 1` permits pass at once, then one per `T`; any window `[t, t + w)` holds at
//! most `ceil(rate × w) + burst` permits, under any interleaving of threads, because every
//! pass is one atomic step on the same word.
//!
//! Trade-offs: exact and smooth, O(1) memory, the cheapest decision of all the
//! algorithms, and `WaitUntil` is exact to the nanosecond. When three or more threads
//! race for the last slot, a loser may be unable to hand its slot back (someone took a
//! later one): that slot goes unused, so heavy contention at the limit can under-admit
//! slightly, never over-admit. It cannot "catch up" after a
//! stall beyond its burst, which is the point. A clock more than 2^56 ns (2.3 years)
//! past its origin saturates; [`MonotonicClock`](super::MonotonicClock) starts at 0.
//!
//! A batch of `n` permits passes when `TAT ≤ now + τ − (n − 1)·T`; a batch larger than
//! `burst + 1` passes once the limiter is idle (`TAT ≤ now`) and is then paid for with
//! silence, so the long-run rate holds.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use super::{ceil_ns, to_fp, Decision, Grant, Nanos, Rate, RateLimiter};

/// The lock-free GCRA limiter. See the [module docs](self).
#[derive(Debug)]
#[repr(align(64))]
pub struct Gcra {
    /// Theoretical arrival time, ns × 2^8.
    tat: AtomicU64,
    /// The interval `T`, ns × 2^8; atomic so that `set_rate` needs no lock.
    interval: AtomicU64,
    burst: u64,
    rate_bits: AtomicU64,
}

impl Gcra {
    pub fn new(rate: Rate, burst: u32) -> Self {
        Self {
            tat: AtomicU64::new(0),
            interval: AtomicU64::new(rate.interval_fp()),
            burst: u64::from(burst),
            rate_bits: AtomicU64::new(rate.to_bits()),
        }
    }

    /// The configured burst.
    pub fn burst(&self) -> u32 {
        u32::try_from(self.burst).unwrap_or(u32::MAX)
    }

    /// Takes `n` permits due at `at`, decided as of `now` (`at ≤ now`): they pass when
    /// the schedule is within the tolerance of `now`, and an idle schedule restarts at
    /// `at`, so that a caller making up its own lateness fills the slots since `at`.
    /// `strict` callers (the hierarchical limiter's burst permits) have no tolerance, so
    /// that they only use capacity that nobody has used ahead of schedule.
    #[inline]
    pub(crate) fn acquire_with(&self, n: u32, at: Nanos, now: Nanos, strict: bool) -> Decision {
        if n == 0 {
            return Decision::Allow;
        }
        let (slack, cost) = self.batch_terms(n, strict);
        let at_fp = to_fp(at.min(now));
        let limit = to_fp(now).saturating_add(slack);
        let mut tat = self.tat.load(Relaxed);
        loop {
            if tat > limit {
                return Decision::WaitUntil(ceil_ns(tat - slack));
            }
            let next = tat.max(at_fp).saturating_add(cost);
            match self.tat.compare_exchange_weak(tat, next, Relaxed, Relaxed) {
                Ok(_) => return Decision::Allow,
                Err(current) => tat = current,
            }
        }
    }

    /// Takes `n` permits whatever the limit: the schedule moves on by their cost, so
    /// that later asks wait for them (sends of a class served first under a cap).
    pub(crate) fn force(&self, n: u32, now: Nanos) {
        let (_, cost) = self.batch_terms(n.max(1), false);
        let now_fp = to_fp(now);
        let mut tat = self.tat.load(Relaxed);
        loop {
            let next = tat.max(now_fp).saturating_add(cost);
            match self.tat.compare_exchange_weak(tat, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(current) => tat = current,
            }
        }
    }

    /// What [`Gcra::acquire_with`] would decide now, taking nothing: one load. A caller
    /// that must spend another limiter's permit first asks this, so that it does not
    /// spend it for a batch this one refuses.
    #[inline]
    pub(crate) fn check_with(&self, n: u32, now: Nanos, strict: bool) -> Decision {
        if n == 0 {
            return Decision::Allow;
        }
        let (slack, _) = self.batch_terms(n, strict);
        let tat = self.tat.load(Relaxed);
        if tat > to_fp(now).saturating_add(slack) {
            return Decision::WaitUntil(ceil_ns(tat - slack));
        }
        Decision::Allow
    }

    /// A batch of `n`'s tolerance and cost (ns × 2^8); `strict` has no tolerance.
    #[inline]
    fn batch_terms(&self, n: u32, strict: bool) -> (u64, u64) {
        let t = self.interval.load(Relaxed);
        let tau = if strict {
            0
        } else {
            t.saturating_mul(self.burst)
        };
        let slack = tau.saturating_sub(t.saturating_mul(u64::from(n) - 1));
        (slack, t.saturating_mul(u64::from(n)))
    }
}

impl RateLimiter for Gcra {
    #[inline]
    fn try_acquire(&self, now: Nanos) -> Decision {
        let t = self.interval.load(Relaxed);
        let tau = t.saturating_mul(self.burst);
        let now_fp = to_fp(now);
        let limit = now_fp.saturating_add(tau);
        let mut tat = self.tat.load(Relaxed);
        if tat > limit {
            return Decision::WaitUntil(ceil_ns(tat - tau));
        }
        if tat >= now_fp {
            // Busy (the schedule runs ahead of now): the next slot starts at TAT whoever
            // takes it, so take it with one fetch_add, which never retries under
            // contention as a compare-and-swap does. It passes on GCRA's own rule:
            // the slot [prev, prev + T) starts within [now, now + τ].
            let prev = self.tat.fetch_add(t, Relaxed);
            if prev >= now_fp && prev <= limit {
                return Decision::Allow;
            }
            // Give the slot back only if nobody took a later one; otherwise it stays
            // used, which can only under-admit, never over-admit.
            let _ = self
                .tat
                .compare_exchange(prev.saturating_add(t), prev, Relaxed, Relaxed);
            if prev > limit {
                return Decision::WaitUntil(ceil_ns(prev - tau));
            }
            // TAT fell behind now meanwhile (a slot given back): decide from idle below.
            tat = self.tat.load(Relaxed);
        }
        loop {
            if tat > limit {
                return Decision::WaitUntil(ceil_ns(tat - tau));
            }
            let next = tat.max(now_fp).saturating_add(t);
            match self.tat.compare_exchange_weak(tat, next, Relaxed, Relaxed) {
                Ok(_) => return Decision::Allow,
                Err(current) => tat = current,
            }
        }
    }

    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        self.acquire_with(n, now, now, false)
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        if max == 0 {
            return Grant {
                granted: 0,
                next_at: None,
            };
        }
        let t = self.interval.load(Relaxed);
        let tau = t.saturating_mul(self.burst);
        let now_fp = to_fp(now);
        let limit = now_fp.saturating_add(tau);
        let mut tat = self.tat.load(Relaxed);
        loop {
            if tat > limit {
                return Grant {
                    granted: 0,
                    next_at: Some(ceil_ns(tat - tau)),
                };
            }
            let base = tat.max(now_fp);
            // One division per batch, not per permit.
            let available = (limit - base) / t + 1;
            let granted = available.min(u64::from(max));
            let next = base.saturating_add(granted.saturating_mul(t));
            match self.tat.compare_exchange_weak(tat, next, Relaxed, Relaxed) {
                Ok(_) => {
                    // granted ≤ max, a u32.
                    let granted = granted as u32;
                    let next_at = (granted < max).then(|| ceil_ns(next.saturating_sub(tau)));
                    return Grant { granted, next_at };
                }
                Err(current) => tat = current,
            }
        }
    }

    /// Rescales the debt (how far TAT is ahead of `now`) to the new interval, so that the
    /// permits already owed stay owed, and caps it at `τ' + T'` so that a lower rate never
    /// makes the limiter wait more than one new interval.
    fn set_rate(&self, rate: Rate, now: Nanos) {
        let new_t = rate.interval_fp();
        let old_t = self.interval.swap(new_t, Relaxed).max(1);
        self.rate_bits.store(rate.to_bits(), Relaxed);
        let cap = new_t.saturating_mul(self.burst).saturating_add(new_t);
        let now_fp = to_fp(now);
        let mut tat = self.tat.load(Relaxed);
        loop {
            if tat <= now_fp {
                return; // idle: nothing owed, nothing to rescale
            }
            let debt = u128::from(tat - now_fp) * u128::from(new_t) / u128::from(old_t);
            let debt = u64::try_from(debt).unwrap_or(u64::MAX).min(cap);
            let next = now_fp.saturating_add(debt);
            match self.tat.compare_exchange_weak(tat, next, Relaxed, Relaxed) {
                Ok(_) => return,
                Err(current) => tat = current,
            }
        }
    }

    fn rate(&self) -> Rate {
        Rate::from_bits(self.rate_bits.load(Relaxed))
    }

    fn name(&self) -> &'static str {
        "gcra"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn smooth_then_exact_wait() {
        let g = Gcra::new(Rate::per_second(1000.0).unwrap(), 0);
        assert_eq!(g.try_acquire(0), Decision::Allow);
        assert_eq!(g.try_acquire(0), Decision::WaitUntil(1_000_000));
        assert_eq!(g.try_acquire(999_999), Decision::WaitUntil(1_000_000));
        assert_eq!(g.try_acquire(1_000_000), Decision::Allow);
    }

    #[test]
    fn burst_then_spacing() {
        let g = Gcra::new(Rate::per_second(10.0).unwrap(), 4);
        for _ in 0..5 {
            assert_eq!(g.try_acquire(0), Decision::Allow);
        }
        assert_eq!(g.try_acquire(0), Decision::WaitUntil(100_000_000));
        let grant = g.acquire_up_to(10, 1_000_000_000);
        assert_eq!(grant.granted, 5);
        assert_eq!(grant.next_at, Some(1_100_000_000));
    }
}
