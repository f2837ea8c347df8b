//! The 1/N time-slice scheduler: one task shares each quantum among up to
//! `max_active_campaigns` campaigns.
//!
//! A round lasts one quantum `q` (between `quantum_min` and `quantum_max`, shorter when
//! the summed rate is high). In a round every active campaign gets one turn, starting
//! from a rotating position: it asks its limiter for as many permits as it has ready
//! work and in-flight room ([`RateLimiter::acquire_up_to`]), dispatches that many sends
//! without waiting for them, and yields. Between rounds the task sleeps until the
//! earliest instant a limiter named, a retry falls due, or the next round, so it never
//! spins; and at least `wake_slack` ([`Scheduler::next_round_at`]), so that one wake-up
//! serves every campaign due within it.
//!
//! The core ([`Scheduler`]) is synchronous and owns all its state: no locks, and no
//! allocation per send with the null sender (the send's future is ready at once and
//! handled inline). The async driver ([`run`]) feeds it jobs, completions and settings.
//!
//! Timer wake-ups are only as fine as ~1 ms, so a turn usually runs a little after the
//! instant its limiter named. A late turn asks the limiter as of that instant (and of
//! each following one up to now), so lateness is not lost from the rate: sends keep the
//! limiter's schedule, shifted by the wake-up delay. Of a longer stall (a process that
//! got no CPU), only the last `quantum_min` plus the wake slack is made up, counting
//! what the limiter makes up by itself ([`acquire_catching_up`]): a stall never turns
//! into a burst larger than `rate × (quantum_min + slack)`, and costs the rate only what
//! exceeds that (the slack delays turns on purpose, so it is not the stall's to spend).
//!
//! Layout: this file holds the state ([`Scheduler`], its campaigns) and its snapshot;
//! `messages` what flows in and out; `registry` settings, jobs and campaign slots;
//! `rounds` the quantum, turns and dispatch; `answers` what each answer does; `caps`
//! the max-min shares under caps; `lanes` each provider's adaptive ceiling; `outlet`
//! dead letters, finished jobs, revocation and drain; `jobs` the per-job bitmap and
//! retries; `driver` the async loop and the clock.

use crate::capping::{CapDecision, FrequencyCap};
use crate::job::Job;
use crate::limiter::hierarchical::HierarchicalLimiter;
use crate::limiter::LimiterScope;
use crate::limiter::{
    Algorithm, Clock, DynLimiter, Grant, Nanos, Rate, RateLimiter, NANOS_PER_SEC,
};
mod answers;
mod app_gates;
mod caps;
mod driver;
mod due;
mod edge;
mod jobs;
mod lanes;
mod lifecycle;
mod live;
mod messages;
mod origins;
mod outlet;
mod policy;
mod prefetch;
mod ramp;
mod refusals;
mod registry;
mod rounds;
mod waits;
mod wheel;
mod windows;

pub use crate::limiter::factory::{LimiterFactory, LocalLimiters};
pub use app_gates::{AppState, AppUpdate};
pub use driver::{acquire_catching_up, run, TimeBase};
use jobs::{ActiveJob, RetryItem};
pub use live::{CampaignLive, SchedulerStats};
pub use messages::{CampaignSettings, Completion, Control, Event, IncomingJob};
pub use ramp::RAMP_TICK;
pub use waits::{WaitHistogram, WAIT_BUCKETS};

pub use lanes::{LanePoint, ProviderLive, HISTORY_S};
pub use origins::{OriginLive, MAX_ORIGIN_LANES, ORIGIN_IDLE};
pub use windows::MAX_ZONES_SHOWN;

pub use answers::{MISMATCH_MIN, MISMATCH_WINDOW, PROBE_IN_FLIGHT};
pub use refusals::{MAX_HALT_RESUMES, REFUSAL_MIN, REFUSAL_WINDOW};

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

/// The shipped `worker.wake_slack_ms`: a send leaves at most 4 ms after its permit
/// (less above [`SENDS_PER_WAKE`] / 4 ms = 50,000/s summed), and a late turn makes up
/// `quantum_min` on top; what the wake-ups it gathers save is in docs/BENCHMARKS.md.
pub const DEFAULT_WAKE_SLACK_MS: u64 = 4;

