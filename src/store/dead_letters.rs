//! Dead letters: messages and devices that could not be processed, each with a reason a
//! person can act on.
//!
//! Writing one cannot fail on what the letter holds (only on the database being out of
//! reach): every text goes through [`safe_text`](super::safe_text) (a NUL becomes `\0`)
//! and is capped, keys and messages are stored as bytes and capped below the table's
//! limits. A letter is unique per (topic, partition, offset, device), and writes skip
//! one already recorded, so a message re-read after a crash gets no second letter.

use super::{safe_text, safe_text_capped, DeadLetterKind, StoreError};
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::borrow::Cow;

/// The most of a raw message that is kept.
pub const MAX_RAW_BYTES: usize = 1024 * 1024;

/// The most of a Kafka key that is kept (its whole length is recorded too).
pub const MAX_KEY_BYTES: usize = 64 * 1024;

/// The most of a reason that is kept (after escaping), cut on a character boundary.
pub const MAX_REASON_BYTES: usize = 4096;

/// The most of a topic, campaign id or job id that is kept: `campaign_id` and `topic` are
/// indexed, and a B-tree entry must stay under about 2.7 kB.
pub const MAX_ID_BYTES: usize = 1024;

/// The most of a device token that is kept (the job rules allow 4096 bytes).
pub const MAX_TOKEN_BYTES: usize = 4096;

/// How much of a raw message and of a key [`list`] reads.
pub const LISTED_PREFIX_BYTES: usize = 1024;

/// The most rows [`list`] returns at once.
pub const MAX_PAGE: i64 = 1000;

/// The most bytes of messages and keys one statement of [`insert_batch`] carries; a larger
/// batch is split (PostgreSQL refuses a protocol message over 1 GiB).
const MAX_STATEMENT_BYTES: usize = 64 * 1024 * 1024;

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
    /// What was wrong, for a person to act on. Kept as given apart from escaping and the
    /// cap at [`MAX_REASON_BYTES`].
    pub reason: &'a str,
    /// The original message; only its first [`MAX_RAW_BYTES`] are kept.
    pub raw: &'a [u8],
    /// The message's Kafka key; its first [`MAX_KEY_BYTES`] are kept, with its length.
    pub key: Option<&'a [u8]>,
    /// The device's index in its job, for a device's letter; `None` for a whole message.
    pub device: Option<u32>,
}

/// A recorded dead letter, as [`list`] reads it: the message and key only by their first
/// [`LISTED_PREFIX_BYTES`] and their lengths.
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
    /// The device's index in its job (for letters written before it was recorded: their
    /// order within the message).
    pub device: Option<u32>,
    pub reason: String,
    /// The first bytes of the stored message.
    pub raw_prefix: Vec<u8>,
    /// The stored message's length (at most [`MAX_RAW_BYTES`]).
    pub raw_len: usize,
    /// The first bytes of the Kafka key; `None` when there was none (or it predates keys).
    pub key_prefix: Option<Vec<u8>>,
    /// The key's length as received (more than was kept when over [`MAX_KEY_BYTES`]).
    pub key_len: Option<usize>,
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
    device: Option<i32>,
    reason: String,
    raw_prefix: Vec<u8>,
    raw_len: i32,
    key_prefix: Option<Vec<u8>>,
    key_len: Option<i32>,
    created_at: DateTime<Utc>,
}

fn corrupt(reason: String) -> StoreError {
    StoreError::Corrupt {
        table: "dead_letters",
        reason,
    }
}

impl TryFrom<Row> for StoredDeadLetter {
    type Error = StoreError;

    fn try_from(r: Row) -> Result<Self, StoreError> {
        let len = |what: &str, n: i32| {
            usize::try_from(n).map_err(|_| corrupt(format!("negative {what} {n}")))
        };
        Ok(StoredDeadLetter {
            id: r.id,
            kind: r.kind.parse()?,
            topic: r.topic,
            partition: r.partition,
            kafka_offset: r.kafka_offset,
            campaign_id: r.campaign_id,
            job_id: r.job_id,
            device_token: r.device_token,
            device: r
                .device
                .map(|d| u32::try_from(d).map_err(|_| corrupt(format!("negative device {d}"))))
                .transpose()?,
            reason: r.reason,
            raw_prefix: r.raw_prefix,
            raw_len: len("raw length", r.raw_len)?,
            key_prefix: r.key_prefix,
            key_len: r.key_len.map(|n| len("key length", n)).transpose()?,
            created_at: r.created_at,
        })
    }
}

