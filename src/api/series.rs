//! `GET /api/campaigns/{id}/series`: a campaign's counts over a range, per second or
//! summed into steps on the server, from the per-second rows or, for old and long
//! ranges, from the per-minute rollup as well.

use super::error::ApiError;
use super::handlers::{params, timestamp, Params};
use super::{AppState, CampaignId};
use crate::store::{campaigns, delivery};
use axum::extract::State;
use axum::response::IntoResponse;
use axum::Json;
use chrono::{DateTime, Duration, Utc};

/// `?from=&to=` (RFC 3339), or `?last=5m` ending now; `to` defaults to now and `from`
/// to five minutes before `to`. `?step=` (1–3600 s) sums the seconds into buckets; without
/// it a range longer than 600 s gets the step that keeps it within 600 points. The step
/// used is in the `x-series-step` header.
///
/// A range longer than 24 h, or one with counts already rolled up into minutes, is read
/// from both tables in steps of whole minutes.
pub async fn series(
    State(state): State<AppState>,
    CampaignId(id): CampaignId,
    query: Params,
) -> Result<axum::response::Response, ApiError> {
    let q = params(query, &["from", "to", "last", "step"])?;
    if campaigns::get(state.pool(), &id).await?.is_none() {
        return Err(ApiError::CampaignNotFound(id));
    }
    let to = match q.get("to") {
        Some(raw) => timestamp("to", raw)?,
        None => Utc::now(),
    };
    let from = match (q.get("from"), q.get("last")) {
        (Some(_), Some(_)) => {
            return Err(ApiError::invalid(
                "last",
                "give either from or last, not both",
            ))
        }
        (Some(raw), None) => timestamp("from", raw)?,
        (None, Some(raw)) => {
            let span = super::parse_duration(raw).map_err(|e| ApiError::invalid("last", e))?;
            to.checked_sub_signed(span)
                .ok_or_else(|| ApiError::invalid("last", "reaches before the year 0"))?
        }
        (None, None) => to - Duration::minutes(5),
    };
    if from > to {
        return Err(ApiError::invalid(
            "from",
            format!("the range starts ({from}) after it ends ({to})"),
        ));
    }
    if to - from > delivery::MAX_SERIES_RANGE
        || delivery::has_minutes(state.pool(), &id, from, to).await?
    {
        return long(&state, &id, from, to, q.get("step")).await;
    }
    let step = match q.get("step") {
        None => delivery::auto_step(from, to),
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|s| (1..=delivery::MAX_STEP_S).contains(s))
            .ok_or_else(|| {
                ApiError::invalid(
                    "step",
                    format!(
                        "must be a whole number of seconds from 1 to {}",
                        delivery::MAX_STEP_S
                    ),
                )
            })?,
    };
    let points = delivery::series_downsampled(state.pool(), &id, from, to, step).await?;
    Ok(([("x-series-step", step.to_string())], Json(points)).into_response())
}

/// An old or long range: minutes and seconds together, in steps of whole minutes.
async fn long(
    state: &AppState,
    id: &str,
    from: DateTime<Utc>,
    to: DateTime<Utc>,
    step: Option<&String>,
) -> Result<axum::response::Response, ApiError> {
    let step = match step {
        None => delivery::auto_step_long(from, to),
        Some(raw) => raw
            .parse::<i64>()
            .ok()
            .filter(|s| (60..=86_400).contains(s) && s % 60 == 0)
            .ok_or_else(|| {
                ApiError::invalid(
                    "step",
                    "for a range older or longer than 24 h, a whole number of minutes in \
                     seconds, 60 to 86400",
                )
            })?,
    };
    let points = delivery::series_long(state.pool(), id, from, to, step).await?;
    Ok(([("x-series-step", step.to_string())], Json(points)).into_response())
}
