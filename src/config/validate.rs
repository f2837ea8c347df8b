//! [`Settings::validate`]: every check that a value's type alone cannot make, each
//! error naming its key.

use super::{
    invalid, CappingSettings, ConfigError, HttpSettings, HygieneSettings, KafkaSettings,
    LimiterSettings, RedisSettings, SenderKind, SenderSettings, Settings, WorkerSettings,
};
use crate::limiter::Rate;
use secrecy::ExposeSecret;

impl Settings {
    /// Checks every value that its type alone cannot guarantee, section by section.
    pub fn validate(&self) -> Result<(), ConfigError> {
        self.kafka.validate()?;
        self.database.validate()?;
        self.worker.validate()?;
        self.limiter.validate()?;
        self.redis.validate()?;
        self.hygiene.validate()?;
        self.capping.validate()?;
        self.sender.validate()?;
        self.http.validate()
    }
}

impl Settings {
    /// `worker.drain_timeout_ms` covers the longest provider exchange (each provider's
    /// `timeout_ms` bounds one send), so that a revocation's drain normally sees every
    /// revoked send back. Checked once the providers are built. (A drain that still
    /// times out loses nothing: the partition's jobs read again wait in the scheduler
    /// for the revoked sends, docs/RELIABILITY.md.)
    pub(super) fn validate_drain(&self) -> Result<(), ConfigError> {
        let longest = self
            .providers
            .iter()
            .filter_map(|p| p.spec.common().map(|c| (c.timeout, p.name.as_str())))
            .max_by_key(|(t, _)| *t);
        let Some((timeout, name)) = longest else {
            return Ok(());
        };
        let ms = timeout.as_millis();
        if u128::from(self.worker.drain_timeout_ms) < ms {
            return Err(invalid(
                "worker.drain_timeout_ms",
                format!(
                    "must be at least the longest provider timeout_ms ({ms} ms, provider {name}): a revocation must outwait a send"
                ),
            ));
        }
        Ok(())
    }
}

impl KafkaSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let k = self;
        if k.brokers.trim().is_empty() {
            return Err(invalid("kafka.brokers", "must not be empty"));
        }
        if !k.is_embedded() {
            for b in k.brokers.split(',') {
                let host = b.trim().rsplit_once(':').map(|(h, _)| h);
                if !matches!(host, Some(h) if !h.is_empty()) {
                    return Err(invalid(
                        "kafka.brokers",
                        format!("{b:?} is not host:port (or use \"embedded\")"),
                    ));
                }
            }
        }
        for (key, v) in [("kafka.topic", &k.topic), ("kafka.group_id", &k.group_id)] {
            if v.trim().is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
        }
        if !(1..=1024).contains(&k.partitions) {
            return Err(invalid("kafka.partitions", "must be 1–1024"));
        }
        if k.commit_interval_ms == 0 {
            return Err(invalid("kafka.commit_interval_ms", "must be > 0"));
        }
        // Kafka's own rule: a member must be able to miss two heartbeats before its
        // session expires.
        let most = k.session_timeout_ms / 3;
        if most < 100 || !(100..=most).contains(&k.heartbeat_interval_ms) {
            return Err(invalid(
                "kafka.heartbeat_interval_ms",
                format!("must be 100–{most} (a third of kafka.session_timeout_ms)"),
            ));
        }
        // A broker that holds every fetch (tansu) holds a new job this long: 5 s at most.
        if !(1..=5_000).contains(&k.fetch_wait_max_ms) {
            return Err(invalid("kafka.fetch_wait_max_ms", "must be 1–5000"));
        }
        self.validate_security()?;
        if !k.is_embedded() {
            crate::broker::check_properties(k)?;
        }
        Ok(())
    }
}

