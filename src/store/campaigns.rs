//! Campaign settings: created by the first job of an unknown campaign or by the API.
//!
//! Once a campaign exists its stored values win: [`upsert_from_job`] never changes a
//! row, while [`put`] (the API) does. Values are validated here first, so that the error
//! names the field; the CHECK constraints in the schema are the backstop, and their
//! violations are mapped to the same field by [`StoreError`]'s `From<sqlx::Error>`.

pub use super::campaign_list::list;
use super::StoreError;
use crate::config::LimiterScope;
use crate::limiter::{Algorithm, Rate};
use chrono::{DateTime, Utc};
use sqlx::PgPool;

/// Longest campaign id, in characters (the job format's rule).
pub const MAX_ID_CHARS: usize = crate::job::MAX_ID_CHARS;
/// The largest burst: permits a limiter may release above its smooth spacing. Beyond
/// this a campaign's burst swamps its rate and the limiter no longer limits.
pub const MAX_BURST: u32 = 10_000;

/// Where a campaign is in its life.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CampaignStatus {
    /// Its jobs are sent.
    Active,
    /// Its jobs wait; nothing is sent until it is active again.
    Paused,
    /// Finished; kept for its history.
    Done,
    /// Stopped by a configuration error its provider reported (`halt_reason`); its jobs
    /// wait, as when paused, until an operator resumes it.
    Halted,
    /// Stopped for good by an operator: the rest of its devices, and of any job that
    /// comes later, are counted `cancelled` and never sent. Final.
    Cancelled,
}

impl CampaignStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            CampaignStatus::Active => "active",
            CampaignStatus::Paused => "paused",
            CampaignStatus::Done => "done",
            CampaignStatus::Halted => "halted",
            CampaignStatus::Cancelled => "cancelled",
        }
    }
}

impl std::fmt::Display for CampaignStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for CampaignStatus {
    type Err = StoreError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "active" => Ok(CampaignStatus::Active),
            "paused" => Ok(CampaignStatus::Paused),
            "done" => Ok(CampaignStatus::Done),
            "halted" => Ok(CampaignStatus::Halted),
            "cancelled" => Ok(CampaignStatus::Cancelled),
            other => Err(StoreError::invalid(
                "status",
                format!(
                    "unknown status {other:?}; expected one of active, paused, done, halted, \
                     cancelled"
                ),
            )),
        }
    }
}

/// A campaign as stored.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Campaign {
    pub id: String,
    /// Sends per second; the schema guarantees 0.001 ≤ send_rate ≤ 10,000,000.
    pub send_rate: f64,
    pub algorithm: Algorithm,
    pub burst: u32,
    pub status: CampaignStatus,
    /// Where its rate is enforced; `None`: the worker's configured `limiter.scope`.
    #[serde(default)]
    pub limiter_scope: Option<LimiterScope>,
    /// Why it is halted (the provider's answer), while `status` is `halted`.
    #[serde(default)]
    pub halt_reason: Option<String>,
    #[serde(default)]
    pub halted_at: Option<DateTime<Utc>>,
    /// Its weight in a fair share under a cap (0.01–100, default 1).
    #[serde(default = "default_weight")]
    pub weight: f64,
    /// Nothing of it is sent before this instant.
    #[serde(default)]
    pub start_at: Option<DateTime<Utc>>,
    /// Devices not sent by this instant are counted `expired`.
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

fn default_weight() -> f64 {
    1.0
}

/// The smallest and largest campaign weight.
pub const MIN_WEIGHT: f64 = 0.01;
pub const MAX_WEIGHT: f64 = 100.0;

/// Checks a weight: [`MIN_WEIGHT`] to [`MAX_WEIGHT`].
pub fn validate_weight(weight: f64) -> Result<f64, StoreError> {
    if (MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
        Ok(weight)
    } else {
        Err(StoreError::invalid(
            "weight",
            format!("must be from {MIN_WEIGHT} to {MAX_WEIGHT}, got {weight}"),
        ))
    }
}

impl Campaign {
    /// The send rate as a validated [`Rate`].
    pub fn rate(&self) -> Result<Rate, StoreError> {
        validate_send_rate(self.send_rate)
    }
}

/// Values used for a campaign created by a job that does not carry them (the
/// `[limiter]` section of the configuration).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CampaignDefaults {
    pub send_rate: Rate,
    pub algorithm: Algorithm,
    pub burst: u32,
}

impl Default for CampaignDefaults {
    /// The shipped configuration's defaults: 100/s, gcra, no burst.
    fn default() -> Self {
        Self {
            send_rate: Rate::per_second(100.0).unwrap_or_else(|_| unreachable!()),
            algorithm: Algorithm::Gcra,
            burst: 0,
        }
    }
}

