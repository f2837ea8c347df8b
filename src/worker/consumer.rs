//! The intake stage: a Kafka consumer-group member on its own thread.
//!
//! The thread only polls, decodes, commits and handles rebalances; it never waits on
//! PostgreSQL or Redis. A bad message's dead letter goes to the outcomes stage
//! ([`super::outcomes`]); a good job's lookups run as a task of the enrich stage
//! ([`super::enrich`]) and the job reaches the scheduler in arrival order once they are
//! back. When lookups pile up, the scheduler's queue is full, or the outcomes queue has
//! no room (a database outage), every partition is paused and the thread keeps polling,
//! so it never leaves its group because of a slow database.
//!
//! Backpressure, per campaign first: each campaign keeps about `lookahead` of sends in
//! memory (see [`Backlog`]); its later jobs are parked, as raw messages while
//! `max_parked_bytes` allows and as offsets re-read by the [`Refetcher`] beyond it, and
//! handed over when the campaign runs low, so a slow campaign's backlog waits without
//! blocking the campaigns behind it in the same partition. A parked offset that
//! retention deleted is dead-lettered (`expired_offset`); other failed re-reads back off
//! per campaign.
//!
//! It runs on a plain thread so that the rebalance callback may block (bounded) while
//! the scheduler drains the revoked partitions' in-flight sends.

mod parking;
mod undecodable;
mod windows;

pub use undecodable::HeldPartition;

use super::backlog::{Backlog, JobRef};
use super::enrich::{self, Enricher, Lookups};
use super::message::HeaderSource;
use super::outcomes::{Letter, Outcomes};
use super::rebalance::{Ctx, State};
use super::refetch::{RefetchError, Refetcher};
use super::scheduler::{CampaignSettings, Control, Event, IncomingJob, SchedulerStats};
use crate::config::KafkaSettings;
use crate::job::Job;
use crate::limiter::Rate;
use crate::store::campaigns::CampaignDefaults;
use crate::store::DeadLetterKind;
use futures::FutureExt;
use parking_lot::Mutex;
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer};
use rdkafka::{Message, TopicPartitionList};
use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::mpsc;
use tracing::Instrument;

/// Gauges the consumer publishes (for metrics and tests).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    pub buffered_jobs: usize,
    pub buffered_devices: usize,
    /// Jobs left in Kafka behind their campaign's lookahead, to be re-read (those
    /// waiting for a window included).
    pub parked_jobs: usize,
    /// Parked jobs waiting for their zone's local-time window to open.
    pub window_jobs: usize,
    /// The zones of each campaign's jobs waiting for a window (campaigns with none are
    /// left out).
    pub window_zones: super::backlog::WindowZones,
    pub paused_partitions: Vec<i32>,
    pub jobs_received: u64,
    /// Parked jobs read from Kafka again: their message was not kept in memory.
    pub parked_rereads: u64,
    pub dead_letters: u64,
    pub commits: u64,
    /// Whether every partition is paused because a later stage has no room.
    pub held_back: bool,
    /// Devices in each campaign's parked jobs (campaigns with none are left out).
    pub parked_devices: Arc<Vec<(Arc<str>, u64)>>,
    /// Partitions held at a batch that cannot be decoded ([`undecodable`]).
    pub undecodable: Arc<Vec<HeldPartition>>,
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
    /// The campaign watcher's snapshots: local-time rules, for jobs waiting for a window.
    pub campaigns: tokio::sync::watch::Receiver<crate::store::listen::CampaignSnapshot>,
    pub drain_timeout: Duration,
    pub control: mpsc::Sender<Control>,
    pub events: std::sync::mpsc::Receiver<Event>,
    pub flush_now: FlushNow,
    pub stats: tokio::sync::watch::Sender<ConsumerStats>,
    pub runtime: Handle,
    /// The job lookups (campaign settings, progress, hygiene, shared cap).
    pub enricher: Enricher,
    pub outcomes: Outcomes,
    /// How long a campaign's cached settings are used before they are read again.
    pub settings_ttl: Duration,
    /// Set to false when the thread ends, however it ends.
    pub running: tokio::sync::watch::Sender<bool>,
    /// The worker's providers: a job's provider name and that provider's own rules are
    /// checked at intake.
    pub providers: Arc<crate::provider::Providers>,
}

