//! `hierarchical`: a global cap over per-campaign limiters, with a soft burst bucket per
//! campaign, after the Yandex HTB.
//!
//! The global limiter is a lock-free [`Gcra`] (the daemon's or the provider's total
//! cap). Each campaign has its own limiter of any algorithm at its own rate, built with
//! no burst, and a burst bucket: a token bucket at the campaign's rate holding at most
//! `burst + 1` permits (in the fixed point of [`Rate::interval_fp`]), which every permit
//! the campaign sends draws from. So the bucket holds exactly the capacity the campaign
//! left unused, up to its burst, and the campaign never sends more than `rate × w +
//! burst` in a window `[t, t + w)`, nor more than its rate in the long run. A request that
//! the bucket covers is then served in one of two classes:
//!
//! 1. Own rate: the campaign's own limiter passes, and the global cap has room (with its
//!    usual tolerance, the global burst). A campaign that stays within its own rate always
//!    has the permits in its bucket, so it always passes while the global cap has room.
//! 2. Burst: the campaign's own limiter refuses, and the global cap is on or behind its
//!    smooth schedule (it is checked with zero tolerance). So a burst only uses capacity
//!    the other campaigns left unused, and own-rate traffic, which may use the global
//!    burst tolerance, has priority over it.
//!
//! Every permit of either class passes the global GCRA, so nothing pushes the global cap
//! over. The global cap is asked first, without taking anything, so that the campaign's
//! own limiter (which may be a shared Redis one) is not spent on a permit the cap refuses.
//! Should the cap refuse after all (another thread took the slot in between), the permit
//! the own limiter gave out is not drawn from the bucket: it is returned to the burst
//! bucket, to go later as a burst permit when the global cap has room.
//!
//! The cap decides as of the latest instant any of its campaigns asked at. A scheduler
//! asks a campaign's limiter as of the instant its permit fell due, which may be
//! milliseconds past (a wake-up's slack, a late timer), while the others were asked as of
//! now: decided as of that past instant, a cap the others keep busy refused permits it
//! had room for now, and a campaign often late fell below its share. The permits still
//! restart an idle cap's schedule at the instant they fell due, so that lateness is made
//! up in the cap as in the campaign's own limiter (docs/ALGORITHMS.md).
//!
//! `WaitUntil` is a lower bound: nothing passes before it, and when the campaign's bucket
//! or own limiter is the constraint it is exact. When the global cap is (or the class
//! changes, e.g. the bucket refills at an instant when only a burst-class permit would
//! pass but the global cap is a few of its intervals ahead), the retry may be told to
//! wait again. Under a saturated global cap, campaigns get its slots first come, first
//! served; sharing them fairly is the scheduler's job (it visits campaigns in turn).

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

use super::{
    build, ceil_ns, to_fp, Algorithm, Decision, DynLimiter, Gcra, Nanos, Rate, RateLimiter,
};

/// The global cap that campaigns are created under. Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct HierarchicalLimiter {
    global: Arc<Cap>,
}

/// The cap's GCRA and its clock: the latest instant it was asked at.
#[derive(Debug)]
struct Cap {
    gcra: Gcra,
    latest: AtomicU64,
}

impl Cap {
    /// `now`, or the latest instant already asked at when that is later.
    #[inline]
    fn now(&self, now: Nanos) -> Nanos {
        let latest = self.latest.load(Relaxed);
        if now <= latest {
            return latest;
        }
        self.latest.fetch_max(now, Relaxed).max(now)
    }
}

impl HierarchicalLimiter {
    /// A global cap of `global` with `global_burst` permits of tolerance for own-rate
    /// traffic (burst traffic gets none).
    pub fn new(global: Rate, global_burst: u32) -> Self {
        Self {
            global: Arc::new(Cap {
                gcra: Gcra::new(global, global_burst),
                latest: AtomicU64::new(0),
            }),
        }
    }

    /// A campaign limited by `algorithm` at `rate` (built with no burst), with a soft burst
    /// bucket of `burst` permits.
    pub fn campaign(&self, algorithm: Algorithm, rate: Rate, burst: u32) -> CampaignLimiter {
        self.campaign_with(build(algorithm, rate, 0), burst)
    }

    /// A campaign over an existing limiter `own`, with a soft burst bucket of `burst`
    /// permits at `own`'s rate.
    pub fn campaign_with(&self, own: DynLimiter, burst: u32) -> CampaignLimiter {
        let interval = own.rate().interval_fp();
        let burst = u64::from(burst);
        CampaignLimiter {
            bucket: Mutex::new(Bucket {
                tokens: i128::from(interval) * i128::from(burst + 1),
                last: 0,
                interval,
            }),
            own,
            global: Arc::clone(&self.global),
            burst,
            first: AtomicBool::new(false),
        }
    }

    /// Changes the global cap from `now` on.
    pub fn set_global_rate(&self, rate: Rate, now: Nanos) {
        self.global.gcra.set_rate(rate, self.global.now(now));
    }

    /// The global cap's rate.
    pub fn global_rate(&self) -> Rate {
        self.global.gcra.rate()
    }

