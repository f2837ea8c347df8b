//! The endpoint handlers. Input is checked here with the store's own rules, so that a bad
//! value is a 422 naming its field before any SQL runs.

use super::error::ApiError;
use super::lifecycle::{self, Eta, Progress, WorkerCounts};
use super::{AppState, CampaignId};
use crate::limiter::Algorithm;
use crate::store::campaign_list::{self, ListQuery};
use crate::store::campaigns::{self, CampaignPatch, CampaignStatus, CampaignSummary};
use crate::store::worker_campaigns::{self, Summed};
use crate::store::{dead_letters, delivery, StoredDeadLetter, MIGRATOR};
use crate::worker::scheduler::CampaignLive;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Query, State};
use axum::http::{header, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use axum::Json;
use chrono::{DateTime, Duration, Utc};
use std::collections::HashMap;
use std::time::Duration as StdDuration;

pub(super) type Params = Result<Query<HashMap<String, String>>, QueryRejection>;

pub async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// One readiness check's result.
#[derive(Debug, serde::Serialize)]
pub struct Check {
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, serde::Serialize)]
pub struct Checks {
    pub broker: Check,
    pub postgres: Check,
    pub migrations: Check,
    /// The worker's Kafka consumer thread (absent when no worker runs in-process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<Check>,
}

#[derive(Debug, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Checks,
}

pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let (broker, postgres, migrations) = tokio::join!(
        check_broker(&state),
        check_postgres(&state),
        check_migrations(&state)
    );
    let consumer = state.worker().map(|w| {
        if *w.consumer_running.borrow() {
            Check {
                ok: true,
                detail: "running".into(),
            }
        } else {
            Check {
                ok: false,
                detail: "the Kafka consumer thread has stopped".into(),
            }
        }
    });
    let ready = broker.ok && postgres.ok && migrations.ok && consumer.as_ref().is_none_or(|c| c.ok);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let checks = Checks {
        broker,
        postgres,
        migrations,
        consumer,
    };
    (status, Json(Readiness { ready, checks }))
}

async fn check_broker(state: &AppState) -> Check {
    let bootstrap = state.inner.bootstrap.clone();
    let timeout = state.inner.broker_timeout;
    // librdkafka's metadata call blocks its thread.
    let ping = tokio::task::spawn_blocking(move || crate::broker::ping(&bootstrap, timeout));
    match tokio::time::timeout(timeout + StdDuration::from_secs(1), ping).await {
        Ok(Ok(Ok(n))) => Check {
            ok: true,
            detail: format!("{n} broker(s) answered"),
        },
        Ok(Ok(Err(e))) => Check {
            ok: false,
            detail: e.to_string(),
        },
        Ok(Err(e)) => Check {
            ok: false,
            detail: format!("ping task failed: {e}"),
        },
        Err(_) => Check {
            ok: false,
            detail: format!("no answer within {} ms", timeout.as_millis()),
        },
    }
}

async fn check_postgres(state: &AppState) -> Check {
    let q = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(state.pool());
    match tokio::time::timeout(StdDuration::from_secs(2), q).await {
        Ok(Ok(_)) => Check {
            ok: true,
            detail: "answered".into(),
        },
        Ok(Err(e)) => Check {
            ok: false,
            detail: crate::store::StoreError::from(e).to_string(),
        },
        Err(_) => Check {
            ok: false,
            detail: "no answer within 2000 ms".into(),
        },
    }
}

