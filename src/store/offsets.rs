//! The offsets committed to Kafka, recorded after each commit so that retention can tell
//! which completed jobs can no longer be re-delivered (see [`super::prune`]).

use super::StoreError;
use sqlx::PgPool;
use std::collections::BTreeMap;

/// Records `marks` (partition, committed offset: the next offset to consume) of `topic`
/// in one statement. Offsets only move forward: a smaller one than stored is ignored.
pub async fn record_committed(
    pool: &PgPool,
    topic: &str,
    marks: &[(i32, i64)],
) -> Result<(), StoreError> {
    // One row per partition (ON CONFLICT cannot touch a row twice), in partition order so
    // that concurrent writers lock rows in the same order.
    let mut latest: BTreeMap<i32, i64> = BTreeMap::new();
    for &(partition, offset) in marks {
        let e = latest.entry(partition).or_insert(offset);
        *e = (*e).max(offset);
    }
    if latest.is_empty() {
        return Ok(());
    }
    let partitions: Vec<i32> = latest.keys().copied().collect();
    let offsets: Vec<i64> = latest.values().copied().collect();
    sqlx::query(
        "INSERT INTO committed_offsets AS c (topic, partition, committed_offset, updated_at) \
         SELECT $1, u.partition, u.committed_offset, now() \
         FROM UNNEST($2::int4[], $3::int8[]) AS u(partition, committed_offset) \
         ON CONFLICT (topic, partition) DO UPDATE SET \
             committed_offset = GREATEST(c.committed_offset, EXCLUDED.committed_offset), \
             updated_at = now()",
    )
    .bind(topic)
    .bind(&partitions)
    .bind(&offsets)
    .execute(pool)
    .await?;
    Ok(())
}

/// The committed offset of `topic`'s `partition`, if one was recorded.
pub async fn committed(
    pool: &PgPool,
    topic: &str,
    partition: i32,
) -> Result<Option<i64>, StoreError> {
    Ok(sqlx::query_scalar(
        "SELECT committed_offset FROM committed_offsets WHERE topic = $1 AND partition = $2",
    )
    .bind(topic)
    .bind(partition)
    .fetch_optional(pool)
    .await?)
}
