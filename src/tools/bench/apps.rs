//! The `apps` phase (issue 55 at scale): many registered apps, some of them sending,
//! against the three loopback mock processes, with one worker process throughout.
//!
//! In order: a worker on an empty registry (its RSS), `--apps-registered` apps put into
//! PostgreSQL, a second worker on them (its RSS with every app idle); one small job per
//! sending app so that each opens its pool (RSS and `app_connections_open` then); each
//! kind's apps sending flat out in turn (CPU per send, set beside the static phase of the
//! same kind in the same round); `--apps-late` apps put one at a time while their jobs
//! wait (PUT to the first send the worker counts); and paced campaigns at ≥ 100/s, some
//! under an app `max_rate` below their summed rate (each whole second from
//! `delivery_seconds`). The mocks accept one APNs key and one FCM service account, so
//! APNs and FCM apps share those (each app still has its own pool and token source);
//! Web Push apps each sign with their own VAPID key.

use super::mockcmd::MockInfo;
use super::process::{free_port, metric_value, stop_child};
use super::process::{Sample, Timed, WorkerProcess};
use super::{phase_err, BenchArgs, BenchError, Ctx, PhaseResult};
use crate::apps::{Keyring, MasterKey};
use crate::job::Job;
use crate::limiter::Rate;
use crate::tools::mock::seeded::SeededSubscriptions;
use futures::StreamExt;
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde::Serialize;
use serde_json::json;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

mod pacing;
mod render;

pub(super) use render::render;

const KINDS: [&str; 3] = ["apns", "fcm", "webpush"];
const NAME: &str = "apps";

/// The scale figures of the `apps` phase (the throughput rows are phases of their own).
#[derive(Debug, Clone, Default, Serialize)]
pub struct AppsResult {
    pub registered: usize,
    pub sending: usize,
    /// Seconds the concurrent PUTs of the registry took.
    pub register_seconds: f64,
    pub rss_no_apps_mb: f64,
    pub rss_registered_idle_mb: f64,
    /// (idle − none) / apps registered then.
    pub bytes_per_idle_app: f64,
    pub pools: usize,
    pub app_connections_open: f64,
    /// RSS with the first half of the pools open, then with all.
    pub rss_half_pools_mb: f64,
    pub rss_pools_open_mb: f64,
    /// (all open − idle) / pools: slots, campaigns, pools and each kind's first use.
    pub bytes_per_pool: f64,
    /// (all open − half open) / the second half: each pool with its slot and campaign.
    pub bytes_per_pool_marginal: f64,
    /// Each late app's PUT to the first send the worker counted, ms.
    pub put_to_first_send_ms: Vec<f64>,
    pub paced_campaigns: usize,
    pub capped_apps: usize,
    /// Worst whole second of any paced campaign: |achieved − rate| / rate.
    pub campaign_worst: f64,
    pub campaign_seconds: usize,
    pub campaign_over_1pct: usize,
    /// Worst whole second of any capped app's summed sends against its `max_rate`.
    pub cap_worst: f64,
    pub cap_seconds: usize,
}

/// One app of the phase: its id and kind.
struct App {
    id: String,
    kind: &'static str,
}

/// The three mocks and what the apps' bodies take from them.
struct Mocks {
    children: Vec<Child>,
    apns_key: String,
    apns: MockInfo,
    fcm_account: serde_json::Value,
    fcm: MockInfo,
    webpush: SeededSubscriptions,
    ca_file: std::path::PathBuf,
}

impl Ctx {
    /// The whole phase; the mocks are stopped whatever happens.
    pub(super) async fn apps_phase(
        &self,
        args: &BenchArgs,
        db: &str,
    ) -> Result<(Vec<PhaseResult>, AppsResult), BenchError> {
        let mut mocks = self.start_mocks().await?;
        let result = self.apps_run(args, db, &mocks).await;
        for c in &mut mocks.children {
            stop_child(c).await;
        }
        result
    }