impl WorkerSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let w = self;
        if !(1..=10_000).contains(&w.max_active_campaigns) {
            return Err(invalid("worker.max_active_campaigns", "must be 1–10000"));
        }
        if !(10..=1000).contains(&w.quantum_min_ms) {
            return Err(invalid("worker.quantum_min_ms", "must be 10–1000"));
        }
        if !(w.quantum_min_ms..=1000).contains(&w.quantum_max_ms) {
            return Err(invalid(
                "worker.quantum_max_ms",
                "must be between worker.quantum_min_ms and 1000",
            ));
        }
        // A late turn makes up quantum_min plus the slack: at most half again keeps the
        // catch-up's burst within 1.5 × rate × quantum_min.
        if w.wake_slack_ms > w.quantum_min_ms / 2 {
            return Err(invalid(
                "worker.wake_slack_ms",
                "must be at most half of worker.quantum_min_ms",
            ));
        }
        // Held permits are made up by the next turn, up to quantum_min late.
        if w.second_edge_ms > w.quantum_min_ms / 2 {
            return Err(invalid(
                "worker.second_edge_ms",
                "must be at most half of worker.quantum_min_ms",
            ));
        }
        if !(10..=60_000).contains(&w.stats_flush_ms) {
            return Err(invalid("worker.stats_flush_ms", "must be 10–60000"));
        }
        if !(1000..=600_000).contains(&w.stats_max_unwritten_ms)
            || w.stats_max_unwritten_ms <= w.stats_flush_ms
        {
            return Err(invalid(
                "worker.stats_max_unwritten_ms",
                "must be 1000–600000 and above worker.stats_flush_ms",
            ));
        }
        if !(100..=600_000).contains(&w.write_timeout_ms) {
            return Err(invalid("worker.write_timeout_ms", "must be 100–600000"));
        }
        // A revocation waits this long for the revoked partitions' sends; 0 would give
        // every rebalance up at once (see [`Settings::validate_drain`]).
        if w.drain_timeout_ms == 0 {
            return Err(invalid("worker.drain_timeout_ms", "must be > 0"));
        }
        if w.max_buffered_jobs == 0 {
            return Err(invalid("worker.max_buffered_jobs", "must be > 0"));
        }
        if w.max_buffered_devices == 0 {
            return Err(invalid("worker.max_buffered_devices", "must be > 0"));
        }
        if !(100..=600_000).contains(&w.lookahead_ms) {
            return Err(invalid(
                "worker.lookahead_ms",
                "must be between 100 and 600000 (10 minutes)",
            ));
        }
        if w.max_parked_jobs == 0 {
            return Err(invalid("worker.max_parked_jobs", "must be > 0"));
        }
        if !(16..=1_048_576).contains(&w.outcome_queue) {
            return Err(invalid("worker.outcome_queue", "must be 16–1048576"));
        }
        // Below a minute, settings would be re-read from the database job after job.
        if !(60_000..=86_400_000).contains(&w.forget_idle_after_ms) {
            return Err(invalid(
                "worker.forget_idle_after_ms",
                "must be 60000–86400000 (1 minute to 1 day)",
            ));
        }
        Ok(())
    }
}

impl LimiterSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        Rate::per_second(self.send_rate)
            .map_err(|e| invalid("limiter.send_rate", e.to_string()))?;
        if self.global_rate != 0.0 {
            Rate::per_second(self.global_rate)
                .map_err(|e| invalid("limiter.global_rate", format!("{e} (or 0 for none)")))?;
        }
        if self.burst > crate::store::campaigns::MAX_BURST {
            return Err(invalid(
                "limiter.burst",
                format!(
                    "must be 0 to {}, got {}",
                    crate::store::campaigns::MAX_BURST,
                    self.burst
                ),
            ));
        }
        if !(1..=10_000).contains(&self.workers_estimate) {
            return Err(invalid("limiter.workers_estimate", "must be 1–10000"));
        }
        self.validate_policy()
    }

    /// The delivery-policy keys: the same bounds as a campaign's own values.
    fn validate_policy(&self) -> Result<(), ConfigError> {
        use crate::job::policy::{MAX_RAMP_UP_S, MIN_RAMP_FROM};
        if !(0.0..=MAX_RAMP_UP_S).contains(&self.ramp_up_s) {
            return Err(invalid(
                "limiter.ramp_up_s",
                format!(
                    "must be 0 to {MAX_RAMP_UP_S} seconds, got {}",
                    self.ramp_up_s
                ),
            ));
        }
        if !(MIN_RAMP_FROM..=1.0).contains(&self.ramp_from) {
            return Err(invalid(
                "limiter.ramp_from",
                format!("must be {MIN_RAMP_FROM} to 1, got {}", self.ramp_from),
            ));
        }
        if self.start_jitter_ms > MAX_START_JITTER_MS {
            return Err(invalid(
                "limiter.start_jitter_ms",
                format!(
                    "must be 0 to {MAX_START_JITTER_MS} (an hour), got {}",
                    self.start_jitter_ms
                ),
            ));
        }
        if !(0.0..=1.0).contains(&self.critical_overdraft) {
            return Err(invalid(
                "limiter.critical_overdraft",
                format!(
                    "must be 0 to 1 (a fraction of the cap), got {}",
                    self.critical_overdraft
                ),
            ));
        }
        Ok(())
    }
}

/// The longest `limiter.start_jitter_ms`: an hour.
const MAX_START_JITTER_MS: u64 = 3_600_000;

