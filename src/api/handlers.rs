//! The endpoint handlers: the campaign views (list, one, change, pause, resume) here,
//! health and metrics, the PUT body and the dead letters in the files below. Input is
//! checked with the store's own rules, so that a bad value is a 422 naming its field
//! before any SQL runs.

use super::error::ApiError;
use super::lifecycle::{self, Eta, PolicyView, Progress, WorkerCounts};
use super::{AppState, CampaignId};
use crate::limiter::Algorithm;
use crate::store::campaign_list::{self, ListQuery};
use crate::store::campaigns::{self, CampaignStatus, CampaignSummary};
use crate::store::delivery;
use crate::store::worker_campaigns::{self, Summed};
use crate::worker::scheduler::{CampaignLive, MAX_ZONES_SHOWN};
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use std::collections::HashMap;

pub mod apps;
mod dead_letter_page;
mod health;
mod patch;

pub use dead_letter_page::dead_letters;
pub use health::{healthz, metrics, readyz, ReadyCache};
pub use patch::parse_patch;

pub(super) type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

/// What the worker is doing with a campaign right now.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LiveView {
    /// Holding a slot (false: waiting for one).
    pub active: bool,
    pub paused: bool,
    /// Why the worker holds it halted (a provider's configuration error), if it does.
    pub halted: Option<String>,
    /// Its send_rate as the worker holds it.
    pub rate: f64,
    /// The rate its limiter runs at: `rate`, or its share while a global cap, its
    /// provider's max_rate or its provider's adaptive ceiling binds.
    pub effective_rate: f64,
    pub algorithm: Algorithm,
    /// Counts since the worker took the campaign up.
    pub sent: u64,
    pub failed: u64,
    pub retried: u64,
    pub in_flight: u32,
    pub open_jobs: u32,
    /// Devices of its jobs held in memory, not finished.
    pub held_devices: u64,
    /// Devices in its parked jobs.
    pub parked_devices: u64,
    /// Its start_at is still ahead.
    pub waiting_start: bool,
    /// The registered app its next sends go through, if any.
    pub app_id: Option<String>,
    /// Why its sends wait for that app (`waiting for app X: …`), when they do.
    pub waiting_for_app: Option<String>,
    /// While it ramps up: the fraction of its full rate allowed now (0–1).
    pub ramp: Option<f64>,
    /// How long it has had work but no share under a cap, because higher classes took
    /// the cap; null while it gets its share.
    pub starved_ms: Option<u64>,
}

/// A zone's current or next window (`opens` may be past while it is open).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ZoneWindow {
    pub zone: String,
    pub opens: Option<DateTime<Utc>>,
    pub closes: Option<DateTime<Utc>>,
}

/// Each zone's next window under `local` at `now`.
fn zone_windows(
    local: &crate::job::window::LocalPolicy,
    zones: &[crate::job::window::Zone],
    now: DateTime<Utc>,
) -> Vec<ZoneWindow> {
    zones
        .iter()
        .map(|z| {
            let next = crate::job::window::next_windows(local, z, now.timestamp_millis(), 1);
            let at = |ms: i64| DateTime::from_timestamp_millis(ms);
            ZoneWindow {
                zone: z.to_string(),
                opens: next.first().and_then(|w| at(w.0)),
                closes: next.first().and_then(|w| at(w.1)),
            }
        })
        .collect()
}

impl From<&CampaignLive> for LiveView {
    fn from(c: &CampaignLive) -> Self {
        Self {
            active: c.active,
            paused: c.paused,
            halted: c.halted.as_deref().map(str::to_string),
            rate: c.rate,
            effective_rate: c.effective_rate,
            algorithm: c.algorithm,
            sent: c.sent,
            failed: c.failed,
            retried: c.retried,
            in_flight: c.in_flight,
            open_jobs: c.open_jobs,
            held_devices: c.held_devices,
            parked_devices: 0,
            waiting_start: c.waiting_start,
            app_id: c.app_id.as_deref().map(str::to_string),
            waiting_for_app: c.waiting_for_app.as_deref().map(str::to_string),
            ramp: c.ramp,
            starved_ms: c.starved_ms,
        }
    }
}

/// A campaign as the API shows it: stored settings, totals, and the worker's view.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CampaignView {
    #[serde(flatten)]
    pub summary: CampaignSummary,
    /// Whether this worker holds a slot for it now.
    pub active: bool,
    /// Its start_at is still ahead.
    pub scheduled: bool,
    pub live: Option<LiveView>,
    pub progress: Progress,
    pub eta: Eta,
    /// Its class, ramp and deadline, and whether it keeps to the deadline.
    pub policy: PolicyView,
}

