//! The `pushpace` command line: parses flags, loads settings and dispatches.

// glibc malloc was about 17% of the worker's CPU per HTTP send in the profile (see
// docs/BENCHMARKS.md, end to end); mimalloc's thread-local free lists cut that.
// Its `no_thp` feature keeps mimalloc from asking for transparent huge pages: zeroing
// 2 MiB at each first touch cost more CPU and memory than the huge pages saved
// (docs/BENCHMARKS.md); `main` also opts out hosts where THP covers every mapping.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use pushpace::config::{LoadOptions, Settings};
use pushpace::telemetry::{self, LogFormat};
use std::path::PathBuf;

#[derive(Parser, Debug)]
#[command(
    name = "pushpace",
    version,
    about = "Paces push-notification sends per campaign"
)]
struct Cli {
    #[command(flatten)]
    global: GlobalArgs,
    #[command(subcommand)]
    command: Command,
}

#[derive(Args, Debug)]
struct GlobalArgs {
    /// Directory holding base.toml and <env>.toml (default: ./config if present, else built-in).
    #[arg(long, global = true, env = "PUSHPACE_CONFIG_DIR")]
    config_dir: Option<PathBuf>,
    /// Configuration environment: local, production, or any <name>.toml in the config dir.
    #[arg(long = "env", global = true, env = "PUSHPACE_ENV")]
    environment: Option<String>,
    /// Override any setting: --set section.key=value (repeatable, highest precedence).
    #[arg(long = "set", global = true, value_name = "KEY=VALUE")]
    overrides: Vec<String>,
    /// Kafka bootstrap servers, or "embedded" (same as --set kafka.brokers=…).
    #[arg(long, global = true)]
    brokers: Option<String>,
    /// PostgreSQL URL (same as --set database.url=…).
    #[arg(long, global = true)]
    database_url: Option<String>,
    /// Log output format.
    #[arg(long, global = true, value_enum, default_value = "text")]
    log_format: LogFormat,
}

impl GlobalArgs {
    fn load_options(&self) -> LoadOptions {
        let mut overrides = Vec::new();
        if let Some(b) = &self.brokers {
            overrides.push(format!("kafka.brokers={b}"));
        }
        if let Some(u) = &self.database_url {
            overrides.push(format!("database.url={u}"));
        }
        overrides.extend(self.overrides.iter().cloned());
        LoadOptions {
            config_dir: self.config_dir.clone(),
            environment: self.environment.clone(),
            overrides,
        }
    }
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Run the worker daemon: consume jobs, pace sends, record stats.
    Run,
    /// Create the database if missing and apply migrations/.
    Migrate,
    /// A self-contained demonstration (embedded broker, loopback provider sink).
    Demo(pushpace::tools::demo::DemoArgs),
    /// Reproduce the rate-limiter experiment on a virtual clock.
    Simulate(pushpace::tools::simulate::SimulateArgs),
    /// Write load-test jobs to the jobs topic.
    Produce(ProduceArgs),
    /// Inspect and steer campaigns through the HTTP API.
    Campaign(pushpace::tools::cli_client::CampaignArgs),
    /// Per-second delivery statistics (through the API), and `stats prune` for retention.
    Stats(pushpace::tools::cli_client::StatsArgs),
    /// The app registry through the HTTP API (`list`, `show`, `put`, `disable`, `enable`,
    /// `delete`), and `rotate-master-key` against the database.
    Apps(pushpace::tools::cli_client::AppsArgs),
    /// Print the effective settings (secrets hidden).
    Config,
    /// A loopback stand-in for the push provider, for load tests and the reliability
    /// scripts: `GET /_sink/stats` returns what it saw, `PUT /_sink/behaviour` changes its answers.
    Sink(SinkArgs),
    /// The named push providers: `list`, or `check NAME` (the authentication round trip,
    /// no notification sent).
    #[command(subcommand)]
    Providers(ProvidersCommand),
    /// The end-to-end benchmark: a plain consumer against the worker (null and HTTP
    /// senders), peak RSS behind a slow campaign, and pacing at scale; prints a table.
    Bench(pushpace::tools::bench::BenchArgs),
    /// A loopback APNs, FCM or Web Push mock over TLS, as its own process; writes the
    /// CA, credentials and `[providers.*]` settings to --dir.
    Mock(pushpace::tools::bench::mockcmd::MockArgs),
}

#[derive(Subcommand, Debug)]
enum ProvidersCommand {
    /// Every provider: name, kind, endpoint, cap (no secret).
    List,
    /// Signs a JWT / fetches an OAuth token / opens TLS with ALPN h2, and says what is wrong.
    Check { name: String },
}

#[derive(Args, Debug)]
struct SinkArgs {
    /// Where to listen (loopback).
    #[arg(long, default_value = "127.0.0.1:8090")]
    bind: std::net::SocketAddr,
    /// Only count requests and answer 200 (for throughput benchmarks).
    #[arg(long)]
    count_only: bool,
}

