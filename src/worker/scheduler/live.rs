//! The snapshot the worker publishes for the API, metrics and tests.

use super::*;

/// Counters the worker exposes (read by metrics, the API and tests).
#[derive(Debug, Default, Clone, PartialEq)]
pub struct SchedulerStats {
    pub active_campaigns: usize,
    pub waiting_campaigns: usize,
    pub max_active_seen: usize,
    pub in_flight: usize,
    pub open_jobs: usize,
    pub sends: u64,
    /// Rounds run since the worker started.
    pub rounds: u64,
    /// Campaign turns run since the worker started (a round holds one per campaign due).
    pub turns: u64,
    /// Time spent in rounds since the worker started, by the scheduler's clock: its
    /// own cost, apart from the intake and the runtime around it.
    pub round_nanos: u64,
    /// Campaigns registered and settings applied since the worker started: a campaign's
    /// rate in `campaigns` can have changed only when this did.
    pub rate_changes: u64,
    /// Changes to a held campaign's figures other than its counts (activation, release,
    /// a new effective rate, a halt or its end); with `rate_changes`, what makes the
    /// driver rebuild `campaigns` at once rather than on its period.
    pub live_changes: u64,
    /// How long limiters asked campaigns to wait for their next permit.
    pub limiter_waits: WaitHistogram,
    /// How late timed rounds woke (kept here, not through the metrics facade, for the
    /// same reason as `limiter_waits`: a few hundred records a second).
    pub wake_lateness: WaitHistogram,
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
    /// Devices not sent by its expiry, and not sent because it was cancelled.
    pub expired: u64,
    pub cancelled: u64,
    /// Devices of its jobs held here and not finished yet (in flight included).
    pub held_devices: u64,
    /// The campaign's size as its jobs state it (`campaign_total_devices`).
    pub total_devices: Option<u64>,
    /// Its `start_at` is still ahead.
    pub waiting_start: bool,
    /// Why its next sends wait for their app (`waiting for app X: …`), when they do.
    pub waiting_for_app: Option<Arc<str>>,
    /// The registered app its next sends go through, when they go through one.
    pub app_id: Option<Arc<str>>,
    /// Its priority class.
    pub priority: crate::job::PriorityClass,
    /// While it ramps up: the fraction of its full rate it is allowed now (0–1).
    pub ramp: Option<f64>,
    /// How long it has had work but (almost) no share under a cap, because classes
    /// above it took the cap: `None` while it gets its share.
    pub starved_ms: Option<u64>,
    /// Its `finish_by` (unix ms), which the planner plans its rate from.
    pub finish_by_ms: Option<i64>,
    /// The zones of its held jobs, under local-time rules (a few dozen at most).
    pub zones: Vec<crate::job::window::Zone>,
}
