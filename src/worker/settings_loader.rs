//! Campaign settings for the enrich stage, read (and created) in batches
//! ([`super::batch`]): one [`upsert_many_from_jobs`] answers every job waiting. A worker
//! starting on a backlog of a thousand new campaigns made two round trips for each, and
//! at the start of `pacing-1000` those were a fifth of the runtime's CPU.

use super::batch::{Batched, Fetch};
use super::scheduler::CampaignSettings;
use crate::job::Job;
use crate::store::campaigns::{upsert_many_from_jobs, CampaignDefaults, JobCampaign};
use crate::store::StoreError;
use sqlx::PgPool;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// Reads campaigns, creating those not stored yet from their job's settings.
pub struct SettingsFetch {
    pool: PgPool,
    defaults: CampaignDefaults,
}

impl Fetch for SettingsFetch {
    type Query = JobCampaign;
    /// A campaign is asked once a batch, with its first job's settings: one statement
    /// may not create the same row twice.
    type Key = String;
    type Answer = CampaignSettings;
    const WHAT: &'static str = "campaign lookup";

    fn key(query: &JobCampaign) -> String {
        query.id.clone()
    }

    fn campaign(query: &JobCampaign) -> &str {
        &query.id
    }

    async fn fetch(
        &self,
        queries: &[&JobCampaign],
    ) -> Result<Vec<Result<CampaignSettings, StoreError>>, StoreError> {
        let wanted: Vec<JobCampaign> = queries.iter().map(|q| (*q).clone()).collect();
        let mut all = upsert_many_from_jobs(&self.pool, &wanted, &self.defaults).await?;
        Ok(wanted
            .iter()
            .map(|w| match all.remove(&w.id) {
                Some(stored) => stored.map(|c| super::to_settings(&c, &self.defaults)),
                None => Err(StoreError::CampaignNotFound(w.id.clone())),
            })
            .collect())
    }
}

/// The enrich stage's handle on the task. Cheap to clone.
#[derive(Clone)]
pub struct SettingsLoader(Batched<SettingsFetch>);

impl SettingsLoader {
    /// Starts the task on the current runtime.
    pub fn spawn(pool: PgPool, defaults: CampaignDefaults, db_down: Arc<AtomicBool>) -> Self {
        Self(Batched::spawn(SettingsFetch { pool, defaults }, db_down))
    }

    /// The job's campaign's stored settings, created from the job's on first sight.
    /// `None` when they cannot be had for good (logged): the job goes on without them.
    pub async fn settings(&self, job: &Job) -> Option<CampaignSettings> {
        self.0
            .get(JobCampaign {
                id: job.campaign_id.clone(),
                send_rate: job.send_rate,
                algorithm: job.algorithm,
            })
            .await
    }
}