#[derive(Args, Debug)]
struct ProduceArgs {
    /// Number of campaigns.
    #[arg(long, default_value_t = 4)]
    campaigns: usize,
    /// Devices per campaign.
    #[arg(long, default_value_t = 10_000)]
    devices_per_campaign: usize,
    /// send_rate carried by the jobs (used when a campaign is first seen).
    #[arg(long, default_value_t = 100.0)]
    send_rate: f64,
    /// Devices per job (1–10000).
    #[arg(long, default_value_t = 500)]
    jobs_size: usize,
    /// Algorithm carried by the jobs.
    #[arg(long)]
    algorithm: Option<pushpace::limiter::Algorithm>,
    /// Campaign id prefix (campaigns are <prefix>-0, <prefix>-1, …).
    #[arg(long, default_value = "load")]
    prefix: String,
}

fn main() -> std::process::ExitCode {
    no_huge_pages();
    let cli = Cli::parse();
    telemetry::init(cli.global.log_format, "info,sqlx=warn,rdkafka=warn");
    match real_main(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Opts this process (and what it starts) out of transparent huge pages, which a host
/// set to `always` would give every large mapping regardless of mimalloc's feature.
fn no_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with integer arguments changes only this process's THP flag.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
}

fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Simulate(args) => {
            let out = pushpace::tools::simulate::run(&args)?;
            print!("{out}");
            Ok(())
        }
        command => {
            let settings = Settings::load(&cli.global.load_options())?;
            let rt = tokio::runtime::Runtime::new().context("starting the tokio runtime")?;
            rt.block_on(dispatch(command, settings))
        }
    }
}

async fn dispatch(command: Command, settings: Settings) -> anyhow::Result<()> {
    match command {
        Command::Migrate => migrate(&settings).await.map(|_| ()),
        Command::Providers(ProvidersCommand::List) => {
            print!(
                "{}",
                pushpace::provider::check::list(
                    &settings.providers,
                    &settings.sender.default_provider
                )
            );
            Ok(())
        }
        Command::Providers(ProvidersCommand::Check { name }) => {
            let summary = pushpace::provider::check::check(&settings.providers, &name).await?;
            println!("{name}: {summary}");
            Ok(())
        }
        Command::Config => {
            println!("{settings:#?}");
            Ok(())
        }
        Command::Simulate(_) => unreachable!("handled before the runtime starts"),
        Command::Run => run(settings).await,
        Command::Demo(args) => {
            let settings = demo_settings(settings);
            pushpace::tools::demo::run(settings, &args).await?;
            Ok(())
        }
        Command::Produce(args) => produce(&settings, &args).await,
        Command::Sink(args) if args.count_only => {
            let summary =
                pushpace::tools::sink::serve_counting_until(args.bind, wait_for_signal()).await?;
            println!("{}", serde_json::to_string_pretty(&summary)?);
            Ok(())
        }
        Command::Bench(args) => {
            pushpace::tools::bench::run(&settings, &args).await?;
            Ok(())
        }
        Command::Mock(args) => Ok(pushpace::tools::bench::mockcmd::run(&args).await?),
        Command::Sink(args) => {
            let config = pushpace::tools::sink::SinkConfig {
                bind: args.bind,
                ..Default::default()
            };
            let summary = pushpace::tools::sink::serve_until(config, wait_for_signal()).await?;
            println!("{}", serde_json::to_string_pretty(&summary)?);
            Ok(())
        }
        Command::Campaign(args) => {
            print!(
                "{}",
                pushpace::tools::cli_client::run_campaign(&args, &settings).await?
            );
            Ok(())
        }
        Command::Stats(args) => {
            print!(
                "{}",
                pushpace::tools::cli_client::run_stats(&args, &settings).await?
            );
            Ok(())
        }
        Command::Apps(args) => {
            print!(
                "{}",
                pushpace::tools::cli_client::run_apps(&args, &settings).await?
            );
            Ok(())
        }
    }
}

/// Creates the database if needed and applies pending migrations.
async fn migrate(settings: &Settings) -> anyhow::Result<sqlx::PgPool> {
    let shown = settings.database.url_for_display();
    pushpace::store::ensure_database_with(settings.database.connect_options()?)
        .await
        .with_context(|| format!("creating the database at {shown}"))?;
    let pool = settings
        .database
        .connect()
        .await
        .with_context(|| format!("connecting to {shown}"))?;
    pushpace::store::migrate(&pool)
        .await
        .context("applying migrations")?;
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations WHERE success")
        .fetch_one(&pool)
        .await?;
    println!("migrations applied: {applied} (database {shown})");
    Ok(pool)
}

/// The demo uses the embedded broker unless a broker was named explicitly.
fn demo_settings(mut settings: Settings) -> Settings {
    if std::env::var_os("PUSHPACE__KAFKA__BROKERS").is_none()
        && !std::env::args().any(|a| a.starts_with("--brokers") || a.starts_with("kafka.brokers"))
    {
        settings.kafka.brokers = "embedded".into();
    }
    settings
}

