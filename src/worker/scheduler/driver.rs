//! The async driver: feeds the synchronous core its jobs, settings and completions,
//! sleeps until the next instant it named, and publishes snapshots; plus the clock
//! mapping ([`TimeBase`]) and the late-turn catch-up rule.

use super::*;

/// Takes up to `want` permits from `limiter` for a turn at `now`, when the limiter last
/// named `next_at`: as of that instant and of each following one up to `now`, so that a
/// late wake-up keeps the limiter's schedule. Of a longer stall only the last `budget`
/// (the scheduler's: `quantum_min` plus the wake slack) is made up, and that counts what
/// the limiter makes up by itself ([`RateLimiter::catch_up`], Redis leases): asking it
/// as of `budget` ago would add its catch-up on top, and a stall would come out as
/// twice the burst.
pub fn acquire_catching_up(
    limiter: &dyn RateLimiter,
    want: u32,
    next_at: Option<Nanos>,
    now: Nanos,
    budget: Nanos,
) -> Grant {
    let max_late = budget.saturating_sub(limiter.catch_up());
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
///
/// An instant is mapped from the distance to the clock's `now`, read at the time of the
/// call, never from a fixed origin: quanta's TSC clock and tokio's (the OS monotonic
/// clock, which NTP slews) run apart by tens of ppm, and from a fixed origin that gap
/// grows without end. A clock ahead of tokio's then made every sleep late by the whole
/// gap (past `quantum_min`, permits lost at every wake); one behind made the driver wake
/// before the instant it named and spin until its clock caught up, more of the time the
/// longer the worker ran.
#[derive(Clone)]
pub struct TimeBase {
    pub clock: Arc<dyn Clock>,
    /// `None`: the system's wall clock. `Some(origin)`: the Unix time at the clock's 0,
    /// for a virtual clock, whose seconds must end when its own time says (a second's
    /// edge read off the real wall clock held permits at random virtual instants).
    wall_origin: Option<Duration>,
}

impl TimeBase {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        Self {
            clock,
            wall_origin: None,
        }
    }

    /// A virtual clock whose 0 is the Unix time `origin`.
    pub fn with_wall_origin(clock: Arc<dyn Clock>, origin: Duration) -> Self {
        Self {
            clock,
            wall_origin: Some(origin),
        }
    }

    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    /// Time since the Unix epoch when the clock read `now`.
    pub fn wall(&self, now: Nanos) -> Duration {
        match self.wall_origin {
            Some(origin) => origin + Duration::from_nanos(now),
            None => std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default(),
        }
    }

    /// The tokio instant at which the clock will read `t` (now, if it already does).
    pub fn instant(&self, t: Nanos) -> tokio::time::Instant {
        let base = tokio::time::Instant::now();
        base + Duration::from_nanos(t.saturating_sub(self.clock.now()))
    }
}

/// How often the driver publishes [`SchedulerStats`]: often enough for the bench
/// harness to time a 4 s run to a few percent.
const STATS_EVERY: Duration = Duration::from_millis(100);

/// How often the per-campaign list in it is rebuilt while only counts changed. It reads
/// every held campaign and job (at 1,000 campaigns, 2% of the worker's CPU ten times a
/// second); the API publishes its figures once a second anyway. A registration, a
/// settings change, an activation, a release, a new effective rate or a halt rebuilds
/// it at the next publish.
const CAMPAIGNS_EVERY: Duration = Duration::from_millis(500);

/// A timed wake-up this late costs every campaign about 5% of a second's sends: worth a
/// warning (at most one per 10 s), since only the process or the machine can cause it.
const LATE_WARNING: Duration = Duration::from_millis(50);

