//! PostgreSQL persistence: connection, migrations, and (in sub-modules) campaigns,
//! per-second delivery stats, job progress and dead letters.
//!
//! - [`campaigns`]: campaign settings (created by the first job or by the API).
//! - [`campaign_list`]: the API's list, paged by keyset.
//! - [`delivery`]: per-second series and totals read from `delivery_seconds`, and long
//!   series that read `delivery_minutes` for their rolled-up part.
//! - [`rollup`]: old seconds rolled into minutes.
//! - [`progress`]: how far a job has got, looked up when it is (re)consumed.
//! - [`dead_letters`]: messages and devices that could not be processed.
//! - [`listen`]: [`listen::CampaignWatcher`], campaign settings kept fresh by LISTEN/NOTIFY.
//! - [`offsets`]: the Kafka offsets committed, for retention.
//! - [`prune`](mod@prune): retention.
//!
//! The writes of counts and progress live in [`crate::stats`], which batches them.

pub mod campaign_list;
pub mod campaigns;
pub mod dead_letters;
pub mod delivery;
pub mod events;
pub mod flush;
pub mod listen;
pub mod offsets;
pub mod progress;
pub mod prune;
pub mod rollup;
pub mod worker_campaigns;

pub use crate::job::DeadLetterKind;
pub use campaigns::{Campaign, CampaignDefaults, CampaignPatch, CampaignStatus, CampaignSummary};
pub use dead_letters::{DeadLetter, StoredDeadLetter};
pub use delivery::{series, totals, Point, Totals, MAX_SERIES_RANGE};
pub use listen::{CampaignSnapshot, CampaignWatcher, WatcherConfig};
pub use progress::JobProgress;
pub use prune::{
    prune, prune_before, prune_dead_letters_before, prune_with_dead_letters, PruneReport,
};

use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::PgPool;
use std::borrow::Cow;
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

    /// Whether the same operation may succeed if retried later: a lost or refused
    /// connection, a pool that timed out, a serialization failure or deadlock, a server
    /// short of resources or shutting down, a lock not available. Everything else (a
    /// value the database refuses, a constraint, a closed pool, a bad URL) fails again
    /// the same way, so retrying it would stall whatever waits on it.
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Database(e) => sqlx_is_transient(e),
            StoreError::Migrate(
                sqlx::migrate::MigrateError::Execute(e)
                | sqlx::migrate::MigrateError::ExecuteMigration(e, _),
            ) => sqlx_is_transient(e),
            StoreError::InvalidUrl(_)
            | StoreError::Invalid { .. }
            | StoreError::CampaignNotFound(_)
            | StoreError::Corrupt { .. }
            | StoreError::Migrate(_) => false,
        }
    }

    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        StoreError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// See [`StoreError::is_transient`].
pub fn sqlx_is_transient(e: &sqlx::Error) -> bool {
    match e {
        // The connection broke (or its TLS or wire protocol did): a new one may work.
        sqlx::Error::Io(_) | sqlx::Error::Tls(_) | sqlx::Error::Protocol(_) => true,
        sqlx::Error::PoolTimedOut => true,
        sqlx::Error::Database(db) => db.code().is_some_and(|c| sqlstate_is_transient(&c)),
        _ => false,
    }
}

/// Whether a SQLSTATE names a condition that can pass: class 08 (connection exception),
/// 40001 (serialization failure), 40P01 (deadlock), class 53 (insufficient resources),
/// 57014 (a statement cancelled: a server's statement_timeout, or an operator),
/// 57P01/57P02/57P03 (server shutting down or starting), 55P03 (lock not available).
/// Data errors (class 22) and constraint violations (class 23) are not.
pub fn sqlstate_is_transient(code: &str) -> bool {
    matches!(
        code,
        "40001" | "40P01" | "57014" | "57P01" | "57P02" | "57P03" | "55P03"
    ) || (code.len() == 5 && (code.starts_with("08") || code.starts_with("53")))
}