/// The most sends one wake-up gathers by its slack, over all campaigns (2 ms at
/// 100,000/s, as measured in docs/BENCHMARKS.md): a larger burst only fills the
/// in-flight pool and the providers' connections sooner.
pub const SENDS_PER_WAKE: f64 = 200.0;

/// The shipped `worker.second_edge_ms`: more than the slack plus the timer's usual
/// lateness (up to 1 ms), so that a permit due before the held part leaves before the
/// second ends; half of `quantum_min`, so that the held permits are made up in full.
pub const DEFAULT_SECOND_EDGE_MS: u64 = 5;

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
    /// Caps over all apps of a kind (`apps.max_rate_<kind>`), between the global cap
    /// and each app's own.
    pub kind_caps: Vec<(crate::provider::ProviderKind, Rate)>,
    /// Where campaign limiters come from.
    pub limiters: Arc<dyn LimiterFactory>,
    /// A campaign's settings are forgotten once it has had no job this long.
    pub forget_after: Duration,
    /// How often every active campaign is visited whatever it named (`None`: 1 s; zero:
    /// every round, as a baseline for the benchmarks).
    pub visit_all_every: Option<Duration>,
    /// A timed round comes at least this long after the last one, so that one wake-up
    /// serves every campaign due within it ([`Scheduler::next_round_at`]).
    pub wake_slack: Duration,
    /// A permit due this close to a wall-clock second's end leaves at the next second's
    /// start, so that each second counts the permits of one 1-s window (`edge`).
    pub second_edge: Duration,
    /// The delivery policy's worker-wide defaults (`[limiter]`).
    pub policy: PolicyDefaults,
}

/// `[limiter]`'s delivery-policy settings.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PolicyDefaults {
    /// A campaign's ramp-up when it sets none, in seconds (0: none).
    pub ramp_up_s: f64,
    /// Where a ramp starts, as a fraction of the full rate.
    pub ramp_from: f64,
    /// A campaign's `start_at` is put off by up to this much, the same for a campaign on
    /// every worker, so that campaigns scheduled for one instant do not start together.
    pub start_jitter: Duration,
    /// How far `critical` campaigns may go over a provider-side cap, as a fraction of it.
    pub critical_overdraft: f64,
}

impl Default for PolicyDefaults {
    fn default() -> Self {
        Self {
            ramp_up_s: 0.0,
            ramp_from: crate::job::policy::DEFAULT_RAMP_FROM,
            start_jitter: Duration::ZERO,
            critical_overdraft: 0.0,
        }
    }
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
            kind_caps: Vec::new(),
            limiters: Arc::new(LocalLimiters),
            forget_after: Duration::from_secs(600),
            visit_all_every: None,
            wake_slack: Duration::from_millis(DEFAULT_WAKE_SLACK_MS),
            second_edge: Duration::from_millis(DEFAULT_SECOND_EDGE_MS),
            policy: PolicyDefaults::default(),
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
            .field("kind_caps", &self.kind_caps)
            .field("forget_after", &self.forget_after)
            .field("wake_slack", &self.wake_slack)
            .field("second_edge", &self.second_edge)
            .field("policy", &self.policy)
            .finish_non_exhaustive()
    }
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
    /// The provider its next sends go through (its oldest work's, set at each turn):
    /// the cap whose share it takes, and the provider a turn asks for room and permits.
    /// Each send still counts against its own job's provider.
    provider: u16,
    /// Stopped by a provider's configuration error until an operator resumes it.
    halt: Option<answers::HaltState>,
    /// An answer has shown that the provider takes this campaign's sends; until then at
    /// most [`PROBE_IN_FLIGHT`] are in flight.
    confirmed: bool,
    mismatch: answers::MismatchWindow,
    /// Refusals judged per origin, and the devices that halted it.
    refusals: refusals::Refusals,
    /// Jobs whose `not_before` is ahead: (unix ms, job slot), soonest first.
    scheduled: BinaryHeap<Reverse<(i64, u32)>>,
    /// Its `start_at` is ahead: it sends nothing and takes no share under a cap.
    waiting_start: bool,
    /// The soonest `expires_at` among its jobs' own (unix ms).
    next_job_expiry: Option<i64>,
    expired: u64,
    cancelled: u64,
    /// The largest `campaign_total_devices` its jobs stated.
    total_devices: Option<u64>,
    /// In the ready list: visited next round.
    ready: bool,
    /// In the room waiters: below its share, it found the pool or its provider full.
    waiting_room: bool,
    /// Its ramp-up while it climbs to its full rate.
    ramp: Option<ramp::Ramp>,
    /// Its finish-by plan on this worker, under its send_rate.
    plan: Option<Rate>,
    /// Since when it has had work but (almost) no share: the classes above took the cap.
    starved_since: Option<Nanos>,
    /// The earliest close (unix ms) of a local send window its queued jobs are in.
    next_close_ms: Option<i64>,
    /// Served before a lower class under the global cap (its limiter's `set_first`).
    first_under_global: bool,
}