    /// The cap used as a gate beside a limiter it does not wrap (a provider's cap over
    /// the sends that go through it, whichever campaign they belong to): how many of
    /// `max` permits it passes as of `now` with its tolerance, taking nothing, and when
    /// the next would pass if not all. Asked before the campaign's own limiter, so that
    /// no campaign permit is spent on a send the cap refuses; [`Self::take`] then takes
    /// what was sent. At most the cap's tolerance (`burst + 1`) at once.
    pub fn room(&self, max: u32, now: Nanos) -> (u32, Option<Nanos>) {
        let gcra = &self.global.gcra;
        let latest = self.global.now(now);
        let top = max.min(gcra.burst().saturating_add(1));
        // `check_with(n)` passes for every n up to the answer (a larger batch has less
        // slack): a binary search of a few loads, once per turn, not per send.
        let (mut lo, mut hi) = (0u32, top);
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            match gcra.check_with(mid, latest, false) {
                Decision::Allow => lo = mid,
                Decision::WaitUntil(_) => hi = mid - 1,
            }
        }
        if lo == max {
            return (lo, None);
        }
        match gcra.check_with(lo + 1, latest, false) {
            Decision::WaitUntil(t) => (lo, Some(t)),
            // Cut by the tolerance only: the rest may pass once these are taken.
            Decision::Allow => (lo, Some(latest)),
        }
    }

    /// Takes `n` permits of the gate (after [`Self::room`] passed them).
    pub fn take(&self, n: u32, now: Nanos) -> Decision {
        let latest = self.global.now(now);
        self.global.gcra.acquire_with(n, now, latest, false)
    }

    /// Takes `n` permits whatever the gate's room: sends of a class served first, whose
    /// shares fit under the cap; the classes below wait for them.
    pub fn force(&self, n: u32, now: Nanos) {
        if n > 0 {
            self.global.gcra.force(n, self.global.now(now));
        }
    }
}

#[derive(Debug)]
struct Bucket {
    /// Unused own capacity at `last`, ns × 2^8; negative when the campaign's limiter
    /// front-loaded (window algorithms) ahead of the refill.
    tokens: i128,
    last: Nanos,
    interval: u64,
}

impl Bucket {
    #[inline]
    fn refill(&mut self, now: Nanos, burst: u64) {
        if now > self.last {
            let cap = i128::from(self.interval) * i128::from(burst + 1);
            self.tokens = (self.tokens + i128::from(to_fp(now - self.last))).min(cap);
            self.last = now;
        }
    }
}

/// One campaign under a [`HierarchicalLimiter`]. See the [module docs](self).
#[derive(Debug)]
pub struct CampaignLimiter {
    own: DynLimiter,
    global: Arc<Cap>,
    bucket: Mutex<Bucket>,
    burst: u64,
    /// Of a class served first under the cap ([`RateLimiter::set_first`]).
    first: AtomicBool,
}

impl CampaignLimiter {
    /// The campaign's own limiter.
    pub fn own(&self) -> &DynLimiter {
        &self.own
    }

    fn acquire_locked(&self, b: &mut Bucket, n: u32, now: Nanos) -> Decision {
        let t = i128::from(b.interval);
        let cost = t * i128::from(n);
        // A batch larger than the bucket waits for a full one and leaves it in debt.
        let need = cost.min(t * i128::from(self.burst + 1));
        if b.tokens < need {
            let short = u64::try_from(need - b.tokens).unwrap_or(u64::MAX);
            return Decision::WaitUntil(b.last.saturating_add(ceil_ns(short)));
        }
        let global = &self.global.gcra;
        let latest = self.global.now(now);
        if self.first.load(Relaxed) {
            // Served first: its share fits under the cap, and the classes below wait.
            let d = self.own.try_acquire_n(n, now);
            if d == Decision::Allow {
                global.force(n, latest);
                b.tokens -= cost;
            }
            return d;
        }
        // Refused with its tolerance, a batch is refused without it too.
        if let wait @ Decision::WaitUntil(_) = global.check_with(n, latest, false) {
            return wait;
        }
        match self.own.try_acquire_n(n, now) {
            Decision::Allow => match global.acquire_with(n, now, latest, false) {
                Decision::Allow => {
                    b.tokens -= cost;
                    Decision::Allow
                }
                // Raced for the slot and lost: the own limiter's permit is spent but not
                // drawn from the bucket, so it returns to the burst.
                wait => wait,
            },
            Decision::WaitUntil(own_at) => match global.acquire_with(n, now, latest, true) {
                Decision::Allow => {
                    b.tokens -= cost;
                    Decision::Allow
                }
                Decision::WaitUntil(global_at) => Decision::WaitUntil(own_at.min(global_at)),
            },
        }
    }
}

impl RateLimiter for CampaignLimiter {
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        if n == 0 {
            return Decision::Allow;
        }
        let mut b = self.bucket.lock();
        b.refill(now, self.burst);
        self.acquire_locked(&mut b, n, now)
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> super::Grant {
        let mut b = self.bucket.lock();
        b.refill(now, self.burst);
        let mut granted = 0;
        while granted < max {
            match self.acquire_locked(&mut b, 1, now) {
                Decision::Allow => granted += 1,
                Decision::WaitUntil(t) => {
                    return super::Grant {
                        granted,
                        next_at: Some(t),
                    }
                }
            }
        }
        super::Grant {
            granted,
            next_at: None,
        }
    }

    /// Changes the campaign's own rate; the bucket keeps its permits, rescaled to the new
    /// interval and capped at the burst.
    fn set_rate(&self, rate: Rate, now: Nanos) {
        let mut b = self.bucket.lock();
        b.refill(now, self.burst);
        self.own.set_rate(rate, now);
        let new_t = rate.interval_fp();
        let cap = i128::from(new_t) * i128::from(self.burst + 1);
        b.tokens = (b.tokens * i128::from(new_t) / i128::from(b.interval.max(1))).min(cap);
        b.interval = new_t;
    }

    fn rate(&self) -> Rate {
        self.own.rate()
    }

    fn catch_up(&self) -> Nanos {
        self.own.catch_up()
    }

    fn set_first(&self, first: bool) {
        self.first.store(first, Relaxed);
    }

    fn name(&self) -> &'static str {
        "hierarchical"
    }
}
