//! [`Batch`]: the rows of one flush, frozen and sorted, and its one write.

use super::counters::OUTCOMES;
use super::progress::{JobCell, Snapshot};
use crate::store::flush::{self, FlushRows};
use crate::store::StoreError;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Rows drained but not yet in a batch.
#[derive(Default)]
pub(super) struct Pending {
    pub(super) seconds: HashMap<(Arc<str>, u64), [u64; OUTCOMES]>,
    /// By cell address: one entry per tracked job, holding its latest finished set.
    pub(super) progress: HashMap<usize, (Arc<JobCell>, Snapshot)>,
}

impl Pending {
    pub(super) fn rows(&self) -> usize {
        self.seconds.len() + self.progress.len()
    }
}

/// Rows frozen for one transaction, sorted.
pub(super) struct Batch {
    pub(super) seq: u64,
    /// The drain that last fed it: everything recorded before is in it or earlier.
    pub(super) drained_at: Instant,
    pub(super) seconds: Vec<(Arc<str>, DateTime<Utc>, [i64; OUTCOMES])>,
    pub(super) progress: Vec<(Arc<JobCell>, Snapshot)>,
}

impl Batch {
    pub(super) fn rows(&self) -> usize {
        self.seconds.len() + self.progress.len()
    }

    /// Freezes drained rows into batch `seq`, sorted so that concurrent flushers lock
    /// shared rows in the same order.
    pub(super) fn seal(pending: Pending, seq: u64, drained_at: Instant) -> Batch {
        let mut seconds: Vec<_> = pending
            .seconds
            .into_iter()
            .filter_map(|((campaign, second), counts)| {
                let at = i64::try_from(second)
                    .ok()
                    .and_then(|s| DateTime::from_timestamp(s, 0));
                match at {
                    Some(at) => Some((campaign, at, counts.map(|c| i64::try_from(c).unwrap_or(i64::MAX)))),
                    None => {
                        // Only a nonsense clock gets here; PostgreSQL cannot hold it anyway.
                        tracing::error!(campaign = %campaign, second, ?counts, "dropping counts for an unrepresentable second");
                        None
                    }
                }
            })
            .collect();
        seconds.sort_unstable_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let mut progress: Vec<_> = pending.progress.into_values().collect();
        progress.sort_unstable_by(|a, b| {
            (&a.0.campaign_id, &a.0.job_id).cmp(&(&b.0.campaign_id, &b.0.job_id))
        });
        Batch {
            seq,
            drained_at,
            seconds,
            progress,
        }
    }

    /// Writes the batch in one statement, within `limit`.
    pub(super) async fn write(
        &self,
        pool: &PgPool,
        flusher_id: &str,
        limit: Duration,
    ) -> Result<(), StoreError> {
        let batch = self;
        let campaigns: Vec<&str> = batch.seconds.iter().map(|r| &*r.0).collect();
        let seconds: Vec<DateTime<Utc>> = batch.seconds.iter().map(|r| r.1).collect();
        let column = |i: usize| -> Vec<i64> { batch.seconds.iter().map(|r| r.2[i]).collect() };
        let n = batch.progress.len();
        let mut jobs: Vec<&str> = Vec::with_capacity(n);
        let mut job_campaigns: Vec<&str> = Vec::with_capacity(n);
        let mut partitions: Vec<i32> = Vec::with_capacity(n);
        let mut offsets: Vec<i64> = Vec::with_capacity(n);
        let mut totals: Vec<i32> = Vec::with_capacity(n);
        let mut sets: Vec<Snapshot> = Vec::with_capacity(n);
        for (cell, snapshot) in &batch.progress {
            // The same job tracked twice (re-consumed): one row, the union of both,
            // since ON CONFLICT cannot touch a row twice in one statement.
            if jobs.last() == Some(&&*cell.job_id)
                && job_campaigns.last() == Some(&&*cell.campaign_id)
            {
                if let Some(last) = sets.last_mut() {
                    last.union(snapshot);
                }
                continue;
            }
            jobs.push(&cell.job_id);
            job_campaigns.push(&cell.campaign_id);
            partitions.push(cell.partition);
            offsets.push(cell.offset);
            totals.push(clamp_i32(cell.total));
            sets.push(snapshot.clone());
        }
        let done: Vec<i32> = sets.iter().map(|s| clamp_i32(s.done)).collect();
        let after: Vec<Vec<u8>> = sets.iter().map(Snapshot::after_bytes).collect();
        let rows = FlushRows {
            flusher_id,
            seq: i64::try_from(batch.seq).unwrap_or(i64::MAX),
            campaigns: &campaigns,
            seconds: &seconds,
            counts: std::array::from_fn(column),
            jobs: &jobs,
            job_campaigns: &job_campaigns,
            partitions: &partitions,
            offsets: &offsets,
            totals: &totals,
            done: &done,
            after: &after,
        };
        execute(pool, &rows, limit).await
    }
}

/// One attempt within `write_timeout`, on a connection of its own: a connection that
/// did not answer in time is detached from the pool and dropped (its socket closed),
/// so that no other query inherits it.
async fn execute(pool: &PgPool, rows: &FlushRows<'_>, limit: Duration) -> Result<(), StoreError> {
    let deadline = Instant::now() + limit;
    let mut conn = tokio::time::timeout_at(deadline, pool.acquire())
        .await
        .map_err(|_| timed_out("waiting for a connection", limit))??;
    match tokio::time::timeout_at(deadline, flush::write(&mut *conn, rows)).await {
        Ok(result) => result,
        Err(_) => {
            drop(conn.detach());
            Err(timed_out("waiting for the flush's answer", limit))
        }
    }
}

// The statement takes one count column per outcome.
const _: () = assert!(OUTCOMES == flush::COUNT_COLUMNS);

/// A write that took longer than `write_timeout`: transient, like a lost connection.
fn timed_out(what: &str, limit: Duration) -> StoreError {
    StoreError::Database(sqlx::Error::Io(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!(
            "stats flush: {what} took over {} ms (worker.write_timeout_ms)",
            limit.as_millis()
        ),
    )))
}

fn clamp_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}