async fn run(settings: Settings) -> anyhow::Result<()> {
    // Before the worker: it takes its metric handles when it is built.
    if let Err(e) = pushpace::metrics::install() {
        tracing::warn!(error = %e, "metrics recorder not installed");
    }
    let pool = migrate(&settings).await?;
    let providers =
        pushpace::provider::build::build(&settings.providers, &settings.sender.default_provider)?;
    for p in providers.iter() {
        tracing::info!(provider = %p.name, kind = p.kind.as_str(), "provider ready");
    }
    let _embedded;
    let bootstrap = if settings.kafka.is_embedded() {
        _embedded = pushpace::broker::EmbeddedBroker::start(&[(
            settings.kafka.topic.as_str(),
            settings.kafka.partitions,
        )])?;
        _embedded.bootstrap_servers().to_string()
    } else {
        settings.kafka.brokers.clone()
    };
    let brokers = pushpace::broker::check_connection(&settings.kafka, &bootstrap).await?;
    tracing::info!(
        brokers,
        security = settings.kafka.security_protocol.as_str(),
        "Kafka answered"
    );
    tracing::info!(brokers = %bootstrap, topic = %settings.kafka.topic, default_provider = %settings.sender.default_provider, "worker starting");
    let worker =
        pushpace::worker::Worker::start(&settings, pool.clone(), bootstrap.clone(), providers)
            .await?;
    let app = pushpace::startup::Application::build(
        &settings,
        pushpace::startup::AppDeps {
            pool,
            worker: Some(pushpace::api::WorkerView::of(&worker)),
            bootstrap: Some(bootstrap),
        },
    )
    .await;
    let app = match app {
        Ok(app) => app.spawn(),
        Err(e) => {
            // Nothing was sent yet, but stop cleanly all the same.
            worker.shutdown().await?;
            return Err(e.into());
        }
    };
    let consumer_failed = tokio::select! {
        () = wait_for_signal() => false,
        () = worker.consumer_stopped() => true,
    };
    if consumer_failed {
        // Not healthy any more: stop what is left and exit non-zero, so that an
        // orchestrator restarts the worker (its uncommitted jobs are read again).
        tracing::error!("the Kafka consumer stopped on its own; shutting down");
        let _ = app.stop().await;
        worker.shutdown().await?;
        anyhow::bail!("the Kafka consumer thread ended unexpectedly");
    }
    tracing::info!("shutting down: draining in-flight sends (a second signal exits at once)");
    tokio::spawn(async {
        wait_for_signal().await;
        eprintln!("second signal: exiting at once");
        std::process::exit(130);
    });
    let stopped = app.stop().await;
    worker.shutdown().await?;
    stopped?;
    tracing::info!("stopped");
    Ok(())
}

async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = match signal(SignalKind::terminate()) {
            Ok(s) => s,
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
                return;
            }
        };
        tokio::select! {
            _ = term.recv() => {}
            _ = tokio::signal::ctrl_c() => {}
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

async fn produce(settings: &Settings, args: &ProduceArgs) -> anyhow::Result<()> {
    let rate = pushpace::limiter::Rate::per_second(args.send_rate).context("--send-rate")?;
    anyhow::ensure!(
        (1..=pushpace::job::MAX_DEVICES).contains(&args.jobs_size),
        "--jobs-size must be 1–{}",
        pushpace::job::MAX_DEVICES
    );
    let mut plan = pushpace::tools::produce::ProducePlan::uniform(
        &args.prefix,
        args.campaigns,
        args.devices_per_campaign,
        rate,
        args.jobs_size,
    );
    plan.algorithm = args.algorithm;
    plan.run_id = format!("{}{}", args.prefix, chrono::Utc::now().format("%H%M%S"));
    anyhow::ensure!(
        !settings.kafka.is_embedded(),
        "produce needs a real broker: set --brokers or PUSHPACE__KAFKA__BROKERS"
    );
    pushpace::broker::check_connection(&settings.kafka, &settings.kafka.brokers).await?;
    pushpace::broker::ensure_topic(
        &settings.kafka,
        &settings.kafka.brokers,
        &settings.kafka.topic,
        settings.kafka.partitions,
    )
    .await?;
    let bar = indicatif::ProgressBar::new(plan.total_devices() as u64);
    bar.set_style(
        indicatif::ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} devices ({per_sec})",
        )
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let jobs = pushpace::tools::produce::produce(
        &settings.kafka,
        &settings.kafka.brokers,
        &settings.kafka.topic,
        &plan,
        |d| bar.inc(d as u64),
    )
    .await?;
    bar.finish();
    println!(
        "produced {jobs} jobs, {} devices, to {}",
        plan.total_devices(),
        settings.kafka.topic
    );
    Ok(())
}

#[cfg(all(test, target_os = "linux"))]
mod tests {
    /// The kernel's own view of the process after the opt-out (`/proc/self/status`).
    #[test]
    fn the_process_runs_without_transparent_huge_pages() {
        super::no_huge_pages();
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status
            .lines()
            .find(|l| l.starts_with("THP_enabled:"))
            .expect("a kernel that reports THP_enabled");
        assert_eq!(line.split_whitespace().nth(1), Some("0"), "{line}");
    }
}
