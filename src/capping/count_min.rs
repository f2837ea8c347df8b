//! A lock-free count-min sketch with two alternating windows, as in pingora-limits.
//!
//! [`CountMinSketch`]: `depth` rows of atomic 8-bit counters; a key adds one to one
//! counter per row and its estimate is the minimum over its counters. Other keys
//! only ever add to a counter, so the estimate never underestimates. Counters saturate
//! at 255 instead of wrapping; as long as no single key is counted more than 255 times
//! (the cap is at most 255) the minimum still never underestimates.
//!
//! [`WindowedSketch`]: two sketches, one per fixed window of time (`now / window`),
//! as pingora's `Rate` alternates its red and blue slots: the current window counts,
//! the previous one stays readable, and a slot is cleared when it is reused two windows
//! later, so counts expire without any per-key bookkeeping. Counting is lock-free; the
//! roll to a new window clears a slot with plain stores, so it expects one writer (the
//! scheduler): an increment racing a roll on another thread could be cleared.

use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

/// Rows: four keeps the chance that a key collides in every row small (see the docs).
pub const DEFAULT_DEPTH: usize = 4;

/// 64 counters on one cache line: all of a key's counters live in one block.
#[repr(align(64))]
struct Block([AtomicU8; 64]);

/// One window's counters.
///
/// Blocked layout: a key picks one 64-byte block, and in it one counter in each of
/// `depth` sub-rows of `64 / depth` counters. One cache miss per key instead of one per
/// row; with the same counters in total, each sub-row counter is shared by as many keys
/// on average as a plain row's, so the estimate is about as tight.
pub struct CountMinSketch {
    blocks: Box<[Block]>,
    depth: usize,
    block_mask: u64,
}

impl std::fmt::Debug for CountMinSketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CountMinSketch")
            .field("depth", &self.depth)
            .field("blocks", &self.blocks.len())
            .finish()
    }
}

/// splitmix64's finaliser: a second, independent-looking hash from the first.
#[inline]
pub fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

impl CountMinSketch {
    /// `depth` rows (a power of two, 1–16) of about `width` counters each: `depth ×
    /// width` counters in all, rounded up to whole, power-of-two many blocks.
    pub fn new(depth: usize, width: usize) -> Self {
        let depth = depth.clamp(1, 16).next_power_of_two();
        let blocks = (depth * width.max(1)).div_ceil(64).next_power_of_two();
        Self {
            blocks: (0..blocks)
                .map(|_| Block([const { AtomicU8::new(0) }; 64]))
                .collect(),
            depth,
            block_mask: blocks as u64 - 1,
        }
    }

    /// The counter of `row` for `hash`: the block from the hash, the position in the
    /// row's sub-row from a second mix of it.
    #[inline]
    fn cell(&self, row: usize, hash: u64, positions: u64) -> &AtomicU8 {
        let per_row = 64 / self.depth;
        let block = &self.blocks[(hash & self.block_mask) as usize];
        let pos = (positions >> (row * 4)) as usize & (per_row - 1);
        &block.0[row * per_row + pos]
    }

    /// Adds one to the key's counters and returns the estimate *before* the increment.
    #[inline]
    pub fn increment(&self, hash: u64) -> u8 {
        let mut before = u8::MAX;
        let positions = mix(hash);
        for row in 0..self.depth {
            let old = self
                .cell(row, hash, positions)
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |v| v.checked_add(1))
                .unwrap_or(u8::MAX);
            before = before.min(old);
        }
        before
    }

    /// The key's count estimate: never below the true count (up to 255).
    #[inline]
    pub fn estimate(&self, hash: u64) -> u8 {
        let positions = mix(hash);
        (0..self.depth)
            .map(|row| self.cell(row, hash, positions).load(Ordering::Relaxed))
            .min()
            .unwrap_or(0)
    }

    /// Sets every counter to zero.
    pub fn clear(&self) {
        for b in self.blocks.iter() {
            for c in &b.0 {
                c.store(0, Ordering::Relaxed);
            }
        }
    }

    pub fn memory_bytes(&self) -> usize {
        self.blocks.len() * 64
    }
}

