//! The sleeping campaigns' wake-ups: a wheel of about-a-millisecond buckets for the
//! next second, and a heap for anything later.
//!
//! At 1,000 campaigns most sleeps end within a second (a limiter's next permit), and a
//! binary heap paid a sift through ten levels of scattered entries for each one (the
//! heap's `pop` was 2.4% of pacing-1000's CPU, 0.8% at 100 campaigns). Here a wake-up is
//! a push onto its bucket and a drain walks the buckets in order; only instants beyond
//! the wheel's span (retries, scheduled starts, lane pauses) go to the heap. Buckets keep
//! their capacity, so a warm wheel allocates nothing.

use crate::limiter::Nanos;
use std::cmp::Reverse;
use std::collections::BinaryHeap;

/// A bucket spans 2^20 ns (1.05 ms): about the timer's own resolution, and a shift.
const TICK_SHIFT: u32 = 20;
/// 1,024 buckets: 1.07 s, more than the gap between permits of any campaign at 1/s or
/// faster, so those never touch the heap.
const SLOTS: usize = 1024;
const WORDS: usize = SLOTS / 64;

pub(super) struct WakeWheel {
    buckets: Box<[Vec<(Nanos, u32)>]>,
    /// One bit per bucket that holds an entry.
    occupied: [u64; WORDS],
    /// Every wheel entry's tick lies in `base .. base + SLOTS`.
    base: u64,
    far: BinaryHeap<Reverse<(Nanos, u32)>>,
    len: usize,
}

impl Default for WakeWheel {
    fn default() -> Self {
        Self {
            buckets: (0..SLOTS).map(|_| Vec::new()).collect(),
            occupied: [0; WORDS],
            base: 0,
            far: BinaryHeap::new(),
            len: 0,
        }
    }
}

fn tick(t: Nanos) -> u64 {
    t >> TICK_SHIFT
}

