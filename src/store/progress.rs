//! Job progress, read when a job is (re)consumed so that the devices already done are
//! skipped. It is written by [`crate::stats::Flusher`], in the same transaction as the
//! delivery counts, and keyed by (campaign_id, job_id): a job_id reused by another
//! campaign has progress of its own.

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
    /// All finished devices: `devices_done` plus those finished after it.
    pub devices_finished: u32,
    /// Finished devices after the prefix: bit `k % 64` of word `k / 64` is device
    /// `devices_done + k`. No trailing zero words.
    #[serde(skip)]
    done_after: Vec<u64>,
    pub completed_at: Option<DateTime<Utc>>,
    pub updated_at: DateTime<Utc>,
}

impl JobProgress {
    pub fn is_complete(&self) -> bool {
        self.completed_at.is_some() || self.devices_done >= self.devices_total
    }

    /// The devices at or after `devices_done` that are finished, ascending.
    pub fn finished_after_prefix(&self) -> impl Iterator<Item = u32> + '_ {
        let base = self.devices_done;
        set_bits(&self.done_after)
            // Below devices_total (checked at decoding), so within u32.
            .map(move |k| base + k as u32)
    }

    /// Whether device `device` (its index in the job) is finished.
    pub fn is_finished(&self, device: u32) -> bool {
        if device < self.devices_done {
            return true;
        }
        let k = device - self.devices_done;
        self.done_after
            .get((k / 64) as usize)
            .is_some_and(|w| w & (1 << (k % 64)) != 0)
    }
}

/// Decodes `done_after` as PostgreSQL prints a bit string (`'0'`/`'1'`, first device
/// first) into words, checking that it stays within the job's `room` devices.
fn decode_after(text: &str, room: u32) -> Result<Vec<u64>, String> {
    let bits = text.trim_end_matches('0').as_bytes();
    if bits.len() as u64 > u64::from(room) {
        return Err(format!(
            "done_after covers {} devices past devices_done, the job has {room} left",
            bits.len()
        ));
    }
    let mut words = vec![0u64; bits.len().div_ceil(64)];
    for (k, b) in bits.iter().enumerate() {
        match b {
            b'0' => {}
            b'1' => words[k / 64] |= 1 << (k % 64),
            other => return Err(format!("done_after holds {:?}", char::from(*other))),
        }
    }
    Ok(words)
}

#[derive(sqlx::FromRow)]
struct ProgressRow {
    job_id: String,
    campaign_id: String,
    partition: i32,
    kafka_offset: i64,
    devices_total: i32,
    devices_done: i32,
    done_after: String,
    completed_at: Option<DateTime<Utc>>,
    updated_at: DateTime<Utc>,
}

/// The stored progress of campaign `campaign_id`'s job `job_id`, if any was flushed.
pub async fn lookup(
    pool: &PgPool,
    campaign_id: &str,
    job_id: &str,
) -> Result<Option<JobProgress>, StoreError> {
    let mut found = lookup_many(pool, &[(campaign_id, job_id)]).await?;
    found.pop().unwrap_or(Ok(None))
}

/// The stored progress of each of the distinct `(campaign_id, job_id)` in `keys`, in one
/// statement:
/// `None` where none was flushed, an error where the stored row is unreadable.
pub async fn lookup_many(
    db: impl sqlx::PgExecutor<'_>,
    keys: &[(&str, &str)],
) -> Result<Vec<Result<Option<JobProgress>, StoreError>>, StoreError> {
    let campaigns: Vec<&str> = keys.iter().map(|k| k.0).collect();
    let jobs: Vec<&str> = keys.iter().map(|k| k.1).collect();
    let rows: Vec<ProgressRow> = sqlx::query_as(
        "SELECT p.job_id, p.campaign_id, p.partition, p.kafka_offset, p.devices_total, \
                p.devices_done, p.done_after::text AS done_after, p.completed_at, p.updated_at \
         FROM UNNEST($1::text[], $2::text[]) AS w(campaign_id, job_id) \
         JOIN job_progress p ON p.campaign_id = w.campaign_id AND p.job_id = w.job_id",
    )
    .bind(&campaigns)
    .bind(&jobs)
    .fetch_all(db)
    .await?;
    let mut found: std::collections::HashMap<(String, String), ProgressRow> = rows
        .into_iter()
        .map(|r| ((r.campaign_id.clone(), r.job_id.clone()), r))
        .collect();
    Ok(keys
        .iter()
        .map(|(c, j)| {
            found
                .remove(&((*c).to_string(), (*j).to_string()))
                .map(decode)
                .transpose()
        })
        .collect())
}

