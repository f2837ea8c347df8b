//! PostgreSQL persistence: connection, migrations, and (in sub-modules) campaigns,
//! per-second delivery stats, job progress and dead letters.
//!
//! - [`campaigns`]: campaign settings (created by the first job or by the API).
//! - [`delivery`]: per-second series and totals read from `delivery_seconds`.
//! - [`progress`]: how far a job has got, looked up when it is (re)consumed.
//! - [`dead_letters`]: messages and devices that could not be processed.
//! - [`listen`]: [`listen::CampaignWatcher`], campaign settings kept fresh by LISTEN/NOTIFY.
//! - [`prune`](mod@prune): retention.
//!
//! The writes of counts and progress live in [`crate::stats`], which batches them.

pub mod campaigns;
pub mod dead_letters;
pub mod delivery;
pub mod listen;
pub mod progress;
pub mod prune;

pub use campaigns::{Campaign, CampaignDefaults, CampaignPatch, CampaignStatus, CampaignSummary};
pub use dead_letters::{DeadLetter, StoredDeadLetter};
pub use delivery::{series, totals, Point, Totals, MAX_SERIES_RANGE};
pub use listen::{CampaignSnapshot, CampaignWatcher, WatcherConfig};
pub use progress::JobProgress;
pub use prune::{prune, prune_before, PruneReport};

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::str::FromStr;
use std::time::Duration;

/// The migrations in `migrations/`, embedded in the binary.
pub static MIGRATOR: Migrator = sqlx::migrate!("./migrations");

/// Errors at the storage boundary.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("invalid database url: {0}")]
    InvalidUrl(String),
    /// A value was refused, by the Rust validation or by a named CHECK constraint.
    #[error("invalid {field}: {reason}")]
    Invalid { field: &'static str, reason: String },
    #[error("campaign {0:?} not found")]
    CampaignNotFound(String),
    /// A stored value that this version cannot read (e.g. an unknown algorithm name).
    #[error("unreadable {table} row: {reason}")]
    Corrupt { table: &'static str, reason: String },
    #[error("database error: {0}")]
    Database(sqlx::Error),
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
}

impl StoreError {
    /// The field a refused value belongs to, when the error is about one.
    pub fn field(&self) -> Option<&'static str> {
        match self {
            StoreError::Invalid { field, .. } => Some(field),
            _ => None,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        StoreError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// CHECK constraints (named in the migrations) and the field each one guards.
const CONSTRAINT_FIELDS: &[(&str, &str, &str)] = &[
    (
        "campaigns_id_length",
        "id",
        "must be 1 to 128 characters",
    ),
    (
        "campaigns_send_rate_range",
        "send_rate",
        "must be at least 0.001 and at most 10000000 per second",
    ),
    (
        "campaigns_algorithm_known",
        "algorithm",
        "must be one of leaky-bucket, token-bucket, fixed-window, sliding-log, sliding-window, gcra, governor",
    ),
    ("campaigns_burst_range", "burst", "must be 0 to 10000"),
    (
        "campaigns_limiter_scope_known",
        "limiter_scope",
        "must be local, redis or null (the configured default)",
    ),
    (
        "campaigns_status_known",
        "status",
        "must be one of active, paused, done",
    ),
    (
        "delivery_seconds_counts_non_negative",
        "count",
        "counts must be 0 or more",
    ),
    (
        "job_progress_devices_total_non_negative",
        "devices_total",
        "must be 0 or more",
    ),
    (
        "job_progress_devices_done_range",
        "devices_done",
        "must be between 0 and devices_total",
    ),
    (
        "dead_letters_kind_known",
        "kind",
        "must be one of malformed_job, invalid_job, undeliverable",
    ),
    ("dead_letters_raw_size", "raw", "must be at most 1 MiB"),
];

impl From<sqlx::Error> for StoreError {
    /// Maps a CHECK violation (SQLSTATE 23514) on a known constraint to
    /// [`StoreError::Invalid`] naming the field; everything else stays a database error.
    fn from(e: sqlx::Error) -> Self {
        let mapped = e.as_database_error().and_then(|db| {
            if db.code().as_deref() != Some("23514") {
                return None;
            }
            let name = db.constraint()?;
            CONSTRAINT_FIELDS
                .iter()
                .find(|(constraint, _, _)| *constraint == name)
                .map(|(_, field, reason)| StoreError::invalid(field, *reason))
        });
        mapped.unwrap_or(StoreError::Database(e))
    }
}

/// Connection options parsed from a URL, without logging it (it may hold a password).
pub fn connect_options(url: &str) -> Result<PgConnectOptions, StoreError> {
    PgConnectOptions::from_str(url).map_err(|e| StoreError::InvalidUrl(redact_error(e)))
}

fn redact_error(e: sqlx::Error) -> String {
    // sqlx's parse errors do not echo the URL, but keep only the kind to be sure.
    match e {
        sqlx::Error::Configuration(inner) => inner.to_string(),
        other => other.to_string(),
    }
}

/// Opens a pool. `connect_timeout` bounds how long start-up waits for the server.
pub async fn connect(
    url: &str,
    max_connections: u32,
    connect_timeout: Duration,
) -> Result<PgPool, StoreError> {
    let options = connect_options(url)?;
    let pool = PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(connect_timeout)
        .connect_with(options)
        .await?;
    Ok(pool)
}

/// Creates the database named in `url` if it does not exist, connecting to the
/// server's `postgres` maintenance database to do so.
pub async fn ensure_database(url: &str) -> Result<(), StoreError> {
    use sqlx::{ConnectOptions, Connection};
    let options = connect_options(url)?;
    let name = options.get_database().unwrap_or("postgres").to_string();
    let mut conn = options.clone().database("postgres").connect().await?;
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)")
            .bind(&name)
            .fetch_one(&mut conn)
            .await?;
    if !exists {
        // CREATE DATABASE takes no bind parameters; quote the identifier instead.
        let quoted = format!("\"{}\"", name.replace('"', "\"\""));
        let result = sqlx::query(&format!("CREATE DATABASE {quoted}"))
            .execute(&mut conn)
            .await;
        if let Err(e) = result {
            // Another process may have created it between the check and the create.
            let dup = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42P04");
            if !dup {
                return Err(e.into());
            }
        }
    }
    conn.close().await?;
    Ok(())
}

/// Applies every pending migration. Safe to run again: applied ones are skipped.
pub async fn migrate(pool: &PgPool) -> Result<(), StoreError> {
    MIGRATOR.run(pool).await?;
    Ok(())
}

/// Why a message or a device ended in `dead_letters`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadLetterKind {
    /// Not valid JSON (or not UTF-8), or over the size limit.
    MalformedJob,
    /// Valid JSON that breaks the job rules (a field is missing, of the wrong type or out of range).
    InvalidJob,
    /// A device that could not be delivered: a permanent provider failure or too many attempts.
    Undeliverable,
}

impl DeadLetterKind {
    pub fn as_str(self) -> &'static str {
        match self {
            DeadLetterKind::MalformedJob => "malformed_job",
            DeadLetterKind::InvalidJob => "invalid_job",
            DeadLetterKind::Undeliverable => "undeliverable",
        }
    }
}

impl std::str::FromStr for DeadLetterKind {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "malformed_job" => Ok(DeadLetterKind::MalformedJob),
            "invalid_job" => Ok(DeadLetterKind::InvalidJob),
            "undeliverable" => Ok(DeadLetterKind::Undeliverable),
            other => Err(StoreError::Corrupt {
                table: "dead_letters",
                reason: format!("unknown kind {other:?}"),
            }),
        }
    }
}
