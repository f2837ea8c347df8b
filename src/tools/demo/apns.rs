//! `pushpace demo --provider apns`: the demo against the in-process APNs mock over TLS
//! and HTTP/2, with a fresh `.p8` key (ES256 JWT auth) and hex device tokens. Progress
//! and the summary come from what the mock accepted; at the end it prints a few of the
//! mock's answers and the dead token's `410 Unregistered`, as recorded by the worker.

use super::feed::Feeder;
use super::{plan_campaigns, progress_bar, start_api, summary_table, DemoArgs, DemoError, DemoRow};
use crate::config::Settings;
use crate::limiter::Algorithm;
use crate::provider::build::build_one;
use crate::provider::settings::{
    ApnsEnvironment, ApnsSpec, CommonSpec, NamedProvider, ProviderSpec,
};
use crate::provider::Providers;
use crate::tools::mock::apns::{ApnsMock, MockApnsConfig};
use crate::tools::mock::tls::TestCa;
use crate::tools::produce::{PlannedCampaign, TokenStyle};
use crate::worker::Worker;
use secrecy::SecretString;
use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

const TEAM: &str = "DEMOTEAM01";
const KEY_ID: &str = "DEMOKEY001";
const TOPIC: &str = "com.example.pushpace.demo";

/// Per campaign, as the mock counted it from one tick to the next.
#[derive(Default, Clone)]
struct Seen {
    distinct: u64,
    duplicates: u64,
    max_1s: u64,
    first: Option<Instant>,
    /// Delivered at the first tick that saw any.
    first_count: u64,
    last: Option<Instant>,
}

pub(super) async fn run(
    settings: Settings,
    args: &DemoArgs,
    pool: sqlx::PgPool,
    bootstrap: String,
) -> Result<Vec<DemoRow>, DemoError> {
    let ca = TestCa::new();
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let mock = ApnsMock::start(
        &ca,
        MockApnsConfig::new(TEAM, KEY_ID, &pair.public_key_pem(), TOPIC),
    )?;
    println!(
        "APNs mock (TLS, ALPN h2, ES256 JWT checked) listening on {}",
        mock.url()
    );
    let providers = Providers::new(
        vec![build_one(&apns_provider(&settings, &ca, &mock, &pair))?],
        "apns",
    )?;

    let run_id = format!("demo{}", chrono::Utc::now().format("%H%M%S"));
    let (plan, algorithms, _scheduled) = plan_campaigns(&settings, &pool, args, &run_id).await?;
    let style = TokenStyle::ApnsHex { dead: Some(0) };
    let dead = style.device(&run_id, &plan.campaigns[0].id, 0, 0);
    let mut feeder = Feeder::new(
        &settings.kafka,
        &bootstrap,
        &settings.kafka.topic,
        &run_id,
        style,
        plan.campaigns.clone(),
        false,
    )?;
    feeder.top_up(|_| 0).await?;
    println!(
        "{} campaigns ({} devices, one of them a dead token), produced as they send",
        plan.campaigns.len(),
        plan.total_devices(),
    );

    let mut settings = settings;
    settings.kafka.group_id = format!("pushpace-{run_id}");
    if let Err(e) = crate::metrics::install() {
        tracing::warn!(error = %e, "metrics recorder not installed");
    }
    let worker = Worker::start(&settings, pool.clone(), bootstrap.clone(), providers).await?;
    let api = start_api(&settings, &pool, &worker, &bootstrap).await;
    if let Some(app) = &api {
        println!("dashboard: {}/", app.url());
    }
    let deadline = Duration::from_secs(args.sized_seconds() * 3 + 30);
    let seen = follow(&mock, &plan.campaigns, &mut feeder, deadline).await?;
    if let Some(app) = api {
        let _ = app.stop().await;
    }
    worker.shutdown().await?;

    let rows: Vec<DemoRow> = plan
        .campaigns
        .iter()
        .zip(algorithms)
        .zip(&seen)
        .map(|((c, algorithm), s)| demo_row(c, algorithm, s))
        .collect();
    println!("\n{}", summary_table(&rows));
    println!("(the first campaign's one lost device is the dead token)");
    print_answers(&mock, &pool, &dead).await;
    Ok(rows)
}

