//! The enrich stage: a job's lookups before it reaches the scheduler, run as a task on
//! the runtime while the consumer thread reads on.
//!
//! - the campaign's stored settings (created on its first job), when the consumer has
//!   none cached;
//! - the job's stored progress: devices finished in an earlier run are skipped;
//! - token hygiene: devices whose tokens are recorded invalid;
//! - the shared frequency cap: devices at their cap (the rest get a reservation).
//!
//! A failure that can pass (database or Redis away) is retried with backoff: the job
//! waits, it is never dropped, and the consumer pauses its partitions once enough jobs
//! wait. A failure that cannot pass is logged and the job goes on without that lookup:
//! sending a device twice is better than losing it.

use super::progress_loader::ProgressLoader;
use super::scheduler::CampaignSettings;
use super::settings_loader::SettingsLoader;
use crate::capping::shared::SharedCap;
use crate::hygiene::TokenHygiene;
use crate::job::Job;
use crate::limiter::{Algorithm, Rate};
use crate::store::campaigns::CampaignDefaults;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

/// What a job's lookups found.
#[derive(Debug, Default)]
pub struct Lookups {
    /// The campaign's stored settings, when they were read.
    pub settings: Option<CampaignSettings>,
    /// Devices 0..already_done finished in an earlier run.
    pub already_done: u32,
    /// Devices after `already_done` finished in an earlier run.
    pub done_after: Vec<u32>,
    /// Devices whose tokens are recorded invalid.
    pub invalid: Vec<u32>,
    /// Devices at the shared frequency cap.
    pub capped: Vec<u32>,
}

/// What the lookups share.
#[derive(Clone)]
pub struct Enricher {
    pub defaults: CampaignDefaults,
    /// Campaign settings, read in batches.
    pub loader: SettingsLoader,
    /// Job progress, read in batches.
    pub progress: ProgressLoader,
    pub hygiene: Option<Arc<TokenHygiene>>,
    pub shared_cap: Option<SharedCap>,
    /// Raised while a lookup fails for a reason that can pass (for one log line).
    pub db_down: Arc<AtomicBool>,
}

impl Enricher {
    /// Runs the job's lookups; `read_settings` when the consumer has none cached.
    pub async fn lookups(self, job: Arc<Job>, read_settings: bool) -> Lookups {
        let settings = if read_settings {
            self.loader.settings(&job).await
        } else {
            None
        };
        let found = self
            .progress
            .progress(&job.campaign_id, &job.job_id)
            .await
            .flatten();
        let (already_done, done_after) = match found {
            Some(p) => {
                let after = p.finished_after_prefix().collect();
                (p.devices_done, after)
            }
            None => (0, Vec::new()),
        };
        let invalid = match &self.hygiene {
            Some(h) => self
                .retry_with("invalid-token lookup", hygiene_transient, || {
                    h.invalid_among(&job.devices, h.scope_of(job.provider_slot))
                })
                .await
                .unwrap_or_default(),
            None => Vec::new(),
        };
        let capped = match &self.shared_cap {
            Some(cap) => {
                // Devices done before are not sent again: no reservation for them either.
                let mut skip: Vec<u32> = invalid.iter().chain(&done_after).copied().collect();
                skip.sort_unstable();
                skip.dedup();
                cap.reserve(
                    &job.campaign_id,
                    &job.job_id,
                    &job.devices,
                    already_done,
                    &skip,
                )
                .await
            }
            None => Vec::new(),
        };
        Lookups {
            settings,
            already_done,
            done_after,
            invalid,
            capped,
        }
    }

    /// Runs `f` until it succeeds (Some) or fails for good (None, logged).
    async fn retry_with<T, E, F, Fut>(
        &self,
        what: &str,
        transient: fn(&E) -> bool,
        f: F,
    ) -> Option<T>
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        match super::retry::until_settled(what, &self.db_down, transient, f).await {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::error!(error = %e, what, "job lookup failed for good; the job goes on without it");
                None
            }
        }
    }
}

fn hygiene_transient(e: &crate::hygiene::HygieneError) -> bool {
    match e {
        crate::hygiene::HygieneError::Database(db) => crate::store::sqlx_is_transient(db),
        _ => false,
    }
}

/// A campaign's settings until its stored ones are read: the job's own, else the
/// defaults. Used only to size the consumer's lookahead; the scheduler gets the stored.
pub fn provisional(
    campaign_id: &str,
    rate: Option<Rate>,
    algorithm: Option<Algorithm>,
    defaults: &CampaignDefaults,
) -> CampaignSettings {
    CampaignSettings {
        id: Arc::from(campaign_id),
        rate: rate.unwrap_or(defaults.send_rate),
        algorithm: algorithm.unwrap_or(defaults.algorithm),
        burst: defaults.burst,
        paused: false,
        halted: false,
        limiter_scope: None,
        weight: 1.0,
        start_at_ms: None,
        expires_at_ms: None,
        cancelled: false,
        priority: Default::default(),
        ramp_up_s: None,
        ramp_from: None,
        finish_by_ms: None,
        local: Default::default(),
    }
}
