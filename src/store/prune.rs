//! Retention: deletes old per-second counts, completed job progress, the flush markers
//! of flushers that are gone and old dead letters, in batches so that no statement holds
//! locks for long.

use super::StoreError;
use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

/// What [`prune`] deleted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct PruneReport {
    pub seconds_deleted: u64,
    pub progress_deleted: u64,
    pub markers_deleted: u64,
    /// Per-minute rows (rolled-up seconds, see [`super::rollup`]) deleted.
    pub minutes_deleted: u64,
    /// Dead letters deleted ([`prune_before`] leaves them; see [`prune_dead_letters_before`]).
    pub dead_letters: u64,
    /// Invalid-token marks deleted because they expired (`hygiene.invalid_ttl`).
    pub invalid_tokens_expired: u64,
    /// Replay templates of jobs (`dead_letter_jobs`) no letter refers to any more.
    pub letter_jobs_deleted: u64,
}

/// The most dead letters one statement deletes, whatever `batch` is: each may hold a
/// 1 MiB message, so this bounds the work (and the locks) of one statement.
pub const MAX_DEAD_LETTER_BATCH: i64 = 10_000;

/// Deletes what is older than `older_than` before now, dead letters included; see
/// [`prune_before`] and [`prune_dead_letters_before`].
pub async fn prune(
    pool: &PgPool,
    older_than: Duration,
    batch: i64,
) -> Result<PruneReport, StoreError> {
    prune_with_dead_letters(pool, older_than, older_than, batch).await
}

/// Like [`prune`], but dead letters are deleted when older than `dead_letters_older_than`.
pub async fn prune_with_dead_letters(
    pool: &PgPool,
    older_than: Duration,
    dead_letters_older_than: Duration,
    batch: i64,
) -> Result<PruneReport, StoreError> {
    let cutoff = cutoff_before_now("older_than", older_than)?;
    let dead_letters_cutoff =
        cutoff_before_now("dead_letters_older_than", dead_letters_older_than)?;
    let mut report = prune_before(pool, cutoff, batch).await?;
    report.dead_letters = prune_dead_letters_before(pool, dead_letters_cutoff, batch).await?;
    report.letter_jobs_deleted = in_batches(pool, PRUNE_LETTER_JOBS, Utc::now(), batch).await?;
    Ok(report)
}

fn cutoff_before_now(field: &'static str, age: Duration) -> Result<DateTime<Utc>, StoreError> {
    if age < Duration::zero() {
        return Err(StoreError::invalid(
            field,
            format!("must not be negative, got {age}"),
        ));
    }
    Ok(Utc::now()
        .checked_sub_signed(age)
        .unwrap_or(DateTime::<Utc>::MIN_UTC))
}

/// Deletes the dead letters created before `cutoff`, at most `batch` (and at most
/// [`MAX_DEAD_LETTER_BATCH`]) per statement, each statement its own transaction.
pub async fn prune_dead_letters_before(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, StoreError> {
    if batch < 1 {
        return Err(StoreError::invalid(
            "batch",
            format!("must be at least 1, got {batch}"),
        ));
    }
    in_batches(
        pool,
        "DELETE FROM dead_letters WHERE id IN ( \
             SELECT id FROM dead_letters WHERE created_at < $1 LIMIT $2)",
        cutoff,
        batch.min(MAX_DEAD_LETTER_BATCH),
    )
    .await
}

/// Deletes the seconds and minutes before `cutoff`, the progress of jobs completed before it (never
/// an unfinished job's, nor one whose offset may still be re-delivered; see
/// `PRUNE_PROGRESS`) and flush markers committed before it, at most `batch` rows per
/// statement, each statement its own transaction.
pub async fn prune_before(
    pool: &PgPool,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<PruneReport, StoreError> {
    if batch < 1 {
        return Err(StoreError::invalid(
            "batch",
            format!("must be at least 1, got {batch}"),
        ));
    }
    let seconds_deleted = in_batches(
        pool,
        "DELETE FROM delivery_seconds WHERE (campaign_id, second) IN ( \
             SELECT campaign_id, second FROM delivery_seconds WHERE second < $1 LIMIT $2)",
        cutoff,
        batch,
    )
    .await?;
    let minutes_deleted = in_batches(
        pool,
        "DELETE FROM delivery_minutes WHERE (campaign_id, minute) IN ( \
             SELECT campaign_id, minute FROM delivery_minutes WHERE minute < $1 LIMIT $2)",
        cutoff,
        batch,
    )
    .await?;
    let progress_deleted = in_batches(pool, PRUNE_PROGRESS, cutoff, batch).await?;
    let markers_deleted = in_batches(
        pool,
        "DELETE FROM stats_flushes WHERE (flusher_id, seq) IN ( \
             SELECT flusher_id, seq FROM stats_flushes WHERE committed_at < $1 LIMIT $2)",
        cutoff,
        batch,
    )
    .await?;
    // Expired marks skip nothing already; whatever `cutoff` is, they can go.
    let invalid_tokens_expired = in_batches(
        pool,
        "DELETE FROM invalid_tokens WHERE ctid IN ( \
             SELECT ctid FROM invalid_tokens WHERE expires_at <= $1 LIMIT $2)",
        Utc::now(),
        batch,
    )
    .await?;
    Ok(PruneReport {
        seconds_deleted,
        progress_deleted,
        markers_deleted,
        minutes_deleted,
        invalid_tokens_expired,
        ..PruneReport::default()
    })
}

/// Completed progress older than the cutoff, once its job cannot be re-delivered: a
/// re-delivered job must find its progress, or it is sent again in full. job_progress
/// has no topic, so the rule is the safe one for any number of topics: some committed
/// offset is recorded for the job's partition, and every one recorded for it (whatever
/// the topic) is past the job's offset. A partition no commit was recorded for keeps its
/// rows.
const PRUNE_PROGRESS: &str = "\
DELETE FROM job_progress WHERE (campaign_id, job_id) IN (
    SELECT p.campaign_id, p.job_id FROM job_progress AS p
    WHERE p.completed_at IS NOT NULL AND p.completed_at < $1
      AND EXISTS (SELECT 1 FROM committed_offsets AS c WHERE c.partition = p.partition)
      AND NOT EXISTS (SELECT 1 FROM committed_offsets AS c
                      WHERE c.partition = p.partition AND c.committed_offset <= p.kafka_offset)
    LIMIT $2)";

/// A job's replay template once no letter of its message is left. Created before the
/// cutoff (now) only: a letter being written refers to its template just after it.
const PRUNE_LETTER_JOBS: &str = "\
DELETE FROM dead_letter_jobs WHERE (topic, partition, kafka_offset) IN (
    SELECT j.topic, j.partition, j.kafka_offset FROM dead_letter_jobs AS j
    WHERE j.created_at < $1 - interval '1 hour'
      AND NOT EXISTS (SELECT 1 FROM dead_letters AS d WHERE d.topic = j.topic
                      AND d.partition = j.partition AND d.kafka_offset = j.kafka_offset)
    LIMIT $2)";

async fn in_batches(
    pool: &PgPool,
    sql: &str,
    cutoff: DateTime<Utc>,
    batch: i64,
) -> Result<u64, StoreError> {
    let mut total = 0;
    loop {
        let deleted = sqlx::query(sql)
            .bind(cutoff)
            .bind(batch)
            .execute(pool)
            .await?
            .rows_affected();
        total += deleted;
        if deleted < batch.unsigned_abs() {
            return Ok(total);
        }
    }
}
