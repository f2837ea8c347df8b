//! `pushpace demo`: the whole pipeline on one machine, with nothing to install.
//!
//! It starts the embedded Kafka broker (unless `kafka.brokers` names a real one), an
//! in-process loopback HTTP sink standing in for the push provider, creates four
//! campaigns at different rates and algorithms, produces their jobs, runs the worker,
//! prints what the sink sees every second, and ends with a summary: target versus
//! achieved rate, the largest 1 s window, lost and duplicates, as counted by the sink.
//!
//! `--provider apns` sends to the in-process APNs mock over TLS and HTTP/2 instead (a
//! fresh `.p8` key, JWT auth, hex device tokens), counts what the mock accepted, and
//! shows a few of its answers: `apns-id`s of deliveries, and one deliberately dead
//! token answered `410 Unregistered` and recorded in `invalid_tokens`.

mod apns;
pub mod feed;
mod report;
mod showcase;

use report::{progress_bar, verdict};
pub use report::{summary_table, DemoRow};

use crate::broker::EmbeddedBroker;
use crate::config::Settings;
use crate::limiter::{Algorithm, Rate};
use crate::sender::{AnySender, HttpSender, HttpSenderConfig};
use crate::store::campaigns::{self, CampaignPatch};
use crate::tools::produce::{PlannedCampaign, ProducePlan, TokenStyle};
use crate::tools::sink::{Sink, SinkConfig, SinkHandle};
use crate::worker::{campaign_defaults, Worker, WorkerError};
use chrono::{DateTime, Utc};
use feed::Feeder;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