/// What the worker publishes: its campaigns and the devices each has parked.
struct Live {
    campaigns: std::sync::Arc<Vec<CampaignLive>>,
    parked: std::sync::Arc<Vec<(std::sync::Arc<str>, u64)>>,
    /// The zones of each campaign's jobs parked until their window opens.
    zones: crate::worker::backlog::WindowZones,
    /// Every worker's published figures (this one's included), by campaign.
    summed: HashMap<String, Summed>,
}

fn view(summary: CampaignSummary, live: &Live, now: DateTime<Utc>) -> CampaignView {
    let id = &*summary.campaign.id;
    let parked = live
        .parked
        .iter()
        .find(|(c, _)| &**c == id)
        .map_or(0, |(_, n)| *n);
    let found = live.campaigns.iter().find(|c| &*c.id == id);
    let counts = match live.summed.get(id) {
        // Summed over the workers that hold it (published within the last seconds).
        Some(s) => WorkerCounts {
            held: s.held,
            parked: s.parked,
            total: s.total_devices,
            effective_rate: (s.effective_rate > 0.0).then_some(s.effective_rate),
            waiting_start: found.is_some_and(|c| c.waiting_start),
            workers: s.workers,
        },
        None => WorkerCounts {
            held: found.map_or(0, |c| c.held_devices),
            parked,
            total: found.and_then(|c| c.total_devices),
            effective_rate: found.map(|c| c.effective_rate),
            waiting_start: found.is_some_and(|c| c.waiting_start),
            workers: u32::from(found.is_some() || parked > 0),
        },
    };
    let (progress, eta) = lifecycle::progress(&summary, counts);
    let mut policy = lifecycle::policy(&summary.campaign, &progress, &eta, now);
    let zones = zones_here(found, &live.zones, id);
    policy.next_windows = zone_windows(&summary.campaign.local, &zones, now);
    let live = found.map(|c| LiveView {
        parked_devices: parked,
        ..LiveView::from(c)
    });
    CampaignView {
        active: live.as_ref().is_some_and(|l| l.active),
        scheduled: summary.campaign.start_at.is_some_and(|t| t > now),
        live,
        progress,
        eta,
        policy,
        summary,
    }
}

/// The zones of the campaign's jobs this worker holds, then of those it has parked
/// until their window opens (at most [`MAX_ZONES_SHOWN`] in all).
fn zones_here(
    found: Option<&CampaignLive>,
    waiting: &crate::worker::backlog::WindowZones,
    id: &str,
) -> Vec<crate::job::window::Zone> {
    let mut zones = found.map(|c| c.zones.clone()).unwrap_or_default();
    let parked = waiting.iter().find(|(c, _)| &**c == id);
    for z in parked.map(|(_, z)| z.as_slice()).unwrap_or_default() {
        if zones.len() == MAX_ZONES_SHOWN {
            break;
        }
        if !zones.contains(z) {
            zones.push(*z);
        }
    }
    zones
}

/// This worker's snapshots, and every worker's published figures (`only`: for one
/// campaign). A failed read of the latter leaves this worker's own.
async fn live_campaigns(state: &AppState, only: Option<&str>) -> Live {
    let summed = worker_campaigns::summed(state.pool(), only)
        .await
        .unwrap_or_else(|e| {
            tracing::warn!(error = %e, "workers' progress not read; showing this worker's");
            HashMap::new()
        });
    Live {
        campaigns: state.worker().map(|w| w.campaigns()).unwrap_or_default(),
        parked: state
            .worker()
            .map(|w| w.parked_devices())
            .unwrap_or_default(),
        zones: state.worker().map(|w| w.window_zones()).unwrap_or_default(),
        summed,
    }
}

/// `?limit=&after=&status=&order=id|active_first`: a page, its next cursor in the
/// `x-next-after` header (absent on the last page); no parameter: the whole list.
pub async fn list_campaigns(
    State(state): State<AppState>,
    query: Params,
) -> Result<Response, ApiError> {
    let q = params(query, &["limit", "after", "status", "order"])?;
    let arg = |k: &str| q.get(k).map(String::as_str);
    let list = ListQuery::parse(arg("limit"), arg("after"), arg("status"), arg("order"))?;
    let now = Utc::now();
    let page = campaign_list::page(state.pool(), now, &list).await?;
    let live = live_campaigns(&state, None).await;
    let views: Vec<CampaignView> = page
        .items
        .into_iter()
        .map(|s| view(s, &live, now))
        .collect();
    let mut response = Json(views).into_response();
    if let Some(next) = page.next {
        // Ids are ASCII from [A-Za-z0-9._:-]: always a valid header value.
        let value = header::HeaderValue::from_str(&next.to_text(list.order))
            .map_err(|e| ApiError::Internal(e.to_string()))?;
        response.headers_mut().insert("x-next-after", value);
    }
    Ok(response)
}

