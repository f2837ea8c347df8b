//! The leases a campaign holds (at most two: the one being spent and the next) and the
//! pure arithmetic on them: taking slots at their times, shaping them through the
//! campaign's own limiter, voiding late slots, and placing a new grant.

use super::{CATCH_UP, EMPTY_RETRY};
use crate::limiter::{ceil_ns, to_fp, Decision, Grant, Nanos, Rate, RateLimiter};

/// A run of slots: the first, the next unused one, the end, and the spacing (ns × 2^8);
/// when shaped locally, usable until `until` (the last slot, or the grant if that is
/// later, plus [`CATCH_UP`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Lease {
    pub(super) start: u64,
    pub(super) cursor: u64,
    pub(super) end: u64,
    pub(super) interval: u64,
    pub(super) until: u64,
}

impl Lease {
    /// Permits not yet taken.
    pub(super) fn left(&self) -> u64 {
        self.end.saturating_sub(self.cursor).div_ceil(self.interval)
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) struct State {
    pub(super) rate: Rate,
    pub(super) burst: u32,
    pub(super) leases: [Lease; 2],
    pub(super) len: usize,
    /// When Redis said the next lease can start (the hint for an empty limiter).
    pub(super) hint: Nanos,
}

impl State {
    fn pop(&mut self) {
        self.leases[0] = self.leases[1];
        self.len = self.len.saturating_sub(1);
    }

    pub(super) fn take(&mut self, max: u32, now: Nanos) -> Grant {
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
    pub(super) fn expire(&mut self, now: Nanos) {
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
    pub(super) fn open(&self, now: Nanos) -> (u64, Nanos) {
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
    pub(super) fn spend(&mut self, mut n: u64) {
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
    pub(super) fn take_shaped(&mut self, max: u32, now: Nanos, own: &dyn RateLimiter) -> Grant {
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
    pub(super) fn try_shaped(&mut self, n: u32, now: Nanos, own: &dyn RateLimiter) -> Decision {
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

    /// Adds the lease Redis granted: `permits` slots spaced by `interval` (ns × 2^8) from
    /// `start`, received at `at`. Kept free of I/O so the arithmetic is unit-tested.
    pub(super) fn push_grant(&mut self, permits: u32, start: Nanos, at: Nanos, interval: u64) {
        if self.len == 2 {
            self.pop();
        }
        // Never overlapping the lease in hand: a sliding-window lease
        // starts "now", and clock conversion may shift a GCRA one.
        let mut cursor = to_fp(start);
        if self.len == 1 {
            cursor = cursor.max(self.leases[0].end);
        }
        let end = cursor.saturating_add(interval.saturating_mul(u64::from(permits)));
        // Slots Redis lets start in the past (its burst tolerance) stay
        // usable for a moment after the grant.
        let last = ceil_ns(end - interval).max(at);
        let i = self.len;
        self.leases[i] = Lease {
            start: cursor,
            cursor,
            end,
            interval,
            until: to_fp(last.saturating_add(CATCH_UP)),
        };
        self.len += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;

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
    fn an_expired_lease_is_dropped_whole() {
        let mut s = state(&[(100 * MS, 5)], MS);
        let g = s.take(10, 200 * MS);
        assert_eq!(g.granted, 0);
        assert_eq!(s.len, 0);
    }

    #[test]
    fn a_grant_becomes_a_lease_after_the_one_in_hand() {
        let interval = to_fp(MS);
        let mut s = state(&[], MS);
        s.push_grant(10, 100 * MS, 100 * MS, interval);
        assert_eq!(s.len, 1);
        let l = s.leases[0];
        assert_eq!(
            (l.start, l.cursor, l.end),
            (to_fp(100 * MS), to_fp(100 * MS), to_fp(110 * MS))
        );
        // Usable until CATCH_UP after the last slot (109 ms).
        assert_eq!(l.until, to_fp(109 * MS + CATCH_UP));
        // A grant that starts inside the lease in hand starts where that one ends.
        s.push_grant(5, 105 * MS, 100 * MS, interval);
        assert_eq!((s.len, s.leases[1].start), (2, to_fp(110 * MS)));
        assert_eq!(s.leases[1].end, to_fp(115 * MS));
        // A third grant replaces the oldest of the two.
        s.push_grant(1, 0, 100 * MS, interval);
        assert_eq!(
            (s.len, s.leases[0].start, s.leases[1].start),
            (2, to_fp(110 * MS), to_fp(115 * MS))
        );
    }

    #[test]
    fn slots_granted_in_the_past_stay_usable_briefly_after_the_grant() {
        let mut s = state(&[], MS);
        // Redis's burst tolerance: ten slots from 50 ms, granted at 100 ms.
        s.push_grant(10, 50 * MS, 100 * MS, to_fp(MS));
        assert_eq!(s.leases[0].until, to_fp(100 * MS + CATCH_UP));
    }
}
