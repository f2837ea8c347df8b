//! What each worker holds of each campaign (devices held and parked, effective rate,
//! the stated total), published about once a second so that the API can sum progress
//! and ETA over every worker, not only the one in its own process.

use super::StoreError;
use sqlx::PgPool;
use std::collections::HashMap;

/// Rows older than this are a worker that stopped publishing: left out of the sums.
pub const FRESH_S: f64 = 5.0;

/// One campaign as one worker holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Held {
    pub campaign_id: String,
    pub held: u64,
    pub parked: u64,
    pub effective_rate: f64,
    pub total_devices: Option<u64>,
    /// The registered app its next sends go through, if any.
    pub app_id: Option<String>,
}

/// A campaign summed over the workers that published it lately.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summed {
    pub held: u64,
    pub parked: u64,
    pub effective_rate: f64,
    pub total_devices: Option<u64>,
    pub workers: u32,
}

/// Replaces `worker_id`'s rows with `rows`, in one statement.
pub async fn publish(pool: &PgPool, worker_id: &str, rows: &[Held]) -> Result<(), StoreError> {
    let ids: Vec<&str> = rows.iter().map(|r| r.campaign_id.as_str()).collect();
    let held: Vec<i64> = rows.iter().map(|r| r.held as i64).collect();
    let parked: Vec<i64> = rows.iter().map(|r| r.parked as i64).collect();
    let rates: Vec<f64> = rows.iter().map(|r| r.effective_rate).collect();
    let totals: Vec<Option<i64>> = rows
        .iter()
        .map(|r| r.total_devices.map(|t| t as i64))
        .collect();
    let apps: Vec<Option<&str>> = rows.iter().map(|r| r.app_id.as_deref()).collect();
    sqlx::query(
        "WITH gone AS ( \
             DELETE FROM worker_campaigns WHERE worker_id = $1 AND campaign_id <> ALL($2) \
         ) \
         INSERT INTO worker_campaigns AS w \
             (campaign_id, worker_id, held, parked, effective_rate, total_devices, app_id, \
              updated_at) \
         SELECT u.id, $1, u.held, u.parked, u.rate, u.total, u.app, now() \
         FROM UNNEST($2::text[], $3::int8[], $4::int8[], $5::float8[], $6::int8[], \
                     $7::text[]) \
             AS u(id, held, parked, rate, total, app) \
         ON CONFLICT (campaign_id, worker_id) DO UPDATE SET \
             held = EXCLUDED.held, parked = EXCLUDED.parked, \
             effective_rate = EXCLUDED.effective_rate, \
             total_devices = EXCLUDED.total_devices, app_id = EXCLUDED.app_id, \
             updated_at = now()",
    )
    .bind(worker_id)
    .bind(&ids)
    .bind(&held)
    .bind(&parked)
    .bind(&rates)
    .bind(&totals)
    .bind(&apps)
    .execute(pool)
    .await?;
    Ok(())
}

/// Deletes a worker's rows (at its shutdown).
pub async fn forget(pool: &PgPool, worker_id: &str) -> Result<(), StoreError> {
    sqlx::query("DELETE FROM worker_campaigns WHERE worker_id = $1")
        .bind(worker_id)
        .execute(pool)
        .await?;
    Ok(())
}

/// What a finish-by plan rests on, for each of `ids`: its finished devices over every
/// worker (`campaign_totals`: sent, failed, invalid, rejected, expired, cancelled, as
/// progress counts them) and how many workers published it within [`FRESH_S`].
pub async fn plan_inputs(
    pool: &PgPool,
    ids: &[String],
) -> Result<HashMap<String, (u64, u32)>, StoreError> {
    let rows: Vec<(String, i64, i64)> = sqlx::query_as(
        "SELECT c.id, \
                COALESCE((SELECT sum(t.sent + t.failed + t.invalid + t.rejected + t.expired \
                                     + t.cancelled) \
                          FROM campaign_totals t WHERE t.campaign_id = c.id), 0)::int8, \
                (SELECT count(*) FROM worker_campaigns w \
                 WHERE w.campaign_id = c.id \
                   AND w.updated_at > now() - make_interval(secs => $2))::int8 \
         FROM unnest($1::text[]) AS c(id)",
    )
    .bind(ids)
    .bind(FRESH_S)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, finished, workers)| (id, (finished.max(0) as u64, workers.max(0) as u32)))
        .collect())
}

/// Each campaign summed over the workers that published within [`FRESH_S`]; `only`:
/// one campaign.
pub async fn summed(
    pool: &PgPool,
    only: Option<&str>,
) -> Result<HashMap<String, Summed>, StoreError> {
    let rows: Vec<(String, i64, i64, f64, Option<i64>, i64)> = sqlx::query_as(
        "SELECT campaign_id, sum(held)::int8, sum(parked)::int8, sum(effective_rate), \
                max(total_devices), count(*) \
         FROM worker_campaigns \
         WHERE updated_at > now() - make_interval(secs => $1) \
           AND ($2::text IS NULL OR campaign_id = $2) \
         GROUP BY campaign_id",
    )
    .bind(FRESH_S)
    .bind(only)
    .fetch_all(pool)
    .await?;
    Ok(rows
        .into_iter()
        .map(|(id, held, parked, rate, total, n)| {
            let s = Summed {
                held: held.max(0) as u64,
                parked: parked.max(0) as u64,
                effective_rate: rate,
                total_devices: total.map(|t| t.max(0) as u64),
                workers: n as u32,
            };
            (id, s)
        })
        .collect())
}
