//! [`LeasedLimiter`]: a campaign limiter that spends permits leased from Redis.
//!
//! The hot path never waits for Redis: it takes slots from at most two leases held in
//! this process (the one being spent and the next, fetched ahead), under the campaign's
//! own short mutex, without allocating. A lease is a run of slots spaced by the
//! campaign's interval; a slot not used within [`CATCH_UP`] of its time is void, so a
//! lease expires with its slice and unused permits are never hoarded or sent in a burst.
//!
//! A background task per campaign keeps the next lease ready: when the limiter is down
//! to one lease and was asked for permits recently, it asks Redis for about
//! rate × slice / workers permits. If Redis fails, the campaign switches to its local
//! fallback limiter (see [`super::fallback`]) until a lease call succeeds again.

use super::{Inner, LeaseAnswer};
use crate::limiter::{
    ceil_ns, lock, to_fp, Decision, Gcra, Grant, Nanos, Rate, RateLimiter, NANOS_PER_SEC,
};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

/// How late a slot may still be used. Later slots are void: a stalled scheduler never
/// turns missed slots into a burst beyond rate × 10 ms.
pub const CATCH_UP: Nanos = 10_000_000;

/// When no lease is ready: how soon to ask the limiter again.
const EMPTY_RETRY: Nanos = 1_000_000;

/// How often a campaign on its fallback probes Redis.
const PROBE_EVERY: Duration = Duration::from_millis(250);

/// A run of slots: the next unused one, the end, and the spacing (ns × 2^8).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Lease {
    cursor: u64,
    end: u64,
    interval: u64,
}

#[derive(Debug, Clone, Copy)]
struct State {
    rate: Rate,
    burst: u32,
    leases: [Lease; 2],
    len: usize,
    /// When Redis said the next lease can start (the hint for an empty limiter).
    hint: Nanos,
}

impl State {
    fn pop(&mut self) {
        self.leases[0] = self.leases[1];
        self.len = self.len.saturating_sub(1);
    }

    fn take(&mut self, max: u32, now: Nanos) -> Grant {
        let now_fp = to_fp(now);
        let oldest = to_fp(now.saturating_sub(CATCH_UP));
        let mut granted = 0u32;
        while self.len > 0 && granted < max {
            let l = &mut self.leases[0];
            let mut base = l.cursor;
            if base < oldest {
                // Void the slots that are too old, keeping the grid.
                base += (oldest - base).div_ceil(l.interval) * l.interval;
            }
            if base >= l.end {
                self.pop();
                continue;
            }
            if base > now_fp {
                l.cursor = base;
                return Grant {
                    granted,
                    next_at: Some(ceil_ns(base)),
                };
            }
            let ready = (now_fp - base) / l.interval + 1;
            let left = (l.end - base).div_ceil(l.interval);
            let g = ready.min(left).min(u64::from(max - granted));
            l.cursor = base + g * l.interval;
            // g ≤ max − granted, a u32.
            granted += g as u32;
            if l.cursor >= l.end {
                self.pop();
            }
        }
        Grant {
            granted,
            next_at: (granted < max).then(|| self.hint.max(now + EMPTY_RETRY)),
        }
    }
}

