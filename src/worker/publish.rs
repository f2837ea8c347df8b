//! Publishes what this worker holds of each campaign (devices held and parked, its
//! effective rate, the stated total) to `worker_campaigns` about once a second, so that
//! any worker's API sums progress and ETA over all of them. At shutdown the rows go.

use crate::store::worker_campaigns::{self, Held};
use crate::worker::consumer::ConsumerStats;
use crate::worker::scheduler::SchedulerStats;
use sqlx::PgPool;
use std::time::Duration;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

/// How often the rows are rewritten: the API's figures are at most this old.
pub const PUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Publishes until `stop` is cancelled, then deletes this worker's rows.
pub async fn run(
    pool: PgPool,
    scheduler: watch::Receiver<SchedulerStats>,
    consumer: watch::Receiver<ConsumerStats>,
    stop: CancellationToken,
) {
    let worker_id = worker_id();
    let mut tick = tokio::time::interval(PUBLISH_EVERY);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut failing = false;
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tick.tick() => {}
        }
        let rows = rows(&scheduler.borrow(), &consumer.borrow());
        match worker_campaigns::publish(&pool, &worker_id, &rows).await {
            Ok(()) => failing = false,
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(error = %e, "cannot publish campaign progress; the API shows this worker's figures late");
            }
            Err(_) => {}
        }
    }
    if let Err(e) = worker_campaigns::forget(&pool, &worker_id).await {
        tracing::debug!(error = %e, "progress rows not deleted; they age out");
    }
}

/// One row per held campaign, and per campaign with parked jobs only.
fn rows(s: &SchedulerStats, c: &ConsumerStats) -> Vec<Held> {
    let mut rows: Vec<Held> = s
        .campaigns
        .iter()
        .map(|l| Held {
            campaign_id: l.id.to_string(),
            held: l.held_devices,
            parked: 0,
            effective_rate: l.effective_rate,
            total_devices: l.total_devices,
            app_id: l.app_id.as_deref().map(str::to_string),
        })
        .collect();
    let at: std::collections::HashMap<&str, usize> = s
        .campaigns
        .iter()
        .enumerate()
        .map(|(i, l)| (&*l.id, i))
        .collect();
    for (id, parked) in c.parked_devices.iter() {
        match at.get(&**id) {
            Some(&i) => rows[i].parked = *parked,
            None => rows.push(Held {
                campaign_id: id.to_string(),
                held: 0,
                parked: *parked,
                effective_rate: 0.0,
                total_devices: None,
                app_id: None,
            }),
        }
    }
    rows
}

fn worker_id() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!("{}-{nanos:x}", std::process::id())
}
