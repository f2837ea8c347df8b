//! The 1/N time-slice scheduler: one task shares each quantum among up to
//! `max_active_campaigns` campaigns.
//!
//! A round lasts one quantum `q` (between `quantum_min` and `quantum_max`, shorter when
//! the summed rate is high). In a round every active campaign gets one turn, starting
//! from a rotating position: it asks its limiter for as many permits as it has ready
//! work and in-flight room ([`RateLimiter::acquire_up_to`]), dispatches that many sends
//! without waiting for them, and yields. Between rounds the task sleeps until the
//! earliest instant a limiter named, a retry falls due, or the next round, so it never
//! spins.
//!
//! The core ([`Scheduler`]) is synchronous and owns all its state: no locks, and no
//! allocation per send with the null sender (the send's future is ready at once and
//! handled inline). The async driver ([`run`]) feeds it jobs, completions and settings.
//!
//! Timer wake-ups are only as fine as ~1 ms, so a turn usually runs a little after the
//! instant its limiter named. A late turn asks the limiter as of that instant (and of
//! each following one up to now), so lateness is not lost from the rate: sends keep the
//! limiter's schedule, shifted by the wake-up delay. Of a longer stall (a process that
//! got no CPU), only the last `quantum_min` is made up, counting what the limiter makes
//! up by itself ([`acquire_catching_up`]): a stall never turns into a burst larger than
//! `rate × quantum_min`, and costs the rate only what exceeds that.

use crate::capping::{CapDecision, FrequencyCap};
use crate::config::LimiterScope;
use crate::job::Job;
use crate::limiter::hierarchical::HierarchicalLimiter;
use crate::limiter::{
    self, Algorithm, Clock, DynLimiter, Grant, Nanos, Rate, RateLimiter, NANOS_PER_SEC,
};
mod answers;
mod caps;
mod lanes;

pub use lanes::{LanePoint, ProviderLive, HISTORY_S};

pub use answers::{MISMATCH_MIN, MISMATCH_WINDOW, PROBE_IN_FLIGHT};

use crate::provider::Providers;
use crate::sender::{SendFuture, SendOutcome};
use crate::stats::{CampaignCounter, JobKey, JobProgressHandle, Outcome, StatsRecorder};
use crate::store::DeadLetterKind;
use crate::worker::outcomes::{Letter, Outcomes, Record};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Builds each campaign's own limiter. The default builds in-process limiters; the
/// distributed mode plugs in a factory whose limiters share a rate across workers.
pub trait LimiterFactory: Send + Sync {
    fn build(&self, campaign: &str, algorithm: Algorithm, rate: Rate, burst: u32) -> DynLimiter;

    /// A limiter for a campaign with its own `limiter_scope` (`None`: the configured
    /// default). Factories that know only one scope ignore it.
    fn build_scoped(
        &self,
        campaign: &str,
        algorithm: Algorithm,
        _scope: Option<LimiterScope>,
        rate: Rate,
        burst: u32,
    ) -> DynLimiter {
        self.build(campaign, algorithm, rate, burst)
    }
}

/// In-process limiters from [`limiter::build`].
#[derive(Debug, Clone, Copy, Default)]
pub struct LocalLimiters;

impl LimiterFactory for LocalLimiters {
    fn build(&self, _campaign: &str, algorithm: Algorithm, rate: Rate, burst: u32) -> DynLimiter {
        limiter::build(algorithm, rate, burst)
    }
}

/// The scheduler's settings.
#[derive(Clone)]
pub struct SchedulerConfig {
    pub max_active_campaigns: usize,
    pub quantum_min: Duration,
    pub quantum_max: Duration,
    pub max_in_flight: usize,
    pub max_attempts: u32,
    pub retry_base: Duration,
    pub retry_max: Duration,
    /// A device failing transiently is given up (dead-lettered) only after
    /// `max_attempts` AND this long since its first failure, so that a provider outage
    /// shorter than this delays sends instead of dropping them.
    pub give_up_after: Duration,
    /// A cap over all campaigns (hierarchical limiter).
    pub global_rate: Option<Rate>,
    /// Where campaign limiters come from.
    pub limiters: Arc<dyn LimiterFactory>,
    /// A campaign's settings are forgotten once it has had no job this long.
    pub forget_after: Duration,
}

/// The shipped defaults (config/base.toml) with in-process limiters and no global cap.
impl Default for SchedulerConfig {
    fn default() -> Self {
        Self {
            max_active_campaigns: 100,
            quantum_min: Duration::from_millis(10),
            quantum_max: Duration::from_millis(1000),
            max_in_flight: 512,
            max_attempts: 8,
            retry_base: Duration::from_millis(100),
            retry_max: Duration::from_secs(10),
            give_up_after: Duration::ZERO,
            global_rate: None,
            limiters: Arc::new(LocalLimiters),
            forget_after: Duration::from_secs(600),
        }
    }
}

impl std::fmt::Debug for SchedulerConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchedulerConfig")
            .field("max_active_campaigns", &self.max_active_campaigns)
            .field("quantum_min", &self.quantum_min)
            .field("quantum_max", &self.quantum_max)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_attempts", &self.max_attempts)
            .field("give_up_after", &self.give_up_after)
            .field("global_rate", &self.global_rate)
            .field("forget_after", &self.forget_after)
            .finish_non_exhaustive()
    }
}

/// A campaign's effective settings (the store's, which win over a job's).
#[derive(Debug, Clone, PartialEq)]
pub struct CampaignSettings {
    pub id: Arc<str>,
    pub rate: Rate,
    pub algorithm: Algorithm,
    pub burst: u32,
    pub paused: bool,
    /// Halted by a provider's configuration error (status `halted`): nothing is sent
    /// until an operator resumes it.
    pub halted: bool,
    /// The campaign's own limiter scope; `None`: the configured default.
    pub limiter_scope: Option<LimiterScope>,
    /// Its weight in a fair share under a cap (weighted max-min).
    pub weight: f64,
}

/// A job handed over by the consumer.
#[derive(Debug)]
pub struct IncomingJob {
    pub job: Arc<Job>,
    pub partition: i32,
    pub offset: i64,
    /// Devices already finished in an earlier run (from job_progress).
    pub already_done: u32,
    /// Device indexes (ascending) after `already_done` also finished in an earlier run
    /// (from job_progress): marked done without a send, counted nowhere.
    pub skip_done: Vec<u32>,
    pub settings: CampaignSettings,
    /// Device indexes (ascending) whose tokens are recorded invalid: marked done without
    /// a send or a permit, counted as `skipped_invalid`.
    pub skip_invalid: Vec<u32>,
    /// Device indexes (ascending) refused by the shared frequency cap at intake
    /// (`capping.scope = "redis"`): marked done without a send, counted as `capped`.
    pub skip_capped: Vec<u32>,
    /// The job's send cursor (devices before it were dispatched), kept here for the
    /// consumer's lookahead.
    pub dispatched: Arc<AtomicU32>,
}

