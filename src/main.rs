//! The `pushpace` command line: parses flags, loads settings and dispatches.

use anyhow::Context;
use clap::{Args, Parser, Subcommand};
use pushpace::config::{LoadOptions, Settings};
use pushpace::telemetry::{self, LogFormat};
use secrecy::ExposeSecret;
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
    Demo,
    /// Reproduce the rate-limiter experiment on a virtual clock.
    Simulate(pushpace::simulate::SimulateArgs),
    /// Write load-test jobs to the jobs topic.
    Produce,
    /// Inspect and steer campaigns through the HTTP API.
    Campaign,
    /// Per-second delivery statistics.
    Stats,
    /// Print the effective settings (secrets hidden).
    Config,
}

fn main() -> std::process::ExitCode {
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

fn real_main(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Simulate(args) => {
            let out = pushpace::simulate::run(&args)?;
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
        Command::Config => {
            println!("{settings:#?}");
            Ok(())
        }
        Command::Simulate(_) => unreachable!("handled before the runtime starts"),
        Command::Run | Command::Demo | Command::Produce | Command::Campaign | Command::Stats => {
            anyhow::bail!("this command is not available yet in this build")
        }
    }
}

/// Creates the database if needed and applies pending migrations.
async fn migrate(settings: &Settings) -> anyhow::Result<sqlx::PgPool> {
    let url = settings.database.url.expose_secret();
    let shown = settings.database.url_for_display();
    pushpace::store::ensure_database(url)
        .await
        .with_context(|| format!("creating the database at {shown}"))?;
    let pool = pushpace::store::connect(
        url,
        settings.database.max_connections,
        settings.database.connect_timeout(),
    )
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
