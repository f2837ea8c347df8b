//! `sliding-log`: the timestamps of recent sends, for an exact sliding window.
//!
//! The log holds `(instant, count)` entries for the sends of the last window `W` (same
//! `W` and `limit` as [`window_for`]); a permit passes when the sends with an instant in
//! `(now − W, now]` plus the request stay within `limit`. Sends at the same instant share
//! one entry, so the log holds at most `limit` entries (bounded memory), usually far
//! fewer.
//!
//! Trade-offs: exact: no window of length `W` ever holds more than `limit`. But it is
//! not smooth: under saturating demand the whole quota goes at once and then again one
//! window later, so a window `[t, t + w)` with `W < w < 2W` can hold `2 × limit`; the
//! documented bound is `ceil(w / W) × limit`. Memory grows with the rate (one entry per
//! distinct send instant, up to `limit`) and a refusal may scan the log, so it is the
//! slowest algorithm here. After a stall the old entries have expired and it catches up
//! at once. `WaitUntil` is exact (the instant the blocking entry leaves the window).
//!
//! A batch larger than `limit` passes into an empty log; a log cannot hold debt, so such
//! a batch exceeds the window bound by `n − limit`.

use parking_lot::Mutex;
use std::collections::VecDeque;

use super::{window_for, Decision, Grant, Nanos, Rate, RateLimiter};

#[derive(Debug)]
struct State {
    log: VecDeque<(Nanos, u64)>,
    /// Sum of the counts in `log`.
    total: u64,
    limit: u64,
    length: Nanos,
    rate: Rate,
}

impl State {
    #[inline]
    fn expire(&mut self, now: Nanos) {
        while let Some(&(at, count)) = self.log.front() {
            if at.saturating_add(self.length) > now {
                break;
            }
            self.total -= count;
            self.log.pop_front();
        }
    }

    #[inline]
    fn record(&mut self, now: Nanos, n: u64) {
        self.total += n;
        match self.log.back_mut() {
            // A caller whose clock reads a little behind joins the newest entry, which
            // expires later: conservative.
            Some((at, count)) if *at >= now => *count += n,
            _ => self.log.push_back((now, n)),
        }
    }

    /// The instant at which enough entries have expired for `n` more permits.
    fn next_fit(&self, n: u64) -> Nanos {
        let excess = if n <= self.limit {
            (self.total + n).saturating_sub(self.limit)
        } else {
            self.total
        };
        let mut freed = 0;
        for &(at, count) in &self.log {
            freed += count;
            if freed >= excess {
                return at.saturating_add(self.length);
            }
        }
        // Unreachable while total is the sum of the log; the last entry is a safe answer.
        self.log
            .back()
            .map_or(0, |&(at, _)| at.saturating_add(self.length))
    }
}

/// The sliding log. See the [module docs](self).
#[derive(Debug)]
pub struct SlidingLog {
    state: Mutex<State>,
    burst: u32,
}

impl SlidingLog {
    pub fn new(rate: Rate, burst: u32) -> Self {
        let w = window_for(rate, burst);
        Self {
            state: Mutex::new(State {
                log: VecDeque::new(),
                total: 0,
                limit: w.limit,
                length: w.length,
                rate,
            }),
            burst,
        }
    }
}

impl RateLimiter for SlidingLog {
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        let n = u64::from(n);
        let mut st = self.state.lock();
        st.expire(now);
        let fits = if n <= st.limit {
            st.total + n <= st.limit
        } else {
            st.total == 0
        };
        if fits {
            if n > 0 {
                st.record(now, n);
            }
            Decision::Allow
        } else {
            Decision::WaitUntil(st.next_fit(n))
        }
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        let mut st = self.state.lock();
        st.expire(now);
        let granted = st.limit.saturating_sub(st.total).min(u64::from(max));
        if granted > 0 {
            st.record(now, granted);
        }
        let granted = granted as u32;
        let next_at = (granted < max).then(|| st.next_fit(1));
        Grant { granted, next_at }
    }

    /// Keeps the log and judges it by the new window from `now` on. If the new window is
    /// shorter, each logged send is moved later by the difference, but not past `now`: it
    /// still counts for as long as the old window said, or until one new window from
    /// `now`, whichever comes first. So a sliding window across the change cannot hold the
    /// old quota and the new one at once, and the limiter is blocked for at most one new
    /// window.
    fn set_rate(&self, rate: Rate, now: Nanos) {
        let w = window_for(rate, self.burst);
        let mut st = self.state.lock();
        let shorter_by = st.length.saturating_sub(w.length);
        if shorter_by > 0 {
            for (at, _) in st.log.iter_mut() {
                *at = at.saturating_add(shorter_by).min(now.max(*at));
            }
        }
        st.limit = w.limit;
        st.length = w.length;
        st.rate = rate;
        st.expire(now);
    }

    fn rate(&self) -> Rate {
        self.state.lock().rate
    }

    fn name(&self) -> &'static str {
        "sliding-log"
    }
}
