//! Time sources for the limiters, kept apart from the algorithms (as governor does).
//!
//! Every algorithm takes `now` as [`Nanos`]: nanoseconds since the clock's own origin.
//! The worker reads a [`MonotonicClock`]; tests and `pushpace simulate` drive a
//! [`ManualClock`] so that results are deterministic and instant.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Nanoseconds since a clock's origin. A `u64` holds 584 years, so it never wraps.
pub type Nanos = u64;

/// One second in [`Nanos`].
pub const NANOS_PER_SEC: Nanos = 1_000_000_000;

/// A monotonic source of [`Nanos`].
pub trait Clock: Send + Sync {
    /// The current time. Never goes backwards.
    fn now(&self) -> Nanos;
}

/// The real clock: `quanta`'s TSC-backed monotonic clock, measured from construction.
///
/// quanta reads the TSC where it is stable (about 10 ns), falling back to the OS clock.
/// `now` takes the raw counter and scales only the difference from the origin (one
/// multiply and shift), which is cheaper than building a `quanta::Instant` and a
/// `Duration`; on the hot path the clock read is often the largest part of a decision.
#[derive(Clone)]
pub struct MonotonicClock {
    clock: quanta::Clock,
    origin: u64,
}

impl MonotonicClock {
    pub fn new() -> Self {
        let clock = quanta::Clock::new();
        let origin = clock.raw();
        Self { clock, origin }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for MonotonicClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MonotonicClock").finish_non_exhaustive()
    }
}

impl Clock for MonotonicClock {
    #[inline]
    fn now(&self) -> Nanos {
        // 0 for a reading at or before the origin, so time never goes below it.
        self.clock.delta_as_nanos(self.origin, self.clock.raw())
    }
}

/// A clock that moves only when told to. Cloning shares the same time.
#[derive(Clone, Debug, Default)]
pub struct ManualClock {
    now: Arc<AtomicU64>,
}

impl ManualClock {
    pub fn new(start: Nanos) -> Self {
        Self {
            now: Arc::new(AtomicU64::new(start)),
        }
    }

    /// Moves the clock forward by `by` nanoseconds.
    pub fn advance(&self, by: Nanos) {
        self.now.fetch_add(by, Ordering::SeqCst);
    }

    /// Sets the clock to `to`; it must not go backwards.
    pub fn set(&self, to: Nanos) {
        let prev = self.now.swap(to, Ordering::SeqCst);
        debug_assert!(to >= prev, "ManualClock must not go backwards");
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Nanos {
        self.now.load(Ordering::SeqCst)
    }
}
