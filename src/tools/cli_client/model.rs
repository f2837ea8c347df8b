//! The API's answers as the CLI reads them: a campaign, its progress, ETA, live state,
//! and one point of a series. Only the fields the CLI prints; the rest are ignored.

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
}

/// One second of a series, as the API returns it.
#[derive(Debug, Clone, Copy, serde::Deserialize, serde::Serialize)]
pub struct PointOut {
    pub t: DateTime<Utc>,
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
}
