//! `GET /api/providers`: each provider's lane as the worker in this process sees it:
//! its adaptive ceiling, its state (`clear`, `backing off`, `paused` until when), the
//! p95 latency of the last second, congestion counts, and the last 5 minutes of
//! ceiling, summed send_rate and achieved rate (one point a second) for the chart.

use super::AppState;
use crate::worker::scheduler::ProviderLive;
use axum::extract::State;
use axum::Json;

/// The providers of the worker in this process; empty when none runs here.
pub async fn list(State(state): State<AppState>) -> Json<Vec<ProviderLive>> {
    let providers = state.worker().map(|w| w.providers()).unwrap_or_default();
    Json(providers.as_ref().clone())
}
