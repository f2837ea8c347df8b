//! Writes to `campaigns`: the row a job's first sight creates, the API's changes (in a
//! transaction that names the actor for `campaign_events`), status changes and halts.

use super::{
    get, validate_actor, validate_burst, validate_id, validate_ramp_from, validate_ramp_up_s,
    validate_send_rate, validate_weight, Campaign, CampaignDefaults, CampaignPatch, CampaignRow,
    CampaignStatus, COLUMNS,
};
use crate::job::window::{format_local_time, LatePolicy};
use crate::job::PriorityClass;
use crate::limiter::LimiterScope;
use crate::limiter::MAX_RATE_PER_SECOND;
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

/// The upsert behind [`put_by`]. NULL is a value of the nullable settings (the
/// configured default, or none), so COALESCE cannot tell "set to NULL" from "keep": each
/// of those has a flag saying whether the patch names it.
const PUT_SQL: &str = "INSERT INTO campaigns (id, send_rate, algorithm, burst, limiter_scope, \
                                weight, start_at, expires_at, priority, ramp_up_s, ramp_from, \
                                finish_by, send_window, deliver_at_local, late_policy) \
     VALUES ($1, COALESCE($2, $5), COALESCE($3, $6), COALESCE($4, $7), $9, \
             COALESCE($10, 1), $12, $14, COALESCE($15, 'normal'), $17, $19, $21, $23, $25, \
             COALESCE($26, 'next_window')) \
     ON CONFLICT (id) DO UPDATE SET \
         send_rate = COALESCE($2, campaigns.send_rate), \
         algorithm = COALESCE($3, campaigns.algorithm), \
         burst = COALESCE($4, campaigns.burst), \
         limiter_scope = CASE WHEN $8 THEN $9 ELSE campaigns.limiter_scope END, \
         weight = COALESCE($10, campaigns.weight), \
         start_at = CASE WHEN $11 THEN $12 ELSE campaigns.start_at END, \
         expires_at = CASE WHEN $13 THEN $14 ELSE campaigns.expires_at END, \
         priority = COALESCE($15, campaigns.priority), \
         ramp_up_s = CASE WHEN $16 THEN $17 ELSE campaigns.ramp_up_s END, \
         ramp_from = CASE WHEN $18 THEN $19 ELSE campaigns.ramp_from END, \
         finish_by = CASE WHEN $20 THEN $21 ELSE campaigns.finish_by END, \
         send_window = CASE WHEN $22 THEN $23 ELSE campaigns.send_window END, \
         deliver_at_local = CASE WHEN $24 THEN $25 ELSE campaigns.deliver_at_local END, \
         late_policy = COALESCE($26, campaigns.late_policy) \
     WHERE campaigns.status <> 'cancelled' \
     RETURNING ";

/// [`put`], recording `actor` in the campaign's events. A cancelled campaign keeps its
/// settings: cancel is final. A new campaign given a `finish_by` and no `send_rate` is
/// stored at the largest rate: the deadline plans its rate, and the caps bound it.
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
    let new_rate = if matches!(patch.finish_by, Some(Some(_))) {
        MAX_RATE_PER_SECOND
    } else {
        defaults.send_rate.as_f64()
    };
    let burst = patch.burst.map(validate_burst).transpose()?;
    let algorithm = patch.algorithm.map(Algorithm::as_str);
    let scope = patch.limiter_scope.flatten().map(LimiterScope::as_str);
    let weight = patch.weight.map(validate_weight).transpose()?;
    let ramp_up_s = patch
        .ramp_up_s
        .flatten()
        .map(validate_ramp_up_s)
        .transpose()?;
    let ramp_from = patch
        .ramp_from
        .flatten()
        .map(validate_ramp_from)
        .transpose()?;
    let window = match patch.send_window.flatten() {
        Some(w) => Some(
            serde_json::to_string(&w)
                .map_err(|e| StoreError::invalid("send_window", e.to_string()))?,
        ),
        None => None,
    };
    let deliver_at = patch.deliver_at_local.flatten().map(format_local_time);
    let mut tx = as_actor(pool, actor).await?;
    let row: Option<CampaignRow> = sqlx::query_as(&format!("{PUT_SQL}{COLUMNS}"))
        .bind(id)
        .bind(send_rate)
        .bind(algorithm)
        .bind(burst)
        .bind(new_rate)
        .bind(defaults.algorithm.as_str())
        .bind(validate_burst(i64::from(defaults.burst))?)
        .bind(patch.limiter_scope.is_some())
        .bind(scope)
        .bind(weight)
        .bind(patch.start_at.is_some())
        .bind(patch.start_at.flatten())
        .bind(patch.expires_at.is_some())
        .bind(patch.expires_at.flatten())
        .bind(patch.priority.map(PriorityClass::as_str))
        .bind(patch.ramp_up_s.is_some())
        .bind(ramp_up_s)
        .bind(patch.ramp_from.is_some())
        .bind(ramp_from)
        .bind(patch.finish_by.is_some())
        .bind(patch.finish_by.flatten())
        .bind(patch.send_window.is_some())
        .bind(window)
        .bind(patch.deliver_at_local.is_some())
        .bind(deliver_at)
        .bind(patch.late_policy.map(LatePolicy::as_str))
        .fetch_optional(&mut *tx)
        .await?;
    if let Some(e) = row.as_ref().and_then(|r| r.local().err()) {
        // The merged window, deliver time and late policy do not fit together: the
        // transaction rolls back as it drops.
        return Err(StoreError::invalid(e.field, e.problem));
    }
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
