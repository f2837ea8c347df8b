//! [`Flusher`]: writes the recorder's counts and job progress to PostgreSQL in batches.
//!
//! Every `interval` the flusher drains the recorder into its own pending buffer, then
//! writes it with ONE statement (so one implicit transaction, no BEGIN/COMMIT round
//! trips): data-modifying CTEs add into `delivery_seconds` for all campaigns' seconds
//! (`INSERT … SELECT FROM UNNEST(…) ON CONFLICT DO UPDATE`) and upsert `job_progress`
//! (each job's finished set, the prefix `devices_done` and the bitmap `done_after`, united
//! with the stored one by `job_progress_union`, so it only grows). PostgreSQL runs every data-modifying CTE exactly
//! once, whether or not the outer query reads it. Adding, not overwriting, lets several
//! workers share a row; rows are sorted so that concurrent flushers lock shared rows in
//! the same order and cannot deadlock.
//!
//! When the database is unreachable the rows stay in memory (the ring keeps being
//! drained, so nothing is lost) and the write is retried with exponential backoff. The
//! outage is logged once (warn), and its end once (info). Past `max_pending_rows` the
//! recorder's backpressure flag is raised so that the scheduler pauses sending.
//!
//! Exactness after recovery: a failed statement is rolled back, so writing the same
//! rows again is correct. The one doubtful case is a connection lost while the statement
//! commits: the server may have committed. Each batch therefore carries a sequence
//! number, and the same statement as the counts moves the flusher's one marker row
//! forward to it; a batch that cannot move it (a retry of a committed batch, or a late
//! copy of an older one) skips the counts (progress only moves forward, so it is
//! written again harmlessly). A batch's rows are frozen once tried, and rows drained
//! during an outage wait in the next batch.

use super::counters::{StatsRecorder, OUTCOMES};
use super::progress::{JobCell, Snapshot};
use super::StatsError;
use crate::store::flush::{self, FlushRows};
use crate::store::StoreError;
use chrono::{DateTime, Utc};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Mutex;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// How often and how patiently the flusher writes.
#[derive(Debug, Clone)]
pub struct FlusherConfig {
    /// Time between flushes (`worker.stats_flush_ms`). Must stay well under a minute,
    /// the span of the recorder's ring.
    pub interval: Duration,
    /// Unwritten rows (campaign-seconds plus jobs) past which backpressure is raised.
    pub max_pending_rows: usize,
    /// First wait after a failed write; doubles up to `retry_max`.
    pub retry_min: Duration,
    pub retry_max: Duration,
    /// How long the final flush at shutdown keeps retrying.
    pub final_flush_timeout: Duration,
}

impl Default for FlusherConfig {
    fn default() -> Self {
        Self {
            interval: Duration::from_secs(1),
            max_pending_rows: 100_000,
            retry_min: Duration::from_millis(250),
            retry_max: Duration::from_secs(10),
            final_flush_timeout: Duration::from_secs(5),
        }
    }
}

/// What one [`Flusher::flush_now`] wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushReport {
    /// Campaign-second rows added into `delivery_seconds`.
    pub seconds_rows: usize,
    /// Rows upserted into `job_progress`.
    pub progress_rows: usize,
    /// Batches committed (one per flush; two after an outage).
    pub batches: usize,
    /// Statements executed: one per batch attempt.
    pub statements: u64,
}

/// Flushes a [`StatsRecorder`]; cheap to clone (clones share the same buffer).
#[derive(Clone)]
pub struct Flusher {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Flusher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Flusher")
            .field("id", &self.inner.id)
            .field("pending_rows", &self.pending_rows())
            .finish_non_exhaustive()
    }
}

struct Inner {
    recorder: StatsRecorder,
    pool: PgPool,
    config: FlusherConfig,
    /// Unique per flusher, for the batch markers.
    id: String,
    state: Mutex<State>,
    statements: AtomicU64,
    batches: AtomicU64,
    failed_writes: AtomicU64,
    pending_rows: AtomicUsize,
}

/// Rows drained but not yet in a batch.
#[derive(Default)]
struct Pending {
    seconds: HashMap<(Arc<str>, u64), [u64; OUTCOMES]>,
    /// By cell address: one entry per tracked job, holding its latest finished set.
    progress: HashMap<usize, (Arc<JobCell>, Snapshot)>,
}