async fn check_migrations(state: &AppState) -> Check {
    let q = sqlx::query_as::<_, (i64, Vec<u8>)>(
        "SELECT version, checksum FROM _sqlx_migrations WHERE success",
    )
    .fetch_all(state.pool());
    let applied = match tokio::time::timeout(StdDuration::from_secs(2), q).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            let missing_table = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42P01");
            return Check {
                ok: false,
                detail: if missing_table {
                    "no migration applied (run `pushpace migrate`)".into()
                } else {
                    crate::store::StoreError::from(e).to_string()
                },
            };
        }
        Err(_) => {
            return Check {
                ok: false,
                detail: "no answer within 2000 ms".into(),
            }
        }
    };
    let applied: HashMap<i64, Vec<u8>> = applied.into_iter().collect();
    let expected: Vec<_> = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    let missing: Vec<String> = expected
        .iter()
        .filter(|m| !applied.contains_key(&m.version))
        .map(|m| m.version.to_string())
        .collect();
    let changed: Vec<String> = expected
        .iter()
        .filter(|m| applied.get(&m.version).is_some_and(|c| **c != *m.checksum))
        .map(|m| m.version.to_string())
        .collect();
    if missing.is_empty() && changed.is_empty() {
        Check {
            ok: true,
            detail: format!("{} of {} applied", expected.len(), expected.len()),
        }
    } else {
        let mut detail = Vec::new();
        if !missing.is_empty() {
            detail.push(format!("not applied: {}", missing.join(", ")));
        }
        if !changed.is_empty() {
            detail.push(format!("changed since applied: {}", changed.join(", ")));
        }
        Check {
            ok: false,
            detail: detail.join("; "),
        }
    }
}

pub async fn metrics(State(state): State<AppState>) -> Response {
    let stats = state
        .worker()
        .map(|w| (w.scheduler.borrow().clone(), w.consumer.borrow().clone()));
    let body = crate::metrics::render(
        state.inner.metrics.as_ref(),
        stats.as_ref().map(|(s, c)| (s, c)),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

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
}

/// What the worker publishes: its campaigns and the devices each has parked.
struct Live {
    campaigns: std::sync::Arc<Vec<CampaignLive>>,
    parked: std::sync::Arc<Vec<(std::sync::Arc<str>, u64)>>,
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
        summary,
    }
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

/// Reads a `PUT /api/campaigns/{id}` body, naming the field at fault.
pub fn parse_patch(body: &[u8]) -> Result<CampaignPatch, ApiError> {
    let value: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Object(Default::default())
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid("body", format!("not valid JSON: {e}")))?
    };
    let serde_json::Value::Object(fields) = value else {
        return Err(ApiError::invalid(
            "body",
            "must be a JSON object such as {\"send_rate\": 750}",
        ));
    };
    let mut patch = CampaignPatch::default();
    for (name, v) in fields {
        match name.as_str() {
            "send_rate" => {
                let rate = v.as_f64().ok_or_else(|| {
                    ApiError::invalid("send_rate", format!("must be a number, got {v}"))
                })?;
                campaigns::validate_send_rate(rate)?;
                patch.send_rate = Some(rate);
            }
            "algorithm" => {
                let name = v.as_str().ok_or_else(|| {
                    ApiError::invalid("algorithm", format!("must be a string, got {v}"))
                })?;
                let algorithm = name
                    .parse::<Algorithm>()
                    .map_err(|e| ApiError::invalid("algorithm", e.to_string()))?;
                patch.algorithm = Some(algorithm);
            }
            "burst" => {
                let burst = v.as_i64().ok_or_else(|| {
                    ApiError::invalid("burst", format!("must be a whole number, got {v}"))
                })?;
                campaigns::validate_burst(burst)?;
                patch.burst = Some(burst);
            }
            "limiter_scope" => {
                // null: back to the configured limiter.scope.
                let scope = match &v {
                    serde_json::Value::Null => None,
                    serde_json::Value::String(name) => {
                        Some(campaigns::validate_limiter_scope(name)?)
                    }
                    _ => {
                        return Err(ApiError::invalid(
                            "limiter_scope",
                            format!("must be \"local\", \"redis\" or null, got {v}"),
                        ))
                    }
                };
                patch.limiter_scope = Some(scope);
            }
            "weight" => {
                let weight = v.as_f64().ok_or_else(|| {
                    ApiError::invalid("weight", format!("must be a number, got {v}"))
                })?;
                campaigns::validate_weight(weight)?;
                patch.weight = Some(weight);
            }
            "start_at" => patch.start_at = Some(lifecycle::instant_field("start_at", &v)?),
            "expires_at" => patch.expires_at = Some(lifecycle::instant_field("expires_at", &v)?),
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown field; expected send_rate, algorithm, burst, limiter_scope, \
                     weight, start_at or expires_at",
                ))
            }
        }
    }
    Ok(patch)
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

