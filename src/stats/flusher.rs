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
//! outage is logged once (warn), and its end once (info). Past `max_pending_rows`, or
//! once the oldest unwritten row has waited `max_unwritten`, the recorder's backpressure
//! flag is raised so that the scheduler pauses sending.
//!
//! The backpressure decision never waits for a write: the write runs without the state
//! lock (the batch is taken out under it), and the flusher's timer keeps draining and
//! judging while a write hangs (a half-open connection answers nothing, for as long as
//! the kernel's retransmissions last). Each write is bounded by `write_timeout`, from
//! asking the pool for a connection to the answer; past it the connection is detached
//! from the pool and dropped (never handed to another query) and the same batch is tried
//! again on a new one.
//!
//! Exactness after recovery: a failed statement is rolled back, so writing the same
//! rows again is correct. The one doubtful case is a connection lost while the statement
//! commits: the server may have committed. Each batch therefore carries a sequence
//! number, and the same statement as the counts moves the flusher's one marker row
//! forward to it; a batch that cannot move it (a retry of a committed batch, or a late
//! copy of an older one) skips the counts (progress only moves forward, so it is
//! written again harmlessly). A batch's rows are frozen once tried, and rows drained
//! during an outage wait in the next batch. That is what makes the timeout safe: a write
//! abandoned after it was sent may still commit (even after the retry did), and adds
//! nothing twice.

use super::batch::{Batch, Pending};
use super::counters::StatsRecorder;
use super::StatsError;
use crate::store::StoreError;
use sqlx::PgPool;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
// parking_lot: never held across an await; the write runs without it.
use parking_lot::Mutex;
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
    /// Unwritten rows this old raise backpressure too (`worker.stats_max_unwritten_ms`):
    /// it bounds what sending does while no write commits.
    pub max_unwritten: Duration,
    /// One write attempt, waiting for a connection included (`worker.write_timeout_ms`).
    pub write_timeout: Duration,
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
            max_unwritten: Duration::from_secs(10),
            write_timeout: Duration::from_secs(10),
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
    /// One writer at a time (the timer's or [`Flusher::flush_now`]); the state lock is
    /// not held while it writes.
    writer: tokio::sync::Mutex<()>,
    statements: AtomicU64,
    batches: AtomicU64,
    failed_writes: AtomicU64,
    pending_rows: AtomicUsize,
}

struct State {
    pending: Pending,
    inflight: Option<Arc<Batch>>,
    next_seq: u64,
    /// Consecutive failed writes.
    failures: u32,
    retry_at: Option<Instant>,
    backoff: Duration,
    last_drain: Instant,
    /// Everything recorded before this is committed.
    durable_through: Instant,
}

