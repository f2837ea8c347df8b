//! The outcomes stage: one async task writes what the worker learned to PostgreSQL
//! (dead letters, invalid tokens, committed offsets) and releases shared-cap
//! reservations, off the consumer thread and off the scheduler.
//!
//! Producers never wait: [`Outcomes::record`] either queues (bounded) or hands the
//! record back, and the caller holds its own work (the consumer pauses its partitions,
//! the scheduler stops dispatching) until there is room again. Every record gets a
//! sequence number; [`Outcomes::durable`] is the highest number below which every record
//! is written, so a caller can make a device's progress (or a message's offset) wait for
//! its dead letter: a letter is durable no later than the progress that skips it.
//!
//! Writes are retried while the failure can pass (connection lost, server shutting
//! down, serialization failure, no answer within `write_timeout`: a half-open
//! connection answers nothing, and every write here is idempotent, so an abandoned one
//! that lands late changes nothing); a data error is not retried: the letter is stored
//! again in its minimal form (reason and raw bytes), and only if that fails too is it
//! logged and counted as lost (`dead_letter_write_failures_total`).

use crate::capping::shared::SharedCap;
use crate::hygiene::TokenHygiene;
use crate::job::Job;
use crate::store::dead_letters::{self, DeadLetter};
use crate::store::DeadLetterKind;
use parking_lot::Mutex;
use sqlx::PgPool;
use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;

/// A dead letter owned by the queue.
#[derive(Debug, Clone)]
pub struct Letter {
    pub kind: DeadLetterKind,
    pub partition: i32,
    pub offset: i64,
    pub campaign_id: Option<Arc<str>>,
    pub job_id: Option<String>,
    /// The device's index in its job, for a device's letter.
    pub device: Option<u32>,
    pub device_token: Option<String>,
    pub reason: String,
    /// The Kafka key, for a message's letter.
    pub key: Option<Vec<u8>>,
    /// The message, for a message's letter (at most `dead_letters::MAX_RAW_BYTES`).
    pub raw: Vec<u8>,
    /// A device's job, so that the letter can be replayed: its template (payload,
    /// provider, options) is stored once per job (`dead_letter_jobs`).
    pub replay: Option<Arc<Job>>,
}

/// What the stage writes.
#[derive(Debug)]
pub enum Record {
    DeadLetter(Box<Letter>),
    /// The provider said this token is gone for good. The device was not delivered,
    /// so its shared-cap reservation (if any) is released once the token is recorded.
    InvalidToken {
        token: String,
        /// The provider (its configured name) that answered: the mark's scope.
        provider: Arc<str>,
        reason: String,
        campaign_id: Arc<str>,
        job_id: String,
        device: u32,
    },
    /// Offsets committed to Kafka (progress behind them may be pruned).
    Committed(Vec<(i32, i64)>),
    /// A campaign halted by its provider's answer: its status becomes `halted`.
    Halt {
        campaign_id: Arc<str>,
        reason: String,
    },
    /// A provider refused an app's credentials (those with `fingerprint`): that kind of
    /// the app becomes `halted`, until `apps enable` or a new PUT.
    AppHalt {
        app_id: Arc<str>,
        kind: crate::provider::ProviderKind,
        fingerprint: Arc<str>,
        reason: String,
    },
}

/// Settings of the stage.
#[derive(Debug, Clone, Copy)]
pub struct OutcomesConfig {
    /// Records queued at most; beyond, producers hold their work.
    pub capacity: usize,
    /// Letters written in one statement at most.
    pub batch: usize,
    /// One write attempt, waiting for a connection included (`worker.write_timeout_ms`).
    pub write_timeout: std::time::Duration,
}

impl Default for OutcomesConfig {
    fn default() -> Self {
        Self {
            capacity: 4096,
            batch: 256,
            write_timeout: std::time::Duration::from_secs(10),
        }
    }
}

struct Shared {
    /// Serialises numbering with queueing, so that numbers enter the queue in order.
    send: Mutex<()>,
    next_seq: AtomicU64,
    /// Every record numbered below this is written (or given up).
    durable: AtomicU64,
    writing_down: AtomicBool,
    write_timeout: std::time::Duration,
}

/// The producers' handle; cheap to clone.
#[derive(Clone)]
pub struct Outcomes {
    tx: mpsc::Sender<(u64, Record)>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Outcomes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Outcomes")
            .field("queued", &self.queued())
            .field("durable", &self.durable())
            .finish()
    }
}

