//! [`ScopedLimiters`]: the scheduler's limiter factory when campaigns may differ in
//! scope. `limiter.scope` is the default; a campaign's stored `limiter_scope` wins.
//!
//! A scope change reaches the scheduler as a settings change (the campaign watcher),
//! and the scheduler rebuilds that campaign's limiter as it does for an algorithm
//! change; this factory only decides which kind to build. The Redis side is made on the
//! first campaign that needs it, so a worker whose campaigns are all local never
//! connects to Redis (nor logs its absence).

use super::lease::share;
use super::{DistributedError, RedisConfig, RedisLimiterFactory};
use crate::config::Settings;
use crate::limiter::factory::LimiterFactory;
use crate::limiter::LimiterScope;
use crate::limiter::{self, Algorithm, Clock, DynLimiter, Rate};
use std::sync::{Arc, OnceLock};

/// Local or Redis-leased limiters, per campaign.
pub struct ScopedLimiters {
    default: LimiterScope,
    config: RedisConfig,
    clock: Arc<dyn Clock>,
    /// The consumer group to count workers in: (bootstrap, group id).
    group: Option<(String, String)>,
    /// The connection keys for the group watcher's client.
    kafka: crate::config::KafkaSettings,
    redis: OnceLock<Option<RedisLimiterFactory>>,
}

impl ScopedLimiters {
    /// With `limiter.scope = "redis"` the Redis side starts now (inside a Tokio runtime,
    /// as [`RedisLimiterFactory::new`]); otherwise on first need.
    pub fn new(
        settings: &Settings,
        clock: Arc<dyn Clock>,
        group: Option<(String, String)>,
    ) -> Result<ScopedLimiters, DistributedError> {
        let s = ScopedLimiters {
            default: settings.limiter.scope,
            config: RedisConfig::from_settings(settings),
            clock,
            group,
            kafka: settings.kafka.clone(),
            redis: OnceLock::new(),
        };
        if s.default == LimiterScope::Redis {
            let f = s.start_redis()?;
            let _ = s.redis.set(Some(f));
        }
        Ok(s)
    }

    fn start_redis(&self) -> Result<RedisLimiterFactory, DistributedError> {
        let f = RedisLimiterFactory::new(self.config.clone(), Arc::clone(&self.clock))?;
        if let Some((bootstrap, group)) = &self.group {
            f.watch_group(&self.kafka, bootstrap, group);
        }
        Ok(f)
    }

    /// The Redis side, once some campaign has needed it (`None` if it could not start).
    pub fn redis(&self) -> Option<&RedisLimiterFactory> {
        self.redis.get().and_then(Option::as_ref)
    }

    /// The configured default scope.
    pub fn default_scope(&self) -> LimiterScope {
        self.default
    }
}

impl std::fmt::Debug for ScopedLimiters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScopedLimiters")
            .field("default", &self.default)
            .field("redis", &self.redis())
            .finish_non_exhaustive()
    }
}

impl LimiterFactory for ScopedLimiters {
    fn build(&self, campaign: &str, algorithm: Algorithm, rate: Rate, burst: u32) -> DynLimiter {
        self.build_scoped(campaign, algorithm, None, rate, burst)
    }

    fn build_scoped(
        &self,
        campaign: &str,
        algorithm: Algorithm,
        scope: Option<LimiterScope>,
        rate: Rate,
        burst: u32,
    ) -> DynLimiter {
        match scope.unwrap_or(self.default) {
            LimiterScope::Local => limiter::build(algorithm, rate, burst),
            LimiterScope::Redis => {
                let redis = self.redis.get_or_init(|| {
                    self.start_redis()
                        .map_err(|error| {
                            tracing::error!(%error, "cannot start the redis limiters");
                        })
                        .ok()
                });
                match redis {
                    Some(f) => Arc::new(f.limiter(campaign, algorithm, rate, burst)),
                    // Only without a runtime or with a URL the settings refused: the
                    // Redis-down rule, rate / workers, so the group stays under the rate.
                    None => {
                        limiter::build(algorithm, share(rate, self.config.workers_estimate), burst)
                    }
                }
            }
        }
    }
}