impl WakeWheel {
    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.len
    }

    #[cfg(test)]
    pub(super) fn clear(&mut self) {
        for b in self.buckets.iter_mut() {
            b.clear();
        }
        self.occupied = [0; WORDS];
        self.far.clear();
        self.len = 0;
    }

    /// `slot` wakes at `t`. An instant already passed wakes at the next drain.
    pub(super) fn push(&mut self, t: Nanos, slot: u32) {
        self.len += 1;
        let k = tick(t).max(self.base);
        if k >= self.base + SLOTS as u64 {
            self.far.push(Reverse((t, slot)));
        } else {
            self.put(k, t, slot);
        }
    }

    fn put(&mut self, k: u64, t: Nanos, slot: u32) {
        let i = (k % SLOTS as u64) as usize;
        self.buckets[i].push((t, slot));
        self.occupied[i / 64] |= 1 << (i % 64);
    }

    /// Moves every slot whose instant is at or before `now` into `out`, in bucket order
    /// (not sorted within a bucket).
    pub(super) fn drain_due(&mut self, now: Nanos, out: &mut Vec<u32>) {
        let before = out.len();
        let now_tick = tick(now);
        // Whole buckets before `now`'s: all due. At most one lap.
        let whole = now_tick.saturating_sub(self.base).min(SLOTS as u64);
        let mut k = self.base;
        while let Some(next) = self.next_occupied(k, self.base + whole) {
            let i = (next % SLOTS as u64) as usize;
            out.extend(self.buckets[i].drain(..).map(|(_, s)| s));
            self.occupied[i / 64] &= !(1 << (i % 64));
            k = next + 1;
        }
        self.base = self.base.max(now_tick);
        // `now`'s own bucket: only what is due.
        let i = (self.base % SLOTS as u64) as usize;
        if self.occupied[i / 64] & (1 << (i % 64)) != 0 {
            let bucket = &mut self.buckets[i];
            bucket.retain(|&(t, s)| {
                let due = t <= now;
                if due {
                    out.push(s);
                }
                !due
            });
            if bucket.is_empty() {
                self.occupied[i / 64] &= !(1 << (i % 64));
            }
        }
        // The heap's entries that the wheel's span now reaches.
        while let Some(&Reverse((t, s))) = self.far.peek() {
            if tick(t) >= self.base + SLOTS as u64 {
                break;
            }
            self.far.pop();
            if t <= now {
                out.push(s);
            } else {
                self.put(tick(t), t, s);
            }
        }
        self.len -= out.len() - before;
    }

    /// The first occupied bucket's tick in `from .. to`.
    fn next_occupied(&self, from: u64, to: u64) -> Option<u64> {
        let mut k = from;
        while k < to {
            let i = (k % SLOTS as u64) as usize;
            let bits = self.occupied[i / 64] >> (i % 64);
            if bits != 0 {
                let at = k + u64::from(bits.trailing_zeros());
                return (at < to).then_some(at);
            }
            k += 64 - (i % 64) as u64;
        }
        None
    }

    /// The earliest instant held.
    pub(super) fn next_due(&self) -> Option<Nanos> {
        let near = self
            .next_occupied(self.base, self.base + SLOTS as u64)
            .and_then(|k| {
                self.buckets[(k % SLOTS as u64) as usize]
                    .iter()
                    .map(|&(t, _)| t)
                    .min()
            });
        match (near, self.far.peek()) {
            (Some(a), Some(Reverse((b, _)))) => Some(a.min(*b)),
            (a, b) => a.or(b.map(|Reverse((t, _))| *t)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Nanos = 1_000_000;

    fn drained(w: &mut WakeWheel, now: Nanos) -> Vec<u32> {
        let mut out = Vec::new();
        w.drain_due(now, &mut out);
        out.sort_unstable();
        out
    }

    #[test]
    fn wakes_each_slot_at_its_instant_and_not_before() {
        let mut w = WakeWheel::default();
        let t0 = 5_000 * MS;
        w.drain_due(t0, &mut Vec::new());
        w.push(t0 + 3 * MS, 1);
        w.push(t0 + 3 * MS + 1, 2);
        w.push(t0 + 900 * MS, 3);
        w.push(t0 + 5_000 * MS, 4); // beyond the wheel
        w.push(t0 - MS, 5); // already passed
        assert_eq!(w.len(), 5);
        assert_eq!(w.next_due(), Some(t0 - MS));
        assert_eq!(drained(&mut w, t0), vec![5]);
        assert_eq!(w.next_due(), Some(t0 + 3 * MS));
        assert_eq!(drained(&mut w, t0 + 3 * MS), vec![1]);
        assert_eq!(drained(&mut w, t0 + 3 * MS + 1), vec![2]);
        assert_eq!(w.next_due(), Some(t0 + 900 * MS));
        assert_eq!(drained(&mut w, t0 + 899 * MS), Vec::<u32>::new());
        assert_eq!(drained(&mut w, t0 + 901 * MS), vec![3]);
        assert_eq!(w.next_due(), Some(t0 + 5_000 * MS));
        assert_eq!(drained(&mut w, t0 + 4_999 * MS), Vec::<u32>::new());
        assert_eq!(drained(&mut w, t0 + 5_000 * MS), vec![4]);
        assert_eq!((w.len(), w.next_due()), (0, None));
    }

    #[test]
    fn a_long_gap_between_drains_wakes_everything_due_once() {
        let mut w = WakeWheel::default();
        for k in 0..3_000u32 {
            w.push(u64::from(k) * MS, k);
        }
        // Three laps of the wheel pass between two drains.
        let got = drained(&mut w, 2_500 * MS);
        assert_eq!(got, (0..=2_500).collect::<Vec<_>>());
        assert_eq!(w.len(), 499);
        assert_eq!(w.next_due(), Some(2_501 * MS));
        let rest = drained(&mut w, 10_000 * MS);
        assert_eq!(rest, (2_501..3_000).collect::<Vec<_>>());
        assert_eq!(w.len(), 0);
    }

    #[test]
    fn matches_a_heap_on_random_instants() {
        let mut rng = fastrand::Rng::with_seed(24);
        let mut w = WakeWheel::default();
        let mut heap = BinaryHeap::new();
        let mut now: Nanos = 1_000 * MS;
        for round in 0..20_000u32 {
            for _ in 0..rng.u32(0..4) {
                let ahead = match rng.u32(0..10) {
                    0 => rng.u64(0..5_000 * MS),
                    _ => rng.u64(0..1_100 * MS),
                };
                let t = now + ahead - rng.u64(0..2 * MS);
                w.push(t, round);
                heap.push(Reverse((t, round)));
            }
            assert_eq!(w.next_due(), heap.peek().map(|Reverse((t, _))| *t));
            now += rng.u64(0..3 * MS);
            let mut want = Vec::new();
            while heap.peek().is_some_and(|Reverse((t, _))| *t <= now) {
                want.push(heap.pop().unwrap().0 .1);
            }
            want.sort_unstable();
            assert_eq!(drained(&mut w, now), want);
            assert_eq!(w.len(), heap.len());
        }
    }
}