    async fn apps_run(
        &self,
        args: &BenchArgs,
        db: &str,
        mocks: &Mocks,
    ) -> Result<(Vec<PhaseResult>, AppsResult), BenchError> {
        let topic = self.topic(NAME);
        let kafka = &self.settings.kafka;
        crate::broker::ensure_topic(kafka, &kafka.brokers, &topic, kafka.partitions).await?;
        let key = MasterKey::generate();
        let keyring = Keyring::new(
            MasterKey::from_base64(&key.to_base64()).map_err(|e| phase_err(NAME, e.to_string()))?,
            vec![],
        )
        .map_err(|e| phase_err(NAME, e.to_string()))?;
        let sending = args.apps_sending.min(args.apps_registered);
        let late = args.apps_late.min(sending);
        let active = (sending + 2 * args.apps_paced + 100).clamp(100, 10_000);
        let env: Vec<(&str, String)> = vec![
            ("PUSHPACE__APPS__MASTER_KEY", key.to_base64().to_string()),
            (
                "PUSHPACE__APPS__CA_FILE",
                mocks.ca_file.display().to_string(),
            ),
            (
                "PUSHPACE__SENDER__MAX_IN_FLIGHT",
                self.max_in_flight.to_string(),
            ),
            ("PUSHPACE__WORKER__MAX_ACTIVE_CAMPAIGNS", active.to_string()),
        ];
        let mut out = AppsResult {
            registered: args.apps_registered,
            sending,
            ..Default::default()
        };
        // The empty registry: the worker creates and migrates the database.
        let mut w = self.start_worker("apps-empty", &topic, db, &env).await?;
        out.rss_no_apps_mb = settled_rss(&w).await;
        w.stop().await;

        let apps: Vec<App> = (0..args.apps_registered)
            .map(|i| App {
                id: format!("{}-app-{i:05}", self.run_id),
                kind: KINDS[i % 3],
            })
            .collect();
        let pool = self.database_pool(db, 8).await?;
        let (early, late_apps) = apps[..sending].split_at(sending - late);
        let registered_first: Vec<&App> = early.iter().chain(apps[sending..].iter()).collect();
        let started = Instant::now();
        put_apps(&pool, &keyring, mocks, &registered_first, &[]).await?;
        out.register_seconds = started.elapsed().as_secs_f64();
        eprintln!(
            "[bench] apps: {} apps registered in {:.1} s",
            registered_first.len(),
            out.register_seconds
        );
        let mut w = self.start_worker(NAME, &topic, db, &env).await?;
        out.rss_registered_idle_mb = settled_rss(&w).await;
        out.bytes_per_idle_app = (out.rss_registered_idle_mb - out.rss_no_apps_mb) * 1048576.0
            / registered_first.len().max(1) as f64;

        let producer: FutureProducer =
            crate::broker::producer_config(kafka, &kafka.brokers).create()?;
        let result = self
            .apps_sending(
                args, &mut w, &producer, &topic, &pool, &keyring, mocks, early, late_apps, &mut out,
            )
            .await;
        let peak = w.stop().await;
        let mut rows = result?;
        let paced = self.apps_pacing_figures(&pool, args, early, &mut out).await;
        pool.close().await;
        paced?;
        for r in &mut rows {
            r.peak_rss_mb = peak;
        }
        Ok((rows, out))
    }