/// Drives a [`Scheduler`] until `stop` is cancelled and every in-flight send has
/// finished, or until the drain deadline after that.
pub async fn run(
    mut scheduler: Scheduler,
    time: TimeBase,
    mut control: mpsc::Receiver<Control>,
    mut completions: mpsc::UnboundedReceiver<Completion>,
    stop: tokio_util::sync::CancellationToken,
    drain_timeout: Duration,
    stats_out: tokio::sync::watch::Sender<SchedulerStats>,
) {
    let mut drain_deadline: Option<tokio::time::Instant> = None;
    let mut control_open = true;
    let mut published = tokio::time::Instant::now();
    let mut published_marker = scheduler.change_marker();
    let mut last_late_warning: Option<tokio::time::Instant> = None;
    let mut listed = (published, scheduler.shape_marker());
    loop {
        let now = time.now();
        // One reading for the round's second and where it ends.
        let wall = time.wall(now);
        let sec = wall.as_secs();
        scheduler.set_wall(now, wall.as_nanos());
        let wake = scheduler.run_round(now, sec);
        scheduler.counters.round_nanos += time.now().saturating_sub(now);
        let marker = scheduler.change_marker();
        if published.elapsed() >= STATS_EVERY {
            let shape = scheduler.shape_marker();
            let reuse = (listed.0.elapsed() < CAMPAIGNS_EVERY && listed.1 == shape)
                .then(|| stats_out.borrow().campaigns.clone());
            if reuse.is_none() {
                listed = (tokio::time::Instant::now(), shape);
            }
            let _ = stats_out.send(scheduler.stats_with(reuse));
            published = tokio::time::Instant::now();
            published_marker = marker;
        }
        if let Some(deadline) = drain_deadline {
            if scheduler.in_flight() == 0 || tokio::time::Instant::now() >= deadline {
                break;
            }
        }
        let unpublished = (marker != published_marker).then_some(published);
        let wake_at = wake_at(&scheduler, &time, now, wake, drain_deadline, unpublished);
        tokio::select! {
            biased;
            _ = stop.cancelled(), if drain_deadline.is_none() => {
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
                // Every sender is gone (the worker is stopping): stop polling it.
                None => control_open = false,
            },
            _ = tokio::time::sleep_until(wake_at) => {
                note_lateness(&mut scheduler, wake_at, &mut last_late_warning);
            }
        }
    }
    let _ = stats_out.send(scheduler.stats());
}

/// When to run the next round without news: [`Scheduler::next_round_at`], at the latest
/// the drain deadline; and counts not yet published (`unpublished`: the last publish)
/// go out within [`STATS_EVERY`], also when the next round is a whole idle quantum away
/// (the last sends of a burst).
fn wake_at(
    scheduler: &Scheduler,
    time: &TimeBase,
    now: Nanos,
    wake: Option<Nanos>,
    drain_deadline: Option<tokio::time::Instant>,
    unpublished: Option<tokio::time::Instant>,
) -> tokio::time::Instant {
    let mut wake_at = time.instant(scheduler.next_round_at(now, wake));
    if let Some(d) = drain_deadline {
        wake_at = wake_at.min(d);
    }
    if let Some(published) = unpublished {
        wake_at = wake_at.min(published + STATS_EVERY);
    }
    wake_at
}

/// Records how late a timed wake-up came, warning at most once per 10 s.
fn note_lateness(
    scheduler: &mut Scheduler,
    wake_at: tokio::time::Instant,
    last_warning: &mut Option<tokio::time::Instant>,
) {
    let late = tokio::time::Instant::now().saturating_duration_since(wake_at);
    scheduler.counters.wake_lateness.record(late.as_secs_f64());
    let quiet = last_warning.is_none_or(|t| t.elapsed() >= Duration::from_secs(10));
    if late >= LATE_WARNING && quiet {
        tracing::warn!(
            late_ms = late.as_millis() as u64,
            "the scheduler woke late: every campaign sends less this second"
        );
        *last_warning = Some(tokio::time::Instant::now());
    }
}

fn apply_control(scheduler: &mut Scheduler, msg: Control, time: &TimeBase) {
    match msg {
        Control::Job(job) => scheduler.add_job(job, time.now()),
        Control::Settings(s) => scheduler.apply_settings(s, time.now()),
        Control::App(u) => scheduler.apply_app(u, time.now(), super::unix_now()),
        Control::Plan { campaign, rate } => scheduler.apply_plan(campaign, rate, time.now()),
        Control::Revoke { partitions, done } => scheduler.start_revoke(partitions, done),
    }
}
