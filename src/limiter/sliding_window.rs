//! `sliding-window`: the previous window's count weighted by its overlap with the
//! sliding window, the approximation described by Criteo.
//!
//! Two counters per calendar window (`W` and `limit` from [`window_for`]): `prev` for the
//! last window and `cur` for this one. At a fraction `f` into the current window the
//! estimate of the sends in the last `W` is `prev × (1 − f) + cur`; a permit passes while
//! that estimate, before it, is below `limit`. (Requiring the estimate *after* it to stay
//! within `limit` looks equivalent but starves small limits: with `limit = 1` a send
//! would block the whole next window, halving the rate.) Everything is integer
//! nanoseconds (`prev × (W − e) + cur × W < limit × W`), so `WaitUntil` is exact.
//!
//! Trade-offs: O(1) memory like fixed-window, without its hard edge: after the first
//! window the quota is released gradually, as earlier sends "slide out", and under
//! saturating demand the long-run rate is `limit / W`. It is still an estimate: it assumes
//! the previous window's sends were spread evenly. When they were not (they all came late
//! in it), a window `[t, t + w)` that straddles the edge can hold up to
//! `(ceil(w / W) + 1) × limit` permits, the same documented bound as fixed-window. The
//! very first window (and the first after an idle spell of two windows) is front-loaded:
//! nothing weighs against it. A `Mutex` per limiter (per campaign, never global).
//!
//! A batch larger than `limit` passes when both counters are empty; the next window then
//! weighs it as `prev`, which pays back part of the excess.

use parking_lot::Mutex;

use super::{window_for, Decision, Grant, Nanos, Rate, RateLimiter};

#[derive(Debug)]
struct State {
    start: Nanos,
    prev: u64,
    cur: u64,
    limit: u64,
    length: Nanos,
    rate: Rate,
}

impl State {
    #[inline]
    fn roll(&mut self, now: Nanos) {
        let elapsed = now.saturating_sub(self.start);
        if elapsed >= self.length {
            let windows = elapsed / self.length;
            self.prev = if windows == 1 { self.cur } else { 0 };
            self.cur = 0;
            self.start += windows * self.length;
        }
    }

    /// `prev × (W − e)`: the previous window's weight, times W.
    #[inline]
    fn weighted_prev(&self, now: Nanos) -> u128 {
        let left = self.length - now.saturating_sub(self.start).min(self.length);
        u128::from(self.prev) * u128::from(left)
    }

    /// The estimate before the last of `n` permits is below the limit:
    /// `prev × (W − e) + (cur + n − 1) × W < limit × W`.
    #[inline]
    fn fits(&self, n: u64, now: Nanos) -> bool {
        let w = u128::from(self.length);
        self.weighted_prev(now) + u128::from(self.cur + n - 1) * w < u128::from(self.limit) * w
    }

    /// The earliest instant at which `n` (1..=limit) more permits fit, given no other
    /// sends.
    fn next_fit(&self, n: u64) -> Nanos {
        let w = u128::from(self.length);
        // The first offset e into a window, with `prev` weighing and room for `a` ≥ 1
        // permits, at which prev × (W − e) < a × W, i.e. prev × (W − e) ≤ a × W − 1.
        let offset = |prev: u64, a: u64| -> u128 {
            if prev == 0 {
                return 0;
            }
            w - ((u128::from(a) * w - 1) / u128::from(prev)).min(w)
        };
        let at = if self.cur + n <= self.limit {
            u128::from(self.start) + offset(self.prev, self.limit - self.cur - n + 1)
        } else {
            // Next window: this one's count becomes `prev`.
            u128::from(self.start) + w + offset(self.cur, self.limit - n + 1)
        };
        u64::try_from(at).unwrap_or(u64::MAX)
    }

    /// How many permits fit now: the largest k with
    /// `prev × (W − e) + (cur + k − 1) × W < limit × W`.
    fn room(&self, now: Nanos) -> u64 {
        let w = u128::from(self.length);
        let budget = (u128::from(self.limit) * w).saturating_sub(self.weighted_prev(now));
        let k = budget.div_ceil(w).saturating_sub(u128::from(self.cur));
        u64::try_from(k).unwrap_or(u64::MAX)
    }
}

/// The Criteo sliding-window estimate. See the [module docs](self).
#[derive(Debug)]
pub struct SlidingWindow {
    state: Mutex<State>,
    burst: u32,
}

impl SlidingWindow {
    pub fn new(rate: Rate, burst: u32) -> Self {
        let w = window_for(rate, burst);
        Self {
            state: Mutex::new(State {
                start: 0,
                prev: 0,
                cur: 0,
                limit: w.limit,
                length: w.length,
                rate,
            }),
            burst,
        }
    }
}

impl RateLimiter for SlidingWindow {
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        let n = u64::from(n);
        let mut st = self.state.lock();
        st.roll(now);
        if n > st.limit {
            if st.prev == 0 && st.cur == 0 {
                st.cur = n;
                return Decision::Allow;
            }
            let windows = if st.cur > 0 { 2 } else { 1 };
            return Decision::WaitUntil(st.start.saturating_add(windows * st.length));
        }
        if n == 0 || st.fits(n, now) {
            st.cur += n;
            Decision::Allow
        } else {
            Decision::WaitUntil(st.next_fit(n))
        }
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        let mut st = self.state.lock();
        st.roll(now);
        let granted = st.room(now).min(u64::from(max));
        st.cur += granted;
        let granted = granted as u32;
        let next_at = (granted < max).then(|| st.next_fit(1));
        Grant { granted, next_at }
    }

    /// Starts a new window at `now` whose "previous window" is the current estimate,
    /// scaled to the new limit (rounded up) and capped at it: what was sent still weighs,
    /// fading out over the next window as it would have, and even a full estimate blocks
    /// the limiter for only one new interval (`W' / limit'`).
    fn set_rate(&self, rate: Rate, now: Nanos) {
        let w = window_for(rate, self.burst);
        let mut st = self.state.lock();
        st.roll(now);
        let old_w = u128::from(st.length);
        let left = old_w - u128::from(now.saturating_sub(st.start).min(st.length));
        let estimate_x_w = u128::from(st.prev) * left + u128::from(st.cur) * old_w;
        let scaled = estimate_x_w
            .saturating_mul(u128::from(w.limit))
            .div_ceil(old_w.saturating_mul(u128::from(st.limit)));
        st.prev = u64::try_from(scaled).unwrap_or(u64::MAX).min(w.limit);
        st.cur = 0;
        st.start = now;
        st.limit = w.limit;
        st.length = w.length;
        st.rate = rate;
    }

    fn rate(&self) -> Rate {
        self.state.lock().rate
    }

    fn name(&self) -> &'static str {
        "sliding-window"
    }
}