    /// Pools, the per-kind throughput, the late PUTs and the paced campaigns, all through
    /// the running worker `w`.
    #[allow(clippy::too_many_arguments)]
    async fn apps_sending(
        &self,
        args: &BenchArgs,
        w: &mut WorkerProcess,
        producer: &FutureProducer,
        topic: &str,
        pool: &sqlx::PgPool,
        keyring: &Keyring,
        mocks: &Mocks,
        early: &[App],
        late: &[App],
        out: &mut AppsResult,
    ) -> Result<Vec<PhaseResult>, BenchError> {
        let unlimited = 1_000_000.0;
        // One small job per early sending app opens its pool: half the apps, then the
        // others, so that the second half's RSS is the pools' own, without what a kind's
        // first use costs once.
        let half = early.len() / 2;
        let mut rss = [0.0; 2];
        for (h, apps) in [&early[..half], &early[half..]].iter().enumerate() {
            let jobs: Vec<Job> = apps
                .iter()
                .enumerate()
                .map(|(i, a)| self.app_job(mocks, a, &format!("o{h}-{i}"), 0, 2, unlimited))
                .collect();
            let base = w.sample().await?.sends;
            send_jobs(producer, topic, &jobs).await?;
            wait_sends(w, base + 2 * apps.len() as u64, Duration::from_secs(300)).await?;
            tokio::time::sleep(Duration::from_secs(3)).await;
            rss[h] = rss_mb(w.pid()).unwrap_or(0.0);
        }
        out.pools = early.len();
        out.rss_half_pools_mb = rss[0];
        out.rss_pools_open_mb = rss[1];
        out.app_connections_open = metric(w, "app_connections_open").await.unwrap_or(0.0);
        let mb = 1048576.0;
        out.bytes_per_pool = (rss[1] - out.rss_registered_idle_mb) * mb / early.len().max(1) as f64;
        out.bytes_per_pool_marginal = (rss[1] - rss[0]) * mb / (early.len() - half).max(1) as f64;

        let mut rows = Vec::new();
        for (k, kind) in KINDS.iter().enumerate() {
            let of_kind: Vec<&App> = early.iter().filter(|a| a.kind == *kind).collect();
            let per_app = if *kind == "webpush" {
                args.apps_webpush_devices
            } else {
                args.apps_devices
            };
            if of_kind.is_empty() || per_app == 0 {
                continue;
            }
            let jobs: Vec<Job> = of_kind
                .iter()
                .enumerate()
                .flat_map(|(i, a)| {
                    (0..per_app.div_ceil(args.job_size)).map(move |j| {
                        let n = (per_app - j * args.job_size).min(args.job_size);
                        (i, j, a, n)
                    })
                })
                .map(|(i, j, a, n)| {
                    let from = (j * args.job_size) as u64;
                    let mut job = self.app_job(mocks, a, &format!("t{k}-{i}"), from, n, unlimited);
                    job.job_id = format!("{}-j{j}", job.job_id);
                    job
                })
                .collect();
            let total = (of_kind.len() * per_app) as u64;
            let before = w.sample().await?;
            send_jobs(producer, topic, &jobs).await?;
            let t = timed_sends(w, before, total, Duration::from_secs(600)).await?;
            let name = format!("apps-{kind}");
            rows.push(PhaseResult {
                note: format!(
                    "{} {kind} apps × {per_app} devices, each app its own pool (pools warm)",
                    of_kind.len()
                ),
                ..PhaseResult::timed(&name, total, t)
            });
        }
        self.late_puts(w, producer, topic, pool, keyring, mocks, late, out)
            .await?;
        self.paced_sends(args, w, producer, topic, pool, keyring, mocks, early, out)
            .await?;
        Ok(rows)
    }

