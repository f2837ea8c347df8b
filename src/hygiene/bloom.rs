//! A lock-free Bloom filter of `AtomicU64` words, for "certainly not in the set" checks.
//!
//! Sizing (the textbook optimum for `n` items and false-positive rate `p`):
//! `m = -n ln p / (ln 2)^2` bits and `k = (m / n) ln 2 = -log2 p` hashes. For 10,000,000
//! tokens at 1 % that is 95.9 Mbit (11.4 MiB, 9.59 bits per entry) and k = 7. The bit
//! count is rounded up to a power of two so an index is a mask, not a division; that
//! only lowers the false-positive rate.
//!
//! The `k` indexes come from two 64-bit halves of the caller's hash by double hashing
//! (Kirsch & Mitzenmacher, "Less hashing, same performance"): `h1 + i·h2`, which keeps
//! the false-positive rate of `k` independent hashes. The caller passes a strong hash
//! (SHA-256 of the token), so both halves are uniform.
//!
//! Inserts are `fetch_or` on single words and checks are plain loads: many threads may
//! insert and check at once without a lock. A check racing an insert of the same item
//! may still say "absent"; callers insert before they rely on the answer.

use std::sync::atomic::{AtomicU64, Ordering};

/// Errors sizing a filter.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BloomError {
    #[error("expected items must be at least 1")]
    NoItems,
    #[error("false-positive rate must be in (0, 0.5], got {0}")]
    BadRate(f64),
    #[error("a filter for {0} items at this rate needs more than 2^36 bits")]
    TooLarge(u64),
}

/// The largest filter: 2^36 bits (8 GiB), far beyond any sensible token count.
const MAX_BITS_LOG2: u32 = 36;

/// A fixed-size Bloom filter over 128-bit item hashes.
pub struct BloomFilter {
    words: Box<[AtomicU64]>,
    /// Bit count minus one (the bit count is a power of two).
    mask: u64,
    hashes: u32,
}

impl std::fmt::Debug for BloomFilter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BloomFilter")
            .field("bits", &self.bits())
            .field("hashes", &self.hashes)
            .finish()
    }
}

impl BloomFilter {
    /// A filter sized for `expected_items` at `false_positive_rate`.
    pub fn with_rate(expected_items: u64, false_positive_rate: f64) -> Result<Self, BloomError> {
        if expected_items == 0 {
            return Err(BloomError::NoItems);
        }
        if !(false_positive_rate > 0.0 && false_positive_rate <= 0.5) {
            return Err(BloomError::BadRate(false_positive_rate));
        }
        let ln2 = std::f64::consts::LN_2;
        let n = expected_items as f64;
        let bits = (-n * false_positive_rate.ln() / (ln2 * ln2))
            .ceil()
            .max(64.0);
        // k = (m / n) ln 2 = -log2 p, from the unrounded optimum: rounding m up only
        // lowers the rate, and must not raise k.
        let hashes = (-false_positive_rate.log2()).round().clamp(1.0, 32.0) as u32;
        let log2 = (bits as u64).next_power_of_two().trailing_zeros();
        if log2 > MAX_BITS_LOG2 {
            return Err(BloomError::TooLarge(expected_items));
        }
        Ok(Self::with_bits(log2, hashes))
    }

    /// A filter of exactly `2^bits_log2` bits (at least 64) and `hashes` hash functions;
    /// tests use tiny ones to force collisions.
    pub fn with_bits(bits_log2: u32, hashes: u32) -> Self {
        let bits_log2 = bits_log2.clamp(6, MAX_BITS_LOG2);
        let words = (1u64 << (bits_log2 - 6)) as usize;
        Self {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            mask: (1u64 << bits_log2) - 1,
            hashes: hashes.clamp(1, 32),
        }
    }

    #[inline]
    fn indexes(&self, hash: u128) -> impl Iterator<Item = u64> + '_ {
        let h1 = hash as u64;
        // Odd, so the k probes are distinct modulo a power of two.
        let h2 = ((hash >> 64) as u64) | 1;
        (0..u64::from(self.hashes)).map(move |i| h1.wrapping_add(i.wrapping_mul(h2)) & self.mask)
    }

    /// Adds an item.
    #[inline]
    pub fn insert(&self, hash: u128) {
        for bit in self.indexes(hash) {
            self.words[(bit >> 6) as usize].fetch_or(1 << (bit & 63), Ordering::Relaxed);
        }
    }

    /// False: certainly never inserted. True: maybe inserted (check the exact source).
    #[inline]
    pub fn may_contain(&self, hash: u128) -> bool {
        self.indexes(hash).all(|bit| {
            self.words[(bit >> 6) as usize].load(Ordering::Relaxed) & (1 << (bit & 63)) != 0
        })
    }

    /// Removes every item (plain stores: callers make sure no insert runs meanwhile).
    pub fn clear(&self) {
        for w in self.words.iter() {
            w.store(0, Ordering::Relaxed);
        }
    }

    pub fn bits(&self) -> u64 {
        self.mask + 1
    }

    pub fn hashes(&self) -> u32 {
        self.hashes
    }

    /// Heap bytes held by the bit array.
    pub fn memory_bytes(&self) -> usize {
        self.words.len() * std::mem::size_of::<AtomicU64>()
    }

    /// The false-positive rate expected with `items` inserted: `(1 - e^(-k n / m))^k`.
    pub fn expected_false_positive_rate(&self, items: u64) -> f64 {
        let k = f64::from(self.hashes);
        (1.0 - (-k * items as f64 / self.bits() as f64).exp()).powf(k)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h(i: u64) -> u128 {
        // A cheap uniform hash for tests (splitmix64 on both halves).
        fn mix(mut z: u64) -> u64 {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            z ^ (z >> 31)
        }
        (u128::from(mix(i)) << 64) | u128::from(mix(i ^ 0xdead_beef))
    }

    #[test]
    fn sizing_matches_the_formula() {
        let f = BloomFilter::with_rate(10_000_000, 0.01).unwrap();
        assert_eq!(f.hashes(), 7);
        assert_eq!(f.bits(), 1 << 27, "95.9 Mbit rounded up to a power of two");
        assert_eq!(f.memory_bytes(), 16 << 20);
        assert!(BloomFilter::with_rate(0, 0.01).is_err());
        assert!(BloomFilter::with_rate(10, 0.0).is_err());
        assert!(BloomFilter::with_rate(10, f64::NAN).is_err());
    }

    #[test]
    fn no_false_negatives_and_rate_near_configured() {
        let n = 100_000;
        let f = BloomFilter::with_rate(n, 0.01).unwrap();
        for i in 0..n {
            f.insert(h(i));
        }
        assert!((0..n).all(|i| f.may_contain(h(i))));
        let trials = 200_000;
        let fp = (n..n + trials).filter(|&i| f.may_contain(h(i))).count();
        let rate = fp as f64 / trials as f64;
        assert!(rate <= 0.01, "measured {rate}");
    }
}