impl CampaignSettings {
    /// An active campaign at `rate` with `algorithm`, no burst, the default scope.
    pub fn active(id: &str, rate: Rate, algorithm: Algorithm) -> Self {
        Self {
            id: Arc::from(id),
            rate,
            algorithm,
            burst: 0,
            paused: false,
            halted: false,
            limiter_scope: None,
            weight: 1.0,
        }
    }
}

impl IncomingJob {
    /// A job seen for the first time: nothing done before, nothing to skip.
    pub fn fresh(job: Job, partition: i32, offset: i64, settings: CampaignSettings) -> Self {
        Self {
            job: Arc::new(job),
            partition,
            offset,
            already_done: 0,
            skip_done: Vec::new(),
            settings,
            skip_invalid: Vec::new(),
            skip_capped: Vec::new(),
            dispatched: Default::default(),
        }
    }
}

/// Messages into the scheduler.
#[derive(Debug)]
pub enum Control {
    Job(IncomingJob),
    Settings(CampaignSettings),
    /// Stop dispatching these partitions' jobs, wait for their in-flight sends, drop
    /// them, and answer. Their unfinished devices are re-read by the next owner.
    Revoke {
        partitions: Vec<i32>,
        done: oneshot::Sender<()>,
    },
}

/// Messages out of the scheduler, to the consumer.
#[derive(Debug)]
pub enum Event {
    /// Every device of the job at (partition, offset) is finished. Its offset may be
    /// committed once `progress` is durable (counts and progress flushed together).
    JobFinished {
        partition: i32,
        offset: i64,
        devices: u32,
        progress: JobProgressHandle,
    },
}

/// A finished send, from a spawned future back to the scheduler.
#[derive(Debug)]
pub struct Completion {
    slot: u32,
    device: u32,
    attempt: u32,
    /// When its first attempt failed (0 before any failure).
    first_failed: Nanos,
    outcome: SendOutcome,
    /// From dispatch to answer.
    latency_ns: u64,
}

/// A record on its way to the outcomes stage, and the device it finishes.
struct AwaitLetter {
    /// Its number once queued.
    seq: Option<u64>,
    /// The record while the queue had no room.
    record: Option<Record>,
    at: Option<LetterFor>,
}

/// The device a dead letter finishes (slot, and the job's identity to check it).
#[derive(Debug, Clone, Copy)]
struct LetterFor {
    slot: u32,
    partition: i32,
    offset: i64,
    device: u32,
}

/// How often the driver looks at letters waiting for their write.
const LETTER_POLL: Duration = Duration::from_millis(10);

/// How often idle campaigns' settings are swept.
const SWEEP_EVERY: Duration = Duration::from_secs(10);

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct RetryItem {
    not_before: Nanos,
    slot: u32,
    device: u32,
    attempt: u32,
    first_failed: Nanos,
}

struct ActiveJob {
    job: Arc<Job>,
    campaign: u32,
    partition: i32,
    offset: i64,
    /// The next device never dispatched.
    next: u32,
    /// One bit per device: finished.
    done: Vec<u64>,
    done_count: u32,
    /// Devices 0..done_prefix are all finished.
    done_prefix: u32,
    in_flight: u32,
    progress: JobProgressHandle,
    /// Devices at or after `next` already marked done (skipped invalid tokens).
    done_ahead: u32,
    /// `next`, published for the consumer's lookahead (one relaxed store per send).
    dispatched: Arc<AtomicU32>,
}

impl ActiveJob {
    fn total(&self) -> u32 {
        self.job.devices.len() as u32
    }

