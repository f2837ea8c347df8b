//! The Kafka consumer: a consumer-group member on its own thread.
//!
//! It reads jobs, dead-letters bad ones, looks up each job's stored progress, and hands
//! the rest to the scheduler. It owns the [`OffsetTracker`]: a job's offset counts as
//! finished only when the scheduler reports every device finished *and* the flusher
//! has made that progress durable, so a committed offset never covers unflushed counts.
//! Offsets are stored and committed on a timer, on revocation and at shutdown.
//!
//! Backpressure, per campaign first: each campaign keeps about `lookahead` of sends in
//! memory (see [`Backlog`]); its later jobs are parked, as raw messages while
//! `max_parked_bytes` allows and as offsets re-read by the [`Refetcher`] beyond it, and
//! handed over when the campaign runs low, so a slow campaign's backlog waits without
//! blocking the campaigns behind it in the same partition. `max_buffered_jobs` /
//! `max_buffered_devices` bound what all campaigns hold in memory (beyond it, jobs are
//! parked too), and a partition whose parked jobs exceed its share of `max_parked_jobs`
//! is paused until they fall below half.
//!
//! A job's stored-progress and invalid-token lookups run as tasks on the runtime while
//! the thread reads on; jobs reach the scheduler in arrival order once theirs are back
//! (see [`Pending`]), so a database round trip per job does not cap consumption.
//!
//! It runs on a plain thread so that the rebalance callback may block (bounded) while
//! the scheduler drains the revoked partitions' in-flight sends.

use super::backlog::{Backlog, JobRef};
use super::offsets::OffsetTracker;
use super::refetch::Refetcher;
use super::scheduler::{CampaignSettings, Control, Event, IncomingJob, SchedulerStats};
use crate::capping::shared::SharedCap;
use crate::config::KafkaSettings;
use crate::hygiene::TokenHygiene;
use crate::job::{self, Job};
use crate::limiter::Rate;
use crate::shutdown::Shutdown;
use crate::stats::JobProgressHandle;
use crate::store::campaigns::{self, CampaignDefaults, CampaignStatus};
use crate::store::dead_letters::{self, DeadLetter};
use crate::store::{progress, DeadLetterKind};
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::message::{BorrowedMessage, Headers};
use rdkafka::{ClientContext, Message, Offset, TopicPartitionList};
use sqlx::PgPool;
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tracing::Instrument;

/// Gauges the consumer publishes (for metrics and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    pub buffered_jobs: usize,
    pub buffered_devices: usize,
    /// Jobs left in Kafka behind their campaign's lookahead, to be re-read.
    pub parked_jobs: usize,
    pub paused_partitions: Vec<i32>,
    pub jobs_received: u64,
    pub dead_letters: u64,
    pub commits: u64,
}

/// Flushes stats and progress now (the flusher's `flush_now`), for revocation and shutdown.
pub type FlushNow = Arc<dyn Fn() -> futures::future::BoxFuture<'static, ()> + Send + Sync>;

/// What the consumer needs.
pub struct ConsumerParams {
    pub kafka: KafkaSettings,
    pub bootstrap: String,
    pub max_buffered_jobs: usize,
    pub max_buffered_devices: usize,
    /// Sends per campaign held in memory ahead of the scheduler.
    pub lookahead: Duration,
    pub max_parked_jobs: usize,
    /// Raw bytes of parked jobs kept in memory; beyond, parked jobs are re-read.
    pub max_parked_bytes: usize,
    /// The scheduler's snapshots: live rates, for the lookahead.
    pub live: tokio::sync::watch::Receiver<SchedulerStats>,
    pub drain_timeout: Duration,
    pub defaults: CampaignDefaults,
    pub pool: PgPool,
    pub control: mpsc::Sender<Control>,
    pub events: std::sync::mpsc::Receiver<Event>,
    pub flush_now: FlushNow,
    pub stats: tokio::sync::watch::Sender<ConsumerStats>,
    pub runtime: Handle,
    /// Token hygiene (skip tokens recorded invalid, record 410s), when enabled.
    pub hygiene: Option<Arc<TokenHygiene>>,
    /// How often the hygiene filter re-reads rows other workers added.
    pub hygiene_reload: Duration,
    /// The frequency cap shared through Redis (`capping.scope = "redis"`): decided per
    /// job with its lookups; reservations of failed sends released.
    pub shared_cap: Option<SharedCap>,
}