impl RedisSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let r = self;
        match url::Url::parse(r.url.expose_secret()) {
            Ok(u) if matches!(u.scheme(), "redis" | "rediss") => {}
            _ => {
                return Err(invalid(
                    "redis.url",
                    "is not a redis:// URL (value hidden: it may hold a password)",
                ))
            }
        }
        r.validate_connection()?;
        if r.connect_timeout_ms == 0 {
            return Err(invalid("redis.connect_timeout_ms", "must be > 0"));
        }
        if !(10..=10_000).contains(&r.lease_ms) {
            return Err(invalid("redis.lease_ms", "must be 10–10000"));
        }
        if r.key_prefix.is_empty() {
            return Err(invalid("redis.key_prefix", "must not be empty"));
        }
        Ok(())
    }
}

impl RedisSettings {
    /// TLS files only with `rediss://`, readable, cert and key together; a user needs a
    /// password from somewhere.
    fn validate_connection(&self) -> Result<(), ConfigError> {
        let tls = self.url.expose_secret().starts_with("rediss://");
        let files = [
            ("redis.ssl_ca_file", &self.ssl_ca_file),
            ("redis.ssl_cert_file", &self.ssl_cert_file),
            ("redis.ssl_key_file", &self.ssl_key_file),
        ];
        for (key, file) in files {
            let Some(path) = file else { continue };
            if !tls {
                return Err(invalid(key, "needs a rediss:// redis.url (TLS)"));
            }
            if !path.is_file() {
                return Err(invalid(
                    key,
                    format!("{} is not a readable file", path.display()),
                ));
            }
        }
        if self.ssl_cert_file.is_some() != self.ssl_key_file.is_some() {
            return Err(invalid(
                "redis.ssl_key_file",
                "mutual TLS needs both redis.ssl_cert_file and redis.ssl_key_file",
            ));
        }
        let url_password = url::Url::parse(self.url.expose_secret())
            .map(|u| u.password().is_some())
            .unwrap_or(false);
        if self.username.is_some() && self.password.is_none() && !url_password {
            return Err(invalid(
                "redis.username",
                "needs a password: redis.password_file, PUSHPACE__REDIS__PASSWORD or one in redis.url",
            ));
        }
        Ok(())
    }
}

/// The longest `hygiene.invalid_ttl`: 10 years, in seconds.
const MAX_INVALID_TTL_S: u64 = 10 * 365 * 24 * 3600;

impl HygieneSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let h = self;
        if h.expected_tokens == 0 || h.expected_tokens > 1_000_000_000 {
            return Err(invalid(
                "hygiene.expected_tokens",
                "must be 1–1,000,000,000",
            ));
        }
        if !(h.false_positive_rate > 0.0 && h.false_positive_rate <= 0.5) {
            return Err(invalid(
                "hygiene.false_positive_rate",
                "must be in (0, 0.5]",
            ));
        }
        if h.reload_ms == 0 {
            return Err(invalid("hygiene.reload_ms", "must be > 0"));
        }
        if h.invalid_ttl == 0 || h.invalid_ttl > MAX_INVALID_TTL_S {
            return Err(invalid(
                "hygiene.invalid_ttl",
                "must be 1–315,360,000 seconds (10 years)",
            ));
        }
        Ok(())
    }
}

impl CappingSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        if self.enabled {
            if let Err(e) = self.cap_config().validate() {
                return Err(invalid("capping", e.to_string()));
            }
        }
        Ok(())
    }
}

impl SenderSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        let s = self;
        if s.kind == SenderKind::Http {
            match url::Url::parse(&s.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                _ => return Err(invalid("sender.url", "must be an http:// or https:// URL")),
            }
        }
        if s.timeout_ms == 0 {
            return Err(invalid("sender.timeout_ms", "must be > 0"));
        }
        if !(1..=64).contains(&s.http2_connections) {
            return Err(invalid("sender.http2_connections", "must be 1 to 64"));
        }
        if s.max_in_flight == 0 {
            return Err(invalid("sender.max_in_flight", "must be > 0"));
        }
        if s.max_attempts == 0 {
            return Err(invalid("sender.max_attempts", "must be > 0"));
        }
        if s.retry_base_ms == 0 || s.retry_max_ms < s.retry_base_ms {
            return Err(invalid(
                "sender.retry_max_ms",
                "retry_base_ms must be > 0 and retry_max_ms ≥ retry_base_ms",
            ));
        }
        Ok(())
    }
}

impl HttpSettings {
    fn validate(&self) -> Result<(), ConfigError> {
        for host in &self.allowed_hosts {
            crate::api::auth::HostPattern::parse(host)
                .map_err(|e| invalid("http.allowed_hosts", e))?;
        }
        Ok(())
    }
}
