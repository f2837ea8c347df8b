//! Per-device frequency capping: at most `max_per_device` sends per fixed `window`,
//! across every campaign. Two scopes (`capping.scope`), with different guarantees:
//!
//! | scope | where it decides | over the cap | under the cap | across workers |
//! |---|---|---|---|---|
//! | `local` | scheduler, at each send ([`FrequencyCap`]) | always skipped | sent, except one send early with probability ≈ 4e-6 | no: each worker caps alone |
//! | `redis` | intake, per held job ([`shared::SharedCap`]) | always skipped | always sent | yes, exact |
//!
//! **`local`**: two stages in the scheduler, so that the common case costs a few atomic
//! loads and no allocation:
//!
//! 1. [`count_min::WindowedSketch`]: an estimate that never underestimates. Below the
//!    cap means certainly under it: send.
//! 2. An exact map of the devices that may be near the cap: every device sent while
//!    its estimate was already ≥ 1 (a second send in the window, or a collision).
//!    When the estimate reaches the cap, this map decides.
//!
//! The one count the exact map cannot see is a device's first send, made while its
//! estimate was 0 (no entry is made then; that is the point of the sketch). A Bloom
//! filter per window records those first sends; when a device enters the exact map,
//! its earlier untracked send is taken as 1 if the filter says "maybe", 0 if it says
//! "certainly not". Hence a device over the cap is always skipped. A device under it
//! is skipped one send early only if its very first send collided in every row of the
//! sketch *and* was a false positive of the filter (sized by [`FIRST_SEND_BITS`]).
//! No sublinear structure can tell "sent once" from "collided" exactly; the measured
//! rate of that case is in docs/BENCHMARKS.md. Windows are fixed (`now / window` of
//! the worker's monotonic clock): a device may get `max_per_device` sends at the end of
//! one window and as many at the start of the next. A job read again after a crash
//! counts its re-sent devices again (the counts live in the process).
//!
//! **`redis`**: exact in both directions and shared by all workers, at the cost of
//! Redis memory (one small set per device and window) and one round trip per held job
//! (per 1,000 devices), never one per send and never on the scheduler's path. Counts
//! are per job reservation, idempotent under redelivery; a send that fails for good
//! gives its reservation back. See [`shared`] for the keys, the window edges (counted
//! at intake, up to `worker.lookahead_ms` before the send) and Redis outages (new jobs
//! wait; nothing is sent uncapped or lost).

pub mod count_min;
pub mod shared;

use crate::limiter::Nanos;
use count_min::{WindowedSketch, DEFAULT_DEPTH};
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};

/// Errors configuring a cap, and of the Redis-backed one.
#[derive(Debug, thiserror::Error)]
pub enum CapError {
    #[error("max_per_device must be 1–254, got {0}")]
    BadCap(u32),
    #[error("the window must be at least 1 ms")]
    BadWindow,
    #[error("expected_devices must be 1–1,000,000,000, got {0}")]
    BadDevices(u64),
    #[error(transparent)]
    Link(#[from] crate::redis_link::LinkError),
    #[error("the cap script answered an unknown position {0}")]
    BadAnswer(usize),
}

impl From<redis::RedisError> for CapError {
    fn from(e: redis::RedisError) -> Self {
        CapError::Link(e.into())
    }
}

/// What to do with one device's send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapDecision {
    /// Under the cap: send it (already counted).
    Send,
    /// At or over the cap in this window: skip it.
    Capped,
}

/// A cap's parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CapConfig {
    pub max_per_device: u32,
    pub window: Nanos,
    /// Distinct devices expected per window: sizes the sketches.
    pub expected_devices: u64,
}

impl CapConfig {
    pub fn validate(&self) -> Result<(), CapError> {
        if !(1..=254).contains(&self.max_per_device) {
            return Err(CapError::BadCap(self.max_per_device));
        }
        if self.window < 1_000_000 {
            return Err(CapError::BadWindow);
        }
        if !(1..=1_000_000_000).contains(&self.expected_devices) {
            return Err(CapError::BadDevices(self.expected_devices));
        }
        Ok(())
    }