/// Lookups in flight at most: enough to cover a database round trip at the broker's
/// read rate (about 1,000 jobs/s × 1 ms), small enough that a slow database soon holds
/// consumption back instead of piling jobs up.
const MAX_PENDING: usize = 32;

/// How long a later stage may have no room before every partition is paused. Longer
/// than a lookup's round trip or a busy scheduler's turn (pausing drops librdkafka's
/// prefetched messages, so pausing on every short wait would cost throughput), much
/// shorter than the group's poll interval.
const PRESSURE_GRACE: Duration = Duration::from_millis(200);

/// How long the parking and pause decisions and the published stats may wait: a busy
/// loop steps every millisecond (at a start, once per message read); a campaign's
/// lookahead is seconds of its sends, so 5 ms late to unpark or resume costs it nothing
/// (the search for starving campaigns keeps a slower pace, [`parking::STARVING_EVERY`]).
/// After a read the partition read is judged at the next step
/// ([`Loop::pause_after_read`]), so it is paused before its next message.
const BOOKKEEPING_EVERY: Duration = Duration::from_millis(5);

/// How often the commit timer commits every watermark, moved or not (else only the
/// moved ones): a failed commit whose failure was never reported is retried within this.
const RECOMMIT_EVERY: Duration = Duration::from_secs(5);

/// How long a failed re-read of a parked job waits before that campaign tries again.
const REFETCH_BACKOFF: Duration = Duration::from_secs(1);

/// A job accepted for the scheduler whose lookups are still running.
pub(super) struct Pending {
    pub job: Arc<Job>,
    pub settings: CampaignSettings,
    pub partition: i32,
    pub offset: i64,
    pub dispatched: Arc<AtomicU32>,
    pub lookups: tokio::task::JoinHandle<Lookups>,
}

/// Flips the running flag when the thread ends, a panic included.
struct Running(tokio::sync::watch::Sender<bool>);

impl Drop for Running {
    fn drop(&mut self) {
        if std::thread::panicking() {
            tracing::error!("the Kafka consumer thread panicked");
        }
        let _ = self.0.send(false);
    }
}

/// Starts the consumer thread. It returns when `stop` is cancelled and everything is
/// committed.
pub fn spawn(
    params: ConsumerParams,
    stop: tokio_util::sync::CancellationToken,
) -> Result<std::thread::JoinHandle<()>, crate::broker::BrokerError> {
    let state = Arc::new(Mutex::new(State {
        topic: params.kafka.topic.clone(),
        tracker: Default::default(),
        load: HashMap::new(),
        assigned: Default::default(),
        finishing: Vec::new(),
        lettered: Vec::new(),
        held_letters: VecDeque::new(),
        events: params.events,
        scheduler_gone: false,
        runtime: params.runtime.clone(),
        stats: ConsumerStats::default(),
        backlog: Backlog::new(params.lookahead),
        pending: VecDeque::new(),
        ready: VecDeque::new(),
        outcomes: params.outcomes.clone(),
    }));
    let ctx = Ctx {
        state: state.clone(),
        control: params.control.clone(),
        drain_timeout: params.drain_timeout,
        flush_now: params.flush_now.clone(),
        outcomes: params.outcomes,
        protocol: Default::default(),
    };
    let kafka = params.kafka;
    let mut config = crate::broker::consumer_config(&kafka, &params.bootstrap);
    // Keep librdkafka's prefetch small: backpressure is ours, not its queue's.
    config.set("queued.max.messages.kbytes", "8192");
    config.set("statistics.interval.ms", "5000");
    let consumer: BaseConsumer<Ctx> = config.create_with_context(ctx)?;
    consumer.subscribe(&[&kafka.topic])?;
    let refetcher = Refetcher::new(&kafka, &params.bootstrap)?;
    let undecodable = undecodable::Undecodable::new(&kafka, &params.bootstrap);
    let commit_every = Duration::from_millis(kafka.commit_interval_ms);
    let drain_timeout = params.drain_timeout;
    let running = Running(params.running);
    let runtime = params.runtime;
    let mut intake = Loop {
        consumer,
        state,
        control: params.control,
        runtime: runtime.clone(),
        defaults: params.enricher.defaults,
        topic: kafka.topic.clone(),
        known: HashMap::new(),
        settings_ttl: params.settings_ttl,
        max_jobs: params.max_buffered_jobs,
        max_devices: params.max_buffered_devices,
        max_parked: params.max_parked_jobs,
        max_parked_bytes: params.max_parked_bytes,
        refetcher,
        undecodable,
        live: params.live,
        campaigns: params.campaigns,
        stats: params.stats,
        flush_now: params.flush_now,
        enricher: params.enricher,
        providers: params.providers,
        pressed_since: None,
        rates_seen: None,
        bookkeeping: (Instant::now(), None),
        starving: (None, Vec::new()),
        unparked_at: Instant::now(),
    };
    let thread = std::thread::Builder::new()
        .name("kafka-consumer".into())
        .spawn(move || {
            let _running = running;
            // Timers built on this thread (timeouts in block_on) need the runtime's context.
            let _context = runtime.enter();
            let mut last_commit = Instant::now();
            let mut last_full = Instant::now();
            while !stop.is_cancelled() {
                intake.step();
                if last_commit.elapsed() >= commit_every {
                    // Now and then every watermark again, moved or not: an async
                    // commit's failure may never be reported (its callback did not come
                    // in tests on tansu), and a failed one must still be retried.
                    let all = last_full.elapsed() >= RECOMMIT_EVERY;
                    if all {
                        last_full = Instant::now();
                    }
                    intake.with_state(|s, c| s.commit(c, CommitMode::Async, all));
                    last_commit = Instant::now();
                }
            }
            intake.finish(drain_timeout);
        })
        .map_err(|e| crate::broker::BrokerError::Embedded(e.to_string()))?;
    Ok(thread)
}