    fn is_done(&self, i: u32) -> bool {
        self.done[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    fn mark_done(&mut self, i: u32) {
        self.done[(i / 64) as usize] |= 1 << (i % 64);
        self.done_count += 1;
        self.progress.mark(i);
        let before = self.done_prefix;
        while self.done_prefix < self.total() && self.is_done(self.done_prefix) {
            self.done_prefix += 1;
        }
        if self.done_prefix != before {
            self.progress.set_done(self.done_prefix);
        }
    }
}

struct Campaign {
    settings: CampaignSettings,
    limiter: DynLimiter,
    /// Job slots with devices never dispatched, oldest first.
    queue: VecDeque<u32>,
    retries: BinaryHeap<Reverse<RetryItem>>,
    in_flight: u32,
    open_jobs: u32,
    /// When the limiter said the next permit is due.
    next_at: Option<Nanos>,
    counter: CampaignCounter,
    active: bool,
    /// The limiter's rate: send_rate, or its fair share under a cap or ceiling.
    effective_rate: Rate,
    sent: u64,
    failed: u64,
    retried: u64,
    invalid: u64,
    /// The provider of its first job: the cap it shares.
    provider: u16,
    /// Stopped by a provider's configuration error until an operator resumes it.
    halt: Option<answers::HaltState>,
    /// An answer has shown that the provider takes this campaign's sends; until then at
    /// most [`PROBE_IN_FLIGHT`] are in flight.
    confirmed: bool,
    mismatch: answers::MismatchWindow,
}

impl Campaign {
    fn has_work(&self) -> bool {
        self.open_jobs > 0
    }
}

/// Counters the worker exposes (read by metrics, the API and tests).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SchedulerStats {
    pub active_campaigns: usize,
    pub waiting_campaigns: usize,
    pub max_active_seen: usize,
    pub in_flight: usize,
    pub open_jobs: usize,
    pub sends: u64,
    /// Devices delivered since the worker started, over all campaigns (unlike the
    /// per-campaign counts, this survives a campaign's release).
    pub delivered: u64,
    /// Devices not sent because their token is recorded invalid.
    pub skipped_invalid: u64,
    /// Devices not sent because they were over their frequency cap.
    pub capped: u64,
    /// The campaigns this worker holds (active or waiting for a slot).
    pub campaigns: Arc<Vec<CampaignLive>>,
    /// Each provider's lane: adaptive ceiling and its recent history.
    pub providers: Arc<Vec<ProviderLive>>,
}

/// One campaign as the scheduler sees it; counts are cumulative since it was loaded.
#[derive(Debug, Clone, PartialEq)]
pub struct CampaignLive {
    pub id: Arc<str>,
    pub rate: f64,
    /// What it sends at: its rate, or its share when a cap or ceiling binds.
    pub effective_rate: f64,
    /// Its weight in that share.
    pub weight: f64,
    pub algorithm: Algorithm,
    pub paused: bool,
    /// Why it is halted, when it is (by an answer here, or in the store).
    pub halted: Option<Arc<str>>,
    pub active: bool,
    pub sent: u64,
    pub failed: u64,
    pub retried: u64,
    /// Tokens the provider said are dead.
    pub invalid: u64,
    pub in_flight: u32,
    pub open_jobs: u32,
}

/// The synchronous scheduler core.
pub struct Scheduler {
    config: SchedulerConfig,
    providers: Arc<Providers>,
    /// Each provider's `max_rate` cap, by slot.
    provider_caps: Vec<Option<HierarchicalLimiter>>,
    /// Sends in flight through each provider, and each one's limit, by slot.
    provider_in_flight: Vec<u32>,
    provider_max_in_flight: Vec<u32>,
    /// Providers whose configuration was refused, by slot: their campaigns halt.
    provider_halts: Vec<Option<Arc<str>>>,
    /// Each provider's lane (adaptive ceiling, sends this second, history), by slot.
    lanes: Vec<lanes::Lane>,
    /// The second the lanes last judged.
    lanes_second: u64,
    /// Summed send_rate per provider (kept to reuse its buffer).
    lane_demand: Vec<f64>,
    halts_total: metrics::Counter,
    stats: StatsRecorder,
    global: Option<HierarchicalLimiter>,
    campaigns: Vec<Option<Campaign>>,
    by_id: HashMap<Arc<str>, u32>,
    /// Settings of campaigns seen lately, and when each was last used.
    known: HashMap<Arc<str>, (CampaignSettings, Nanos)>,
    last_sweep: Nanos,
    active: Vec<u32>,
    waiting: VecDeque<u32>,
    rotate: usize,
    jobs: Vec<Option<ActiveJob>>,
    free_jobs: Vec<u32>,
    in_flight: usize,
    completions: mpsc::UnboundedSender<Completion>,
    events: std::sync::mpsc::Sender<Event>,
    /// Partitions being revoked, each set with the answer it waits for.
    revoking: Vec<(Vec<i32>, oneshot::Sender<()>)>,
    draining: bool,
    /// Where dead letters and invalid tokens go (none in unit tests: marked at once).
    outcomes: Option<Outcomes>,
    /// Records waiting for room in the outcomes queue or for their write; a device
    /// with a dead letter counts as done only once its letter is durable.
    letters: VecDeque<AwaitLetter>,
    counters: SchedulerStats,
    retries_total: metrics::Counter,
    limiter_wait: metrics::Histogram,
    /// The latest `now` seen, for rate changes made outside a call that carries one.
    now_hint: Nanos,
    in_round: bool,
    /// Campaigns that went idle during a round (capacity kept between rounds).
    deferred_release: Vec<u32>,
    /// The per-device frequency cap, when enabled.
    capping: Option<FrequencyCap>,
    skipped_total: metrics::Counter,
    capped_total: metrics::Counter,
}

impl Scheduler {
    pub fn new(
        config: SchedulerConfig,
        providers: impl Into<Arc<Providers>>,
        stats: StatsRecorder,
        completions: mpsc::UnboundedSender<Completion>,
        events: std::sync::mpsc::Sender<Event>,
    ) -> Self {
        let providers: Arc<Providers> = providers.into();
        let quantum_min = config.quantum_min.as_nanos() as Nanos;
        let global = config
            .global_rate
            .map(|r| caps::cap_limiter(r, quantum_min));
        let provider_caps = providers
            .iter()
            .map(|p| p.max_rate.map(|r| caps::cap_limiter(r, quantum_min)))
            .collect();
        let provider_max_in_flight = providers
            .iter()
            .map(|p| p.max_in_flight.unwrap_or(u32::MAX))
            .collect();
        Self {
            config,
            provider_caps,
            provider_in_flight: vec![0; providers.len()],
            provider_max_in_flight,
            lanes: providers.iter().map(lanes::Lane::new).collect(),
            lanes_second: 0,
            lane_demand: Vec::new(),
            providers,
            provider_halts: Vec::new(),
            halts_total: metrics::counter!("campaign_halts_total"),
            stats,
            global,
            campaigns: Vec::new(),
            by_id: HashMap::new(),
            known: HashMap::new(),
            last_sweep: 0,
            active: Vec::new(),
            waiting: VecDeque::new(),
            rotate: 0,
            jobs: Vec::new(),
            free_jobs: Vec::new(),
            in_flight: 0,
            completions,
            events,
            revoking: Vec::new(),
            draining: false,
            outcomes: None,
            letters: VecDeque::new(),
            counters: SchedulerStats::default(),
            retries_total: metrics::counter!("retries_total"),
            limiter_wait: metrics::histogram!("limiter_wait_seconds"),
            now_hint: 0,
            in_round: false,
            deferred_release: Vec::new(),
            capping: None,
            skipped_total: metrics::counter!("skipped_invalid_total"),
            capped_total: metrics::counter!("capped_total"),
        }
    }

    /// Sends dead letters and invalid tokens to the outcomes stage.
    pub fn set_outcomes(&mut self, outcomes: Outcomes) {
        self.outcomes = Some(outcomes);
    }

    /// Enables a per-device frequency cap (checked before each first attempt).
    pub fn set_capping(&mut self, cap: Option<FrequencyCap>) {
        self.capping = cap;
    }

    /// The frequency cap's counters, when enabled.
    pub fn capping_stats(&self) -> Option<crate::capping::CapStats> {
        self.capping.as_ref().map(|c| c.stats())
    }

    /// A snapshot, with every campaign (allocates: call it a few times a second at most).
    pub fn stats(&self) -> SchedulerStats {
        let campaigns = self
            .campaigns
            .iter()
            .flatten()
            .map(|c| CampaignLive {
                id: c.settings.id.clone(),
                rate: c.settings.rate.as_f64(),
                effective_rate: c.effective_rate.as_f64(),
                weight: c.settings.weight,
                algorithm: c.settings.algorithm,
                paused: c.settings.paused,
                halted: c.halt.as_ref().map(|h| h.reason.clone()).or_else(|| {
                    c.settings
                        .halted
                        .then(|| Arc::from("halted (see the campaign's halt_reason)"))
                }),
                active: c.active,
                sent: c.sent,
                failed: c.failed,
                retried: c.retried,
                invalid: c.invalid,
                in_flight: c.in_flight,
                open_jobs: c.open_jobs,
            })
            .collect();
        SchedulerStats {
            active_campaigns: self.active.len(),
            waiting_campaigns: self.waiting.len(),
            in_flight: self.in_flight,
            open_jobs: self.jobs.len() - self.free_jobs.len(),
            max_active_seen: self.counters.max_active_seen,
            sends: self.counters.sends,
            delivered: self.counters.delivered,
            skipped_invalid: self.counters.skipped_invalid,
            capped: self.counters.capped,
            campaigns: Arc::new(campaigns),
            providers: Arc::new(self.lanes_live(self.now_hint, unix_ms())),
        }
    }

