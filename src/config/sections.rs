//! The plain sections of the settings: `[kafka]`, `[worker]`, `[limiter]`,
//! `[redis]`, `[hygiene]`, `[capping]`, `[http]`, and [`redact_url`] for what is shown.

use super::by_name;
// The domain enums live with their modules; re-exported so `config::` paths still work.
use super::kafka::{KafkaProperties, SaslMechanism, SecurityProtocol};
pub use crate::distributed::RedisAlgorithm;
use crate::limiter::{Algorithm, Rate};
pub use crate::limiter::{LimiterScope, UnknownScope};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

/// `[hygiene]`: the Bloom filter in front of `invalid_tokens` (see `crate::hygiene`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HygieneSettings {
    /// Skip tokens recorded invalid; record tokens answered 410.
    pub enabled: bool,
    /// Invalid tokens the filter is sized for.
    pub expected_tokens: u64,
    /// The filter's false-positive rate at `expected_tokens`.
    pub false_positive_rate: f64,
    /// How often the filter re-reads rows other workers added.
    pub reload_ms: u64,
    /// Seconds a token answered dead is skipped (for its provider) after the last such
    /// answer: tokens do come back (an app reinstalled, a restored device).
    pub invalid_ttl: u64,
}

impl HygieneSettings {
    /// [`Self::invalid_ttl`] as a duration.
    pub fn ttl(&self) -> std::time::Duration {
        std::time::Duration::from_secs(self.invalid_ttl)
    }
}

impl Default for HygieneSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            expected_tokens: 10_000_000,
            false_positive_rate: 0.01,
            reload_ms: 5000,
            invalid_ttl: 30 * 24 * 3600,
        }
    }
}

/// `capping.scope`: where the frequency cap decides, and what it guarantees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CappingScope {
    /// Per worker, in the scheduler: over the cap always skipped, under it skipped one
    /// send early with probability about 4e-6 (see `crate::capping`).
    Local,
    /// Shared by all workers through Redis (`[redis]` url, key_prefix), decided per job
    /// at intake: exact in both directions (see `crate::capping::shared`).
    Redis,
}

/// `[capping]`: an optional per-device frequency cap (see `crate::capping`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CappingSettings {
    pub enabled: bool,
    /// At most this many sends per device per window (1–254).
    pub max_per_device: u32,
    /// The window, in seconds.
    pub window: u64,
    /// Distinct devices expected per window: sizes the sketches (local scope only).
    pub expected_devices: u64,
    #[serde(deserialize_with = "by_name")]
    pub scope: CappingScope,
}

impl Default for CappingSettings {
    fn default() -> Self {
        Self {
            enabled: false,
            max_per_device: 3,
            window: 3600,
            expected_devices: 10_000_000,
            scope: CappingScope::Local,
        }
    }
}

