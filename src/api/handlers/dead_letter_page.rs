//! `GET /api/dead-letters`: a page of dead letters, newest first, each shown by the
//! prefix of its message and key the store reads.

use super::{params, Params};
use crate::api::error::ApiError;
use crate::api::AppState;
use crate::store::{dead_letters, StoredDeadLetter};
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Utc};

/// A dead letter as `GET /api/dead-letters` lists it. The message and the key are shown
/// only by their first [`dead_letters::LISTED_PREFIX_BYTES`], which is all the store reads.
#[derive(Debug, serde::Serialize)]
pub struct DeadLetterView {
    pub id: i64,
    pub kind: crate::store::DeadLetterKind,
    pub topic: String,
    pub partition: i32,
    pub kafka_offset: i64,
    pub campaign_id: Option<String>,
    pub job_id: Option<String>,
    pub device_token: Option<String>,
    /// The device's index in its job; null for a whole message.
    pub device: Option<u32>,
    pub reason: String,
    pub created_at: DateTime<Utc>,
    /// The stored message's length in bytes.
    pub raw_len: usize,
    /// Its first bytes as text (invalid UTF-8 replaced).
    pub raw: String,
    pub raw_truncated: bool,
    /// The Kafka key's first bytes, ASCII with other bytes as `\xNN` (`\\` for a
    /// backslash); null when the message had none.
    pub key: Option<String>,
    /// The key's length in bytes as received.
    pub key_len: Option<usize>,
    pub key_truncated: bool,
}

impl From<StoredDeadLetter> for DeadLetterView {
    fn from(d: StoredDeadLetter) -> Self {
        let key_truncated = match (&d.key_prefix, d.key_len) {
            (Some(k), Some(len)) => len > k.len(),
            _ => false,
        };
        Self {
            id: d.id,
            kind: d.kind,
            topic: d.topic,
            partition: d.partition,
            kafka_offset: d.kafka_offset,
            campaign_id: d.campaign_id,
            job_id: d.job_id,
            device_token: d.device_token,
            device: d.device,
            reason: d.reason,
            created_at: d.created_at,
            raw_truncated: d.raw_len > d.raw_prefix.len(),
            raw_len: d.raw_len,
            raw: String::from_utf8_lossy(&d.raw_prefix).into_owned(),
            key: d.key_prefix.map(|k| k.escape_ascii().to_string()),
            key_len: d.key_len,
            key_truncated,
        }
    }
}

#[derive(Debug, serde::Serialize)]
pub struct DeadLetterPage {
    pub items: Vec<DeadLetterView>,
    /// Pass as `before` for the next (older) page; null on the last page.
    pub next_before: Option<i64>,
}

/// `?campaign=&limit=&before=`, newest first.
pub async fn dead_letters(
    State(state): State<AppState>,
    query: Params,
) -> Result<Json<DeadLetterPage>, ApiError> {
    let q = params(query, &["campaign", "limit", "before"])?;
    let limit = match q.get("limit") {
        None => 100,
        Some(raw) => match raw.parse::<i64>() {
            Ok(n) if (1..=dead_letters::MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid(
                    "limit",
                    format!(
                        "must be a whole number from 1 to {}",
                        dead_letters::MAX_PAGE
                    ),
                ))
            }
        },
    };
    let before = q
        .get("before")
        .map(|raw| {
            raw.parse::<i64>()
                .map_err(|_| ApiError::invalid("before", "must be a dead letter id"))
        })
        .transpose()?;
    let campaign = q.get("campaign").map(String::as_str);
    if let Some(c) = campaign {
        crate::api::check_campaign_id("campaign", c)?;
    }
    let rows = dead_letters::list(state.pool(), campaign, before, limit).await?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|d| d.id))
        .flatten();
    Ok(Json(DeadLetterPage {
        items: rows.into_iter().map(DeadLetterView::from).collect(),
        next_before,
    }))
}