/// A change made through the API: the fields given are set, the others kept (or, for a
/// new campaign, taken from [`CampaignDefaults`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Deserialize)]
pub struct CampaignPatch {
    pub send_rate: Option<f64>,
    pub algorithm: Option<Algorithm>,
    pub burst: Option<i64>,
    /// `None`: keep; `Some(None)`: back to the configured default; `Some(Some(s))`: set.
    #[serde(default, deserialize_with = "present")]
    pub limiter_scope: Option<Option<LimiterScope>>,
    pub weight: Option<f64>,
    /// `None`: keep; `Some(None)`: clear; `Some(Some(t))`: set.
    #[serde(default, deserialize_with = "present")]
    pub start_at: Option<Option<DateTime<Utc>>>,
    /// As `start_at`.
    #[serde(default, deserialize_with = "present")]
    pub expires_at: Option<Option<DateTime<Utc>>>,
}

/// A field that is present, even as `null`, is `Some` (serde maps a missing one to the
/// `#[serde(default)]`, `None`), so that "set to null" and "leave alone" differ.
fn present<'de, D, T>(d: D) -> Result<Option<Option<T>>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::Deserialize<'de>,
{
    <Option<T> as serde::Deserialize>::deserialize(d).map(Some)
}

/// A campaign with its delivery totals, for the API's list.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct CampaignSummary {
    #[serde(flatten)]
    pub campaign: Campaign,
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
    /// Tokens the provider said are dead.
    pub invalid: i64,
    /// Devices the provider refused for good.
    pub rejected: i64,
    /// Not sent by its expiry.
    pub expired: i64,
    /// Not sent: the campaign was cancelled.
    pub cancelled: i64,
    /// Mean sends per second over the 10 complete seconds before `now`.
    pub rate_10s: f64,
}

/// Checks a campaign id with the job format's rule: 1–128 characters from
/// `[A-Za-z0-9._:-]` (so every id the API takes is one a job can name).
pub fn validate_id(id: &str) -> Result<(), StoreError> {
    crate::job::check_id("id", id).map_err(|e| match e {
        crate::job::JobError::Field { problem, .. } => StoreError::invalid("id", problem),
        other => StoreError::invalid("id", other.to_string()),
    })
}

/// Checks a send rate with the same rules as [`Rate::per_second`].
pub fn validate_send_rate(send_rate: f64) -> Result<Rate, StoreError> {
    Rate::per_second(send_rate).map_err(|e| StoreError::invalid("send_rate", e.to_string()))
}

/// Checks a limiter scope name; `null` (the configured default) is handled by the caller.
pub fn validate_limiter_scope(name: &str) -> Result<LimiterScope, StoreError> {
    name.parse::<LimiterScope>()
        .map_err(|e| StoreError::invalid("limiter_scope", e.to_string()))
}

/// Checks a burst: 0 to [`MAX_BURST`].
pub fn validate_burst(burst: i64) -> Result<i32, StoreError> {
    if !(0..=i64::from(MAX_BURST)).contains(&burst) {
        return Err(StoreError::invalid(
            "burst",
            format!("must be a whole number from 0 to {MAX_BURST}, got {burst}"),
        ));
    }
    // MAX_BURST fits an i32 (the column is an `integer`).
    Ok(burst as i32)
}

pub(super) const COLUMNS: &str =
    "id, send_rate, algorithm, burst, status, limiter_scope, halt_reason, \
                       halted_at, weight, start_at, expires_at, created_at, updated_at";

#[derive(sqlx::FromRow)]
pub(super) struct CampaignRow {
    id: String,
    send_rate: f64,
    algorithm: String,
    burst: i32,
    status: String,
    limiter_scope: Option<String>,
    halt_reason: Option<String>,
    halted_at: Option<DateTime<Utc>>,
    weight: f64,
    start_at: Option<DateTime<Utc>>,
    expires_at: Option<DateTime<Utc>>,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
}

impl TryFrom<CampaignRow> for Campaign {
    type Error = StoreError;

