//! Job progress for the enrich stage, read in batches ([`super::batch`]) over a
//! connection of the loader's own.
//!
//! Every job is looked up, and a pooled query costs three round trips: sqlx tests the
//! connection when it is taken and again when it is given back. A held connection makes
//! it one round trip a batch; a failure drops it, and the retry opens a new one.

use super::batch::{Batched, Fetch};
use crate::store::progress::{self, JobProgress};
use crate::store::StoreError;
use sqlx::postgres::{PgConnectOptions, PgConnection};
use sqlx::{ConnectOptions, PgPool};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;

/// A job, as its progress is keyed.
pub struct JobQuery {
    pub campaign_id: String,
    pub job_id: String,
}

/// Reads stored progress over its own connection.
pub struct ProgressFetch {
    options: Arc<PgConnectOptions>,
    connect_timeout: Duration,
    /// Only the loader's task uses it; the lock is never contended.
    conn: Mutex<Option<PgConnection>>,
}

impl ProgressFetch {
    async fn connect(&self) -> Result<PgConnection, StoreError> {
        match tokio::time::timeout(self.connect_timeout, self.options.connect()).await {
            Ok(conn) => Ok(conn?),
            Err(_) => Err(StoreError::from(sqlx::Error::PoolTimedOut)),
        }
    }
}

impl Fetch for ProgressFetch {
    type Query = JobQuery;
    type Key = (String, String);
    type Answer = Option<JobProgress>;
    const WHAT: &'static str = "progress lookup";

    fn key(query: &JobQuery) -> (String, String) {
        (query.campaign_id.clone(), query.job_id.clone())
    }

    fn campaign(query: &JobQuery) -> &str {
        &query.campaign_id
    }

    async fn fetch(
        &self,
        queries: &[&JobQuery],
    ) -> Result<Vec<Result<Option<JobProgress>, StoreError>>, StoreError> {
        let keys: Vec<(&str, &str)> = queries
            .iter()
            .map(|q| (q.campaign_id.as_str(), q.job_id.as_str()))
            .collect();
        let mut slot = self.conn.lock().await;
        let mut conn = match slot.take() {
            Some(conn) => conn,
            None => self.connect().await?,
        };
        let found = progress::lookup_many(&mut conn, &keys).await;
        // Whatever broke, the next try starts on a new connection.
        if found.is_ok() {
            *slot = Some(conn);
        }
        found
    }
}

/// The enrich stage's handle on the task. Cheap to clone.
#[derive(Clone)]
pub struct ProgressLoader(Batched<ProgressFetch>);

impl ProgressLoader {
    /// Starts the task on the current runtime; its connection is opened with `pool`'s
    /// options when first needed.
    pub fn spawn(pool: &PgPool, db_down: Arc<AtomicBool>) -> Self {
        let fetch = ProgressFetch {
            options: pool.connect_options(),
            connect_timeout: pool.options().get_acquire_timeout(),
            conn: Mutex::new(None),
        };
        Self(Batched::spawn(fetch, db_down))
    }

    /// The job's stored progress: `Some(None)` when none was flushed, `None` when it
    /// cannot be had for good (logged).
    pub async fn progress(&self, campaign_id: &str, job_id: &str) -> Option<Option<JobProgress>> {
        self.0
            .get(JobQuery {
                campaign_id: campaign_id.to_string(),
                job_id: job_id.to_string(),
            })
            .await
    }
}
