//! The worker: wires consumer → scheduler → sender → stats flusher, and shuts them down
//! in the order that loses nothing.
//!
//! - [`consumer`]: intake, the Kafka consumer-group member (own thread): poll, decode,
//!   rebalance ([`rebalance`]), offsets ([`offsets`]), pauses, parking ([`backlog`],
//!   [`refetch`]).
//! - [`enrich`]: a job's lookups (campaign settings, progress, hygiene, shared cap);
//!   `settings_loader` and `progress_loader` answer the lookups waiting together, in
//!   batches (`batch`).
//! - [`scheduler`]: the 1/N time-slice scheduler and its async driver.
//! - [`outcomes`]: dead letters, invalid tokens and committed offsets, written by one
//!   task from a bounded queue.
//!
//! Shutdown ([`crate::shutdown::Phases`], one cancellation token cancelled a phase at a
//! time): cancelling intake stops fetching and dispatching; the scheduler waits for its
//! in-flight sends (up to `drain_timeout`); the consumer flushes progress and commits
//! what is durable; the outcomes writer writes what is queued (up to 10 s); the
//! publisher deletes this worker's rows; then the flusher makes its final flush and the
//! campaign watcher stops.

mod app_router;
pub mod backlog;
mod batch;
pub mod consumer;
pub mod enrich;
pub mod message;
pub mod offsets;
pub mod outcomes;
pub mod planner;
pub mod progress_loader;
mod publish;
mod rebalance;
pub mod refetch;
mod retry;
pub mod scheduler;
mod settings_loader;