    /// Applies settings from the store (rate change, pause, algorithm change).
    pub fn apply_settings(&mut self, s: CampaignSettings, now: Nanos) {
        self.now_hint = self.now_hint.max(now);
        self.known.insert(s.id.clone(), (s.clone(), self.now_hint));
        let Some(&slot) = self.by_id.get(&s.id) else {
            return;
        };
        let rebuild = {
            let c = self.campaigns[slot as usize]
                .as_ref()
                .expect("indexed campaign");
            c.settings.algorithm != s.algorithm
                || c.settings.burst != s.burst
                || c.settings.limiter_scope != s.limiter_scope
        };
        let effective = self.campaigns[slot as usize]
            .as_ref()
            .map_or(s.rate, |c| c.effective_rate);
        let provider = self.campaigns[slot as usize]
            .as_ref()
            .map_or(0, |c| c.provider);
        let limiter = rebuild.then(|| self.build_limiter(&s, effective, provider));
        let c = self.campaigns[slot as usize]
            .as_mut()
            .expect("indexed campaign");
        if let Some(l) = limiter {
            c.limiter = l;
        }
        c.next_at = None;
        tracing::info!(campaign = %s.id, rate = %s.rate, algorithm = %s.algorithm, paused = s.paused, halted = s.halted, "campaign settings applied");
        let (halted, paused) = (s.halted, s.paused);
        c.settings = s;
        self.apply_halt_settings(slot, halted, paused);
        // The new rate (or pause) changes everyone's fair share under a global cap.
        self.rebalance(now);
    }

    /// Takes a job from the consumer.
    pub fn add_job(&mut self, incoming: IncomingJob, now: Nanos) {
        let IncomingJob {
            job,
            partition,
            offset,
            already_done,
            skip_done,
            settings,
            skip_invalid,
            skip_capped,
            dispatched,
        } = incoming;
        self.now_hint = self.now_hint.max(now);
        let total = job.devices.len() as u32;
        let campaign_id: Arc<str> = Arc::from(job.campaign_id.as_str());
        if self.is_revoking(partition) {
            // Revoked before it arrived: its next owner reads it again.
            return;
        }
        let settings = self
            .known
            .get(&campaign_id)
            .map_or(settings, |(s, _)| s.clone());
        self.known
            .insert(campaign_id.clone(), (settings.clone(), now));
        let cslot = self.campaign_slot(settings, job.provider_slot);

        let progress = self.stats.track_job(JobKey {
            job_id: job.job_id.clone(),
            campaign_id: job.campaign_id.clone(),
            partition,
            offset,
            devices_total: total,
        });
        let already_done = already_done.min(total);
        let mut active = ActiveJob {
            job,
            campaign: cslot,
            partition,
            offset,
            next: already_done,
            done: vec![0; total.div_ceil(64) as usize],
            done_count: 0,
            done_prefix: 0,
            in_flight: 0,
            progress,
            done_ahead: 0,
            dispatched,
        };
        active.dispatched.store(already_done, Ordering::Relaxed);
        for i in 0..already_done {
            active.mark_done(i);
        }
        let mut skip = |list: &[u32]| {
            let mut skipped = 0u32;
            for &i in list.iter().filter(|&&i| i >= already_done && i < total) {
                if !active.is_done(i) {
                    active.mark_done(i);
                    active.done_ahead += 1;
                    skipped += 1;
                }
            }
            skipped
        };
        // Finished before: done, but not skipped now (no count, no skipped_invalid).
        let _ = skip(&skip_done);
        let skipped = skip(&skip_invalid);
        let capped = skip(&skip_capped);
        for (n, outcome) in [
            (skipped, Outcome::SkippedInvalid),
            (capped, Outcome::Capped),
        ] {
            if n > 0 {
                if let Some(c) = self.campaigns[cslot as usize].as_ref() {
                    c.counter.record(unix_now(), outcome, n);
                }
            }
        }
        self.counters.skipped_invalid += u64::from(skipped);
        self.skipped_total.increment(u64::from(skipped));
        self.counters.capped += u64::from(capped);
        self.capped_total.increment(u64::from(capped));
        if active.done_count == total {
            // Finished in an earlier run: nothing to send.
            let _ = self.events.send(Event::JobFinished {
                partition,
                offset,
                devices: total,
                progress: active.progress,
            });
            self.release_campaign_if_idle(cslot);
            return;
        }
        let slot = match self.free_jobs.pop() {
            Some(s) => {
                self.jobs[s as usize] = Some(active);
                s
            }
            None => {
                self.jobs.push(Some(active));
                (self.jobs.len() - 1) as u32
            }
        };
        let c = self.campaigns[cslot as usize]
            .as_mut()
            .expect("campaign slot");
        c.queue.push_back(slot);
        c.open_jobs += 1;
        if !c.active && !self.waiting.contains(&cslot) {
            if self.active.len() < self.config.max_active_campaigns {
                self.activate(cslot);
            } else {
                self.waiting.push_back(cslot);
            }
        }
    }

    /// The campaign's slot; a new campaign takes the provider of its first job (for
    /// the provider's cap).
    fn campaign_slot(&mut self, settings: CampaignSettings, provider: u16) -> u32 {
        if let Some(&s) = self.by_id.get(&settings.id) {
            return s;
        }
        let limiter = self.build_limiter(&settings, settings.rate, provider);
        let counter = self.stats.campaign(&settings.id);
        let effective_rate = settings.rate;
        let id = settings.id.clone();
        let c = Campaign {
            settings,
            limiter,
            queue: VecDeque::new(),
            retries: BinaryHeap::new(),
            in_flight: 0,
            open_jobs: 0,
            next_at: None,
            counter,
            active: false,
            effective_rate,
            sent: 0,
            failed: 0,
            retried: 0,
            invalid: 0,
            provider,
            halt: None,
            confirmed: false,
            mismatch: answers::MismatchWindow::default(),
        };
        let slot = match self.campaigns.iter().position(|c| c.is_none()) {
            Some(i) => {
                self.campaigns[i] = Some(c);
                i as u32
            }
            None => {
                self.campaigns.push(Some(c));
                (self.campaigns.len() - 1) as u32
            }
        };
        self.by_id.insert(id, slot);
        slot
    }

