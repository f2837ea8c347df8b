//! `[database]`: where PostgreSQL is and how to reach it (TLS, password), for every
//! connection pushpace opens: the worker's pool (and the LISTEN and loaders made from
//! it), `migrate`, the CLI's `stats`, the demo and the bench.

use super::{invalid, redact_url, ConfigError};
use crate::store::StoreError;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use sqlx::postgres::{PgConnectOptions, PgSslMode};
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DatabaseSettings {
    pub url: SecretString,
    pub max_connections: u32,
    pub connect_timeout_ms: u64,
    /// `stats prune` rolls per-second counts older than this into per-minute ones.
    #[serde(default = "default_rollup_after_ms")]
    pub rollup_after_ms: u64,
    /// disable | prefer | require | verify-ca | verify-full, over the URL's `sslmode`.
    #[serde(default)]
    pub sslmode: Option<String>,
    /// The CA that signs the server's certificate (PEM), over the URL's `sslrootcert`;
    /// without either, verify-ca and verify-full use the public roots.
    #[serde(default)]
    pub sslrootcert: Option<PathBuf>,
    /// A client certificate and its key (PEM), for servers that ask for one.
    #[serde(default)]
    pub sslcert: Option<PathBuf>,
    #[serde(default)]
    pub sslkey: Option<PathBuf>,
    /// Also `PUSHPACE__DATABASE__PASSWORD`; or read from `password_file` at load. Over
    /// the URL's password.
    #[serde(default)]
    pub password: Option<SecretString>,
    #[serde(default)]
    pub password_file: Option<PathBuf>,
}

/// 48 h: two days of per-second charts, then minutes.
fn default_rollup_after_ms() -> u64 {
    48 * 3_600_000
}

impl DatabaseSettings {
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_millis(self.connect_timeout_ms)
    }

    /// [`DatabaseSettings::rollup_after_ms`] as a span.
    pub fn rollup_after(&self) -> chrono::Duration {
        i64::try_from(self.rollup_after_ms)
            .ok()
            .and_then(chrono::Duration::try_milliseconds)
            .unwrap_or(chrono::Duration::MAX)
    }

    /// The URL with any password replaced, for logs and messages.
    pub fn url_for_display(&self) -> String {
        redact_url(self.url.expose_secret())
    }

    /// The URL's options with the keys of this section over them. Every connection
    /// pushpace opens starts from these (or from a pool made with them).
    pub fn connect_options(&self) -> Result<PgConnectOptions, StoreError> {
        let mut options = crate::store::connect_options(self.url.expose_secret())?;
        if let Some(mode) = &self.sslmode {
            options = options.ssl_mode(parse_sslmode(mode).map_err(StoreError::InvalidUrl)?);
        }
        if let Some(path) = &self.sslrootcert {
            options = options.ssl_root_cert(path);
        }
        if let Some(path) = &self.sslcert {
            options = options.ssl_client_cert(path);
        }
        if let Some(path) = &self.sslkey {
            options = options.ssl_client_key(path);
        }
        if let Some(password) = &self.password {
            options = options.password(password.expose_secret());
        }
        Ok(options)
    }

    /// [`DatabaseSettings::connect_options`] for another database of the same server.
    pub fn connect_options_for(&self, database: &str) -> Result<PgConnectOptions, StoreError> {
        Ok(self.connect_options()?.database(database))
    }

    /// A pool of `max_connections`, waiting at most `connect_timeout_ms` for the server.
    pub async fn connect(&self) -> Result<sqlx::PgPool, StoreError> {
        crate::store::connect_with(
            self.connect_options()?,
            self.max_connections,
            self.connect_timeout(),
        )
        .await
    }

    /// Reads `password_file` into `password` (one of the two, not both).
    pub(super) fn resolve_secrets(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.password_file {
            if self.password.is_some() {
                return Err(invalid(
                    "database.password_file",
                    "set either it or database.password (PUSHPACE__DATABASE__PASSWORD), not both",
                ));
            }
            let secret = super::kafka::read_secret_file("database.password_file", path)?;
            self.password = Some(secret);
        }
        Ok(())
    }

    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        if crate::store::connect_options(self.url.expose_secret()).is_err() {
            return Err(invalid(
                "database.url",
                "is not a postgres:// URL (value hidden: it may hold a password)",
            ));
        }
        if self.max_connections == 0 {
            return Err(invalid("database.max_connections", "must be > 0"));
        }
        // Below a day, per-second series (up to 24 h) would miss their rolled-up part.
        if !(86_400_000..=31_536_000_000).contains(&self.rollup_after_ms) {
            return Err(invalid(
                "database.rollup_after_ms",
                "must be 86400000–31536000000 (1 day to 365 days)",
            ));
        }
        self.validate_tls()
    }

    /// A known sslmode; readable files; a client certificate with its key.
    fn validate_tls(&self) -> Result<(), ConfigError> {
        if let Some(mode) = &self.sslmode {
            parse_sslmode(mode).map_err(|e| invalid("database.sslmode", e))?;
        }
        // sqlx 0.8.6 skips the name check of verify-ca by matching rustls's old
        // NotValidForName error, which rustls 0.23 now reports as NotValidForNameContext:
        // verify-ca would check the name after all. Refused rather than mislabelled.
        let mode = self.connect_options().map(|o| o.get_ssl_mode());
        if matches!(mode, Ok(PgSslMode::VerifyCa)) {
            return Err(invalid(
                "database.sslmode",
                "verify-ca is not available (the driver checks the host name anyway): \
                 use verify-full with a host the certificate names, or require",
            ));
        }
        let files = [
            ("database.sslrootcert", &self.sslrootcert),
            ("database.sslcert", &self.sslcert),
            ("database.sslkey", &self.sslkey),
        ];
        for (key, file) in files {
            if let Some(path) = file.as_ref().filter(|p| !p.is_file()) {
                return Err(invalid(
                    key,
                    format!("{} is not a readable file", path.display()),
                ));
            }
        }
        if self.sslcert.is_some() != self.sslkey.is_some() {
            return Err(invalid(
                "database.sslkey",
                "a client certificate needs both database.sslcert and database.sslkey",
            ));
        }
        Ok(())
    }

    /// Removes the query parameters the PostgreSQL driver (sqlx) does not understand
    /// (`sslpassword`, `passfile`, …): it would ignore them anyway, but it logs each one
    /// with its value, which may be a secret. Their names alone are logged here.
    pub(super) fn drop_unsupported_params(&mut self) {
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

fn parse_sslmode(mode: &str) -> Result<PgSslMode, String> {
    PgSslMode::from_str(mode)
        .map_err(|_| format!("{mode:?} is not one of disable, allow, prefer, require, verify-full"))
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
            .field("rollup_after_ms", &self.rollup_after_ms)
            .field("sslmode", &self.sslmode)
            .field("sslrootcert", &self.sslrootcert)
            .field("sslcert", &self.sslcert)
            .field("sslkey", &self.sslkey)
            .field("password", &self.password.as_ref().map(|_| "[set]"))
            .field("password_file", &self.password_file)
            .finish()
    }
}