    /// Counters per sketch row: one per expected device (the total is rounded up to a
    /// power of two of blocks), so each row holds at most about one device per counter.
    fn width(&self) -> usize {
        self.expected_devices as usize
    }
}

/// Counters of what the cap decided (cumulative).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CapStats {
    pub checks: u64,
    pub exact_checks: u64,
    pub capped: u64,
    pub exact_entries: usize,
}

/// Bits of the first-send filter per expected device. With [`FIRST_SEND_HASHES`] bits
/// set in one 64-bit word per device, about 1.3e-4 false positives at full load (the
/// one-word layout costs some accuracy against a plain Bloom filter of the same size,
/// and saves all but one cache miss).
pub const FIRST_SEND_BITS: u64 = 20;
pub const FIRST_SEND_HASHES: u32 = 8;

/// A Bloom filter of the devices first sent in one window, all of a device's bits in
/// one word (owned by the cap: plain words, no atomics needed).
struct FirstSends {
    window: u64,
    words: Box<[u64]>,
}

impl FirstSends {
    fn new(bits: u64) -> Self {
        let words = bits.div_ceil(64).max(1).next_power_of_two() as usize;
        Self {
            window: u64::MAX,
            words: vec![0; words].into_boxed_slice(),
        }
    }

    /// The word index and the mask of the key's bits.
    #[inline]
    fn locate(&self, key: u128) -> (usize, u64) {
        let word = (key as u64) & (self.words.len() as u64 - 1);
        let picks = (key >> 64) as u64;
        let mask = (0..FIRST_SEND_HASHES).fold(0u64, |m, i| m | 1 << ((picks >> (i * 6)) & 63));
        (word as usize, mask)
    }

    #[inline]
    fn insert(&mut self, key: u128) {
        let (w, mask) = self.locate(key);
        self.words[w] |= mask;
    }

    #[inline]
    fn may_contain(&self, key: u128) -> bool {
        let (w, mask) = self.locate(key);
        self.words[w] & mask == mask
    }

    fn bytes(&self) -> usize {
        self.words.len() * 8
    }
}

/// A fixed hash for in-memory keys: SipHash with per-process random keys.
type KeyHasher = std::collections::hash_map::RandomState;

/// The per-worker cap (owned by the scheduler: `&mut self`, no lock).
pub struct FrequencyCap {
    config: CapConfig,
    hasher: KeyHasher,
    sketch: WindowedSketch,
    /// One filter per window, alternating like the sketch's slots.
    first_sends: [FirstSends; 2],
    /// Exact sends this window (including one for an untracked first send).
    exact: HashMap<Box<str>, u32>,
    exact_window: u64,
    stats: CapStats,
}

