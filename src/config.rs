//! Layered settings, as zero2prod does it.
//!
//! Layers, lowest first:
//! 1. `config/base.toml`, embedded in the binary so that it runs from anywhere;
//!    a `base.toml` in the config directory replaces the embedded one when present;
//! 2. `config/<PUSHPACE_ENV>.toml` (default `local`; `production` is shipped too);
//! 3. environment variables `PUSHPACE__SECTION__KEY` (e.g. `PUSHPACE__KAFKA__BROKERS`);
//! 4. command-line overrides (`--set section.key=value` and the named flags).
//!
//! The result is deserialised into typed structs and validated once; an invalid value
//! fails start-up with a message naming the key and the reason. Secrets
//! (`http.admin_token`, `database.url`, which may hold a password) are `SecretString`s,
//! so neither `Debug` nor logs ever show them; URLs that are shown (`database.url`,
//! `redis.url`, `sender.url`) go through [`redact_url`] first.

use crate::limiter::{Algorithm, Rate};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

const EMBEDDED_BASE: &str = include_str!("../config/base.toml");
const EMBEDDED_LOCAL: &str = include_str!("../config/local.toml");
const EMBEDDED_PRODUCTION: &str = include_str!("../config/production.toml");

/// Errors while loading settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{key}: {reason}")]
    Invalid { key: &'static str, reason: String },
    /// The loader's message already says everything; not also a `source`, so that
    /// `{:#}` does not print it twice.
    #[error("configuration: {0}")]
    Load(config::ConfigError),
    #[error("--set {0:?}: expected section.key=value")]
    BadOverride(String),
    #[error("environment {env:?}: no file {path} and no embedded default")]
    UnknownEnvironment { env: String, path: PathBuf },
}

impl From<config::ConfigError> for ConfigError {
    fn from(e: config::ConfigError) -> Self {
        ConfigError::Load(e)
    }
}

/// Reads a unit enum from its name with serde's own message for a wrong one, which lists
/// the accepted names; the loader's message names only the wrong one.
fn by_name<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::{value::StrDeserializer, Error};
    let name = String::deserialize(d)?;
    T::deserialize(StrDeserializer::<serde::de::value::Error>::new(&name)).map_err(D::Error::custom)
}

fn invalid(key: &'static str, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key,
        reason: reason.into(),
    }
}

/// All of pushpace's settings.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Settings {
    pub kafka: KafkaSettings,
    pub database: DatabaseSettings,
    pub worker: WorkerSettings,
    pub limiter: LimiterSettings,
    pub sender: SenderSettings,
    pub http: HttpSettings,
    pub redis: RedisSettings,
    #[serde(default)]
    pub hygiene: HygieneSettings,
    #[serde(default)]
    pub capping: CappingSettings,
}

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
}

impl Default for HygieneSettings {
    fn default() -> Self {
        Self {
            enabled: true,
            expected_tokens: 10_000_000,
            false_positive_rate: 0.01,
            reload_ms: 5000,
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
    pub dead_letter_topic: String,
    pub partitions: i32,
    #[serde(deserialize_with = "by_name")]
    pub isolation_level: IsolationLevel,
    pub commit_interval_ms: u64,
    pub session_timeout_ms: u64,
    /// librdkafka's `fetch.wait.max.ms`: how long the broker may hold a fetch that has
    /// too little data.
    pub fetch_wait_max_ms: u64,
    #[serde(deserialize_with = "by_name")]
    pub assignment_strategy: AssignmentStrategy,
}

impl KafkaSettings {
    pub fn is_embedded(&self) -> bool {
        self.brokers == "embedded"
    }
}

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub max_connections: u32,
    pub connect_timeout_ms: u64,
}

impl DatabaseSettings {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// The URL with any password replaced, for logs and messages.
    pub fn url_for_display(&self) -> String {
        redact_url(self.url.expose_secret())
    }

