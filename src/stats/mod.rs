//! In-memory per-campaign, per-second delivery counters and their batched flusher.
//!
//! The hot path ([`CampaignCounter::record`], [`JobProgressHandle::mark`],
//! [`JobProgressHandle::set_done`]) is a few atomic operations on memory owned by one
//! campaign or one job: no allocation, no lock shared between campaigns. A [`Flusher`]
//! drains everything every `interval` into its own buffer and writes it to PostgreSQL in
//! one statement (UNNEST upserts for all campaigns' seconds and all jobs' finished sets),
//! so that counts and progress commit together and a crash loses at most one interval of
//! both, whatever a single device (a retrying one) does.
//!
//! - [`counters`]: [`StatsRecorder`], [`CampaignCounter`] and the per-second ring.
//! - [`progress`]: [`JobKey`] and [`JobProgressHandle`].
//! - [`flusher`]: [`Flusher`], its retry and backpressure.

mod batch;
pub mod counters;
pub mod flusher;
pub mod progress;

pub use counters::{unix_second, CampaignCounter, Outcome, StatsRecorder, OUTCOMES, RING_SECONDS};
pub use flusher::{FlushReport, Flusher, FlusherConfig};
pub use progress::{JobKey, JobProgressHandle};

use crate::store::StoreError;

/// Errors of the stats flusher.
#[derive(Debug, thiserror::Error)]
pub enum StatsError {
    /// A flush failed; its rows are kept in memory and retried.
    #[error("stats flush failed ({rows} rows kept in memory): {source}")]
    Flush {
        rows: usize,
        #[source]
        source: StoreError,
    },
    /// The final flush at shutdown gave up: these rows are lost.
    #[error("stats not flushed at shutdown: {rows} rows lost: {source}")]
    Unflushed {
        rows: usize,
        #[source]
        source: StoreError,
    },
}