/// A sketch per fixed window, two windows kept.
#[derive(Debug)]
pub struct WindowedSketch {
    window: u64,
    slots: [Slot; 2],
}

#[derive(Debug)]
struct Slot {
    /// Window index + 1 the slot counts for; 0 = none yet.
    epoch: AtomicU64,
    sketch: CountMinSketch,
}

impl WindowedSketch {
    /// Windows of `window` nanoseconds (at least 1).
    pub fn new(window: u64, depth: usize, width: usize) -> Self {
        let slot = || Slot {
            epoch: AtomicU64::new(0),
            sketch: CountMinSketch::new(depth, width),
        };
        Self {
            window: window.max(1),
            slots: [slot(), slot()],
        }
    }

    /// The index of the window containing `now`.
    #[inline]
    pub fn window_index(&self, now: u64) -> u64 {
        now / self.window
    }

    /// The sketch of window `index` if a slot holds it.
    #[inline]
    fn slot_for(&self, index: u64) -> Option<&CountMinSketch> {
        let slot = &self.slots[(index & 1) as usize];
        (slot.epoch.load(Ordering::Acquire) == index + 1).then_some(&slot.sketch)
    }

    /// The key's estimate in the window containing `now` (0 if nothing counted there).
    #[inline]
    pub fn estimate(&self, hash: u64, now: u64) -> u8 {
        self.slot_for(self.window_index(now))
            .map_or(0, |s| s.estimate(hash))
    }

    /// The key's estimate in the window before the one containing `now`.
    pub fn previous_estimate(&self, hash: u64, now: u64) -> u8 {
        match self.window_index(now).checked_sub(1) {
            Some(i) => self.slot_for(i).map_or(0, |s| s.estimate(hash)),
            None => 0,
        }
    }

    /// Counts the key in the window containing `now`, rolling the slot if it holds an
    /// older window; returns the estimate before the increment.
    #[inline]
    pub fn increment(&self, hash: u64, now: u64) -> u8 {
        let index = self.window_index(now);
        let slot = &self.slots[(index & 1) as usize];
        let epoch = slot.epoch.load(Ordering::Acquire);
        if epoch != index + 1 {
            if epoch > index + 1 {
                // A clock behind the last roll: count into nothing rather than into a
                // newer window (a send the cap never sees is never a wrong skip).
                return 0;
            }
            if slot
                .epoch
                .compare_exchange(epoch, index + 1, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
            {
                slot.sketch.clear();
            }
        }
        slot.sketch.increment(hash)
    }

    pub fn memory_bytes(&self) -> usize {
        self.slots.iter().map(|s| s.sketch.memory_bytes()).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn never_underestimates_even_when_crowded() {
        let s = CountMinSketch::new(2, 16);
        let mut truth = std::collections::HashMap::new();
        for i in 0..2_000u64 {
            let k = mix(i % 97 + 1);
            s.increment(k);
            *truth.entry(k).or_insert(0u32) += 1;
        }
        for (k, n) in truth {
            assert!(u32::from(s.estimate(k)) >= n.min(255));
        }
    }

    #[test]
    fn windows_alternate_and_expire() {
        let w = WindowedSketch::new(100, 4, 1024);
        assert_eq!(w.increment(7, 10), 0);
        assert_eq!(w.increment(7, 50), 1);
        assert_eq!(w.estimate(7, 99), 2);
        assert_eq!(w.estimate(7, 100), 0, "a new window starts empty");
        w.increment(7, 150);
        assert_eq!(w.previous_estimate(7, 150), 2);
        assert_eq!(w.estimate(7, 150), 1);
        // Two windows later the first slot is reused and cleared.
        assert_eq!(w.increment(7, 210), 0);
        assert_eq!(w.previous_estimate(7, 210), 1);
    }
}
