//! `fixed-window`: a counter per calendar window.
//!
//! Time is cut into windows `[k·W, (k+1)·W)` counted from the clock's origin, with
//! `W` and the per-window `limit` from [`window_for`]: 1 s and `rate` permits for whole
//! rates without burst; for a fractional rate the window stretches until it holds a whole
//! permit (0.5/s: 1 permit per 2 s), and a burst adds permits and stretches the window so
//! that the long-run rate stays `limit / W = rate`.
//!
//! Trade-offs: the cheapest state there is (a start and a count), but the whole window's
//! quota goes at its very start under saturating demand, and two quotas can meet at a
//! window edge: the documented bound is that a window `[t, t + w)` holds at most
//! `(ceil(w / W) + 1) × limit` permits, i.e. up to 2× the rate over 1 s. After a stall the
//! next window is fresh, so it catches up at once. `WaitUntil` is exact (the next window
//! start). A `Mutex` per limiter (per campaign, never global).
//!
//! A batch larger than `limit` passes into an empty window, and its excess is carried as
//! debt into the following windows, so the long-run rate holds.

use parking_lot::Mutex;

use super::{window_for, Decision, Grant, Nanos, Rate, RateLimiter};

#[derive(Debug)]
struct State {
    start: Nanos,
    count: u64,
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
            self.start += windows * self.length;
            self.count = self
                .count
                .saturating_sub(windows.saturating_mul(self.limit));
        }
    }

    /// The start of the first window in which `n` more permits fit.
    fn next_fit(&self, n: u64) -> Nanos {
        let excess = if n <= self.limit {
            (self.count + n).saturating_sub(self.limit)
        } else {
            self.count
        };
        let windows = excess.div_ceil(self.limit).max(1);
        self.start
            .saturating_add(windows.saturating_mul(self.length))
    }
}

/// The fixed-window counter. See the [module docs](self).
#[derive(Debug)]
pub struct FixedWindow {
    state: Mutex<State>,
    burst: u32,
}

impl FixedWindow {
    pub fn new(rate: Rate, burst: u32) -> Self {
        let w = window_for(rate, burst);
        Self {
            state: Mutex::new(State {
                start: 0,
                count: 0,
                limit: w.limit,
                length: w.length,
                rate,
            }),
            burst,
        }
    }
}

impl RateLimiter for FixedWindow {
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        let n = u64::from(n);
        let mut st = self.state.lock();
        st.roll(now);
        let fits = if n <= st.limit {
            st.count + n <= st.limit
        } else {
            st.count == 0
        };
        if fits {
            st.count += n;
            Decision::Allow
        } else {
            Decision::WaitUntil(st.next_fit(n))
        }
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        let mut st = self.state.lock();
        st.roll(now);
        let granted = st.limit.saturating_sub(st.count).min(u64::from(max)) as u32;
        st.count += u64::from(granted);
        let next_at = (granted < max).then(|| st.next_fit(1));
        Grant { granted, next_at }
    }

    /// Switches to the new window grid at `now`; the permits already counted in the
    /// current window are scaled to the new limit (rounded up) and capped at it, so the
    /// limiter is never blocked for longer than one new window.
    fn set_rate(&self, rate: Rate, now: Nanos) {
        let w = window_for(rate, self.burst);
        let mut st = self.state.lock();
        st.roll(now);
        let scaled = (u128::from(st.count) * u128::from(w.limit)).div_ceil(u128::from(st.limit));
        st.count = u64::try_from(scaled).unwrap_or(u64::MAX).min(w.limit);
        st.start = now - now % w.length;
        st.limit = w.limit;
        st.length = w.length;
        st.rate = rate;
    }

    fn rate(&self) -> Rate {
        self.state.lock().rate
    }

    fn name(&self) -> &'static str {
        "fixed-window"
    }
}