/// Lookups in flight at most: enough to cover a database round trip at the broker's
/// read rate (about 1,000 jobs/s × 1 ms), small enough that a slow database soon holds
/// consumption back instead of piling jobs up.
const MAX_PENDING: usize = 32;

/// A job accepted for the scheduler whose lookups are still running.
struct Pending {
    job: Arc<Job>,
    settings: CampaignSettings,
    partition: i32,
    offset: i64,
    dispatched: Arc<AtomicU32>,
    lookups: tokio::task::JoinHandle<Lookups>,
}

/// What a job's lookups found.
#[derive(Debug, Default)]
struct Lookups {
    /// Devices already done (stored progress).
    already_done: u32,
    /// Devices whose tokens are recorded invalid.
    invalid: Vec<u32>,
    /// Devices at the shared frequency cap.
    capped: Vec<u32>,
}

#[derive(Default)]
struct PartitionLoad {
    jobs: usize,
    devices: usize,
    paused: bool,
}

/// State shared by the poll loop and the rebalance callback (both on the consumer
/// thread; the mutex is never contended).
struct State {
    topic: String,
    tracker: OffsetTracker,
    load: HashMap<i32, PartitionLoad>,
    /// The partitions assigned to this member, kept from the rebalance callbacks: asking
    /// librdkafka (`assignment()`) is a round trip to its main thread, too slow per message.
    assigned: std::collections::BTreeSet<i32>,
    /// Finished jobs whose progress is not durable yet.
    finishing: Vec<(i32, i64, JobProgressHandle)>,
    events: std::sync::mpsc::Receiver<Event>,
    scheduler_gone: bool,
    pool: PgPool,
    runtime: Handle,
    stats: ConsumerStats,
    hygiene: Option<Arc<TokenHygiene>>,
    shared_cap: Option<SharedCap>,
    backlog: Backlog,
    /// Jobs waiting for their lookups, in arrival order.
    pending: VecDeque<Pending>,
}

impl State {
    /// Applies scheduler events: finished jobs wait for durability, dead letters are written.
    fn drain_events(&mut self) {
        loop {
            match self.events.try_recv() {
                Ok(Event::JobFinished {
                    partition,
                    offset,
                    devices,
                    progress,
                }) => {
                    self.backlog.finished(partition, offset);
                    // Its memory is freed now; only its offset waits for durability.
                    // Counting it until the next flush would cap throughput at the
                    // buffer bound per flush interval.
                    let l = self.load.entry(partition).or_default();
                    l.jobs = l.jobs.saturating_sub(1);
                    l.devices = l.devices.saturating_sub(devices as usize);
                    self.finishing.push((partition, offset, progress));
                }
                Ok(Event::DeadLetter {
                    campaign_id,
                    job_id,
                    partition,
                    offset,
                    device,
                    device_token,
                    reason,
                    kind,
                }) => {
                    if let Some(cap) = &self.shared_cap {
                        cap.release(&campaign_id, &job_id, device, &device_token);
                    }
                    let letter = DeadLetter {
                        kind,
                        topic: &self.topic,
                        partition,
                        kafka_offset: offset,
                        campaign_id: Some(&campaign_id),
                        job_id: Some(&job_id),
                        device_token: Some(&device_token),
                        reason: &reason,
                        raw: &[],
                    };
                    write_dead_letter(&self.pool, &self.runtime, &letter);
                    self.stats.dead_letters += 1;
                    metrics::counter!("dead_letters_total", "kind" => kind.as_str()).increment(1);
                }
                Ok(Event::InvalidToken { token, reason }) => {
                    if let Some(h) = &self.hygiene {
                        record_invalid(h, &self.runtime, &token, &reason);
                    }
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.scheduler_gone = true;
                    break;
                }
            }
        }
        let mut i = 0;
        while i < self.finishing.len() {
            if self.finishing[i].2.is_durably_complete() {
                let (p, o, _) = self.finishing.swap_remove(i);
                self.tracker.finished(p, o);
            } else {
                i += 1;
            }
        }
    }