use crate::config::{CappingScope, Settings};
use crate::limiter::{Clock, MonotonicClock};
use crate::provider::Providers;
use crate::shutdown::Phases;
use crate::stats::{Flusher, FlusherConfig, StatsRecorder};
use crate::store::campaigns::{Campaign, CampaignDefaults, CampaignStatus};
use crate::store::listen::{CampaignWatcher, WatcherConfig};
use consumer::{ConsumerParams, ConsumerStats};
use scheduler::{CampaignSettings, Control, Scheduler, SchedulerConfig, SchedulerStats, TimeBase};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// Errors starting or stopping the worker.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error(transparent)]
    Broker(#[from] crate::broker::BrokerError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Sender(#[from] crate::sender::SenderError),
    #[error(transparent)]
    Provider(#[from] crate::provider::ProviderError),
    #[error(transparent)]
    Hygiene(#[from] crate::hygiene::HygieneError),
    #[error(transparent)]
    Capping(#[from] crate::capping::CapError),
    #[error("a worker task failed: {0}")]
    Task(String),
    #[error(transparent)]
    Distributed(#[from] crate::distributed::DistributedError),
}

/// The defaults for campaigns created by a job that names no rate or algorithm.
pub fn campaign_defaults(settings: &Settings) -> CampaignDefaults {
    CampaignDefaults {
        send_rate: settings.limiter.default_rate(),
        algorithm: settings.limiter.algorithm,
        burst: settings.limiter.burst,
    }
}

/// Converts stored settings into the scheduler's; a stored rate is always valid (the
/// table's CHECK constraint), the fallback only guards a hand-edited row.
pub fn to_settings(c: &Campaign, fallback: &CampaignDefaults) -> CampaignSettings {
    CampaignSettings {
        id: Arc::from(c.id.as_str()),
        rate: c.rate().unwrap_or(fallback.send_rate),
        algorithm: c.algorithm,
        burst: c.burst,
        paused: c.status == CampaignStatus::Paused,
        halted: c.status == CampaignStatus::Halted,
        limiter_scope: c.limiter_scope,
        weight: c.weight,
        start_at_ms: c.start_at.map(|t| t.timestamp_millis()),
        expires_at_ms: c.expires_at.map(|t| t.timestamp_millis()),
        cancelled: c.status == CampaignStatus::Cancelled,
        priority: c.priority,
        ramp_up_s: c.ramp_up_s,
        ramp_from: c.ramp_from,
        finish_by_ms: c.finish_by.map(|t| t.timestamp_millis()),
        local: c.local,
    }
}

/// A running worker.
pub struct Worker {
    /// The stop signal; [`Worker::shutdown`] cancels it a phase at a time, and dropping
    /// the worker cancels it all at once.
    phases: Phases,
    consumer: std::thread::JoinHandle<()>,
    scheduler: JoinHandle<()>,
    outcome_writer: JoinHandle<()>,
    flusher_task: JoinHandle<Result<(), crate::stats::StatsError>>,
    _watcher: CampaignWatcher,
    pub flusher: Flusher,
    pub scheduler_stats: watch::Receiver<SchedulerStats>,
    pub consumer_stats: watch::Receiver<ConsumerStats>,
    /// True while the Kafka consumer thread runs; false once it ended, however.
    pub consumer_running: watch::Receiver<bool>,
    /// The outcomes stage's queue (dead letters, invalid tokens, committed offsets).
    pub outcomes: outcomes::Outcomes,
    pub control: mpsc::Sender<Control>,
    /// Token hygiene, when `hygiene.enabled` (its filter and counters).
    pub hygiene: Option<Arc<crate::hygiene::TokenHygiene>>,
    /// The frequency cap shared through Redis, when `capping.scope = "redis"`.
    pub shared_cap: Option<crate::capping::shared::SharedCap>,
}

impl Worker {
    /// Starts every part. Must run inside a multi-threaded tokio runtime.
    pub async fn start(
        settings: &Settings,
        pool: PgPool,
        bootstrap: String,
        providers: impl Into<Arc<Providers>>,
    ) -> Result<Worker, WorkerError> {
        Self::start_with_clock(
            settings,
            pool,
            bootstrap,
            providers,
            Arc::new(MonotonicClock::new()),
        )
        .await
    }

    pub async fn start_with_clock(
        settings: &Settings,
        pool: PgPool,
        bootstrap: String,
        providers: impl Into<Arc<Providers>>,
        clock: Arc<dyn Clock>,
    ) -> Result<Worker, WorkerError> {
        let providers: Arc<Providers> = providers.into();
        // On an early return, dropping `phases` stops whatever has started.
        let phases = Phases::new();
        let stats = start_stats(settings, &pool, &phases).await?;
        let (control, control_rx) = mpsc::channel::<Control>(64);
        let (completions_tx, completions_rx) = mpsc::unbounded_channel();
        let (events_tx, events_rx) = std::sync::mpsc::channel();
        let (sched_stats_tx, scheduler_stats) = watch::channel(SchedulerStats::default());
        let (consumer_stats_tx, consumer_stats) = watch::channel(ConsumerStats::default());
        let mut core = build_scheduler(
            settings,
            &bootstrap,
            &providers,
            Arc::clone(&clock),
            stats.recorder,
            completions_tx,
            events_tx,
        )?;
        let side =
            start_enrich_side(settings, pool.clone(), &mut core, &providers, &phases).await?;
        let scheduler = phases.spawn(scheduler::run(
            core,
            TimeBase::new(clock),
            control_rx,
            completions_rx,
            phases.intake().clone(),
            Duration::from_millis(settings.worker.drain_timeout_ms),
            sched_stats_tx,
        ));
        start_app_router(settings, &pool, &providers, control.clone(), &phases);
        let defaults = campaign_defaults(settings);
        let forward = forward_settings(stats.watcher.subscribe(), control.clone(), defaults);
        phases.spawn(phases.intake().clone().run_until_cancelled_owned(forward));
        let (running_tx, consumer_running) = watch::channel(true);
        let ends = ConsumerEnds {
            live: scheduler_stats.clone(),
            campaigns: stats.watcher.subscribe(),
            control: control.clone(),
            events: events_rx,
            stats: consumer_stats_tx,
            running: running_tx,
            stop: phases.intake().clone(),
        };
        let consumer = start_consumer(settings, bootstrap, providers, &side, &stats.flusher, ends)?;
        phases.spawn(planner::run(
            pool.clone(),
            scheduler_stats.clone(),
            consumer_stats.clone(),
            control.clone(),
            phases.intake().clone(),
        ));
        phases.spawn(publish::run(
            pool,
            scheduler_stats.clone(),
            consumer_stats.clone(),
            phases.intake().clone(),
        ));
        Ok(Worker {
            phases,
            consumer,
            scheduler,
            outcome_writer: side.outcome_writer,
            flusher_task: stats.flusher_task,
            _watcher: stats.watcher,
            flusher: stats.flusher,
            scheduler_stats,
            consumer_stats,
            consumer_running,
            outcomes: side.outcomes,
            control,
            hygiene: side.enricher.hygiene,
            shared_cap: side.enricher.shared_cap,
        })
    }

    /// Graceful stop: drain in-flight sends, flush, commit.
    pub async fn shutdown(self) -> Result<(), WorkerError> {
        let Worker {
            phases,
            consumer,
            scheduler,
            outcome_writer,
            flusher_task,
            outcomes,
            ..
        } = self;
        // Fetching and dispatching stop; the scheduler drains its in-flight sends, and
        // the consumer waits for that, flushes progress and commits what is durable.
        phases.intake().cancel();
        let joined = tokio::task::spawn_blocking(move || consumer.join()).await;
        if !matches!(joined, Ok(Ok(()))) {
            tracing::error!("the consumer thread panicked");
        }
        let _ = scheduler.await;
        // The scheduler held the last other handle: the writer ends once its queue is
        // written (bounded, so that a database that never comes back cannot hold the
        // process: what is not written is re-read with its message).
        drop(outcomes);
        if tokio::time::timeout(OUTCOMES_DRAIN, outcome_writer)
            .await
            .is_err()
        {
            tracing::warn!("outcomes not all written at shutdown; their messages are read again");
        }
        // The publisher deletes this worker's rows; the forwarder and the reload end.
        phases.intake_done().await;
        phases.flush().cancel();
        let flushed = flusher_task
            .await
            .map_err(|e| WorkerError::Task(e.to_string()))?;
        if let Err(e) = flushed {
            tracing::error!(error = %e, "final stats flush failed");
        }
        phases.root().cancel();
        Ok(())
    }
}

/// How long shutdown waits for queued outcomes to be written.
const OUTCOMES_DRAIN: Duration = Duration::from_secs(10);

/// The stats side: the recorder the scheduler counts into, its flusher, and the campaign
/// watcher.
struct StatsSide {
    recorder: StatsRecorder,
    flusher: Flusher,
    flusher_task: JoinHandle<Result<(), crate::stats::StatsError>>,
    watcher: CampaignWatcher,
}

async fn start_stats(
    settings: &Settings,
    pool: &PgPool,
    phases: &Phases,
) -> Result<StatsSide, WorkerError> {
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(
        recorder.clone(),
        pool.clone(),
        FlusherConfig {
            interval: Duration::from_millis(settings.worker.stats_flush_ms),
            max_unwritten: Duration::from_millis(settings.worker.stats_max_unwritten_ms),
            write_timeout: Duration::from_millis(settings.worker.write_timeout_ms),
            ..FlusherConfig::default()
        },
    );
    let flusher_task = flusher.spawn(phases.flush().clone());
    let watcher = CampaignWatcher::start(
        pool.clone(),
        WatcherConfig {
            refresh_interval: Duration::from_secs(1),
            ..WatcherConfig::default()
        },
        phases.root().clone(),
    )
    .await?;
    Ok(StatsSide {
        recorder,
        flusher,
        flusher_task,
        watcher,
    })
}

/// The apps' side: the router that keeps the app slots' providers in the scheduler
/// current, and (from the first job naming an app) the watcher of those apps, which
/// ends with the root phase.
fn start_app_router(
    settings: &Settings,
    pool: &PgPool,
    providers: &Providers,
    control: mpsc::Sender<Control>,
    phases: &Phases,
) {
    let start = app_router::WatcherStart {
        pool: pool.clone(),
        keyring: settings.apps.keyring.clone(),
        config: WatcherConfig {
            refresh_interval: Duration::from_secs(1),
            ..WatcherConfig::default()
        },
        stop: phases.root().clone(),
    };
    phases.spawn(app_router::run(
        Arc::clone(providers.apps()),
        start,
        crate::apps::provider::AppDefaults::from_settings(settings),
        control,
        phases.intake().clone(),
    ));
}

fn build_scheduler(
    settings: &Settings,
    bootstrap: &str,
    providers: &Arc<Providers>,
    clock: Arc<dyn Clock>,
    recorder: StatsRecorder,
    completions: mpsc::UnboundedSender<scheduler::Completion>,
    events: std::sync::mpsc::Sender<scheduler::Event>,
) -> Result<Scheduler, WorkerError> {
    let w = &settings.worker;
    // limiter.scope (or a campaign's own limiter_scope): whole rates per process, or
    // shared through Redis leases.
    let limiters: Arc<dyn scheduler::LimiterFactory> =
        Arc::new(crate::distributed::ScopedLimiters::new(
            settings,
            clock,
            Some((bootstrap.to_string(), settings.kafka.group_id.clone())),
        )?);
    Ok(Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: w.max_active_campaigns,
            quantum_min: Duration::from_millis(w.quantum_min_ms),
            quantum_max: Duration::from_millis(w.quantum_max_ms),
            max_in_flight: settings.sender.max_in_flight,
            max_attempts: settings.sender.max_attempts,
            retry_base: Duration::from_millis(settings.sender.retry_base_ms),
            retry_max: Duration::from_millis(settings.sender.retry_max_ms),
            give_up_after: Duration::from_millis(settings.sender.give_up_after_ms),
            global_rate: settings.limiter.global_rate(),
            kind_caps: settings.apps.kind_caps(),
            limiters,
            forget_after: Duration::from_millis(w.forget_idle_after_ms),
            visit_all_every: None,
            wake_slack: Duration::from_millis(w.wake_slack_ms),
            second_edge: Duration::from_millis(w.second_edge_ms),
            policy: policy_defaults(&settings.limiter),
        },
        Arc::clone(providers),
        recorder,
        completions,
        events,
    ))
}

/// `[limiter]`'s delivery-policy keys, as the scheduler takes them.
fn policy_defaults(l: &crate::config::LimiterSettings) -> scheduler::PolicyDefaults {
    scheduler::PolicyDefaults {
        ramp_up_s: l.ramp_up_s,
        ramp_from: l.ramp_from,
        start_jitter: Duration::from_millis(l.start_jitter_ms),
        critical_overdraft: l.critical_overdraft,
    }
}

/// The enrich and outcomes side: a job's lookups, and the stage that writes outcomes.
struct EnrichSide {
    enricher: enrich::Enricher,
    outcomes: outcomes::Outcomes,
    outcome_writer: JoinHandle<()>,
}

/// Starts the frequency cap, token hygiene (and its reload) and the outcomes writer,
/// and hands the scheduler what it uses of them.
async fn start_enrich_side(
    settings: &Settings,
    pool: PgPool,
    scheduler: &mut Scheduler,
    providers: &Providers,
    phases: &Phases,
) -> Result<EnrichSide, WorkerError> {
    // capping.scope: local decides in the scheduler at each send; redis at intake.
    let shared_cap = match (settings.capping.enabled, settings.capping.scope) {
        (false, _) => None,
        (true, CappingScope::Local) => {
            let cap = crate::capping::FrequencyCap::new(settings.capping.cap_config())?;
            scheduler.set_capping(Some(cap));
            None
        }
        (true, CappingScope::Redis) => Some(crate::capping::shared::SharedCap::new(
            crate::capping::shared::SharedCapConfig::from_settings(settings),
        )?),
    };
    let hygiene = if settings.hygiene.enabled {
        let h = crate::hygiene::TokenHygiene::start(
            pool.clone(),
            settings.hygiene.expected_tokens,
            settings.hygiene.false_positive_rate,
            settings.hygiene.ttl(),
            &providers.iter().map(|p| p.name.clone()).collect::<Vec<_>>(),
        )
        .await?;
        Some(Arc::new(h))
    } else {
        None
    };
    let (outcomes, writer) = outcomes::channel(
        outcomes::OutcomesConfig {
            capacity: settings.worker.outcome_queue,
            write_timeout: Duration::from_millis(settings.worker.write_timeout_ms),
            ..Default::default()
        },
        pool.clone(),
        settings.kafka.topic.clone(),
        hygiene.clone(),
        shared_cap.clone(),
    );
    // Not on the phases: it ends when its queue closes, once everything is queued.
    let outcome_writer = tokio::spawn(writer.run());
    scheduler.set_outcomes(outcomes.clone());
    if let Some(h) = hygiene.clone() {
        let every = Duration::from_millis(settings.hygiene.reload_ms);
        phases.spawn(
            phases
                .intake()
                .clone()
                .run_until_cancelled_owned(reload_hygiene(h, every)),
        );
    }
    let db_down: Arc<std::sync::atomic::AtomicBool> = Default::default();
    let enricher = enrich::Enricher {
        loader: settings_loader::SettingsLoader::spawn(
            pool.clone(),
            campaign_defaults(settings),
            db_down.clone(),
        ),
        progress: progress_loader::ProgressLoader::spawn(&pool, db_down.clone()),
        defaults: campaign_defaults(settings),
        hygiene,
        shared_cap,
        db_down,
    };
    Ok(EnrichSide {
        enricher,
        outcomes,
        outcome_writer,
    })
}

/// The consumer's ends of the channels to the scheduler and the worker, and its stop.
struct ConsumerEnds {
    live: watch::Receiver<SchedulerStats>,
    campaigns: watch::Receiver<crate::store::listen::CampaignSnapshot>,
    control: mpsc::Sender<Control>,
    events: std::sync::mpsc::Receiver<scheduler::Event>,
    stats: watch::Sender<ConsumerStats>,
    running: watch::Sender<bool>,
    stop: CancellationToken,
}

fn start_consumer(
    settings: &Settings,
    bootstrap: String,
    providers: Arc<Providers>,
    side: &EnrichSide,
    flusher: &Flusher,
    ends: ConsumerEnds,
) -> Result<std::thread::JoinHandle<()>, WorkerError> {
    let w = &settings.worker;
    let flusher = flusher.clone();
    let params = ConsumerParams {
        kafka: settings.kafka.clone(),
        bootstrap,
        max_buffered_jobs: w.max_buffered_jobs,
        max_buffered_devices: w.max_buffered_devices,
        lookahead: Duration::from_millis(w.lookahead_ms),
        max_parked_jobs: w.max_parked_jobs,
        max_parked_bytes: w.max_parked_bytes,
        live: ends.live,
        campaigns: ends.campaigns,
        drain_timeout: Duration::from_millis(w.drain_timeout_ms),
        control: ends.control,
        events: ends.events,
        flush_now: Arc::new(move || {
            let f = flusher.clone();
            Box::pin(async move {
                if let Err(e) = f.flush_now().await {
                    tracing::warn!(error = %e, "flush failed; progress stays pending");
                }
            })
        }),
        stats: ends.stats,
        runtime: tokio::runtime::Handle::current(),
        enricher: side.enricher.clone(),
        providers,
        outcomes: side.outcomes.clone(),
        // Shorter than the scheduler's forget_after, so that settings a job carries are
        // never older than what the scheduler still remembers.
        settings_ttl: Duration::from_millis(w.forget_idle_after_ms / 2),
        running: ends.running,
    };
    Ok(consumer::spawn(params, ends.stop)?)
}

/// Adds the invalid tokens other workers recorded, every `every`.
async fn reload_hygiene(h: Arc<crate::hygiene::TokenHygiene>, every: Duration) {
    let mut tick = tokio::time::interval(every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        if let Err(e) = h.reload().await {
            tracing::warn!(error = %e, "invalid-token reload failed; retried at the next interval");
        }
    }
}

impl Worker {
    /// Resolves when the consumer thread has ended (after shutdown, or on its own:
    /// then the process should exit non-zero so that it is restarted).
    pub async fn consumer_stopped(&self) {
        let mut running = self.consumer_running.clone();
        let _ = running.wait_for(|r| !*r).await;
    }
}

/// Sends each changed campaign's settings to the scheduler.
async fn forward_settings(
    mut snapshots: watch::Receiver<crate::store::listen::CampaignSnapshot>,
    control: mpsc::Sender<Control>,
    defaults: CampaignDefaults,
) {
    let mut last: HashMap<String, CampaignSettings> = HashMap::new();
    let mut seen: Option<crate::store::listen::CampaignSnapshot> = None;
    loop {
        let current = snapshots.borrow_and_update().clone();
        // Only the shards that changed since the last look are compared.
        for c in current.changed_since(seen.as_ref()) {
            let s = to_settings(c, &defaults);
            if last.get(&c.id) != Some(&s) {
                if control.send(Control::Settings(s.clone())).await.is_err() {
                    return;
                }
                last.insert(c.id.clone(), s);
            }
        }
        seen = Some(current);
        if snapshots.changed().await.is_err() {
            return;
        }
    }
}
