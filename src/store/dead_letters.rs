//! Dead letters: messages and devices that could not be processed, each with a reason a
//! person can act on. They are rare, so each is one INSERT.

use super::{DeadLetterKind, StoreError};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// The most of a raw message that is kept.
pub const MAX_RAW_BYTES: usize = 1024 * 1024;

/// The most rows [`list`] returns at once.
pub const MAX_PAGE: i64 = 1000;

/// A dead letter to record.
#[derive(Debug, Clone, Copy)]
pub struct DeadLetter<'a> {
    pub kind: DeadLetterKind,
    pub topic: &'a str,
    pub partition: i32,
    pub kafka_offset: i64,
    pub campaign_id: Option<&'a str>,
    pub job_id: Option<&'a str>,
    pub device_token: Option<&'a str>,
    pub reason: &'a str,
    /// The original message; only its first [`MAX_RAW_BYTES`] are kept.
    pub raw: &'a [u8],
    /// TEMP.
    pub key: Option<&'a [u8]>,
    pub device: Option<u32>,
}

/// TEMP.
pub async fn insert_batch(pool: &PgPool, letters: &[DeadLetter<'_>]) -> Result<u64, StoreError> {
    for l in letters {
        insert(pool, l).await?;
    }
    Ok(letters.len() as u64)
}

/// A recorded dead letter.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct StoredDeadLetter {
    pub id: i64,
    pub kind: DeadLetterKind,
    pub topic: String,
    pub partition: i32,
    pub kafka_offset: i64,
    pub campaign_id: Option<String>,
    pub job_id: Option<String>,
    pub device_token: Option<String>,
    pub reason: String,
    pub raw: Vec<u8>,
    pub created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: i64,
    kind: String,
    topic: String,
    partition: i32,
    kafka_offset: i64,
    campaign_id: Option<String>,
    job_id: Option<String>,
    device_token: Option<String>,
    reason: String,
    raw: Vec<u8>,
    created_at: DateTime<Utc>,
}

impl TryFrom<Row> for StoredDeadLetter {
    type Error = StoreError;

    fn try_from(r: Row) -> Result<Self, StoreError> {
        Ok(StoredDeadLetter {
            id: r.id,
            kind: r.kind.parse()?,
            topic: r.topic,
            partition: r.partition,
            kafka_offset: r.kafka_offset,
            campaign_id: r.campaign_id,
            job_id: r.job_id,
            device_token: r.device_token,
            reason: r.reason,
            raw: r.raw,
            created_at: r.created_at,
        })
    }
}

/// Records a dead letter and returns its id.
pub async fn insert(pool: &PgPool, letter: &DeadLetter<'_>) -> Result<i64, StoreError> {
    let raw = &letter.raw[..letter.raw.len().min(MAX_RAW_BYTES)];
    let id = sqlx::query_scalar(
        "INSERT INTO dead_letters \
             (kind, topic, partition, kafka_offset, campaign_id, job_id, device_token, reason, raw) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) RETURNING id",
    )
    .bind(letter.kind.as_str())
    .bind(letter.topic)
    .bind(letter.partition)
    .bind(letter.kafka_offset)
    .bind(letter.campaign_id)
    .bind(letter.job_id)
    .bind(letter.device_token)
    .bind(letter.reason)
    .bind(raw)
    .fetch_one(pool)
    .await?;
    Ok(id)
}

/// Dead letters, newest first, optionally of one campaign. Pass the smallest id of a page
/// as `before_id` to get the next one. `limit` is clamped to 1..=[`MAX_PAGE`].
pub async fn list(
    pool: &PgPool,
    campaign: Option<&str>,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<StoredDeadLetter>, StoreError> {
    const COLUMNS: &str = "id, kind, topic, partition, kafka_offset, campaign_id, job_id, \
                           device_token, reason, raw, created_at";
    let limit = limit.clamp(1, MAX_PAGE);
    let before = before_id.unwrap_or(i64::MAX);
    // Two statements rather than `campaign_id = $1 OR $1 IS NULL`, so that each can use
    // its index (the campaign one, or the primary key).
    let rows: Vec<Row> = match campaign {
        Some(campaign) => {
            sqlx::query_as(&format!(
                "SELECT {COLUMNS} FROM dead_letters WHERE campaign_id = $1 AND id < $2 \
                 ORDER BY id DESC LIMIT $3"
            ))
            .bind(campaign)
            .bind(before)
            .bind(limit)
            .fetch_all(pool)
            .await?
        }
        None => {
            sqlx::query_as(&format!(
                "SELECT {COLUMNS} FROM dead_letters WHERE id < $1 ORDER BY id DESC LIMIT $2"
            ))
            .bind(before)
            .bind(limit)
            .fetch_all(pool)
            .await?
        }
    };
    rows.into_iter().map(StoredDeadLetter::try_from).collect()
}