    fn commit(&mut self, consumer: &BaseConsumer<Ctx>, mode: CommitMode, all: bool) {
        let marks = if all {
            self.tracker.watermarks()
        } else {
            self.tracker.take_new_watermarks()
        };
        if marks.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &marks {
            if tpl
                .add_partition_offset(&self.topic, *p, Offset::Offset(*o))
                .is_err()
            {
                continue;
            }
        }
        match consumer.commit(&tpl, mode) {
            Ok(()) => self.stats.commits += 1,
            Err(e) => tracing::warn!(error = %e, "offset commit failed; will retry"),
        }
    }
}

/// Writes a dead letter, retrying until it is stored: a dead letter is never dropped.
fn write_dead_letter(pool: &PgPool, rt: &Handle, letter: &DeadLetter<'_>) {
    let mut backoff = Duration::from_millis(100);
    let mut logged = false;
    loop {
        match rt.block_on(dead_letters::insert(pool, letter)) {
            Ok(_) => {
                if logged {
                    tracing::info!("dead letters are being written again");
                }
                return;
            }
            Err(e) => {
                if !logged {
                    tracing::warn!(error = %e, "cannot write a dead letter; retrying (consumption waits)");
                    logged = true;
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Records a token as invalid, retrying until it is stored: like a dead letter, it is
/// never dropped (consumption waits).
fn record_invalid(hygiene: &TokenHygiene, rt: &Handle, token: &str, reason: &str) {
    let mut backoff = Duration::from_millis(100);
    let mut logged = false;
    loop {
        match rt.block_on(hygiene.record_invalid(token, reason)) {
            Ok(()) => return,
            Err(e) => {
                if !logged {
                    tracing::warn!(error = %e, "cannot record an invalid token; retrying (consumption waits)");
                    logged = true;
                }
                std::thread::sleep(backoff);
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// The rebalance hooks.
struct Ctx {
    state: Arc<Mutex<State>>,
    control: mpsc::Sender<Control>,
    drain_timeout: Duration,
    flush_now: FlushNow,
}

impl ClientContext for Ctx {
    /// librdkafka's statistics (every `statistics.interval.ms`): the consumer lag per partition.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let Ok(state) = self.state.lock() else { return };
        if let Some(topic) = statistics.topics.get(&state.topic) {
            for (p, part) in &topic.partitions {
                if *p >= 0 && part.consumer_lag >= 0 {
                    metrics::gauge!("consumer_lag", "partition" => p.to_string())
                        .set(part.consumer_lag as f64);
                }
            }
        }
    }
}

impl ConsumerContext for Ctx {
    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        tracing::info!(?partitions, "partitions revoked; draining them");
        // Not handed over yet: their next owner reads them again.
        if let Ok(mut s) = self.state.lock() {
            s.pending.retain(|p| {
                let keep = !partitions.contains(&p.partition);
                if !keep {
                    p.lookups.abort();
                }
                keep
            });
        }
        let state = self.state.clone();
        let rt = state.lock().map(|s| s.runtime.clone());
        let Ok(rt) = rt else { return };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let sent = self
            .control
            .blocking_send(Control::Revoke {
                partitions: partitions.clone(),
                done: done_tx,
            })
            .is_ok();
        if sent {
            let waited = rt.block_on(tokio::time::timeout(self.drain_timeout, done_rx));
            if waited.is_err() {
                tracing::warn!("revoked partitions still had sends in flight at the drain timeout");
            }
        }
        // Make progress durable, so the finished jobs can be committed now.
        rt.block_on(tokio::time::timeout(self.drain_timeout, (self.flush_now)()))
            .ok();
        let Ok(mut s) = state.lock() else { return };
        s.drain_events();
        s.commit(consumer, CommitMode::Sync, true);
        for p in &partitions {
            s.tracker.forget(*p);
            s.load.remove(p);
            s.assigned.remove(p);
        }
        s.backlog.forget_partitions(&partitions);
        s.finishing.retain(|(p, ..)| !partitions.contains(p));
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            tracing::info!(?partitions, "partitions assigned");
            if let Ok(mut s) = self.state.lock() {
                s.assigned.extend(partitions.iter().copied());
            }
            // librdkafka keeps a partition's pause across revoke and re-assign, but the
            // revoke forgot our paused flag: without this a partition paused before a
            // rebalance would never be read again.
            if let Err(e) = consumer.resume(tpl) {
                tracing::warn!(error = %e, "cannot resume the assigned partitions");
            }
        }
    }
}

/// Starts the consumer thread. It returns when shut down and everything is committed.
pub fn spawn(
    params: ConsumerParams,
    mut shutdown: Shutdown,
) -> Result<std::thread::JoinHandle<()>, crate::broker::BrokerError> {
    let ConsumerParams {
        kafka,
        bootstrap,
        max_buffered_jobs,
        max_buffered_devices,
        lookahead,
        max_parked_jobs,
        max_parked_bytes,
        live,
        drain_timeout,
        defaults,
        pool,
        control,
        events,
        flush_now,
        stats,
        runtime,
        hygiene,
        hygiene_reload,
        shared_cap,
    } = params;
    let state = Arc::new(Mutex::new(State {
        topic: kafka.topic.clone(),
        tracker: OffsetTracker::default(),
        load: HashMap::new(),
        assigned: Default::default(),
        finishing: Vec::new(),
        events,
        scheduler_gone: false,
        pool: pool.clone(),
        runtime: runtime.clone(),
        stats: ConsumerStats::default(),
        hygiene: hygiene.clone(),
        shared_cap: shared_cap.clone(),
        backlog: Backlog::new(lookahead),
        pending: VecDeque::new(),
    }));
    let flush_for_loop = flush_now.clone();
    let ctx = Ctx {
        state: state.clone(),
        control: control.clone(),
        drain_timeout,
        flush_now,
    };
    let mut config = crate::broker::consumer_config(&kafka, &bootstrap);
    // Keep librdkafka's prefetch small: backpressure is ours, not its queue's.
    config.set("queued.max.messages.kbytes", "8192");
    config.set("statistics.interval.ms", "5000");
    let consumer: BaseConsumer<Ctx> = config.create_with_context(ctx)?;
    consumer.subscribe(&[&kafka.topic])?;
    let refetcher = Refetcher::new(&kafka, &bootstrap)?;
    let commit_every = Duration::from_millis(kafka.commit_interval_ms);
    let thread = std::thread::Builder::new()
        .name("kafka-consumer".into())
        .spawn(move || {
            // Timers built on this thread (timeouts in block_on) need the runtime's context.
            let _context = runtime.enter();
            let runtime = runtime.clone();
            let mut loop_state = Loop {
                consumer,
                state,
                control,
                pool,
                runtime,
                defaults,
                topic: kafka.topic.clone(),
                known: Default::default(),
                max_jobs: max_buffered_jobs,
                max_devices: max_buffered_devices,
                max_parked: max_parked_jobs,
                max_parked_bytes,
                refetcher,
                live,
                unpark_after: Instant::now(),
                stats,
                db_down: Default::default(),
                flush_now: flush_for_loop,
                hygiene,
                shared_cap,
            };
            let mut last_commit = Instant::now();
            let mut last_reload = Instant::now();
            while !shutdown.poll_now() {
                loop_state.step();
                if last_reload.elapsed() >= hygiene_reload {
                    loop_state.reload_hygiene();
                    last_reload = Instant::now();
                }
                if last_commit.elapsed() >= commit_every {
                    loop_state.with_state(|s, c| s.commit(c, CommitMode::Async, false));
                    last_commit = Instant::now();
                }
            }
            loop_state.finish(drain_timeout);
        })
        .map_err(|e| crate::broker::BrokerError::Embedded(e.to_string()))?;
    Ok(thread)
}

struct Loop {
    consumer: BaseConsumer<Ctx>,
    state: Arc<Mutex<State>>,
    control: mpsc::Sender<Control>,
    pool: PgPool,
    runtime: Handle,
    defaults: CampaignDefaults,
    topic: String,
    known: std::cell::RefCell<HashMap<String, CampaignSettings>>,
    max_jobs: usize,
    max_devices: usize,
    max_parked: usize,
    max_parked_bytes: usize,
    refetcher: Refetcher,
    live: tokio::sync::watch::Receiver<SchedulerStats>,
    /// No re-read before this instant (backoff after a failed one).
    unpark_after: Instant,
    stats: tokio::sync::watch::Sender<ConsumerStats>,
    db_down: Arc<AtomicBool>,
    flush_now: FlushNow,
    hygiene: Option<Arc<TokenHygiene>>,
    shared_cap: Option<SharedCap>,
}

impl Loop {
    /// Adds the invalid tokens other workers recorded since the last reload.
    fn reload_hygiene(&self) {
        if let Some(h) = &self.hygiene {
            if let Err(e) = self.runtime.block_on(h.reload()) {
                tracing::warn!(error = %e, "invalid-token reload failed; retried at the next interval");
            }
        }
    }

    fn with_state<R>(&self, f: impl FnOnce(&mut State, &BaseConsumer<Ctx>) -> R) -> R {
        let mut s = self.state.lock().unwrap_or_else(|p| p.into_inner());
        f(&mut s, &self.consumer)
    }

    /// One iteration: apply events, re-read parked jobs that are due, adjust pauses,
    /// read at most one new message.
    fn step(&mut self) {
        self.with_state(|s, _| s.drain_events());
        self.follow_live_rates();
        self.unpark_due();
        self.adjust_pauses();
        self.publish_stats();
        self.forward_looked_up(false);
        // Lookups come back within milliseconds: do not sleep 50 ms on them.
        let wait = if self.with_state(|s, _| s.pending.is_empty()) {
            Duration::from_millis(50)
        } else {
            Duration::from_millis(1)
        };
        let polled = self.consumer.poll(wait);
        match polled {
            None => {}
            Some(Err(e)) => {
                tracing::warn!(error = %e, "kafka poll error (the client reconnects by itself)");
            }
            Some(Ok(msg)) => {
                let partition = msg.partition();
                let offset = msg.offset();
                self.handle(&msg, partition, offset);
            }
        }
    }

    /// Rate changes (API, database) move each campaign's lookahead.
    fn follow_live_rates(&mut self) {
        if !self.live.has_changed().unwrap_or(false) {
            return;
        }
        let live = self.live.borrow_and_update().campaigns.clone();
        let mut known = self.known.borrow_mut();
        self.with_state(|s, _| {
            for c in live.iter() {
                s.backlog.set_rate(&c.id, c.rate);
                if let (Some(k), Ok(rate)) = (known.get_mut(&*c.id), Rate::per_second(c.rate)) {
                    k.rate = rate;
                }
            }
        });
    }

    /// Whether memory has room for one more job under the worker-wide bounds.
    fn has_room(&self) -> bool {
        self.with_state(|s, _| {
            let jobs: usize = s.load.values().map(|l| l.jobs).sum();
            let devices: usize = s.load.values().map(|l| l.devices).sum();
            jobs < self.max_jobs && devices < self.max_devices
        })
    }

    /// Hands over parked jobs of campaigns running low, most starved first: from memory,
    /// or re-read from Kafka.
    fn unpark_due(&mut self) {
        // Bounded per step, in count and in time, so that the loop still polls often
        // (the group's poll interval) and serves new messages and rebalances.
        const MAX_PER_STEP: usize = 64;
        const MAX_STEP_TIME: Duration = Duration::from_millis(200);
        if Instant::now() < self.unpark_after {
            return;
        }
        let started = Instant::now();
        for _ in 0..MAX_PER_STEP {
            if started.elapsed() > MAX_STEP_TIME {
                return;
            }
            let room = self.has_room();
            let Some((campaign, parked)) = self.with_state(|s, _| s.backlog.next_to_unpark(room))
            else {
                return;
            };
            let at = parked.at;
            let fetched = match parked.message {
                Some(m) => Ok(m),
                None => self.refetcher.fetch(&self.topic, at),
            };
            match fetched {
                Ok(msg) => {
                    let span = tracing::info_span!(
                        "job",
                        partition = at.partition,
                        offset = at.offset,
                        refetched = true
                    );
                    let _g = span.enter();
                    if let Some(job) = self.decode_or_dead_letter(&msg, at.partition, at.offset) {
                        let settings = self.campaign_settings(&job);
                        self.hand_over(job, settings, at.partition, at.offset);
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, partition = at.partition, offset = at.offset, "cannot re-read a parked job; retrying in 1 s");
                    self.with_state(|s, _| s.backlog.unpark_failed(&campaign, at));
                    self.unpark_after = Instant::now() + Duration::from_secs(1);
                    return;
                }
            }
        }
    }

    /// Pauses a partition whose parked jobs exceed its share of `max_parked_jobs`, or,
    /// once parked messages fill `max_parked_bytes`, any partition where no campaign
    /// starves: reading ahead is then driven by need, and parked jobs stay in memory
    /// instead of being re-read from Kafka one by one.
    fn adjust_pauses(&mut self) {
        let n = self.with_state(|s, _| s.load.len().max(s.assigned.len()).max(1));
        let share = (self.max_parked / n).max(1);
        let max_bytes = self.max_parked_bytes;
        let topic = self.topic.clone();
        self.with_state(|s, c| {
            let evicted = s.backlog.evict_hog(max_bytes);
            if evicted > 0 {
                tracing::info!(evicted, "one campaign filled the parked-bytes budget; its newest parked jobs will be re-read");
            }
            let bytes = s.backlog.parked_bytes();
            for (p, l) in s.load.iter_mut() {
                let parked = s.backlog.parked_in(*p);
                let starving = s.backlog.starving_in(*p);
                // Built only to pause or resume: a partition list is two C allocations.
                let tpl = || {
                    let mut tpl = TopicPartitionList::new();
                    tpl.add_partition(&topic, *p);
                    tpl
                };
                let too_many = parked >= share;
                // A zero budget keeps nothing in memory: only offsets, no memory pause.
                let memory_full = max_bytes > 0 && bytes >= max_bytes && !starving;
                if (too_many || memory_full) && !l.paused {
                    if c.pause(&tpl()).is_ok() {
                        l.paused = true;
                        tracing::debug!(
                            partition = p,
                            parked,
                            parked_bytes = bytes,
                            "partition paused: enough parked ahead"
                        );
                    }
                } else if l.paused
                    && parked <= share / 2
                    && (bytes <= max_bytes / 4 * 3 || starving)
                    && c.resume(&tpl()).is_ok()
                {
                    l.paused = false;
                    tracing::debug!(partition = p, "partition resumed");
                }
            }
        });
    }

    fn publish_stats(&self) {
        let snapshot = self.with_state(|s, _| {
            let mut st = s.stats.clone();
            st.buffered_jobs = s.load.values().map(|l| l.jobs).sum();
            st.buffered_devices = s.load.values().map(|l| l.devices).sum();
            st.parked_jobs = s.backlog.parked_total();
            st.paused_partitions = s
                .load
                .iter()
                .filter(|(_, l)| l.paused)
                .map(|(p, _)| *p)
                .collect();
            st.paused_partitions.sort_unstable();
            st
        });
        self.stats.send_if_modified(|old| {
            if *old != snapshot {
                *old = snapshot;
                true
            } else {
                false
            }
        });
    }

    /// A new message: dead-letter it, hold it, or park it behind its campaign's lookahead.
    fn handle(&self, msg: &BorrowedMessage<'_>, partition: i32, offset: i64) {
        let span = tracing::info_span!("job", partition, offset);
        let _g = span.enter();
        self.with_state(|s, _| {
            s.tracker.started(partition, offset);
            s.stats.jobs_received += 1;
            s.load.entry(partition).or_default();
        });
        let Some(job) = self.decode_or_dead_letter(msg, partition, offset) else {
            return;
        };
        let settings = self.campaign_settings(&job);
        let room = self.has_room();
        let at = JobRef { partition, offset };
        let max_bytes = self.max_parked_bytes;
        let parked = self.with_state(|s, _| {
            if s.backlog.wants(&settings.id) && (room || s.backlog.guaranteed(&settings.id)) {
                false
            } else {
                // Keep the raw message while memory allows: no re-read later. Partitions
                // pause at the budget unless a campaign starves there (see adjust_pauses);
                // reading on for it may keep up to twice the budget.
                let size = msg.payload_len() + msg.key_len();
                let keep = (s.backlog.parked_bytes() + size <= 2 * max_bytes).then(|| msg.detach());
                s.backlog
                    .park(&settings.id, settings.rate.as_f64(), at, keep);
                true
            }
        });
        if parked {
            tracing::debug!(campaign = %settings.id, "job parked behind its campaign's lookahead");
        } else {
            self.hand_over(job, settings, partition, offset);
        }
    }

    /// Decodes and checks a job; a bad one is dead-lettered (and finished) here.
    fn decode_or_dead_letter<M: Message>(
        &self,
        msg: &M,
        partition: i32,
        offset: i64,
    ) -> Option<Job> {
        let payload = msg.payload().unwrap_or(&[]);
        let decoded = job::decode(payload)
            .map_err(|e| (e.kind(), e.to_string()))
            .and_then(|j| match header_problem(msg) {
                Some(reason) => Err((DeadLetterKind::InvalidJob, reason)),
                None => Ok(j),
            });
        match decoded {
            Ok(j) => Some(j),
            Err((kind, reason)) => {
                tracing::warn!(%reason, kind = kind.as_str(), "job dead-lettered");
                let key_campaign = msg.key().and_then(|k| std::str::from_utf8(k).ok());
                let letter = DeadLetter {
                    kind,
                    topic: &self.topic,
                    partition,
                    kafka_offset: offset,
                    campaign_id: key_campaign.filter(|k| campaigns::validate_id(k).is_ok()),
                    job_id: None,
                    device_token: None,
                    reason: &reason,
                    raw: payload,
                };
                write_dead_letter(&self.pool, &self.runtime, &letter);
                metrics::counter!("dead_letters_total", "kind" => kind.as_str()).increment(1);
                self.with_state(|s, _| {
                    s.stats.dead_letters += 1;
                    s.tracker.finished(partition, offset);
                });
                None
            }
        }
    }

    /// Accepts a job for the scheduler: it counts against the bounds now, and reaches the
    /// scheduler once its stored progress and invalid tokens are looked up.
    fn hand_over(&self, job: Job, settings: CampaignSettings, partition: i32, offset: i64) {
        let devices = job.devices.len();
        let dispatched = Arc::new(AtomicU32::new(0));
        self.with_state(|s, _| {
            let l = s.load.entry(partition).or_default();
            l.jobs += 1;
            l.devices += devices;
            s.backlog.hold(
                &settings.id,
                settings.rate.as_f64(),
                JobRef { partition, offset },
                devices as u32,
                dispatched.clone(),
            );
        });
        let job = Arc::new(job);
        let lookups = self.runtime.spawn(
            lookups(
                self.pool.clone(),
                self.hygiene.clone(),
                self.shared_cap.clone(),
                job.clone(),
                self.db_down.clone(),
            )
            .instrument(tracing::Span::current()),
        );
        let full = self.with_state(|s, _| {
            s.pending.push_back(Pending {
                job,
                settings,
                partition,
                offset,
                dispatched,
                lookups,
            });
            s.pending.len() >= MAX_PENDING
        });
        if full {
            self.forward_looked_up(true);
        }
    }

    /// Hands the jobs whose lookups are back to the scheduler, oldest first; with `wait`,
    /// waits for the oldest one first.
    fn forward_looked_up(&self, mut wait: bool) {
        loop {
            let next = self.with_state(|s, _| {
                let ready = s
                    .pending
                    .front()
                    .is_some_and(|p| wait || p.lookups.is_finished());
                if ready {
                    s.pending.pop_front()
                } else {
                    None
                }
            });
            let Some(p) = next else { return };
            wait = false;
            let found = match self.runtime.block_on(p.lookups) {
                Ok(found) => found,
                // Only a panic gets here (revoked jobs are removed before aborting):
                // sending in full may duplicate, but loses nothing.
                Err(e) => {
                    tracing::error!(error = %e, job_id = %p.job.job_id, "job lookups failed; sending the job in full");
                    Lookups::default()
                }
            };
            let already_done = found.already_done;
            p.dispatched.store(already_done, Ordering::Relaxed);
            let incoming = IncomingJob {
                job: p.job,
                partition: p.partition,
                offset: p.offset,
                already_done,
                settings: p.settings,
                skip_invalid: found.invalid,
                skip_capped: found.capped,
                dispatched: p.dispatched,
            };
            // Blocks when the scheduler's queue is full: a natural brake on consumption.
            if self.control.blocking_send(Control::Job(incoming)).is_err() {
                tracing::warn!("scheduler is gone; job left for re-delivery");
            }
        }
    }

    /// The campaign's stored settings, creating the campaign on its first job.
    fn campaign_settings(&self, job: &Job) -> CampaignSettings {
        if let Some(s) = self.known.borrow().get(&job.campaign_id) {
            return s.clone();
        }
        let pool = self.pool.clone();
        let defaults = self.defaults;
        let stored = self.retry_db("campaign lookup", || {
            let pool = pool.clone();
            let id = job.campaign_id.clone();
            let (rate, alg) = (job.send_rate, job.algorithm);
            async move { campaigns::upsert_from_job(&pool, &id, rate, alg, &defaults).await }
        });
        let settings = CampaignSettings {
            id: Arc::from(stored.id.as_str()),
            rate: stored.rate().unwrap_or(defaults.send_rate),
            algorithm: stored.algorithm,
            burst: stored.burst,
            paused: stored.status == CampaignStatus::Paused,
            limiter_scope: stored.limiter_scope,
        };
        // Only the first job's lookup is cached; later changes arrive from the watcher.
        let mut known = self.known.borrow_mut();
        if known.len() > 100_000 {
            known.clear();
        }
        known.insert(job.campaign_id.clone(), settings.clone());
        settings
    }

    /// Runs a database call until it succeeds: the job waits, it is never dropped.
    fn retry_db<T, E, F, Fut>(&self, what: &str, mut f: F) -> T
    where
        E: std::fmt::Display,
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self.runtime.block_on(f()) {
                Ok(v) => {
                    if self.db_down.swap(false, Ordering::Relaxed) {
                        tracing::info!("database reachable again");
                    }
                    return v;
                }
                Err(e) => {
                    if !self.db_down.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %e, what, "database call failed; retrying with backoff");
                    }
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// After shutdown: wait for the scheduler to drain, then make the last commit.
    fn finish(self, drain_timeout: Duration) {
        let deadline = Instant::now() + drain_timeout + Duration::from_secs(5);
        // The scheduler drains its in-flight sends, then drops its event sender.
        while !self.with_state(|s, _| {
            s.drain_events();
            s.scheduler_gone
        }) && Instant::now() < deadline
        {
            std::thread::sleep(Duration::from_millis(20));
        }
        // Make the last progress durable so that the finished jobs can be committed.
        let _ = self.runtime.block_on(tokio::time::timeout(
            Duration::from_secs(10),
            (self.flush_now)(),
        ));
        self.with_state(|s, c| {
            s.drain_events();
            s.commit(c, CommitMode::Sync, true);
        });
        self.publish_stats();
        tracing::info!("consumer stopped; offsets committed");
    }
}

/// A job's lookups: how many devices its stored progress has done (0 for a job_id
/// stored by another campaign), which of its tokens are recorded invalid, and, with a
/// shared cap, which of the others are at the cap (the rest get a reservation).
/// Retried until the database and Redis answer: the job waits, it is never dropped.
async fn lookups(
    pool: PgPool,
    hygiene: Option<Arc<TokenHygiene>>,
    shared_cap: Option<SharedCap>,
    job: Arc<Job>,
    db_down: Arc<AtomicBool>,
) -> Lookups {
    let found = retry_async("progress lookup", &db_down, || {
        progress::lookup(&pool, &job.job_id)
    })
    .await;
    let already_done = match found {
        Some(p) if p.campaign_id == job.campaign_id => p.devices_done,
        Some(p) => {
            tracing::warn!(job_id = %job.job_id, stored_campaign = %p.campaign_id, "job_id reused by another campaign; sending it in full");
            0
        }
        None => 0,
    };
    let invalid = match &hygiene {
        Some(h) => {
            retry_async("invalid-token lookup", &db_down, || {
                h.invalid_among(&job.devices)
            })
            .await
        }
        None => Vec::new(),
    };
    let capped = match &shared_cap {
        Some(cap) => {
            cap.reserve(
                &job.campaign_id,
                &job.job_id,
                &job.devices,
                already_done,
                &invalid,
            )
            .await
        }
        None => Vec::new(),
    };
    Lookups {
        already_done,
        invalid,
        capped,
    }
}

/// Runs a database call until it succeeds, logging the first failure and the recovery.
async fn retry_async<'a, T, E, F, Fut>(what: &str, db_down: &AtomicBool, mut f: F) -> T
where
    E: std::fmt::Display,
    F: FnMut() -> Fut + 'a,
    Fut: std::future::Future<Output = Result<T, E>> + 'a,
{
    let mut backoff = Duration::from_millis(100);
    loop {
        match f().await {
            Ok(v) => {
                if db_down.swap(false, Ordering::Relaxed) {
                    tracing::info!("database reachable again");
                }
                return v;
            }
            Err(e) => {
                if !db_down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, what, "database call failed; retrying with backoff");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}

/// Headers must be UTF-8 text when present; anything else is refused with a reason.
fn header_problem<M: Message>(msg: &M) -> Option<String> {
    let headers = msg.headers()?;
    for h in headers.iter() {
        if let Some(v) = h.value {
            if std::str::from_utf8(v).is_err() {
                return Some(format!("header {:?} is not UTF-8 text", h.key));
            }
        }
    }
    None
}
