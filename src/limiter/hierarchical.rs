//! `hierarchical`: a global cap over per-campaign limiters, with a soft burst bucket per
//! campaign, after the Yandex HTB.
//!
//! The global limiter is a lock-free [`Gcra`] (the daemon's or the provider's total
//! cap). Each campaign has its own limiter of any algorithm at its own rate, built with
//! no burst, and a burst bucket: a token bucket at the campaign's rate holding at most
//! `burst + 1` permits (in the fixed point of [`Rate::interval_fp`]), which every permit
//! the campaign sends draws from. The bucket therefore holds exactly the campaign's own
//! capacity that it left unused, up to its burst. A request is served in two ways:
//!
//! 1. Own rate: the campaign's limiter passes and the global cap has room (its usual
//!    tolerance, the global burst). A campaign within its own rate always passes this
//!    way while the global cap has room.
//! 2. Burst: the campaign's limiter refuses, but the bucket holds the permits and the
//!    global cap is on or behind its smooth schedule (it is checked with zero
//!    tolerance). So a burst only uses capacity that the other campaigns left unused, and
//!    own-rate traffic, which may use the global burst tolerance, has priority over it.
//!
//! Every permit of either kind passes the global GCRA, so nothing ever pushes the global
//! cap over. When the campaign's limiter passes but the global cap refuses, the permit
//! the campaign's limiter gave out is not drawn from the bucket: it is returned to the
//! burst bucket, to be sent later as a burst permit when the global cap has room.
//!
//! Bounds: a campaign alone under a roomy global cap sends at most `ceil(rate × w) +
//! burst` in any window `[t, t + w)` (with a `gcra` own limiter) and its long-run rate is
//! its own rate: the bucket refills at that rate and every permit drains it. `WaitUntil`
//! is exact while the global cap is not the constraint; when it is, the answer is the
//! earliest instant the global cap could pass the request, a lower bound (another
//! campaign may take that slot first, and the caller is then told to wait again).

use std::sync::{Arc, Mutex};

use super::{
    build, ceil_ns, lock, to_fp, Algorithm, Decision, DynLimiter, Gcra, Nanos, Rate, RateLimiter,
};

/// The global cap that campaigns are created under. Cheap to clone (one `Arc`).
#[derive(Debug, Clone)]
pub struct HierarchicalLimiter {
    global: Arc<Gcra>,
}

impl HierarchicalLimiter {
    /// A global cap of `global` with `global_burst` permits of tolerance for own-rate
    /// traffic (burst traffic gets none).
    pub fn new(global: Rate, global_burst: u32) -> Self {
        Self {
            global: Arc::new(Gcra::new(global, global_burst)),
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
        }
    }

    /// Changes the global cap from `now` on.
    pub fn set_global_rate(&self, rate: Rate, now: Nanos) {
        self.global.set_rate(rate, now);
    }

    /// The global cap's rate.
    pub fn global_rate(&self) -> Rate {
        self.global.rate()
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
    global: Arc<Gcra>,
    bucket: Mutex<Bucket>,
    burst: u64,
}

impl CampaignLimiter {
    /// The campaign's own limiter.
    pub fn own(&self) -> &DynLimiter {
        &self.own
    }

    fn acquire_locked(&self, b: &mut Bucket, n: u32, now: Nanos) -> Decision {
        let cost = i128::from(b.interval) * i128::from(n);
        match self.own.try_acquire_n(n, now) {
            Decision::Allow => match self.global.acquire_with(n, now, false) {
                Decision::Allow => {
                    b.tokens -= cost;
                    Decision::Allow
                }
                // The own permit is not drawn from the bucket: returned to the burst.
                wait => wait,
            },
            Decision::WaitUntil(own_at) => {
                let cap = i128::from(b.interval) * i128::from(self.burst + 1);
                if cost > cap {
                    return Decision::WaitUntil(own_at);
                }
                if b.tokens >= cost {
                    return match self.global.acquire_with(n, now, true) {
                        Decision::Allow => {
                            b.tokens -= cost;
                            Decision::Allow
                        }
                        Decision::WaitUntil(global_at) => {
                            Decision::WaitUntil(own_at.min(global_at))
                        }
                    };
                }
                let short = u64::try_from(cost - b.tokens).unwrap_or(u64::MAX);
                let burst_at = b
                    .last
                    .saturating_add(ceil_ns(short))
                    .max(self.global.earliest(n, true));
                Decision::WaitUntil(own_at.min(burst_at))
            }
        }
    }
}

impl RateLimiter for CampaignLimiter {
    fn try_acquire_n(&self, n: u32, now: Nanos) -> Decision {
        if n == 0 {
            return Decision::Allow;
        }
        let mut b = lock(&self.bucket);
        b.refill(now, self.burst);
        self.acquire_locked(&mut b, n, now)
    }

    fn acquire_up_to(&self, max: u32, now: Nanos) -> super::Grant {
        let mut b = lock(&self.bucket);
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
        let mut b = lock(&self.bucket);
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

    fn name(&self) -> &'static str {
        "hierarchical"
    }
}
