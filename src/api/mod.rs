//! The operator HTTP API and dashboard (axum), served next to the worker.
//!
//! - `GET /healthz`, `GET /readyz` (broker, PostgreSQL, migrations, each by name);
//! - `GET /metrics`: Prometheus text ([`crate::metrics`]);
//! - `GET /api/campaigns`, `GET|PUT /api/campaigns/{id}`,
//!   `POST /api/campaigns/{id}/pause|resume|cancel`, `GET /api/campaigns/{id}/series`,
//!   `GET /api/campaigns/{id}/events` (its settings history), `GET /api/summary`;
//! - `GET /api/dead-letters` (admin token: it holds device tokens and payloads);
//! - `GET /api/apps`, `GET|PUT|DELETE /api/apps/{id}`, `POST /api/apps/{id}/disable|enable`
//!   (admin token: the app registry, [`crate::apps`]);
//! - `GET /`: the dashboard, its script and the vendored uPlot, all built into the binary.
//!
//! Every request must name an allowed `Host` ([`auth::AllowedHosts`]), and every campaign
//! id the API takes follows the job format's rule ([`CampaignId`]), refused with 400.
//!
//! The API only writes the store: the `campaigns` trigger NOTIFYs, the worker's
//! `CampaignWatcher` re-reads and the scheduler applies the change within a second. What
//! the worker is doing right now (which campaigns it holds, their live counts) comes from
//! its published snapshots, through [`WorkerView`]; without a worker in the process the
//! API still serves everything the store holds.
//!
//! - [`auth`]: the admin token check and the `Host` check.
//! - [`error`]: [`ApiError`] and its JSON responses.

pub mod auth;
mod dashboard;
pub mod error;
mod handlers;
pub mod lifecycle;
mod providers;
mod series;
mod summary;

pub use error::ApiError;

use crate::store::CampaignDefaults;
use crate::worker::consumer::ConsumerStats;
use crate::worker::scheduler::{CampaignLive, SchedulerStats};
use crate::worker::Worker;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path};
use axum::http::request::Parts;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::PrometheusHandle;
use secrecy::{ExposeSecret, SecretString};
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;

/// The largest request body accepted, in bytes (a campaign change is well under 100).
pub const MAX_BODY_BYTES: usize = 16 * 1024;

/// What the API reads of a running worker: its published snapshots.
#[derive(Clone, Debug)]
pub struct WorkerView {
    pub scheduler: watch::Receiver<SchedulerStats>,
    pub consumer: watch::Receiver<ConsumerStats>,
    /// False once the Kafka consumer thread has ended.
    pub consumer_running: watch::Receiver<bool>,
}

impl WorkerView {
    pub fn of(worker: &Worker) -> Self {
        Self {
            scheduler: worker.scheduler_stats.clone(),
            consumer: worker.consumer_stats.clone(),
            consumer_running: worker.consumer_running.clone(),
        }
    }

    /// The campaigns the worker holds now (active or waiting for a slot).
    pub fn campaigns(&self) -> Arc<Vec<CampaignLive>> {
        self.scheduler.borrow().campaigns.clone()
    }

    /// Devices in each campaign's parked jobs.
    pub fn parked_devices(&self) -> Arc<Vec<(Arc<str>, u64)>> {
        self.consumer.borrow().parked_devices.clone()
    }

    /// The zones of each campaign's jobs parked until their window opens.
    pub fn window_zones(&self) -> crate::worker::backlog::WindowZones {
        self.consumer.borrow().window_zones.clone()
    }

    /// Each provider's lane: adaptive ceiling, state and recent history.
    pub fn providers(&self) -> Arc<Vec<crate::worker::scheduler::ProviderLive>> {
        self.scheduler.borrow().providers.clone()
    }
}

/// Everything a handler needs; cheap to clone.
#[derive(Clone)]
pub struct AppState {
    inner: Arc<Inner>,
}

struct Inner {
    pool: PgPool,
    admin_token: SecretString,
    defaults: CampaignDefaults,
    /// `/readyz`'s checks: cached, on a connection and a Kafka client of their own.
    readiness: handlers::ReadyCache,
    worker: Option<WorkerView>,
    metrics: Option<PrometheusHandle>,
    /// `limiter.global_rate`, for the summary.
    global_rate: Option<f64>,
    /// `[apps]`' master keys; `None`: apps can be read but not put.
    keyring: Option<Arc<crate::apps::Keyring>>,
    /// What the apps' providers take from `[sender]` and `[apps]` (for `check`).
    app_defaults: crate::apps::provider::AppDefaults,
}

impl AppState {
    /// `bootstrap` is the broker the readiness check pings (the embedded broker's real
    /// address when `kafka.brokers = "embedded"`).
    pub fn new(
        pool: PgPool,
        settings: &crate::config::Settings,
        bootstrap: String,
        worker: Option<WorkerView>,
        metrics: Option<PrometheusHandle>,
    ) -> Self {
        Self {
            inner: Arc::new(Inner {
                admin_token: settings.http.admin_token.clone(),
                defaults: crate::worker::campaign_defaults(settings),
                readiness: handlers::ReadyCache::new(
                    Arc::new(crate::limiter::MonotonicClock::new()),
                    &pool,
                    settings.kafka.clone(),
                    bootstrap,
                    Duration::from_secs(2),
                ),
                pool,
                worker,
                metrics,
                global_rate: settings.limiter.global_rate().map(|r| r.as_f64()),
                keyring: settings.apps.keyring.clone(),
                app_defaults: crate::apps::provider::AppDefaults::from_settings(settings),
            }),
        }
    }

