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
//!
//! `[providers.<name>]` sections (see [`providers`]) are read into one flat struct each
//! and checked into the typed specs of [`crate::provider::settings`]: key files are read
//! and parsed once, at load, and never shown.
//!
//! Submodules: [`sections`] (the plain sections), [`sender`] (`[sender]`), [`providers`]
//! and [`keys`] (named providers and their key material), `validate` (the checks).

mod apps;
mod database;
pub mod kafka;
mod keys;
pub mod providers;
mod sections;
mod sender;
#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_database;
#[cfg(test)]
mod tests_kafka;
#[cfg(test)]
mod tests_providers;
mod validate;

pub use apps::AppsSettings;
pub use database::DatabaseSettings;
pub use sections::*;
pub use sender::*;

use crate::provider::settings::NamedProvider;
use serde::Deserialize;
use std::path::{Path, PathBuf};

const EMBEDDED_BASE: &str = include_str!("../../config/base.toml");
const EMBEDDED_LOCAL: &str = include_str!("../../config/local.toml");
const EMBEDDED_PRODUCTION: &str = include_str!("../../config/production.toml");

/// Errors while loading settings.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{key}: {reason}")]
    Invalid { key: String, reason: String },
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
pub(crate) fn by_name<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    use serde::de::{value::StrDeserializer, Error};
    let name = String::deserialize(d)?;
    T::deserialize(StrDeserializer::<serde::de::value::Error>::new(&name)).map_err(D::Error::custom)
}

/// [`ConfigError::Invalid`] for code outside `config` that checks a key.
pub fn invalid_key(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    invalid(key, reason)
}

pub(crate) fn invalid(key: impl Into<String>, reason: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// All of pushpace's settings. `Debug` (what `pushpace config` prints) shows no secret.
#[derive(Clone, Deserialize)]
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
    /// `[apps]`: the app registry's master keys (src/config/apps.rs).
    #[serde(default)]
    pub apps: AppsSettings,
    /// Every provider, checked: first the implicit `webhook` of `[sender]`, then the
    /// `[providers.<name>]` sections by name. Filled by [`Settings::load`].
    #[serde(skip)]
    pub providers: Vec<NamedProvider>,
    /// `[providers.*]` is read separately, into [`providers::ProviderSection`]s.
    #[serde(default, rename = "providers")]
    _provider_sections: serde::de::IgnoredAny,
}

impl std::fmt::Debug for Settings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Settings")
            .field("kafka", &self.kafka)
            .field("database", &self.database)
            .field("worker", &self.worker)
            .field("limiter", &self.limiter)
            .field("sender", &self.sender)
            .field("http", &self.http)
            .field("redis", &self.redis)
            .field("hygiene", &self.hygiene)
            .field("capping", &self.capping)
            .field("apps", &self.apps)
            .field("providers", &self.providers)
            .finish()
    }
}

impl Settings {
    /// The provider named `name`.
    pub fn provider(&self, name: &str) -> Option<&NamedProvider> {
        self.providers.iter().find(|p| p.name == name)
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
        let built = builder.build()?;
        let sections = providers::sections(&built)?;
        let mut settings: Settings = built.try_deserialize()?;
        settings.database.drop_unsupported_params();
        settings.database.resolve_secrets()?;
        settings.kafka.resolve_secrets()?;
        settings.redis.resolve_secrets()?;
        settings.validate()?;
        settings.providers = providers::build(&settings.sender, sections)?;
        settings.validate_drain()?;
        Ok(settings)
    }
}
