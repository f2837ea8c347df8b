//! Writes to `campaigns`: the row a job's first sight creates, the API's changes (in a
//! transaction that names the actor for `campaign_events`), status changes and halts.

use super::{
    get, validate_actor, validate_burst, validate_id, validate_send_rate, validate_weight,
    Campaign, CampaignDefaults, CampaignPatch, CampaignRow, CampaignStatus, COLUMNS,
};
use crate::limiter::LimiterScope;
use crate::limiter::{Algorithm, Rate};
use crate::store::StoreError;
use sqlx::PgPool;
use std::collections::HashMap;

/// The campaign of a job. An unknown campaign is created with the job's `send_rate` and
/// `algorithm` (or `defaults`); a known one is returned as stored, whatever the job says.
pub async fn upsert_from_job(
    pool: &PgPool,
    id: &str,
    send_rate: Option<Rate>,
    algorithm: Option<Algorithm>,
    defaults: &CampaignDefaults,
) -> Result<Campaign, StoreError> {
    let wanted = [JobCampaign {
        id: id.to_string(),
        send_rate,
        algorithm,
    }];
    let mut answers = upsert_many_from_jobs(pool, &wanted, defaults).await?;
    answers
        .remove(id)
        .unwrap_or_else(|| Err(StoreError::CampaignNotFound(id.to_string())))
}

/// A job's campaign as [`upsert_from_job`] takes it.
#[derive(Debug, Clone)]
pub struct JobCampaign {
    pub id: String,
    pub send_rate: Option<Rate>,
    pub algorithm: Option<Algorithm>,
}

/// Each id's answer from [`upsert_many_from_jobs`].
pub type Upserted = HashMap<String, Result<Campaign, StoreError>>;

/// [`upsert_from_job`] for many campaigns in at most three statements, whatever their
/// number: a read, an insert of those missing, and a read of those another worker
/// inserted in between. A worker starting on a backlog of a thousand new campaigns made
/// two round trips for each. An invalid id or stored row fails only its own answer; `Err`
/// is a failure of the whole (the database), to retry.
pub async fn upsert_many_from_jobs(
    pool: &PgPool,
    wanted: &[JobCampaign],
    defaults: &CampaignDefaults,
) -> Result<Upserted, StoreError> {
    let mut out = Upserted::with_capacity(wanted.len());
    let mut valid: Vec<&JobCampaign> = Vec::with_capacity(wanted.len());
    for w in wanted {
        match validate_id(&w.id) {
            Ok(()) => valid.push(w),
            Err(e) => {
                out.insert(w.id.clone(), Err(e));
            }
        }
    }
    // Most jobs belong to a campaign that exists: read first, so that they make no write
    // (which would wake every watcher through the NOTIFY trigger).
    let ids: Vec<String> = valid.iter().map(|w| w.id.clone()).collect();
    read_into(pool, &ids, &mut out).await?;
    let missing: Vec<&JobCampaign> = valid
        .into_iter()
        .filter(|w| !out.contains_key(&w.id))
        .collect();
    if missing.is_empty() {
        return Ok(out);
    }
    let burst = validate_burst(i64::from(defaults.burst))?;
    let rates: Vec<f64> = missing
        .iter()
        .map(|w| w.send_rate.unwrap_or(defaults.send_rate).as_f64())
        .collect();
    let algorithms: Vec<&str> = missing
        .iter()
        .map(|w| w.algorithm.unwrap_or(defaults.algorithm).as_str())
        .collect();
    let ids: Vec<String> = missing.iter().map(|w| w.id.clone()).collect();
    let inserted: Vec<CampaignRow> = sqlx::query_as(&format!(
        "INSERT INTO campaigns (id, send_rate, algorithm, burst) \
         SELECT id, rate, algorithm, $4 FROM unnest($1::text[], $2::float8[], $3::text[]) \
             AS w(id, rate, algorithm) \
         ON CONFLICT (id) DO NOTHING RETURNING {COLUMNS}"
    ))
    .bind(&ids)
    .bind(&rates)
    .bind(&algorithms)
    .bind(burst)
    .fetch_all(pool)
    .await?;
    for row in inserted {
        let id = row.id.clone();
        out.insert(id, row.try_into());
    }
    // Another worker created these between our read and our insert: theirs wins.
    let raced: Vec<String> = ids.into_iter().filter(|id| !out.contains_key(id)).collect();
    if !raced.is_empty() {
        read_into(pool, &raced, &mut out).await?;
        for id in raced {
            out.entry(id.clone())
                .or_insert(Err(StoreError::CampaignNotFound(id)));
        }
    }
    Ok(out)
}

/// Reads the campaigns `ids` into `out`, each row's conversion its own answer.
async fn read_into(pool: &PgPool, ids: &[String], out: &mut Upserted) -> Result<(), StoreError> {
    if ids.is_empty() {
        return Ok(());
    }
    for row in super::read::rows_of(pool, ids).await? {
        let id = row.id.clone();
        out.insert(id, row.try_into());
    }
    Ok(())
}

