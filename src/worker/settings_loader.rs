//! Campaign settings for the enrich stage, read (and created) in batches.
//!
//! Each job whose campaign the consumer has no settings for asks here. One task takes
//! every request waiting and answers them with one [`upsert_many_from_jobs`]: a worker
//! starting on a backlog of a thousand new campaigns made two round trips for each, each
//! with its own wake-ups on both sides, and at the start of `pacing-1000` those were a
//! fifth of the runtime's CPU. A lone request is one read, as before.

use super::scheduler::CampaignSettings;
use crate::job::Job;
use crate::store::campaigns::{upsert_many_from_jobs, CampaignDefaults, JobCampaign};
use crate::store::StoreError;
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Requests answered by one statement set. Bounded so that one batch's arrays stay small
/// next to PostgreSQL's limits and a batch's wait stays short; more wait for the next.
pub const MAX_BATCH: usize = 512;

/// Requests waiting for the task: room for a burst of new campaigns.
const QUEUE: usize = 4096;

struct Request {
    campaign: JobCampaign,
    reply: oneshot::Sender<Option<CampaignSettings>>,
}

/// The enrich stage's handle on the task. Cheap to clone; the task ends with the last
/// clone.
#[derive(Clone)]
pub struct SettingsLoader {
    tx: mpsc::Sender<Request>,
}

impl SettingsLoader {
    /// Starts the task on the current runtime.
    pub fn spawn(pool: PgPool, defaults: CampaignDefaults, db_down: Arc<AtomicBool>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(rx, pool, defaults, db_down));
        Self { tx }
    }

    /// The job's campaign's stored settings, created from the job's on first sight.
    /// `None` when they cannot be had for good (logged): the job goes on without them.
    /// A database that is away is waited for, as every lookup is.
    pub async fn settings(&self, job: &Job) -> Option<CampaignSettings> {
        let (reply, answer) = oneshot::channel();
        let campaign = JobCampaign {
            id: job.campaign_id.clone(),
            send_rate: job.send_rate,
            algorithm: job.algorithm,
        };
        self.tx.send(Request { campaign, reply }).await.ok()?;
        answer.await.ok().flatten()
    }
}

async fn run(
    mut rx: mpsc::Receiver<Request>,
    pool: PgPool,
    defaults: CampaignDefaults,
    db_down: Arc<AtomicBool>,
) {
    let mut batch: Vec<Request> = Vec::new();
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        let mut seen = HashSet::with_capacity(batch.len());
        let wanted: Vec<JobCampaign> = batch
            .iter()
            .filter(|r| seen.insert(r.campaign.id.as_str()))
            .map(|r| r.campaign.clone())
            .collect();
        let found = super::retry::until_settled(
            "campaign lookup",
            &db_down,
            StoreError::is_transient,
            || upsert_many_from_jobs(&pool, &wanted, &defaults),
        )
        .await;
        for r in batch.drain(..) {
            let answer = match &found {
                Ok(all) => match all.get(&r.campaign.id) {
                    Some(Ok(stored)) => Some(super::to_settings(stored, &defaults)),
                    Some(Err(e)) => {
                        tracing::error!(campaign = %r.campaign.id, error = %e, "campaign lookup failed for good; the job goes on without it");
                        None
                    }
                    None => None,
                },
                Err(e) => {
                    tracing::error!(campaign = %r.campaign.id, error = %e, "campaign lookup failed for good; the job goes on without it");
                    None
                }
            };
            let _ = r.reply.send(answer);
        }
    }
}