fn decode(r: ProgressRow) -> Result<JobProgress, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        table: "job_progress",
        reason: format!(
            "job {:?} of campaign {:?}: {reason}",
            r.job_id, r.campaign_id
        ),
    };
    let devices_total =
        u32::try_from(r.devices_total).map_err(|_| corrupt("negative devices_total".into()))?;
    let devices_done =
        u32::try_from(r.devices_done).map_err(|_| corrupt("negative devices_done".into()))?;
    if devices_done > devices_total {
        return Err(corrupt("devices_done past devices_total".into()));
    }
    let done_after = decode_after(&r.done_after, devices_total - devices_done).map_err(corrupt)?;
    let after: u32 = done_after.iter().map(|w| w.count_ones()).sum();
    Ok(JobProgress {
        devices_total,
        devices_done,
        devices_finished: devices_done + after,
        done_after,
        job_id: r.job_id,
        campaign_id: r.campaign_id,
        partition: r.partition,
        kafka_offset: r.kafka_offset,
        completed_at: r.completed_at,
        updated_at: r.updated_at,
    })
}

/// The offsets of the set bits of `words`, ascending.
pub(crate) fn set_bits(words: &[u64]) -> impl Iterator<Item = u64> + '_ {
    words.iter().enumerate().flat_map(|(i, &w)| {
        let base = i as u64 * 64;
        let mut w = w;
        std::iter::from_fn(move || {
            (w != 0).then(|| {
                let b = u64::from(w.trailing_zeros());
                w &= w - 1;
                base + b
            })
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(total: i32, done: i32, after: &str) -> ProgressRow {
        ProgressRow {
            job_id: "j".into(),
            campaign_id: "c".into(),
            partition: 0,
            kafka_offset: 0,
            devices_total: total,
            devices_done: done,
            done_after: after.into(),
            completed_at: None,
            updated_at: Utc::now(),
        }
    }

    #[test]
    fn the_finished_set_is_decoded_past_the_prefix() {
        let after = format!("01{}1", "0".repeat(70));
        let p = decode(row(100, 3, &after)).unwrap();
        // Bit 1 and bit 72 past the prefix of 3.
        assert_eq!(p.finished_after_prefix().collect::<Vec<_>>(), [4, 75]);
        assert_eq!(p.devices_finished, 5);
        assert!(p.is_finished(0) && p.is_finished(2) && p.is_finished(4) && p.is_finished(75));
        assert!(!p.is_finished(3) && !p.is_finished(5) && !p.is_finished(99));
        let none = decode(row(10, 10, "")).unwrap();
        assert_eq!(none.finished_after_prefix().count(), 0);
        assert!(none.is_complete());
    }

    #[test]
    fn a_bitmap_past_the_job_is_corrupt_not_a_panic() {
        for (total, done, after) in [(4, 2, "111"), (4, 5, ""), (4, -1, ""), (4, 0, "1x")] {
            let err = decode(row(total, done, after)).unwrap_err();
            assert!(
                matches!(
                    err,
                    StoreError::Corrupt {
                        table: "job_progress",
                        ..
                    }
                ),
                "{total} {done} {after:?}: {err}"
            );
        }
        // Trailing zeros (a byte's padding) are no devices.
        let p = decode(row(4, 2, "10000000")).unwrap();
        assert_eq!(p.finished_after_prefix().collect::<Vec<_>>(), [2]);
    }
}
