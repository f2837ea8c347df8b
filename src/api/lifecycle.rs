//! The campaign lifecycle in the API: start and expiry fields, cancel, the settings
//! history, each campaign's progress and ETA, and its delivery policy against them.
//!
//! Progress counts what the store has finished (delivered, failed, invalid, rejected,
//! skipped, capped, expired, cancelled) against what is known to remain: the devices
//! the worker holds and those in its parked jobs. Jobs still in Kafka that no worker has
//! read are unknown per campaign, so the ETA says what it rests on: `known` (held and
//! parked devices) or `total` (the producer's `campaign_total_devices`).

use super::error::ApiError;
use super::handlers::{load_view, CampaignView};
use super::{AppState, CampaignId};
use crate::job::PriorityClass;
use crate::store::campaigns::{self, Campaign, CampaignStatus, CampaignSummary};
use crate::store::events::{self, CampaignEvent};
use axum::extract::State;
use axum::http::HeaderMap;
use axum::Json;
use chrono::{DateTime, Utc};

/// The header a client may name itself with in `campaign_events` (the CLI sends `cli`).
pub const ACTOR_HEADER: &str = "x-pushpace-actor";

/// Who made a change: the client's `x-pushpace-actor`, else `api`.
pub fn actor(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(v) = headers.get(ACTOR_HEADER) else {
        return Ok("api".into());
    };
    let name = v
        .to_str()
        .map_err(|_| ApiError::invalid(ACTOR_HEADER, "must be ASCII"))?;
    campaigns::validate_actor(name)?;
    Ok(name.to_string())
}

/// A `start_at` / `expires_at` value of a PUT: RFC 3339, unix seconds, or null (clear).
pub fn instant_field(
    field: &'static str,
    v: &serde_json::Value,
) -> Result<Option<DateTime<Utc>>, ApiError> {
    let bad = || {
        ApiError::invalid(
            field,
            format!("must be an RFC 3339 time, unix seconds or null, got {v}"),
        )
    };
    match v {
        serde_json::Value::Null => Ok(None),
        serde_json::Value::String(s) => DateTime::parse_from_rfc3339(s)
            .map(|t| Some(t.with_timezone(&Utc)))
            .map_err(|e| ApiError::invalid(field, format!("{s:?} is not an RFC 3339 time: {e}"))),
        serde_json::Value::Number(n) => {
            let secs = n.as_f64().ok_or_else(bad)?;
            if !(0.0..=crate::job::MAX_UNIX_S as f64).contains(&secs) {
                return Err(ApiError::invalid(
                    field,
                    format!(
                        "must be unix seconds from 0 to {} (the year 9999), got {n}",
                        crate::job::MAX_UNIX_S
                    ),
                ));
            }
            DateTime::from_timestamp_millis((secs * 1000.0).round() as i64)
                .map(Some)
                .ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// How far along a campaign is.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Progress {
    /// Delivered.
    pub sent: i64,
    /// Finished by an answer or an end: delivered, failed, invalid, rejected, expired,
    /// cancelled (not the devices skipped or capped at intake).
    pub finished: i64,
    /// Devices the worker holds or has parked, not finished.
    pub known_remaining: u64,
    /// The campaign's size, when its jobs state it.
    pub total: Option<u64>,
    /// finished / total, when the total is known.
    pub fraction: Option<f64>,
    /// How many workers' figures `known_remaining` sums (0: none holds it).
    pub workers: u32,
}

/// When a campaign should finish at its current rate.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Eta {
    /// Seconds from now; null when nothing is known to remain, or it does not send.
    pub seconds: Option<f64>,
    /// The rate it rests on: the worker's effective rate, else the send_rate.
    pub rate: f64,
    /// `known`: held and parked devices; `total`: the stated total minus the finished.
    pub basis: &'static str,
}

/// What the worker knows of a campaign beyond its store row.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct WorkerCounts {
    pub held: u64,
    pub parked: u64,
    pub total: Option<u64>,
    pub effective_rate: Option<f64>,
    pub waiting_start: bool,
    pub workers: u32,
}

/// The devices left, and what that rests on: the stated total minus the finished, else
/// the devices the workers hold and have parked.
fn remaining(finished: i64, known_remaining: u64, total: Option<u64>) -> (u64, &'static str) {
    match total {
        Some(t) => (t.saturating_sub(finished.max(0) as u64), "total"),
        None => (known_remaining, "known"),
    }
}

/// Progress and ETA from the store's totals and the worker's counts.
pub fn progress(s: &CampaignSummary, w: WorkerCounts) -> (Progress, Eta) {
    let finished = s.sent + s.failed + s.invalid + s.rejected + s.expired + s.cancelled;
    let known_remaining = w.held + w.parked;
    let rate = w.effective_rate.unwrap_or(s.campaign.send_rate);
    let (remaining, basis) = remaining(finished, known_remaining, w.total);
    let sending = matches!(s.campaign.status, CampaignStatus::Active);
    let seconds = (sending && remaining > 0 && rate > 0.0).then(|| remaining as f64 / rate);
    let progress = Progress {
        sent: s.sent,
        finished,
        known_remaining,
        total: w.total,
        fraction: w
            .total
            .map(|t| (finished.max(0) as f64 / t.max(1) as f64).min(1.0)),
        workers: w.workers,
    };
    (
        progress,
        Eta {
            seconds,
            rate,
            basis,
        },
    )
}

