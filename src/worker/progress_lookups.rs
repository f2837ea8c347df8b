//! Stored-progress lookups for the consumer, batched: one statement answers every job
//! that asked while the previous statement ran.
//!
//! Jobs reach the consumer in bursts (a fetch answer brings a few hundred at once), and
//! each must know its stored progress before the scheduler gets it. One `SELECT` per job
//! put about a thousand statements a second on the PostgreSQL server that the broker
//! may share, for rows that almost never exist (a job has progress only after a crash
//! or a revocation). Batching answers a burst with one or two statements and adds no
//! wait when jobs come one at a time: a lone request goes out at once.

use crate::store::progress::{self, JobProgress};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};

/// Jobs answered by one statement at most: a burst of a fetch answer (about 300 jobs of
/// 500 devices per MiB-sized partition fetch) in one or two statements, while the array
/// parameter stays a few kilobytes.
const MAX_BATCH: usize = 256;

/// Why a lookup has no answer; the caller retries (a job waits, it is never dropped).
#[derive(Debug, Clone, thiserror::Error)]
pub enum LookupError {
    #[error("{0}")]
    Store(Arc<crate::store::StoreError>),
    #[error("the progress lookup task has stopped")]
    Stopped,
}

type Reply = oneshot::Sender<Result<Option<JobProgress>, LookupError>>;

/// The handle the consumer's lookup tasks share.
#[derive(Clone)]
pub struct ProgressLookups {
    requests: mpsc::UnboundedSender<(String, Reply)>,
    statements: Arc<AtomicU64>,
}

impl ProgressLookups {
    /// Starts the batching task on `runtime`; it ends when every handle is dropped.
    pub fn start(pool: PgPool, runtime: &Handle) -> Self {
        let (requests, rx) = mpsc::unbounded_channel();
        let statements = Arc::new(AtomicU64::new(0));
        runtime.spawn(serve(pool, rx, statements.clone()));
        Self {
            requests,
            statements,
        }
    }

    /// The stored progress of `job_id`, if any was flushed.
    pub async fn lookup(&self, job_id: &str) -> Result<Option<JobProgress>, LookupError> {
        let (reply, answer) = oneshot::channel();
        self.requests
            .send((job_id.to_owned(), reply))
            .map_err(|_| LookupError::Stopped)?;
        answer.await.map_err(|_| LookupError::Stopped)?
    }

    /// Statements run so far (for tests and metrics).
    pub fn statements(&self) -> u64 {
        self.statements.load(Relaxed)
    }
}

async fn serve(
    pool: PgPool,
    mut rx: mpsc::UnboundedReceiver<(String, Reply)>,
    statements: Arc<AtomicU64>,
) {
    let mut batch: Vec<(String, Reply)> = Vec::with_capacity(MAX_BATCH);
    let mut ids: Vec<String> = Vec::with_capacity(MAX_BATCH);
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        ids.clear();
        ids.extend(batch.iter().map(|(id, _)| id.clone()));
        let result = progress::lookup_many(&pool, &ids).await;
        statements.fetch_add(1, Relaxed);
        metrics::counter!("progress_lookup_statements_total").increment(1);
        match result {
            Ok(found) => {
                // Rows are rare (a job has progress only after a crash or a revocation);
                // a job_id asked twice in one batch gets its row both times.
                let by_id: HashMap<String, JobProgress> =
                    found.into_iter().map(|p| (p.job_id.clone(), p)).collect();
                for (id, reply) in batch.drain(..) {
                    let _ = reply.send(Ok(by_id.get(&id).cloned()));
                }
            }
            Err(e) => {
                let e = LookupError::Store(Arc::new(e));
                for (_, reply) in batch.drain(..) {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