pub(super) async fn load_view(state: &AppState, id: &str) -> Result<CampaignView, ApiError> {
    let campaign = campaigns::get(state.pool(), id)
        .await?
        .ok_or_else(|| ApiError::CampaignNotFound(id.to_string()))?;
    let totals = delivery::totals(state.pool(), id).await?;
    // The same window as the list: the 10 complete seconds before now.
    let end = Utc::now();
    let last10 = delivery::series(state.pool(), id, end - Duration::seconds(10), end).await?;
    let rate_10s = last10.iter().map(|p| p.sent).sum::<i64>() as f64 / 10.0;
    let summary = CampaignSummary {
        campaign,
        sent: totals.sent,
        failed: totals.failed,
        retried: totals.retried,
        invalid: totals.invalid,
        rejected: totals.rejected,
        expired: totals.expired,
        cancelled: totals.cancelled,
        rate_10s,
    };
    Ok(view(
        summary,
        &live_campaigns(state, Some(id)).await,
        Utc::now(),
    ))
}

pub async fn get_campaign(
    State(state): State<AppState>,
    CampaignId(id): CampaignId,
) -> Result<Json<CampaignView>, ApiError> {
    Ok(Json(load_view(&state, &id).await?))
}
fn body_bytes(body: Result<Bytes, BytesRejection>) -> Result<Bytes, ApiError> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::PayloadTooLarge {
                limit: super::MAX_BODY_BYTES,
            }
        } else {
            ApiError::BadBody(e.body_text())
        }
    })
}

pub async fn put_campaign(
    State(state): State<AppState>,
    CampaignId(id): CampaignId,
    headers: axum::http::HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<CampaignView>), ApiError> {
    campaigns::validate_id(&id)?;
    let who = lifecycle::actor(&headers)?;
    let patch = parse_patch(&body_bytes(body)?)?;
    let existed = campaigns::get(state.pool(), &id).await?.is_some();
    let campaign =
        campaigns::put_by(state.pool(), &id, &patch, &state.inner.defaults, Some(&who)).await?;
    tracing::info!(
        campaign = %campaign.id,
        send_rate = campaign.send_rate,
        algorithm = %campaign.algorithm,
        burst = campaign.burst,
        limiter_scope = campaign.limiter_scope.map_or("default", |s| s.as_str()),
        created = !existed,
        "campaign changed through the API"
    );
    let status = if existed {
        StatusCode::OK
    } else {
        StatusCode::CREATED
    };
    Ok((status, Json(load_view(&state, &id).await?)))
}

async fn set_status(
    state: &AppState,
    id: &str,
    status: CampaignStatus,
    headers: &axum::http::HeaderMap,
) -> Result<Json<CampaignView>, ApiError> {
    let who = lifecycle::actor(headers)?;
    let campaign = campaigns::set_status_by(state.pool(), id, status, Some(&who)).await?;
    tracing::info!(campaign = %campaign.id, status = %campaign.status, "campaign status changed through the API");
    Ok(Json(load_view(state, id).await?))
}

pub async fn pause(
    State(state): State<AppState>,
    CampaignId(id): CampaignId,
    headers: axum::http::HeaderMap,
) -> Result<Json<CampaignView>, ApiError> {
    set_status(&state, &id, CampaignStatus::Paused, &headers).await
}

pub async fn resume(
    State(state): State<AppState>,
    CampaignId(id): CampaignId,
    headers: axum::http::HeaderMap,
) -> Result<Json<CampaignView>, ApiError> {
    set_status(&state, &id, CampaignStatus::Active, &headers).await
}

pub(super) fn params(p: Params, known: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let Query(map) = p.map_err(|e| ApiError::invalid("query", e.body_text()))?;
    if let Some(unknown) = map.keys().find(|k| !known.contains(&k.as_str())) {
        return Err(ApiError::invalid(
            unknown.clone(),
            format!("unknown parameter; expected one of {}", known.join(", ")),
        ));
    }
    Ok(map)
}

pub(super) fn timestamp(field: &str, raw: &str) -> Result<DateTime<Utc>, ApiError> {
    DateTime::parse_from_rfc3339(raw)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| {
            ApiError::invalid(
                field,
                format!("{raw:?} is not an RFC 3339 time such as 2026-11-22T10:00:00Z: {e}"),
            )
        })
}
pub async fn no_route(uri: Uri) -> ApiError {
    ApiError::NoRoute(uri.path().to_string())
}