impl State {
    fn rows(&self) -> usize {
        self.pending.rows() + self.inflight.as_ref().map_or(0, |b| b.rows())
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
                    last_drain: Instant::now(),
                    durable_through: Instant::now(),
                }),
                writer: tokio::sync::Mutex::new(()),
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
        // The write in progress. It is never cancelled (that would only leave its outcome
        // in doubt): it ends by itself, within `write_timeout`.
        let mut write: Option<std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>> =
            None;
        loop {
            let wake = tokio::select! {
                biased;
                _ = stop.cancelled() => Wake::Stop,
                _ = async {
                    match write.as_mut() {
                        Some(w) => w.await,
                        None => std::future::pending().await,
                    }
                } => Wake::Written,
                _ = tick.tick() => Wake::Tick,
            };
            match wake {
                Wake::Stop => break,
                Wake::Written => write = None,
                Wake::Tick => {
                    // Drain and judge the backlog even while a write hangs, so that the
                    // ring never falls a lap behind and backpressure rises in time.
                    if self.drain_and_judge() && write.is_none() {
                        let this = self.clone();
                        write = Some(Box::pin(async move {
                            // Failures are logged (once per outage) and kept for the next try.
                            let _ = this.write_all().await;
                        }));
                    }
                }
            }
        }
        if let Some(w) = write {
            w.await;
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
        // Waits for a write in progress (at most `write_timeout`), then drains after it.
        let _writer = self.inner.writer.lock().await;
        self.drain(&mut self.inner.state.lock());
        self.write_locked().await
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

    /// Drains, updates backpressure, and says whether a write is due (rows are waiting
    /// and no retry backoff holds them).
    fn drain_and_judge(&self) -> bool {
        let mut state = self.inner.state.lock();
        self.drain(&mut state);
        state.rows() > 0 && state.retry_at.is_none_or(|at| Instant::now() >= at)
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
        let now = Instant::now();
        state.last_drain = now;
        if state.rows() == 0 {
            state.durable_through = now;
        }
        self.update_backpressure(state);
    }

    /// Raises the flag past either bound (rows, or age of the oldest unwritten row) and
    /// lowers it once both are back under half.
    fn update_backpressure(&self, state: &State) {
        let rows = state.rows();
        self.inner.pending_rows.store(rows, Ordering::Relaxed);
        let age = if rows == 0 {
            Duration::ZERO
        } else {
            Instant::now().saturating_duration_since(state.durable_through)
        };
        let max = self.inner.config.max_pending_rows;
        let max_age = self.inner.config.max_unwritten;
        let flag = &self.inner.recorder.inner.backpressure;
        if rows > max || age > max_age {
            if !flag.swap(true, Ordering::Relaxed) {
                tracing::warn!(
                    rows,
                    max,
                    unwritten_ms = age.as_millis() as u64,
                    max_unwritten_ms = max_age.as_millis() as u64,
                    "stats backlog over its bound; pausing sends until it is written"
                );
            }
        } else if rows <= max / 2 && age <= max_age / 2 && flag.swap(false, Ordering::Relaxed) {
            tracing::info!(rows, "stats backlog written; sending again");
        }
    }

    /// Writes every pending row (the timer's flush).
    async fn write_all(&self) -> Result<FlushReport, StatsError> {
        let _writer = self.inner.writer.lock().await;
        self.write_locked().await
    }

    /// Writes batches until nothing is pending; the caller holds the writer lock. The
    /// state lock is taken only between writes.
    async fn write_locked(&self) -> Result<FlushReport, StatsError> {
        let mut report = FlushReport::default();
        loop {
            let batch = {
                let mut state = self.inner.state.lock();
                if state.inflight.is_none() {
                    if state.pending.rows() == 0 {
                        break;
                    }
                    let pending = std::mem::take(&mut state.pending);
                    let batch = Arc::new(Batch::seal(pending, state.next_seq, state.last_drain));
                    state.next_seq += 1;
                    state.inflight = Some(batch);
                }
                match &state.inflight {
                    Some(batch) => batch.clone(),
                    None => break,
                }
            };
            let started = std::time::Instant::now();
            self.count_statement(&mut report);
            let result = batch
                .write(
                    &self.inner.pool,
                    &self.inner.id,
                    self.inner.config.write_timeout,
                )
                .await;
            metrics::histogram!("stats_flush_seconds").record(started.elapsed().as_secs_f64());
            let mut state = self.inner.state.lock();
            match result {
                Ok(()) => {
                    state.inflight = None;
                    state.durable_through = state.durable_through.max(batch.drained_at);
                    report.seconds_rows += batch.seconds.len();
                    report.progress_rows += batch.progress.len();
                    report.batches += 1;
                    self.committed(batch);
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
                Err(e) => return Err(self.failed(&mut state, e)),
            }
        }
        self.update_backpressure(&self.inner.state.lock());
        Ok(report)
    }

    /// After a failed write: backoff, one warning per outage, and backpressure.
    fn failed(&self, state: &mut State, e: StoreError) -> StatsError {
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
        StatsError::Flush { rows, source: e }
    }

    /// After a commit: jobs learn their durable progress, finished ones are forgotten.
    fn committed(&self, batch: Arc<Batch>) {
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

    fn count_statement(&self, report: &mut FlushReport) {
        self.inner.statements.fetch_add(1, Ordering::Relaxed);
        metrics::counter!("stats_flush_statements_total").increment(1);
        report.statements += 1;
    }
}

/// What the timer woke the flusher for.
enum Wake {
    Stop,
    Tick,
    Written,
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