/// A letter's values as they are bound: escaped, capped, in the columns' types.
struct Prepared<'a> {
    kind: &'static str,
    topic: Cow<'a, str>,
    partition: i32,
    kafka_offset: i64,
    campaign_id: Option<Cow<'a, str>>,
    job_id: Option<Cow<'a, str>>,
    device_token: Option<Cow<'a, str>>,
    reason: Cow<'a, str>,
    raw: &'a [u8],
    key: Option<&'a [u8]>,
    key_len: Option<i32>,
    device: Option<i32>,
}

impl<'a> Prepared<'a> {
    fn new(l: &DeadLetter<'a>) -> Result<Self, StoreError> {
        let device = l
            .device
            .map(|d| {
                // Unreachable for a job within the job rules (at most 10,000 devices).
                i32::try_from(d).map_err(|_| {
                    StoreError::invalid("device", format!("index {d} is over {}", i32::MAX))
                })
            })
            .transpose()?;
        Ok(Self {
            kind: l.kind.as_str(),
            topic: safe_text_capped(l.topic, MAX_ID_BYTES),
            partition: l.partition,
            kafka_offset: l.kafka_offset,
            campaign_id: l.campaign_id.map(|s| safe_text_capped(s, MAX_ID_BYTES)),
            job_id: l.job_id.map(|s| safe_text_capped(s, MAX_ID_BYTES)),
            device_token: l.device_token.map(|s| safe_text_capped(s, MAX_TOKEN_BYTES)),
            reason: safe_text_capped(l.reason, MAX_REASON_BYTES),
            raw: &l.raw[..l.raw.len().min(MAX_RAW_BYTES)],
            key: l.key.map(|k| &k[..k.len().min(MAX_KEY_BYTES)]),
            key_len: l.key.map(|k| i32::try_from(k.len()).unwrap_or(i32::MAX)),
            device,
        })
    }

    /// The bytes this letter adds to a statement, roughly (the large values only).
    fn weight(&self) -> usize {
        self.raw.len() + self.key.map_or(0, <[u8]>::len) + self.reason.len()
    }
}

const INSERT_COLUMNS: &str = "kind, topic, partition, kafka_offset, campaign_id, job_id, \
                              device_token, reason, raw, kafka_key, kafka_key_len, device";

/// Records a dead letter and returns its id, or `None` when this message (or this device
/// of it) already has one.
pub async fn insert(pool: &PgPool, letter: &DeadLetter<'_>) -> Result<Option<i64>, StoreError> {
    let p = Prepared::new(letter)?;
    let id = sqlx::query_scalar(&format!(
        "INSERT INTO dead_letters ({INSERT_COLUMNS}) \
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12) \
         ON CONFLICT DO NOTHING RETURNING id"
    ))
    .bind(p.kind)
    .bind(p.topic.as_ref())
    .bind(p.partition)
    .bind(p.kafka_offset)
    .bind(p.campaign_id.as_deref())
    .bind(p.job_id.as_deref())
    .bind(p.device_token.as_deref())
    .bind(p.reason.as_ref())
    .bind(p.raw)
    .bind(p.key)
    .bind(p.key_len)
    .bind(p.device)
    .fetch_optional(pool)
    .await?;
    Ok(id)
}