/// A campaign's delivery policy as the API shows it, with its deadline against the ETA.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicyView {
    pub priority: PriorityClass,
    /// As stored; null: the worker's `limiter.ramp_up_s`.
    pub ramp_up_s: Option<f64>,
    /// As stored; null: `limiter.ramp_from`.
    pub ramp_from: Option<f64>,
    pub finish_by: Option<DateTime<Utc>>,
    /// A `finish_by` is set and the projected finish is later than it, or it has passed
    /// with devices left. Never for a campaign that is done or cancelled.
    pub behind: bool,
    /// When it should finish at the ETA's rate: from its start when that is still
    /// ahead, else from now; null when the ETA is (nothing known to remain, or it does
    /// not send).
    pub projected_finish: Option<DateTime<Utc>>,
    /// With a `finish_by`: what the plan of what remains rests on, as the ETA's does:
    /// `total` (the jobs' `campaign_total_devices`) or `known` (what the workers hold).
    pub plan_basis: Option<&'static str>,
    /// Under local-time rules: each zone of the jobs this worker holds or has parked
    /// until their window opens, with its current or next window.
    pub next_windows: Vec<super::handlers::ZoneWindow>,
    /// `send_window`, `deliver_at_local` (when set) and `late_policy`.
    #[serde(flatten)]
    pub local: crate::job::window::LocalPolicy,
}

/// How much later than `finish_by` a projection may be before the campaign is `behind`:
/// a campaign on its planned rate projects to its deadline, give or take rounding.
pub const BEHIND_SLACK_S: f64 = 1.0;

/// The policy view of `c` from its progress and ETA at `now`.
pub fn policy(c: &Campaign, p: &Progress, eta: &Eta, now: DateTime<Utc>) -> PolicyView {
    let begin = c.start_at.filter(|t| *t > now).unwrap_or(now);
    let projected_finish = eta.seconds.and_then(|s| {
        let ms = (s * 1000.0).round() as i64;
        DateTime::from_timestamp_millis(begin.timestamp_millis().saturating_add(ms))
    });
    let over = matches!(c.status, CampaignStatus::Done | CampaignStatus::Cancelled);
    let plan_basis = c
        .finish_by
        .map(|_| remaining(p.finished, p.known_remaining, p.total).1);
    let behind = c.finish_by.is_some_and(|fb| {
        let left_s = (fb - begin).num_milliseconds() as f64 / 1000.0;
        let late = eta.seconds.is_some_and(|s| s > left_s + BEHIND_SLACK_S);
        let (left, _) = remaining(p.finished, p.known_remaining, p.total);
        let passed = fb <= now && left > 0;
        !over && (late || passed)
    });
    PolicyView {
        priority: c.priority,
        ramp_up_s: c.ramp_up_s,
        ramp_from: c.ramp_from,
        finish_by: c.finish_by,
        behind,
        projected_finish,
        plan_basis,
        next_windows: Vec::new(),
        local: c.local,
    }
}

/// `POST /api/campaigns/{id}/cancel`: final. The worker ends its jobs within a second.
pub async fn cancel(
    State(state): State<AppState>,
    CampaignId(id): CampaignId,
    headers: HeaderMap,
) -> Result<Json<CampaignView>, ApiError> {
    let who = actor(&headers)?;
    let campaign =
        campaigns::set_status_by(state.pool(), &id, CampaignStatus::Cancelled, Some(&who)).await?;
    tracing::info!(campaign = %campaign.id, actor = %who, "campaign cancelled through the API");
    Ok(Json(load_view(&state, &id).await?))
}

