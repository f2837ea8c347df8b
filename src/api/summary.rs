//! `GET /api/summary`: the figures of the dashboard's summary strip in one read. Public,
//! like the campaign list: rates and counts only, no device token and no payload.

use super::{ApiError, AppState};
use crate::store::campaigns::{self, CampaignStatus, CampaignSummary};
use crate::store::StoreError;
use crate::worker::scheduler::CampaignLive;
use axum::extract::State;
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use sqlx::PgPool;

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Summary {
    /// Sends per second over the 10 complete seconds before now, every campaign and
    /// every worker (the store's count).
    pub sends_per_s: f64,
    /// The summed send_rate of the campaigns at work: active, started, and held by this
    /// worker or sending in the last 10 s (an active campaign with nothing left to send
    /// asks for nothing).
    pub send_rate_sum: f64,
    pub caps: Caps,
    pub campaigns: Counts,
    /// Dead letters written in the last hour.
    pub dead_letters_last_hour: i64,
    /// Each provider of the worker in this process; empty without one.
    pub providers: Vec<ProviderState>,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Caps {
    /// `limiter.global_rate`; null when none is set, or not known to this API.
    pub global: Option<f64>,
}

/// Campaigns by status, each counted once: an active campaign whose `start_at` is still
/// ahead counts as `scheduled`.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Counts {
    pub active: u32,
    pub paused: u32,
    pub halted: u32,
    pub scheduled: u32,
    pub cancelled: u32,
    pub done: u32,
}

#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProviderState {
    pub name: String,
    /// `clear`, `backing off` or `paused`.
    pub state: &'static str,
    /// The adaptive ceiling while one binds.
    pub ceiling: Option<f64>,
}

pub async fn get(State(state): State<AppState>) -> Result<Json<Summary>, ApiError> {
    let now = Utc::now();
    let (list, dead_letters) = tokio::try_join!(
        campaigns::list(state.pool(), now),
        dead_letters_since(state.pool(), now - Duration::hours(1)),
    )?;
    let live = state.worker().map(|w| w.campaigns()).unwrap_or_default();
    let providers = state.worker().map(|w| w.providers()).unwrap_or_default();
    let mut summary = summarise(&list, &live, now);
    summary.dead_letters_last_hour = dead_letters;
    summary.caps.global = state.global_rate();
    summary.providers = providers
        .iter()
        .map(|p| ProviderState {
            name: p.name.to_string(),
            state: p.state,
            ceiling: p.ceiling,
        })
        .collect();
    Ok(Json(summary))
}

/// One parameterised COUNT over the `created_at` index.
async fn dead_letters_since(pool: &PgPool, since: DateTime<Utc>) -> Result<i64, StoreError> {
    let n = sqlx::query_scalar("SELECT count(*) FROM dead_letters WHERE created_at >= $1")
        .bind(since)
        .fetch_one(pool)
        .await?;
    Ok(n)
}

/// The rates and counts of `list`; dead letters and providers are left empty.
fn summarise(list: &[CampaignSummary], live: &[CampaignLive], now: DateTime<Utc>) -> Summary {
    let mut counts = Counts::default();
    let mut send_rate_sum = 0.0;
    for s in list {
        let c = &s.campaign;
        let scheduled = c.start_at.is_some_and(|t| t > now);
        let slot = match c.status {
            CampaignStatus::Active if scheduled => &mut counts.scheduled,
            CampaignStatus::Active => &mut counts.active,
            CampaignStatus::Paused => &mut counts.paused,
            CampaignStatus::Halted => &mut counts.halted,
            CampaignStatus::Cancelled => &mut counts.cancelled,
            CampaignStatus::Done => &mut counts.done,
        };
        *slot += 1;
        let held = live
            .iter()
            .any(|l| *l.id == *c.id && l.active && !l.paused && l.halted.is_none());
        if c.status == CampaignStatus::Active && !scheduled && (held || s.rate_10s > 0.0) {
            send_rate_sum += c.send_rate;
        }
    }
    Summary {
        sends_per_s: list.iter().map(|s| s.rate_10s).sum(),
        send_rate_sum,
        caps: Caps { global: None },
        campaigns: counts,
        dead_letters_last_hour: 0,
        providers: Vec::new(),
    }
}
