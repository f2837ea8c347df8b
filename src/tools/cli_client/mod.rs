//! The `campaign`, `stats` and `apps` commands: a client of the HTTP API (reqwest),
//! printing tables, JSON (`--format json`), a Unicode sparkline, or an SVG chart (plotters).
//! `stats prune` and `apps rotate-master-key` are the exceptions: they run against the
//! database directly.
//!
//! The API is `--api URL` (or `PUSHPACE_API`), else `http://<http.bind>`. Changes need the
//! admin token, taken from `PUSHPACE_ADMIN_TOKEN`, else from `http.admin_token`.

use crate::config::Settings;
use clap::{Args, Subcommand, ValueEnum};
use std::path::PathBuf;

mod apps;
mod client;
mod lifecycle;
mod model;
mod policy;
#[cfg(test)]
mod policy_tests;
mod render;
mod stats;

pub use apps::{run_apps, AppsArgs, AppsCommand};
pub use model::{CampaignOut, EtaOut, LiveOut, PointOut, PolicyOut, ProgressOut};
pub use policy::{RampArgs, WindowArgs};
pub use stats::{run_stats, sparkline, stats_svg};

use client::{decode, pretty, put_campaign, Changed, Client};
use render::{campaign_details, campaign_table, number, scope_text};

/// The environment variable the CLI reads the admin token from.
pub const TOKEN_ENV: &str = "PUSHPACE_ADMIN_TOKEN";

/// Errors of the `campaign` and `stats` commands.
#[derive(Debug, thiserror::Error)]
pub enum CliError {
    #[error("{url}: {status}: {message}")]
    Api {
        url: String,
        status: u16,
        message: String,
    },
    #[error(
        "cannot reach the API at {url}: {source} (is `pushpace run` up? set --api or PUSHPACE_API)"
    )]
    Unreachable {
        url: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{url}: unexpected answer: {reason}")]
    Decode { url: String, reason: String },
    #[error("no admin token: set {TOKEN_ENV} (or http.admin_token)")]
    NoToken,
    #[error("{0}")]
    Invalid(String),
    /// A check that ran and failed: what it printed, then a non-zero exit.
    #[error("{0}")]
    CheckFailed(String),
    #[error("writing {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("drawing the chart: {0}")]
    Chart(String),
    #[error(transparent)]
    Store(#[from] crate::store::StoreError),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    Table,
    Json,
}

/// Where the API is and how to print its answers.
#[derive(Args, Debug, Clone)]
pub struct ApiArgs {
    /// The API's base URL [default: http://<http.bind>].
    #[arg(long, global = true, env = "PUSHPACE_API", value_name = "URL")]
    pub api: Option<String>,
    /// Output format.
    #[arg(long, global = true, value_enum, default_value = "table")]
    pub format: OutputFormat,
}

#[derive(Args, Debug, Clone)]
pub struct CampaignArgs {
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(subcommand)]
    pub command: CampaignCommand,
}

#[derive(Subcommand, Debug, Clone)]
pub enum CampaignCommand {
    /// Every campaign with its rate, status and counts.
    List,
    /// One campaign.
    Show { id: String },
    /// Sets a campaign's send_rate (creating the campaign if it is new).
    SetRate {
        id: String,
        /// Sends per second (the API checks the range and answers with the rule).
        #[arg(allow_negative_numbers = true)]
        rate: f64,
    },
    /// Sets where a campaign's rate is enforced: `local` (each worker applies the whole
    /// rate), `redis` (the workers share it) or `default` (the worker's limiter.scope).
    SetScope {
        id: String,
        /// local, redis or default.
        scope: String,
    },
    /// Sets a campaign's weight in a fair share under a cap (0.01–100, default 1): with
    /// weight 3 it gets three times the share of a weight-1 campaign, never more than
    /// its send_rate.
    SetWeight { id: String, weight: f64 },
    /// Sets when a campaign starts: RFC 3339 (2026-11-25T10:00:00Z), unix seconds, or
    /// `none`. Nothing of it is sent earlier.
    SetStart { id: String, at: String },
    /// Sets when a campaign expires (as set-start): devices not sent by then are counted
    /// expired, with one dead letter per job.
    SetExpiry { id: String, at: String },
    /// Sets a campaign's class under a shared cap: critical, high, normal (the default)
    /// or bulk. A class is served before the ones below it; bulk gets what they leave.
    SetPriority {
        id: String,
        /// critical, high, normal or bulk.
        class: String,
    },
    /// Sets the time a campaign should be finished by (as set-start; `none` clears it).
    /// `campaign show` says whether it keeps to it at the rate it sends.
    SetFinishBy { id: String, at: String },
    /// Sets how a campaign's rate climbs to its send_rate: --seconds N (0: no ramp) and
    /// --from F (the fraction it starts at), or --default for the worker's
    /// limiter.ramp_up_s and limiter.ramp_from.
    SetRamp(RampArgs),
    /// Sets the local hours a campaign sends in (--from 09:00 --to 21:00 [--days
    /// mon,tue,…]), a local delivery time (--deliver-at 10:00), and what to do with a job
    /// whose local time has passed (--late send_now|next_window|skip); --clear removes
    /// the window.
    SetWindow(WindowArgs),
    /// Cancels a campaign for good: the rest of it, and any job for it that comes later,
    /// is counted cancelled and never sent. Asks first unless --yes.
    Cancel {
        id: String,
        /// Do not ask.
        #[arg(long)]
        yes: bool,
    },
    /// A campaign's settings history: who changed what, when.
    Events { id: String },
    /// Stops a campaign's sends; its jobs wait.
    Pause { id: String },
    /// Lets a paused or halted campaign send again (fix a halt's cause first).
    Resume { id: String },
}

