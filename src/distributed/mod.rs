//! Distributed mode: the workers of one consumer group share each campaign's send_rate
//! through Redis (`limiter.scope = "redis"`, the default for every campaign, or a
//! campaign's own `limiter_scope`, which wins; see [`scope`]).
//!
//! The scheduler is synchronous, so Redis is never on its path. Each campaign's limiter
//! is a [`LeasedLimiter`]: it spends permits from a local lease, and a background task
//! per campaign refills the lease ahead of need with one atomic script call: about
//! rate × `redis.lease_ms` / workers permits at a time (at least 1). Redis keeps the
//! global total; the campaign's own algorithm, run locally at the campaign's rate,
//! shapes when the leased permits go (except the window-counting algorithms: see
//! [`lease`]).
//!
//! - [`redis_gcra`]: the Lua GCRA; a lease is a run of exact slots of the campaign's
//!   schedule, so the workers together keep one smooth schedule.
//! - [`redis_sliding_window`]: Criteo's weighted two-window approximation, as a second
//!   algorithm and a comparison.
//! - [`lease`]: the lease-spending limiter and its refill task.
//! - [`redis_clock`]: places a GCRA lease's slots on the worker's clock by Redis's.
//! - [`fallback`]: Redis unreachable: a local limiter of the campaign's algorithm at
//!   send_rate / workers, the number of workers taken from the consumer group's
//!   membership or `limiter.workers_estimate`.
//! - [`scope`]: the scheduler's limiter factory, choosing local or leased limiters per
//!   campaign.

pub mod fallback;
pub mod lease;
pub mod redis_clock;
pub mod redis_gcra;
pub mod redis_sliding_window;
pub mod scope;

pub use fallback::Membership;
pub use lease::LeasedLimiter;
pub use scope::ScopedLimiters;

use crate::config::Settings;
use crate::limiter::factory::LimiterFactory;
use crate::limiter::{Algorithm, Clock, DynLimiter, Rate};
use crate::redis_link::{self, RedisLink, RedisTarget};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// `redis.algorithm`: how the shared limit is kept in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RedisAlgorithm {
    /// GCRA in a Lua script: leases are exact time slots of the campaign's schedule.
    RedisGcra,
    /// Criteo's approximation: per-window counters weighted by the previous window.
    RedisSlidingWindow,
}

/// Errors of the distributed mode: all of them are Redis's.
pub use crate::redis_link::LinkError as DistributedError;

/// One answer of a lease script.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LeaseAnswer {
    /// `permits` slots, the first `offset_micros` from the script's "now" (negative when
    /// the burst lets the lease start in the past), spaced by the campaign's interval.
    /// `redis_now_micros`: that "now" on Redis's clock, for a schedule kept there
    /// (`None`: the lease starts on receipt).
    Granted {
        permits: u32,
        offset_micros: i64,
        redis_now_micros: Option<i64>,
    },
    /// Nothing now; ask again after this long.
    Wait(Duration),
}

/// What the distributed limiters need from the settings.
#[derive(Clone)]
pub struct RedisConfig {
    /// Where and how to connect (URL, credentials, TLS).
    pub target: RedisTarget,
    pub connect_timeout: Duration,
    pub algorithm: RedisAlgorithm,
    /// The slice a lease covers.
    pub lease: Duration,
    pub key_prefix: String,
    pub workers_estimate: u32,
}

impl RedisConfig {
    pub fn from_settings(settings: &Settings) -> RedisConfig {
        RedisConfig {
            target: settings.redis.target(),
            connect_timeout: settings.redis.connect_timeout(),
            algorithm: settings.redis.algorithm,
            lease: Duration::from_millis(settings.redis.lease_ms),
            key_prefix: settings.redis.key_prefix.clone(),
            workers_estimate: settings.limiter.workers_estimate.max(1),
        }
    }
}

impl std::fmt::Debug for RedisConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConfig")
            .field("target", &self.target)
            .field("connect_timeout", &self.connect_timeout)
            .field("algorithm", &self.algorithm)
            .field("lease", &self.lease)
            .field("key_prefix", &self.key_prefix)
            .field("workers_estimate", &self.workers_estimate)
            .finish()
    }
}

/// Builds [`LeasedLimiter`]s that share each campaign's rate through Redis. Cheap to
/// clone; clones share the connection, counters and membership.
#[derive(Clone)]
pub struct RedisLimiterFactory {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: RedisConfig,
    link: RedisLink,
    pub(crate) clock: Arc<dyn Clock>,
    pub(crate) runtime: tokio::runtime::Handle,
    round_trips: AtomicU64,
    pub(crate) membership: Membership,
    pub(crate) redis_clock: redis_clock::RedisClock,
    /// Whether the outage has been logged (once per outage, not per campaign).
    outage_logged: AtomicBool,
}