/// Errors of the demo.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Broker(#[from] crate::broker::BrokerError),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
    #[error(transparent)]
    Sink(#[from] crate::tools::sink::SinkError),
    #[error(transparent)]
    Sender(#[from] crate::sender::SenderError),
    #[error(transparent)]
    Worker(#[from] WorkerError),
    #[error(transparent)]
    Provider(#[from] crate::provider::ProviderError),
    #[error("the APNs mock: {0}")]
    Mock(#[from] std::io::Error),
}

/// The providers `demo --provider` can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum DemoProvider {
    /// The in-process APNs mock, over TLS and HTTP/2.
    Apns,
}

/// The demo's knobs.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// Size each campaign to run about this many seconds (devices = rate × duration)
    /// and end when all are delivered. Without it the campaigns run until Ctrl-C.
    #[arg(long)]
    pub duration: Option<u64>,
    /// How many campaigns (rates cycle through 20, 100, 500, 2000/s).
    #[arg(long, default_value_t = 4)]
    pub campaigns: usize,
    /// Send to a provider mock instead of the webhook sink.
    #[arg(long, value_enum)]
    pub provider: Option<DemoProvider>,
}

impl DemoArgs {
    /// The seconds each campaign is sized for: `--duration`, or [`OPEN_ENDED_SIZE_S`]
    /// for the progress bars of an open-ended run.
    fn sized_seconds(&self) -> u64 {
        self.duration.unwrap_or(OPEN_ENDED_SIZE_S).max(1)
    }
}

/// An open-ended demo's campaigns are planned at this many seconds, for the bars only:
/// they keep going until Ctrl-C.
const OPEN_ENDED_SIZE_S: u64 = 20;
/// After the campaigns stop, how long the demo waits for the worker to send what was
/// produced: [`feed::LEAD`] of sending plus the worker's own start-up and flush.
const DRAIN_MAX: Duration = Duration::from_secs(30);
/// The demo stops when nothing has been delivered for this long (a worker that cannot
/// reach its broker or database): longer than a group join on the embedded broker.
const STALLED: Duration = Duration::from_secs(30);
/// How often the feeder tops campaigns up: well inside [`feed::LEAD`].
const FEED_EVERY: Duration = Duration::from_millis(200);

const RATES: [f64; 4] = [20.0, 100.0, 500.0, 2000.0];
const ALGORITHMS: [Algorithm; 4] = [
    Algorithm::Gcra,
    Algorithm::TokenBucket,
    Algorithm::LeakyBucket,
    Algorithm::SlidingWindow,
];

/// Runs the demo, printing progress to stdout. Returns the summary rows.
pub async fn run(settings: Settings, args: &DemoArgs) -> Result<Vec<DemoRow>, DemoError> {
    // The embedded broker lives until the demo returns.
    let (_embedded, bootstrap, pool) = broker_and_database(&settings).await?;
    if args.provider == Some(DemoProvider::Apns) {
        return apns::run(settings, args, pool, bootstrap).await;
    }
    let mut settings = settings;
    let token = ensure_admin_token(&mut settings);
    let sink = Sink::start(SinkConfig::default()).await?;
    println!("provider sink listening on {}", sink.url());
    let sender = demo_providers(&settings, &sink)?;

    let run_id = format!("demo{}", chrono::Utc::now().format("%H%M%S"));
    let (plan, algorithms, scheduled) = plan_campaigns(&settings, &pool, args, &run_id).await?;
    let mut feeder = Feeder::new(
        &settings.kafka,
        &bootstrap,
        &settings.kafka.topic,
        &run_id,
        TokenStyle::Plain,
        plan.campaigns.clone(),
        args.duration.is_none(),
    )?;
    share_a_capped_provider(&mut feeder, &plan);
    let jobs = feeder.top_up(|_| 0).await?;
    println!(
        "{} campaigns; their jobs are produced as they send, {} s ahead ({jobs} jobs now)",
        plan.campaigns.len(),
        feed::LEAD.as_secs()
    );

    settings.kafka.group_id = format!("pushpace-{run_id}");
    if let Err(e) = crate::metrics::install() {
        tracing::warn!(error = %e, "metrics recorder not installed");
    }
    let worker = Worker::start(&settings, pool.clone(), bootstrap.clone(), sender).await?;
    let api = start_api(&settings, &pool, &worker, &bootstrap).await;
    print_dashboard(api.as_ref(), token.as_deref());
    let started = Instant::now();
    feed_and_show(&mut feeder, &sink, args, started).await?;
    feeder.stop();
    let drained = drain(&feeder, &sink).await;
    if let Some(app) = api {
        let _ = app.stop().await;
    }
    worker.shutdown().await?;

    let rows = report::rows(&feeder, &sink, algorithms, drained);
    println!("\n{}", summary_table(&rows));
    print_showcase(&sink, &plan, scheduled);
    println!("{}", verdict(&rows, settings.kafka.is_embedded()));
    Ok(rows)
}

/// The broker (embedded, or the configured one with the topic ensured) and the
/// migrated database.
async fn broker_and_database(
    settings: &Settings,
) -> Result<(Option<EmbeddedBroker>, String, sqlx::PgPool), DemoError> {
    let (embedded, bootstrap) = if settings.kafka.is_embedded() {
        println!("starting the embedded Kafka broker (librdkafka mock cluster)…");
        let embedded =
            EmbeddedBroker::start(&[(settings.kafka.topic.as_str(), settings.kafka.partitions)])?;
        let bootstrap = embedded.bootstrap_servers().to_string();
        (Some(embedded), bootstrap)
    } else {
        crate::broker::ensure_topic(
            &settings.kafka,
            &settings.kafka.brokers,
            &settings.kafka.topic,
            settings.kafka.partitions,
        )
        .await?;
        (None, settings.kafka.brokers.clone())
    };
    crate::store::ensure_database_with(settings.database.connect_options()?).await?;
    let pool = settings.database.connect().await?;
    crate::store::migrate(&pool).await?;
    Ok((embedded, bootstrap, pool))
}

/// With enough campaigns, two of them share the capped provider with different weights.
fn share_a_capped_provider(feeder: &mut Feeder, plan: &ProducePlan) {
    if plan.campaigns.len() <= WEIGHTED.1 {
        return;
    }
    for ci in [WEIGHTED.0, WEIGHTED.1] {
        feeder.set_provider(ci, CAPPED);
    }
    println!(
        "campaigns {} and {} share provider {CAPPED:?} capped at {CAPPED_RATE}/s, with \
         weights 1 and {WEIGHTED_WEIGHT}: they get {}/s and {}/s",
        plan.campaigns[WEIGHTED.0].id,
        plan.campaigns[WEIGHTED.1].id,
        CAPPED_RATE / (1.0 + WEIGHTED_WEIGHT),
        CAPPED_RATE * WEIGHTED_WEIGHT / (1.0 + WEIGHTED_WEIGHT)
    );
}

/// The sink as two webhook providers, as `pushpace run` builds the webhook of
/// [sender] (with the adaptive ceiling); the second carries the demo's cap.
fn demo_providers(
    settings: &Settings,
    sink: &SinkHandle,
) -> Result<crate::provider::Providers, DemoError> {
    let mut sender_config = HttpSenderConfig::new(sink.url());
    sender_config.timeout = Duration::from_millis(settings.sender.timeout_ms);
    let webhook = |name: &str, max_rate| -> Result<crate::provider::Provider, DemoError> {
        Ok(crate::provider::Provider {
            name: std::sync::Arc::from(name),
            kind: crate::provider::ProviderKind::Webhook,
            max_rate,
            max_in_flight: None,
            adaptive: Some(crate::provider::ceiling::CeilingParams::default()),
            sender: AnySender::Http(HttpSender::new(&sender_config)?),
        })
    };
    Ok(crate::provider::Providers::new(
        vec![
            webhook("webhook", None)?,
            webhook(CAPPED, Rate::per_second(CAPPED_RATE).ok())?,
        ],
        "webhook",
    )?)
}

/// The closing lines on the scheduled campaign and the weighted pair.
fn print_showcase(sink: &SinkHandle, plan: &ProducePlan, scheduled: Option<DateTime<Utc>>) {
    if let (Some(at), Some(last)) = (scheduled, plan.campaigns.last()) {
        println!("{}", showcase::scheduled_line(sink, &last.id, at));
    }
    if plan.campaigns.len() > WEIGHTED.1 {
        let (a, b) = (
            &plan.campaigns[WEIGHTED.0].id,
            &plan.campaigns[WEIGHTED.1].id,
        );
        let weights = (1.0, WEIGHTED_WEIGHT);
        println!(
            "{}",
            showcase::weighted_line(sink, (a, b), weights, CAPPED_RATE)
        );
    }
}

/// The demo's controls need the admin token: when none is configured, one is drawn for
/// this run. Returns it when drawn (to print); a configured one is never printed.
fn ensure_admin_token(settings: &mut Settings) -> Option<String> {
    if settings.http.admin_token().is_some() {
        return None;
    }
    let mut bytes = [0u8; 16];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).ok()?;
    let token: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    settings.http.admin_token = secrecy::SecretString::from(token.clone());
    Some(token)
}

fn print_dashboard(api: Option<&crate::startup::RunningApplication>, token: Option<&str>) {
    let Some(app) = api else {
        println!("dashboard not started (http.bind is taken; see the log)");
        return;
    };
    println!(
        "dashboard: {}/  (metrics: {}/metrics)",
        app.url(),
        app.url()
    );
    match token {
        Some(t) => println!(
            "admin token for this run (paste it in the dashboard to use its controls): {t}"
        ),
        None => println!("the dashboard's controls take the configured http.admin_token"),
    }
}

/// Feeds the campaigns and prints what the sink saw each second, until every planned
/// device is delivered (with `--duration`), nothing is delivered for [`STALLED`], or
/// Ctrl-C. A slow machine takes longer than `--duration`; only a stall ends it early.
async fn feed_and_show(
    feeder: &mut Feeder,
    sink: &SinkHandle,
    args: &DemoArgs,
    started: Instant,
) -> Result<(), DemoError> {
    let (mut last_total, mut last_move) = (0u64, Instant::now());
    let mut feed = tokio::time::interval(FEED_EVERY);
    let mut show = tokio::time::interval(Duration::from_secs(1));
    show.tick().await;
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    if args.duration.is_none() {
        println!("the campaigns run until Ctrl-C");
    }
    loop {
        tokio::select! {
            _ = &mut ctrl_c => {
                println!("Ctrl-C: no more jobs; sending what was produced…");
                return Ok(());
            }
            _ = feed.tick() => {
                feeder.top_up(|id| delivered(sink, id)).await?;
            }
            _ = show.tick() => {
                let done = print_tick(feeder, sink, args, started);
                if feeder.all_produced() && done {
                    return Ok(());
                }
                let total = sink.summary().distinct_delivered;
                if total != last_total {
                    (last_total, last_move) = (total, Instant::now());
                } else if last_move.elapsed() >= STALLED {
                    println!("nothing delivered for {} s: stopping", STALLED.as_secs());
                    return Ok(());
                }
            }
        }
    }
}

/// One progress block; whether every produced device was delivered.
fn print_tick(feeder: &Feeder, sink: &SinkHandle, args: &DemoArgs, started: Instant) -> bool {
    let mut out = format!("t={:>3}s", started.elapsed().as_secs());
    let mut all_done = true;
    for (ci, c) in feeder.campaigns().enumerate() {
        let done = delivered(sink, &c.id);
        all_done &= done >= feeder.produced(ci) as u64;
        let last = sink.recent_requests(&c.id, Duration::from_secs(1));
        let _ = write!(
            out,
            "\n  {:<24} target {:>6}/s  last 1s {:>6}  {:>7}",
            c.id,
            c.send_rate.as_f64(),
            last,
            done,
        );
        if args.duration.is_some() {
            let bar = progress_bar(done, c.devices as u64, 12);
            let _ = write!(out, "/{:<7} {bar}", c.devices);
        }
    }
    println!("{out}");
    all_done
}

fn delivered(sink: &SinkHandle, campaign: &str) -> u64 {
    sink.campaign(campaign).map_or(0, |s| s.distinct_delivered)
}

/// Waits until every produced device is delivered, for at most [`DRAIN_MAX`].
async fn drain(feeder: &Feeder, sink: &SinkHandle) -> bool {
    let until = Instant::now() + DRAIN_MAX;
    loop {
        let done = feeder
            .campaigns()
            .enumerate()
            .all(|(ci, c)| delivered(sink, &c.id) >= feeder.produced(ci) as u64);
        if done {
            return true;
        }
        if Instant::now() >= until {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// When the demo's scheduled campaign starts, after the run begins.
const SCHEDULED_START_S: i64 = 30;
/// Two campaigns at 100/s (the same place in the rates' cycle) that share a provider
/// capped below their sum, the second with a larger weight.
const WEIGHTED: (usize, usize) = (1, 5);
const WEIGHTED_WEIGHT: f64 = 3.0;
const CAPPED: &str = "capped";
const CAPPED_RATE: f64 = 100.0;

/// Creates the demo's campaigns (rates and algorithms cycling) and plans their jobs;
/// returns the last one's `start_at` when it is scheduled.
async fn plan_campaigns(
    settings: &Settings,
    pool: &sqlx::PgPool,
    args: &DemoArgs,
    run_id: &str,
) -> Result<(ProducePlan, Vec<Algorithm>, Option<DateTime<Utc>>), DemoError> {
    let defaults = campaign_defaults(settings);
    let mut scheduled = None;
    let mut plan = ProducePlan {
        campaigns: Vec::new(),
        job_size: 500,
        algorithm: None,
        run_id: run_id.to_string(),
    };
    let mut algorithms = Vec::new();
    let n = args.campaigns.max(1);
    for i in 0..n {
        let rate = RATES[i % RATES.len()];
        let algorithm = ALGORITHMS[i % ALGORITHMS.len()];
        let id = format!("{run_id}-c{i}-{}", rate as u64);
        // With two or more, the last one is scheduled: the dashboard shows it waiting.
        let start_at = (n >= 2 && i == n - 1)
            .then(|| chrono::Utc::now() + chrono::Duration::seconds(SCHEDULED_START_S));
        if start_at.is_some() {
            println!("campaign {id} is scheduled: it starts {SCHEDULED_START_S} s in");
            scheduled = start_at;
        }
        campaigns::put(
            pool,
            &id,
            &CampaignPatch {
                send_rate: Some(rate),
                algorithm: Some(algorithm),
                burst: Some(0),
                limiter_scope: None,
                weight: (n > WEIGHTED.1 && i == WEIGHTED.1).then_some(WEIGHTED_WEIGHT),
                start_at: start_at.map(Some),
                expires_at: None,
                ..Default::default()
            },
            &defaults,
        )
        .await?;
        plan.campaigns.push(PlannedCampaign {
            id,
            send_rate: Rate::per_second(rate).unwrap_or(defaults.send_rate),
            devices: (rate * args.sized_seconds() as f64) as usize,
        });
        algorithms.push(algorithm);
    }
    Ok((plan, algorithms, scheduled))
}

/// The API and dashboard next to the demo's worker, on `http.bind`, or on a free
/// loopback port when that one is taken.
async fn start_api(
    settings: &Settings,
    pool: &sqlx::PgPool,
    worker: &Worker,
    bootstrap: &str,
) -> Option<crate::startup::RunningApplication> {
    let deps = || crate::startup::AppDeps {
        pool: pool.clone(),
        worker: Some(crate::api::WorkerView::of(worker)),
        bootstrap: Some(bootstrap.to_string()),
    };
    match crate::startup::Application::build(settings, deps()).await {
        Ok(app) => Some(app.spawn()),
        Err(e) => {
            tracing::info!(error = %e, "http.bind is taken; using a free loopback port");
            let mut s = settings.clone();
            s.http.bind = std::net::SocketAddr::from(([127, 0, 0, 1], 0));
            crate::startup::Application::build(&s, deps())
                .await
                .ok()
                .map(|a| a.spawn())
        }
    }
}