    fn activate(&mut self, slot: u32) {
        let c = self.campaigns[slot as usize]
            .as_mut()
            .expect("campaign slot");
        c.active = true;
        self.active.push(slot);
        self.counters.max_active_seen = self.counters.max_active_seen.max(self.active.len());
        tracing::info!(campaign = %c.settings.id, active = self.active.len(), "campaign active");
        self.rebalance(self.now_hint);
    }

    /// Deactivates and forgets a campaign with no open jobs; admits a waiting one.
    fn release_campaign_if_idle(&mut self, slot: u32) {
        if self.in_round {
            if !self.deferred_release.contains(&slot) {
                self.deferred_release.push(slot);
            }
            return;
        }
        let idle = self.campaigns[slot as usize]
            .as_ref()
            .is_some_and(|c| !c.has_work() && c.in_flight == 0);
        if !idle {
            return;
        }
        let c = self.campaigns[slot as usize].take().expect("campaign slot");
        self.by_id.remove(&c.settings.id);
        self.active.retain(|&s| s != slot);
        self.waiting.retain(|&s| s != slot);
        tracing::info!(campaign = %c.settings.id, "campaign idle");
        drop(c);
        while self.active.len() < self.config.max_active_campaigns {
            match self.waiting.pop_front() {
                Some(next) => self.activate(next),
                None => break,
            }
        }
        self.rebalance(self.now_hint);
    }

    /// The round's quantum: short when rates are high, long when they are low. It aims at
    /// about 100 sends per round in total, within [quantum_min, quantum_max].
    pub fn quantum(&self) -> Duration {
        let total: f64 = self
            .active
            .iter()
            .filter_map(|&s| self.campaigns[s as usize].as_ref())
            .map(|c| c.settings.rate.as_f64())
            .sum();
        if total <= 0.0 {
            return self.config.quantum_max;
        }
        Duration::from_secs_f64(100.0 / total)
            .clamp(self.config.quantum_min, self.config.quantum_max)
    }

