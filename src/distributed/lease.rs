//! [`LeasedLimiter`]: a campaign limiter that spends permits leased from Redis.
//!
//! The hot path never waits for Redis: it takes permits from at most two leases held in
//! this process (the one being spent and the next, fetched ahead), under the campaign's
//! own short mutex, without allocating. A lease is a run of slots of the campaign's
//! schedule, spaced by its interval: so the lease's rate is the campaign's rate, and its
//! slots are this worker's part of the global total that Redis keeps. They are placed
//! on this worker's clock by Redis's ([`super::redis_clock`]): never early, and late by
//! the quickest recent round trip, however long this answer took to be read.
//!
//! **The campaign's own algorithm.** Redis decides how many permits a worker gets; the
//! campaign's algorithm decides when, within its leases, they go. The limiter holds a
//! local limiter of the campaign's algorithm, built by [`crate::limiter::build`] at the
//! campaign's rate and burst, and a permit passes when both a lease and that limiter
//! have one: a lease's permits are usable from its first slot until [`CATCH_UP`] after
//! its last (not each at its own slot), and the local limiter shapes them. For
//! `leaky-bucket` without burst that is the lease's own smooth spacing; `gcra` and
//! `governor` without burst *are* that spacing, so they spend each slot at its own time
//! instead (below), which keeps the tighter timing; `token-bucket`, or any of them
//! with a burst, may send up to `burst + 1`
//! permits at once when a lease opens after a gap, as it would alone. A permit then goes
//! at most `burst / rate` before its slot, so over any window of `w` the workers together
//! send at most `rate × w + 2 × burst + 1` (one burst of Redis's tolerance after an
//! idle spell, one of local shaping).
//!
//! **Algorithms that cannot sit under a lease.** `fixed-window`, `sliding-log` and
//! `sliding-window` count per window of `limit / rate`, about a second, while a lease
//! covers `redis.lease_ms` (100 ms): the window would never bind within a lease, so
//! under one they would pass each lease at once as a burst of its size, a shape that is
//! neither theirs nor smooth, and one that lets a second's count exceed the rate by a
//! lease per worker. For these the limiter falls back, explicitly and logged once per
//! campaign, to spending each slot at its own time (the GCRA schedule Redis keeps);
//! [`LeasedLimiter::local_algorithm`] says `None`. Their own shape still applies on the
//! Redis-down fallback, which is local.
//!
//! In both modes a slot not used within [`CATCH_UP`] of its time (the last slot of its
//! lease, when shaped locally) is void, so a lease expires with its slice and unused
//! permits are never hoarded or sent in a burst.
//!
//! A background task per campaign keeps the next lease ready: when the limiter is down
//! to one lease and was asked for permits recently, it asks Redis for about
//! rate × slice / workers permits. If Redis fails, the campaign switches to its local
//! fallback limiter (see [`super::fallback`]) until a lease call succeeds again.

mod refill;
mod state;

use super::Inner;
use crate::limiter::{to_fp, Algorithm, Decision, DynLimiter, Grant, Nanos, Rate, RateLimiter};
use parking_lot::Mutex;
use refill::refill;
use state::{Lease, State};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How late a slot may still be used. Later slots are void: a stalled scheduler never
/// turns missed slots into a burst beyond rate × 10 ms.
pub const CATCH_UP: Nanos = 10_000_000;

/// When no lease is ready: how soon to ask the limiter again.
const EMPTY_RETRY: Nanos = 1_000_000;

/// How often a campaign on its fallback probes Redis.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// Whether the campaign's own algorithm shapes the permits of a lease (see the module
/// doc): not the window-counting ones, whose window outlasts a lease; and not a GCRA
/// (`gcra`, `governor`) without burst, whose shape *is* the lease's schedule, so spending
/// each slot at its own time gives the same shape with tighter timing (a slot is void
/// [`CATCH_UP`] after its time, while a shaped lease stays usable from its first slot
/// to its last: after a rebalance, that let a whole-run second reach 2,046 at 2,000/s).
pub fn shapes_leases(algorithm: Algorithm, burst: u32) -> bool {
    match algorithm {
        Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow => false,
        Algorithm::Gcra | Algorithm::Governor => burst > 0,
        _ => true,
    }
}