struct Loop {
    consumer: BaseConsumer<Ctx>,
    state: Arc<Mutex<State>>,
    control: mpsc::Sender<Control>,
    runtime: Handle,
    defaults: CampaignDefaults,
    topic: String,
    /// Campaign settings read from the store, and when.
    known: HashMap<Arc<str>, (CampaignSettings, Instant)>,
    settings_ttl: Duration,
    max_jobs: usize,
    max_devices: usize,
    max_parked: usize,
    max_parked_bytes: usize,
    refetcher: Refetcher,
    undecodable: undecodable::Undecodable,
    live: tokio::sync::watch::Receiver<SchedulerStats>,
    campaigns: tokio::sync::watch::Receiver<crate::store::listen::CampaignSnapshot>,
    stats: tokio::sync::watch::Sender<ConsumerStats>,
    flush_now: FlushNow,
    enricher: Enricher,
    providers: Arc<crate::provider::Providers>,
    /// Since when a later stage has had no room.
    pressed_since: Option<Instant>,
    /// The scheduler's `rate_changes` as of the last walk of its rates.
    rates_seen: Option<u64>,
    /// When the parking and pause decisions (and the published stats) last ran, and the
    /// partition of a message read since, whose pause is judged at the next step
    /// ([`BOOKKEEPING_EVERY`]).
    bookkeeping: (Instant, Option<i32>),
    /// When the partitions where a campaign starves were last searched (at most every
    /// [`parking::STARVING_EVERY`]; `None`: at the next pass above ¾ of the parked-bytes
    /// budget), and what was found.
    starving: (Option<Instant>, Vec<i32>),
    /// When parked jobs were last handed over (at least [`BOOKKEEPING_EVERY`] apart).
    unparked_at: Instant,
}

impl Loop {
    fn with_state<R>(&self, f: impl FnOnce(&mut State, &BaseConsumer<Ctx>) -> R) -> R {
        let mut s = self.state.lock();
        f(&mut s, &self.consumer)
    }