impl Campaign {
    fn has_work(&self) -> bool {
        self.open_jobs > 0
    }
}

/// The lanes shown, and the (judged second, lanes, live changes) they were built at.
type LanesShown = ((u64, usize, u64), Arc<Vec<ProviderLive>>);

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
    /// The gates of the app slots (from `providers.apps().base()` on).
    app_gates: Vec<app_gates::AppGate>,
    /// The caps over all apps of a kind.
    kind_caps: Vec<(crate::provider::ProviderKind, HierarchicalLimiter)>,
    /// Each provider's lane (adaptive ceiling, sends this second, history), by slot.
    lanes: Vec<lanes::Lane>,
    /// Each Web Push origin's lane, paced at dispatch.
    origins: origins::OriginLanes,
    /// The second the lanes last judged.
    lanes_second: u64,
    /// Summed send_rate per provider (kept to reuse its buffer).
    lane_demand: Vec<f64>,
    halts_total: metrics::Counter,
    stats: StatsRecorder,
    global: Option<HierarchicalLimiter>,
    /// Whether the last rebalance set fair shares (a cap applied then).
    shares_applied: bool,
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
    /// Partitions being revoked, and the jobs held until their revocation completes.
    revoking: outlet::Revocations,
    draining: bool,
    /// Where dead letters and invalid tokens go (none in unit tests: marked at once).
    outcomes: Option<Outcomes>,
    /// Records waiting for room in the outcomes queue or for their write; a device
    /// with a dead letter counts as done only once its letter is durable.
    letters: VecDeque<AwaitLetter>,
    counters: SchedulerStats,
    retries_total: metrics::Counter,
    /// The latest `now` seen, for rate changes made outside a call that carries one.
    now_hint: Nanos,
    in_round: bool,
    /// Campaigns that went idle during a round (capacity kept between rounds).
    deferred_release: Vec<u32>,
    /// The per-device frequency cap, when enabled.
    capping: Option<FrequencyCap>,
    skipped_total: metrics::Counter,
    capped_total: metrics::Counter,
    expired_total: metrics::Counter,
    cancelled_total: metrics::Counter,
    /// The wall clock at a monotonic instant: (now, unix ms), set by the driver.
    wall: (Nanos, i64),
    /// Where wall-clock seconds end, and the held part of each.
    edge: edge::SecondEdge,
    /// Active campaigns to visit next round (each once: `Campaign::ready`).
    ready: Vec<u32>,
    /// Campaigns cut below their share by a full pool or provider, longest waiting
    /// first: they take freed room before the ready list (`Campaign::waiting_room`).
    room_waiters: VecDeque<u32>,
    /// Active campaigns asleep until an instant.
    sleeping: wheel::WakeWheel,
    /// The slots a round's wake-up drain found due (kept for its capacity).
    woken: Vec<u32>,
    /// When every active campaign was last visited (the net under a missed event).
    last_visit_all: Nanos,
    /// Summed send_rate of the active campaigns; `None`: to be summed again.
    rate_sum: std::cell::Cell<Option<f64>>,
    /// The lanes as the API shows them, and what they were built at (judged second,
    /// lanes, live changes): rebuilt once a second at most, not per snapshot, since
    /// each lane carries minutes of history and an app platform has many lanes.
    lanes_shown: std::cell::RefCell<Option<LanesShown>>,
    /// Campaigns climbing their ramp-up, and when their rates are next set.
    ramping: Vec<u32>,
    next_ramp_at: Nanos,
    /// Finish-by plans by campaign, kept while a campaign is not held.
    plans: HashMap<Arc<str>, Rate>,
    /// What `critical` campaigns may send over each provider's cap, by slot.
    overdraft_caps: Vec<Option<HierarchicalLimiter>>,
    /// The lowest class (highest rank) sending through each provider, by slot, as of
    /// the last rebalance: the classes above it are served first there.
    lowest_rank: Vec<u8>,
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
        let second_edge = config.second_edge.as_nanos() as Nanos;
        let global = config
            .global_rate
            .map(|r| caps::cap_limiter(r, quantum_min));
        let kind_caps = config
            .kind_caps
            .iter()
            .map(|&(k, r)| (k, caps::cap_limiter(r, quantum_min)))
            .collect();
        let provider_caps = providers
            .iter()
            .map(|p| p.max_rate.map(|r| caps::cap_limiter(r, quantum_min)))
            .collect();
        let overdraft = config.policy.critical_overdraft;
        let overdraft_caps = providers
            .iter()
            .map(|p| caps::overdraft_limiter(p.max_rate, overdraft, quantum_min))
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
            origins: Default::default(),
            lanes_second: 0,
            lane_demand: Vec::new(),
            providers,
            provider_halts: Vec::new(),
            app_gates: Vec::new(),
            kind_caps,
            halts_total: metrics::counter!("campaign_halts_total"),
            stats,
            global,
            shares_applied: false,
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
            revoking: Default::default(),
            draining: false,
            outcomes: None,
            letters: VecDeque::new(),
            counters: SchedulerStats::default(),
            retries_total: metrics::counter!("retries_total"),
            now_hint: 0,
            in_round: false,
            deferred_release: Vec::new(),
            capping: None,
            skipped_total: metrics::counter!("skipped_invalid_total"),
            capped_total: metrics::counter!("capped_total"),
            expired_total: metrics::counter!("expired_total"),
            cancelled_total: metrics::counter!("cancelled_total"),
            wall: (0, 0),
            edge: edge::SecondEdge::new(second_edge),
            ready: Vec::new(),
            room_waiters: VecDeque::new(),
            sleeping: wheel::WakeWheel::default(),
            woken: Vec::new(),
            last_visit_all: 0,
            rate_sum: std::cell::Cell::new(None),
            lanes_shown: std::cell::RefCell::new(None),
            ramping: Vec::new(),
            next_ramp_at: 0,
            plans: HashMap::new(),
            overdraft_caps,
            lowest_rank: Vec::new(),
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
        self.stats_with(None)
    }

    /// The snapshot, reusing `campaigns` when given: its counts are then as old as it
    /// is. Building the list reads every held campaign and job, cold at 1,000
    /// campaigns; the scalar counts cost nothing.
    pub fn stats_with(&self, campaigns: Option<Arc<Vec<CampaignLive>>>) -> SchedulerStats {
        let campaigns = campaigns.unwrap_or_else(|| Arc::new(self.campaigns_live()));
        SchedulerStats {
            active_campaigns: self.active.len(),
            waiting_campaigns: self.waiting.len(),
            in_flight: self.in_flight,
            open_jobs: self.jobs.len() - self.free_jobs.len(),
            max_active_seen: self.counters.max_active_seen,
            sends: self.counters.sends,
            rounds: self.counters.rounds,
            turns: self.counters.turns,
            round_nanos: self.counters.round_nanos,
            rate_changes: self.counters.rate_changes,
            live_changes: self.counters.live_changes,
            limiter_waits: self.counters.limiter_waits.clone(),
            wake_lateness: self.counters.wake_lateness.clone(),
            delivered: self.counters.delivered,
            skipped_invalid: self.counters.skipped_invalid,
            capped: self.counters.capped,
            campaigns,
            providers: self.lanes_shown(),
        }
    }

    /// The lanes for the API, from the cache while nothing they show has moved.
    fn lanes_shown(&self) -> Arc<Vec<ProviderLive>> {
        let at = (
            self.lanes_second,
            self.lanes.len(),
            self.counters.live_changes,
        );
        let mut shown = self.lanes_shown.borrow_mut();
        if let Some((built, lanes)) = shown.as_ref() {
            if *built == at {
                return Arc::clone(lanes);
            }
        }
        let lanes = Arc::new(self.lanes_live(self.now_hint, unix_ms()));
        *shown = Some((at, Arc::clone(&lanes)));
        lanes
    }

    /// Changes whenever a held campaign's figures other than its counts may have.
    pub fn shape_marker(&self) -> (u64, u64) {
        (self.counters.rate_changes, self.counters.live_changes)
    }

    fn campaigns_live(&self) -> Vec<CampaignLive> {
        let mut held = vec![0u64; self.campaigns.len()];
        for j in self.jobs.iter().flatten() {
            if let Some(h) = held.get_mut(j.campaign as usize) {
                *h += u64::from(j.total() - j.done_count);
            }
        }
        self.campaigns
            .iter()
            .enumerate()
            .filter_map(|(slot, c)| c.as_ref().map(|c| (slot, held[slot], c)))
            .map(|(slot, held_devices, c)| CampaignLive {
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
                waiting_for_app: (c.open_jobs > 0)
                    .then(|| self.waiting_for_app(c.provider))
                    .flatten(),
                app_id: self.app_key(c.provider).map(|k| k.app_id.clone()),
                active: c.active,
                sent: c.sent,
                failed: c.failed,
                retried: c.retried,
                invalid: c.invalid,
                in_flight: c.in_flight,
                open_jobs: c.open_jobs,
                expired: c.expired,
                cancelled: c.cancelled,
                held_devices,
                total_devices: c.total_devices,
                waiting_start: c.waiting_start,
                priority: c.settings.priority,
                ramp: c.ramp.map(|r| r.fraction(self.now_hint)),
                starved_ms: self.starved_ms(c),
                finish_by_ms: c.settings.finish_by_ms,
                zones: self.zones_of(slot as u32),
            })
            .collect()
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

fn unix_now() -> u64 {
    crate::stats::unix_second(std::time::SystemTime::now())
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
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
mod app_gate_tests;
#[cfg(test)]
mod driver_tests;
#[cfg(test)]
mod lifecycle_tests;
#[cfg(test)]
mod origin_tests;
#[cfg(test)]
mod outcome_tests;
#[cfg(test)]
mod pacing_tests;
#[cfg(test)]
mod policy_tests;
#[cfg(test)]
mod provider_tests;
#[cfg(test)]
mod refusal_tests;
#[cfg(test)]
mod revoke_tests;
#[cfg(test)]
mod room_tests;
#[cfg(test)]
mod window_tests;

#[cfg(test)]
pub(super) mod tests {
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
        with_campaign_at(1_000.0)
    }

    /// One campaign "c" at `rate` with 10,000 devices.
    pub(super) fn with_campaign_at(rate: f64) -> Scheduler {
        let mut s = scheduler();
        let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
        let devices = (0..10_000).map(|d| format!("dev-{d}")).collect();
        let job = Job::new("j", "c", devices, payload).unwrap();
        let rate = Rate::per_second(rate).unwrap();
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
        // 31 ms late (the stall and the timer's 1 ms): the last 14 ms (quantum_min and
        // the 4 ms slack) are made up, 17 ms (17 sends) are not; the run's end may cut
        // one more. Without the catch-up all 31 would be lost (1,969).
        assert!((1_981..=1_984).contains(&sends), "{sends}");
        // The catch-up is one burst of at most rate × (quantum_min + slack) (+ the send
        // due now).
        assert!((14..=16).contains(&largest), "a burst of {largest}");
    }
}