impl Outcomes {
    /// Queues a record and returns its sequence number, or hands it back when the
    /// queue is full (or the stage is gone).
    pub fn record(&self, record: Record) -> Result<u64, Record> {
        let _order = self.shared.send.lock();
        let seq = self.shared.next_seq.load(Ordering::Relaxed);
        match self.tx.try_send((seq, record)) {
            Ok(()) => {
                self.shared.next_seq.store(seq + 1, Ordering::Release);
                Ok(seq)
            }
            Err(mpsc::error::TrySendError::Full((_, r)))
            | Err(mpsc::error::TrySendError::Closed((_, r))) => Err(r),
        }
    }

    /// Whether record `seq` is written.
    pub fn is_durable(&self, seq: u64) -> bool {
        seq < self.durable()
    }

    /// Every record numbered below this is written.
    pub fn durable(&self) -> u64 {
        self.shared.durable.load(Ordering::Acquire)
    }

    /// Records queued and not yet written.
    pub fn queued(&self) -> u64 {
        self.shared
            .next_seq
            .load(Ordering::Acquire)
            .saturating_sub(self.durable())
    }

    /// Whether the last write attempt failed (the database is away).
    pub fn is_stalled(&self) -> bool {
        self.shared.writing_down.load(Ordering::Relaxed)
    }
}

/// What the writer task needs.
pub struct OutcomeWriter {
    rx: mpsc::Receiver<(u64, Record)>,
    shared: Arc<Shared>,
    pool: PgPool,
    topic: String,
    hygiene: Option<Arc<TokenHygiene>>,
    shared_cap: Option<SharedCap>,
    batch: usize,
    /// Written numbers above the contiguous durable mark.
    done_above: BTreeSet<u64>,
}

/// Builds the stage: the producers' handle and the writer to spawn.
pub fn channel(
    config: OutcomesConfig,
    pool: PgPool,
    topic: String,
    hygiene: Option<Arc<TokenHygiene>>,
    shared_cap: Option<SharedCap>,
) -> (Outcomes, OutcomeWriter) {
    let (tx, rx) = mpsc::channel(config.capacity.max(1));
    let shared = Arc::new(Shared {
        send: Mutex::new(()),
        next_seq: AtomicU64::new(0),
        durable: AtomicU64::new(0),
        writing_down: AtomicBool::new(false),
        write_timeout: config.write_timeout,
    });
    (
        Outcomes {
            tx,
            shared: shared.clone(),
        },
        OutcomeWriter {
            rx,
            shared,
            pool,
            topic,
            hygiene,
            shared_cap,
            batch: config.batch.max(1),
            done_above: BTreeSet::new(),
        },
    )
}

impl OutcomeWriter {
    /// Writes records until every producer handle is dropped and the queue is empty.
    pub async fn run(mut self) {
        let mut buf = Vec::with_capacity(self.batch);
        while self.rx.recv_many(&mut buf, self.batch).await > 0 {
            let mut letters = Vec::new();
            for (seq, record) in buf.drain(..) {
                match record {
                    Record::DeadLetter(l) => letters.push((seq, *l)),
                    Record::InvalidToken {
                        token,
                        provider,
                        reason,
                        campaign_id,
                        job_id,
                        device,
                    } => {
                        self.invalid_token(&token, &provider, &reason).await;
                        if let Some(cap) = &self.shared_cap {
                            cap.release(&campaign_id, &job_id, device, &token);
                        }
                        self.written(seq);
                    }
                    Record::Committed(marks) => {
                        self.committed(&marks).await;
                        self.written(seq);
                    }
                    Record::Halt {
                        campaign_id,
                        reason,
                    } => {
                        self.halt(&campaign_id, &reason).await;
                        self.written(seq);
                    }
                    Record::AppHalt {
                        app_id,
                        kind,
                        fingerprint,
                        reason,
                    } => {
                        self.app_halt(&app_id, kind, &fingerprint, &reason).await;
                        self.written(seq);
                    }
                }
            }
            if !letters.is_empty() {
                self.letters(&letters).await;
                for (seq, l) in &letters {
                    self.release_cap(l);
                    self.written(*seq);
                }
            }
        }
    }

    fn written(&mut self, seq: u64) {
        let mut durable = self.shared.durable.load(Ordering::Relaxed);
        if seq != durable {
            self.done_above.insert(seq);
            return;
        }
        durable += 1;
        while self.done_above.remove(&durable) {
            durable += 1;
        }
        self.shared.durable.store(durable, Ordering::Release);
    }

