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
    /// Not sent by the campaign's or the job's expiry.
    pub expired: i64,
    /// Not sent: the campaign was cancelled.
    pub cancelled: i64,
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
    /// Not sent by the campaign's or the job's expiry.
    pub expired: i64,
    /// Not sent: the campaign was cancelled.
    pub cancelled: i64,
}

/// One point per second in `[from, to)` (both truncated to the second), seconds without
/// a row filled with zeros. Ranges longer than [`MAX_SERIES_RANGE`] are refused.
pub async fn series(
    pool: &PgPool,
    campaign_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Point>, StoreError> {
    let Some((from, to)) = check_range(from, to)? else {
        return Ok(Vec::new());
    };
    let points = sqlx::query_as(
        "SELECT g.t, COALESCE(d.sent, 0) AS sent, COALESCE(d.failed, 0) AS failed, \
                COALESCE(d.retried, 0) AS retried, \
                COALESCE(d.skipped_invalid, 0) AS skipped_invalid, COALESCE(d.capped, 0) AS capped, \
                COALESCE(d.invalid, 0) AS invalid, COALESCE(d.rejected, 0) AS rejected, \
                COALESCE(d.expired, 0) AS expired, COALESCE(d.cancelled, 0) AS cancelled \
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

/// `[from, to)` checked against [`MAX_SERIES_RANGE`], for [`series`] and
/// [`series_downsampled`]; `None` when empty.
fn check_range(from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Option<Span>, StoreError> {
    checked_range(from, to, MAX_SERIES_RANGE)
}

/// The steps, in seconds, that [`auto_step`] picks from.
pub const STEP_LADDER: [i64; 8] = [1, 5, 10, 30, 60, 300, 600, 3600];
/// The most points a range gives when [`auto_step`] picks its step.
pub const MAX_AUTO_POINTS: i64 = 600;
/// The longest step [`series_downsampled`] takes, in seconds.
pub const MAX_STEP_S: i64 = 3600;

/// The smallest step of [`STEP_LADDER`] that cuts `[from, to)` into at most
/// [`MAX_AUTO_POINTS`] points: a chart of 24 h needs no 86,400 of them.
pub fn auto_step(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    let span = (truncate_to_second(to) - truncate_to_second(from))
        .num_seconds()
        .max(0);
    STEP_LADDER
        .into_iter()
        .find(|s| (span + s - 1) / s <= MAX_AUTO_POINTS)
        .unwrap_or(MAX_STEP_S)
}

/// [`series`] summed into buckets of `step` seconds (1–[`MAX_STEP_S`]), `t` the bucket's
/// start. Buckets are aligned to the Unix epoch, so a chart refreshed later keeps its
/// points; the range is widened to whole buckets. Step 1 is [`series`] itself.
pub async fn series_downsampled(
    pool: &PgPool,
    campaign_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    step: i64,
) -> Result<Vec<Point>, StoreError> {
    if !(1..=MAX_STEP_S).contains(&step) {
        return Err(StoreError::invalid(
            "step",
            format!("must be a whole number of seconds from 1 to {MAX_STEP_S}, got {step}"),
        ));
    }
    if step == 1 {
        return series(pool, campaign_id, from, to).await;
    }
    // The same bounds as `series`, checked on the range asked for.
    let Some((from, to)) = check_range(from, to)? else {
        return Ok(Vec::new());
    };
    let start = from.timestamp().div_euclid(step) * step;
    let end = (to.timestamp() + step - 1).div_euclid(step) * step;
    let (start, end) = (
        DateTime::from_timestamp(start, 0).unwrap_or(from),
        DateTime::from_timestamp(end, 0).unwrap_or(to),
    );
    let points = sqlx::query_as(
        "WITH b AS ( \
             SELECT date_bin(make_interval(secs => $4), d.second, $2) AS t, \
                    sum(d.sent) AS sent, sum(d.failed) AS failed, sum(d.retried) AS retried, \
                    sum(d.skipped_invalid) AS skipped_invalid, sum(d.capped) AS capped, \
                    sum(d.invalid) AS invalid, sum(d.rejected) AS rejected, \
                    sum(d.expired) AS expired, sum(d.cancelled) AS cancelled \
             FROM delivery_seconds d \
             WHERE d.campaign_id = $1 AND d.second >= $2 AND d.second < $3 \
             GROUP BY 1) \
         SELECT g.t, COALESCE(b.sent, 0)::int8 AS sent, COALESCE(b.failed, 0)::int8 AS failed, \
                COALESCE(b.retried, 0)::int8 AS retried, \
                COALESCE(b.skipped_invalid, 0)::int8 AS skipped_invalid, \
                COALESCE(b.capped, 0)::int8 AS capped, COALESCE(b.invalid, 0)::int8 AS invalid, \
                COALESCE(b.rejected, 0)::int8 AS rejected, \
                COALESCE(b.expired, 0)::int8 AS expired, \
                COALESCE(b.cancelled, 0)::int8 AS cancelled \
         FROM generate_series($2::timestamptz, $3::timestamptz - make_interval(secs => $4), \
                              make_interval(secs => $4)) AS g(t) \
         LEFT JOIN b ON b.t = g.t \
         ORDER BY g.t",
    )
    .bind(campaign_id)
    .bind(start)
    .bind(end)
    .bind(step as f64)
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
                COALESCE(sum(rejected), 0)::int8 AS rejected, \
                COALESCE(sum(expired), 0)::int8 AS expired, \
                COALESCE(sum(cancelled), 0)::int8 AS cancelled \
         FROM campaign_totals WHERE campaign_id = $1",
    )
    .bind(campaign_id)
    .fetch_one(pool)
    .await?;
    Ok(totals)
}

/// The longest range [`series_minutes`] serves: 31 days, 44,640 points.
pub const MAX_MINUTES_RANGE: Duration = Duration::days(31);
/// The longest range [`series_long`] serves.
pub const MAX_LONG_RANGE: Duration = Duration::days(400);
/// The most points [`series_long`] gives.
pub const MAX_LONG_POINTS: i64 = 10_000;
/// The steps, in seconds, that [`auto_step_long`] picks from: whole minutes, so that a
/// rolled-up minute falls in one bucket.
pub const LONG_STEP_LADDER: [i64; 8] = [60, 300, 600, 1800, 3600, 10_800, 21_600, 86_400];

/// A range of instants, `[start, end)`.
type Span = (DateTime<Utc>, DateTime<Utc>);

/// `[from, to)` checked against `max`; `None` when empty.
fn checked_range(
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    max: Duration,
) -> Result<Option<Span>, StoreError> {
    let (from, to) = (truncate_to_second(from), truncate_to_second(to));
    if to < from {
        return Err(StoreError::invalid(
            "to",
            format!("the range ends ({to}) before it starts ({from})"),
        ));
    }
    if to - from > max {
        return Err(StoreError::invalid(
            "to",
            format!(
                "the range is {} s long; at most {} s ({} h) can be read at once",
                (to - from).num_seconds(),
                max.num_seconds(),
                max.num_hours()
            ),
        ));
    }
    Ok((to > from).then_some((from, to)))
}

/// One point per minute of `[from, to)` (moved out to whole minutes) from
/// `delivery_minutes` alone: the rolled-up part of a campaign's history, minutes without
/// a row as zeros. Ranges longer than [`MAX_MINUTES_RANGE`] are refused.
pub async fn series_minutes(
    pool: &PgPool,
    campaign_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<Vec<Point>, StoreError> {
    let Some((from, to)) = checked_range(from, to, MAX_MINUTES_RANGE)? else {
        return Ok(Vec::new());
    };
    let (start, end) = bucket_bounds(from, to, 60);
    let points = sqlx::query_as(
        "SELECT g.t, COALESCE(m.sent, 0) AS sent, COALESCE(m.failed, 0) AS failed, \
                COALESCE(m.retried, 0) AS retried, \
                COALESCE(m.skipped_invalid, 0) AS skipped_invalid, COALESCE(m.capped, 0) AS capped, \
                COALESCE(m.invalid, 0) AS invalid, COALESCE(m.rejected, 0) AS rejected, \
                COALESCE(m.expired, 0) AS expired, COALESCE(m.cancelled, 0) AS cancelled \
         FROM generate_series($2::timestamptz, $3::timestamptz - interval '1 minute', \
                              interval '1 minute') AS g(t) \
         LEFT JOIN delivery_minutes m ON m.campaign_id = $1 AND m.minute = g.t \
         ORDER BY g.t",
    )
    .bind(campaign_id)
    .bind(start)
    .bind(end)
    .fetch_all(pool)
    .await?;
    Ok(points)
}

/// `[from, to)` widened to whole buckets of `step` seconds, aligned to the Unix epoch.
fn bucket_bounds(
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    step: i64,
) -> (DateTime<Utc>, DateTime<Utc>) {
    let start = from.timestamp().div_euclid(step) * step;
    let end = (to.timestamp() + step - 1).div_euclid(step) * step;
    (
        DateTime::from_timestamp(start, 0).unwrap_or(from),
        DateTime::from_timestamp(end, 0).unwrap_or(to),
    )
}

/// Whether any of the campaign's counts in `[from, to)` were rolled up into minutes
/// (one probe of the minutes' primary key).
pub async fn has_minutes(
    pool: &PgPool,
    campaign_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
) -> Result<bool, StoreError> {
    let found: bool = sqlx::query_scalar(
        "SELECT EXISTS (SELECT 1 FROM delivery_minutes \
                        WHERE campaign_id = $1 AND minute >= $2 AND minute < $3)",
    )
    .bind(campaign_id)
    .bind(from - Duration::minutes(1))
    .bind(to)
    .fetch_one(pool)
    .await?;
    Ok(found)
}

/// The smallest step of [`LONG_STEP_LADDER`] that cuts `[from, to)` into at most
/// [`MAX_AUTO_POINTS`] points (the largest when none does).
pub fn auto_step_long(from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
    let span = (truncate_to_second(to) - truncate_to_second(from))
        .num_seconds()
        .max(0);
    LONG_STEP_LADDER
        .into_iter()
        .find(|s| (span + s - 1) / s <= MAX_AUTO_POINTS)
        .unwrap_or(86_400)
}

/// A long range of a campaign's history summed into buckets of `step` seconds (a whole
/// number of minutes, 60–86,400), `t` the bucket's start, aligned to the Unix epoch and
/// widened to whole buckets like [`series_downsampled`]; at most [`MAX_LONG_RANGE`] and
/// [`MAX_LONG_POINTS`].
///
/// Both tables are read over the whole range, in one statement (one snapshot): a rollup
/// batch moves counts from seconds to minutes in one transaction, so each count is in
/// exactly one table, wherever the rollup's age or a late flush put the boundary. The
/// old part has no seconds left and the recent part no minutes, so each index range scan
/// reads only rows that exist.
pub async fn series_long(
    pool: &PgPool,
    campaign_id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    step: i64,
) -> Result<Vec<Point>, StoreError> {
    if !(60..=86_400).contains(&step) || step % 60 != 0 {
        return Err(StoreError::invalid(
            "step",
            format!("must be a whole number of minutes in seconds, 60 to 86400, got {step}"),
        ));
    }
    let Some((from, to)) = checked_range(from, to, MAX_LONG_RANGE)? else {
        return Ok(Vec::new());
    };
    let (start, end) = bucket_bounds(from, to, step);
    let points = (end - start).num_seconds() / step;
    if points > MAX_LONG_POINTS {
        return Err(StoreError::invalid(
            "step",
            format!(
                "{step} s gives {points} points; at most {MAX_LONG_POINTS}: take a longer step"
            ),
        ));
    }
    let points = sqlx::query_as(SERIES_LONG)
        .bind(campaign_id)
        .bind(start)
        .bind(end)
        .bind(step as f64)
        .fetch_all(pool)
        .await?;
    Ok(points)
}

const SERIES_LONG: &str = "\
WITH r AS (
    SELECT m.minute AS t, m.sent, m.failed, m.retried, m.skipped_invalid, m.capped, m.invalid,
           m.rejected, m.expired, m.cancelled
    FROM delivery_minutes m WHERE m.campaign_id = $1 AND m.minute >= $2 AND m.minute < $3
    UNION ALL
    SELECT d.second, d.sent, d.failed, d.retried, d.skipped_invalid, d.capped, d.invalid,
           d.rejected, d.expired, d.cancelled
    FROM delivery_seconds d WHERE d.campaign_id = $1 AND d.second >= $2 AND d.second < $3
), b AS (
    SELECT date_bin(make_interval(secs => $4), r.t, $2) AS t,
           sum(r.sent) AS sent, sum(r.failed) AS failed, sum(r.retried) AS retried,
           sum(r.skipped_invalid) AS skipped_invalid, sum(r.capped) AS capped,
           sum(r.invalid) AS invalid, sum(r.rejected) AS rejected,
           sum(r.expired) AS expired, sum(r.cancelled) AS cancelled
    FROM r GROUP BY 1
)
SELECT g.t, COALESCE(b.sent, 0)::int8 AS sent, COALESCE(b.failed, 0)::int8 AS failed,
       COALESCE(b.retried, 0)::int8 AS retried,
       COALESCE(b.skipped_invalid, 0)::int8 AS skipped_invalid,
       COALESCE(b.capped, 0)::int8 AS capped, COALESCE(b.invalid, 0)::int8 AS invalid,
       COALESCE(b.rejected, 0)::int8 AS rejected, COALESCE(b.expired, 0)::int8 AS expired,
       COALESCE(b.cancelled, 0)::int8 AS cancelled
FROM generate_series($2::timestamptz, $3::timestamptz - make_interval(secs => $4),
                     make_interval(secs => $4)) AS g(t)
LEFT JOIN b ON b.t = g.t
ORDER BY g.t";
