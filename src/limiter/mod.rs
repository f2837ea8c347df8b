//! The rate-limiter library: every send passes through a [`RateLimiter`].
//!
//! This is pushpace's "RateLimitingInterface": construct from a validated [`Rate`] and a
//! burst, then ask [`RateLimiter::try_acquire`] at a given instant. The answer is either
//! [`Decision::Allow`] or [`Decision::WaitUntil`] with the earliest instant at which a
//! retry succeeds, so callers sleep exactly that long rather than poll. A limiter says
//! "not yet", never "never".
//!
//! Layout (one algorithm per file; the clock is kept apart, as in governor):
//! - [`clock`]: the [`Clock`] trait, [`MonotonicClock`] and [`ManualClock`].
//! - [`rate`]: [`Rate`], validated once.
//! - [`leaky_bucket`], [`token_bucket`], [`fixed_window`], [`sliding_log`],
//!   [`sliding_window`], [`gcra`], [`governor_adapter`]: the algorithms.
//! - [`hierarchical`]: a global cap over per-campaign limiters with a soft burst.
//! - [`build`]: the factory that makes any of them by [`Algorithm`] name.

pub mod clock;
pub mod factory;
pub mod fixed_window;
pub mod gcra;
pub mod governor_adapter;
pub mod hierarchical;
pub mod leaky_bucket;
pub mod rate;
pub mod sliding_log;
pub mod sliding_window;
pub mod token_bucket;

use std::sync::Arc;

pub use clock::{Clock, ManualClock, MonotonicClock, Nanos, NANOS_PER_SEC};
pub use fixed_window::FixedWindow;
pub use gcra::Gcra;
pub use governor_adapter::GovernorLimiter;
pub use hierarchical::{CampaignLimiter, HierarchicalLimiter};
pub use leaky_bucket::LeakyBucket;
pub use rate::{Rate, RateError, FP_ONE, FP_SHIFT, MAX_RATE_PER_SECOND};
pub use sliding_log::SlidingLog;
pub use sliding_window::SlidingWindow;
pub use token_bucket::TokenBucket;

/// The answer of a limiter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decision {
    /// The permit(s) were taken.
    Allow,
    /// Nothing was taken; the earliest instant at which the same request can succeed.
    WaitUntil(Nanos),
}

impl Decision {
    pub fn is_allowed(self) -> bool {
        matches!(self, Decision::Allow)
    }
}

/// A rate limiter. Implementations are `Send + Sync` and take `now` from the caller's
/// [`Clock`], so that the same code runs under real and virtual time.
pub trait RateLimiter: Send + Sync {
    /// Takes one permit at `now`, or says when one will be available.
    fn try_acquire(&self, now: Nanos) -> Decision {
        self.try_acquire_n(1, now)
    }

    /// Takes `n` permits at once, all or none. `n` larger than the burst capacity can
    /// still succeed: the limiter then waits until the whole batch fits its spacing.
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision;

    /// Changes the rate of a live limiter. The new rate holds from `now`; it never
    /// releases more than the configured burst, and lowering the rate never stalls the
    /// limiter for longer than one new interval (one new window for the window-counting
    /// algorithms, whose natural step is a window).
    fn set_rate(&self, rate: Rate, now: Nanos);

    /// The current rate.
    fn rate(&self) -> Rate;

    /// The algorithm's name, as accepted by [`Algorithm::from_str`](std::str::FromStr).
    fn name(&self) -> &'static str;

    /// How long after their time this limiter still grants permits by itself: asked as of
    /// `now`, it may grant those due since `now − catch_up()`. 0 for the algorithms here
    /// (beyond their burst, time not asked for is gone); Redis leases spend a slot up to
    /// their catch-up late. A caller that makes up its own lateness counts this in, so
    /// that the two do not add up.
    fn catch_up(&self) -> Nanos {
        0
    }

    /// Under a shared cap: whether this limiter's campaign is of a class served before
    /// others sharing the cap. Its permits are then taken from the cap whatever the
    /// cap's room, so the classes below wait for them (its own rate, set to its share,
    /// bounds it). A limiter under no cap ignores it.
    fn set_first(&self, _first: bool) {}

    /// Takes as many permits as are available at `now`, up to `max`: the scheduler's way
    /// to fill a whole time slice with one call. Callable on `dyn RateLimiter`; every
    /// algorithm here overrides the one-by-one default with a single-step version.
    fn acquire_up_to(&self, max: u32, now: Nanos) -> Grant {
        let mut granted = 0;
        while granted < max {
            match self.try_acquire(now) {
                Decision::Allow => granted += 1,
                Decision::WaitUntil(t) => {
                    return Grant {
                        granted,
                        next_at: Some(t),
                    }
                }
            }
        }
        Grant {
            granted,
            next_at: None,
        }
    }
}

impl std::fmt::Debug for dyn RateLimiter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RateLimiter")
            .field("name", &self.name())
            .field("rate", &self.rate())
            .finish()
    }
}

/// The outcome of [`RateLimiter::acquire_up_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Grant {
    /// Permits taken, 0..=max.
    pub granted: u32,
    /// When fewer than asked were granted: the earliest instant the next permit can be had.
    pub next_at: Option<Nanos>,
}

/// The algorithms a campaign can choose, by the names used in config, jobs and the API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Algorithm {
    LeakyBucket,
    TokenBucket,
    FixedWindow,
    SlidingLog,
    SlidingWindow,
    Gcra,
    Governor,
}

