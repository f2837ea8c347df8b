//! [`LeasedLimiter`]: a campaign limiter that spends permits leased from Redis.
//!
//! The hot path never waits for Redis: it takes permits from at most two leases held in
//! this process (the one being spent and the next, fetched ahead), under the campaign's
//! own short mutex, without allocating. A lease is a run of slots of the campaign's
//! schedule, spaced by its interval: so the lease's rate is the campaign's rate, and its
//! slots are this worker's part of the global total that Redis keeps.
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

use super::{Inner, LeaseAnswer};
use crate::limiter::{
    ceil_ns, lock, to_fp, Algorithm, Decision, DynLimiter, Grant, Nanos, Rate, RateLimiter,
    NANOS_PER_SEC,
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

/// A run of slots: the first, the next unused one, the end, and the spacing (ns × 2^8);
/// when shaped locally, usable until `until` (the last slot, or the grant if that is
/// later, plus [`CATCH_UP`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Lease {
    start: u64,
    cursor: u64,
    end: u64,
    interval: u64,
    until: u64,
}

impl Lease {
    /// Permits not yet taken.
    fn left(&self) -> u64 {
        self.end.saturating_sub(self.cursor).div_ceil(self.interval)
    }
}

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

    /// Drops the leases whose last slot is more than [`CATCH_UP`] old.
    fn expire(&mut self, now: Nanos) {
        let now_fp = to_fp(now);
        while self.len > 0 {
            let l = &self.leases[0];
            if l.left() > 0 && l.until >= now_fp {
                return;
            }
            self.pop();
        }
    }

    /// Permits of the leases open at `now` (first slot reached), and when more open.
    fn open(&self, now: Nanos) -> (u64, Nanos) {
        let now_fp = to_fp(now);
        let mut open = 0;
        for l in &self.leases[..self.len] {
            if l.start > now_fp {
                return (open, ceil_ns(l.start));
            }
            open += l.left();
        }
        (open, self.hint.max(now + EMPTY_RETRY))
    }

    /// Takes `n` permits from the open leases, oldest first (the caller checked that
    /// they hold that many).
    fn spend(&mut self, mut n: u64) {
        while n > 0 && self.len > 0 {
            let l = &mut self.leases[0];
            let g = n.min(l.left());
            l.cursor += g * l.interval;
            n -= g;
            if l.left() == 0 {
                self.pop();
            }
        }
    }

    /// Up to `max` permits that both the open leases and the campaign's own limiter
    /// allow at `now`.
    fn take_shaped(&mut self, max: u32, now: Nanos, own: &dyn RateLimiter) -> Grant {
        self.expire(now);
        let (open, more_at) = self.open(now);
        // offer ≤ max, a u32.
        let offer = open.min(u64::from(max)) as u32;
        if offer == 0 {
            return Grant {
                granted: 0,
                next_at: (max > 0).then_some(more_at),
            };
        }
        let g = own.acquire_up_to(offer, now);
        self.spend(u64::from(g.granted));
        let next_at = if g.granted == max {
            None
        } else if g.granted < offer {
            g.next_at.or(Some(more_at))
        } else {
            Some(more_at)
        };
        Grant {
            granted: g.granted,
            next_at,
        }
    }

    /// `n` permits at once from the open leases and the own limiter, or none.
    fn try_shaped(&mut self, n: u32, now: Nanos, own: &dyn RateLimiter) -> Decision {
        self.expire(now);
        let (open, more_at) = self.open(now);
        if open < u64::from(n) {
            return Decision::WaitUntil(more_at);
        }
        let d = own.try_acquire_n(n, now);
        if d.is_allowed() {
            self.spend(u64::from(n));
        }
        d
    }
}

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
        let mut s = *lock(&self.shared.state);
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
        lock(&self.shared.state).len > 0
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
        let mut s = lock(&self.shared.state);
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
        let mut s = lock(&self.shared.state);
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
        lock(&self.shared.state).rate
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
        let mut n = (rate.as_f64() * slice.as_secs_f64() / f64::from(workers))
            .ceil()
            .clamp(1.0, f64::from(u32::MAX)) as u32;
        if len == 0 && shared.own.is_some() {
            // Starting or after a gap: room for the burst the campaign's own algorithm
            // may send at once (Redis grants it only if its tolerance has it).
            n = n.saturating_add(burst);
        }
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
                        let end =
                            cursor.saturating_add(interval.saturating_mul(u64::from(permits)));
                        // Slots Redis lets start in the past (its burst tolerance) stay
                        // usable for a moment after the grant.
                        let last = ceil_ns(end - interval).max(at);
                        let lease = Lease {
                            start: cursor,
                            cursor,
                            end,
                            interval,
                            until: to_fp(last.saturating_add(CATCH_UP)),
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

    #[test]
    fn a_share_below_the_smallest_rate_is_the_smallest_rate() {
        let r = |x: f64| Rate::per_second(x).unwrap();
        assert_eq!(share(r(100.0), 4), r(25.0));
        assert_eq!(share(r(0.002), 4), r(0.001));
        assert_eq!(share(r(0.001), 1), r(0.001));
    }

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
            let end = cursor + permits * to_fp(interval);
            s.leases[s.len] = Lease {
                start: cursor,
                cursor,
                end,
                interval: to_fp(interval),
                until: end - to_fp(interval) + to_fp(CATCH_UP),
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
    fn the_own_algorithm_shapes_the_leased_permits() {
        let rate = Rate::per_second(1000.0).unwrap();
        // Token bucket, burst 4: five at once when the lease opens, then one per 1 ms.
        let bucket = crate::limiter::build(Algorithm::TokenBucket, rate, 4);
        let mut s = state(&[(100 * MS, 10)], MS);
        let g = s.take_shaped(100, 99 * MS, bucket.as_ref());
        assert_eq!(
            (g.granted, g.next_at),
            (0, Some(100 * MS)),
            "not before the lease"
        );
        assert_eq!(s.take_shaped(100, 100 * MS, bucket.as_ref()).granted, 5);
        assert_eq!(s.take_shaped(100, 101 * MS, bucket.as_ref()).granted, 1);
        // GCRA without burst: the lease's own spacing.
        let gcra = crate::limiter::build(Algorithm::Gcra, rate, 0);
        let mut s = state(&[(100 * MS, 10)], MS);
        let g = s.take_shaped(100, 100 * MS, gcra.as_ref());
        assert_eq!(g.granted, 1);
        assert_eq!(
            g.next_at,
            Some(101 * MS),
            "the own limiter names the next instant"
        );
    }

    #[test]
    fn the_leases_bound_what_the_own_algorithm_may_send() {
        let rate = Rate::per_second(1000.0).unwrap();
        let bucket = crate::limiter::build(Algorithm::TokenBucket, rate, 100);
        let mut s = state(&[(100 * MS, 5), (120 * MS, 5)], MS);
        let g = s.take_shaped(100, 110 * MS, bucket.as_ref());
        // Only the open lease: the second opens at 120 ms.
        assert_eq!((g.granted, g.next_at), (5, Some(120 * MS)));
        assert_eq!(s.take_shaped(100, 120 * MS, bucket.as_ref()).granted, 5);
        assert_eq!(s.len, 0);
        // All or none: 3 permits need an open lease holding 3.
        let mut s = state(&[(100 * MS, 2)], MS);
        assert!(!s.try_shaped(3, 100 * MS, bucket.as_ref()).is_allowed());
        assert!(s.try_shaped(2, 100 * MS, bucket.as_ref()).is_allowed());
    }

    #[test]
    fn a_shaped_lease_expires_after_its_last_slot() {
        let rate = Rate::per_second(1000.0).unwrap();
        let bucket = crate::limiter::build(Algorithm::TokenBucket, rate, 100);
        let mut s = state(&[(100 * MS, 10)], MS);
        // The last slot is at 109 ms: usable until 119 ms, void after.
        assert_eq!(s.take_shaped(3, 119 * MS, bucket.as_ref()).granted, 3);
        assert_eq!(s.take_shaped(100, 120 * MS, bucket.as_ref()).granted, 0);
        assert_eq!(s.len, 0);
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

    #[test]
    fn an_expired_lease_is_dropped_whole() {
        let mut s = state(&[(100 * MS, 5)], MS);
        let g = s.take(10, 200 * MS);
        assert_eq!(g.granted, 0);
        assert_eq!(s.len, 0);
    }
}
