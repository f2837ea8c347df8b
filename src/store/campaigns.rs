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
    validate_actor, validate_burst, validate_finish_by, validate_id, validate_limiter_scope,
    validate_priority, validate_ramp_from, validate_ramp_up_s, validate_send_rate, validate_weight,
    MAX_ACTOR_CHARS, MAX_BURST, MAX_ID_CHARS, MAX_WEIGHT, MIN_WEIGHT,
};
pub use write::{
    halt, put, put_by, set_status, set_status_by, upsert_from_job, upsert_many_from_jobs,
    JobCampaign, Upserted,
};

use super::StoreError;
use crate::job::window::{LatePolicy, LocalPolicy, SendWindow, WindowError};
use crate::job::PriorityClass;
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
    /// Under a shared cap, served strictly before the classes below it.
    #[serde(default)]
    pub priority: PriorityClass,
    /// Seconds its rate takes to climb to the full rate (0: no ramp); `None`: the
    /// worker's `limiter.ramp_up_s`.
    #[serde(default)]
    pub ramp_up_s: Option<f64>,
    /// The fraction of the full rate a ramp starts at (0.01–1); `None`:
    /// `limiter.ramp_from`.
    #[serde(default)]
    pub ramp_from: Option<f64>,
    /// The instant it should be done by: its rate is planned from what remains and the
    /// time left, and `send_rate` is the most it may send at. A campaign the API creates
    /// with a `finish_by` and no `send_rate` gets the largest rate (10,000,000/s), so
    /// that only the caps bound the plan.
    #[serde(default)]
    pub finish_by: Option<DateTime<Utc>>,
    /// Its recipients' local-time rules (`send_window`, `deliver_at_local`,
    /// `late_policy`), in the zone each job states.
    #[serde(flatten)]
    pub local: LocalPolicy,
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
    /// `None`: keep (a new campaign is `normal`).
    pub priority: Option<PriorityClass>,
    /// `None`: keep; `Some(None)`: back to `limiter.ramp_up_s`; `Some(Some(s))`: set.
    #[serde(default, deserialize_with = "present")]
    pub ramp_up_s: Option<Option<f64>>,
    /// As `ramp_up_s`, with `limiter.ramp_from`.
    #[serde(default, deserialize_with = "present")]
    pub ramp_from: Option<Option<f64>>,
    /// As `start_at`. A new campaign given one without a `send_rate` is stored at the
    /// largest rate (10,000,000/s): with a deadline, `send_rate` is the most it may
    /// send at, and the caps bound it.
    #[serde(default, deserialize_with = "present")]
    pub finish_by: Option<Option<DateTime<Utc>>>,
    /// As `start_at`: the recipients' local hours and days.
    #[serde(default, deserialize_with = "present")]
    pub send_window: Option<Option<SendWindow>>,
    /// As `start_at`: minutes after local midnight (the API reads `HH:MM`).
    #[serde(skip)]
    pub deliver_at_local: Option<Option<u16>>,
    /// `None`: keep (a new campaign is `next_window`).
    pub late_policy: Option<LatePolicy>,
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
    "id, send_rate, algorithm, burst, status, limiter_scope, halt_reason, halted_at, weight, \
     start_at, expires_at, priority, ramp_up_s, ramp_from, finish_by, send_window, \
     deliver_at_local, late_policy, created_at, updated_at";

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
    priority: String,
    ramp_up_s: Option<f64>,
    ramp_from: Option<f64>,
    finish_by: Option<DateTime<Utc>>,
    send_window: Option<String>,
    deliver_at_local: Option<String>,
    late_policy: String,
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
        let priority = row
            .priority
            .parse::<PriorityClass>()
            .map_err(|e| corrupt(format!("campaign {:?}: {e}", row.id)))?;
        let local = row
            .local()
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
            priority,
            ramp_up_s: row.ramp_up_s,
            ramp_from: row.ramp_from,
            finish_by: row.finish_by,
            local,
            created_at: row.created_at,
            updated_at: row.updated_at,
        })
    }
}
/// `t` with its sub-second part dropped.
pub(crate) fn truncate_to_second(t: DateTime<Utc>) -> DateTime<Utc> {
    DateTime::from_timestamp(t.timestamp(), 0).unwrap_or(t)
}

impl CampaignRow {
    /// The stored local-time columns, read back through the API's own checks (a PUT
    /// of one of them is checked against the others this way).
    pub(super) fn local(&self) -> Result<LocalPolicy, WindowError> {
        let window = self
            .send_window
            .as_deref()
            .map(serde_json::from_str::<serde_json::Value>)
            .transpose()
            .map_err(|e| WindowError {
                field: "send_window",
                problem: e.to_string(),
            })?;
        let at = self.deliver_at_local.clone().map(serde_json::Value::String);
        let late = serde_json::Value::String(self.late_policy.clone());
        LocalPolicy::parse_fields(window.as_ref(), at.as_ref(), Some(&late))
    }
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
        assert_eq!((p.ramp_up_s, p.ramp_from, p.finish_by), (None, None, None));
        let p: CampaignPatch = serde_json::from_str(
            r#"{"priority": "bulk", "ramp_up_s": null, "ramp_from": 0.2, "finish_by": null}"#,
        )
        .unwrap();
        assert_eq!(p.priority, Some(PriorityClass::Bulk));
        assert_eq!((p.ramp_up_s, p.ramp_from), (Some(None), Some(Some(0.2))));
        assert_eq!(p.finish_by, Some(None));
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
