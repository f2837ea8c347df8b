//! The API's answers as the CLI reads them: a campaign, its progress, ETA, delivery
//! policy, live state, and one point of a series. Only the fields the CLI prints; the
//! rest are ignored.

use chrono::{DateTime, Utc};

// serde default for `weight`: an answer without one means the neutral weight.
fn one() -> f64 {
    1.0
}

/// A campaign as the API returns it (the fields the CLI prints).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct CampaignOut {
    pub id: String,
    pub send_rate: f64,
    pub algorithm: String,
    pub burst: u32,
    pub status: String,
    /// `None`: the worker's configured limiter.scope.
    #[serde(default)]
    pub limiter_scope: Option<String>,
    #[serde(default = "one")]
    pub weight: f64,
    #[serde(default)]
    pub start_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expired: i64,
    #[serde(default)]
    pub cancelled: i64,
    #[serde(default)]
    pub progress: Option<ProgressOut>,
    #[serde(default)]
    pub eta: Option<EtaOut>,
    /// Why a provider's answer halted it, while halted.
    #[serde(default)]
    pub halt_reason: Option<String>,
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
    /// Tokens the provider said are dead.
    #[serde(default)]
    pub invalid: i64,
    /// Devices the provider refused for good.
    #[serde(default)]
    pub rejected: i64,
    pub rate_10s: f64,
    pub active: bool,
    pub live: Option<LiveOut>,
    /// Its class, ramp, deadline and window (absent from an older API).
    #[serde(default)]
    pub policy: Option<PolicyOut>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct ProgressOut {
    pub finished: i64,
    pub known_remaining: u64,
    pub total: Option<u64>,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct EtaOut {
    pub seconds: Option<f64>,
    pub rate: f64,
    pub basis: String,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct LiveOut {
    pub active: bool,
    pub paused: bool,
    pub sent: u64,
    pub failed: u64,
    pub in_flight: u32,
    pub open_jobs: u32,
    /// While it ramps up: the fraction of its full rate allowed now.
    #[serde(default)]
    pub ramp: Option<f64>,
    /// How long it has had work but no share under a cap (higher classes took it).
    #[serde(default)]
    pub starved_ms: Option<u64>,
}

// serde default for `priority`: an answer without one means the default class.
fn normal() -> String {
    "normal".into()
}

/// A field that may be absent (`None`: the API does not know it) or null (`Some(Null)`:
/// known, and not set).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    <serde_json::Value as serde::Deserialize>::deserialize(d).map(Some)
}

/// A campaign's delivery policy as the API shows it.
#[derive(Debug, Clone, serde::Deserialize)]
pub struct PolicyOut {
    #[serde(default = "normal")]
    pub priority: String,
    /// `None`: the worker's `limiter.ramp_up_s`.
    #[serde(default)]
    pub ramp_up_s: Option<f64>,
    /// `None`: the worker's `limiter.ramp_from`.
    #[serde(default)]
    pub ramp_from: Option<f64>,
    #[serde(default)]
    pub finish_by: Option<DateTime<Utc>>,
    /// The projected finish is later than `finish_by`, or it passed with devices left.
    #[serde(default)]
    pub behind: bool,
    #[serde(default)]
    pub projected_finish: Option<DateTime<Utc>>,
    /// `{"from": "09:00", "to": "21:00", "days": [...]}` or null; kept as JSON so that a
    /// shape the CLI does not know yet still prints.
    #[serde(default, deserialize_with = "present")]
    pub send_window: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    pub deliver_at_local: Option<serde_json::Value>,
    #[serde(default, deserialize_with = "present")]
    pub late_policy: Option<serde_json::Value>,
    /// `[{zone, opens, closes}]`, per device time zone.
    #[serde(default)]
    pub next_windows: Option<Vec<serde_json::Value>>,
}

/// One second of a series, as the API returns it.
#[derive(Debug, Clone, Copy, serde::Deserialize, serde::Serialize)]
pub struct PointOut {
    pub t: DateTime<Utc>,
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
}