impl Algorithm {
    pub const ALL: [Algorithm; 7] = [
        Algorithm::LeakyBucket,
        Algorithm::TokenBucket,
        Algorithm::FixedWindow,
        Algorithm::SlidingLog,
        Algorithm::SlidingWindow,
        Algorithm::Gcra,
        Algorithm::Governor,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Algorithm::LeakyBucket => "leaky-bucket",
            Algorithm::TokenBucket => "token-bucket",
            Algorithm::FixedWindow => "fixed-window",
            Algorithm::SlidingLog => "sliding-log",
            Algorithm::SlidingWindow => "sliding-window",
            Algorithm::Gcra => "gcra",
            Algorithm::Governor => "governor",
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An algorithm name that pushpace does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown algorithm {0:?}; expected one of leaky-bucket, token-bucket, fixed-window, sliding-log, sliding-window, gcra, governor")]
pub struct UnknownAlgorithm(pub String);

impl std::str::FromStr for Algorithm {
    type Err = UnknownAlgorithm;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Algorithm::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownAlgorithm(s.to_string()))
    }
}

/// A limiter of any algorithm, shareable between tasks.
pub type DynLimiter = Arc<dyn RateLimiter>;

/// Builds a limiter of `algorithm` at `rate` with `burst` extra permits.
///
/// `burst` is the number of permits a limiter may release above its smooth spacing of
/// 1/rate; 0 means perfectly smooth where the algorithm allows it. What that means for
/// each algorithm (see its module doc and docs/ALGORITHMS.md):
/// - `gcra`, `leaky-bucket`, `token-bucket`, `governor`: after an idle spell, `burst + 1`
///   permits at once, then one per 1/rate. Over any window `[t, t + w)`, at most
///   `rate × w + burst` permits (rounded up to whole permits).
/// - `fixed-window`, `sliding-log`, `sliding-window`: these count per window, so a whole
///   window is their natural burst. The window holds `limit = max(1, round(rate × 1 s)) +
///   burst` permits and lasts `limit / rate` (see [`window_for`]), so `burst` raises
///   the burst without changing the long-run rate.
pub fn build(algorithm: Algorithm, rate: Rate, burst: u32) -> DynLimiter {
    match algorithm {
        Algorithm::LeakyBucket => Arc::new(LeakyBucket::new(rate, burst)),
        Algorithm::TokenBucket => Arc::new(TokenBucket::new(rate, burst)),
        Algorithm::FixedWindow => Arc::new(FixedWindow::new(rate, burst)),
        Algorithm::SlidingLog => Arc::new(SlidingLog::new(rate, burst)),
        Algorithm::SlidingWindow => Arc::new(SlidingWindow::new(rate, burst)),
        Algorithm::Gcra => Arc::new(Gcra::new(rate, burst)),
        Algorithm::Governor => Arc::new(GovernorLimiter::new(rate, burst)),
    }
}

/// The window of the window-counting algorithms (fixed-window, sliding-log,
/// sliding-window).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Window {
    /// Permits per window: `max(1, round(rate × 1 s)) + burst`.
    pub limit: u64,
    /// The window's length, `limit / rate` rounded to the nanosecond: 1 s for whole
    /// rates without burst, longer for fractional rates (0.5/s: 2 s) or with a burst, so
    /// that `limit / length` is the rate to within 1 ns per window.
    pub length: Nanos,
}

/// The window the window-counting algorithms use for `rate` and `burst`.
pub fn window_for(rate: Rate, burst: u32) -> Window {
    let base = rate.as_f64().round().max(1.0) as u64;
    let limit = base + u64::from(burst);
    // `as` saturates on absurd bursts; max(1) rules out a zero-length window.
    let length = ((limit as f64) * (NANOS_PER_SEC as f64) / rate.as_f64())
        .round()
        .max(1.0) as Nanos;
    Window { limit, length }
}

/// Nanoseconds to the fixed point of [`Rate::interval_fp`], saturating instead of
/// wrapping for clocks older than 2^56 ns (2.3 years).
#[inline(always)]
pub(crate) fn to_fp(ns: Nanos) -> u64 {
    ns.min(u64::MAX >> FP_SHIFT) << FP_SHIFT
}

/// The first whole nanosecond at or after a fixed-point instant.
#[inline(always)]
pub(crate) fn ceil_ns(fp: u64) -> Nanos {
    (fp >> FP_SHIFT) + u64::from(fp & (FP_ONE - 1) != 0)
}

/// `a × b / c` without overflow, saturating at `u64::MAX`; `c` of 0 is treated as 1.
#[inline]
pub(crate) fn mul_div(a: u64, b: u64, c: u64) -> u64 {
    let q = u128::from(a) * u128::from(b) / u128::from(c.max(1));
    u64::try_from(q).unwrap_or(u64::MAX)
}

/// `limiter.scope`: `local` (each worker applies the full rate) or `redis` (the workers
/// of a consumer group share it; see `crate::distributed`). The default for every
/// campaign; a campaign's own `limiter_scope` (stored, set through the API) wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum LimiterScope {
    Local,
    Redis,
}

impl LimiterScope {
    pub const ALL: [LimiterScope; 2] = [LimiterScope::Local, LimiterScope::Redis];

    /// The name used in config, the API and the `campaigns.limiter_scope` column.
    pub fn as_str(self) -> &'static str {
        match self {
            LimiterScope::Local => "local",
            LimiterScope::Redis => "redis",
        }
    }
}

impl std::fmt::Display for LimiterScope {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A limiter scope name that pushpace does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown limiter scope {0:?}; expected local or redis")]
pub struct UnknownScope(pub String);

impl std::str::FromStr for LimiterScope {
    type Err = UnknownScope;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        LimiterScope::ALL
            .into_iter()
            .find(|a| a.as_str() == s)
            .ok_or_else(|| UnknownScope(s.to_string()))
    }
}
