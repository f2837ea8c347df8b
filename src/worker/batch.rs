//! One task answering the enrich stage's lookups of one kind in batches.
//!
//! Every request waiting when the task wakes is answered by one fetch (a database round
//! trip or two), so a worker starting on a backlog of thousands of jobs makes a few
//! round trips, not thousands, each with its own wake-ups on both sides. Under a steady
//! trickle a batch is one request, answered as soon as it comes: nothing waits for
//! company.

use crate::store::StoreError;
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use tokio::sync::{mpsc, oneshot};

/// Requests answered by one fetch. Bounded so that one batch's arrays stay small next to
/// PostgreSQL's limits and a batch's wait stays short; more wait for the next.
pub const MAX_BATCH: usize = 512;

/// Requests waiting for the task: room for a burst of new jobs.
const QUEUE: usize = 4096;

/// What one kind of lookup fetches, many at a time.
pub trait Fetch: Send + Sync + 'static {
    type Query: Send + Sync + 'static;
    /// Requests with the same key get the same answer (the first one's query is asked).
    type Key: Eq + Hash + Send;
    type Answer: Clone + Send + 'static;
    /// For the logs: "campaign lookup", ….
    const WHAT: &'static str;

    fn key(query: &Self::Query) -> Self::Key;

    /// The campaign a query is for, for the logs.
    fn campaign(query: &Self::Query) -> &str;

    /// One answer per query, in order. `Err` as a whole: every query fails alike (and
    /// is retried while that can pass); an `Err` in the list fails that query for good.
    fn fetch(
        &self,
        queries: &[&Self::Query],
    ) -> impl std::future::Future<Output = Result<Vec<Result<Self::Answer, StoreError>>, StoreError>>
           + Send;
}

struct Request<F: Fetch> {
    query: F::Query,
    reply: oneshot::Sender<Option<F::Answer>>,
}

/// The enrich stage's handle on one task. Cheap to clone; the task ends with the last
/// clone.
pub struct Batched<F: Fetch> {
    tx: mpsc::Sender<Request<F>>,
}

impl<F: Fetch> Clone for Batched<F> {
    fn clone(&self) -> Self {
        Self {
            tx: self.tx.clone(),
        }
    }
}

impl<F: Fetch> Batched<F> {
    /// Starts the task on the current runtime.
    pub fn spawn(fetcher: F, db_down: Arc<AtomicBool>) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE);
        tokio::spawn(run(rx, fetcher, db_down));
        Self { tx }
    }

    /// The answer to `query`. `None` when it cannot be had for good (logged): the job
    /// goes on without it. A database that is away is waited for, as every lookup is.
    pub async fn get(&self, query: F::Query) -> Option<F::Answer> {
        let (reply, answer) = oneshot::channel();
        self.tx.send(Request { query, reply }).await.ok()?;
        answer.await.ok().flatten()
    }
}

async fn run<F: Fetch>(mut rx: mpsc::Receiver<Request<F>>, fetcher: F, db_down: Arc<AtomicBool>) {
    let mut batch: Vec<Request<F>> = Vec::new();
    while rx.recv_many(&mut batch, MAX_BATCH).await > 0 {
        // Each request's place among the distinct queries asked.
        let mut index: HashMap<F::Key, usize> = HashMap::with_capacity(batch.len());
        let mut wanted: Vec<&F::Query> = Vec::with_capacity(batch.len());
        let places: Vec<usize> = batch
            .iter()
            .map(|r| {
                *index.entry(F::key(&r.query)).or_insert_with(|| {
                    wanted.push(&r.query);
                    wanted.len() - 1
                })
            })
            .collect();
        let found =
            super::retry::until_settled(F::WHAT, &db_down, StoreError::is_transient, || {
                fetcher.fetch(&wanted)
            })
            .await;
        let found = match found {
            Ok(all) if all.len() == wanted.len() => Ok(all),
            Ok(all) => Err(StoreError::Corrupt {
                table: F::WHAT,
                reason: format!("{} answers to {} queries", all.len(), wanted.len()),
            }),
            Err(e) => Err(e),
        };
        drop(wanted);
        for (r, place) in batch.drain(..).zip(places) {
            let answer = match &found {
                Ok(all) => all[place].as_ref().map_err(ToString::to_string).cloned(),
                Err(e) => Err(e.to_string()),
            };
            let answer = answer
                .map_err(|error| {
                    let campaign = F::campaign(&r.query);
                    tracing::error!(what = F::WHAT, campaign, %error, "lookup failed for good; the job goes on without it");
                })
                .ok();
            let _ = r.reply.send(answer);
        }
    }
}