/// What a campaign's limiter (the hot path) and its refill task share.
struct Shared {
    campaign: Arc<str>,
    key: String,
    state: Mutex<State>,
    /// The campaign's algorithm at its rate, shaping the leased permits; `None` for the
    /// algorithms that cannot sit under a lease (slots spent at their times).
    own: Option<DynLimiter>,
    algorithm: Algorithm,
    fallback_on: AtomicBool,
    /// The campaign's algorithm at rate / workers, while Redis is unreachable.
    fallback: DynLimiter,
    /// The refill task waits on this; the hot path wakes it once per need.
    notify: Notify,
    wanted: AtomicBool,
    last_demand: AtomicU64,
}

impl Shared {
    fn want_more(&self) {
        if !self.wanted.swap(true, Relaxed) {
            self.notify.notify_one();
        }
    }
}

/// A campaign limiter sharing its rate with other workers through Redis leases.
/// Dropping it stops its refill task.
pub struct LeasedLimiter {
    shared: Arc<Shared>,
    inner: Arc<Inner>,
    task: tokio::task::AbortHandle,
}

impl LeasedLimiter {
    pub(crate) fn start(
        inner: Arc<Inner>,
        campaign: &str,
        algorithm: Algorithm,
        rate: Rate,
        burst: u32,
    ) -> Self {
        let now = inner.clock.now();
        let own =
            shapes_leases(algorithm, burst).then(|| crate::limiter::build(algorithm, rate, burst));
        if own.is_none() && !matches!(algorithm, Algorithm::Gcra | Algorithm::Governor) {
            tracing::info!(
                campaign,
                %algorithm,
                "this algorithm cannot shape leased permits (its window outlasts a lease); \
                 leased slots are spent at their own times instead"
            );
        }
        let shared = Arc::new(Shared {
            campaign: Arc::from(campaign),
            key: inner.key(campaign),
            own,
            algorithm,
            state: Mutex::new(State {
                rate,
                burst,
                leases: [Lease::default(); 2],
                len: 0,
                hint: 0,
            }),
            fallback_on: AtomicBool::new(false),
            fallback: crate::limiter::build(
                algorithm,
                share(rate, inner.membership.workers()),
                burst,
            ),
            notify: Notify::new(),
            wanted: AtomicBool::new(true),
            last_demand: AtomicU64::new(now),
        });
        let task = inner
            .runtime
            .spawn(refill(Arc::clone(&shared), Arc::clone(&inner)))
            .abort_handle();
        LeasedLimiter {
            shared,
            inner,
            task,
        }
    }

    /// Whether the campaign runs on its local fallback (Redis unreachable).
    pub fn on_fallback(&self) -> bool {
        self.shared.fallback_on.load(Relaxed)
    }

    /// Permits leased and not yet used or void at `now`.
    pub fn leased_permits(&self, now: Nanos) -> u64 {
        let mut s = *self.shared.state.lock();
        if self.shared.own.is_some() {
            s.expire(now);
            return s.leases[..s.len].iter().map(Lease::left).sum();
        }
        let oldest = to_fp(now.saturating_sub(CATCH_UP));
        s.leases[..s.len]
            .iter()
            .map(|l| {
                l.end
                    .saturating_sub(l.cursor.max(oldest))
                    .div_ceil(l.interval)
            })
            .sum()
    }

    /// The algorithm that shapes the leased permits: the campaign's own, or `None` when
    /// it cannot sit under a lease and slots are spent at their own times.
    pub fn local_algorithm(&self) -> Option<Algorithm> {
        self.shared.own.as_ref().map(|_| self.shared.algorithm)
    }

    /// Whether Redis has granted a lease that is still held.
    pub fn holds_lease(&self) -> bool {
        self.shared.state.lock().len > 0
    }
}

