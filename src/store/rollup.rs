//! Rollup: per-second counts older than `database.rollup_after_ms` become per-minute
//! counts (`delivery_minutes`), so that long history stays cheap to keep and to chart.
//!
//! Each batch is ONE statement: it deletes up to `batch` old seconds and adds their sums
//! into their minutes, so a count is in exactly one of the two tables whatever fails or
//! runs concurrently. A DELETE fires no trigger on `delivery_seconds` (there is none for
//! it), so `campaign_totals` does not change. Rows a flush holds locked are skipped
//! (`SKIP LOCKED`) and rolled up by a later run; a flush that adds into an old second the
//! batch holds waits for that batch only, and then inserts the second anew, which a later
//! rollup adds into the same minute.

use super::StoreError;
use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

/// What a rollup did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct RollupReport {
    /// `delivery_seconds` rows deleted (their counts now in minutes).
    pub seconds_rolled: u64,
    /// `delivery_minutes` rows inserted or added into.
    pub minutes_written: u64,
    /// Statements run (each its own transaction).
    pub batches: u64,
}

/// One batch; see the module docs. Minutes are written in key order, so that two
/// rollups running at once lock them in the same order and cannot deadlock.
const ROLL_UP_BATCH: &str = "\
WITH moved AS (
    DELETE FROM delivery_seconds WHERE (campaign_id, second) IN (
        SELECT campaign_id, second FROM delivery_seconds WHERE second < $1
        LIMIT $2 FOR UPDATE SKIP LOCKED)
    RETURNING campaign_id, second, sent, failed, retried, skipped_invalid, capped, invalid,
              rejected, expired, cancelled
), minutes AS (
    INSERT INTO delivery_minutes AS m
        (campaign_id, minute, sent, failed, retried, skipped_invalid, capped, invalid,
         rejected, expired, cancelled)
    SELECT campaign_id, date_bin('1 minute', second, TIMESTAMPTZ '2000-01-01 00:00:00+00'),
           sum(sent), sum(failed), sum(retried), sum(skipped_invalid), sum(capped),
           sum(invalid), sum(rejected), sum(expired), sum(cancelled)
    FROM moved
    GROUP BY 1, 2
    ORDER BY 1, 2
    ON CONFLICT (campaign_id, minute) DO UPDATE SET
        sent = m.sent + EXCLUDED.sent,
        failed = m.failed + EXCLUDED.failed,
        retried = m.retried + EXCLUDED.retried,
        skipped_invalid = m.skipped_invalid + EXCLUDED.skipped_invalid,
        capped = m.capped + EXCLUDED.capped,
        invalid = m.invalid + EXCLUDED.invalid,
        rejected = m.rejected + EXCLUDED.rejected,
        expired = m.expired + EXCLUDED.expired,
        cancelled = m.cancelled + EXCLUDED.cancelled
    RETURNING 1
)
SELECT (SELECT count(*) FROM moved), (SELECT count(*) FROM minutes)";

/// Rolls up the seconds older than `older_than` before now; see [`roll_up_before`].
pub async fn roll_up(
    pool: &PgPool,
    older_than: Duration,
    batch: i64,
) -> Result<RollupReport, StoreError> {
    if older_than < Duration::zero() {
        return Err(StoreError::invalid(
            "rollup_after",
            format!("must not be negative, got {older_than}"),
        ));
    }
    let cutoff = Utc::now()
        .checked_sub_signed(older_than)
        .unwrap_or(DateTime::<Utc>::MIN_UTC);
    roll_up_before(pool, cutoff, batch).await
}

/// Rolls up every second before `cutoff` (moved down to a whole minute, so that a minute
/// is rolled up whole), `batch` rows per statement, until none is left.
pub async fn roll_up_before(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<RollupReport, StoreError> {
    let mut report = RollupReport::default();
    loop {
        let (seconds, minutes) = roll_up_batch(pool, cutoff, batch).await?;
        report.seconds_rolled += seconds;
        report.minutes_written += minutes;
        report.batches += 1;
        if seconds < batch.unsigned_abs() {
            return Ok(report);
        }
    }
}

/// One batch: up to `batch` seconds before `cutoff` (moved down to a whole minute) rolled
/// into their minutes. Returns the seconds deleted and the minutes written.
pub async fn roll_up_batch(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<(u64, u64), StoreError> {
    if batch < 1 {
        return Err(StoreError::invalid(
            "batch",
            format!("must be at least 1, got {batch}"),
        ));
    }
    let (seconds, minutes): (i64, i64) = sqlx::query_as(ROLL_UP_BATCH)
        .bind(whole_minute(cutoff))
        .bind(batch)
        .fetch_one(pool)
        .await?;
    Ok((seconds.unsigned_abs(), minutes.unsigned_abs()))
}

/// `t` moved down to the start of its minute.
pub fn whole_minute(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp().div_euclid(60) * 60, 0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cutoffs_move_down_to_a_whole_minute() {
        let t = |s: i64| DateTime::from_timestamp(s, 0).unwrap();
        assert_eq!(whole_minute(t(120)), t(120));
        assert_eq!(whole_minute(t(179)), t(120));
        assert_eq!(whole_minute(t(-1)), t(-60));
        let sub = DateTime::from_timestamp(61, 999_000_000).unwrap();
        assert_eq!(whole_minute(sub), t(60));
    }
}