    fn release_cap(&self, l: &Letter) {
        if let (Some(cap), Some(campaign), Some(job), Some(device), Some(token)) = (
            &self.shared_cap,
            &l.campaign_id,
            &l.job_id,
            l.device,
            &l.device_token,
        ) {
            cap.release(campaign, job, device, token);
        }
    }

    async fn letters(&self, letters: &[(u64, Letter)]) {
        self.templates(letters).await;
        let rows: Vec<DeadLetter<'_>> = letters.iter().map(|(_, l)| self.row(l)).collect();
        let Err(e) = self.write("dead letters", &rows).await else {
            count_letters(letters.iter().map(|(_, l)| l));
            return;
        };
        // A batch refused for its data: each letter alone, then in its minimal form.
        tracing::error!(error = %e, "a batch of dead letters was refused; writing them one by one");
        for (_, l) in letters {
            self.letter_alone(l).await;
        }
    }

    /// Writes letters in one statement, retrying while the failure can pass.
    async fn write(&self, what: &str, rows: &[DeadLetter<'_>]) -> Result<(), Failure> {
        retry(what, &self.shared, || async {
            dead_letters::insert_batch(&self.pool, rows)
                .await
                .map(|_| ())
                .map_err(Failure::from_store)
        })
        .await
    }

    /// Stores the replay templates of the letters' jobs, once per job. A failure costs
    /// only the replay (logged): the letters are written either way.
    async fn templates(&self, letters: &[(u64, Letter)]) {
        let mut jobs: Vec<(i32, i64, Vec<u8>)> = Vec::new();
        for (_, l) in letters {
            let Some(job) = &l.replay else { continue };
            if !jobs
                .iter()
                .any(|(p, o, _)| (*p, *o) == (l.partition, l.offset))
            {
                jobs.push((l.partition, l.offset, dead_letters::job_template(job)));
            }
        }
        if jobs.is_empty() {
            return;
        }
        let rows: Vec<dead_letters::LetterJob<'_>> = jobs
            .iter()
            .map(|(partition, offset, job)| dead_letters::LetterJob {
                topic: &self.topic,
                partition: *partition,
                kafka_offset: *offset,
                job,
            })
            .collect();
        let r = retry("dead-letter jobs", &self.shared, || async {
            dead_letters::insert_jobs(&self.pool, &rows)
                .await
                .map(|_| ())
                .map_err(Failure::from_store)
        })
        .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "replay templates of dead-lettered devices not stored");
        }
    }

    async fn letter_alone(&self, l: &Letter) {
        let row = self.row(l);
        let Err(e) = self.write("dead letter", &[row]).await else {
            count_letters([l]);
            return;
        };
        let reason = format!("{} (stored in minimal form: {e})", l.reason);
        let minimal = DeadLetter {
            campaign_id: None,
            job_id: None,
            device_token: None,
            reason: &reason,
            ..row
        };
        let last = self.write("dead letter (minimal)", &[minimal]).await;
        if let Err(e) = last {
            metrics::counter!("dead_letter_write_failures_total").increment(1);
            tracing::error!(
                error = %e,
                partition = l.partition,
                offset = l.offset,
                device = ?l.device,
                kind = l.kind.as_str(),
                "a dead letter could not be stored in any form"
            );
        } else {
            count_letters([l]);
        }
    }

    fn row<'a>(&'a self, l: &'a Letter) -> DeadLetter<'a> {
        DeadLetter {
            kind: l.kind,
            topic: &self.topic,
            partition: l.partition,
            kafka_offset: l.offset,
            campaign_id: l.campaign_id.as_deref(),
            job_id: l.job_id.as_deref(),
            device_token: l.device_token.as_deref(),
            reason: &l.reason,
            raw: &l.raw,
            key: l.key.as_deref(),
            device: l.device,
        }
    }

    async fn invalid_token(&self, token: &str, provider: &str, reason: &str) {
        let Some(h) = &self.hygiene else { return };
        let r = retry("invalid token", &self.shared, || async {
            h.record_invalid(token, provider, reason)
                .await
                .map_err(Failure::from_hygiene)
        })
        .await;
        if let Err(e) = r {
            tracing::error!(error = %e, "an invalid token could not be recorded");
        }
    }

    async fn halt(&self, campaign_id: &str, reason: &str) {
        let r = retry("campaign halt", &self.shared, || async {
            crate::store::campaigns::halt(&self.pool, campaign_id, reason)
                .await
                .map(|_| ())
                .map_err(Failure::from_store)
        })
        .await;
        if let Err(e) = r {
            // The worker keeps it halted either way; only the API will not say so.
            tracing::error!(error = %e, campaign = campaign_id, "a campaign's halt could not be recorded");
        }
    }

    async fn app_halt(
        &self,
        app_id: &str,
        kind: crate::provider::ProviderKind,
        fingerprint: &str,
        reason: &str,
    ) {
        let Some(kind) = crate::apps::AppKind::of(kind) else {
            return;
        };
        let halted = std::sync::atomic::AtomicBool::new(false);
        let r = retry("app halt", &self.shared, || async {
            let done =
                crate::apps::store::halt_refused(&self.pool, app_id, kind, fingerprint, reason)
                    .await
                    .map_err(|e| Failure::from_store(crate::store::StoreError::from(e)))?;
            halted.store(done, std::sync::atomic::Ordering::Relaxed);
            Ok(())
        })
        .await;
        match r {
            Ok(()) if !halted.into_inner() => {
                tracing::info!(app = app_id, kind = %kind, "app halt not recorded: its credentials changed since");
            }
            Ok(()) => {}
            Err(e) => {
                // This worker keeps the slot closed; the router opens it on the next change.
                tracing::error!(error = %e, app = app_id, "an app's halt could not be recorded");
            }
        }
    }

    async fn committed(&self, marks: &[(i32, i64)]) {
        let r = retry("committed offsets", &self.shared, || async {
            crate::store::offsets::record_committed(&self.pool, &self.topic, marks)
                .await
                .map_err(Failure::from_store)
        })
        .await;
        if let Err(e) = r {
            tracing::warn!(error = %e, "committed offsets not recorded; progress behind them is kept longer");
        }
    }
}

