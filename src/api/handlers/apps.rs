//! The app registry's endpoints ([`crate::apps`]), all behind the admin token:
//!
//! - `PUT /api/apps/{id}`: create (201) or replace (200); a bad field is a 422 naming it
//!   (`apns.key`, `fcm.service_account.private_key`, `webpush.vapid_key`…). Without a
//!   master key it is a 503 that says how to configure one.
//! - `GET /api/apps?limit=&after=` (paged as the campaigns are: the next cursor in
//!   `x-next-after`, absent on the last page) and `GET /api/apps/{id}`, each kind with
//!   its `live` lane in this worker and the app's `campaigns` ([`views`]);
//! - `POST /api/apps/{id}/disable|enable` (enable also ends a halt);
//! - `DELETE /api/apps/{id}[?force=true]`: 409 while campaigns still send through it.
//! - `POST /api/apps/{id}/check`: each kind's authentication round trip (200 with a
//!   result per kind, `ok` false naming what failed; 404 for an unknown app).
//!
//! Answers show fingerprints, settings and statuses, never a secret: the views come from
//! the store's reads, which do not open a sealed row.

use super::{body_bytes, params, Params};
use crate::api::error::ApiError;
use crate::api::{lifecycle, AppState};
use crate::apps::store::{self, AppView};
use crate::apps::AppsError;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{FromRequestParts, State};
use axum::http::request::Parts;
use axum::http::{header, HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use views::AppDetail;

mod views;

/// The routes; the caller puts them behind the admin token.
pub fn routes() -> Router<AppState> {
    Router::new()
        .route("/api/apps", get(list))
        .route("/api/apps/{id}", get(show).put(put).delete(delete))
        .route("/api/apps/{id}/disable", post(disable))
        .route("/api/apps/{id}/enable", post(enable))
        .route("/api/apps/{id}/check", post(check))
}

impl From<AppsError> for ApiError {
    fn from(e: AppsError) -> Self {
        match e {
            AppsError::Invalid(f) => ApiError::invalid(f.field, f.reason),
            AppsError::NotFound(id) => ApiError::AppNotFound(id),
            e @ AppsError::InUse { .. } => ApiError::Conflict(e.to_string()),
            e @ AppsError::NoMasterKey => ApiError::Unavailable(format!(
                "the app registry cannot seal credentials: {e}, then restart pushpace"
            )),
            AppsError::Database(e) => ApiError::Store(crate::store::StoreError::Database(e)),
            // Opening is not done by these endpoints; kept apart from a 500 all the same.
            e @ (AppsError::NoCredentials { .. }
            | AppsError::Disabled { .. }
            | AppsError::Halted { .. }) => ApiError::Conflict(e.to_string()),
        }
    }
}

/// An app id from the path, checked with the job format's rule (400 naming `id`).
pub struct AppId(pub String);

impl<S: Send + Sync> FromRequestParts<S> for AppId {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, ApiError> {
        crate::api::path_id(parts, state).await.map(AppId)
    }
}

async fn list(State(state): State<AppState>, query: Params) -> Result<Response, ApiError> {
    let q = params(query, &["limit", "after"])?;
    let limit = q
        .get("limit")
        .map(|raw| {
            raw.parse::<i64>().map_err(|_| {
                ApiError::invalid(
                    "limit",
                    format!("must be a whole number from 1 to {}", store::MAX_PAGE),
                )
            })
        })
        .transpose()?;
    let page = store::page(state.pool(), limit, q.get("after").map(String::as_str)).await?;
    let ids: Vec<&str> = page.items.iter().map(|a| a.id.as_str()).collect();
    let mut campaigns = store::campaigns_by_app(state.pool(), &ids).await?;
    let providers = state.worker().map(|w| w.providers()).unwrap_or_default();
    let lanes = views::app_lanes(&providers);
    let now_s = unix_now_s();
    let items: Vec<AppDetail> = page
        .items
        .into_iter()
        .map(|app| {
            let c = campaigns.remove(&app.id).unwrap_or_default();
            views::detail(app, &lanes, c, now_s, false)
        })
        .collect();
    let mut response = Json(items).into_response();
    if let Some(next) = page.next {
        // Ids are ASCII from [A-Za-z0-9._:-]: always a valid header value.
        let value =
            header::HeaderValue::from_str(&next).map_err(|e| ApiError::Internal(e.to_string()))?;
        response.headers_mut().insert("x-next-after", value);
    }
    Ok(response)
}

/// The current unix second (what the lanes' history is stamped in).
fn unix_now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

async fn show(
    State(state): State<AppState>,
    AppId(id): AppId,
) -> Result<Json<AppDetail>, ApiError> {
    let app = store::get(state.pool(), &id)
        .await?
        .ok_or(ApiError::AppNotFound(id))?;
    let campaigns = store::campaigns_by_app(state.pool(), &[app.id.as_str()])
        .await?
        .remove(&app.id)
        .unwrap_or_default();
    let providers = state.worker().map(|w| w.providers()).unwrap_or_default();
    let lanes = views::app_lanes(&providers);
    Ok(Json(views::detail(
        app,
        &lanes,
        campaigns,
        unix_now_s(),
        true,
    )))
}

async fn put(
    State(state): State<AppState>,
    AppId(id): AppId,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Result<(StatusCode, Json<AppView>), ApiError> {
    let who = lifecycle::actor(&headers)?;
    // Refused before the body is read: without a key nothing could be stored.
    let keyring = state.keyring().ok_or(AppsError::NoMasterKey)?;
    let input = crate::apps::parse_app(&body_bytes(body)?).map_err(AppsError::from)?;
    let (app, created) = store::put(state.pool(), Some(keyring), &id, &input, Some(&who)).await?;
    let kinds: Vec<&str> = app.credentials.keys().map(|k| k.as_str()).collect();
    tracing::info!(app = %app.id, kinds = ?kinds, created, actor = %who,
        "app credentials put through the API");
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(app)))
}