/// A dead letter as `GET /api/dead-letters` lists it. The message and the key are shown
/// only by their first [`dead_letters::LISTED_PREFIX_BYTES`], which is all the store reads.
#[derive(Debug, serde::Serialize)]
pub struct DeadLetterView {
    pub id: i64,
    pub kind: crate::store::DeadLetterKind,
    pub topic: String,
    pub partition: i32,
    pub kafka_offset: i64,
    pub campaign_id: Option<String>,
    pub job_id: Option<String>,
    pub device_token: Option<String>,
    /// The device's index in its job; null for a whole message.
    pub device: Option<u32>,
    pub reason: String,
    pub created_at: DateTime<Utc>,
    /// The stored message's length in bytes.
    pub raw_len: usize,
    /// Its first bytes as text (invalid UTF-8 replaced).
    pub raw: String,
    pub raw_truncated: bool,
    /// The Kafka key's first bytes, ASCII with other bytes as `\xNN` (`\\` for a
    /// backslash); null when the message had none.
    pub key: Option<String>,
    /// The key's length in bytes as received.
    pub key_len: Option<usize>,
    pub key_truncated: bool,
}

impl From<StoredDeadLetter> for DeadLetterView {
    fn from(d: StoredDeadLetter) -> Self {
        let key_truncated = match (&d.key_prefix, d.key_len) {
            (Some(k), Some(len)) => len > k.len(),
            _ => false,
        };
        Self {
            id: d.id,
            kind: d.kind,
            topic: d.topic,
            partition: d.partition,
            kafka_offset: d.kafka_offset,
            campaign_id: d.campaign_id,
            job_id: d.job_id,
            device_token: d.device_token,
            device: d.device,
            reason: d.reason,
            created_at: d.created_at,
            raw_truncated: d.raw_len > d.raw_prefix.len(),
            raw_len: d.raw_len,
            raw: String::from_utf8_lossy(&d.raw_prefix).into_owned(),
            key: d.key_prefix.map(|k| k.escape_ascii().to_string()),
            key_len: d.key_len,
            key_truncated,
        }
    }
}

#[derive(Debug, serde::Serialize)]
pub struct DeadLetterPage {
    pub items: Vec<DeadLetterView>,
    /// Pass as `before` for the next (older) page; null on the last page.
    pub next_before: Option<i64>,
}

/// `?campaign=&limit=&before=`, newest first.
pub async fn dead_letters(
    State(state): State<AppState>,
    query: Params,
) -> Result<Json<DeadLetterPage>, ApiError> {
    let q = params(query, &["campaign", "limit", "before"])?;
    let limit = match q.get("limit") {
        None => 100,
        Some(raw) => match raw.parse::<i64>() {
            Ok(n) if (1..=dead_letters::MAX_PAGE).contains(&n) => n,
            _ => {
                return Err(ApiError::invalid(
                    "limit",
                    format!(
                        "must be a whole number from 1 to {}",
                        dead_letters::MAX_PAGE
                    ),
                ))
            }
        },
    };
    let before = q
        .get("before")
        .map(|raw| {
            raw.parse::<i64>()
                .map_err(|_| ApiError::invalid("before", "must be a dead letter id"))
        })
        .transpose()?;
    let campaign = q.get("campaign").map(String::as_str);
    if let Some(c) = campaign {
        super::check_campaign_id("campaign", c)?;
    }
    let rows = dead_letters::list(state.pool(), campaign, before, limit).await?;
    let next_before = (rows.len() as i64 == limit)
        .then(|| rows.last().map(|d| d.id))
        .flatten();
    Ok(Json(DeadLetterPage {
        items: rows.into_iter().map(DeadLetterView::from).collect(),
        next_before,
    }))
}

pub async fn no_route(uri: Uri) -> ApiError {
    ApiError::NoRoute(uri.path().to_string())
}
