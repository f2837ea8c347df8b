//! The sink's hidden quota: a token bucket the worker knows nothing of, for the tests of
//! the adaptive ceiling. Past it the sink answers 429 ([`super::Behaviour::Quota`]) or
//! answers late ([`super::Behaviour::SlowAbove`]), as a provider over its capacity does.

use std::time::Instant;

/// `per_second` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone)]
pub struct Bucket {
    per_second: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    pub fn new(per_second: u64, burst: u64) -> Self {
        Self {
            per_second: per_second as f64,
            burst: burst.max(1) as f64,
            tokens: burst.max(1) as f64,
            last: Instant::now(),
        }
    }

    /// Whether this bucket is for these settings (a changed quota starts a new one).
    pub fn is_for(&self, per_second: u64, burst: u64) -> bool {
        self.per_second == per_second as f64 && self.burst == burst.max(1) as f64
    }

    /// Takes one token if there is one.
    pub fn take(&mut self, now: Instant) -> bool {
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.last = now;
        self.tokens = (self.tokens + elapsed * self.per_second).min(self.burst);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}
