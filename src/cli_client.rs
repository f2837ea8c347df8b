//! The `campaign` and `stats` commands: a client of the HTTP API (reqwest), printing
//! tables, JSON (`--format json`), a Unicode sparkline, or an SVG chart (plotters).
//! `stats prune` is the exception: retention runs against the database directly.
//!
//! The API is `--api URL` (or `PUSHPACE_API`), else `http://<http.bind>`. Changes need the
//! admin token, taken from `PUSHPACE_ADMIN_TOKEN`, else from `http.admin_token`.

use crate::config::Settings;
use chrono::{DateTime, Utc};
use clap::{Args, Subcommand, ValueEnum};
use secrecy::ExposeSecret;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::Duration;

mod lifecycle;

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

fn one() -> f64 {
    1.0
}

/// A campaign as the API returns it (the fields the CLI prints).
#[derive(Debug, Clone, serde::Deserialize)]
pub struct CampaignOut {
    pub id: String,
    pub send_rate: f64,
    pub algorithm: String,
    pub burst: u32,
    pub status: String,
    /// `None`: the worker's configured limiter.scope.
    #[serde(default)]
    pub limiter_scope: Option<String>,
    #[serde(default = "one")]
    pub weight: f64,
    #[serde(default)]
    pub start_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expires_at: Option<DateTime<Utc>>,
    #[serde(default)]
    pub expired: i64,
    #[serde(default)]
    pub cancelled: i64,
    #[serde(default)]
    pub progress: Option<ProgressOut>,
    #[serde(default)]
    pub eta: Option<EtaOut>,
    /// Why a provider's answer halted it, while halted.
    #[serde(default)]
    pub halt_reason: Option<String>,
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
    /// Tokens the provider said are dead.
    #[serde(default)]
    pub invalid: i64,
    /// Devices the provider refused for good.
    #[serde(default)]
    pub rejected: i64,
    pub rate_10s: f64,
    pub active: bool,
    pub live: Option<LiveOut>,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct ProgressOut {
    pub finished: i64,
    pub known_remaining: u64,
    pub total: Option<u64>,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct EtaOut {
    pub seconds: Option<f64>,
    pub rate: f64,
    pub basis: String,
}

#[derive(Debug, Clone, serde::Deserialize)]
pub struct LiveOut {
    pub active: bool,
    pub paused: bool,
    pub sent: u64,
    pub failed: u64,
    pub in_flight: u32,
    pub open_jobs: u32,
}

/// One second of a series, as the API returns it.
#[derive(Debug, Clone, Copy, serde::Deserialize, serde::Serialize)]
pub struct PointOut {
    pub t: DateTime<Utc>,
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
}

struct Client {
    base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Client {
    fn new(api: &ApiArgs, settings: &Settings) -> Result<Self, CliError> {
        let base = match &api.api {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let mut bind = settings.http.bind;
                if bind.ip().is_unspecified() {
                    bind.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{bind}")
            }
        };
        url::Url::parse(&base).map_err(|e| CliError::Invalid(format!("--api {base:?}: {e}")))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()
            .map_err(|source| CliError::Unreachable {
                url: base.clone(),
                source,
            })?;
        let token = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| settings.http.admin_token().map(str::to_string));
        Ok(Self { base, http, token })
    }

    fn campaign_url(&self, id: &str) -> String {
        let mut u = format!("{}/api/campaigns/", self.base);
        u.push_str(&encode_segment(id));
        u
    }

    async fn call(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<serde_json::Value>,
        auth: bool,
    ) -> Result<Vec<u8>, CliError> {
        let mut req = self.http.request(method, &url);
        if auth {
            let token = self.token.as_deref().ok_or(CliError::NoToken)?;
            // Named in the campaign's settings history.
            req = req
                .bearer_auth(token)
                .header(crate::api::lifecycle::ACTOR_HEADER, "cli");
        }
        if let Some(body) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let unreachable = |source| CliError::Unreachable {
            url: url.clone(),
            source,
        };
        let res = req.send().await.map_err(unreachable)?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(unreachable)?;
        if !status.is_success() {
            let message = serde_json::from_slice::<serde_json::Value>(&bytes)
                .ok()
                .and_then(|v| v.get("error").and_then(|e| e.as_str()).map(str::to_string))
                .unwrap_or_else(|| String::from_utf8_lossy(&bytes).into_owned());
            return Err(CliError::Api {
                url,
                status: status.as_u16(),
                message,
            });
        }
        Ok(bytes.to_vec())
    }
}

/// What a campaign change answered: the API's JSON as is (`--json`), or the campaign.
enum Changed {
    Json(String),
    Campaign(Box<CampaignOut>),
}

/// PUTs `body` to campaign `id` (authenticated).
async fn put_campaign(
    client: &Client,
    id: &str,
    body: serde_json::Value,
    json: bool,
) -> Result<Changed, CliError> {
    let url = client.campaign_url(id);
    let bytes = client
        .call(reqwest::Method::PUT, url.clone(), Some(body), true)
        .await?;
    if json {
        return pretty(&url, &bytes).map(Changed::Json);
    }
    decode(&url, &bytes).map(|c| Changed::Campaign(Box::new(c)))
}

fn decode<T: serde::de::DeserializeOwned>(url: &str, bytes: &[u8]) -> Result<T, CliError> {
    serde_json::from_slice(bytes).map_err(|e| CliError::Decode {
        url: url.to_string(),
        reason: e.to_string(),
    })
}

fn pretty(url: &str, bytes: &[u8]) -> Result<String, CliError> {
    let v: serde_json::Value = decode(url, bytes)?;
    let mut s = serde_json::to_string_pretty(&v).map_err(|e| CliError::Decode {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    s.push('\n');
    Ok(s)
}

/// Percent-encodes a path segment (ids may hold `/`, `?`, `#`, spaces…).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
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
            if !rate.is_finite() {
                return Err(CliError::Invalid(format!(
                    "RATE must be a number, got {rate}"
                )));
            }
            let body = serde_json::json!({ "send_rate": rate });
            let c = match put_campaign(&client, id, body, json).await? {
                Changed::Json(text) => return Ok(text),
                Changed::Campaign(c) => c,
            };
            Ok(format!(
                "campaign {}: send_rate {}/s ({}, {}); the worker applies it within a second\n",
                c.id,
                number(c.send_rate),
                c.algorithm,
                c.status
            ))
        }
        CampaignCommand::SetWeight { id, weight } => {
            if !weight.is_finite() {
                return Err(CliError::Invalid(format!(
                    "WEIGHT must be a number, got {weight}"
                )));
            }
            let body = serde_json::json!({ "weight": weight });
            let c = match put_campaign(&client, id, body, json).await? {
                Changed::Json(text) => return Ok(text),
                Changed::Campaign(c) => c,
            };
            Ok(format!(
                "campaign {}: weight {}; the worker applies it within a second\n",
                c.id,
                number(c.weight)
            ))
        }
        CampaignCommand::SetScope { id, scope } => {
            // The API checks the name; "default" is the CLI's word for null.
            let value = match scope.as_str() {
                "default" => serde_json::Value::Null,
                other => serde_json::Value::String(other.to_string()),
            };
            let body = serde_json::json!({ "limiter_scope": value });
            let c = match put_campaign(&client, id, body, json).await? {
                Changed::Json(text) => return Ok(text),
                Changed::Campaign(c) => c,
            };
            Ok(format!(
                "campaign {}: limiter scope {}; the worker applies it within a second\n",
                c.id,
                scope_text(c.limiter_scope.as_deref())
            ))
        }
        CampaignCommand::SetStart { id, at } => {
            lifecycle::set_instant(&client, id, "start_at", at, json).await
        }
        CampaignCommand::SetExpiry { id, at } => {
            lifecycle::set_instant(&client, id, "expires_at", at, json).await
        }
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

/// A campaign's limiter scope as printed: its own, or the configured default.
fn scope_text(scope: Option<&str>) -> String {
    scope.map_or_else(|| "default (limiter.scope)".into(), str::to_string)
}

/// A number without needless decimals: 250, 0.5, 1234.567.
fn number(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Left-aligned text columns, right-aligned numeric ones, two spaces apart.
fn table(header: &[&str], numeric: &[bool], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                l.push_str("  ");
            }
            if numeric[i] {
                l.extend(std::iter::repeat_n(' ', pad));
                l.push_str(cell);
            } else {
                l.push_str(cell);
                l.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

fn campaign_table(list: &[CampaignOut]) -> String {
    if list.is_empty() {
        return "no campaigns\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            vec![
                c.id.clone(),
                c.status.clone(),
                c.algorithm.clone(),
                number(c.send_rate),
                format!("{:.1}", c.rate_10s),
                c.sent.to_string(),
                c.failed.to_string(),
                if c.active { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATUS",
            "ALGORITHM",
            "SEND_RATE",
            "RATE_10S",
            "SENT",
            "FAILED",
            "ACTIVE",
        ],
        &[false, false, false, true, true, true, true, false],
        &rows,
    )
}

fn campaign_details(c: &CampaignOut) -> String {
    let mut out = String::new();
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<12}{v}");
    };
    kv("id", c.id.clone());
    kv("status", c.status.clone());
    if let Some(reason) = &c.halt_reason {
        kv(
            "halted",
            format!("{reason} (fix the configuration, then `campaign resume`)"),
        );
    }
    kv("send_rate", format!("{}/s", number(c.send_rate)));
    kv("algorithm", c.algorithm.clone());
    kv("burst", c.burst.to_string());
    kv("scope", scope_text(c.limiter_scope.as_deref()));
    kv("weight", number(c.weight));
    kv("rate_10s", format!("{:.1}/s", c.rate_10s));
    kv("sent", c.sent.to_string());
    kv("failed", c.failed.to_string());
    kv("retried", c.retried.to_string());
    kv("invalid", c.invalid.to_string());
    kv("rejected", c.rejected.to_string());
    kv("expired", c.expired.to_string());
    kv("cancelled", c.cancelled.to_string());
    let when = |t: Option<DateTime<Utc>>| t.map_or_else(|| "none".into(), |t| t.to_rfc3339());
    kv("start_at", when(c.start_at));
    kv("expires_at", when(c.expires_at));
    if let (Some(p), Some(e)) = (&c.progress, &c.eta) {
        let total = p.total.map_or_else(|| "unknown".into(), |t| t.to_string());
        kv(
            "progress",
            format!(
                "{} finished of {total}; {} known to remain",
                p.finished, p.known_remaining
            ),
        );
        let eta = e.seconds.map_or_else(
            || "none".into(),
            |s| format!("{s:.0} s at {}/s ({} devices)", number(e.rate), e.basis),
        );
        kv("eta", eta);
    }
    kv(
        "worker",
        match &c.live {
            Some(l) => format!(
                "{}{}, {} in flight, {} open jobs, {} sent since taken up",
                if l.active {
                    "active"
                } else {
                    "waiting for a slot"
                },
                if l.paused { " (paused)" } else { "" },
                l.in_flight,
                l.open_jobs,
                l.sent
            ),
            None => "not held".into(),
        },
    );
    kv("created_at", c.created_at.to_rfc3339());
    kv("updated_at", c.updated_at.to_rfc3339());
    out
}

/// Runs `stats ID` or `stats prune` and returns what to print.
pub async fn run_stats(args: &StatsArgs, settings: &Settings) -> Result<String, CliError> {
    if let Some(StatsCommand::Prune {
        older_than,
        dead_letters_older_than,
        batch,
    }) = &args.command
    {
        let dead_letters = dead_letters_older_than.as_deref().unwrap_or(older_than);
        return prune(settings, older_than, dead_letters, *batch).await;
    }
    let id = args
        .id
        .as_deref()
        .ok_or_else(|| CliError::Invalid("stats needs a campaign ID (or `stats prune`)".into()))?;
    let span = crate::api::parse_duration(&args.last)
        .map_err(|e| CliError::Invalid(format!("--last: {e}")))?;
    let client = Client::new(&args.api, settings)?;
    let url = client.campaign_url(id);
    let bytes = client
        .call(reqwest::Method::GET, url.clone(), None, false)
        .await?;
    let campaign: CampaignOut = decode(&url, &bytes)?;
    // Per second, as the table's heading says, also for spans the API would sum.
    let series_url = format!("{url}/series?last={}s&step=1", span.num_seconds());
    let bytes = client
        .call(reqwest::Method::GET, series_url.clone(), None, false)
        .await?;
    let points: Vec<PointOut> = decode(&series_url, &bytes)?;
    if let Some(path) = &args.svg {
        let svg = stats_svg(&campaign, &points)?;
        std::fs::write(path, svg).map_err(|source| CliError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if args.api.format == OutputFormat::Json {
        let out = serde_json::json!({
            "campaign": campaign.id,
            "send_rate": campaign.send_rate,
            "points": points,
        });
        return Ok(format!("{out:#}\n"));
    }
    Ok(stats_text(&campaign, &points))
}

async fn prune(
    settings: &Settings,
    older_than: &str,
    dead_letters_older_than: &str,
    batch: i64,
) -> Result<String, CliError> {
    let span = crate::api::parse_duration(older_than)
        .map_err(|e| CliError::Invalid(format!("--older-than: {e}")))?;
    let dead_letters_span = crate::api::parse_duration(dead_letters_older_than)
        .map_err(|e| CliError::Invalid(format!("--dead-letters-older-than: {e}")))?;
    let pool = crate::store::connect(
        settings.database.url.expose_secret(),
        1,
        settings.database.connect_timeout(),
    )
    .await?;
    // Pruning first: seconds about to be deleted are not rolled up for nothing.
    let rollup_after = settings.database.rollup_after();
    let report = async {
        let pruned =
            crate::store::prune_with_dead_letters(&pool, span, dead_letters_span, batch).await?;
        let rolled = crate::store::rollup::roll_up(&pool, rollup_after, batch).await?;
        Ok::<_, crate::store::StoreError>((pruned, rolled))
    }
    .await;
    pool.close().await;
    let (report, rolled) = report?;
    Ok(format!(
        "pruned older than {older_than}: {} per-second rows, {} finished job progress rows, {} flush markers, \
         {} per-minute rows; dead letters older than {dead_letters_older_than}: {}\n\
         rolled up older than {} h: {} per-second rows into {} per-minute rows\n",
        report.seconds_deleted,
        report.progress_deleted,
        report.markers_deleted,
        report.minutes_deleted,
        report.dead_letters,
        rollup_after.num_hours(),
        rolled.seconds_rolled,
        rolled.minutes_written
    ))
}

fn stats_text(c: &CampaignOut, points: &[PointOut]) -> String {
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.t.format("%Y-%m-%d %H:%M:%S").to_string(),
                p.sent.to_string(),
                p.failed.to_string(),
                p.retried.to_string(),
            ]
        })
        .collect();
    let mut out = table(
        &["SECOND (UTC)", "SENT", "FAILED", "RETRIED"],
        &[false, true, true, true],
        &rows,
    );
    let sent: Vec<i64> = points.iter().map(|p| p.sent).collect();
    let total: i64 = sent.iter().sum();
    let max = sent.iter().copied().max().unwrap_or(0);
    let mean = if sent.is_empty() {
        0.0
    } else {
        total as f64 / sent.len() as f64
    };
    let _ = writeln!(
        out,
        "\n{}  sent/s over {} s: max {max}, mean {mean:.1}, total {total}; send_rate {}/s",
        c.id,
        points.len(),
        number(c.send_rate)
    );
    let _ = writeln!(out, "{}", sparkline(&sent, 120));
    out
}

/// A Unicode sparkline at most `width` characters wide (seconds averaged per character
/// when there are more); a blank is a stretch with no sends.
pub fn sparkline(values: &[i64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if values.is_empty() || width == 0 {
        return String::new();
    }
    let per = values.len().div_ceil(width);
    let buckets: Vec<f64> = values
        .chunks(per)
        .map(|c| c.iter().sum::<i64>() as f64 / c.len() as f64)
        .collect();
    let max = buckets.iter().copied().fold(0.0, f64::max);
    buckets
        .iter()
        .map(|&v| {
            if v <= 0.0 {
                ' '
            } else {
                let level = ((v / max) * (BARS.len() - 1) as f64).round() as usize;
                BARS[level.min(BARS.len() - 1)]
            }
        })
        .collect()
}

/// The series as an SVG line chart, with send_rate as a dashed line.
pub fn stats_svg(c: &CampaignOut, points: &[PointOut]) -> Result<String, CliError> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| CliError::Chart(e.to_string());
    let n = points.len().max(1) as f64;
    let max = points.iter().map(|p| p.sent).max().unwrap_or(0) as f64;
    let y_max = max.max(c.send_rate * 1.15).max(1.0);
    let start = points
        .first()
        .map(|p| p.t.format("%H:%M:%S UTC").to_string());
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 360)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{}: sends per second, send_rate {}/s",
                    c.id,
                    number(c.send_rate)
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..n, 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(match &start {
                Some(s) => format!("seconds from {s}"),
                None => "seconds".into(),
            })
            .y_desc("per second")
            .max_light_lines(0)
            .draw()
            .map_err(|e| err(&e))?;
        let sent = points
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64 + 0.5, p.sent as f64));
        chart
            .draw_series(LineSeries::new(
                sent,
                RGBColor(31, 119, 180).stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label("sent/s");
        let failed = points
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64 + 0.5, p.failed as f64));
        chart
            .draw_series(LineSeries::new(
                failed,
                RGBColor(214, 39, 40).stroke_width(1),
            ))
            .map_err(|e| err(&e))?
            .label("failed/s");
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, c.send_rate), (n, c.send_rate)],
                6,
                4,
                RGBColor(255, 127, 14).stroke_width(2),
            ))
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sparkline_scales_and_buckets() {
        assert_eq!(sparkline(&[0, 1, 2, 4, 8], 10), " ▂▃▅█");
        assert_eq!(sparkline(&[], 10), "");
        let long: Vec<i64> = (0..300).map(|i| i % 10).collect();
        assert!(sparkline(&long, 120).chars().count() <= 120);
    }

    #[test]
    fn tables_align() {
        let t = table(
            &["ID", "N"],
            &[false, true],
            &[
                vec!["a".into(), "5".into()],
                vec!["bbb".into(), "1234".into()],
            ],
        );
        assert_eq!(t, "ID      N\na       5\nbbb  1234\n");
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode_segment("spring-sale.v2:x"), "spring-sale.v2:x");
        assert_eq!(encode_segment("a/b c?"), "a%2Fb%20c%3F");
    }
}