    pub fn pool(&self) -> &PgPool {
        &self.inner.pool
    }

    pub(crate) fn admin_token(&self) -> Option<&str> {
        let t = self.inner.admin_token.expose_secret();
        (!t.is_empty()).then_some(t)
    }

    /// The configured cap over all campaigns, per second.
    pub(crate) fn global_rate(&self) -> Option<f64> {
        self.inner.global_rate
    }

    pub(crate) fn readiness(&self) -> &handlers::ReadyCache {
        &self.inner.readiness
    }

    pub(crate) fn worker(&self) -> Option<&WorkerView> {
        self.inner.worker.as_ref()
    }

    pub(crate) fn keyring(&self) -> Option<&crate::apps::Keyring> {
        self.inner.keyring.as_deref()
    }

    pub(crate) fn app_defaults(&self) -> &crate::apps::provider::AppDefaults {
        &self.inner.app_defaults
    }
}

/// A campaign id taken from the path (`{id}`), checked with the job format's rule
/// (1–128 characters from `[A-Za-z0-9._:-]`): a bad one is a 400 naming it, before any
/// SQL runs.
#[derive(Debug, Clone)]
pub struct CampaignId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for CampaignId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        path_id(parts, state).await.map(CampaignId)
    }
}

/// The `{id}` of a path (a campaign's or an app's), checked with the job format's id
/// rule: a bad one is a 400 naming `id`.
pub(crate) async fn path_id<S: Send + Sync>(
    parts: &mut Parts,
    state: &S,
) -> Result<String, ApiError> {
    let Path(id) = Path::<String>::from_request_parts(parts, state)
        .await
        .map_err(|e| ApiError::InvalidId {
            field: "id",
            reason: e.body_text(),
        })?;
    check_campaign_id("id", &id)?;
    Ok(id)
}

/// Checks a campaign id given as `field` with the job format's rule.
pub fn check_campaign_id(field: &'static str, id: &str) -> Result<(), ApiError> {
    crate::job::check_id(field, id).map_err(|e| ApiError::InvalidId {
        field,
        reason: match e {
            crate::job::JobError::Field { problem, .. } => problem,
            other => other.to_string(),
        },
    })
}

/// The whole HTTP surface. `hosts` are the `Host` values served (see [`auth`]).
pub fn router(state: AppState, hosts: auth::AllowedHosts) -> Router {
    // Changes, and the dead letters (they hold device tokens and payloads).
    let guarded = Router::new()
        .route(
            "/api/campaigns/{id}",
            axum::routing::put(handlers::put_campaign),
        )
        .route("/api/campaigns/{id}/pause", post(handlers::pause))
        .route("/api/campaigns/{id}/resume", post(handlers::resume))
        .route("/api/campaigns/{id}/cancel", post(lifecycle::cancel))
        .route("/api/dead-letters", get(handlers::dead_letters))
        .merge(handlers::apps::routes())
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            auth::require_admin,
        ));
    Router::new()
        .route("/healthz", get(handlers::healthz))
        .route("/readyz", get(handlers::readyz))
        .route("/metrics", get(handlers::metrics))
        .route("/api/campaigns", get(handlers::list_campaigns))
        .route("/api/campaigns/{id}", get(handlers::get_campaign))
        .route("/api/campaigns/{id}/series", get(series::series))
        .route("/api/campaigns/{id}/events", get(lifecycle::list_events))
        .route("/api/providers", get(providers::list))
        .route("/api/summary", get(summary::get))
        .merge(guarded)
        .merge(dashboard::routes())
        .fallback(handlers::no_route)
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(axum::middleware::from_fn_with_state(
            Arc::new(hosts),
            auth::require_known_host,
        ))
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}

/// Parses a span such as `90s`, `5m`, `2h`, `30d` (a bare number is seconds), as the
/// API's `last` parameter and the CLI's `--last` and `--older-than` take it.
pub fn parse_duration(raw: &str) -> Result<chrono::Duration, String> {
    let s = raw.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (digits, unit) = s.split_at(split);
    let n: i64 = digits
        .parse()
        .map_err(|_| format!("{raw:?} is not a duration such as 90s, 5m, 2h or 30d"))?;
    let secs_per = match unit.trim() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        other => return Err(format!("{raw:?}: unknown unit {other:?}; use s, m, h or d")),
    };
    n.checked_mul(secs_per)
        .and_then(chrono::Duration::try_seconds)
        .ok_or_else(|| format!("{raw:?} is too long"))
}

#[cfg(test)]
mod tests {
    use super::parse_duration;

    #[test]
    fn durations() {
        assert_eq!(parse_duration("90").unwrap().num_seconds(), 90);
        assert_eq!(parse_duration("5m").unwrap().num_seconds(), 300);
        assert_eq!(parse_duration("2h").unwrap().num_seconds(), 7200);
        assert_eq!(parse_duration("30d").unwrap().num_seconds(), 30 * 86_400);
        for bad in ["", "m", "5x", "-5m", "1.5h", "99999999999999999999d"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
    }
}
