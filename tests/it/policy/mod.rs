//! The delivery policy (issue 56) through the real worker: jobs produced to the real
//! broker, settings stored in the real PostgreSQL, sends to the loopback sink, whose
//! release stamps (the worker's own send instants) measure the pacing.

mod finish_by;
mod priority;
mod ramp;
mod windows;

use crate::harness::{job_at, produce_jobs, TestWorker};
use crate::helpers::{pacing_lock, unique_name, wait_for};
use pushpace::job::Job;
use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch};
use pushpace::tools::sink::Arrival;
use sqlx::PgPool;
use std::time::Duration;

/// How long a worker may take to join its group and start sending (tansu's group join
/// takes seconds: a rebalance per heartbeat while it settles).
const GROUP_JOIN_LIMIT: Duration = Duration::from_secs(60);

/// Stores `patch` for `campaign` before its jobs arrive: the stored settings win.
async fn store(pool: &PgPool, campaign: &str, patch: CampaignPatch) {
    campaigns::put(pool, campaign, &patch, &CampaignDefaults::default())
        .await
        .expect("store the campaign's policy");
}

/// `jobs` jobs of `devices` devices for `campaign` at `rate` (the stored rate wins).
fn jobs(campaign: &str, rate: f64, jobs: usize, devices: usize) -> Vec<Job> {
    (0..jobs)
        .map(|j| {
            let list: Vec<String> = (0..devices)
                .map(|d| format!("{campaign}-{j}-{d}"))
                .collect();
            job_at(&format!("{campaign}-j{j}"), campaign, rate, &list)
        })
        .collect()
}

/// The worker's release instants of `campaign`'s pushes, sorted.
fn released(arrivals: &[Arrival], campaign: &str) -> Vec<Duration> {
    let mut out: Vec<Duration> = arrivals
        .iter()
        .filter(|a| &*a.campaign_id == campaign)
        .map(|a| a.released.expect("release stamp"))
        .collect();
    out.sort();
    out
}

/// Releases in `[from, to)`.
fn count_in(times: &[Duration], from: Duration, to: Duration) -> usize {
    times.partition_point(|t| *t < to) - times.partition_point(|t| *t < from)
}

/// A campaign name unique to this run (ids take no `_`).
fn name(prefix: &str) -> String {
    unique_name(prefix).replace('_', "-")
}
