//! A campaign's settings history: every change of its send_rate, weight, status,
//! algorithm, start or expiry, written by a trigger on `campaigns` (so no writer can
//! forget it) with the actor the API named for its transaction.

use super::StoreError;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// The most events one read returns (the newest ones).
pub const MAX_EVENTS: i64 = 1000;

/// One change of one setting.
#[derive(Debug, Clone, PartialEq, serde::Serialize, sqlx::FromRow)]
pub struct CampaignEvent {
    pub at: DateTime<Utc>,
    /// Who made it: the API's caller (`api`, or the name it gave), or `worker`.
    pub actor: String,
    /// send_rate, weight, status, algorithm, start_at or expires_at.
    pub field: String,
    #[sqlx(rename = "old_value")]
    pub old: Option<String>,
    #[sqlx(rename = "new_value")]
    pub new: Option<String>,
}

/// The campaign's newest `limit` events (at most [`MAX_EVENTS`]), oldest first.
pub async fn list(
    pool: &PgPool,
    campaign_id: &str,
    limit: i64,
) -> Result<Vec<CampaignEvent>, StoreError> {
    let mut rows: Vec<CampaignEvent> = sqlx::query_as(
        "SELECT at, actor, field, old_value, new_value FROM campaign_events \
         WHERE campaign_id = $1 ORDER BY at DESC, id DESC LIMIT $2",
    )
    .bind(campaign_id)
    .bind(limit.clamp(1, MAX_EVENTS))
    .fetch_all(pool)
    .await?;
    rows.reverse();
    Ok(rows)
}
