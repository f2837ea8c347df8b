//! Job progress, read when a job is (re)consumed so that the devices already done are
//! skipped. It is written by [`crate::stats::Flusher`], in the same transaction as the
//! delivery counts.

use super::StoreError;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// How far a job has got.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct JobProgress {
    pub job_id: String,
    pub campaign_id: String,
    pub partition: i32,
    pub kafka_offset: i64,
    pub devices_total: u32,
    /// The devices, in job order, that are finished (delivered, or failed for good):
    /// a re-consumed job starts at this index.
    pub devices_done: u32,
    pub completed_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

impl JobProgress {
    pub fn is_complete(&self) -> bool {
        self.completed_at.is_some() || self.devices_done >= self.devices_total
    }
}

#[derive(sqlx::FromRow)]
struct ProgressRow {
    job_id: String,
    campaign_id: String,
    partition: i32,
    kafka_offset: i64,
    devices_total: i32,
    devices_done: i32,
    completed_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
}

/// The progress columns, with a WHERE clause of the caller's (its values bound, never
/// formatted in).
macro_rules! select_progress {
    ($filter:literal) => {
        concat!(
            "SELECT job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, \
             completed_at, updated_at FROM job_progress WHERE ",
            $filter
        )
    };
}

/// The stored progress of `job_id`, if any was flushed.
pub async fn lookup(pool: &PgPool, job_id: &str) -> Result<Option<JobProgress>, StoreError> {
    let row: Option<ProgressRow> = sqlx::query_as(select_progress!("job_id = $1"))
        .bind(job_id)
        .fetch_optional(pool)
        .await?;
    row.map(ProgressRow::into_progress).transpose()
}

/// The stored progress of each of `job_ids` that has any, in one statement (the
/// consumer's lookups for a burst of jobs; see [`crate::worker`]). Order is not kept.
pub async fn lookup_many(
    pool: &PgPool,
    job_ids: &[String],
) -> Result<Vec<JobProgress>, StoreError> {
    let rows: Vec<ProgressRow> = sqlx::query_as(select_progress!("job_id = ANY($1)"))
        .bind(job_ids)
        .fetch_all(pool)
        .await?;
    rows.into_iter().map(ProgressRow::into_progress).collect()
}

impl ProgressRow {
    fn into_progress(self) -> Result<JobProgress, StoreError> {
        let corrupt = |what: &str| StoreError::Corrupt {
            table: "job_progress",
            reason: format!("job {:?}: negative {what}", self.job_id),
        };
        Ok(JobProgress {
            devices_total: u32::try_from(self.devices_total)
                .map_err(|_| corrupt("devices_total"))?,
            devices_done: u32::try_from(self.devices_done).map_err(|_| corrupt("devices_done"))?,
            job_id: self.job_id,
            campaign_id: self.campaign_id,
            partition: self.partition,
            kafka_offset: self.kafka_offset,
            completed_at: self.completed_at,
            updated_at: self.updated_at,
        })
    }
}