/// Records many dead letters in one statement (more only when their messages together
/// exceed 64 MiB) and returns how many were new; letters already recorded, also twice in
/// `letters`, are skipped. Safe to repeat after a failure part-way.
pub async fn insert_batch(pool: &PgPool, letters: &[DeadLetter<'_>]) -> Result<u64, StoreError> {
    let prepared = letters
        .iter()
        .map(Prepared::new)
        .collect::<Result<Vec<_>, _>>()?;
    let mut inserted = 0;
    let mut start = 0;
    while start < prepared.len() {
        let mut end = start + 1;
        let mut weight = prepared[start].weight();
        while end < prepared.len() && weight + prepared[end].weight() <= MAX_STATEMENT_BYTES {
            weight += prepared[end].weight();
            end += 1;
        }
        inserted += insert_chunk(pool, &prepared[start..end]).await?;
        start = end;
    }
    Ok(inserted)
}

async fn insert_chunk(pool: &PgPool, chunk: &[Prepared<'_>]) -> Result<u64, StoreError> {
    fn col<'a, 'b, T>(chunk: &'a [Prepared<'b>], f: impl Fn(&'a Prepared<'b>) -> T) -> Vec<T> {
        chunk.iter().map(f).collect()
    }
    let result = sqlx::query(&format!(
        "INSERT INTO dead_letters ({INSERT_COLUMNS}) \
         SELECT * FROM unnest($1::text[], $2::text[], $3::integer[], $4::bigint[], \
             $5::text[], $6::text[], $7::text[], $8::text[], $9::bytea[], $10::bytea[], \
             $11::integer[], $12::integer[]) \
         ON CONFLICT DO NOTHING"
    ))
    .bind(col(chunk, |p| p.kind))
    .bind(col(chunk, |p| p.topic.as_ref()))
    .bind(col(chunk, |p| p.partition))
    .bind(col(chunk, |p| p.kafka_offset))
    .bind(col(chunk, |p| p.campaign_id.as_deref()))
    .bind(col(chunk, |p| p.job_id.as_deref()))
    .bind(col(chunk, |p| p.device_token.as_deref()))
    .bind(col(chunk, |p| p.reason.as_ref()))
    .bind(col(chunk, |p| p.raw))
    .bind(col(chunk, |p| p.key))
    .bind(col(chunk, |p| p.key_len))
    .bind(col(chunk, |p| p.device))
    .execute(pool)
    .await?;
    Ok(result.rows_affected())
}

/// Dead letters, newest first, optionally of one campaign. Pass the smallest id of a page
/// as `before_id` to get the next one. `limit` is clamped to 1..=[`MAX_PAGE`]. Messages
/// and keys are read only as far as [`LISTED_PREFIX_BYTES`].
pub async fn list(
    pool: &PgPool,
    campaign: Option<&str>,
    before_id: Option<i64>,
    limit: i64,
) -> Result<Vec<StoredDeadLetter>, StoreError> {
    let columns = format!(
        "id, kind, topic, partition, kafka_offset, campaign_id, job_id, device_token, device, \
         reason, substring(raw FROM 1 FOR {LISTED_PREFIX_BYTES}) AS raw_prefix, \
         octet_length(raw) AS raw_len, \
         substring(kafka_key FROM 1 FOR {LISTED_PREFIX_BYTES}) AS key_prefix, \
         kafka_key_len AS key_len, created_at"
    );
    let limit = limit.clamp(1, MAX_PAGE);
    let before = before_id.unwrap_or(i64::MAX);
    // Two statements rather than `campaign_id = $1 OR $1 IS NULL`, so that each can use
    // its index (the campaign one, or the primary key).
    let rows: Vec<Row> = match campaign {
        Some(campaign) => {
            sqlx::query_as(&format!(
                "SELECT {columns} FROM dead_letters WHERE campaign_id = $1 AND id < $2 \
                 ORDER BY id DESC LIMIT $3"
            ))
            // Escaped as stored, so that this lookup cannot fail either.
            .bind(safe_text(campaign).as_ref())
            .bind(before)
            .bind(limit)
            .fetch_all(pool)
            .await?
        }
        None => {
            sqlx::query_as(&format!(
                "SELECT {columns} FROM dead_letters WHERE id < $1 ORDER BY id DESC LIMIT $2"
            ))
            .bind(before)
            .bind(limit)
            .fetch_all(pool)
            .await?
        }
    };
    rows.into_iter().map(StoredDeadLetter::try_from).collect()
}

/// The replay template of a device letter's job, stored once per job.
#[derive(Debug, Clone, Copy)]
pub struct LetterJob<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub kafka_offset: i64,
    /// [`job_template`] of the job.
    pub job: &'a [u8],
}

/// Where a template's device list is: the first `,"devices":[]` is the field itself,
/// since no string written before it can hold an unescaped quote.
const EMPTY_DEVICES: &[u8] = b",\"devices\":[]";
const CAMPAIGN_FIELD: &[u8] = b",\"campaign_id\":";

/// The job as a message with an empty device list: its payload (verbatim), provider,
/// options and lifecycle, what a device letter needs besides its token to be replayed.
pub fn job_template(job: &crate::job::Job) -> Vec<u8> {
    crate::job::Job {
        job_id: job.job_id.clone(),
        campaign_id: job.campaign_id.clone(),
        send_rate: job.send_rate,
        algorithm: job.algorithm,
        devices: Vec::new(),
        payload: job.payload.clone(),
        provider: job.provider.clone(),
        app_id: job.app_id.clone(),
        provider_slot: job.provider_slot,
        options: job.options.clone(),
        lifecycle: job.lifecycle,
        class_priority: Default::default(),
        zone: None,
    }
    .to_json()
}