/// Creates or updates a campaign. Given fields are set; missing ones keep their stored
/// value, or take `defaults` for a new campaign. Its `campaign_events` name no actor
/// (recorded as `worker`): the API uses [`put_by`].
pub async fn put(
    pool: &PgPool,
    id: &str,
    patch: &CampaignPatch,
    defaults: &CampaignDefaults,
) -> Result<Campaign, StoreError> {
    put_by(pool, id, patch, defaults, None).await
}
/// Starts a transaction whose `campaign_events` rows name `actor`.
async fn as_actor(
    pool: &PgPool,
    actor: Option<&str>,
) -> Result<sqlx::Transaction<'static, sqlx::Postgres>, StoreError> {
    let mut tx = pool.begin().await?;
    if let Some(actor) = actor {
        validate_actor(actor)?;
        sqlx::query("SELECT set_config('pushpace.actor', $1, true)")
            .bind(actor)
            .execute(&mut *tx)
            .await?;
    }
    Ok(tx)
}

/// [`put`], recording `actor` in the campaign's events. A cancelled campaign keeps its
/// settings: cancel is final.
pub async fn put_by(
    pool: &PgPool,
    id: &str,
    patch: &CampaignPatch,
    defaults: &CampaignDefaults,
    actor: Option<&str>,
) -> Result<Campaign, StoreError> {
    validate_id(id)?;
    let send_rate = patch
        .send_rate
        .map(validate_send_rate)
        .transpose()?
        .map(Rate::as_f64);
    let burst = patch.burst.map(validate_burst).transpose()?;
    let algorithm = patch.algorithm.map(Algorithm::as_str);
    // NULL is a value of limiter_scope (the configured default), so COALESCE cannot
    // tell "set to NULL" from "keep": $8 says whether the patch names the field.
    let set_scope = patch.limiter_scope.is_some();
    let scope = patch.limiter_scope.flatten().map(LimiterScope::as_str);
    let weight = patch.weight.map(validate_weight).transpose()?;
    let mut tx = as_actor(pool, actor).await?;
    let row: Option<CampaignRow> = sqlx::query_as(&format!(
        "INSERT INTO campaigns (id, send_rate, algorithm, burst, limiter_scope, weight, \
                                start_at, expires_at) \
         VALUES ($1, COALESCE($2, $5), COALESCE($3, $6), COALESCE($4, $7), $9, \
                 COALESCE($10, 1), $12, $14) \
         ON CONFLICT (id) DO UPDATE SET \
             send_rate = COALESCE($2, campaigns.send_rate), \
             algorithm = COALESCE($3, campaigns.algorithm), \
             burst = COALESCE($4, campaigns.burst), \
             limiter_scope = CASE WHEN $8 THEN $9 ELSE campaigns.limiter_scope END, \
             weight = COALESCE($10, campaigns.weight), \
             start_at = CASE WHEN $11 THEN $12 ELSE campaigns.start_at END, \
             expires_at = CASE WHEN $13 THEN $14 ELSE campaigns.expires_at END \
         WHERE campaigns.status <> 'cancelled' \
         RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(send_rate)
    .bind(algorithm)
    .bind(burst)
    .bind(defaults.send_rate.as_f64())
    .bind(defaults.algorithm.as_str())
    .bind(validate_burst(i64::from(defaults.burst))?)
    .bind(set_scope)
    .bind(scope)
    .bind(weight)
    .bind(patch.start_at.is_some())
    .bind(patch.start_at.flatten())
    .bind(patch.expires_at.is_some())
    .bind(patch.expires_at.flatten())
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    match row {
        Some(row) => row.try_into(),
        None => Err(cancelled_is_final(id)),
    }
}

fn cancelled_is_final(id: &str) -> StoreError {
    StoreError::invalid(
        "status",
        format!("campaign {id:?} is cancelled, and cancel is final; nothing of it can change"),
    )
}

/// Sets a campaign's status.
pub async fn set_status(
    pool: &PgPool,
    id: &str,
    status: CampaignStatus,
) -> Result<Campaign, StoreError> {
    set_status_by(pool, id, status, None).await
}

/// [`set_status`], recording `actor` in the campaign's events. A cancelled campaign
/// stays cancelled (cancelling it again changes nothing).
pub async fn set_status_by(
    pool: &PgPool,
    id: &str,
    status: CampaignStatus,
    actor: Option<&str>,
) -> Result<Campaign, StoreError> {
    let mut tx = as_actor(pool, actor).await?;
    // Any status set by an operator ends a halt: its reason goes with it.
    let row: Option<CampaignRow> = sqlx::query_as(&format!(
        "UPDATE campaigns SET status = $2, \
             halt_reason = CASE WHEN $2 = 'halted' THEN halt_reason END, \
             halted_at = CASE WHEN $2 = 'halted' THEN halted_at END \
         WHERE id = $1 AND status <> 'cancelled' RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(status.as_str())
    .fetch_optional(&mut *tx)
    .await?;
    tx.commit().await?;
    match row {
        Some(row) => row.try_into(),
        None => match get(pool, id).await? {
            None => Err(StoreError::CampaignNotFound(id.to_string())),
            Some(c) if status == CampaignStatus::Cancelled => Ok(c),
            Some(_) => Err(cancelled_is_final(id)),
        },
    }
}

/// Halts an active campaign because its provider reported a configuration error. A
/// paused or finished campaign keeps its status (the operator's word wins); `false` when
/// nothing changed. The reason is cut to 1,000 characters.
pub async fn halt(pool: &PgPool, id: &str, reason: &str) -> Result<bool, StoreError> {
    let reason: String = reason.chars().take(1000).collect();
    let done = sqlx::query(
        "UPDATE campaigns SET status = 'halted', halt_reason = $2, halted_at = now() \
         WHERE id = $1 AND status = 'active'",
    )
    .bind(id)
    .bind(reason)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}