/// Prints each campaign's progress once a second, from what the mock accepted, and
/// tops the feed up, until every deliverable device arrived or `deadline` passed.
async fn follow(
    mock: &ApnsMock,
    campaigns: &[PlannedCampaign],
    feeder: &mut Feeder,
    deadline: Duration,
) -> Result<Vec<Seen>, DemoError> {
    let started = Instant::now();
    // Every device but the dead one is deliverable.
    let total = campaigns.iter().map(|c| c.devices as u64).sum::<u64>() - 1;
    let mut seen = vec![Seen::default(); campaigns.len()];
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.tick().await;
    loop {
        tick.tick().await;
        let now = Instant::now();
        let counts = per_campaign(mock, campaigns.len());
        let by_id: HashMap<&str, u64> = campaigns
            .iter()
            .zip(&counts)
            .map(|(c, n)| (c.id.as_str(), n.0))
            .collect();
        feeder
            .top_up(|id| by_id.get(id).copied().unwrap_or(0))
            .await?;
        let mut out = format!("t={:>3}s", started.elapsed().as_secs());
        for ((c, s), &(distinct, duplicates)) in campaigns.iter().zip(&mut seen).zip(&counts) {
            let last_1s = distinct.saturating_sub(s.distinct);
            if last_1s > 0 {
                if s.first.is_none() {
                    (s.first, s.first_count) = (Some(now), distinct);
                }
                s.last = Some(now);
            }
            s.max_1s = s.max_1s.max(last_1s);
            (s.distinct, s.duplicates) = (distinct, duplicates);
            let bar = progress_bar(distinct, c.devices as u64, 12);
            let _ = write!(
                out,
                "\n  {:<24} target {:>6}/s  last 1s {:>6}  {:>7}/{:<7} {bar}",
                c.id,
                c.send_rate.as_f64(),
                last_1s,
                distinct,
                c.devices
            );
        }
        println!("{out}");
        let done: u64 = seen.iter().map(|s| s.distinct).sum();
        if done >= total || started.elapsed() >= deadline {
            return Ok(seen);
        }
    }
}

/// One campaign's summary row. The rate is taken between the first and the last tick
/// that saw sends (ticks are 1 s apart; what came before the first tick is left out).
fn demo_row(c: &PlannedCampaign, algorithm: Algorithm, s: &Seen) -> DemoRow {
    let span = match (s.first, s.last) {
        (Some(a), Some(b)) => (b - a).as_secs_f64(),
        _ => 0.0,
    };
    let between = s.distinct - s.first_count;
    DemoRow {
        campaign: c.id.clone(),
        algorithm,
        target: c.send_rate.as_f64(),
        devices: c.devices as u64,
        delivered_distinct: s.distinct,
        duplicates: s.duplicates,
        mean_rate: if span > 0.0 {
            between as f64 / span
        } else {
            0.0
        },
        max_1s: s.max_1s,
        duration_s: span,
        dropped_by_broker: 0,
        unsent: 0,
    }
}

/// The provider the worker sends through: the mock's URL, CA and key.
fn apns_provider(
    settings: &Settings,
    ca: &TestCa,
    mock: &ApnsMock,
    pair: &rcgen::KeyPair,
) -> NamedProvider {
    NamedProvider {
        name: "apns".into(),
        spec: ProviderSpec::Apns(ApnsSpec {
            name: "apns".into(),
            team_id: TEAM.into(),
            key_id: KEY_ID.into(),
            key_pem: SecretString::from(pair.serialize_pem()),
            topic: TOPIC.into(),
            environment: ApnsEnvironment::Sandbox,
            endpoint: mock.url(),
            connections: 2,
            token_refresh: Duration::from_secs(50 * 60),
            common: CommonSpec {
                ca_pem: Some(ca.ca_pem().into_bytes()),
                ca_file: None,
                max_rate: None,
                timeout: Duration::from_millis(settings.sender.timeout_ms),
                max_in_flight: settings.sender.max_in_flight,
                adaptive: Some(crate::provider::ceiling::CeilingParams::default()),
                app: None,
            },
        }),
    }
}

/// (distinct tokens delivered, duplicates) per campaign index, from the tokens' first
/// 16 hex digits (campaign index + 1).
fn per_campaign(mock: &ApnsMock, campaigns: usize) -> Vec<(u64, u64)> {
    let mut out = vec![(0u64, 0u64); campaigns];
    let tokens: HashMap<String, u32> = mock.controls().delivered_tokens();
    for (token, n) in tokens {
        let index = token
            .get(..16)
            .and_then(|h| usize::from_str_radix(h, 16).ok())
            .and_then(|i| i.checked_sub(1));
        if let Some(slot) = index.and_then(|i| out.get_mut(i)) {
            slot.0 += 1;
            slot.1 += u64::from(n.saturating_sub(1));
        }
    }
    out
}

/// A few of the mock's answers, and whether the worker recorded the dead token.
async fn print_answers(mock: &ApnsMock, pool: &sqlx::PgPool, dead: &str) {
    println!("a few of the APNs mock's answers:");
    for p in mock.controls().delivered().iter().take(3) {
        println!(
            "  200  apns-id {}  token {}…  topic {}  push-type {}  priority {}",
            p.apns_id,
            &p.token[..12.min(p.token.len())],
            p.topic,
            p.push_type.as_deref().unwrap_or("-"),
            p.priority.as_deref().unwrap_or("-"),
        );
    }
    let gone = mock.controls().answers("Unregistered");
    println!(
        "  410  {{\"reason\":\"Unregistered\"}} for token {}… ({gone}×)",
        &dead[..12]
    );
    let recorded: Option<String> = sqlx::query_scalar(
        "SELECT reason FROM invalid_tokens WHERE token_hash = sha256($1::bytea)",
    )
    .bind(dead.as_bytes())
    .fetch_optional(pool)
    .await
    .ok()
    .flatten();
    match recorded {
        Some(reason) => println!("  the worker recorded it in invalid_tokens ({reason}): counted invalid, skipped from now on"),
        None => println!("  the dead token is not in invalid_tokens (yet)"),
    }
}
