//! [`RedisClock`]: places a GCRA lease's slots on the scheduler's clock at their own
//! time, whatever the round trip that brought the lease.
//!
//! Redis keeps each campaign's schedule in its own clock (`TIME`). Each answer carries
//! Redis's "now", read before our clock is read on receipt, so `redis_now − received` is
//! a lower bound of the offset between the two clocks. The estimate is the largest
//! recent lower bound: slots are never placed early, and late by at most the quickest
//! recent round trip rather than this answer's. Placing each lease by its own receipt
//! shifted the whole lease late by however long the worker took to read the answer,
//! into the next worker's slots (docs/BENCHMARKS.md, "lease slots on Redis's clock").
//!
//! Recent: the best of the current and the previous [`WINDOW`], each sample aged by
//! [`SLEW_DIVISOR`], so a step or a slew of either clock cannot place slots early for long.

use crate::limiter::Nanos;
use parking_lot::Mutex;

/// How long a sample counts (two windows at most): long enough to hold a quick round
/// trip among a campaign's leases (several per second), short enough to follow a step
/// of Redis's clock within seconds.
const WINDOW: Nanos = 2_000_000_000;

/// NTP slews a clock by at most 500 ppm (1 / 2,000): a sample's bound loses that much
/// with age, so a slowing Redis clock never leaves the estimate above the truth.
const SLEW_DIVISOR: Nanos = 2_000;

#[derive(Default)]
struct Best {
    /// The best score in the current and the previous window; `None` before a sample.
    current: Option<i64>,
    previous: Option<i64>,
    window_start: Nanos,
}

/// The offset between Redis's clock and the scheduler's, from lease answers.
#[derive(Default)]
pub struct RedisClock {
    best: Mutex<Best>,
}

impl RedisClock {
    pub fn new() -> RedisClock {
        RedisClock::default()
    }

    /// Records an answer stamped `redis_now_micros` by Redis and received at `received`
    /// (scheduler clock), and returns where `redis_at_micros` falls on the scheduler's
    /// clock: never before it, never later than `received + (redis_at − redis_now)`.
    pub fn place(&self, redis_now_micros: i64, redis_at_micros: i64, received: Nanos) -> Nanos {
        let received_i = i64::try_from(received).unwrap_or(i64::MAX);
        let sample = redis_now_micros
            .saturating_mul(1000)
            .saturating_sub(received_i);
        let offset = self.observe(sample, received);
        let local = redis_at_micros.saturating_mul(1000).saturating_sub(offset);
        u64::try_from(local).unwrap_or(0)
    }

    /// The estimate at `now` after the sample: the largest aged lower bound.
    fn observe(&self, sample: i64, now: Nanos) -> i64 {
        // A sample's score is its bound plus the slew it may lose by `now`'s origin:
        // comparing scores compares bounds aged to any common time.
        let score = sample.saturating_add(slew(now));
        let mut b = self.best.lock();
        if now.saturating_sub(b.window_start) >= WINDOW {
            let skipped = now.saturating_sub(b.window_start) >= 2 * WINDOW;
            b.previous = if skipped { None } else { b.current };
            b.current = None;
            b.window_start = now;
        }
        let current = b.current.map_or(score, |c| c.max(score));
        b.current = Some(current);
        let best = b.previous.map_or(current, |p| p.max(current));
        best.saturating_sub(slew(now))
    }
}

/// The slew allowance accumulated from the clock's origin to `t`.
fn slew(t: Nanos) -> i64 {
    i64::try_from(t / SLEW_DIVISOR).unwrap_or(i64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;
    /// Redis's clock minus ours in this test, in ns.
    const TRUE_OFFSET: i64 = 1_700_000_000_000_000_000;

    /// An answer that Redis stamped at our `sent` and that we read `rtt` later.
    fn answer(c: &RedisClock, sent: Nanos, rtt: Nanos, slot_in: i64) -> Nanos {
        let redis_now = (TRUE_OFFSET + sent as i64) / 1000;
        c.place(redis_now, redis_now + slot_in, sent + rtt)
    }

    #[test]
    fn a_slow_answer_is_placed_by_the_quickest_recent_one() {
        let c = RedisClock::new();
        // Quick: 100 µs; the slot 50 ms after Redis's now lands 100 µs late at most.
        let quick = answer(&c, 10 * MS, MS / 10, 50_000);
        assert!((60 * MS..=60 * MS + MS / 10).contains(&quick), "{quick}");
        // 30 ms to read this answer: placed as by the quick one (aged 90 ms: 45 µs
        // more), not 30 ms late.
        let slow = answer(&c, 100 * MS, 30 * MS, 50_000);
        assert!((150 * MS..=150 * MS + MS / 5).contains(&slow), "{slow}");
    }

    #[test]
    fn a_slot_is_never_placed_before_its_time() {
        let c = RedisClock::new();
        for (i, rtt) in [5 * MS, MS / 2, 20 * MS, MS / 10, 3 * MS]
            .iter()
            .enumerate()
        {
            let sent = (i as u64 + 1) * 300 * MS;
            let at = answer(&c, sent, *rtt, 10_000);
            assert!(
                at >= sent + 10 * MS,
                "answer {i}: {at} before {}",
                sent + 10 * MS
            );
            assert!(
                at <= sent + 10 * MS + rtt,
                "answer {i}: {at} later than its own"
            );
        }
    }

    #[test]
    fn an_old_quick_sample_is_forgotten_after_two_windows() {
        let c = RedisClock::new();
        answer(&c, 0, MS / 10, 0);
        // Redis's clock steps back 5 ms: the truth moves, the old sample must go.
        let stepped = |sent: Nanos, rtt: Nanos| {
            let redis_now = (TRUE_OFFSET - 5 * MS as i64 + sent as i64) / 1000;
            c.place(redis_now, redis_now, sent + rtt)
        };
        let soon = stepped(WINDOW / 2, 10 * MS);
        assert!(soon < WINDOW / 2, "still on the old sample: {soon}");
        stepped(WINDOW + MS, 10 * MS);
        let later = stepped(2 * WINDOW + 2 * MS, 10 * MS);
        assert!(later >= 2 * WINDOW + 2 * MS, "{later}");
    }
}
