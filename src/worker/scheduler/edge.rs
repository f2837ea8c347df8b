//! The edge of the wall-clock second: a permit due in its last `second_edge` leaves at
//! the start of the next second.
//!
//! Sends are counted in the second of the round that releases them, and a round comes
//! up to `wake_slack` plus the timer's lateness after the permit. A permit due just
//! before a second ends therefore leaves before it in some seconds and after it in
//! others, and a campaign at 100/s counts 99 or 101 where its limiter gave 100: one
//! send, 1% of that second. Holding those permits to the next second's start makes the
//! crossing the same every second, so each second counts the permits of one fixed
//! 1-s window. A permit waits at most `second_edge` plus the timer's lateness, within
//! `quantum_min`, which the next turn makes up ([`super::acquire_catching_up`]), so no
//! send is lost from the rate.

use crate::limiter::{Nanos, NANOS_PER_SEC};

/// Where the wall clock's seconds end on the scheduler's clock, and how much of each
/// second's end is held back.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct SecondEdge {
    /// The instant the current wall-clock second ends; `None` until the driver says.
    end: Option<Nanos>,
    /// The held part of each second's end; 0 holds nothing.
    hold: Nanos,
}

impl SecondEdge {
    pub(super) fn new(hold: Nanos) -> Self {
        Self { end: None, hold }
    }

    /// The driver read the wall clock at `now`: `unix_nanos` since the epoch.
    pub(super) fn set(&mut self, now: Nanos, unix_nanos: u128) {
        let into = (unix_nanos % u128::from(NANOS_PER_SEC)) as Nanos;
        self.end = Some(now + (NANOS_PER_SEC - into));
    }

    /// How far from its second's end `t` lies: (0, 1 s]; `None` without a clock.
    fn until_end(&self, t: Nanos) -> Option<Nanos> {
        let end = self.end?;
        // A turn's instants lie within a second of the clock's reading: no division.
        let d = if end >= t {
            match end - t {
                d if d < NANOS_PER_SEC => d,
                d => d % NANOS_PER_SEC,
            }
        } else {
            match t - end {
                d if d < NANOS_PER_SEC => NANOS_PER_SEC - d,
                d => NANOS_PER_SEC - d % NANOS_PER_SEC,
            }
        };
        Some(if d == 0 { NANOS_PER_SEC } else { d })
    }

    /// The latest permit instant a turn at `now` may take: `now`, or the start of the
    /// held part when `now` falls in it.
    pub(super) fn horizon(&self, now: Nanos) -> Nanos {
        match self.until_end(now) {
            Some(d) if d <= self.hold => now.saturating_sub(self.hold - d),
            _ => now,
        }
    }

    /// When a permit due at `t` may leave: `t`, or its second's end when `t` falls in
    /// the held part.
    pub(super) fn release_at(&self, t: Nanos) -> Nanos {
        match self.until_end(t) {
            Some(d) if d <= self.hold => t + d,
            _ => t,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    /// The wall clock 0.3 s into a second at scheduler instant 10 s: seconds end at
    /// 10.7 s, 11.7 s and so on.
    fn edge(hold_ms: Nanos) -> SecondEdge {
        let mut e = SecondEdge::new(hold_ms * MS);
        e.set(10_000 * MS, 1_700_000_000_300_000_000);
        e
    }

    #[test]
    fn permits_in_the_held_part_leave_at_the_seconds_end() {
        let e = edge(5);
        assert_eq!(e.release_at(10_695 * MS), 10_700 * MS);
        assert_eq!(e.release_at(10_696 * MS), 10_700 * MS);
        assert_eq!(e.release_at(10_694 * MS), 10_694 * MS);
        assert_eq!(e.release_at(10_700 * MS), 10_700 * MS, "a second's start");
        assert_eq!(e.release_at(10_701 * MS), 10_701 * MS);
        // Seconds later and earlier than the one the clock was read in.
        assert_eq!(e.release_at(12_699 * MS), 12_700 * MS);
        assert_eq!(e.release_at(12_690 * MS), 12_690 * MS);
        assert_eq!(e.release_at(9_698 * MS), 9_700 * MS);
    }

    #[test]
    fn a_turn_in_the_held_part_takes_permits_only_up_to_its_start() {
        let e = edge(5);
        assert_eq!(e.horizon(10_697 * MS), 10_695 * MS);
        assert_eq!(e.horizon(10_695 * MS), 10_695 * MS);
        assert_eq!(e.horizon(10_690 * MS), 10_690 * MS);
        assert_eq!(e.horizon(10_700 * MS), 10_700 * MS);
        assert_eq!(e.horizon(11_699 * MS), 11_695 * MS);
    }

    #[test]
    fn nothing_is_held_without_a_clock_or_a_hold() {
        let e = SecondEdge::new(5 * MS);
        assert_eq!(e.release_at(10_699 * MS), 10_699 * MS);
        assert_eq!(e.horizon(10_699 * MS), 10_699 * MS);
        let e = edge(0);
        assert_eq!(e.release_at(10_699 * MS), 10_699 * MS);
        assert_eq!(e.horizon(10_699 * MS), 10_699 * MS);
    }
}