impl Pending {
    fn rows(&self) -> usize {
        self.seconds.len() + self.progress.len()
    }
}

/// Rows frozen for one transaction, sorted.
struct Batch {
    seq: u64,
    seconds: Vec<(Arc<str>, DateTime<Utc>, [i64; OUTCOMES])>,
    progress: Vec<(Arc<JobCell>, Snapshot)>,
}

impl Batch {
    fn rows(&self) -> usize {
        self.seconds.len() + self.progress.len()
    }
}

struct State {
    pending: Pending,
    inflight: Option<Batch>,
    next_seq: u64,
    /// Consecutive failed writes.
    failures: u32,
    retry_at: Option<Instant>,
    backoff: Duration,
}

impl State {
    fn rows(&self) -> usize {
        self.pending.rows() + self.inflight.as_ref().map_or(0, Batch::rows)
    }
}

impl Flusher {
    pub fn new(recorder: StatsRecorder, pool: PgPool, config: FlusherConfig) -> Self {
        let backoff = config.retry_min;
        Self {
            inner: Arc::new(Inner {
                recorder,
                pool,
                id: unique_id(),
                state: Mutex::new(State {
                    pending: Pending::default(),
                    inflight: None,
                    next_seq: 1,
                    failures: 0,
                    retry_at: None,
                    backoff,
                }),
                config,
                statements: AtomicU64::new(0),
                batches: AtomicU64::new(0),
                failed_writes: AtomicU64::new(0),
                pending_rows: AtomicUsize::new(0),
            }),
        }
    }

    /// Flushes every `interval` until `stop` is cancelled, then makes a final flush,
    /// retrying for up to `final_flush_timeout`.
    pub async fn run(&self, stop: CancellationToken) -> Result<(), StatsError> {
        let mut tick = tokio::time::interval(self.inner.config.interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            // The flush runs outside the select: cancelling it mid-transaction would
            // only leave the outcome in doubt.
            let stop = tokio::select! {
                biased;
                _ = stop.cancelled() => true,
                _ = tick.tick() => false,
            };
            if stop {
                break;
            }
            self.scheduled_flush().await;
        }
        self.final_flush().await
    }

    /// Spawns [`Flusher::run`] on the current runtime.
    pub fn spawn(
        &self,
        stop: CancellationToken,
    ) -> tokio::task::JoinHandle<Result<(), StatsError>> {
        let this = self.clone();
        tokio::spawn(async move { this.run(stop).await })
    }

    /// Drains everything now and writes it, ignoring the retry backoff (for shutdown and
    /// partition revocation). On failure the rows stay pending.
    pub async fn flush_now(&self) -> Result<FlushReport, StatsError> {
        let mut state = self.inner.state.lock().await;
        self.drain(&mut state);
        self.write_all(&mut state).await
    }

    /// Data statements executed so far (attempts included).
    pub fn statements(&self) -> u64 {
        self.inner.statements.load(Ordering::Relaxed)
    }

    /// Transactions committed so far.
    pub fn batches_committed(&self) -> u64 {
        self.inner.batches.load(Ordering::Relaxed)
    }

    /// Batch writes that failed so far (each is retried).
    pub fn failed_writes(&self) -> u64 {
        self.inner.failed_writes.load(Ordering::Relaxed)
    }

    /// Rows drained but not yet committed, as of the last drain or write.
    pub fn pending_rows(&self) -> usize {
        self.inner.pending_rows.load(Ordering::Relaxed)
    }

    /// The recorder this flusher drains.
    pub fn recorder(&self) -> &StatsRecorder {
        &self.inner.recorder
    }

    async fn scheduled_flush(&self) {
        let mut state = self.inner.state.lock().await;
        // Drain even while backing off, so the ring never falls a lap behind.
        self.drain(&mut state);
        if state.retry_at.is_some_and(|at| Instant::now() < at) {
            return;
        }
        // Failures are logged (once per outage) and kept for the next attempt.
        let _ = self.write_all(&mut state).await;
    }

    async fn final_flush(&self) -> Result<(), StatsError> {
        let deadline = Instant::now() + self.inner.config.final_flush_timeout;
        let mut wait = self.inner.config.retry_min;
        loop {
            match self.flush_now().await {
                Ok(_) => return Ok(()),
                Err(StatsError::Flush { rows, source }) => {
                    if Instant::now() + wait > deadline {
                        tracing::error!(rows, error = %source, "giving up the final stats flush");
                        return Err(StatsError::Unflushed { rows, source });
                    }
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(self.inner.config.retry_max);
                }
                Err(other) => return Err(other),
            }
        }
    }