fn count_letters<'a>(letters: impl IntoIterator<Item = &'a Letter>) {
    for l in letters {
        metrics::counter!("dead_letters_total", "kind" => l.kind.as_str()).increment(1);
    }
}

/// A failed write: whether it can pass later, and what it said.
struct Failure {
    transient: bool,
    message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl Failure {
    fn from_store(e: crate::store::StoreError) -> Self {
        Self {
            transient: e.is_transient(),
            message: e.to_string(),
        }
    }

    fn timed_out(limit: std::time::Duration) -> Self {
        Self {
            transient: true,
            message: format!(
                "no answer within {} ms (worker.write_timeout_ms)",
                limit.as_millis()
            ),
        }
    }

    fn from_hygiene(e: crate::hygiene::HygieneError) -> Self {
        let transient = match &e {
            crate::hygiene::HygieneError::Database(db) => crate::store::sqlx_is_transient(db),
            _ => false,
        };
        Self {
            transient,
            message: e.to_string(),
        }
    }
}

/// Runs `f` until it succeeds or fails for good; the stage's flag says when it waits.
/// An attempt past `write_timeout` counts as a lost connection: it is dropped (the pool
/// tests a connection given back mid-query before reusing it, so a wedged one never
/// serves another write) and tried again.
async fn retry<F, Fut>(what: &str, shared: &Shared, mut f: F) -> Result<(), Failure>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<(), Failure>>,
{
    let limit = shared.write_timeout;
    let attempt = || {
        let write = f();
        async move {
            tokio::time::timeout(limit, write)
                .await
                .unwrap_or_else(|_| Err(Failure::timed_out(limit)))
        }
    };
    super::retry::until_settled(
        what,
        &shared.writing_down,
        |e: &Failure| e.transient,
        attempt,
    )
    .await
}

#[cfg(test)]
impl Outcomes {
    /// A queue with no writer: tests read it and say what is written.
    pub(crate) fn for_test(capacity: usize) -> (Outcomes, mpsc::Receiver<(u64, Record)>) {
        let (tx, rx) = mpsc::channel(capacity);
        let shared = Arc::new(Shared {
            send: Mutex::new(()),
            next_seq: AtomicU64::new(0),
            durable: AtomicU64::new(0),
            writing_down: AtomicBool::new(false),
            write_timeout: OutcomesConfig::default().write_timeout,
        });
        (Outcomes { tx, shared }, rx)
    }

    /// Every record below `seq` is written.
    pub(crate) fn written_below(&self, seq: u64) {
        self.shared.durable.store(seq, Ordering::Release);
    }
}
