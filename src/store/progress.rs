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
    /// TEMP.
    pub fn finished_after_prefix(&self) -> impl Iterator<Item = u32> {
        std::iter::empty()
    }

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

/// The stored progress of `job_id`, if any was flushed.
pub async fn lookup(
    pool: &PgPool,
    _campaign_id: &str,
    job_id: &str,
) -> Result<Option<JobProgress>, StoreError> {
    let row: Option<ProgressRow> = sqlx::query_as(
        "SELECT job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, \
                completed_at, updated_at \
         FROM job_progress WHERE job_id = $1",
    )
    .bind(job_id)
    .fetch_optional(pool)
    .await?;
    row.map(|r| {
        let corrupt = |what: &str| StoreError::Corrupt {
            table: "job_progress",
            reason: format!("job {:?}: negative {what}", r.job_id),
        };
        Ok(JobProgress {
            devices_total: u32::try_from(r.devices_total).map_err(|_| corrupt("devices_total"))?,
            devices_done: u32::try_from(r.devices_done).map_err(|_| corrupt("devices_done"))?,
            job_id: r.job_id,
            campaign_id: r.campaign_id,
            partition: r.partition,
            kafka_offset: r.kafka_offset,
            completed_at: r.completed_at,
            updated_at: r.updated_at,
        })
    })
    .transpose()
}
