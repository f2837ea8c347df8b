//! Finish-by plans: every [`PLAN_EVERY`], each held campaign with a `finish_by` still
//! ahead gets the rate that sends what remains by then ([`Control::Plan`]); the
//! scheduler holds it under its send_rate and the caps (docs/ALGORITHMS.md,
//! "Finish-by").
//!
//! What remains rests on the best basis known, as the ETA's does: with the stated
//! `campaign_total_devices`, the total minus what every worker finished (the store),
//! shared by the workers publishing the campaign; without it, what this worker holds
//! and has parked. A state read, not a call back up: the planner reads the snapshots and
//! the store, and sends the scheduler a rate, as the settings watcher does.

use crate::limiter::rate::MIN_RATE_PER_SECOND;
use crate::limiter::Rate;
use crate::store::worker_campaigns;
use crate::worker::consumer::ConsumerStats;
use crate::worker::scheduler::{Control, SchedulerStats};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// How often plans are worked out anew (the issue asks for 10 s at most). A finish-by
/// campaign sends nothing until its first plan, so this is also its start's delay.
pub const PLAN_EVERY: Duration = Duration::from_secs(1);

/// A plan aims this much before the deadline: a rate that ends exactly on it ends a
/// little after, by the last devices' answers and the store's flush.
pub const PLAN_MARGIN_MS: i64 = 1_000;

/// What a plan rests on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Basis {
    /// The stated total minus every worker's finished devices, shared by the workers.
    Total,
    /// What this worker holds and has parked.
    Known,
}

/// The rate that sends `remaining` devices by `finish_by_ms`, for one of `workers`
/// sharing them; `None` once the deadline has passed (the campaign then sends at its
/// send_rate, the most it may, and shows `behind`).
pub fn planned_rate(remaining: u64, finish_by_ms: i64, now_ms: i64, workers: u32) -> Option<Rate> {
    let left_ms = finish_by_ms - now_ms;
    if left_ms <= 0 {
        return None;
    }
    // Aim a margin early while there is time for it; in the last margin, at the deadline.
    let aim_ms = if left_ms > 2 * PLAN_MARGIN_MS {
        left_ms - PLAN_MARGIN_MS
    } else {
        left_ms
    };
    let rate = remaining as f64 * 1000.0 / aim_ms as f64 / f64::from(workers.max(1));
    Rate::per_second(rate.max(MIN_RATE_PER_SECOND)).ok()
}

/// One campaign's plan from the snapshots and the store's figures.
fn plan_one(
    held_here: u64,
    total: Option<u64>,
    store: Option<(u64, u32)>,
    finish_by_ms: i64,
    now_ms: i64,
) -> (Option<Rate>, Basis) {
    match (total, store) {
        (Some(t), Some((finished, workers))) => {
            let rate = planned_rate(t.saturating_sub(finished), finish_by_ms, now_ms, workers);
            (rate, Basis::Total)
        }
        _ => (
            planned_rate(held_here, finish_by_ms, now_ms, 1),
            Basis::Known,
        ),
    }
}

/// Plans until `stop` is cancelled. A failed store read keeps the last plans (and
/// plans on the `Known` basis where nothing was read yet).
pub async fn run(
    pool: PgPool,
    scheduler: watch::Receiver<SchedulerStats>,
    consumer: watch::Receiver<ConsumerStats>,
    control: mpsc::Sender<Control>,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval(PLAN_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut sent: HashMap<Arc<str>, Option<Rate>> = HashMap::new();
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let due = due_campaigns(&scheduler.borrow(), &consumer.borrow());
        sent.retain(|id, _| due.iter().any(|d| d.id == *id));
        if due.is_empty() {
            continue;
        }
        let with_total: Vec<String> = due
            .iter()
            .filter(|d| d.total.is_some())
            .map(|d| d.id.to_string())
            .collect();
        let store = if with_total.is_empty() {
            HashMap::new()
        } else {
            match worker_campaigns::plan_inputs(&pool, &with_total).await {
                Ok(m) => {
                    failing = false;
                    m
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(error = %e, "finish-by plans cannot read progress; planning from what this worker holds");
                    }
                    failing = true;
                    HashMap::new()
                }
            }
        };
        let now_ms = chrono::Utc::now().timestamp_millis();
        for d in due {
            let inputs = store.get(&*d.id).copied();
            let (rate, basis) = plan_one(d.held, d.total, inputs, d.finish_by_ms, now_ms);
            if sent.get(&d.id) == Some(&rate) {
                continue;
            }
            tracing::debug!(campaign = %d.id, ?rate, ?basis, "finish-by plan");
            let msg = Control::Plan {
                campaign: d.id.clone(),
                rate,
            };
            if control.send(msg).await.is_err() {
                return;
            }
            sent.insert(d.id, rate);
        }
    }
}

/// A held campaign with a deadline, as the planner reads it.
struct Due {
    id: Arc<str>,
    /// Devices held and parked here.
    held: u64,
    total: Option<u64>,
    finish_by_ms: i64,
}

fn due_campaigns(s: &SchedulerStats, c: &ConsumerStats) -> Vec<Due> {
    if !s.campaigns.iter().any(|l| l.finish_by_ms.is_some()) {
        return Vec::new();
    }
    let parked: HashMap<&str, u64> = c.parked_devices.iter().map(|(id, n)| (&**id, *n)).collect();
    s.campaigns
        .iter()
        .filter_map(|l| {
            let finish_by_ms = l.finish_by_ms?;
            let parked = parked.get(&*l.id).copied().unwrap_or(0);
            Some(Due {
                id: l.id.clone(),
                held: l.held_devices + parked,
                total: l.total_devices,
                finish_by_ms,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn per_s(r: Option<Rate>) -> f64 {
        r.map_or(f64::NAN, Rate::as_f64)
    }

    #[test]
    fn a_plan_sends_what_remains_a_margin_before_the_deadline() {
        // 120,000 devices due in 60 s: 120,000 / 59 s.
        let r = per_s(planned_rate(120_000, 60_000, 0, 1));
        assert!((r - 120_000.0 / 59.0).abs() < 1e-6, "{r}");
        // Two workers share it.
        let r2 = per_s(planned_rate(120_000, 60_000, 0, 2));
        assert!((r2 - r / 2.0).abs() < 1e-6, "{r2}");
        // In the last two margins it aims at the deadline itself.
        let r = per_s(planned_rate(1_000, 1_500, 0, 1));
        assert!((r - 1_000.0 / 1.5).abs() < 1e-6, "{r}");
        // Past the deadline: no plan (its send_rate), and nothing left is the least rate.
        assert_eq!(planned_rate(1_000, 1_000, 1_000, 1), None);
        assert_eq!(per_s(planned_rate(0, 60_000, 0, 1)), MIN_RATE_PER_SECOND);
    }

    #[test]
    fn the_basis_is_the_total_when_stated_else_what_is_held_here() {
        let (r, b) = plan_one(500, Some(10_000), Some((4_000, 3)), 61_000, 0);
        assert_eq!(b, Basis::Total);
        assert!((per_s(r) - 6_000.0 / 60.0 / 3.0).abs() < 1e-6);
        let (r, b) = plan_one(500, None, None, 61_000, 0);
        assert_eq!(b, Basis::Known);
        assert!((per_s(r) - 500.0 / 60.0).abs() < 1e-6);
        // The store not read: what is held here.
        let (_, b) = plan_one(500, Some(10_000), None, 61_000, 0);
        assert_eq!(b, Basis::Known);
    }
}
