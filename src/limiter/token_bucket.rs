//! `token-bucket`: tokens accumulate while idle, up to a capacity.
//!
//! Tokens drip in at the rate and are kept (in the fixed point of [`Rate::interval_fp`],
//! as nanoseconds of credit: one token is one interval `T`) up to `capacity = (burst + 1)
//! tokens`; a permit takes one. The bucket starts full.
//!
//! Trade-offs: the classic way to allow bursts: idle time is saved up, to the capacity,
//! and spent at once. With `burst = 0` it is exactly as smooth as `leaky-bucket` and
//! `gcra`; with a large burst it front-loads after every idle spell or stall (that is what
//! `pushpace simulate --burst N` shows). O(1) memory, exact `WaitUntil`, a `Mutex` per
//! limiter (per campaign, never global).
//!
//! Burst: `burst + 1` permits at once after an idle spell; any window `[t, t + w)` holds
//! at most `ceil(rate × w) + burst`. A batch larger than the capacity waits for a full
//! bucket, takes it, and leaves the bucket in debt (negative), so the long-run rate holds.

use parking_lot::Mutex;

use super::{ceil_ns, to_fp, Decision, Grant, Nanos, Rate, RateLimiter};

#[derive(Debug)]
struct State {
    /// Credit at `last`, ns × 2^8; negative after an oversized batch.
    tokens: i128,
    last: Nanos,
    interval: u64,
    rate: Rate,
}

impl State {
    #[inline]
    fn capacity(&self, burst: u64) -> i128 {
        i128::from(self.interval) * i128::from(burst + 1)
    }

    #[inline]
    fn refill(&mut self, now: Nanos, burst: u64) {
        if now > self.last {
            let cap = self.capacity(burst);
            self.tokens = (self.tokens + i128::from(to_fp(now - self.last))).min(cap);
            self.last = now;
        }
    }

    /// Tokens needed before `n` permits can go: their cost, or a full bucket for a batch
    /// larger than the capacity.
    #[inline]
    fn needed(&self, n: u32, burst: u64) -> i128 {
        (i128::from(self.interval) * i128::from(n)).min(self.capacity(burst))
    }

    #[inline]
    fn wait_until(&self, needed: i128) -> Nanos {
        let short = u64::try_from(needed - self.tokens).unwrap_or(u64::MAX);
        self.last.saturating_add(ceil_ns(short))
    }
}

/// The token bucket. See the [module docs](self).
#[derive(Debug)]
pub struct TokenBucket {
    state: Mutex<State>,
    burst: u64,
}

impl TokenBucket {
    pub fn new(rate: Rate, burst: u32) -> Self {
        let interval = rate.interval_fp();
        let burst = u64::from(burst);
        Self {
            state: Mutex::new(State {
                tokens: i128::from(interval) * i128::from(burst + 1),
                last: 0,
                interval,
                rate,
            }),
            burst,
        }
    }
}

impl RateLimiter for TokenBucket {
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        let mut st = self.state.lock();
        st.refill(now, self.burst);
        let needed = st.needed(n, self.burst);
        if st.tokens >= needed {
            st.tokens -= i128::from(st.interval) * i128::from(n);
            Decision::Allow
        } else {
            Decision::WaitUntil(st.wait_until(needed))
        }
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        let mut st = self.state.lock();
        st.refill(now, self.burst);
        let t = i128::from(st.interval);
        let whole = if st.tokens > 0 { st.tokens / t } else { 0 };
        let granted = whole.min(i128::from(max)) as u32;
        st.tokens -= t * i128::from(granted);
        let next_at = (granted < max).then(|| st.wait_until(t));
        Grant { granted, next_at }
    }

    /// Rescales the credit to the new interval (saved-up permits stay saved) within the
    /// new capacity, and forgives debt beyond one new interval, so that a lower rate never
    /// stalls the bucket for longer than that.
    fn set_rate(&self, rate: Rate, now: Nanos) {
        let mut st = self.state.lock();
        st.refill(now, self.burst);
        let new_t = rate.interval_fp();
        let old_t = st.interval.max(1);
        st.tokens = st.tokens * i128::from(new_t) / i128::from(old_t);
        st.interval = new_t;
        st.rate = rate;
        let cap = st.capacity(self.burst);
        st.tokens = st.tokens.clamp(0, cap);
    }

    fn rate(&self) -> Rate {
        self.state.lock().rate
    }

    fn name(&self) -> &'static str {
        "token-bucket"
    }
}