impl CappingSettings {
    pub fn cap_config(&self) -> crate::capping::CapConfig {
        crate::capping::CapConfig {
            max_per_device: self.max_per_device,
            window: self.window.saturating_mul(crate::limiter::NANOS_PER_SEC),
            expected_devices: self.expected_devices,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum IsolationLevel {
    ReadCommitted,
    ReadUncommitted,
}

impl IsolationLevel {
    pub fn as_str(self) -> &'static str {
        match self {
            IsolationLevel::ReadCommitted => "read_committed",
            IsolationLevel::ReadUncommitted => "read_uncommitted",
        }
    }
}

/// How the consumer group spreads partitions (librdkafka's
/// `partition.assignment.strategy`). Every member of a group must use the same kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum AssignmentStrategy {
    /// Eager: every rebalance revokes every member's partitions, then assigns them all.
    Range,
    /// Eager, round-robin over the members (librdkafka's name, as documented).
    #[serde(rename = "roundrobin")]
    RoundRobin,
    /// Incremental: a rebalance revokes only the partitions that move, so the members
    /// that keep theirs go on sending through it.
    CooperativeSticky,
}

impl AssignmentStrategy {
    pub fn as_str(self) -> &'static str {
        match self {
            AssignmentStrategy::Range => "range",
            AssignmentStrategy::RoundRobin => "roundrobin",
            AssignmentStrategy::CooperativeSticky => "cooperative-sticky",
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KafkaSettings {
    /// `host:port[,host:port…]`, or `embedded` for librdkafka's in-process mock cluster.
    pub brokers: String,
    pub topic: String,
    pub group_id: String,
    pub partitions: i32,
    #[serde(deserialize_with = "by_name")]
    pub isolation_level: IsolationLevel,
    pub commit_interval_ms: u64,
    pub session_timeout_ms: u64,
    /// librdkafka's `heartbeat.interval.ms`: how soon a member hears that its group is
    /// rebalancing. At most a third of the session timeout.
    pub heartbeat_interval_ms: u64,
    /// librdkafka's `fetch.wait.max.ms`: how long the broker may hold a fetch that has
    /// too little data.
    pub fetch_wait_max_ms: u64,
    #[serde(deserialize_with = "by_name")]
    pub assignment_strategy: AssignmentStrategy,
    /// plaintext | ssl | sasl_plaintext | sasl_ssl (src/config/kafka.rs).
    #[serde(default, deserialize_with = "by_name")]
    pub security_protocol: SecurityProtocol,
    #[serde(default)]
    pub sasl_mechanism: Option<SaslMechanism>,
    #[serde(default)]
    pub sasl_username: Option<String>,
    /// Also `PUSHPACE__KAFKA__SASL_PASSWORD`; or read from `sasl_password_file` at load.
    #[serde(default)]
    pub sasl_password: Option<SecretString>,
    #[serde(default)]
    pub sasl_password_file: Option<PathBuf>,
    /// PEM CA certificates to trust (else the system's).
    #[serde(default)]
    pub ssl_ca_file: Option<PathBuf>,
    /// Mutual TLS: the client's certificate and key (PEM).
    #[serde(default)]
    pub ssl_cert_file: Option<PathBuf>,
    #[serde(default)]
    pub ssl_key_file: Option<PathBuf>,
    #[serde(default)]
    pub ssl_key_password: Option<SecretString>,
    /// Check that the broker's certificate names the host connected to.
    #[serde(default = "yes")]
    pub ssl_endpoint_identification: bool,
    /// Any other librdkafka property, passed through to every client.
    #[serde(default)]
    pub properties: KafkaProperties,
}

fn yes() -> bool {
    true
}

impl KafkaSettings {
    pub fn is_embedded(&self) -> bool {
        self.brokers == "embedded"
    }
}

/// The URL as it may be shown: [`crate::redact::url`].
pub fn redact_url(raw: &str) -> String {
    crate::redact::url(raw)
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    pub max_active_campaigns: usize,
    pub quantum_min_ms: u64,
    pub quantum_max_ms: u64,
    /// A timed round comes at least this long after the last: one wake-up serves every
    /// campaign due within it (0: a wake-up at each instant a limiter names).
    pub wake_slack_ms: u64,
    /// A permit due this close to a wall-clock second's end leaves at the next second's
    /// start, so that each second counts one 1-s window of permits (0: none held).
    pub second_edge_ms: u64,
    pub stats_flush_ms: u64,
    /// Counts and progress unwritten this long raise the stats backpressure.
    pub stats_max_unwritten_ms: u64,
    /// One database write of the flusher or the outcomes writer, connection included.
    pub write_timeout_ms: u64,
    pub drain_timeout_ms: u64,
    pub max_buffered_jobs: usize,
    pub max_buffered_devices: usize,
    /// Each campaign holds about this much of its sends in memory; later jobs are parked.
    pub lookahead_ms: u64,
    /// Parked jobs (offsets only) before partitions are paused.
    pub max_parked_jobs: usize,
    /// Raw bytes of parked jobs kept in memory (beyond, they are re-read from Kafka).
    pub max_parked_bytes: usize,
    /// Dead letters, invalid tokens and offset records queued for their write at most;
    /// beyond, reading and sending wait for the database.
    pub outcome_queue: usize,
    /// A campaign with no job for this long is forgotten by the worker's maps.
    pub forget_idle_after_ms: u64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimiterSettings {
    #[serde(deserialize_with = "by_name")]
    pub algorithm: Algorithm,
    pub burst: u32,
    /// The rate of a campaign whose first job names none.
    pub send_rate: f64,
    /// A cap over all campaigns of this worker; 0 disables it.
    pub global_rate: f64,
    /// Where a campaign's rate is enforced: this process alone, or shared through Redis.
    #[serde(deserialize_with = "by_name")]
    pub scope: LimiterScope,
    /// Workers sharing a campaign, for lease sizes and the Redis-down fallback rate.
    pub workers_estimate: u32,
    /// A campaign's ramp-up when it sets none, in seconds (0: none; at most 86400).
    pub ramp_up_s: f64,
    /// Where a ramp starts, as a fraction of the full rate (0.01–1).
    pub ramp_from: f64,
    /// A scheduled start is put off by up to this much (at most an hour), so that
    /// campaigns scheduled for one instant do not start together.
    pub start_jitter_ms: u64,
    /// How far `critical` campaigns may go over a shared cap, as a fraction of it (0–1).
    pub critical_overdraft: f64,
}

/// `[redis]`: the store behind `limiter.scope = "redis"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    /// `redis://` or `rediss://` (TLS); may hold `username:password`.
    pub url: SecretString,
    /// The ACL user, over the URL's.
    pub username: Option<String>,
    /// Also `PUSHPACE__REDIS__PASSWORD`; or read from `password_file` at load. Over the
    /// URL's password.
    pub password: Option<SecretString>,
    pub password_file: Option<PathBuf>,
    /// The CA that signs the server's certificate (PEM); without it, the public roots.
    pub ssl_ca_file: Option<PathBuf>,
    /// A client certificate and its key (PEM), for mutual TLS.
    pub ssl_cert_file: Option<PathBuf>,
    pub ssl_key_file: Option<PathBuf>,
    pub connect_timeout_ms: u64,
    #[serde(deserialize_with = "by_name")]
    pub algorithm: RedisAlgorithm,
    /// The slice a lease covers: each lease holds about rate × slice / workers permits.
    pub lease_ms: u64,
    /// Prefix of every key pushpace writes.
    pub key_prefix: String,
}

impl RedisSettings {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// Where and how every Redis client connects (`crate::redis_link::client_for`).
    pub fn target(&self) -> crate::redis_link::RedisTarget {
        crate::redis_link::RedisTarget {
            url: self.url.clone(),
            username: self.username.clone(),
            password: self.password.clone(),
            ca_file: self.ssl_ca_file.clone(),
            cert_file: self.ssl_cert_file.clone(),
            key_file: self.ssl_key_file.clone(),
        }
    }

    /// Reads `password_file` into `password` (one of the two, not both).
    pub(super) fn resolve_secrets(&mut self) -> Result<(), super::ConfigError> {
        if let Some(path) = &self.password_file {
            if self.password.is_some() {
                return Err(super::invalid(
                    "redis.password_file",
                    "set either it or redis.password (PUSHPACE__REDIS__PASSWORD), not both",
                ));
            }
            self.password = Some(super::kafka::read_secret_file("redis.password_file", path)?);
        }
        Ok(())
    }
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(self.url.expose_secret()))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[set]"))
            .field("password_file", &self.password_file)
            .field("ssl_ca_file", &self.ssl_ca_file)
            .field("ssl_cert_file", &self.ssl_cert_file)
            .field("ssl_key_file", &self.ssl_key_file)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .field("algorithm", &self.algorithm)
            .field("lease_ms", &self.lease_ms)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

impl LimiterSettings {
    pub fn default_rate(&self) -> Rate {
        // Validated in `Settings::validate`, so this cannot fail afterwards.
        Rate::per_second(self.send_rate).unwrap_or_else(|_| unreachable_rate())
    }

    pub fn global_rate(&self) -> Option<Rate> {
        (self.global_rate > 0.0)
            .then(|| Rate::per_second(self.global_rate).unwrap_or_else(|_| unreachable_rate()))
    }
}

fn unreachable_rate() -> Rate {
    // Only reachable if a caller built LimiterSettings by hand without validating.
    Rate::per_second(1.0).expect("1/s is a valid rate")
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSettings {
    pub bind: SocketAddr,
    /// Empty means "not configured": mutating endpoints and dead letters are then refused.
    pub admin_token: SecretString,
    /// Host header values accepted besides the bound address (`127.0.0.1:PORT`,
    /// `localhost:PORT`, `[::1]:PORT`): `name` (any port) or `name:port`. In a file a
    /// list; in `PUSHPACE__HTTP__ALLOWED_HOSTS` or `--set`, comma-separated.
    #[serde(default, deserialize_with = "host_list")]
    pub allowed_hosts: Vec<String>,
}

/// A list of hosts, from a TOML array or a comma-separated string (environment, flags).
fn host_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<String>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Hosts {
        List(Vec<String>),
        Text(String),
    }
    let list = match Hosts::deserialize(d)? {
        Hosts::List(l) => l,
        Hosts::Text(t) => t.split(',').map(str::to_string).collect(),
    };
    Ok(list
        .into_iter()
        .map(|h| h.trim().to_string())
        .filter(|h| !h.is_empty())
        .collect())
}

impl HttpSettings {
    pub fn admin_token(&self) -> Option<&str> {
        let t = self.admin_token.expose_secret();
        (!t.is_empty()).then_some(t)
    }
}

impl std::fmt::Debug for HttpSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HttpSettings")
            .field("bind", &self.bind)
            .field("allowed_hosts", &self.allowed_hosts)
            .field(
                "admin_token",
                &if self.admin_token().is_some() {
                    "[set]"
                } else {
                    "[not set]"
                },
            )
            .finish()
    }
}