    /// One iteration: apply events, pass looked-up jobs on, re-read parked jobs that are
    /// due, adjust pauses, read at most one new message.
    fn step(&mut self) {
        self.with_state(|s, _| s.drain_events());
        self.follow_live_rates();
        self.forward_looked_up();
        let pressed = self.under_pressure();
        let now = Instant::now();
        self.pressed_since = pressed.then(|| self.pressed_since.unwrap_or(now));
        let hold = self
            .pressed_since
            .is_some_and(|t| now.duration_since(t) >= PRESSURE_GRACE);
        let (last, read) = self.bookkeeping;
        if hold || now.duration_since(last) >= BOOKKEEPING_EVERY {
            // A read never makes a campaign run low, so unparking keeps its own pace:
            // each try walks every campaign with parked jobs.
            let unpark_due = now.duration_since(self.unparked_at) >= BOOKKEEPING_EVERY;
            if !pressed && unpark_due {
                self.release_windows();
                self.unpark_due();
                self.unparked_at = now;
            }
            self.adjust_pauses(hold);
            if self.undecodable.active() {
                let assigned = self.with_state(|s, _| s.assigned.clone());
                self.undecodable.bookkeeping(&assigned);
            }
            self.publish_stats(hold);
            self.bookkeeping = (now, None);
        } else if let Some(partition) = read {
            self.pause_after_read(partition);
            self.bookkeeping.1 = None;
        }
        // Lookups come back within milliseconds: do not sleep 50 ms on them, nor on the
        // bookkeeping after a read.
        let busy = self.with_state(|s, _| !s.pending.is_empty() || !s.ready.is_empty());
        let wait = if busy {
            Duration::from_millis(1)
        } else if self.bookkeeping.0.elapsed() < BOOKKEEPING_EVERY && read.is_some() {
            BOOKKEEPING_EVERY
        } else {
            Duration::from_millis(50)
        };
        match self.consumer.poll(wait) {
            None => {}
            Some(Err(e)) if undecodable::is_undecodable(&e) => {
                let assigned: Vec<i32> =
                    self.with_state(|s, _| s.assigned.iter().copied().collect());
                self.undecodable.on_error(&self.consumer, &e, &assigned);
            }
            Some(Err(e)) => {
                tracing::warn!(error = %e, "kafka poll error (the client reconnects by itself)");
            }
            Some(Ok(msg)) => {
                let (partition, offset) = (msg.partition(), msg.offset());
                self.undecodable.read(partition, offset);
                self.handle(&msg, partition, offset);
                self.bookkeeping.1 = Some(partition);
            }
        }
    }

    /// Whether a later stage has no room: then every partition is paused.
    fn under_pressure(&self) -> bool {
        self.with_state(|s, _| {
            s.pending.len() >= MAX_PENDING || !s.ready.is_empty() || !s.held_letters.is_empty()
        })
    }

    /// Rate changes (API, database) move each campaign's lookahead. A snapshot comes
    /// every 100 ms with new counts; its rates are walked only when the scheduler
    /// registered a campaign or applied settings since the last walk (two map lookups
    /// per campaign, ten times a second, were a tenth of the intake's CPU at 1,000).
    fn follow_live_rates(&mut self) {
        if !self.live.has_changed().unwrap_or(false) {
            return;
        }
        let (live, marker) = {
            let snapshot = self.live.borrow_and_update();
            (snapshot.campaigns.clone(), snapshot.rate_changes)
        };
        if self.rates_seen == Some(marker) {
            return;
        }
        self.rates_seen = Some(marker);
        let known = &mut self.known;
        let mut s = self.state.lock();
        for c in live.iter() {
            s.backlog.set_rate(&c.id, c.rate);
            if let (Some((k, _)), Ok(rate)) = (known.get_mut(&c.id), Rate::per_second(c.rate)) {
                k.rate = rate;
            }
        }
    }

    /// Whether memory has room for one more job under the worker-wide bounds.
    fn has_room(&self) -> bool {
        self.with_state(|s, _| {
            let jobs: usize = s.load.values().map(|l| l.jobs).sum();
            let devices: usize = s.load.values().map(|l| l.devices).sum();
            jobs < self.max_jobs && devices < self.max_devices
        })
    }

