//! Campaign settings: created by the first job of an unknown campaign or by the API.
//!
//! Once a campaign exists its stored values win: [`upsert_from_job`] never changes a
//! row, while [`put`] (the API) does. Values are validated here first, so that the error
//! names the field; the CHECK constraints in the schema are the backstop, and their
//! violations are mapped to the same field by [`StoreError`]'s `From<sqlx::Error>`.

mod read;
mod validate;
mod write;

pub use super::campaign_list::list;
pub use read::{all, changed_since, get, get_many};
pub use validate::{
    validate_actor, validate_burst, validate_id, validate_limiter_scope, validate_send_rate,
    validate_weight, MAX_ACTOR_CHARS, MAX_BURST, MAX_ID_CHARS, MAX_WEIGHT, MIN_WEIGHT,
};
pub use write::{
    halt, put, put_by, set_status, set_status_by, upsert_from_job, upsert_many_from_jobs,
    JobCampaign, Upserted,
};

use super::StoreError;
use crate::limiter::LimiterScope;
use crate::limiter::{Algorithm, Rate};
use chrono::{DateTime, Utc};

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
/// `t` with its sub-second part dropped.
pub(crate) fn truncate_to_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

#[cfg(test)]
mod tests {
    use super::*;

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
