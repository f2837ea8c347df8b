//! The stats flusher's one statement (see [`crate::stats::Flusher`]): a batch marker,
//! every campaign-second added into `delivery_seconds`, and every job's finished set
//! united with the stored one, as data-modifying CTEs of a single implicit transaction.

use super::StoreError;
use chrono::{DateTime, Utc};

/// The count columns of `delivery_seconds` the statement adds into.
pub const COUNT_COLUMNS: usize = 9;

/// One batch as columns, ready for `UNNEST`. The count columns and the progress columns
/// each have one entry per row.
#[derive(Debug)]
pub struct FlushRows<'a> {
    pub flusher_id: &'a str,
    pub seq: i64,
    pub campaigns: &'a [&'a str],
    pub seconds: &'a [DateTime<Utc>],
    /// One column per outcome, in the recorder's order (sent, failed, retried,
    /// skipped_invalid, capped, invalid, rejected, expired, cancelled).
    pub counts: [Vec<i64>; COUNT_COLUMNS],
    pub jobs: &'a [&'a str],
    pub job_campaigns: &'a [&'a str],
    pub partitions: &'a [i32],
    pub offsets: &'a [i64],
    pub totals: &'a [i32],
    pub done: &'a [i32],
    pub after: &'a [Vec<u8>],
}

/// Writes a batch in one statement (below), on a pool or on one connection.
pub async fn write<'e, E: sqlx::PgExecutor<'e>>(
    executor: E,
    rows: &FlushRows<'_>,
) -> Result<(), StoreError> {
    let c = &rows.counts;
    sqlx::query(FLUSH)
        .bind(rows.flusher_id)
        .bind(rows.seq)
        .bind(rows.campaigns)
        .bind(rows.seconds)
        .bind(&c[0])
        .bind(&c[1])
        .bind(&c[2])
        .bind(&c[3])
        .bind(&c[4])
        .bind(rows.jobs)
        .bind(rows.job_campaigns)
        .bind(rows.partitions)
        .bind(rows.offsets)
        .bind(rows.totals)
        .bind(rows.done)
        .bind(rows.after)
        .bind(&c[5])
        .bind(&c[6])
        .bind(&c[7])
        .bind(&c[8])
        .execute(executor)
        .await?;
    Ok(())
}

/// The whole flush in one statement: the flusher's marker moved forward to this batch,
/// every campaign-second added into `delivery_seconds` only if it moved (a batch at or
/// below the marker was committed already: a retry after a lost COMMIT, or a late copy
/// of one; the marker's row lock orders concurrent copies, and the loser re-reads it),
/// and every job's finished set united with the stored one (it only grows, so writing
/// it twice is harmless). `done_after` arrives as bytes, first device
/// in the high bit, and is normalised by `job_progress_union` (see its migration).
const FLUSH: &str = "\
WITH marker AS (
    INSERT INTO stats_flushes AS f (flusher_id, seq) VALUES ($1, $2)
    ON CONFLICT (flusher_id) DO UPDATE SET seq = EXCLUDED.seq, committed_at = now()
        WHERE f.seq < EXCLUDED.seq
    RETURNING 1
), seconds AS (
    INSERT INTO delivery_seconds AS d
        (campaign_id, second, sent, failed, retried, skipped_invalid, capped, invalid, rejected,
         expired, cancelled)
    SELECT u.campaign_id, u.second, u.sent, u.failed, u.retried, u.skipped_invalid, u.capped,
           u.invalid, u.rejected, u.expired, u.cancelled
    FROM UNNEST($3::text[], $4::timestamptz[], $5::int8[], $6::int8[], $7::int8[], $8::int8[],
                $9::int8[], $17::int8[], $18::int8[], $19::int8[], $20::int8[])
        AS u(campaign_id, second, sent, failed, retried, skipped_invalid, capped, invalid, rejected,
             expired, cancelled)
    WHERE EXISTS (SELECT 1 FROM marker)
    ON CONFLICT (campaign_id, second) DO UPDATE SET
        sent = d.sent + EXCLUDED.sent,
        failed = d.failed + EXCLUDED.failed,
        retried = d.retried + EXCLUDED.retried,
        skipped_invalid = d.skipped_invalid + EXCLUDED.skipped_invalid,
        capped = d.capped + EXCLUDED.capped,
        invalid = d.invalid + EXCLUDED.invalid,
        rejected = d.rejected + EXCLUDED.rejected,
        expired = d.expired + EXCLUDED.expired,
        cancelled = d.cancelled + EXCLUDED.cancelled
), progress AS (
    INSERT INTO job_progress AS p
        (job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, done_after,
         completed_at, updated_at)
    SELECT u.job_id, u.campaign_id, u.partition, u.kafka_offset, u.devices_total,
           LEAST(n.devices_done, u.devices_total), n.done_after,
           CASE WHEN n.devices_done >= u.devices_total THEN now() END, now()
    FROM UNNEST($10::text[], $11::text[], $12::int4[], $13::int8[], $14::int4[], $15::int4[],
                $16::bytea[])
        AS u(job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, after)
    CROSS JOIN LATERAL job_progress_union(u.devices_done,
        ('x' || encode(u.after, 'hex'))::bit varying, 0, B'') AS n
    ON CONFLICT (campaign_id, job_id) DO UPDATE SET
        partition = EXCLUDED.partition,
        kafka_offset = EXCLUDED.kafka_offset,
        (devices_done, done_after, completed_at) = (
            SELECT LEAST(m.devices_done, p.devices_total), m.done_after,
                   COALESCE(p.completed_at, CASE WHEN m.devices_done >= p.devices_total THEN now() END)
            FROM job_progress_union(p.devices_done, p.done_after,
                                    EXCLUDED.devices_done, EXCLUDED.done_after) AS m),
        updated_at = now()
)
SELECT 1";
