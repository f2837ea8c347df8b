//! Where campaign limiters come from: [`LocalLimiters`] builds in-process ones; the
//! distributed mode plugs in a factory whose limiters share a rate across workers.

use super::LimiterScope;
use super::{Algorithm, DynLimiter, Rate};

/// Builds each campaign's own limiter. The default builds in-process limiters; the
/// distributed mode plugs in a factory whose limiters share a rate across workers.
pub trait LimiterFactory: Send + Sync {
    fn build(&self, campaign: &str, algorithm: Algorithm, rate: Rate, burst: u32) -> DynLimiter;

    /// A limiter for a campaign with its own `limiter_scope` (`None`: the configured
    /// default). Factories that know only one scope ignore it.
    fn build_scoped(
        &self,
        campaign: &str,
        algorithm: Algorithm,
        _scope: Option<LimiterScope>,
        rate: Rate,
        burst: u32,
    ) -> DynLimiter {
        self.build(campaign, algorithm, rate, burst)
    }
}

/// In-process limiters from [`super::build`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalLimiters;

impl LimiterFactory for LocalLimiters {
    fn build(&self, _campaign: &str, algorithm: Algorithm, rate: Rate, burst: u32) -> DynLimiter {
        super::build(algorithm, rate, burst)
    }
}