    fn try_from(row: CampaignRow) -> Result<Self, StoreError> {
        let corrupt = |reason: String| StoreError::Corrupt {
            table: "campaigns",
            reason,
        };
        let algorithm = row
            .algorithm
            .parse::<Algorithm>()
            .map_err(|e| corrupt(format!("campaign {:?}: {e}", row.id)))?;
        let status = row
            .status
            .parse::<CampaignStatus>()
            .map_err(|e| corrupt(format!("campaign {:?}: {e}", row.id)))?;
        let burst = u32::try_from(row.burst)
            .map_err(|_| corrupt(format!("campaign {:?}: burst {}", row.id, row.burst)))?;
        let limiter_scope = row
            .limiter_scope
            .as_deref()
            .map(str::parse::<LimiterScope>)
            .transpose()
            .map_err(|e| corrupt(format!("campaign {:?}: {e}", row.id)))?;
        Ok(Campaign {
            id: row.id,
            send_rate: row.send_rate,
            algorithm,
            burst,
            status,
            limiter_scope,
            halt_reason: row.halt_reason,
            halted_at: row.halted_at,
            weight: row.weight,
            start_at: row.start_at,
            expires_at: row.expires_at,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}

/// The campaign of a job. An unknown campaign is created with the job's `send_rate` and
/// `algorithm` (or `defaults`); a known one is returned as stored, whatever the job says.
pub async fn upsert_from_job(
    pool: &PgPool,
    id: &str,
    send_rate: Option<Rate>,
    algorithm: Option<Algorithm>,
    defaults: &CampaignDefaults,
) -> Result<Campaign, StoreError> {
    validate_id(id)?;
    // Most jobs belong to a campaign that exists: one read, and no write that would wake
    // every watcher through the NOTIFY trigger.
    if let Some(found) = get(pool, id).await? {
        return Ok(found);
    }
    let rate = send_rate.unwrap_or(defaults.send_rate);
    let algorithm = algorithm.unwrap_or(defaults.algorithm);
    let burst = validate_burst(i64::from(defaults.burst))?;
    let inserted: Option<CampaignRow> = sqlx::query_as(&format!(
        "INSERT INTO campaigns (id, send_rate, algorithm, burst) VALUES ($1, $2, $3, $4) \
         ON CONFLICT (id) DO NOTHING RETURNING {COLUMNS}"
    ))
    .bind(id)
    .bind(rate.as_f64())
    .bind(algorithm.as_str())
    .bind(burst)
    .fetch_optional(pool)
    .await?;
    match inserted {
        Some(row) => row.try_into(),
        // Another worker created it between our read and our insert: theirs wins.
        None => get(pool, id)
            .await?
            .ok_or_else(|| StoreError::CampaignNotFound(id.to_string())),
    }
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

/// The longest actor name recorded in `campaign_events`.
pub const MAX_ACTOR_CHARS: usize = 64;

/// Checks an actor name: 1–64 characters from `[A-Za-z0-9._:@-]`.
pub fn validate_actor(actor: &str) -> Result<(), StoreError> {
    let ok = !actor.is_empty()
        && actor.chars().count() <= MAX_ACTOR_CHARS
        && actor
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:@-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(StoreError::invalid(
            "actor",
            format!("must be 1–{MAX_ACTOR_CHARS} characters from [A-Za-z0-9._:@-]"),
        ))
    }
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
    let rows: Vec<CampaignRow> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM campaigns WHERE id = ANY($1)"
    ))
    .bind(ids)
    .fetch_all(pool)
    .await?;
    rows.into_iter().map(Campaign::try_from).collect()
}

/// `t` with its sub-second part dropped.
pub(crate) fn truncate_to_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        assert_eq!(validate_id("").unwrap_err().field(), Some("id"));
        assert_eq!(
            validate_id(&"x".repeat(200)).unwrap_err().field(),
            Some("id")
        );
        assert!(validate_id(&"x".repeat(128)).is_ok());
        assert!(validate_id("Spring.sale_2026:v-1").is_ok());
        for bad in ["é", "a b", "a/b", "nul\0", "a%20b"] {
            let e = validate_id(bad).unwrap_err();
            assert_eq!(e.field(), Some("id"), "{bad}");
            assert!(
                e.to_string().contains("[A-Za-z0-9._:-]") || e.to_string().contains("only A-Z"),
                "{e}"
            );
        }
        for bad in [0.0, -1.0, 1e-300, 0.000_5, 1e12, f64::NAN, f64::INFINITY] {
            assert_eq!(
                validate_send_rate(bad).unwrap_err().field(),
                Some("send_rate")
            );
        }
        assert_eq!(validate_burst(-1).unwrap_err().field(), Some("burst"));
        assert_eq!(validate_burst(1 << 40).unwrap_err().field(), Some("burst"));
        assert_eq!(validate_burst(5).ok(), Some(5));
        assert_eq!(validate_burst(10_000).ok(), Some(10_000));
        assert_eq!(validate_burst(10_001).unwrap_err().field(), Some("burst"));
        assert_eq!(
            validate_burst(i64::from(i32::MAX)).unwrap_err().field(),
            Some("burst")
        );
        assert_eq!(
            validate_limiter_scope("global").unwrap_err().field(),
            Some("limiter_scope")
        );
        assert_eq!(
            validate_limiter_scope("redis").ok(),
            Some(LimiterScope::Redis)
        );
    }

    #[test]
    fn a_patch_tells_null_from_missing() {
        let p: CampaignPatch = serde_json::from_str(r#"{"limiter_scope": null}"#).unwrap();
        assert_eq!(p.limiter_scope, Some(None));
        let p: CampaignPatch = serde_json::from_str(r#"{"limiter_scope": "redis"}"#).unwrap();
        assert_eq!(p.limiter_scope, Some(Some(LimiterScope::Redis)));
        let p: CampaignPatch = serde_json::from_str(r#"{"burst": 2}"#).unwrap();
        assert_eq!(p.limiter_scope, None);
    }

    #[test]
    fn status_round_trips() {
        for s in [
            CampaignStatus::Active,
            CampaignStatus::Paused,
            CampaignStatus::Done,
        ] {
            assert_eq!(s.as_str().parse::<CampaignStatus>().ok(), Some(s));
        }
        assert!("gone".parse::<CampaignStatus>().is_err());
    }
}
