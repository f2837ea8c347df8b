//! `leaky-bucket`: the leaky bucket as a meter.
//!
//! Each permit pours one interval's worth of water (`T = 1/rate`) into a bucket that
//! leaks at one nanosecond of water per nanosecond; a permit passes if its water fits
//! under the brim, `capacity = (burst + 1) × T`. The water is kept in the fixed point of
//! [`Rate::interval_fp`], so rates up to 10 M/s keep their accuracy.
//!
//! Trade-offs: smooth spacing of 1/rate, never more than the bucket size at once, O(1)
//! memory, exact `WaitUntil`. It is the same arithmetic as [`gcra`](super::gcra) (the
//! water level is `TAT − now`), written the classic way, with a `Mutex` around two words
//! instead of one atomic; that lock is per limiter, i.e. per campaign, never global.
//! Compared with `token-bucket` the difference is only the point of view (water poured in
//! versus tokens taken out): with the same burst both release the same sequence.
//!
//! Burst: after an idle spell `burst + 1` permits pass at once; any window `[t, t + w)`
//! holds at most `ceil(rate × w) + burst`. A batch larger than `burst + 1` passes when
//! the bucket is empty and overflows it; the overflow leaks away before anything else
//! passes, so the long-run rate holds.

use parking_lot::Mutex;

use super::{ceil_ns, mul_div, to_fp, Decision, Grant, Nanos, Rate, RateLimiter};

#[derive(Debug)]
struct State {
    /// Water in the bucket at `last`, ns × 2^8.
    water: u64,
    last: Nanos,
    interval: u64,
    rate: Rate,
}

impl State {
    #[inline]
    fn leak(&mut self, now: Nanos) {
        if now > self.last {
            self.water = self.water.saturating_sub(to_fp(now - self.last));
            self.last = now;
        }
    }

    /// The level water must be at or under for `n` permits to fit.
    #[inline]
    fn room(&self, n: u32, burst: u64) -> u64 {
        if u64::from(n) <= burst + 1 {
            self.interval.saturating_mul(burst + 1 - u64::from(n))
        } else {
            0
        }
    }
}

/// The leaky bucket (as a meter). See the [module docs](self).
#[derive(Debug)]
pub struct LeakyBucket {
    state: Mutex<State>,
    burst: u64,
}

impl LeakyBucket {
    pub fn new(rate: Rate, burst: u32) -> Self {
        Self {
            state: Mutex::new(State {
                water: 0,
                last: 0,
                interval: rate.interval_fp(),
                rate,
            }),
            burst: u64::from(burst),
        }
    }
}

impl RateLimiter for LeakyBucket {
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        let mut st = self.state.lock();
        st.leak(now);
        let room = st.room(n, self.burst);
        if st.water <= room {
            st.water = st
                .water
                .saturating_add(st.interval.saturating_mul(u64::from(n)));
            Decision::Allow
        } else {
            Decision::WaitUntil(st.last.saturating_add(ceil_ns(st.water - room)))
        }
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        let mut st = self.state.lock();
        st.leak(now);
        let t = st.interval;
        let capacity = t.saturating_mul(self.burst + 1);
        let fits = capacity.saturating_sub(st.water) / t;
        let granted = fits.min(u64::from(max)) as u32;
        st.water = st
            .water
            .saturating_add(t.saturating_mul(u64::from(granted)));
        let next_at = (granted < max).then(|| {
            let room = capacity - t; // t ≤ capacity since burst + 1 ≥ 1
            st.last
                .saturating_add(ceil_ns(st.water.saturating_sub(room)))
        });
        Grant { granted, next_at }
    }

    /// Rescales the water to the new interval (the permits in the bucket stay in it) and
    /// caps it at the new capacity, so that the next permit is at most one new interval
    /// away.
    fn set_rate(&self, rate: Rate, now: Nanos) {
        let mut st = self.state.lock();
        st.leak(now);
        let new_t = rate.interval_fp();
        let capacity = new_t.saturating_mul(self.burst + 1);
        st.water = mul_div(st.water, new_t, st.interval).min(capacity);
        st.interval = new_t;
        st.rate = rate;
    }

    fn rate(&self) -> Rate {
        self.state.lock().rate
    }

    fn name(&self) -> &'static str {
        "leaky-bucket"
    }
}