/// Records the templates of jobs whose devices are being dead-lettered; one already
/// recorded is kept (safe to repeat).
pub async fn insert_jobs(pool: &PgPool, jobs: &[LetterJob<'_>]) -> Result<u64, StoreError> {
    if jobs.is_empty() {
        return Ok(0);
    }
    let topics: Vec<Cow<'_, str>> = jobs
        .iter()
        .map(|j| safe_text_capped(j.topic, MAX_ID_BYTES))
        .collect();
    let result = sqlx::query(
        "INSERT INTO dead_letter_jobs (topic, partition, kafka_offset, job) \
         SELECT * FROM unnest($1::text[], $2::integer[], $3::bigint[], $4::bytea[]) \
         ON CONFLICT DO NOTHING",
    )
    .bind(topics.iter().map(AsRef::as_ref).collect::<Vec<&str>>())
    .bind(jobs.iter().map(|j| j.partition).collect::<Vec<_>>())
    .bind(jobs.iter().map(|j| j.kafka_offset).collect::<Vec<_>>())
    .bind(
        jobs.iter()
            .map(|j| &j.job[..j.job.len().min(MAX_RAW_BYTES)])
            .collect::<Vec<_>>(),
    )
    .execute(pool)
    .await?;
    Ok(result.rows_affected())
}

/// The job message that sends the device of letter `id` again: its job's template with
/// the letter's token as the only device, under `job_id` (the original id's progress
/// already counts the device finished, so a replay needs an id of its own). `None` when
/// the letter is not a device's or its job's template is not stored (letters written
/// before templates existed).
pub async fn replay_message(
    pool: &PgPool,
    id: i64,
    job_id: &str,
) -> Result<Option<Vec<u8>>, StoreError> {
    let row: Option<(Option<String>, Vec<u8>)> = sqlx::query_as(
        "SELECT d.device_token, j.job FROM dead_letters AS d \
         JOIN dead_letter_jobs AS j USING (topic, partition, kafka_offset) \
         WHERE d.id = $1 AND d.device IS NOT NULL",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let Some((Some(token), template)) = row else {
        return Ok(None);
    };
    splice_device(&template, job_id, &token)
        .map(Some)
        .ok_or_else(|| {
            corrupt(format!(
                "letter {id}: its job's template has no device list"
            ))
        })
}

/// `template` under `job_id` with `token` as its one device (a Web Push subscription's
/// stored text goes back as the object it is).
fn splice_device(template: &[u8], job_id: &str, token: &str) -> Option<Vec<u8>> {
    let find = |needle: &[u8]| template.windows(needle.len()).position(|w| w == needle);
    let campaign = find(CAMPAIGN_FIELD)?;
    let devices = find(EMPTY_DEVICES)?;
    if devices < campaign {
        return None;
    }
    let mut out = Vec::with_capacity(template.len() + token.len() + job_id.len() + 16);
    out.extend_from_slice(b"{\"job_id\":");
    serde_json::to_writer(&mut out, job_id).ok()?;
    out.extend_from_slice(&template[campaign..devices]);
    out.extend_from_slice(b",\"devices\":[");
    if crate::job::Subscription::parse(token).is_some() {
        out.extend_from_slice(token.as_bytes());
    } else {
        serde_json::to_writer(&mut out, token).ok()?;
    }
    out.push(b']');
    out.extend_from_slice(&template[devices + EMPTY_DEVICES.len()..]);
    Some(out)
}

#[cfg(test)]
mod replay_tests {
    use super::*;

    #[test]
    fn a_replayed_device_is_its_job_with_one_device_and_a_new_id() {
        let raw = br#"{"job_id":"j-1","campaign_id":"c","provider":"apns-b","collapse_id":"x\",\"devices\":[]","devices":["aa","bb"],"payload":{"aps":{"alert":"hi \"devices\":[]"}}}"#;
        let job = crate::job::decode(raw).expect("job");
        let template = job_template(&job);
        let out = splice_device(&template, "j-1.replay", "bb").expect("spliced");
        let again = crate::job::decode(&out).expect("a valid job");
        assert_eq!(again.job_id, "j-1.replay");
        assert_eq!(again.devices, vec!["bb".to_string()]);
        assert_eq!(again.payload.get(), job.payload.get(), "payload verbatim");
        assert_eq!(again.provider, job.provider);
        assert_eq!(again.options, job.options);
    }
}