    /// Late apps' jobs first, then each app's PUT alone, timed to the worker's next send.
    #[allow(clippy::too_many_arguments)]
    async fn late_puts(
        &self,
        w: &WorkerProcess,
        producer: &FutureProducer,
        topic: &str,
        pool: &sqlx::PgPool,
        keyring: &Keyring,
        mocks: &Mocks,
        late: &[App],
        out: &mut AppsResult,
    ) -> Result<(), BenchError> {
        let per_app = 20;
        let jobs: Vec<Job> = late
            .iter()
            .enumerate()
            .map(|(i, a)| self.app_job(mocks, a, &format!("l{i}"), 0, per_app, 1_000_000.0))
            .collect();
        send_jobs(producer, topic, &jobs).await?;
        // Until the worker holds them all (waiting for their apps), at most 10 s.
        let want = (late.len() * per_app) as f64;
        let end = Instant::now() + Duration::from_secs(10);
        while metric(w, "buffered_devices").await.unwrap_or(0.0) < want && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        for app in late {
            let before = w.sample().await?.sends;
            // Counted at the provider's answer, not at the scheduler's 100 ms publish.
            let label = format!("provider=\"app/{}/{}\"", app.id, app.kind);
            let at = Instant::now();
            put_apps(pool, keyring, mocks, &[app], &[]).await?;
            while delivered_through(w, &label).await == 0.0 {
                if at.elapsed() > Duration::from_secs(30) {
                    let what = format!("app {} sent nothing in 30 s", app.id);
                    return Err(phase_err(NAME, what));
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            out.put_to_first_send_ms
                .push(at.elapsed().as_secs_f64() * 1e3);
            wait_sends(w, before + per_app as u64, Duration::from_secs(60)).await?;
        }
        Ok(())
    }

    /// A job of app `a` in campaign `<run>-<a>-<tag>`: `n` devices from `from` on.
    fn app_job(&self, mocks: &Mocks, a: &App, tag: &str, from: u64, n: usize, rate: f64) -> Job {
        let campaign = format!("{}-{tag}", a.id);
        let index: u64 =
            a.id.rsplit('-')
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
        // Distinct per app and campaign tag: the tag's hash in the high bits.
        let tag_bits = tag
            .bytes()
            .fold(7u64, |h, b| h.wrapping_mul(31).wrapping_add(b as u64));
        let devices: Vec<String> = (from..from + n as u64)
            .map(|d| match a.kind {
                // Leading zeros: never one of the mock's error markers.
                "apns" => format!("{:08x}{:08x}{:048x}", tag_bits & 0xfff_ffff, index + 1, d),
                "fcm" => format!("{campaign}-dev-{d:07}"),
                _ => mocks
                    .webpush
                    .subscription(((tag_bits & 0xffff) << 44) | (index << 24) | d),
            })
            .collect();
        let payload = match a.kind {
            "apns" => r#"{"aps":{"alert":{"title":"pushpace","body":"paced hello"}}}"#,
            "fcm" => r#"{"notification":{"title":"pushpace","body":"paced hello"}}"#,
            _ => r#"{"title":"pushpace","body":"paced hello"}"#,
        };
        let payload = serde_json::value::RawValue::from_string(payload.into()).expect("JSON");
        let mut job = Job::new(format!("{campaign}-job"), campaign, devices, payload)
            .expect("generated jobs follow the rules")
            .with_app(Some(a.id.clone()))
            .with_send_rate(Rate::per_second(rate).expect("a valid rate"));
        job.provider = Some(a.kind.into());
        job
    }

    /// The three mocks as processes, and one CA file trusting all three.
    async fn start_mocks(&self) -> Result<Mocks, BenchError> {
        let mut children = Vec::new();
        let mut infos = Vec::new();
        for kind in KINDS {
            let dir = self
                .out_dir
                .join(format!("{}-apps-{kind}-mock", self.run_id));
            match self.spawn_mock(kind, &dir).await {
                Ok((child, info)) => {
                    children.push(child);
                    infos.push((dir, info));
                }
                Err(e) => {
                    for c in &mut children {
                        stop_child(c).await;
                    }
                    return Err(e);
                }
            }
        }
        let read = |dir: &Path, f: &str| std::fs::read_to_string(dir.join(f));
        let mut ca = String::new();
        for (dir, _) in &infos {
            ca.push_str(&read(dir, "ca.pem")?);
        }
        let ca_file = self.out_dir.join(format!("{}-apps-ca.pem", self.run_id));
        std::fs::write(&ca_file, ca)?;
        let bad = |what: &str| phase_err(NAME, format!("the mock wrote no usable {what}"));
        let fcm_account = serde_json::from_str(&read(&infos[1].0, "service_account.json")?)
            .map_err(|_| bad("service account"))?;
        let seed = infos[2]
            .1
            .seed
            .as_deref()
            .and_then(super::mockcmd::parse_seed);
        let webpush = SeededSubscriptions::new(&infos[2].1.url, seed.ok_or_else(|| bad("seed"))?);
        let apns_key = read(&infos[0].0, "key.p8")?;
        let mut infos = infos.into_iter().map(|(_, i)| i);
        Ok(Mocks {
            children,
            apns_key,
            apns: infos.next().expect("three mocks"),
            fcm_account,
            fcm: infos.next().expect("three mocks"),
            webpush,
            ca_file,
        })
    }

    /// `pushpace mock <kind>` on a free port; waits for its `provider.json`.
    async fn spawn_mock(&self, kind: &str, dir: &Path) -> Result<(Child, MockInfo), BenchError> {
        let _ = std::fs::remove_dir_all(dir);
        let log = std::fs::File::create(dir.with_extension("log"))?;
        let mut child = Command::new(&self.exe)
            .args(["mock", kind, "--bind"])
            .arg(format!("127.0.0.1:{}", free_port()?))
            .arg("--dir")
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let info = std::fs::read(dir.join("provider.json")).ok();
            if let Some(info) = info.and_then(|b| serde_json::from_slice(&b).ok()) {
                return Ok((child, info));
            }
            if child.try_wait()?.is_some() || Instant::now() > deadline {
                stop_child(&mut child).await;
                return Err(phase_err(NAME, format!("the {kind} mock did not start")));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// An app's PUT body for the mock of its kind, with `max_rate` if given.
fn body(mocks: &Mocks, kind: &str, max_rate: Option<f64>) -> serde_json::Value {
    let s = &mocks.apns.settings;
    let get = |k: &str| s.get(k).cloned().unwrap_or_default();
    let mut kind_body = match kind {
        "apns" => json!({"key": mocks.apns_key, "key_id": get("key_id"),
            "team_id": get("team_id"), "topic": get("topic"),
            "environment": "sandbox", "endpoint": mocks.apns.url}),
        "fcm" => json!({"service_account": mocks.fcm_account, "endpoint": mocks.fcm.url}),
        _ => {
            use p256::pkcs8::EncodePrivateKey;
            let key = p256::SecretKey::random(&mut aes_gcm::aead::OsRng);
            let pem = key
                .to_pkcs8_pem(p256::pkcs8::LineEnding::LF)
                .expect("a fresh key encodes");
            json!({"vapid_key": pem.as_str(), "subject": "mailto:bench@example.com"})
        }
    };
    if let Some(r) = max_rate {
        kind_body["max_rate"] = json!(r);
    }
    json!({ kind: kind_body })
}

/// Puts `apps` (eight at a time); `caps` gives some of them a `max_rate`.
async fn put_apps(
    pool: &sqlx::PgPool,
    keyring: &Keyring,
    mocks: &Mocks,
    apps: &[&App],
    caps: &[(usize, f64)],
) -> Result<(), BenchError> {
    let puts = apps.iter().enumerate().map(|(i, a)| {
        let cap = caps.iter().find(|c| c.0 == i).map(|c| c.1);
        let text = body(mocks, a.kind, cap).to_string();
        async move {
            let input = crate::apps::parse_app(text.as_bytes())
                .map_err(|e| phase_err(NAME, format!("app {}: {e}", a.id)))?;
            crate::apps::store::put(pool, Some(keyring), &a.id, &input, Some("bench"))
                .await
                .map_err(|e| phase_err(NAME, format!("app {}: {e}", a.id)))
        }
    });
    let mut results = futures::stream::iter(puts).buffer_unordered(8);
    while let Some(r) = results.next().await {
        r?;
    }
    Ok(())
}

/// Writes `jobs` to `topic`, keyed by campaign, 256 in flight.
async fn send_jobs(producer: &FutureProducer, topic: &str, jobs: &[Job]) -> Result<(), BenchError> {
    let sends = jobs.iter().map(|job| {
        let (value, key) = (job.to_json(), job.campaign_id.clone());
        async move {
            producer
                .send(
                    FutureRecord::to(topic).key(&key).payload(&value),
                    Duration::from_secs(60),
                )
                .await
                .map_err(|(e, _)| BenchError::Kafka(e))
        }
    });
    let mut results = futures::stream::iter(sends).buffer_unordered(256);
    while let Some(r) = results.next().await {
        r?;
    }
    Ok(())
}

/// `provider_answers_total` of class `delivered` for the provider `label` names.
async fn delivered_through(w: &WorkerProcess, label: &str) -> f64 {
    let Ok(text) = w.metrics().await else {
        return 0.0;
    };
    text.lines()
        .filter(|l| l.starts_with("provider_answers_total{") && l.contains(label))
        .filter(|l| l.contains("class=\"delivered\""))
        .map(metric_value)
        .sum()
}

/// One gauge or counter of the worker's `/metrics`.
async fn metric(w: &WorkerProcess, name: &str) -> Option<f64> {
    let text = w.metrics().await.ok()?;
    let line = text
        .lines()
        .find(|l| l.starts_with(name) && l[name.len()..].starts_with(' '))?;
    Some(metric_value(line))
}

/// Polls until the worker has sent `total` in all.
async fn wait_sends(w: &WorkerProcess, total: u64, limit: Duration) -> Result<(), BenchError> {
    let end = Instant::now() + limit;
    loop {
        let sent = w.sample().await.map(|s| s.sends).unwrap_or(0);
        if sent >= total {
            return Ok(());
        }
        if Instant::now() > end {
            return Err(phase_err(
                NAME,
                format!("sent {sent} of {total} within {limit:?}"),
            ));
        }
        // Sparse: a scrape renders every app provider's series, which is not free.
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// From sample `f`, taken before the jobs were produced, to the first sample with `n`
/// more sends: the worker's CPU and the host's steal between. Unlike `time_until`, the
/// window starts before the first send (a kind's run is too short for the first sample
/// past it to come early), so the rate is a lower bound.
async fn timed_sends(
    w: &WorkerProcess,
    f: Sample,
    n: u64,
    limit: Duration,
) -> Result<Timed, BenchError> {
    let end = Instant::now() + limit;
    let base = f.sends;
    loop {
        let s = w.sample().await?;
        if s.sends >= base + n {
            let (a, b) = (f.at.expect("sampled"), s.at.expect("sampled"));
            let ticks = s.host.total.saturating_sub(f.host.total);
            let steal = s.host.steal.saturating_sub(f.host.steal);
            return Ok(Timed {
                secs: (b - a).as_secs_f64().max(1e-3),
                sent: s.sends - f.sends,
                cpu: s.cpu_s - f.cpu_s,
                steal: (ticks > 0).then(|| steal as f64 / ticks as f64),
            });
        }
        if Instant::now() > end {
            return Err(phase_err(NAME, format!("sent {} of {n}", s.sends - base)));
        }
        let near = s.sends >= base + n / 100 * 95;
        tokio::time::sleep(Duration::from_millis(if near { 20 } else { 200 })).await;
    }
}

/// The worker's RSS 5 s after it answered: the same moment for both registry sizes.
async fn settled_rss(w: &WorkerProcess) -> f64 {
    tokio::time::sleep(Duration::from_secs(5)).await;
    rss_mb(w.pid()).unwrap_or(0.0)
}

/// The resident set now (VmRSS), in MB.
fn rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}