impl RedisLimiterFactory {
    /// Starts connecting in the background (start-up never waits for Redis: until it
    /// answers, campaigns run on the fallback). Must be called inside a Tokio runtime;
    /// `clock` must be the scheduler's.
    pub fn new(
        config: RedisConfig,
        clock: Arc<dyn Clock>,
    ) -> Result<RedisLimiterFactory, DistributedError> {
        let (runtime, client) = RedisLink::open(&config.target)?;
        let inner = Arc::new(Inner {
            membership: Membership::new(config.workers_estimate),
            redis_clock: redis_clock::RedisClock::new(),
            link: RedisLink::new(config.connect_timeout),
            config,
            clock,
            runtime,
            round_trips: AtomicU64::new(0),
            outage_logged: AtomicBool::new(false),
        });
        inner.runtime.spawn(connect(Arc::downgrade(&inner), client));
        Ok(RedisLimiterFactory { inner })
    }

    /// Lease script calls made so far (every EVALSHA, granted or not).
    pub fn round_trips(&self) -> u64 {
        self.inner.round_trips.load(Relaxed)
    }

    /// The workers the rate is divided among (lease sizes, fallback rate).
    pub fn workers(&self) -> u32 {
        self.inner.membership.workers()
    }

    pub fn membership(&self) -> &Membership {
        &self.inner.membership
    }

    /// Whether a connection to Redis has been made (it reconnects by itself afterwards).
    pub fn is_connected(&self) -> bool {
        self.inner.link.is_connected()
    }

    /// Why the first connection is not made yet (refused, TLS, credentials), if tried.
    pub fn connect_error(&self) -> Option<String> {
        self.inner.link.last_error()
    }

    /// Follows the consumer group's live members, for [`Self::workers`]; see
    /// [`fallback::watch_group`].
    pub fn watch_group(
        &self,
        kafka: &crate::config::KafkaSettings,
        bootstrap: &str,
        group_id: &str,
    ) {
        fallback::watch_group(Arc::downgrade(&self.inner), kafka, bootstrap, group_id);
    }

    /// A campaign limiter sharing `rate` through Redis (`redis.algorithm`), its leased
    /// permits shaped by the campaign's own `algorithm` (see [`lease`]).
    pub fn limiter(
        &self,
        campaign: &str,
        algorithm: Algorithm,
        rate: Rate,
        burst: u32,
    ) -> LeasedLimiter {
        LeasedLimiter::start(Arc::clone(&self.inner), campaign, algorithm, rate, burst)
    }
}

impl std::fmt::Debug for RedisLimiterFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLimiterFactory")
            .field("config", &self.inner.config)
            .field("round_trips", &self.round_trips())
            .field("workers", &self.workers())
            .finish()
    }
}

impl LimiterFactory for RedisLimiterFactory {
    fn build(&self, campaign: &str, algorithm: Algorithm, rate: Rate, burst: u32) -> DynLimiter {
        Arc::new(self.limiter(campaign, algorithm, rate, burst))
    }
}

impl Inner {
    /// One lease script call, bounded by the connect timeout.
    pub(crate) async fn lease(
        &self,
        key: &str,
        rate: Rate,
        burst: u32,
        n: u32,
    ) -> Result<LeaseAnswer, DistributedError> {
        let lease = 2 * self.config.lease;
        self.link
            .call(|mut conn| async move {
                // Counted once connected: every EVALSHA sent, granted or not.
                self.round_trips.fetch_add(1, Relaxed);
                metrics::counter!("redis_round_trips_total").increment(1);
                match self.config.algorithm {
                    RedisAlgorithm::RedisGcra => {
                        redis_gcra::lease(&mut conn, key, rate, burst, n, lease).await
                    }
                    RedisAlgorithm::RedisSlidingWindow => {
                        redis_sliding_window::lease(&mut conn, key, rate, burst, n).await
                    }
                }
            })
            .await
    }

    /// The key of a campaign for the configured algorithm.
    pub(crate) fn key(&self, campaign: &str) -> String {
        match self.config.algorithm {
            RedisAlgorithm::RedisGcra => redis_gcra::key(&self.config.key_prefix, campaign),
            RedisAlgorithm::RedisSlidingWindow => {
                redis_sliding_window::key(&self.config.key_prefix, campaign)
            }
        }
    }

    /// Logs the first failure of an outage, once for all campaigns.
    pub(crate) fn outage(&self, error: &DistributedError) {
        if !self.outage_logged.swap(true, Relaxed) {
            tracing::warn!(
                %error,
                workers = self.membership.workers(),
                "redis unreachable; campaigns fall back to local limiters at send_rate / workers"
            );
        }
    }

    /// Logs the end of an outage, once.
    pub(crate) fn recovered(&self) {
        if self.outage_logged.swap(false, Relaxed) {
            tracing::info!("redis answers again; campaigns back on shared leases");
        }
    }
}

/// Makes the first connection, retrying until Redis answers; the connection manager
/// reconnects by itself after that.
async fn connect(inner: Weak<Inner>, client: redis::Client) {
    redis_link::connect_until_up(
        inner,
        client,
        |i| &i.link,
        |i| i.recovered(),
        |i, e| i.outage(&e),
    )
    .await;
}