/// `GET /api/campaigns/{id}/events`: its settings history, oldest first.
pub async fn list_events(
    State(state): State<AppState>,
    CampaignId(id): CampaignId,
) -> Result<Json<Vec<CampaignEvent>>, ApiError> {
    if campaigns::get(state.pool(), &id).await?.is_none() {
        return Err(ApiError::CampaignNotFound(id));
    }
    Ok(Json(
        events::list(state.pool(), &id, events::MAX_EVENTS).await?,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;
    use chrono::Duration;

    fn summary(sent: i64, expired: i64, status: CampaignStatus) -> CampaignSummary {
        let now = Utc::now();
        CampaignSummary {
            campaign: Campaign {
                id: "c".into(),
                send_rate: 100.0,
                algorithm: Algorithm::Gcra,
                burst: 0,
                status,
                limiter_scope: None,
                halt_reason: None,
                halted_at: None,
                weight: 1.0,
                start_at: None,
                expires_at: None,
                priority: Default::default(),
                ramp_up_s: None,
                ramp_from: None,
                finish_by: None,
                local: Default::default(),
                created_at: now,
                updated_at: now,
            },
            sent,
            failed: 0,
            retried: 7,
            invalid: 0,
            rejected: 0,
            expired,
            cancelled: 0,
            rate_10s: 0.0,
        }
    }

    #[test]
    fn eta_rests_on_the_known_devices_or_the_stated_total() {
        let w = WorkerCounts {
            held: 300,
            parked: 700,
            effective_rate: Some(50.0),
            ..Default::default()
        };
        let (p, eta) = progress(&summary(400, 100, CampaignStatus::Active), w);
        assert_eq!(
            (p.finished, p.known_remaining, p.fraction),
            (500, 1000, None)
        );
        assert_eq!(
            (eta.seconds, eta.rate, eta.basis),
            (Some(20.0), 50.0, "known")
        );

        let w = WorkerCounts {
            total: Some(2_000),
            ..w
        };
        let (p, eta) = progress(&summary(400, 100, CampaignStatus::Active), w);
        assert_eq!(p.fraction, Some(0.25));
        assert_eq!((eta.seconds, eta.basis), (Some(30.0), "total"));

        // No worker: the send_rate; paused: no ETA.
        let (_, eta) = progress(
            &summary(0, 0, CampaignStatus::Active),
            WorkerCounts {
                parked: 100,
                ..Default::default()
            },
        );
        assert_eq!((eta.seconds, eta.rate), (Some(1.0), 100.0));
        let (_, eta) = progress(&summary(0, 0, CampaignStatus::Paused), w);
        assert_eq!(eta.seconds, None);
    }

    #[test]
    fn behind_is_a_projection_past_the_deadline_or_a_deadline_past_with_devices_left() {
        let now = Utc::now();
        let mut s = summary(0, 0, CampaignStatus::Active);
        let w = |held: u64, rate: f64| WorkerCounts {
            held,
            effective_rate: Some(rate),
            workers: 1,
            ..Default::default()
        };
        let at = |s: &CampaignSummary, w: WorkerCounts| {
            let (p, eta) = progress(s, w);
            policy(&s.campaign, &p, &eta, now)
        };
        // No deadline: never behind, no plan, and the projection is now + the ETA.
        let v = at(&s, w(1_000, 100.0));
        assert!(!v.behind && v.plan_basis.is_none());
        assert_eq!(
            v.projected_finish.map(|t| t.timestamp_millis()),
            Some(now.timestamp_millis() + 10_000)
        );
        // 10 s of work, 60 s left: on time; 20 s left at half the rate: behind.
        s.campaign.finish_by = Some(now + Duration::seconds(60));
        let v = at(&s, w(1_000, 100.0));
        assert!(!v.behind && v.plan_basis == Some("known"), "{v:?}");
        s.campaign.finish_by = Some(now + Duration::seconds(15));
        assert!(at(&s, w(1_000, 50.0)).behind);
        // Within the slack of the deadline: on time.
        s.campaign.finish_by = Some(now + Duration::milliseconds(9_500));
        assert!(!at(&s, w(1_000, 100.0)).behind);
        // Passed with devices left, even paused (no ETA); not once nothing is left.
        s.campaign.finish_by = Some(now - Duration::seconds(1));
        s.campaign.status = CampaignStatus::Paused;
        let v = at(&s, w(5, 100.0));
        assert!(v.behind && v.projected_finish.is_none());
        assert!(!at(&s, w(0, 100.0)).behind);
        // Cancelled: over, never behind.
        s.campaign.status = CampaignStatus::Cancelled;
        assert!(!at(&s, w(5, 100.0)).behind);
        // A start still ahead: the projection counts from it.
        s.campaign.status = CampaignStatus::Active;
        s.campaign.start_at = Some(now + Duration::seconds(30));
        s.campaign.finish_by = Some(now + Duration::seconds(35));
        let v = at(&s, w(1_000, 100.0));
        assert!(v.behind, "10 s of work in the 5 s after the start");
        assert_eq!(
            v.projected_finish.map(|t| t.timestamp_millis()),
            Some(now.timestamp_millis() + 40_000)
        );
    }

    #[test]
    fn instants_in_a_put() {
        let t = instant_field("start_at", &serde_json::json!("2026-11-25T10:00:00Z")).unwrap();
        assert_eq!(t.unwrap().timestamp(), 1_795_600_800);
        let t = instant_field("start_at", &serde_json::json!(1_795_600_800)).unwrap();
        assert_eq!(t.unwrap().timestamp(), 1_795_600_800);
        assert_eq!(
            instant_field("start_at", &serde_json::Value::Null).unwrap(),
            None
        );
        for bad in [
            serde_json::json!("soon"),
            serde_json::json!(-1),
            serde_json::json!(1e15),
            serde_json::json!(true),
        ] {
            assert!(instant_field("expires_at", &bad).is_err(), "{bad}");
        }
    }
}