/// A text that PostgreSQL stores whatever it holds: U+0000 (which a `text` value cannot
/// hold: SQLSTATE 22021) becomes the two visible characters `\0`. Nothing else changes,
/// so a `\0` already in the text reads the same as an escaped NUL. In a UTF-8 database
/// (what [`migrate`] expects) every other character is accepted.
pub fn safe_text(s: &str) -> Cow<'_, str> {
    if s.contains('\0') {
        Cow::Owned(s.replace('\0', "\\0"))
    } else {
        Cow::Borrowed(s)
    }
}

/// [`safe_text`] of the longest prefix of `s` whose escaped form is at most `max_bytes`
/// long, cut on a character boundary (never inside an escape).
pub fn safe_text_capped(s: &str, max_bytes: usize) -> Cow<'_, str> {
    let mut len = 0;
    let mut end = s.len();
    for (i, c) in s.char_indices() {
        let width = if c == '\0' { 2 } else { c.len_utf8() };
        if len + width > max_bytes {
            end = i;
            break;
        }
        len += width;
    }
    safe_text(&s[..end])
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
        "must be one of active, paused, done, halted, cancelled",
    ),
    (
        "campaigns_expires_after_start",
        "expires_at",
        "must be after start_at",
    ),
    (
        "campaigns_priority_known",
        "priority",
        "must be one of critical, high, normal, bulk",
    ),
    (
        "campaigns_ramp_up_s_range",
        "ramp_up_s",
        "must be from 0 to 86400 seconds, or null (the configured default)",
    ),
    (
        "campaigns_ramp_from_range",
        "ramp_from",
        "must be from 0.01 to 1, or null (the configured default)",
    ),
    (
        "delivery_seconds_counts_non_negative",
        "count",
        "counts must be 0 or more",
    ),
    (
        "delivery_minutes_counts_non_negative",
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
        "must be one of malformed_job, invalid_job, undeliverable, expired_offset, expired",
    ),
    ("dead_letters_raw_size", "raw", "must be at most 1 MiB"),
    (
        "dead_letters_kafka_key_size",
        "key",
        "must be at most 64 KiB, with its length 0 or more",
    ),
    ("dead_letters_device_non_negative", "device", "must be 0 or more"),
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
    connect_with(connect_options(url)?, max_connections, connect_timeout).await
}

/// [`connect`] with options already made (`DatabaseSettings::connect_options`: TLS and
/// password from `[database]`).
pub async fn connect_with(
    options: PgConnectOptions,
    max_connections: u32,
    connect_timeout: Duration,
) -> Result<PgPool, StoreError> {
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
    ensure_database_with(connect_options(url)?).await
}