    /// One round: a turn for every active campaign. Returns when the scheduler next has
    /// something to do (a limiter's next permit or a retry falling due), if sooner than
    /// the next round.
    pub fn run_round(&mut self, now: Nanos, unix_sec: u64) -> Option<Nanos> {
        self.now_hint = self.now_hint.max(now);
        self.tick_lanes(now, unix_sec);
        self.settle_letters();
        self.sweep_known(now);
        let n = self.active.len();
        // The flusher holds too many unwritten rows, or the outcomes queue is full
        // (database down): pause, never drop.
        let held = self.letters.back().is_some_and(|l| l.seq.is_none());
        if n == 0 || self.draining || self.stats.backpressure() || held {
            return self.letters_wake(now);
        }
        let share = (self.config.max_in_flight / n).max(1) as u32;
        let mut next_wake: Option<Nanos> = None;
        let start = self.rotate % n;
        self.rotate = self.rotate.wrapping_add(1);
        // Campaigns that go idle in this round are released after it, so that the
        // active list does not change under the loop.
        self.in_round = true;
        for k in 0..n {
            let slot = self.active[(start + k) % n];
            if let Some(t) = self.turn(slot, share, now, unix_sec) {
                next_wake = Some(next_wake.map_or(t, |w: Nanos| w.min(t)));
            }
        }
        self.in_round = false;
        while let Some(slot) = self.deferred_release.pop() {
            self.release_campaign_if_idle(slot);
        }
        match (next_wake, self.letters_wake(now)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn turn(&mut self, slot: u32, share: u32, now: Nanos, unix_sec: u64) -> Option<Nanos> {
        let room_total = self.config.max_in_flight.saturating_sub(self.in_flight) as u32;
        let c = self.campaigns[slot as usize].as_mut()?;
        if c.settings.paused || c.settings.halted || c.halt.is_some() {
            return None;
        }
        if let Some(t) = c.next_at {
            if t > now {
                return Some(t);
            }
        }
        let ready_retries = c
            .retries
            .iter()
            .filter(|Reverse(r)| r.not_before <= now)
            .count() as u32;
        let mut undispatched: u32 = 0;
        for &j in &c.queue {
            if let Some(job) = self.jobs[j as usize].as_ref() {
                undispatched = undispatched.saturating_add(job.total() - job.next - job.done_ahead);
                if undispatched >= share {
                    break;
                }
            }
        }
        // Its share of max_in_flight, or more while half the pool sits idle: the share
        // only has to stop one slow campaign from starving the others.
        let cap = share.max(room_total / 2);
        let lane = c.provider;
        if let Some(until) = self.lane_paused(lane, now) {
            // The provider asked for a pause: nothing until then, in-flight sends finish.
            return Some(until);
        }
        let c = self.campaigns[slot as usize].as_mut()?;
        let provider = usize::from(c.provider);
        let provider_room = self
            .provider_max_in_flight
            .get(provider)
            .map_or(u32::MAX, |&max| {
                max.saturating_sub(self.provider_in_flight[provider])
            });
        let mut room = cap
            .saturating_sub(c.in_flight)
            .min(room_total)
            .min(provider_room);
        if !c.confirmed {
            room = room.min(PROBE_IN_FLIGHT.saturating_sub(c.in_flight));
        }
        let want = (ready_retries + undispatched).min(room);
        let mut wake = c
            .retries
            .peek()
            .map(|Reverse(r)| r.not_before)
            .filter(|&t| t > now);
        if want == 0 {
            return wake;
        }
        let quantum_min = self.config.quantum_min.as_nanos() as Nanos;
        let grant = acquire_catching_up(c.limiter.as_ref(), want, c.next_at, now, quantum_min);
        let granted = grant.granted;
        c.next_at = grant.next_at;
        if let Some(t) = c.next_at {
            self.limiter_wait
                .record((t - now) as f64 / NANOS_PER_SEC as f64);
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        let mut left = granted;
        // Retries first: they are the oldest work.
        while left > 0 {
            let c = self.campaigns[slot as usize].as_mut()?;
            if c.halt.is_some() {
                break;
            }
            match c.retries.peek() {
                Some(Reverse(r)) if r.not_before <= now => {
                    let r = c.retries.pop().expect("peeked").0;
                    self.dispatch(
                        slot,
                        r.slot,
                        r.device,
                        (r.attempt, r.first_failed),
                        now,
                        unix_sec,
                    );
                    left -= 1;
                }
                _ => break,
            }
        }
        while left > 0 {
            let c = self.campaigns[slot as usize].as_mut()?;
            if c.halt.is_some() {
                break;
            }
            let Some(&jslot) = c.queue.front() else { break };
            let job = self.jobs[jslot as usize].as_mut().expect("queued job");
            let device = job.next;
            job.next += 1;
            let skipped = job.is_done(device);
            if skipped {
                job.done_ahead -= 1;
            }
            // Step over devices skipped at intake, so a finished job is never queued.
            while job.next < job.total() && job.is_done(job.next) {
                job.next += 1;
                job.done_ahead -= 1;
            }
            job.dispatched.store(job.next, Ordering::Relaxed);
            if job.next == job.total() {
                c.queue.pop_front();
            }
            if skipped {
                // Skipped at intake: no send, and its permit goes to the next device.
                continue;
            }
            if let Some(cap) = self.capping.as_mut() {
                if cap.check(&job.job.devices[device as usize], now) == CapDecision::Capped {
                    // A policy outcome: finished without a send; the permit is kept.
                    c.counter.record(unix_sec, Outcome::Capped, 1);
                    self.counters.capped += 1;
                    self.capped_total.increment(1);
                    job.mark_done(device);
                    if job.done_count == job.total() {
                        self.finish_job(jslot);
                    }
                    continue;
                }
            }
            self.dispatch(slot, jslot, device, (0, 0), now, unix_sec);
            left -= 1;
        }
        wake
    }

    fn dispatch(
        &mut self,
        cslot: u32,
        jslot: u32,
        device: u32,
        (attempt, first_failed): (u32, Nanos),
        now: Nanos,
        unix_sec: u64,
    ) {
        let provider = self.jobs[jslot as usize]
            .as_ref()
            .map_or(0, |j| j.job.provider_slot);
        if let Some(reason) = self.provider_halt(provider) {
            // Its provider refused its configuration: no send, the device waits.
            self.halt_campaign(cslot, &reason, now);
            self.hold_for_resume((jslot, device, attempt, first_failed), now);
            return;
        }
        if let Some(until) = self.lane_paused(provider, now) {
            // A job of another provider than its campaign's first (whose lane the turn
            // checked): its own provider asked for a pause. The device waits for it.
            let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
            c.retries.push(Reverse(RetryItem {
                not_before: until,
                slot: jslot,
                device,
                attempt,
                first_failed,
            }));
            return;
        }
        self.lane_sent(provider);
        let job = self.jobs[jslot as usize].as_mut().expect("dispatched job");
        job.in_flight += 1;
        if let Some(n) = self.provider_in_flight.get_mut(usize::from(provider)) {
            *n += 1;
        }
        let future: SendFuture = self.providers.send(&job.job, device as usize);
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        c.in_flight += 1;
        self.in_flight += 1;
        self.counters.sends += 1;
        match future.into_ready() {
            Ok(outcome) => self.complete(
                Completion {
                    slot: jslot,
                    device,
                    attempt,
                    first_failed,
                    outcome,
                    latency_ns: 0,
                },
                now,
                unix_sec,
            ),
            Err(pending) => {
                let tx = self.completions.clone();
                tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    let outcome = pending.await;
                    let _ = tx.send(Completion {
                        slot: jslot,
                        device,
                        attempt,
                        first_failed,
                        outcome,
                        latency_ns: started.elapsed().as_nanos() as u64,
                    });
                });
            }
        }
    }

    fn dead_letter(&mut self, slot: u32, device: u32, reason: String) {
        let job = self.jobs[slot as usize].as_ref().expect("job");
        let letter = Letter {
            kind: DeadLetterKind::Undeliverable,
            partition: job.partition,
            offset: job.offset,
            campaign_id: Some(Arc::from(job.job.campaign_id.as_str())),
            job_id: Some(job.job.job_id.clone()),
            device: Some(device),
            device_token: Some(job.job.devices[device as usize].clone()),
            reason,
            key: None,
            raw: Vec::new(),
        };
        let at = LetterFor {
            slot,
            partition: job.partition,
            offset: job.offset,
            device,
        };
        self.queue_record(Record::DeadLetter(Box::new(letter)), Some(at));
    }

    fn finish_job(&mut self, slot: u32) {
        let job = self.jobs[slot as usize].take().expect("job");
        self.free_jobs.push(slot);
        let cslot = job.campaign;
        let devices = job.total();
        let _ = self.events.send(Event::JobFinished {
            partition: job.partition,
            offset: job.offset,
            devices,
            progress: job.progress,
        });
        if let Some(c) = self.campaigns[cslot as usize].as_mut() {
            c.open_jobs -= 1;
        }
        self.release_campaign_if_idle(cslot);
    }

    /// Starts revoking partitions: their jobs leave the queues (no more dispatches, no
    /// retries); the answer goes once their in-flight sends are back. Several
    /// revocations may overlap, each answered on its own.
    pub fn start_revoke(&mut self, partitions: Vec<i32>, done: oneshot::Sender<()>) {
        for slot in 0..self.jobs.len() as u32 {
            let Some(job) = self.jobs[slot as usize].as_ref() else {
                continue;
            };
            if !partitions.contains(&job.partition) {
                continue;
            }
            if let Some(c) = self.campaigns[job.campaign as usize].as_mut() {
                c.queue.retain(|s| *s != slot);
                c.retries.retain(|Reverse(r)| r.slot != slot);
            }
        }
        self.revoking.push((partitions, done));
        self.check_revoke_done();
    }

    fn is_revoking(&self, partition: i32) -> bool {
        self.revoking.iter().any(|(p, _)| p.contains(&partition))
    }

    fn check_revoke_done(&mut self) {
        let mut k = 0;
        while k < self.revoking.len() {
            let partitions = &self.revoking[k].0;
            let busy = self
                .jobs
                .iter()
                .flatten()
                .any(|j| partitions.contains(&j.partition) && j.in_flight > 0);
            if busy {
                k += 1;
                continue;
            }
            let (partitions, done) = self.revoking.remove(k);
            self.drop_partitions(&partitions);
            let _ = done.send(());
        }
    }

    /// Queues a record for the outcomes stage; `at`: the device it finishes once durable.
    fn queue_record(&mut self, record: Record, at: Option<LetterFor>) {
        let Some(outcomes) = &self.outcomes else {
            if let Some(at) = at {
                self.letter_durable(at);
            }
            return;
        };
        // Behind records still waiting for room, to keep their order.
        let waiting = self.letters.back().is_some_and(|l| l.seq.is_none());
        let (seq, record) = if waiting {
            (None, Some(record))
        } else {
            match outcomes.record(record) {
                Ok(seq) => (Some(seq), None),
                Err(r) => (None, Some(r)),
            }
        };
        self.letters.push_back(AwaitLetter { seq, record, at });
    }

    /// Queues the records that waited for room, and finishes the devices whose letters
    /// are durable.
    fn settle_letters(&mut self) {
        if self.letters.is_empty() {
            return;
        }
        let Some(outcomes) = self.outcomes.clone() else {
            return;
        };
        for l in self.letters.iter_mut() {
            let Some(record) = l.record.take() else {
                continue;
            };
            match outcomes.record(record) {
                Ok(seq) => l.seq = Some(seq),
                Err(r) => {
                    l.record = Some(r);
                    break;
                }
            }
        }
        let durable = outcomes.durable();
        let mut k = 0;
        while k < self.letters.len() {
            match self.letters[k].seq {
                Some(seq) if seq < durable => {
                    let l = self.letters.remove(k).expect("index in range");
                    if let Some(at) = l.at {
                        self.letter_durable(at);
                    }
                }
                _ => k += 1,
            }
        }
    }

    /// A device's dead letter is stored: the device is finished.
    fn letter_durable(&mut self, at: LetterFor) {
        let Some(job) = self.jobs[at.slot as usize].as_mut() else {
            return;
        };
        // The slot may hold another job by now (this one was revoked).
        if job.partition != at.partition || job.offset != at.offset || job.is_done(at.device) {
            return;
        }
        job.mark_done(at.device);
        if job.done_count == job.total() {
            self.finish_job(at.slot);
        }
        self.check_revoke_done();
    }

    /// While letters wait, the driver comes back soon to settle them.
    fn letters_wake(&self, now: Nanos) -> Option<Nanos> {
        (!self.letters.is_empty()).then_some(now + LETTER_POLL.as_nanos() as Nanos)
    }

    /// Forgets the settings of campaigns that had no job for `forget_after`.
    fn sweep_known(&mut self, now: Nanos) {
        if now.saturating_sub(self.last_sweep) < SWEEP_EVERY.as_nanos() as Nanos {
            return;
        }
        self.last_sweep = now;
        let forget = self.config.forget_after.as_nanos() as Nanos;
        let before = self.known.len();
        let by_id = &self.by_id;
        self.known
            .retain(|id, (_, used)| by_id.contains_key(id) || now.saturating_sub(*used) < forget);
        let forgotten = before - self.known.len();
        if forgotten > 0 {
            tracing::debug!(forgotten, "idle campaigns forgotten");
        }
    }

    /// Forgets the jobs of `partitions` (their next owner re-reads them).
    fn drop_partitions(&mut self, partitions: &[i32]) {
        let slots: Vec<u32> = self
            .jobs
            .iter()
            .enumerate()
            .filter_map(|(i, j)| {
                j.as_ref()
                    .filter(|j| partitions.contains(&j.partition))
                    .map(|_| i as u32)
            })
            .collect();
        for slot in &slots {
            let job = self.jobs[*slot as usize].take().expect("job");
            self.free_jobs.push(*slot);
            if let Some(c) = self.campaigns[job.campaign as usize].as_mut() {
                c.open_jobs -= 1;
                c.queue.retain(|s| s != slot);
                c.retries.retain(|Reverse(r)| r.slot != *slot);
            }
        }
        let campaigns: Vec<u32> = (0..self.campaigns.len() as u32).collect();
        for c in campaigns {
            self.release_campaign_if_idle(c);
        }
    }

    /// Stops dispatching; in-flight sends still complete.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Changes whenever a published count would: cheap to compare, unlike [`Self::stats`].
    fn change_marker(&self) -> (u64, u64, u64, usize, usize) {
        let c = &self.counters;
        (
            c.sends,
            c.delivered,
            c.skipped_invalid + c.capped,
            self.active.len(),
            self.in_flight,
        )
    }
}

/// Takes up to `want` permits from `limiter` for a turn at `now`, when the limiter last
/// named `next_at`: as of that instant and of each following one up to `now`, so that a
/// late wake-up keeps the limiter's schedule. Of a longer stall only the last
/// `quantum_min` is made up, and that counts what the limiter makes up by itself
/// ([`RateLimiter::catch_up`], Redis leases): asking it as of `quantum_min` ago would
/// add its catch-up on top, and a stall would come out as twice the burst.
pub fn acquire_catching_up(
    limiter: &dyn RateLimiter,
    want: u32,
    next_at: Option<Nanos>,
    now: Nanos,
    quantum_min: Nanos,
) -> Grant {
    let max_late = quantum_min.saturating_sub(limiter.catch_up());
    let mut asked_at = match next_at {
        Some(t) if t <= now => t.max(now.saturating_sub(max_late)),
        _ => now,
    };
    let mut granted = 0u32;
    loop {
        let grant = limiter.acquire_up_to(want - granted, asked_at);
        granted += grant.granted;
        match grant.next_at {
            Some(t) if t <= now && t > asked_at && granted < want => asked_at = t,
            next_at => return Grant { granted, next_at },
        }
    }
}

/// Converts the scheduler's clock into tokio instants.
#[derive(Clone)]
pub struct TimeBase {
    pub clock: Arc<dyn Clock>,
    origin: tokio::time::Instant,
    origin_nanos: Nanos,
}

impl TimeBase {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        let origin_nanos = clock.now();
        Self {
            clock,
            origin: tokio::time::Instant::now(),
            origin_nanos,
        }
    }

    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    pub fn instant(&self, t: Nanos) -> tokio::time::Instant {
        self.origin + Duration::from_nanos(t.saturating_sub(self.origin_nanos))
    }
}

fn unix_now() -> u64 {
    crate::stats::unix_second(std::time::SystemTime::now())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// How often the driver publishes [`SchedulerStats`].
// Often enough for the bench harness to time a 4 s run to a few percent; a snapshot
// clones at most 100 campaigns' counters.
const STATS_EVERY: Duration = Duration::from_millis(100);

/// A timed wake-up this late costs every campaign about 5% of a second's sends: worth a
/// warning (at most one per 10 s), since only the process or the machine can cause it.
const LATE_WARNING: Duration = Duration::from_millis(50);

/// Drives a [`Scheduler`] until `control` closes (the consumer is gone) and every
/// in-flight send has finished, or until the drain deadline after shutdown.
pub async fn run(
    mut scheduler: Scheduler,
    time: TimeBase,
    mut control: mpsc::Receiver<Control>,
    mut completions: mpsc::UnboundedReceiver<Completion>,
    mut shutdown: crate::shutdown::Shutdown,
    drain_timeout: Duration,
    stats_out: tokio::sync::watch::Sender<SchedulerStats>,
) {
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    let mut control_open = true;
    let mut published = tokio::time::Instant::now();
    let mut published_marker = scheduler.change_marker();
    let mut last_late_warning: Option<tokio::time::Instant> = None;
    loop {
        let now = time.now();
        let sec = unix_now();
        let wake = scheduler.run_round(now, sec);
        let marker = scheduler.change_marker();
        if published.elapsed() >= STATS_EVERY {
            let _ = stats_out.send(scheduler.stats());
            published = tokio::time::Instant::now();
            published_marker = marker;
        }
        if let Some(deadline) = drain_deadline {
            if scheduler.in_flight() == 0 || tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        let q = scheduler.quantum();
        let round_end = time.instant(now) + q;
        let mut wake_at = wake.map_or(round_end, |w| time.instant(w).min(round_end));
        if let Some(d) = drain_deadline {
            wake_at = wake_at.min(d);
        }
        // Counts not yet published go out within STATS_EVERY, also when the next round
        // is a whole idle quantum away (the last sends of a burst).
        if marker != published_marker {
            wake_at = wake_at.min(published + STATS_EVERY);
        }
        tokio::select! {
            biased;
            _ = shutdown.recv(), if drain_deadline.is_none() => {
                scheduler.drain();
                drain_deadline = Some(tokio::time::Instant::now() + drain_timeout);
            }
            Some(done) = completions.recv() => {
                scheduler.complete(done, time.now(), unix_now());
                // Handle every completion already waiting before the next round.
                while let Ok(done) = completions.try_recv() {
                    scheduler.complete(done, time.now(), unix_now());
                }
            }
            msg = control.recv(), if control_open => match msg {
                Some(msg) => {
                    apply_control(&mut scheduler, msg, &time);
                    // Every message already waiting before the next round: a round per
                    // job would cap intake at one job per round.
                    while let Ok(msg) = control.try_recv() {
                        apply_control(&mut scheduler, msg, &time);
                    }
                }
                None => {
                    control_open = false;
                    if drain_deadline.is_none() {
                        scheduler.drain();
                        drain_deadline = Some(tokio::time::Instant::now() + drain_timeout);
                    }
                }
            },
            _ = tokio::time::sleep_until(wake_at) => {
                let late = tokio::time::Instant::now().saturating_duration_since(wake_at);
                metrics::histogram!("scheduler_wake_lateness_seconds").record(late.as_secs_f64());
                let quiet = last_late_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
                if late >= LATE_WARNING && quiet {
                    tracing::warn!(late_ms = late.as_millis() as u64, "the scheduler woke late: every campaign sends less this second");
                    last_late_warning = Some(tokio::time::Instant::now());
                }
            }
        }
    }
    let _ = stats_out.send(scheduler.stats());
}

fn apply_control(scheduler: &mut Scheduler, msg: Control, time: &TimeBase) {
    match msg {
        Control::Job(job) => scheduler.add_job(job, time.now()),
        Control::Settings(s) => scheduler.apply_settings(s, time.now()),
        Control::Revoke { partitions, done } => scheduler.start_revoke(partitions, done),
    }
}

impl std::fmt::Debug for Scheduler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Scheduler")
            .field("stats", &self.stats())
            .finish()
    }
}

#[cfg(test)]
mod answer_tests;
#[cfg(test)]
mod outcome_tests;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;
    use crate::sender::{AnySender, NullSender};