#[derive(Args, Debug, Clone)]
#[command(args_conflicts_with_subcommands = true)]
pub struct StatsArgs {
    /// The campaign whose per-second counts to show.
    pub id: Option<String>,
    /// How far back: 90s, 5m, 2h (at most 24h).
    #[arg(long, default_value = "5m")]
    pub last: String,
    /// Also write the chart as an SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    #[command(flatten)]
    pub api: ApiArgs,
    #[command(subcommand)]
    pub command: Option<StatsCommand>,
}

#[derive(Subcommand, Debug, Clone)]
pub enum StatsCommand {
    /// Deletes per-second and per-minute counts, finished job progress, flush markers and
    /// dead letters older than a span, then rolls per-second counts older than
    /// `database.rollup_after_ms` into per-minute ones.
    Prune {
        /// 30d, 12h, …
        #[arg(long, value_name = "SPAN")]
        older_than: String,
        /// Keeps dead letters for this span instead (default: --older-than).
        #[arg(long, value_name = "SPAN")]
        dead_letters_older_than: Option<String>,
        /// Rows per DELETE (or rollup) statement.
        #[arg(long, default_value_t = 10_000)]
        batch: i64,
    },
}

/// Runs a `campaign` subcommand and returns what to print.
pub async fn run_campaign(args: &CampaignArgs, settings: &Settings) -> Result<String, CliError> {
    let client = Client::new(&args.api, settings)?;
    let json = args.api.format == OutputFormat::Json;
    use reqwest::Method;
    match &args.command {
        CampaignCommand::List => {
            let url = format!("{}/api/campaigns", client.base);
            let bytes = client.call(Method::GET, url.clone(), None, false).await?;
            if json {
                return pretty(&url, &bytes);
            }
            let list: Vec<CampaignOut> = decode(&url, &bytes)?;
            Ok(campaign_table(&list))
        }
        CampaignCommand::Show { id } => {
            let url = client.campaign_url(id);
            let bytes = client.call(Method::GET, url.clone(), None, false).await?;
            if json {
                return pretty(&url, &bytes);
            }
            Ok(campaign_details(&decode(&url, &bytes)?))
        }
        CampaignCommand::SetRate { id, rate } => {
            let body = serde_json::json!({ "send_rate": finite("RATE", *rate)? });
            set_setting(&client, id, body, json, |c| {
                format!(
                    "send_rate {}/s ({}, {})",
                    number(c.send_rate),
                    c.algorithm,
                    c.status
                )
            })
            .await
        }
        CampaignCommand::SetWeight { id, weight } => {
            let body = serde_json::json!({ "weight": finite("WEIGHT", *weight)? });
            set_setting(&client, id, body, json, |c| {
                format!("weight {}", number(c.weight))
            })
            .await
        }
        CampaignCommand::SetScope { id, scope } => {
            // The API checks the name; "default" is the CLI's word for null.
            let value = match scope.as_str() {
                "default" => serde_json::Value::Null,
                other => serde_json::Value::String(other.to_string()),
            };
            let body = serde_json::json!({ "limiter_scope": value });
            set_setting(&client, id, body, json, |c| {
                format!("limiter scope {}", scope_text(c.limiter_scope.as_deref()))
            })
            .await
        }
        CampaignCommand::SetStart { id, at } => {
            lifecycle::set_instant(&client, id, "start_at", at, json).await
        }
        CampaignCommand::SetExpiry { id, at } => {
            lifecycle::set_instant(&client, id, "expires_at", at, json).await
        }
        CampaignCommand::SetPriority { id, class } => {
            policy::set_priority(&client, id, class, json).await
        }
        CampaignCommand::SetFinishBy { id, at } => {
            policy::set_finish_by(&client, id, at, json).await
        }
        CampaignCommand::SetRamp(ramp) => policy::set_ramp(&client, ramp, json).await,
        CampaignCommand::SetWindow(window) => policy::set_window(&client, window, json).await,
        CampaignCommand::Cancel { id, yes } => lifecycle::cancel(&client, id, *yes, json).await,
        CampaignCommand::Events { id } => lifecycle::events(&client, id, json).await,
        CampaignCommand::Pause { id } | CampaignCommand::Resume { id } => {
            let action = if matches!(args.command, CampaignCommand::Pause { .. }) {
                "pause"
            } else {
                "resume"
            };
            let url = format!("{}/{action}", client.campaign_url(id));
            let bytes = client.call(Method::POST, url.clone(), None, true).await?;
            if json {
                return pretty(&url, &bytes);
            }
            let c: CampaignOut = decode(&url, &bytes)?;
            Ok(format!("campaign {}: {}\n", c.id, c.status))
        }
    }
}

/// Refuses NaN and infinities before they reach the API.
fn finite(name: &str, v: f64) -> Result<f64, CliError> {
    if v.is_finite() {
        Ok(v)
    } else {
        Err(CliError::Invalid(format!(
            "{name} must be a number, got {v}"
        )))
    }
}

/// PUTs one setting and says what the campaign now has (`describe`), or the JSON as is.
async fn set_setting(
    client: &Client,
    id: &str,
    body: serde_json::Value,
    json: bool,
    describe: impl FnOnce(&CampaignOut) -> String,
) -> Result<String, CliError> {
    match put_campaign(client, id, body, json).await? {
        Changed::Json(text) => Ok(text),
        Changed::Campaign(c) => Ok(format!(
            "campaign {}: {}; the worker applies it within a second\n",
            c.id,
            describe(&c)
        )),
    }
}