    fn publish_stats(&self, pressure: bool) {
        let snapshot = self.with_state(|s, _| {
            let mut st = s.stats.clone();
            st.buffered_jobs = s.load.values().map(|l| l.jobs).sum();
            st.buffered_devices = s.load.values().map(|l| l.devices).sum();
            st.parked_jobs = s.backlog.parked_total();
            st.window_jobs = s.backlog.waiting_total();
            st.window_zones = s.backlog.waiting_zones(super::scheduler::MAX_ZONES_SHOWN);
            st.paused_partitions = s
                .load
                .iter()
                .filter(|(_, l)| l.paused)
                .map(|(p, _)| *p)
                .collect();
            st.paused_partitions.sort_unstable();
            st.held_back = pressure;
            st.parked_devices = s.backlog.parked_devices();
            st
        });
        let snapshot = ConsumerStats {
            undecodable: self.undecodable.held(),
            ..snapshot
        };
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
    /// A job to be parked is only peeked at ([`crate::job::peek`]): it is decoded in full
    /// when handed over, and a bad one is dead-lettered then.
    fn handle(&self, msg: &rdkafka::message::BorrowedMessage<'_>, partition: i32, offset: i64) {
        let span = tracing::info_span!("job", partition, offset);
        let _g = span.enter();
        self.with_state(|s, _| {
            s.tracker.started(partition, offset);
            s.stats.jobs_received += 1;
            s.load.entry(partition).or_default();
        });
        let at = JobRef { partition, offset };
        let peeked = super::message::peek_message(msg);
        if let Some(p) = &peeked {
            if self.park_for_window(&p.campaign_id, p.zone, at, p.devices) {
                return;
            }
            let settings = self.settings_for(&p.campaign_id, p.send_rate, p.algorithm);
            if self.park_if_behind(msg, &settings, at, p.devices) {
                return;
            }
        }
        let Some(job) = self.decode_or_dead_letter(msg, partition, offset) else {
            return;
        };
        let devices = job.devices.len() as u32;
        // A peeked job's window was decided above, from the same `tz`.
        if peeked.is_none() && self.park_for_window(&job.campaign_id, job.zone, at, devices) {
            return;
        }
        let settings = self.campaign_settings(&job);
        if !self.park_if_behind(msg, &settings, at, devices) {
            self.hand_over(job, settings, partition, offset);
        }
    }

    /// Parks the job behind its campaign's lookahead unless the campaign wants it now
    /// and memory has room; returns whether it parked it.
    fn park_if_behind(
        &self,
        msg: &rdkafka::message::BorrowedMessage<'_>,
        settings: &CampaignSettings,
        at: JobRef,
        devices: u32,
    ) -> bool {
        let room = self.has_room();
        let max_bytes = self.max_parked_bytes;
        let parked = self.with_state(|s, _| {
            if s.backlog.wants(&settings.id) && (room || s.backlog.guaranteed(&settings.id)) {
                return false;
            }
            // Keep the raw message while memory allows: no re-read later. Partitions
            // pause at the budget unless a campaign starves there (see adjust_pauses);
            // reading on for it may keep up to twice the budget.
            let size = msg.payload_len() + msg.key_len();
            let keep = (s.backlog.parked_bytes() + size <= 2 * max_bytes).then(|| msg.detach());
            s.backlog
                .park(&settings.id, settings.rate.as_f64(), at, devices, keep);
            true
        });
        if parked {
            tracing::debug!(campaign = %settings.id, "job parked behind its campaign's lookahead");
        }
        parked
    }

    /// Decodes and checks a job; a bad one is dead-lettered (its offset finishes once
    /// the letter is written).
    fn decode_or_dead_letter<M: HeaderSource>(
        &self,
        msg: &M,
        partition: i32,
        offset: i64,
    ) -> Option<Job> {
        // A decoder bug on one message must not take the partition (or the consumer
        // thread) down with it: the message becomes a letter, kept whole.
        let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            super::message::inspect_message(msg).and_then(|mut job| {
                self.providers.resolve(&mut job)?;
                Ok(job)
            })
        }))
        .unwrap_or_else(|panic| Err(super::message::Rejection::from_panic(&*panic)));
        let rejection = match checked {
            Ok(job) => return Some(job),
            Err(r) => r,
        };
        tracing::warn!(reason = %rejection.reason, kind = rejection.kind.as_str(), "job dead-lettered");
        let raw = msg.payload().unwrap_or(&[]);
        let raw = &raw[..raw.len().min(crate::store::dead_letters::MAX_RAW_BYTES)];
        let letter = Letter {
            kind: rejection.kind,
            partition,
            offset,
            campaign_id: None,
            job_id: None,
            device: None,
            device_token: None,
            reason: rejection.reason,
            key: msg.key().map(<[u8]>::to_vec),
            raw: raw.to_vec(),
            replay: None,
        };
        self.with_state(|s, _| s.dead_letter_message(letter));
        None
    }

    /// Accepts a job for the scheduler: it counts against the bounds now, and reaches the
    /// scheduler once its lookups are back.
    fn hand_over(&self, job: Job, settings: CampaignSettings, partition: i32, offset: i64) {
        let devices = job.devices.len();
        let dispatched = Arc::new(AtomicU32::new(0));
        let read_settings = !self.is_cached(&settings.id);
        let job = Arc::new(job);
        let lookups = self.runtime.spawn(
            self.enricher
                .clone()
                .lookups(job.clone(), read_settings)
                .instrument(tracing::Span::current()),
        );
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
            s.pending.push_back(Pending {
                job,
                settings,
                partition,
                offset,
                dispatched,
                lookups,
            });
        });
    }

    /// Moves jobs whose lookups are back to the scheduler, oldest first, while its
    /// queue has room. Never waits.
    fn forward_looked_up(&mut self) {
        loop {
            let next = self.with_state(|s, _| {
                let done = s.pending.front().is_some_and(|p| p.lookups.is_finished());
                if done {
                    s.pending.pop_front()
                } else {
                    None
                }
            });
            let Some(mut p) = next else { break };
            let found = match (&mut p.lookups).now_or_never() {
                Some(Ok(found)) => found,
                // Only a panic gets here (revoked jobs are removed before aborting):
                // sending in full may duplicate, but loses nothing.
                Some(Err(e)) => {
                    tracing::error!(error = %e, job_id = %p.job.job_id, "job lookups failed; sending the job in full");
                    Lookups::default()
                }
                None => unreachable!("a finished task is ready"),
            };
            let settings = match found.settings {
                Some(stored) => {
                    self.remember(&stored);
                    stored
                }
                None => p.settings,
            };
            p.dispatched.store(found.already_done, Ordering::Relaxed);
            let incoming = IncomingJob {
                job: p.job,
                partition: p.partition,
                offset: p.offset,
                already_done: found.already_done,
                settings,
                skip_done: found.done_after,
                skip_invalid: found.invalid,
                skip_capped: found.capped,
                dispatched: p.dispatched,
            };
            self.with_state(|s, _| s.ready.push_back(incoming));
        }
        self.send_ready();
    }

    /// Hands ready jobs to the scheduler while its queue has room.
    fn send_ready(&self) {
        self.with_state(|s, _| {
            while let Some(job) = s.ready.pop_front() {
                match self.control.try_send(Control::Job(job)) {
                    Ok(()) => {}
                    Err(mpsc::error::TrySendError::Full(Control::Job(job))) => {
                        s.ready.push_front(job);
                        return;
                    }
                    Err(_) => {
                        tracing::warn!("scheduler is gone; job left for re-delivery");
                        return;
                    }
                }
            }
        });
    }

    fn is_cached(&self, id: &str) -> bool {
        self.known
            .get(id)
            .is_some_and(|(_, at)| at.elapsed() < self.settings_ttl)
    }

    /// The campaign's settings as last read (the scheduler gets the stored ones), or
    /// provisional ones until its lookups read them.
    fn campaign_settings(&self, job: &Job) -> CampaignSettings {
        self.settings_for(&job.campaign_id, job.send_rate, job.algorithm)
    }

    /// The campaign's settings as read from the store, else those its job states.
    fn settings_for(
        &self,
        campaign_id: &str,
        rate: Option<Rate>,
        algorithm: Option<crate::limiter::Algorithm>,
    ) -> CampaignSettings {
        match self.known.get(campaign_id) {
            Some((s, _)) => s.clone(),
            None => enrich::provisional(campaign_id, rate, algorithm, &self.defaults),
        }
    }

    /// Remembers settings read from the store; expired entries go when the cache is full.
    fn remember(&mut self, settings: &CampaignSettings) {
        if self.known.len() >= MAX_CACHED_CAMPAIGNS {
            let ttl = self.settings_ttl;
            self.known.retain(|_, (_, at)| at.elapsed() < ttl);
        }
        self.known
            .insert(settings.id.clone(), (settings.clone(), Instant::now()));
    }

    /// After shutdown: wait for the scheduler to drain, then make the last commit.
    fn finish(self, drain_timeout: Duration) {
        let deadline = Instant::now() + drain_timeout + Duration::from_secs(5);
        // The scheduler drains its in-flight sends, then drops its event sender; dead
        // letters of read messages get their write.
        while !self.with_state(|s, _| {
            s.drain_events();
            s.scheduler_gone && s.lettered.is_empty() && s.held_letters.is_empty()
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
        self.publish_stats(false);
        tracing::info!("consumer stopped; offsets committed");
    }
}

/// Cached campaign settings before expired entries are swept.
const MAX_CACHED_CAMPAIGNS: usize = 100_000;