    /// Removes the query parameters the PostgreSQL driver (sqlx) does not understand
    /// (`sslpassword`, `passfile`, …): it would ignore them anyway, but it logs each one
    /// with its value, which may be a secret. Their names alone are logged here.
    fn drop_unsupported_params(&mut self) {
        let Ok(mut u) = url::Url::parse(self.url.expose_secret()) else {
            return;
        };
        if u.query().is_none() {
            return;
        }
        let (kept, dropped): (Vec<_>, Vec<_>) = u
            .query_pairs()
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .partition(|(k, _)| PG_PARAMS.contains(&k.as_str()) || k.starts_with("options["));
        if dropped.is_empty() {
            return;
        }
        let names: Vec<&str> = dropped.iter().map(|(k, _)| k.as_str()).collect();
        tracing::warn!(
            parameters = %names.join(", "),
            "database.url: ignoring query parameters the PostgreSQL driver does not support"
        );
        if kept.is_empty() {
            u.set_query(None);
        } else {
            u.query_pairs_mut().clear().extend_pairs(kept);
        }
        self.url = SecretString::from(u.to_string());
    }
}

/// The query parameters sqlx's PostgreSQL driver reads (besides `options[…]`).
const PG_PARAMS: &[&str] = &[
    "sslmode",
    "ssl-mode",
    "sslrootcert",
    "ssl-root-cert",
    "ssl-ca",
    "sslcert",
    "ssl-cert",
    "sslkey",
    "ssl-key",
    "statement-cache-capacity",
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "password",
    "application_name",
    "options",
];

impl std::fmt::Debug for DatabaseSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DatabaseSettings")
            .field("url", &self.url_for_display())
            .field("max_connections", &self.max_connections)
            .field("connect_timeout_ms", &self.connect_timeout_ms)
            .finish()
    }
}

/// Query parameters whose value is a secret or names where one is kept (libpq's
/// `password`, `sslpassword`, `passfile`, `sslkey`; common token names), compared
/// without case.
const SECRET_PARAMS: &[&str] = &[
    "password",
    "pass",
    "pwd",
    "sslpassword",
    "passfile",
    "sslkey",
    "secret",
    "token",
    "access_token",
    "auth",
    "key",
    "apikey",
    "api_key",
];

/// Replaces the password of a URL, and the value of every query parameter that may hold
/// a secret, with `***`, for logs, messages and `Debug`; unparsable input is hidden whole.
pub fn redact_url(raw: &str) -> String {
    let Ok(mut u) = url::Url::parse(raw) else {
        return "<unparsable url>".to_string();
    };
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let secret = SECRET_PARAMS.iter().any(|s| k.eq_ignore_ascii_case(s));
                let v = if secret { "***".into() } else { v.into_owned() };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    if u.fragment().is_some() {
        u.set_fragment(Some("***"));
    }
    u.to_string()
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkerSettings {
    pub max_active_campaigns: usize,
    pub quantum_min_ms: u64,
    pub quantum_max_ms: u64,
    pub stats_flush_ms: u64,
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
}

/// `limiter.scope`: `local` (each worker applies the full rate) or `redis` (the workers
/// of a consumer group share it; see `crate::distributed`). The default for every
/// campaign; a campaign's own `limiter_scope` (stored, set through the API) wins.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize, serde::Serialize)]
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

/// `redis.algorithm`: how the shared limit is kept in Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum RedisAlgorithm {
    /// GCRA in a Lua script: leases are exact time slots of the campaign's schedule.
    RedisGcra,
    /// Criteo's approximation: per-window counters weighted by the previous window.
    RedisSlidingWindow,
}

/// `[redis]`: the store behind `limiter.scope = "redis"`.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSettings {
    pub url: SecretString,
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
}

impl std::fmt::Debug for RedisSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisSettings")
            .field("url", &redact_url(self.url.expose_secret()))
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SenderKind {
    Http,
    Null,
}

/// `Debug` shows `url` through [`redact_url`]: it may carry a user and password.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenderSettings {
    #[serde(deserialize_with = "by_name")]
    pub kind: SenderKind,
    pub url: String,
    pub timeout_ms: u64,
    pub max_in_flight: usize,
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt (with full jitter) up to `retry_max_ms`.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// Transient failures are given up only after `max_attempts` and this long since
    /// the device's first failure.
    pub give_up_after_ms: u64,
    /// Speak HTTP/2 without negotiation (h2c) to a plain-text provider.
    pub http2_prior_knowledge: bool,
    /// h2c connections; each carries many sends at once.
    pub http2_connections: usize,
    /// The HTTP/1.1 client for an `http://` URL: `hyper` (lean) or `reqwest`.
    #[serde(deserialize_with = "by_name")]
    pub http1_client: crate::sender::Http1Client,
}