struct Shared {
    campaign: Arc<str>,
    key: String,
    state: Mutex<State>,
    fallback_on: AtomicBool,
    fallback: Gcra,
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
    pub(crate) fn start(inner: Arc<Inner>, campaign: &str, rate: Rate, burst: u32) -> Self {
        let now = inner.clock.now();
        let shared = Arc::new(Shared {
            campaign: Arc::from(campaign),
            key: inner.key(campaign),
            state: Mutex::new(State {
                rate,
                burst,
                leases: [Lease::default(); 2],
                len: 0,
                hint: 0,
            }),
            fallback_on: AtomicBool::new(false),
            fallback: Gcra::new(share(rate, inner.membership.workers()), burst),
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
        let s = lock(&self.shared.state);
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
        let mut s = lock(&self.shared.state);
        let mut trial = *s;
        let g = trial.take(n, now);
        let low = trial.len < 2;
        let decision = if g.granted == n {
            *s = trial;
            Decision::Allow
        } else {
            Decision::WaitUntil(g.next_at.unwrap_or(now + EMPTY_RETRY))
        };
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
        let mut s = lock(&self.shared.state);
        let g = s.take(max, now);
        let low = s.len < 2;
        drop(s);
        if low && max > 0 {
            self.shared.want_more();
        }
        g
    }

    fn set_rate(&self, rate: Rate, now: Nanos) {
        // Slots leased at the old spacing stay valid: at most a slice or two of them.
        lock(&self.shared.state).rate = rate;
        let workers = self.inner.membership.workers();
        self.shared.fallback.set_rate(share(rate, workers), now);
        self.shared.notify.notify_one();
    }

    fn rate(&self) -> Rate {
        lock(&self.shared.state).rate
    }

    fn name(&self) -> &'static str {
        "redis-leased"
    }
}

/// `rate / workers`, at least a valid rate.
pub(crate) fn share(rate: Rate, workers: u32) -> Rate {
    Rate::per_second(rate.as_f64() / f64::from(workers.max(1))).unwrap_or(rate)
}

/// Keeps the next lease ready; switches the campaign to and from its fallback.
async fn refill(shared: Arc<Shared>, inner: Arc<Inner>) {
    let gauge = metrics::gauge!("redis_lease_permits", "campaign" => shared.campaign.to_string());
    let slice = inner.config.lease;
    let slice_ns = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    loop {
        let now = inner.clock.now();
        let (len, rate, burst) = {
            let s = lock(&shared.state);
            (s.len, s.rate, s.burst)
        };
        let fallback = shared.fallback_on.load(Relaxed);
        let idle = now.saturating_sub(shared.last_demand.load(Relaxed)) > 2 * slice_ns;
        if !fallback && (len >= 2 || idle) {
            shared.wanted.store(false, Relaxed);
            tokio::select! {
                _ = shared.notify.notified() => {}
                _ = tokio::time::sleep(slice) => {}
            }
            continue;
        }
        let workers = inner.membership.workers();
        let n = (rate.as_f64() * slice.as_secs_f64() / f64::from(workers))
            .ceil()
            .clamp(1.0, f64::from(u32::MAX)) as u32;
        match inner.lease(&shared.key, rate, burst, n).await {
            Ok(answer) => {
                if shared.fallback_on.swap(false, Relaxed) {
                    tracing::debug!(campaign = %shared.campaign, "back on redis leases");
                }
                inner.recovered();
                match answer {
                    LeaseAnswer::Granted {
                        permits,
                        offset_micros,
                    } => {
                        gauge.set(f64::from(permits));
                        // The answer's "now" is at most one round trip before ours: the
                        // slots land that much late, never early.
                        let at = inner.clock.now();
                        let start = at.saturating_add_signed(offset_micros.saturating_mul(1000));
                        let interval = rate.interval_fp();
                        let mut s = lock(&shared.state);
                        if s.len == 2 {
                            s.pop();
                        }
                        // Never overlapping the lease in hand: a sliding-window lease
                        // starts "now", and clock conversion may shift a GCRA one.
                        let mut cursor = to_fp(start);
                        if s.len == 1 {
                            cursor = cursor.max(s.leases[0].end);
                        }
                        let lease = Lease {
                            cursor,
                            end: cursor.saturating_add(interval.saturating_mul(u64::from(permits))),
                            interval,
                        };
                        let i = s.len;
                        s.leases[i] = lease;
                        s.len += 1;
                    }
                    LeaseAnswer::Wait(d) => {
                        let d = d.min(slice);
                        lock(&shared.state).hint =
                            now + u64::try_from(d.as_nanos()).unwrap_or(NANOS_PER_SEC);
                        tokio::time::sleep(d).await;
                    }
                }
            }
            Err(e) => {
                let fallback_rate = share(rate, workers);
                if shared.fallback.rate() != fallback_rate {
                    shared.fallback.set_rate(fallback_rate, inner.clock.now());
                }
                if !shared.fallback_on.load(Relaxed) {
                    let mut s = lock(&shared.state);
                    s.len = 0;
                    drop(s);
                    shared.fallback_on.store(true, Relaxed);
                }
                inner.outage(&e);
                tokio::time::sleep(PROBE_EVERY).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn state(leases: &[(Nanos, u64)], interval: Nanos) -> State {
        let mut s = State {
            rate: Rate::per_second(1000.0).unwrap(),
            burst: 0,
            leases: [Lease::default(); 2],
            len: 0,
            hint: 0,
        };
        for &(start, permits) in leases {
            let cursor = to_fp(start);
            s.leases[s.len] = Lease {
                cursor,
                end: cursor + permits * to_fp(interval),
                interval: to_fp(interval),
            };
            s.len += 1;
        }
        s
    }

    #[test]
    fn slots_are_spent_at_their_time_and_not_before() {
        let mut s = state(&[(100 * MS, 10)], MS);
        let g = s.take(5, 99 * MS);
        assert_eq!(g.granted, 0);
        assert_eq!(g.next_at, Some(100 * MS));
        // At 102 ms the slots of 100, 101 and 102 ms are due.
        assert_eq!(s.take(5, 102 * MS).granted, 3);
        assert_eq!(s.take(5, 102 * MS).next_at, Some(103 * MS));
    }

    #[test]
    fn slots_older_than_the_catch_up_are_void() {
        let mut s = state(&[(100 * MS, 100)], MS);
        // 50 ms late: only the last 10 ms of slots (catch-up) are still usable.
        let g = s.take(1000, 150 * MS);
        assert_eq!(g.granted, 11);
    }

    #[test]
    fn the_next_lease_follows_when_the_first_is_spent() {
        let mut s = state(&[(100 * MS, 2), (110 * MS, 3)], MS);
        assert_eq!(s.take(10, 101 * MS).granted, 2);
        assert_eq!(s.len, 1);
        let g = s.take(10, 112 * MS);
        assert_eq!(g.granted, 3);
        assert_eq!(s.len, 0);
        // Empty: try again shortly (or when Redis said).
        assert_eq!(g.next_at, Some(112 * MS + EMPTY_RETRY));
    }

    #[test]
    fn an_expired_lease_is_dropped_whole() {
        let mut s = state(&[(100 * MS, 5)], MS);
        let g = s.take(10, 200 * MS);
        assert_eq!(g.granted, 0);
        assert_eq!(s.len, 0);
    }
}
