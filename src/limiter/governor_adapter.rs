//! `governor`: an adapter over the [governor] crate's direct (un-keyed) limiter, so that
//! users can choose it and the benchmarks compare against it.
//!
//! governor is GCRA too, with its own clock abstraction. The adapter hands it the
//! caller's `now` through a thread-local read by a zero-sized governor clock, so it runs
//! under the same real or virtual time as every other algorithm. Its quota is one permit
//! per [`Rate::interval_nanos`] with `burst + 1` permits of burst capacity.
//!
//! Trade-offs: battle-tested and lock-free inside, exact `WaitUntil` (governor's
//! `earliest_possible`), same burst semantics as `gcra`: after an idle spell `burst + 1`
//! at once, and any window `[t, t + w)` holds at most `ceil(rate × w) + burst`. Its
//! interval is whole nanoseconds, so rates near 10 M/s (100 ns) are off by up to 0.5%
//! (7 M/s: 143 ns instead of 142.857, −0.1%). A governor quota cannot change, so the
//! quota sits behind a `RwLock` (a read lock per decision) and `set_rate` swaps in a new
//! limiter that carries over the old one's debt, rescaled and capped at one new interval
//! beyond the burst. A batch larger than `burst + 1`, which governor refuses outright
//! (`InsufficientCapacity`), waits for a full bucket, and the excess is charged to it at
//! later virtual instants so that the long-run rate holds.

use std::cell::Cell;
use std::num::NonZeroU32;
use std::sync::RwLock;
use std::time::Duration;

use governor::clock::Clock as GovernorClock;
use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos as GovernorNanos;
use governor::state::{InMemoryState, NotKeyed};
use governor::Quota;

use super::{mul_div, Decision, Grant, Nanos, Rate, RateLimiter};

thread_local! {
    static CALLER_NOW: Cell<Nanos> = const { Cell::new(0) };
}

/// A governor clock that reads the instant the adapter was just given.
#[derive(Debug, Clone, Copy, Default)]
struct CallerClock;

impl GovernorClock for CallerClock {
    type Instant = GovernorNanos;

    #[inline]
    fn now(&self) -> GovernorNanos {
        GovernorNanos::from(CALLER_NOW.with(Cell::get))
    }
}

#[inline]
fn set_now(now: Nanos) {
    CALLER_NOW.with(|c| c.set(now));
}

type Direct =
    governor::RateLimiter<NotKeyed, InMemoryState, CallerClock, NoOpMiddleware<GovernorNanos>>;

#[derive(Debug)]
struct Inner {
    limiter: Direct,
    capacity: NonZeroU32,
    interval: Nanos,
    rate: Rate,
}

impl Inner {
    fn new(rate: Rate, burst: u32) -> Self {
        let interval = rate.interval_nanos();
        let capacity = NonZeroU32::new(burst.saturating_add(1)).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(Duration::from_nanos(interval))
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(capacity);
        // governor measures from the clock's reading at construction: make it 0, the
        // origin every caller's `now` counts from.
        set_now(0);
        Self {
            limiter: Direct::direct_with_clock(quota, CallerClock),
            capacity,
            interval,
            rate,
        }
    }

    /// Takes `n ≤ capacity` permits at `now`.
    #[inline]
    fn check_n(&self, n: NonZeroU32, now: Nanos) -> Decision {
        set_now(now);
        match self.limiter.check_n(n) {
            Ok(Ok(())) => Decision::Allow,
            Ok(Err(not_until)) => Decision::WaitUntil(not_until.earliest_possible().as_u64()),
            // Callers never ask for more than the capacity; the earliest instant one
            // interval on keeps the "not yet, never never" contract if they did.
            Err(_) => Decision::WaitUntil(now.saturating_add(self.interval)),
        }
    }

    /// Charges `permits` more to the limiter, as early as it accepts them from `from`
    /// on: governor state is a theoretical arrival time, so this pushes it into the future.
    fn charge(&self, mut permits: u64, mut from: Nanos) {
        while permits > 0 {
            let chunk = permits.min(u64::from(self.capacity.get()));
            let Some(n) = u32::try_from(chunk).ok().and_then(NonZeroU32::new) else {
                return;
            };
            match self.check_n(n, from) {
                Decision::Allow => permits -= chunk,
                Decision::WaitUntil(t) => from = t.max(from.saturating_add(1)),
            }
        }
    }
}

/// The governor adapter. See the [module docs](self).
#[derive(Debug)]
pub struct GovernorLimiter {
    inner: RwLock<Inner>,
    burst: u32,
}

impl GovernorLimiter {
    pub fn new(rate: Rate, burst: u32) -> Self {
        Self {
            inner: RwLock::new(Inner::new(rate, burst)),
            burst,
        }
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Inner> {
        self.inner
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

impl RateLimiter for GovernorLimiter {
    #[inline]
    fn try_acquire(&self, now: Nanos) -> Decision {
        let inner = self.read();
        set_now(now);
        match inner.limiter.check() {
            Ok(()) => Decision::Allow,
            Err(not_until) => Decision::WaitUntil(not_until.earliest_possible().as_u64()),
        }
    }

    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        let Some(nz) = NonZeroU32::new(n) else {
            return Decision::Allow;
        };
        let inner = self.read();
        if nz <= inner.capacity {
            return inner.check_n(nz, now);
        }
        match inner.check_n(inner.capacity, now) {
            Decision::Allow => {
                inner.charge(u64::from(n - inner.capacity.get()), now);
                Decision::Allow
            }
            wait => wait,
        }
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        let inner = self.read();
        set_now(now);
        let mut granted = 0;
        while granted < max {
            match inner.limiter.check() {
                Ok(()) => granted += 1,
                Err(not_until) => {
                    return Grant {
                        granted,
                        next_at: Some(not_until.earliest_possible().as_u64()),
                    }
                }
            }
        }
        Grant {
            granted,
            next_at: None,
        }
    }

    fn set_rate(&self, rate: Rate, now: Nanos) {
        let mut inner = self
            .inner
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // The old limiter is about to go, so asking it for a full bucket is a free probe:
        // the answer is its theoretical arrival time, i.e. how far ahead it is.
        let debt = match inner.check_n(inner.capacity, now) {
            Decision::Allow => 0,
            Decision::WaitUntil(t) => t.saturating_sub(now),
        };
        let next = Inner::new(rate, self.burst);
        let cap = next.interval.saturating_mul(u64::from(next.capacity.get()));
        let debt = mul_div(debt, next.interval, inner.interval).min(cap);
        if debt > 0 {
            // A fresh limiter passes one permit at `from` and sets its TAT to from + T.
            let from = now.saturating_add(debt).saturating_sub(next.interval);
            set_now(from);
            let _ = next.limiter.check();
        }
        *inner = next;
    }

    fn rate(&self) -> Rate {
        self.read().rate
    }

    fn name(&self) -> &'static str {
        "governor"
    }
}