impl std::fmt::Debug for SenderSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderSettings")
            .field("kind", &self.kind)
            .field("url", &redact_url(&self.url))
            .field("timeout_ms", &self.timeout_ms)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_attempts", &self.max_attempts)
            .field("retry_base_ms", &self.retry_base_ms)
            .field("retry_max_ms", &self.retry_max_ms)
            .field("give_up_after_ms", &self.give_up_after_ms)
            .field("http2_prior_knowledge", &self.http2_prior_knowledge)
            .field("http2_connections", &self.http2_connections)
            .field("http1_client", &self.http1_client)
            .finish()
    }
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

/// Where to load settings from and what to put on top.
#[derive(Debug, Clone, Default)]
pub struct LoadOptions {
    /// Directory with base.toml and <env>.toml; `config/` when it exists, else embedded only.
    pub config_dir: Option<PathBuf>,
    /// The environment; `PUSHPACE_ENV`, else `local`.
    pub environment: Option<String>,
    /// `section.key=value` pairs, highest precedence.
    pub overrides: Vec<String>,
}

impl Settings {
    /// Loads and validates settings from the layers described in the module doc.
    pub fn load(options: &LoadOptions) -> Result<Settings, ConfigError> {
        Self::load_with_env(options, |k| std::env::var(k).ok(), std::env::vars())
    }

    fn load_with_env(
        options: &LoadOptions,
        var: impl Fn(&str) -> Option<String>,
        vars: impl Iterator<Item = (String, String)>,
    ) -> Result<Settings, ConfigError> {
        use config::{Config, File, FileFormat};

        let environment = options
            .environment
            .clone()
            .or_else(|| var("PUSHPACE_ENV"))
            .unwrap_or_else(|| "local".to_string());
        let dir = options.config_dir.clone().or_else(|| {
            let d = Path::new("config");
            d.join("base.toml").is_file().then(|| d.to_path_buf())
        });

        let mut builder = Config::builder();
        let base_file = dir.as_ref().map(|d| d.join("base.toml"));
        builder = match base_file.filter(|p| p.is_file()) {
            Some(p) => builder.add_source(File::from(p).format(FileFormat::Toml)),
            None => builder.add_source(File::from_str(EMBEDDED_BASE, FileFormat::Toml)),
        };
        let env_file = dir.as_ref().map(|d| d.join(format!("{environment}.toml")));
        builder = match (env_file, environment.as_str()) {
            (Some(p), _) if p.is_file() => {
                builder.add_source(File::from(p).format(FileFormat::Toml))
            }
            (_, "local") => builder.add_source(File::from_str(EMBEDDED_LOCAL, FileFormat::Toml)),
            (_, "production") => {
                builder.add_source(File::from_str(EMBEDDED_PRODUCTION, FileFormat::Toml))
            }
            (p, _) => {
                return Err(ConfigError::UnknownEnvironment {
                    path: p.unwrap_or_else(|| PathBuf::from(format!("{environment}.toml"))),
                    env: environment,
                })
            }
        };
        let env_source = config::Environment::with_prefix("PUSHPACE")
            .prefix_separator("__")
            .separator("__")
            .source(Some(vars.collect()));
        builder = builder.add_source(env_source);
        for pair in &options.overrides {
            let (key, value) = pair
                .split_once('=')
                .filter(|(k, _)| k.contains('.'))
                .ok_or_else(|| ConfigError::BadOverride(pair.clone()))?;
            builder = builder.set_override(key.trim(), value.trim())?;
        }
        let mut settings: Settings = builder.build()?.try_deserialize()?;
        settings.database.drop_unsupported_params();
        settings.validate()?;
        Ok(settings)
    }