async fn set_enabled(
    state: &AppState,
    id: &str,
    enable: bool,
    headers: &HeaderMap,
) -> Result<Json<AppView>, ApiError> {
    let who = lifecycle::actor(headers)?;
    let app = store::set_enabled(state.pool(), id, enable, Some(&who)).await?;
    tracing::info!(app = %app.id, enable, actor = %who, "app status changed through the API");
    Ok(Json(app))
}

async fn disable(
    State(state): State<AppState>,
    AppId(id): AppId,
    headers: HeaderMap,
) -> Result<Json<AppView>, ApiError> {
    set_enabled(&state, &id, false, &headers).await
}

async fn enable(
    State(state): State<AppState>,
    AppId(id): AppId,
    headers: HeaderMap,
) -> Result<Json<AppView>, ApiError> {
    set_enabled(&state, &id, true, &headers).await
}

/// What a check answers.
#[derive(serde::Serialize)]
struct Checked {
    id: String,
    ok: bool,
    kinds: Vec<crate::apps::check::KindCheck>,
}

async fn check(State(state): State<AppState>, AppId(id): AppId) -> Result<Json<Checked>, ApiError> {
    let kinds =
        crate::apps::check::check(state.pool(), state.keyring(), state.app_defaults(), &id).await?;
    let ok = kinds.iter().all(|k| k.ok);
    tracing::info!(app = %id, ok, "app credentials checked through the API");
    Ok(Json(Checked { id, ok, kinds }))
}

/// What a DELETE answers.
#[derive(serde::Serialize)]
struct Deleted {
    deleted: String,
    /// Campaigns that were still sending through it (only above 0 when forced).
    sending_campaigns: i64,
}

async fn delete(
    State(state): State<AppState>,
    AppId(id): AppId,
    headers: HeaderMap,
    query: Params,
) -> Result<Json<Deleted>, ApiError> {
    let q = params(query, &["force"])?;
    let force = match q.get("force").map(String::as_str) {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::invalid("force", "must be true or false")),
    };
    let who = lifecycle::actor(&headers)?;
    let campaigns = store::delete(state.pool(), &id, force, Some(&who)).await?;
    tracing::info!(app = %id, force, sending_campaigns = campaigns, actor = %who,
        "app deleted through the API");
    Ok(Json(Deleted {
        deleted: id,
        sending_campaigns: campaigns,
    }))
}