impl Drop for LeasedLimiter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for LeasedLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeasedLimiter")
            .field("campaign", &self.shared.campaign)
            .field("on_fallback", &self.on_fallback())
            .finish_non_exhaustive()
    }
}

impl RateLimiter for LeasedLimiter {
    /// All or none, from the leases in hand: a batch larger than what one worker holds
    /// at once never passes, so callers should use [`RateLimiter::acquire_up_to`].
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        if self.shared.fallback_on.load(Relaxed) {
            return self.shared.fallback.try_acquire_n(n, now);
        }
        self.shared.last_demand.store(now, Relaxed);
        let mut s = self.shared.state.lock();
        let decision = match &self.shared.own {
            Some(own) => s.try_shaped(n, now, own.as_ref()),
            None => {
                let mut trial = *s;
                let g = trial.take(n, now);
                if g.granted == n {
                    *s = trial;
                    Decision::Allow
                } else {
                    Decision::WaitUntil(g.next_at.unwrap_or(now + EMPTY_RETRY))
                }
            }
        };
        let low = s.len < 2;
        drop(s);
        if low {
            self.shared.want_more();
        }
        decision
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        if self.shared.fallback_on.load(Relaxed) {
            return self.shared.fallback.acquire_up_to(max, now);
        }
        if max > 0 {
            self.shared.last_demand.store(now, Relaxed);
        }
        let mut s = self.shared.state.lock();
        let g = match &self.shared.own {
            Some(own) => s.take_shaped(max, now, own.as_ref()),
            None => s.take(max, now),
        };
        let low = s.len < 2;
        drop(s);
        if low && max > 0 {
            self.shared.want_more();
        }
        g
    }

    fn set_rate(&self, rate: Rate, now: Nanos) {
        // Slots leased at the old spacing stay valid: at most a slice or two of them.
        let mut s = self.shared.state.lock();
        s.rate = rate;
        if let Some(own) = &self.shared.own {
            own.set_rate(rate, now);
        }
        drop(s);
        let workers = self.inner.membership.workers();
        self.shared.fallback.set_rate(share(rate, workers), now);
        self.shared.notify.notify_one();
    }

    fn rate(&self) -> Rate {
        self.shared.state.lock().rate
    }

    /// [`CATCH_UP`] while slots are spent at their own times; shaped leases follow the
    /// campaign's own limiter, and the fallback is local.
    fn catch_up(&self) -> Nanos {
        if self.shared.own.is_none() && !self.on_fallback() {
            CATCH_UP
        } else {
            0
        }
    }

    fn name(&self) -> &'static str {
        "redis-leased"
    }
}

/// `rate / workers`, at least a valid rate.
pub(crate) fn share(rate: Rate, workers: u32) -> Rate {
    // Below the smallest rate a Rate holds, each worker gets that smallest rate: the
    // closest to an even split (the whole rate per worker would be `workers` times it).
    let each =
        (rate.as_f64() / f64::from(workers.max(1))).max(crate::limiter::rate::MIN_RATE_PER_SECOND);
    Rate::per_second(each).unwrap_or(rate)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_share_below_the_smallest_rate_is_the_smallest_rate() {
        let r = |x: f64| Rate::per_second(x).unwrap();
        assert_eq!(share(r(100.0), 4), r(25.0));
        assert_eq!(share(r(0.002), 4), r(0.001));
        assert_eq!(share(r(0.001), 1), r(0.001));
    }

    #[test]
    fn window_algorithms_and_burstless_gcra_do_not_shape_leases() {
        for a in Algorithm::ALL {
            let window = matches!(
                a,
                Algorithm::FixedWindow | Algorithm::SlidingLog | Algorithm::SlidingWindow
            );
            let gcra = matches!(a, Algorithm::Gcra | Algorithm::Governor);
            assert_eq!(shapes_leases(a, 1), !window, "{a} with burst");
            assert_eq!(shapes_leases(a, 0), !window && !gcra, "{a} without burst");
        }
    }
}