    fn drain(&self, state: &mut State) {
        let pending = &mut state.pending;
        // Progress first, counts second: the scheduler counts a device before it marks it
        // done, so every device in the drained progress has its count in this batch too.
        // (The other order could commit a device as done whose count lands in the next
        // batch, which a crash would then lose.)
        {
            let mut jobs = self.inner.recorder.inner.jobs.lock();
            // Forget jobs whose handle was dropped after their last value became durable.
            jobs.retain(|cell| !cell.finished());
            for cell in jobs.iter() {
                if let Some(snapshot) = cell.take_change() {
                    // A cell's snapshots only grow: the latest holds the earlier ones.
                    pending
                        .progress
                        .insert(Arc::as_ptr(cell) as usize, (cell.clone(), snapshot));
                }
            }
        }
        self.inner
            .recorder
            .drain_counts(|campaign, second, outcome, n| {
                let counts = pending
                    .seconds
                    .entry((campaign.clone(), second))
                    .or_default();
                counts[outcome] = counts[outcome].saturating_add(n);
            });
        self.update_backpressure(state);
    }

    fn update_backpressure(&self, state: &State) {
        let rows = state.rows();
        self.inner.pending_rows.store(rows, Ordering::Relaxed);
        let max = self.inner.config.max_pending_rows;
        let flag = &self.inner.recorder.inner.backpressure;
        if rows > max {
            if !flag.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    rows,
                    max,
                    "stats backlog over its bound; pausing sends until it is written"
                );
            }
        } else if rows <= max / 2 && flag.swap(false, Ordering::Relaxed) {
            tracing::info!(rows, "stats backlog written; sending again");
        }
    }

    /// Freezes the pending rows into a new batch.
    fn seal(&self, state: &mut State) -> Batch {
        let pending = std::mem::take(&mut state.pending);
        let mut seconds: Vec<_> = pending
            .seconds
            .into_iter()
            .filter_map(|((campaign, second), counts)| {
                let at = i64::try_from(second)
                    .ok()
                    .and_then(|s| DateTime::from_timestamp(s, 0));
                match at {
                    Some(at) => Some((campaign, at, counts.map(|c| i64::try_from(c).unwrap_or(i64::MAX)))),
                    None => {
                        // Only a nonsense clock gets here; PostgreSQL cannot hold it anyway.
                        tracing::error!(campaign = %campaign, second, ?counts, "dropping counts for an unrepresentable second");
                        None
                    }
                }
            })
            .collect();
        seconds.sort_unstable_by(|a, b| (&a.0, a.1).cmp(&(&b.0, b.1)));
        let mut progress: Vec<_> = pending.progress.into_values().collect();
        progress.sort_unstable_by(|a, b| {
            (&a.0.campaign_id, &a.0.job_id).cmp(&(&b.0.campaign_id, &b.0.job_id))
        });
        let seq = state.next_seq;
        state.next_seq += 1;
        Batch {
            seq,
            seconds,
            progress,
        }
    }

    async fn write_all(&self, state: &mut State) -> Result<FlushReport, StatsError> {
        let mut report = FlushReport::default();
        loop {
            if state.inflight.is_none() {
                if state.pending.rows() == 0 {
                    break;
                }
                let batch = self.seal(state);
                state.inflight = Some(batch);
            }
            let Some(batch) = state.inflight.as_ref() else {
                break;
            };
            let started = std::time::Instant::now();
            let result = self.write_batch(batch, &mut report).await;
            metrics::histogram!("stats_flush_seconds").record(started.elapsed().as_secs_f64());
            match result {
                Ok(()) => {
                    if let Some(batch) = state.inflight.take() {
                        report.seconds_rows += batch.seconds.len();
                        report.progress_rows += batch.progress.len();
                        report.batches += 1;
                        self.committed(batch);
                    }
                    if state.failures > 0 {
                        tracing::info!(
                            failed_attempts = state.failures,
                            "stats flush recovered; the rows kept in memory are written"
                        );
                    }
                    state.failures = 0;
                    state.retry_at = None;
                    state.backoff = self.inner.config.retry_min;
                }
                Err(e) => {
                    self.inner.failed_writes.fetch_add(1, Ordering::Relaxed);
                    let rows = state.rows();
                    if state.failures == 0 {
                        tracing::warn!(
                            error = %e,
                            rows,
                            "stats flush failed; keeping counts in memory and retrying with backoff"
                        );
                    } else {
                        tracing::debug!(error = %e, rows, attempt = state.failures + 1, "stats flush failed again");
                    }
                    state.failures = state.failures.saturating_add(1);
                    state.retry_at = Some(Instant::now() + state.backoff);
                    state.backoff = (state.backoff * 2).min(self.inner.config.retry_max);
                    self.update_backpressure(state);
                    return Err(StatsError::Flush { rows, source: e });
                }
            }
        }
        self.update_backpressure(state);
        Ok(report)
    }

    /// After a commit: jobs learn their durable progress, finished ones are forgotten.
    fn committed(&self, batch: Batch) {
        self.inner.batches.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("stats_flushes_total").increment(1);
        if batch.progress.is_empty() {
            return;
        }
        for (cell, snapshot) in &batch.progress {
            cell.mark_durable(snapshot);
        }
        drop(batch);
        self.inner
            .recorder
            .inner
            .jobs
            .lock()
            .retain(|cell| !cell.finished());
    }

    async fn write_batch(&self, batch: &Batch, report: &mut FlushReport) -> Result<(), StoreError> {
        let campaigns: Vec<&str> = batch.seconds.iter().map(|r| &*r.0).collect();
        let seconds: Vec<DateTime<Utc>> = batch.seconds.iter().map(|r| r.1).collect();
        let column = |i: usize| -> Vec<i64> { batch.seconds.iter().map(|r| r.2[i]).collect() };
        let n = batch.progress.len();
        let mut jobs: Vec<&str> = Vec::with_capacity(n);
        let mut job_campaigns: Vec<&str> = Vec::with_capacity(n);
        let mut partitions: Vec<i32> = Vec::with_capacity(n);
        let mut offsets: Vec<i64> = Vec::with_capacity(n);
        let mut totals: Vec<i32> = Vec::with_capacity(n);
        let mut sets: Vec<Snapshot> = Vec::with_capacity(n);
        for (cell, snapshot) in &batch.progress {
            // The same job tracked twice (re-consumed): one row, the union of both,
            // since ON CONFLICT cannot touch a row twice in one statement.
            if jobs.last() == Some(&&*cell.job_id)
                && job_campaigns.last() == Some(&&*cell.campaign_id)
            {
                if let Some(last) = sets.last_mut() {
                    last.union(snapshot);
                }
                continue;
            }
            jobs.push(&cell.job_id);
            job_campaigns.push(&cell.campaign_id);
            partitions.push(cell.partition);
            offsets.push(cell.offset);
            totals.push(clamp_i32(cell.total));
            sets.push(snapshot.clone());
        }
        let done: Vec<i32> = sets.iter().map(|s| clamp_i32(s.done)).collect();
        let after: Vec<Vec<u8>> = sets.iter().map(Snapshot::after_bytes).collect();
        self.count_statement(report);
        let rows = FlushRows {
            flusher_id: &self.inner.id,
            seq: i64::try_from(batch.seq).unwrap_or(i64::MAX),
            campaigns: &campaigns,
            seconds: &seconds,
            counts: std::array::from_fn(column),
            jobs: &jobs,
            job_campaigns: &job_campaigns,
            partitions: &partitions,
            offsets: &offsets,
            totals: &totals,
            done: &done,
            after: &after,
        };
        flush::write(&self.inner.pool, &rows).await?;
        Ok(())
    }

    fn count_statement(&self, report: &mut FlushReport) {
        self.inner.statements.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("stats_flush_statements_total").increment(1);
        report.statements += 1;
    }
}

// The statement takes one count column per outcome.
const _: () = assert!(OUTCOMES == flush::COUNT_COLUMNS);

fn clamp_i32(v: u32) -> i32 {
    i32::try_from(v).unwrap_or(i32::MAX)
}

/// A flusher id unique across processes and restarts: pid, start time and a counter.
fn unique_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    format!(
        "{}-{nanos:x}-{}",
        std::process::id(),
        NEXT.fetch_add(1, Ordering::Relaxed)
    )
}