/// [`ensure_database`] with options already made.
pub async fn ensure_database_with(options: PgConnectOptions) -> Result<(), StoreError> {
    use sqlx::{ConnectOptions, Connection};
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

// Parsed here: the store reads kinds back from `dead_letters`.
impl std::str::FromStr for DeadLetterKind {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "malformed_job" => Ok(DeadLetterKind::MalformedJob),
            "invalid_job" => Ok(DeadLetterKind::InvalidJob),
            "undeliverable" => Ok(DeadLetterKind::Undeliverable),
            "expired_offset" => Ok(DeadLetterKind::ExpiredOffset),
            "expired" => Ok(DeadLetterKind::Expired),
            "unknown_app" => Ok(DeadLetterKind::UnknownApp),
            other => Err(StoreError::Corrupt {
                table: "dead_letters",
                reason: format!("unknown kind {other:?}"),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sqlstates_that_can_pass_are_transient() {
        for code in [
            "08000", "08003", "08006", "08001", "08004", "08P01", "40001", "40P01", "53000",
            "53100", "53200", "53300", "53400", "57014", "57P01", "57P02", "57P03", "55P03",
        ] {
            assert!(sqlstate_is_transient(code), "{code}");
        }
    }

    #[test]
    fn data_errors_and_the_rest_are_not_transient() {
        for code in [
            "22021", "22001", "22P02", "22P05", "23505", "23514", "23502", "40000", "40002",
            "40003", "42P01", "42601", "55000", "55006", "57P04", "XX000", "08", "530", "",
            "0800000",
        ] {
            assert!(!sqlstate_is_transient(code), "{code}");
        }
    }

    #[test]
    fn connection_and_pool_errors_are_transient_but_a_closed_pool_is_not() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionReset, "reset");
        assert!(StoreError::Database(sqlx::Error::Io(io)).is_transient());
        assert!(StoreError::Database(sqlx::Error::Tls("handshake".into())).is_transient());
        assert!(StoreError::Database(sqlx::Error::Protocol("eof".into())).is_transient());
        assert!(StoreError::Database(sqlx::Error::PoolTimedOut).is_transient());
        assert!(!StoreError::Database(sqlx::Error::PoolClosed).is_transient());
        assert!(!StoreError::Database(sqlx::Error::RowNotFound).is_transient());
        assert!(!StoreError::Database(sqlx::Error::Decode("bad".into())).is_transient());
        assert!(StoreError::from(sqlx::Error::PoolTimedOut).is_transient());
        let migrate = sqlx::migrate::MigrateError::Execute(sqlx::Error::PoolTimedOut);
        assert!(StoreError::Migrate(migrate).is_transient());
        assert!(
            !StoreError::Migrate(sqlx::migrate::MigrateError::VersionMissing(1)).is_transient()
        );
        assert!(!StoreError::invalid("kind", "unknown").is_transient());
        assert!(!StoreError::InvalidUrl("x".into()).is_transient());
        assert!(!StoreError::CampaignNotFound("c".into()).is_transient());
    }

    #[test]
    fn safe_text_makes_nul_visible_and_leaves_the_rest() {
        assert!(matches!(safe_text("plain ünïcode ✓"), Cow::Borrowed(_)));
        assert_eq!(safe_text("plain ünïcode ✓"), "plain ünïcode ✓");
        assert_eq!(safe_text("a\0b\0"), "a\\0b\\0");
        assert_eq!(safe_text("\0"), "\\0");
        assert_eq!(safe_text(""), "");
        // Other control characters and backslashes are valid text: kept as they are.
        assert_eq!(safe_text("tab\there \\ \u{1}"), "tab\there \\ \u{1}");
        assert!(!safe_text("x\0y").contains('\0'));
    }

    #[test]
    fn safe_text_capped_cuts_on_a_character_and_never_inside_an_escape() {
        assert_eq!(safe_text_capped("abcdef", 4), "abcd");
        assert_eq!(safe_text_capped("abc", 10), "abc");
        // "é" is two bytes: a cap inside it drops it whole.
        assert_eq!(safe_text_capped("aé", 2), "a");
        assert_eq!(safe_text_capped("aé", 3), "aé");
        // The escape takes two bytes: a cap of 2 after "a" cannot hold it.
        assert_eq!(safe_text_capped("a\0b", 2), "a");
        assert_eq!(safe_text_capped("a\0b", 3), "a\\0");
        assert_eq!(safe_text_capped("a\0b", 4), "a\\0b");
        assert_eq!(safe_text_capped("\0\0\0", 5), "\\0\\0");
        assert_eq!(safe_text_capped("anything", 0), "");
        let long = "€".repeat(2000);
        let capped = safe_text_capped(&long, 4096);
        assert_eq!(
            capped.len(),
            4095,
            "1365 three-byte characters fit in 4096 bytes"
        );
    }

    #[test]
    fn dead_letter_kinds_round_trip() {
        for kind in [
            DeadLetterKind::MalformedJob,
            DeadLetterKind::InvalidJob,
            DeadLetterKind::Undeliverable,
            DeadLetterKind::ExpiredOffset,
            DeadLetterKind::Expired,
            DeadLetterKind::UnknownApp,
        ] {
            assert_eq!(kind.as_str().parse::<DeadLetterKind>().unwrap(), kind);
            let json = serde_json::to_string(&kind).unwrap();
            assert_eq!(json, format!("\"{}\"", kind.as_str()));
        }
        assert_eq!(DeadLetterKind::ExpiredOffset.as_str(), "expired_offset");
        assert!("expiry".parse::<DeadLetterKind>().is_err());
    }
}