    const SEC: Nanos = NANOS_PER_SEC;
    const MS: Nanos = 1_000_000;

    fn scheduler() -> Scheduler {
        let (completions, _) = mpsc::unbounded_channel();
        let (events, _) = std::sync::mpsc::channel();
        Scheduler::new(
            SchedulerConfig {
                max_active_campaigns: 10,
                max_in_flight: 10_000,
                max_attempts: 5,
                ..SchedulerConfig::default()
            },
            AnySender::Null(NullSender),
            StatsRecorder::new(),
            completions,
            events,
        )
    }

    /// One campaign at 1,000/s with more devices than it can send in the test.
    fn with_campaign() -> Scheduler {
        let mut s = scheduler();
        let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
        let devices = (0..10_000).map(|d| format!("dev-{d}")).collect();
        let job = Job::new("j", "c", devices, payload).unwrap();
        let rate = Rate::per_second(1_000.0).unwrap();
        let settings = CampaignSettings::active("c", rate, Algorithm::Gcra);
        s.add_job(IncomingJob::fresh(job, 0, 0, settings), 0);
        s
    }

    /// Drives rounds as the driver does, each 1 ms after the instant asked for (timer
    /// granularity), until `until`; at `stall_at` the process gets no CPU for `stall`.
    /// Returns the sends and the largest number sent in one round.
    fn drive(s: &mut Scheduler, until: Nanos, stall_at: Nanos, stall: Nanos) -> (u64, u64) {
        let mut now = 0;
        let mut stalled = false;
        let mut largest = 0;
        while now < until {
            let before = s.stats().sends;
            let wake = s.run_round(now, now / SEC);
            largest = largest.max(s.stats().sends - before);
            let round_end = now + s.quantum().as_nanos() as Nanos;
            let mut next = wake.map_or(round_end, |w| w.min(round_end)).max(now) + MS;
            if !stalled && next >= stall_at {
                next += stall;
                stalled = true;
            }
            now = next;
        }
        (s.stats().sends, largest)
    }

    #[test]
    fn a_short_stall_is_made_up_in_full() {
        let mut s = with_campaign();
        let (sends, largest) = drive(&mut s, 2 * SEC, SEC, 8 * MS);
        // 1,000/s over 2 s; the 8 ms without CPU cost nothing.
        assert!((1_999..=2_001).contains(&sends), "{sends}");
        assert!(largest <= 11, "a burst of {largest}");
    }

    #[test]
    fn a_long_stall_loses_only_what_exceeds_quantum_min() {
        let mut s = with_campaign();
        let (sends, largest) = drive(&mut s, 2 * SEC, SEC, 30 * MS);
        // 31 ms late (the stall and the timer's 1 ms): the last 10 ms are made up, 21 ms
        // (21 sends) are not; the run's end may cut one more. Without the catch-up all
        // 31 would be lost (1,969).
        assert!((1_977..=1_980).contains(&sends), "{sends}");
        // The catch-up is one burst of at most rate × quantum_min (+ the send due now).
        assert!((10..=12).contains(&largest), "a burst of {largest}");
    }
}
