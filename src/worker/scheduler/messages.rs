//! What flows into and out of the scheduler: a campaign's settings, a job from intake,
//! the control messages, the events to intake, and a send's completion.

use super::*;
use crate::job::PriorityClass;

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
    /// Unix milliseconds before which nothing of it is sent.
    pub start_at_ms: Option<i64>,
    /// Unix milliseconds from which its unsent devices are counted `expired`.
    pub expires_at_ms: Option<i64>,
    /// Cancelled (final): its jobs, and later ones, are finished without a send.
    pub cancelled: bool,
    /// Under a shared cap, served strictly before the classes below it.
    pub priority: PriorityClass,
    /// Seconds its rate takes to climb to the full rate; `None`: `limiter.ramp_up_s`.
    pub ramp_up_s: Option<f64>,
    /// The fraction of the full rate a ramp starts at; `None`: `limiter.ramp_from`.
    pub ramp_from: Option<f64>,
    /// Unix milliseconds by which it should be finished: its rate is then planned from
    /// what remains ([`Control::Plan`]), with `rate` as the most it may send at.
    pub finish_by_ms: Option<i64>,
    /// Its recipients' local-time rules, applied in the zone each job states.
    pub local: crate::job::window::LocalPolicy,
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
            start_at_ms: None,
            expires_at_ms: None,
            cancelled: false,
            priority: PriorityClass::Normal,
            ramp_up_s: None,
            ramp_from: None,
            finish_by_ms: None,
            local: Default::default(),
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
    /// An app slot's provider, or why its jobs wait (the app router's word).
    App(super::AppUpdate),
    /// A finish-by campaign's planned rate on this worker (`None`: no plan, its
    /// send_rate), from the planner's reading of what remains.
    Plan {
        campaign: Arc<str>,
        rate: Option<Rate>,
    },
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
    pub(super) slot: u32,
    pub(super) device: u32,
    pub(super) attempt: u32,
    /// When its first attempt failed (0 before any failure).
    pub(super) first_failed: Nanos,
    pub(super) outcome: SendOutcome,
    /// From dispatch to answer.
    pub(super) latency_ns: u64,
    /// The epoch of its provider's slot when it left (an app's credentials rotate).
    pub(super) epoch: u32,
}
