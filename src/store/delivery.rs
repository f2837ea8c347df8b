//! Reads of a campaign's per-second series (`delivery_seconds`) and of its lifetime
//! totals (`campaign_totals`, which triggers on `delivery_seconds` keep in the flush's
//! own transaction; retention does not lower them).
//!
//! The writes are batched by [`crate::stats::Flusher`], never done one row per send.

use super::campaigns::truncate_to_second;
use super::StoreError;
use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

/// The longest range [`series`] serves: 24 hours, 86,400 points.
pub const MAX_SERIES_RANGE: Duration = Duration::hours(24);

/// One second of a campaign's series.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct Point {
    /// The start of the second.
    pub t: DateTime<Utc>,
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
    /// Not sent: the token is recorded invalid.
    pub skipped_invalid: i64,
    /// Not sent: over the device's frequency cap.
    pub capped: i64,
    /// The provider said the token is dead.
    pub invalid: i64,
    /// The provider refused it for good, for that device only.
    pub rejected: i64,
}

/// A campaign's counts over all time, including seconds that retention has deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, sqlx::FromRow)]
pub struct Totals {
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
    /// Not sent: the token is recorded invalid.
    pub skipped_invalid: i64,
    /// Not sent: over the device's frequency cap.
    pub capped: i64,
    /// The provider said the token is dead.
    pub invalid: i64,
    /// The provider refused it for good, for that device only.
    pub rejected: i64,
}

/// One point per second in `[from, to)` (both truncated to the second), seconds without
/// a row filled with zeros. Ranges longer than [`MAX_SERIES_RANGE`] are refused.
pub async fn series(
    pool: &PgPool,
    campaign_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Point>, StoreError> {
    let from = truncate_to_second(from);
    let to = truncate_to_second(to);
    if to < from {
        return Err(StoreError::invalid(
            "to",
            format!("the range ends ({to}) before it starts ({from})"),
        ));
    }
    if to - from > MAX_SERIES_RANGE {
        return Err(StoreError::invalid(
            "to",
            format!(
                "the range is {} s long; at most {} s (24 h) can be read at once",
                (to - from).num_seconds(),
                MAX_SERIES_RANGE.num_seconds()
            ),
        ));
    }
    if to == from {
        return Ok(Vec::new());
    }
    let points = sqlx::query_as(
        "SELECT g.t, COALESCE(d.sent, 0) AS sent, COALESCE(d.failed, 0) AS failed, \
                COALESCE(d.retried, 0) AS retried, \
                COALESCE(d.skipped_invalid, 0) AS skipped_invalid, COALESCE(d.capped, 0) AS capped, \
                COALESCE(d.invalid, 0) AS invalid, COALESCE(d.rejected, 0) AS rejected \
         FROM generate_series($2::timestamptz, $3::timestamptz - interval '1 second', \
                              interval '1 second') AS g(t) \
         LEFT JOIN delivery_seconds d ON d.campaign_id = $1 AND d.second = g.t \
         ORDER BY g.t",
    )
    .bind(campaign_id)
    .bind(from)
    .bind(to)
    .fetch_all(pool)
    .await?;
    Ok(points)
}

/// A campaign's counts over all time (zeros when it has none): one index lookup of its
/// (at most two) `campaign_totals` rows.
pub async fn totals(pool: &PgPool, campaign_id: &str) -> Result<Totals, StoreError> {
    let totals = sqlx::query_as(
        "SELECT COALESCE(sum(sent), 0)::int8 AS sent, COALESCE(sum(failed), 0)::int8 AS failed, \
                COALESCE(sum(retried), 0)::int8 AS retried, \
                COALESCE(sum(skipped_invalid), 0)::int8 AS skipped_invalid, \
                COALESCE(sum(capped), 0)::int8 AS capped, \
                COALESCE(sum(invalid), 0)::int8 AS invalid, \
                COALESCE(sum(rejected), 0)::int8 AS rejected \
         FROM campaign_totals WHERE campaign_id = $1",
    )
    .bind(campaign_id)
    .fetch_one(pool)
    .await?;
    Ok(totals)
}