impl std::fmt::Debug for FrequencyCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FrequencyCap")
            .field("config", &self.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl FrequencyCap {
    pub fn new(config: CapConfig) -> Result<Self, CapError> {
        config.validate()?;
        let bits = config.expected_devices * FIRST_SEND_BITS;
        Ok(Self::build(config, config.width(), bits))
    }

    /// A cap whose sketches have `width` counters per row and whose first-send filters
    /// have `width` bits; tests use tiny ones to force collisions.
    pub fn with_width(config: CapConfig, width: usize) -> Self {
        Self::build(config, width, width as u64)
    }

    fn build(config: CapConfig, width: usize, first_bits: u64) -> Self {
        Self {
            config,
            hasher: KeyHasher::new(),
            sketch: WindowedSketch::new(config.window, DEFAULT_DEPTH, width),
            first_sends: [FirstSends::new(first_bits), FirstSends::new(first_bits)],
            exact: HashMap::new(),
            exact_window: 0,
            stats: CapStats::default(),
        }
    }

    /// The first-send filter's key: two mixes of the hash, independent of the
    /// sketch's columns.
    #[inline]
    fn first_key(hash: u64) -> u128 {
        let a = count_min::mix(hash ^ 0x6a09_e667_f3bc_c909);
        let b = count_min::mix(hash ^ 0xbb67_ae85_84ca_a73b);
        (u128::from(a) << 64) | u128::from(b)
    }

    /// The filter of `window`, cleared if it last held an older one.
    fn first_sends(&mut self, window: u64) -> &mut FirstSends {
        let slot = &mut self.first_sends[(window & 1) as usize];
        if slot.window != window {
            slot.words.fill(0);
            slot.window = window;
        }
        slot
    }

    #[inline]
    fn hash(&self, token: &str) -> u64 {
        let mut h = self.hasher.build_hasher();
        h.write(token.as_bytes());
        h.finish()
    }

    /// Decides one send of `token` at `now`, counting it when the answer is `Send`.
    pub fn check(&mut self, token: &str, now: Nanos) -> CapDecision {
        self.stats.checks += 1;
        let hash = self.hash(token);
        let window = self.sketch.window_index(now);
        if window != self.exact_window {
            // Keeps the map's capacity: no reallocation in the next window.
            self.exact.clear();
            self.exact_window = window;
        }
        let cap = self.config.max_per_device;
        let estimate = u32::from(self.sketch.estimate(hash, now));
        if estimate == 0 {
            // Certainly never sent this window: the common case, no map access.
            self.sketch.increment(hash, now);
            self.first_sends(window).insert(Self::first_key(hash));
            return CapDecision::Send;
        }
        // Seen (or a collision): keep an exact count from here on.
        let sent = match self.exact.get_mut(token) {
            Some(n) => n,
            None => {
                let untracked =
                    u32::from(self.first_sends(window).may_contain(Self::first_key(hash)));
                self.exact.entry(Box::from(token)).or_insert(untracked)
            }
        };
        if estimate >= cap {
            self.stats.exact_checks += 1;
            if *sent >= cap {
                self.stats.capped += 1;
                return CapDecision::Capped;
            }
        }
        *sent += 1;
        self.sketch.increment(hash, now);
        CapDecision::Send
    }

    pub fn config(&self) -> CapConfig {
        self.config
    }

    pub fn stats(&self) -> CapStats {
        CapStats {
            exact_entries: self.exact.len(),
            ..self.stats
        }
    }

    /// Bytes held by the sketches (the exact map is extra: see [`Self::stats`]).
    pub fn sketch_bytes(&self) -> usize {
        self.sketch.memory_bytes()
            + self
                .first_sends
                .iter()
                .map(FirstSends::bytes)
                .sum::<usize>()
    }

    /// Bytes held by the exact map's table and keys (approximate: allocator overhead
    /// not counted).
    pub fn exact_bytes(&self) -> usize {
        let slot = std::mem::size_of::<(Box<str>, u32)>() + 1;
        self.exact.capacity() * slot + self.exact.keys().map(|k| k.len()).sum::<usize>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOUR: Nanos = 3_600_000_000_000;

    fn cap(n: u32) -> FrequencyCap {
        FrequencyCap::new(CapConfig {
            max_per_device: n,
            window: HOUR,
            expected_devices: 1 << 16,
        })
        .unwrap()
    }

    #[test]
    fn three_per_hour() {
        let mut c = cap(3);
        for _ in 0..3 {
            assert_eq!(c.check("a", 10), CapDecision::Send);
        }
        assert_eq!(c.check("a", 20), CapDecision::Capped);
        assert_eq!(c.check("b", 20), CapDecision::Send);
        assert_eq!(c.check("a", HOUR + 1), CapDecision::Send, "a new window");
        assert_eq!(c.stats().capped, 1);
    }

    #[test]
    fn a_cap_of_one() {
        let mut c = cap(1);
        assert_eq!(c.check("a", 0), CapDecision::Send);
        assert_eq!(c.check("a", 0), CapDecision::Capped);
        assert_eq!(c.check("b", 0), CapDecision::Send);
    }

    #[test]
    fn bad_configs_are_refused() {
        let ok = CapConfig {
            max_per_device: 3,
            window: HOUR,
            expected_devices: 10,
        };
        assert!(ok.validate().is_ok());
        assert!(CapConfig {
            max_per_device: 0,
            ..ok
        }
        .validate()
        .is_err());
        assert!(CapConfig {
            max_per_device: 255,
            ..ok
        }
        .validate()
        .is_err());
        assert!(CapConfig { window: 0, ..ok }.validate().is_err());
        assert!(CapConfig {
            expected_devices: 0,
            ..ok
        }
        .validate()
        .is_err());
    }
}
