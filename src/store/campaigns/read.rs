//! Reads of `campaigns`: one, some, all, or those changed since an instant.

use super::{Campaign, CampaignRow, COLUMNS};
use crate::store::StoreError;
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// One campaign, if it exists.
pub async fn get(pool: &PgPool, id: &str) -> Result<Option<Campaign>, StoreError> {
    let row: Option<CampaignRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM campaigns WHERE id = $1"))
            .bind(id)
            .fetch_optional(pool)
            .await?;
    row.map(Campaign::try_from).transpose()
}

/// Every campaign, by id.
pub async fn all(pool: &PgPool) -> Result<Vec<Campaign>, StoreError> {
    let rows: Vec<CampaignRow> =
        sqlx::query_as(&format!("SELECT {COLUMNS} FROM campaigns ORDER BY id"))
            .fetch_all(pool)
            .await?;
    rows.into_iter().map(Campaign::try_from).collect()
}

/// Every campaign whose `updated_at` is at or after `since` (the index on it makes this
/// a read of those rows only).
pub async fn changed_since(
    pool: &PgPool,
    since: DateTime<Utc>,
) -> Result<Vec<Campaign>, StoreError> {
    let rows: Vec<CampaignRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM campaigns WHERE updated_at >= $1 ORDER BY updated_at, id"
    ))
    .bind(since)
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Campaign::try_from).collect()
}

/// The campaigns among `ids` that exist.
pub async fn get_many(pool: &PgPool, ids: &[String]) -> Result<Vec<Campaign>, StoreError> {
    rows_of(pool, ids)
        .await?
        .into_iter()
        .map(Campaign::try_from)
        .collect()
}

/// The stored rows of those of `ids` that exist, unconverted (a caller may answer each
/// row on its own).
pub(super) async fn rows_of(pool: &PgPool, ids: &[String]) -> Result<Vec<CampaignRow>, StoreError> {
    Ok(sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM campaigns WHERE id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(pool)
    .await?)
}