    /// Checks every value that its type alone cannot guarantee.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let k = &self.kafka;
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
        for (key, v) in [
            ("kafka.topic", &k.topic),
            ("kafka.group_id", &k.group_id),
            ("kafka.dead_letter_topic", &k.dead_letter_topic),
        ] {
            if v.trim().is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
        }
        if k.topic == k.dead_letter_topic {
            return Err(invalid(
                "kafka.dead_letter_topic",
                "must differ from kafka.topic",
            ));
        }
        if !(1..=1024).contains(&k.partitions) {
            return Err(invalid("kafka.partitions", "must be 1–1024"));
        }
        if k.commit_interval_ms == 0 {
            return Err(invalid("kafka.commit_interval_ms", "must be > 0"));
        }
        // A broker that holds every fetch (tansu) holds a new job this long: 5 s at most.
        if !(1..=5_000).contains(&k.fetch_wait_max_ms) {
            return Err(invalid("kafka.fetch_wait_max_ms", "must be 1–5000"));
        }
        if crate::store::connect_options(self.database.url.expose_secret()).is_err() {
            return Err(invalid(
                "database.url",
                "is not a postgres:// URL (value hidden: it may hold a password)",
            ));
        }
        if self.database.max_connections == 0 {
            return Err(invalid("database.max_connections", "must be > 0"));
        }
        let w = &self.worker;
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
        if !(10..=60_000).contains(&w.stats_flush_ms) {
            return Err(invalid("worker.stats_flush_ms", "must be 10–60000"));
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
        Rate::per_second(self.limiter.send_rate)
            .map_err(|e| invalid("limiter.send_rate", e.to_string()))?;
        if self.limiter.global_rate != 0.0 {
            Rate::per_second(self.limiter.global_rate)
                .map_err(|e| invalid("limiter.global_rate", format!("{e} (or 0 for none)")))?;
        }
        if self.limiter.burst > crate::store::campaigns::MAX_BURST {
            return Err(invalid(
                "limiter.burst",
                format!(
                    "must be 0 to {}, got {}",
                    crate::store::campaigns::MAX_BURST,
                    self.limiter.burst
                ),
            ));
        }
        if !(1..=10_000).contains(&self.limiter.workers_estimate) {
            return Err(invalid("limiter.workers_estimate", "must be 1–10000"));
        }
        let r = &self.redis;
        match url::Url::parse(r.url.expose_secret()) {
            Ok(u) if matches!(u.scheme(), "redis" | "rediss") => {}
            _ => {
                return Err(invalid(
                    "redis.url",
                    "is not a redis:// URL (value hidden: it may hold a password)",
                ))
            }
        }
        if r.connect_timeout_ms == 0 {
            return Err(invalid("redis.connect_timeout_ms", "must be > 0"));
        }
        if !(10..=10_000).contains(&r.lease_ms) {
            return Err(invalid("redis.lease_ms", "must be 10–10000"));
        }
        if r.key_prefix.is_empty() {
            return Err(invalid("redis.key_prefix", "must not be empty"));
        }
        let h = &self.hygiene;
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
        let c = &self.capping;
        if c.enabled {
            if let Err(e) = c.cap_config().validate() {
                return Err(invalid("capping", e.to_string()));
            }
        }
        let s = &self.sender;
        if s.kind == SenderKind::Http {
            match url::Url::parse(&s.url) {
                Ok(u) if matches!(u.scheme(), "http" | "https") => {}
                _ => return Err(invalid("sender.url", "must be an http:// or https:// URL")),
            }
        }
        if s.timeout_ms == 0 {
            return Err(invalid("sender.timeout_ms", "must be > 0"));
        }
        for host in &self.http.allowed_hosts {
            crate::api::auth::HostPattern::parse(host)
                .map_err(|e| invalid("http.allowed_hosts", e))?;
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

#[cfg(test)]
mod tests {
    use super::*;

    fn load(env: &[(&str, &str)], overrides: &[&str]) -> Result<Settings, ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let lookup = env.clone();
        Settings::load_with_env(
            &LoadOptions {
                config_dir: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config")),
                environment: None,
                overrides: overrides.iter().map(|s| s.to_string()).collect(),
            },
            move |k| lookup.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            env.into_iter(),
        )
    }

    #[test]
    fn limiter_scope_names_round_trip() {
        for s in LimiterScope::ALL {
            assert_eq!(s.as_str().parse::<LimiterScope>(), Ok(s));
        }
        assert!("global".parse::<LimiterScope>().is_err());
    }

    #[test]
    fn layers_apply_in_order() {
        let s = load(&[], &[]).unwrap();
        assert_eq!(s.kafka.topic, "pushpace.jobs");
        // local.toml overrides base.toml.
        assert_eq!(s.kafka.isolation_level, IsolationLevel::ReadUncommitted);
        let s = load(&[("PUSHPACE_ENV", "production")], &[]).unwrap();
        assert_eq!(s.kafka.isolation_level, IsolationLevel::ReadCommitted);
        assert_eq!(s.sender.max_in_flight, 2048);
        // Environment beats files; flags beat environment.
        let s = load(
            &[
                ("PUSHPACE__KAFKA__BROKERS", "127.0.0.1:19092"),
                ("PUSHPACE__WORKER__STATS_FLUSH_MS", "500"),
            ],
            &["worker.stats_flush_ms=250"],
        )
        .unwrap();
        assert_eq!(s.kafka.brokers, "127.0.0.1:19092");
        assert_eq!(s.worker.stats_flush_ms, 250);
    }

    #[test]
    fn enum_keys_take_the_documented_names() {
        for name in ["range", "roundrobin", "cooperative-sticky"] {
            let s = load(&[], &[&format!("kafka.assignment_strategy={name}")]).unwrap();
            assert_eq!(s.kafka.assignment_strategy.as_str(), name);
        }
        for name in ["read_committed", "read_uncommitted"] {
            let s = load(&[], &[&format!("kafka.isolation_level={name}")]).unwrap();
            assert_eq!(s.kafka.isolation_level.as_str(), name);
        }
        for scope in LimiterScope::ALL {
            let s = load(&[], &[&format!("limiter.scope={}", scope.as_str())]).unwrap();
            assert_eq!(s.limiter.scope, scope);
        }
        for a in Algorithm::ALL {
            let s = load(&[], &[&format!("limiter.algorithm={}", a.as_str())]).unwrap();
            assert_eq!(s.limiter.algorithm, a);
        }
    }

    #[test]
    fn invalid_values_name_the_key() {
        let e = load(&[("PUSHPACE__KAFKA__TOPIC", " ")], &[]).unwrap_err();
        assert_eq!(e.to_string(), "kafka.topic: must not be empty");
        let e = load(&[], &["limiter.send_rate=0"]).unwrap_err();
        assert!(e.to_string().starts_with("limiter.send_rate: "), "{e}");
        let e = load(&[], &["worker.quantum_max_ms=5"]).unwrap_err();
        assert!(e.to_string().starts_with("worker.quantum_max_ms"), "{e}");
        for bad in ["0", "5001"] {
            let e = load(&[("PUSHPACE__KAFKA__FETCH_WAIT_MAX_MS", bad)], &[]).unwrap_err();
            assert_eq!(e.to_string(), "kafka.fetch_wait_max_ms: must be 1–5000");
        }
        let e = load(&[], &["limiter.algorithm=magic"]).unwrap_err();
        assert!(e.to_string().contains("magic"), "{e}");
        let e = load(&[("PUSHPACE__SENDER__HTTP1_CLIENT", "curl")], &[]).unwrap_err();
        let chain = format!("{:#}", anyhow::Error::from(e));
        assert!(chain.contains("sender.http1_client"), "{chain}");
        assert_eq!(chain.matches("curl").count(), 1, "said once: {chain}");
        assert!(
            chain.contains("`hyper` or `reqwest`"),
            "lists the names: {chain}"
        );
        let e = load(&[], &["kafka.assignment_strategy=sticky"]).unwrap_err();
        let text = e.to_string();
        for name in [
            "kafka.assignment_strategy",
            "sticky",
            "`cooperative-sticky`",
        ] {
            assert!(text.contains(name), "{name}: {text}");
        }
        let e = load(&[("PUSHPACE_ENV", "nowhere")], &[]).unwrap_err();
        assert!(e.to_string().contains("nowhere"), "{e}");
    }

    #[test]
    fn url_secrets_are_redacted() {
        assert_eq!(
            redact_url("https://u:p4ss@push.example:8443/v1?token=t0k&x=1#frag"),
            "https://u:***@push.example:8443/v1?token=***&x=1#***"
        );
        assert_eq!(
            redact_url(
                "postgres://app@db/x?sslmode=require&PASSWORD=a&sslpassword=b&passfile=%2Fp"
            ),
            "postgres://app@db/x?sslmode=require&PASSWORD=***&sslpassword=***&passfile=***"
        );
        assert_eq!(redact_url("http://h/p"), "http://h/p");
        assert_eq!(redact_url("not a url"), "<unparsable url>");

        let s = load(
            &[
                (
                    "PUSHPACE__SENDER__URL",
                    "https://user:Sender-Pa55@push.example/send",
                ),
                (
                    "PUSHPACE__DATABASE__URL",
                    "postgres://app@127.0.0.1/x?password=Q-Pa55&sslpassword=K-Pa55&passfile=%2Fpf-X9",
                ),
            ],
            &[],
        )
        .unwrap();
        let dbg = format!("{s:?}");
        for secret in ["Sender-Pa55", "Q-Pa55", "K-Pa55", "pf-X9"] {
            assert!(!dbg.contains(secret), "{secret}: {dbg}");
        }
        assert!(dbg.contains("user:***@push.example"), "{dbg}");
        // The driver's own parameters stay (password still reaches it); the ones it
        // would log and ignore are dropped.
        assert_eq!(
            s.database.url.expose_secret(),
            "postgres://app@127.0.0.1/x?password=Q-Pa55"
        );
        assert_eq!(s.sender.url, "https://user:Sender-Pa55@push.example/send");
    }

    #[test]
    fn rates_bursts_and_hosts_are_bounded() {
        for bad in ["0.0009", "1e-300"] {
            let e = load(&[], &[&format!("limiter.send_rate={bad}")]).unwrap_err();
            assert!(e.to_string().contains("at least 0.001"), "{e}");
            let e = load(&[], &[&format!("limiter.global_rate={bad}")]).unwrap_err();
            assert!(e.to_string().starts_with("limiter.global_rate: "), "{e}");
        }
        assert!(load(&[], &["limiter.send_rate=0.001"]).is_ok());
        assert!(load(&[], &["limiter.burst=10000"]).is_ok());
        for bad in ["10001", "2147483647"] {
            let e = load(&[], &[&format!("limiter.burst={bad}")]).unwrap_err();
            assert_eq!(
                e.to_string(),
                format!("limiter.burst: must be 0 to 10000, got {bad}")
            );
        }
        let s = load(
            &[("PUSHPACE__HTTP__ALLOWED_HOSTS", "a.example, b.example:9000")],
            &[],
        )
        .unwrap();
        assert_eq!(s.http.allowed_hosts, ["a.example", "b.example:9000"]);
        assert!(load(&[], &[]).unwrap().http.allowed_hosts.is_empty());
        for bad in ["http://a.example", "a.example/x", "a.example:port"] {
            let e = load(&[], &[&format!("http.allowed_hosts={bad}")]).unwrap_err();
            assert!(e.to_string().starts_with("http.allowed_hosts: "), "{e}");
        }
    }

    #[test]
    fn secrets_stay_out_of_debug() {
        let s = load(
            &[
                ("PUSHPACE__HTTP__ADMIN_TOKEN", "tok-very-secret"),
                (
                    "PUSHPACE__DATABASE__URL",
                    "postgres://app:hunter2@127.0.0.1:5432/pushpace",
                ),
            ],
            &[],
        )
        .unwrap();
        let dbg = format!("{s:?}");
        assert!(!dbg.contains("tok-very-secret"), "{dbg}");
        assert!(!dbg.contains("hunter2"), "{dbg}");
        assert_eq!(s.http.admin_token(), Some("tok-very-secret"));
        assert_eq!(
            s.database.url_for_display(),
            "postgres://app:***@127.0.0.1:5432/pushpace"
        );
    }
}
