//! `pushpace bench`: the end-to-end benchmark harness.
//!
//! It produces its jobs to fresh topics first, then measures each phase against a real
//! broker and PostgreSQL, with the worker as a separate release process (`pushpace run`,
//! configured through `PUSHPACE__*` variables) so that its CPU time and peak RSS are its
//! own:
//!
//! - `consumer`: the physical limit, a plain rdkafka consumer that reads and decodes the
//!   same jobs and does nothing else (in this process);
//! - `null`: the worker with the null sender: sends/s, CPU seconds per million sends,
//!   peak RSS, PostgreSQL statements per flush;
//! - `http1`, `http1-reqwest`, `h2c`: the worker with the HTTP sender against a counting
//!   sink (its own process), over HTTP/1.1 keep-alive (hyper's connection API; reqwest's
//!   client as the baseline) and over HTTP/2 with prior knowledge;
//! - `backlog`: peak RSS while a slow campaign keeps a million devices waiting in Kafka,
//!   and whether a fast campaign behind it still runs;
//! - `pacing`: 100 campaigns whose rates sum to 100,000/s; the per-second counts in
//!   `delivery_seconds` (the null sender counts a send in the second it happens) give
//!   the distribution of |achieved − send_rate| / send_rate over campaign-seconds.
//!
//! Throughput is timed from the worker's `/metrics` (`delivered_total`, which the
//! scheduler publishes within 100 ms of a change), polled every 20 ms: from the first
//! sample that shows a send to the first that shows them all. Both ends lag by the same
//! publishing delay, which mostly cancels. Each phase's send curve is written to
//! `<out-dir>/<run>-<phase>-sends.csv`.

use crate::config::Settings;
use crate::job;
use crate::limiter::Rate;
use crate::produce::{self, ProducePlan};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use secrecy::ExposeSecret;
use serde::Serialize;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Errors of the harness: set-up, a phase that fails or does not finish, I/O.
#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("broker: {0}")]
    Broker(#[from] crate::broker::BrokerError),
    #[error("kafka: {0}")]
    Kafka(#[from] rdkafka::error::KafkaError),
    #[error("database: {0}")]
    Database(#[from] sqlx::Error),
    #[error("store: {0}")]
    Store(#[from] crate::store::StoreError),
    #[error("i/o: {0}")]
    Io(#[from] std::io::Error),
    #[error("http: {0}")]
    Http(#[from] reqwest::Error),
    #[error("phase {phase}: {message}")]
    Phase {
        phase: &'static str,
        message: String,
    },
}

fn phase_err(phase: &'static str, message: impl Into<String>) -> BenchError {
    BenchError::Phase {
        phase,
        message: message.into(),
    }
}

/// The phases, in the order they run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Phase {
    Consumer,
    Null,
    Http1,
    /// HTTP/1.1 through reqwest: the baseline for `http1`, in the same run.
    Http1Reqwest,
    H2c,
    Backlog,
    Pacing,
}

impl Phase {
    const ALL: [Phase; 7] = [
        Phase::Consumer,
        Phase::Null,
        Phase::Http1,
        Phase::Http1Reqwest,
        Phase::H2c,
        Phase::Backlog,
        Phase::Pacing,
    ];

    fn name(self) -> &'static str {
        match self {
            Phase::Consumer => "consumer",
            Phase::Null => "null",
            Phase::Http1 => "http1",
            Phase::Http1Reqwest => "http1-reqwest",
            Phase::H2c => "h2c",
            Phase::Backlog => "backlog",
            Phase::Pacing => "pacing",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct BenchArgs {
    /// Phases to run (default: all), comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub phases: Vec<Phase>,
    /// Campaigns in the throughput phases.
    #[arg(long, default_value_t = 100)]
    pub campaigns: usize,
    /// Devices in all, in the throughput phases.
    #[arg(long, default_value_t = 2_000_000)]
    pub devices: usize,
    /// Devices per job.
    #[arg(long, default_value_t = 500)]
    pub job_size: usize,
    /// Devices waiting behind the slow campaign in the backlog phase.
    #[arg(long, default_value_t = 1_000_000)]
    pub backlog_devices: usize,
    /// How long the backlog phase watches the worker, in seconds.
    #[arg(long, default_value_t = 20)]
    pub backlog_seconds: u64,
    /// Sum of the 100 campaigns' rates in the pacing phase (sends per second).
    #[arg(long, default_value_t = 100_000.0)]
    pub pacing_total_rate: f64,
    /// How long each pacing campaign runs at its rate, in seconds.
    #[arg(long, default_value_t = 30)]
    pub pacing_seconds: u64,
    /// Sends in flight at once in the throughput phases (`sender.max_in_flight`).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u32).range(1..))]
    pub max_in_flight: u32,
    /// Where worker and sink logs go.
    #[arg(long, default_value = "target/bench")]
    pub out_dir: PathBuf,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep the bench databases afterwards (topics are always kept).
    #[arg(long)]
    pub keep: bool,
}

/// One phase's figures; fields that do not apply are `None`.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PhaseResult {
    pub phase: String,
    pub devices: u64,
    pub seconds: f64,
    pub per_second: f64,
    pub cpu_s_per_million: Option<f64>,
    pub peak_rss_mb: Option<f64>,
    pub statements_per_flush: Option<f64>,
    pub server_statements_per_flush: Option<f64>,
    pub note: String,
}

/// The pacing distribution.
#[derive(Debug, Clone, Default, Serialize)]
pub struct PacingResult {
    pub campaigns: usize,
    pub total_rate: f64,
    pub campaign_seconds: usize,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
    pub max_over_rate: f64,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct BenchReport {
    pub run_id: String,
    pub cores: usize,
    pub phases: Vec<PhaseResult>,
    pub pacing: Option<PacingResult>,
    pub null_over_consumer: Option<f64>,
    /// `http1` (hyper connections) over `http1-reqwest`, sends per second.
    pub http1_over_reqwest: Option<f64>,
}

/// Runs the harness; prints the table and returns the report.
pub async fn run(settings: &Settings, args: &BenchArgs) -> Result<BenchReport, BenchError> {
    let phases: Vec<Phase> = if args.phases.is_empty() {
        Phase::ALL.to_vec()
    } else {
        Phase::ALL
            .into_iter()
            .filter(|p| args.phases.contains(p))
            .collect()
    };
    std::fs::create_dir_all(&args.out_dir)?;
    let run_id = format!("b{}", chrono::Utc::now().format("%H%M%S"));
    let ctx = Ctx {
        settings: settings.clone(),
        run_id: run_id.clone(),
        out_dir: args.out_dir.clone(),
        exe: std::env::current_exe()?,
        max_in_flight: args.max_in_flight,
    };
    let mut report = BenchReport {
        run_id: run_id.clone(),
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ..Default::default()
    };
    let mut databases = Vec::new();

    let throughput = phases.iter().any(|p| {
        matches!(
            p,
            Phase::Consumer | Phase::Null | Phase::Http1 | Phase::Http1Reqwest | Phase::H2c
        )
    });
    let mut plan = None;
    if throughput {
        let per_campaign = args.devices.div_ceil(args.campaigns.max(1));
        // 1 M/s each: far above what a worker reaches, so the limiters never bind.
        let p = ProducePlan::uniform(
            &format!("{run_id}t"),
            args.campaigns.max(1),
            per_campaign,
            Rate::per_second(1_000_000.0).expect("a valid rate"),
            args.job_size,
        );
        let topic = ctx.topic("throughput");
        ctx.produce(&topic, &p).await?;
        plan = Some((topic, p));
    }
    for phase in phases {
        eprintln!("[bench] phase {}", phase.name());
        let result = match phase {
            Phase::Consumer => {
                let (topic, p) = plan.as_ref().expect("produced above");
                ctx.plain_consumer(topic, p).await?
            }
            Phase::Null | Phase::Http1 | Phase::Http1Reqwest | Phase::H2c => {
                let (topic, p) = plan.as_ref().expect("produced above");
                let db = ctx.database(&phase.name().replace('-', "_"));
                databases.push(db.clone());
                ctx.worker_throughput(phase, topic, p, &db).await?
            }
            Phase::Backlog => {
                let topic = ctx.topic("backlog");
                let db = ctx.database("backlog");
                databases.push(db.clone());
                ctx.backlog(&topic, &db, args).await?
            }
            Phase::Pacing => {
                let topic = ctx.topic("pacing");
                let db = ctx.database("pacing");
                databases.push(db.clone());
                let (r, pacing) = ctx.pacing(&topic, &db, args).await?;
                report.pacing = Some(pacing);
                r
            }
        };
        eprintln!("[bench] {}", one_line(&result));
        report.phases.push(result);
    }
    let rate_of = |name: &str| {
        report
            .phases
            .iter()
            .find(|r| r.phase == name)
            .map(|r| r.per_second)
    };
    if let (Some(null), Some(plain)) = (rate_of("null"), rate_of("consumer")) {
        report.null_over_consumer = Some(null / plain);
    }
    if let (Some(lean), Some(baseline)) = (rate_of("http1"), rate_of("http1-reqwest")) {
        report.http1_over_reqwest = Some(lean / baseline);
    }
    if !args.keep {
        ctx.clean_up(&databases).await;
    }
    print!("{}", render_table(&report));
    if let Some(path) = &args.json {
        std::fs::write(
            path,
            serde_json::to_vec_pretty(&report).map_err(std::io::Error::other)?,
        )?;
    }
    Ok(report)
}

fn one_line(r: &PhaseResult) -> String {
    format!(
        "{}: {} devices in {:.2} s = {:.0}/s {}",
        r.phase, r.devices, r.seconds, r.per_second, r.note
    )
}

/// The figures as a plain-text table.
pub fn render_table(report: &BenchReport) -> String {
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".to_string(), |v| format!("{v:.prec$}"));
    let mut out = format!(
        "\npushpace bench {} ({} cores)\n{:<13} {:>10} {:>8} {:>12} {:>12} {:>9} {:>11}  note\n",
        report.run_id,
        report.cores,
        "phase",
        "devices",
        "seconds",
        "per second",
        "cpu s / 1M",
        "peak MB",
        "stmt/flush"
    );
    for r in &report.phases {
        out.push_str(&format!(
            "{:<13} {:>10} {:>8.2} {:>12.0} {:>12} {:>9} {:>11}  {}\n",
            r.phase,
            r.devices,
            r.seconds,
            r.per_second,
            opt(r.cpu_s_per_million, 2),
            opt(r.peak_rss_mb, 1),
            opt(r.statements_per_flush, 2),
            r.note
        ));
    }
    if let Some(ratio) = report.null_over_consumer {
        out.push_str(&format!(
            "null sender / plain consumer: {ratio:.2}× the device rate\n"
        ));
    }
    if let Some(ratio) = report.http1_over_reqwest {
        out.push_str(&format!(
            "http1 (hyper connections) / http1-reqwest: {ratio:.2}× the send rate\n"
        ));
    }
    if let Some(p) = &report.pacing {
        out.push_str(&format!(
            "pacing: {} campaigns summing to {:.0}/s, {} campaign-seconds: |achieved − rate| / rate p50 {:.2}% p99 {:.2}% max {:.2}%; largest second {:.3}× its rate\n",
            p.campaigns,
            p.total_rate,
            p.campaign_seconds,
            p.p50 * 100.0,
            p.p99 * 100.0,
            p.max * 100.0,
            p.max_over_rate
        ));
    }
    out
}

struct Ctx {
    settings: Settings,
    run_id: String,
    out_dir: PathBuf,
    exe: PathBuf,
    max_in_flight: u32,
}

/// Where the worker process is, and how to read it.
struct WorkerProcess {
    child: Child,
    metrics_url: String,
    http: reqwest::Client,
    /// Where `time_until` writes the send curve (CSV).
    curve_path: PathBuf,
}

/// One poll of a worker process.
#[derive(Debug, Clone, Copy, Default)]
struct Sample {
    at: Option<Instant>,
    sends: u64,
    cpu_s: f64,
    flushes: f64,
    statements: f64,
    parked: f64,
    buffered_devices: f64,
    paused_partitions: f64,
}

impl Ctx {
    fn topic(&self, what: &str) -> String {
        format!("pushpace.bench.{}.{what}", self.run_id)
    }

    fn database(&self, phase: &str) -> String {
        format!("pushpace_bench_{}_{phase}", self.run_id)
    }

    fn database_url(&self, name: &str) -> String {
        let base = self.settings.database.url.expose_secret();
        match url::Url::parse(base) {
            Ok(mut u) => {
                u.set_path(name);
                u.to_string()
            }
            Err(_) => format!("postgres://postgres@127.0.0.1:5432/{name}"),
        }
    }

    async fn produce(&self, topic: &str, plan: &ProducePlan) -> Result<(), BenchError> {
        let brokers = &self.settings.kafka.brokers;
        crate::broker::ensure_topic(brokers, topic, self.settings.kafka.partitions).await?;
        let bar = progress_bar(plan.total_devices() as u64, "producing");
        produce::produce(brokers, topic, plan, |d| bar.inc(d as u64)).await?;
        bar.finish_and_clear();
        eprintln!(
            "[bench] produced {} jobs, {} devices to {topic}",
            plan.total_jobs(),
            plan.total_devices()
        );
        Ok(())
    }

    /// The physical limit: read and decode every job, nothing else.
    async fn plain_consumer(
        &self,
        topic: &str,
        plan: &ProducePlan,
    ) -> Result<PhaseResult, BenchError> {
        let mut kafka = self.settings.kafka.clone();
        kafka.group_id = format!("{}-plain", self.run_id);
        let consumer: BaseConsumer =
            crate::broker::consumer_config(&kafka, &self.settings.kafka.brokers).create()?;
        consumer.subscribe(&[topic])?;
        let jobs = plan.total_jobs();
        let total = plan.total_devices() as u64;
        let result = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(300);
            let mut first = None;
            let mut read = 0usize;
            let mut devices = 0u64;
            let mut bad = 0usize;
            while read < jobs && Instant::now() < deadline {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        first.get_or_insert_with(Instant::now);
                        read += 1;
                        match job::decode(m.payload().unwrap_or(&[])) {
                            Ok(j) => devices += j.devices.len() as u64,
                            Err(_) => bad += 1,
                        }
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "plain consumer"),
                    None => {}
                }
            }
            (first.map(|f| f.elapsed()), read, devices, bad)
        })
        .await
        .map_err(|e| phase_err("consumer", e.to_string()))?;
        let (elapsed, read, devices, bad) = result;
        if read < jobs || bad > 0 || devices != total {
            return Err(phase_err(
                "consumer",
                format!("read {read} of {jobs} jobs ({devices} devices, {bad} undecodable)"),
            ));
        }
        let secs = elapsed.unwrap_or_default().as_secs_f64();
        Ok(PhaseResult {
            phase: "consumer".into(),
            devices,
            seconds: secs,
            per_second: devices as f64 / secs,
            note: format!(
                "plain rdkafka consumer + job decode, {:.0} jobs/s",
                jobs as f64 / secs
            ),
            ..Default::default()
        })
    }

    /// Starts `pushpace run` on `topic` with a fresh database and the given extra settings.
    async fn start_worker(
        &self,
        phase: &'static str,
        topic: &str,
        db: &str,
        extra: &[(&str, String)],
    ) -> Result<WorkerProcess, BenchError> {
        let port = free_port()?;
        let log = std::fs::File::create(
            self.out_dir
                .join(format!("{}-{phase}-worker.log", self.run_id)),
        )?;
        let mut cmd = Command::new(&self.exe);
        cmd.arg("run")
            .env("PUSHPACE__KAFKA__BROKERS", &self.settings.kafka.brokers)
            .env("PUSHPACE__KAFKA__TOPIC", topic)
            .env(
                "PUSHPACE__KAFKA__GROUP_ID",
                format!("{}-{phase}", self.run_id),
            )
            .env(
                "PUSHPACE__KAFKA__ISOLATION_LEVEL",
                self.settings.kafka.isolation_level.as_str(),
            )
            .env("PUSHPACE__DATABASE__URL", self.database_url(db))
            .env("PUSHPACE__HTTP__BIND", format!("127.0.0.1:{port}"))
            .env("RUST_LOG", "info,sqlx=warn,rdkafka=warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        for (k, v) in extra {
            cmd.env(k, v);
        }
        let child = cmd.spawn()?;
        let w = WorkerProcess {
            child,
            curve_path: self
                .out_dir
                .join(format!("{}-{phase}-sends.csv", self.run_id)),
            metrics_url: format!("http://127.0.0.1:{port}/metrics"),
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(5))
                .build()?,
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        let health = format!("http://127.0.0.1:{port}/healthz");
        loop {
            if w.http.get(&health).send().await.is_ok() {
                return Ok(w);
            }
            if Instant::now() > deadline {
                return Err(phase_err(
                    phase,
                    "the worker did not answer /healthz within 60 s",
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The worker on the throughput topic, with the null or the HTTP sender.
    async fn worker_throughput(
        &self,
        phase: Phase,
        topic: &str,
        plan: &ProducePlan,
        db: &str,
    ) -> Result<PhaseResult, BenchError> {
        let name = phase.name();
        let mut sink = None;
        let mut extra: Vec<(&str, String)> = vec![
            // Every send in flight is a job device held; room for the HTTP round trips.
            (
                "PUSHPACE__SENDER__MAX_IN_FLIGHT",
                self.max_in_flight.to_string(),
            ),
        ];
        match phase {
            Phase::Null => extra.push(("PUSHPACE__SENDER__KIND", "null".into())),
            _ => {
                let port = free_port()?;
                let log = std::fs::File::create(
                    self.out_dir
                        .join(format!("{}-{name}-sink.log", self.run_id)),
                )?;
                let child = Command::new(&self.exe)
                    .args(["sink", "--count-only", "--bind"])
                    .arg(format!("127.0.0.1:{port}"))
                    .stdin(Stdio::null())
                    .stdout(log.try_clone()?)
                    .stderr(log)
                    .spawn()?;
                sink = Some((child, port));
                wait_for_port(port, Duration::from_secs(20)).await?;
                extra.push(("PUSHPACE__SENDER__KIND", "http".into()));
                extra.push((
                    "PUSHPACE__SENDER__URL",
                    format!("http://127.0.0.1:{port}/push"),
                ));
                extra.push((
                    "PUSHPACE__SENDER__HTTP2_PRIOR_KNOWLEDGE",
                    (phase == Phase::H2c).to_string(),
                ));
                let client = if phase == Phase::Http1Reqwest {
                    "reqwest"
                } else {
                    "hyper"
                };
                extra.push(("PUSHPACE__SENDER__HTTP1_CLIENT", client.into()));
            }
        }
        let total = plan.total_devices() as u64;
        let mut w = self.start_worker(name, topic, db, &extra).await?;
        let timed = w.time_until(name, total, Duration::from_secs(600)).await;
        let flush = w.sample().await.unwrap_or_default();
        let server = server_statements_per_flush(&self.database_url(db), flush.flushes).await;
        let peak = w.stop().await;
        // The sink's own CPU, to tell which side of the loopback limits the rate.
        let (sink_requests, sink_cpu) = match sink {
            Some((mut child, port)) => {
                let n = sink_requests(port).await;
                let cpu = cpu_seconds(child.id());
                stop_child(&mut child).await;
                (n, cpu)
            }
            None => (None, None),
        };
        let (secs, sent, cpu) = timed?;
        let mut note = match phase {
            Phase::Null => "null sender".to_string(),
            Phase::Http1 => {
                "HTTP/1.1 keep-alive (hyper connections) to a loopback sink process".to_string()
            }
            Phase::Http1Reqwest => {
                "HTTP/1.1 keep-alive (reqwest, the baseline) to a loopback sink process".to_string()
            }
            _ => "HTTP/2 (h2c) to a loopback sink process".to_string(),
        };
        if let Some(n) = sink_requests {
            note.push_str(&format!(", sink saw {n} requests"));
        }
        if let Some(cpu) = sink_cpu {
            note.push_str(&format!(
                ", sink CPU {:.2} s per 1M",
                cpu / (sent as f64 / 1e6)
            ));
        }
        Ok(PhaseResult {
            phase: name.into(),
            devices: total,
            seconds: secs,
            per_second: sent as f64 / secs,
            cpu_s_per_million: Some(cpu / (sent as f64 / 1e6)),
            peak_rss_mb: peak,
            statements_per_flush: (flush.flushes > 0.0).then(|| flush.statements / flush.flushes),
            server_statements_per_flush: server,
            note,
        })
    }

    /// Peak RSS with a slow campaign's million devices waiting in Kafka.
    async fn backlog(
        &self,
        topic: &str,
        db: &str,
        args: &BenchArgs,
    ) -> Result<PhaseResult, BenchError> {
        // One slow campaign (its jobs first in every partition it uses) and a fast one
        // behind it: the fast one must finish while the slow one's backlog waits.
        let fast_devices = 50_000usize;
        let mut plan = ProducePlan::with_rates(
            &format!("{}k", self.run_id),
            &[(10.0, args.backlog_devices), (5_000.0, fast_devices)],
            args.job_size,
            None,
        )
        .expect("valid rates");
        plan.run_id = format!("{}k", self.run_id);
        self.produce(topic, &plan).await?;
        let mut w = self
            .start_worker(
                "backlog",
                topic,
                db,
                &[("PUSHPACE__SENDER__KIND", "null".into())],
            )
            .await?;
        let started = Instant::now();
        let watch = Duration::from_secs(args.backlog_seconds);
        let mut last = Sample::default();
        let mut max_parked: f64 = 0.0;
        while started.elapsed() < watch {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Ok(s) = w.sample().await {
                max_parked = max_parked.max(s.parked);
                last = s;
            }
        }
        let peak = w.stop().await;
        // The fast campaign's deliveries and their span, from its per-second rows.
        let pool = crate::store::connect(&self.database_url(db), 1, Duration::from_secs(5)).await?;
        let (fast_sent, fast_span): (i64, f64) = sqlx::query_as(
            "SELECT coalesce(sum(sent), 0)::int8, \
                    coalesce(extract(epoch FROM max(second) - min(second))::float8 + 1, 0) \
             FROM delivery_seconds WHERE campaign_id = $1",
        )
        .bind(format!("{}-c1", plan.run_id))
        .fetch_one(&pool)
        .await?;
        pool.close().await;
        Ok(PhaseResult {
            phase: "backlog".into(),
            devices: plan.total_devices() as u64,
            seconds: watch.as_secs_f64(),
            per_second: last.sends as f64 / watch.as_secs_f64(),
            peak_rss_mb: peak,
            note: format!(
                "{} devices at 10/s waiting, up to {max_parked} jobs parked; fast campaign (5,000/s): {fast_sent} of {fast_devices} delivered over {fast_span:.0} s",
                args.backlog_devices,
            ),
            ..Default::default()
        })
    }

    /// 100 campaigns at rates summing to `pacing_total_rate`, each for `pacing_seconds`.
    async fn pacing(
        &self,
        topic: &str,
        db: &str,
        args: &BenchArgs,
    ) -> Result<(PhaseResult, PacingResult), BenchError> {
        let n = 100usize;
        let rates = pacing_rates(n, args.pacing_total_rate);
        let campaigns: Vec<(f64, usize)> = rates
            .iter()
            .map(|r| (*r, (r * args.pacing_seconds as f64).round() as usize))
            .collect();
        let plan = ProducePlan::with_rates(
            &format!("{}p", self.run_id),
            &campaigns,
            args.job_size,
            None,
        )
        .map_err(|e| phase_err("pacing", e.to_string()))?;
        self.produce(topic, &plan).await?;
        let total = plan.total_devices() as u64;
        let mut w = self
            .start_worker(
                "pacing",
                topic,
                db,
                &[("PUSHPACE__SENDER__KIND", "null".into())],
            )
            .await?;
        let limit = Duration::from_secs(args.pacing_seconds * 3 + 60);
        let timed = w.time_until("pacing", total, limit).await;
        let peak = w.stop().await;
        let (secs, sent, cpu) = timed?;
        let pool = crate::store::connect(&self.database_url(db), 2, Duration::from_secs(5)).await?;
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT campaign_id, extract(epoch FROM second)::int8, sent FROM delivery_seconds ORDER BY campaign_id, second",
        )
        .fetch_all(&pool)
        .await?;
        pool.close().await;
        let rate_of: std::collections::HashMap<String, f64> = plan
            .campaigns
            .iter()
            .map(|c| (c.id.clone(), c.send_rate.as_f64()))
            .collect();
        let pacing = pacing_distribution(&rows, &rate_of);
        let result = PhaseResult {
            phase: "pacing".into(),
            devices: total,
            seconds: secs,
            per_second: sent as f64 / secs,
            cpu_s_per_million: Some(cpu / (sent as f64 / 1e6)),
            peak_rss_mb: peak,
            note: format!(
                "100 campaigns, {:.0}–{:.0}/s, summing to {:.0}/s",
                rates[0],
                rates[n - 1],
                args.pacing_total_rate
            ),
            ..Default::default()
        };
        Ok((result, pacing))
    }

    /// Drops the bench databases. Topics are left in place: tansu 0.6.0 answers a
    /// DeleteTopics request for one topic by deleting every topic it has.
    async fn clean_up(&self, databases: &[String]) {
        let Ok(pool) =
            crate::store::connect(&self.database_url("postgres"), 1, Duration::from_secs(5)).await
        else {
            return;
        };
        for db in databases {
            // Names are built here from the run id: [a-z0-9_] only, quoted all the same.
            let sql = format!("DROP DATABASE IF EXISTS \"{db}\" WITH (FORCE)");
            if let Err(e) = sqlx::query(&sql).execute(&pool).await {
                tracing::warn!(error = %e, database = %db, "could not drop a bench database");
            }
        }
        pool.close().await;
    }
}

impl WorkerProcess {
    fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn metrics(&self) -> Result<String, BenchError> {
        Ok(self
            .http
            .get(&self.metrics_url)
            .send()
            .await?
            .text()
            .await?)
    }

    async fn sample(&self) -> Result<Sample, BenchError> {
        let text = self.metrics().await?;
        let at = Instant::now();
        let mut s = Sample {
            at: Some(at),
            cpu_s: cpu_seconds(self.pid()).unwrap_or(0.0),
            ..Default::default()
        };
        for line in text.lines() {
            if line.starts_with("delivered_total ") {
                s.sends = metric_value(line) as u64;
            } else if line.starts_with("stats_flushes_total ") {
                s.flushes = metric_value(line);
            } else if line.starts_with("stats_flush_statements_total ") {
                s.statements = metric_value(line);
            } else if line.starts_with("parked_jobs ") {
                s.parked = metric_value(line);
            } else if line.starts_with("buffered_devices ") {
                s.buffered_devices = metric_value(line);
            } else if line.starts_with("paused_partitions ") {
                s.paused_partitions = metric_value(line);
            }
        }
        Ok(s)
    }

    /// Polls until `total` sends: (seconds from first send to last, sends timed, CPU s).
    async fn time_until(
        &mut self,
        phase: &'static str,
        total: u64,
        limit: Duration,
    ) -> Result<(f64, u64, f64), BenchError> {
        let deadline = Instant::now() + limit;
        let mut first: Option<Sample> = None;
        let mut last = Sample::default();
        // The send curve, for telling a slow start or tail from a slow middle.
        let started = Instant::now();
        let mut curve = String::from(
            "seconds,sends,cpu_seconds,buffered_devices,parked_jobs,paused_partitions\n",
        );
        let bar = progress_bar(total, phase);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bar.abandon();
                return Err(phase_err(
                    phase,
                    format!("the worker exited early: {status}"),
                ));
            }
            if let Ok(s) = self.sample().await {
                bar.set_position(s.sends);
                if let Some(at) = s.at {
                    let t = (at - started).as_secs_f64();
                    curve.push_str(&format!(
                        "{t:.3},{},{:.3},{},{},{}\n",
                        s.sends, s.cpu_s, s.buffered_devices, s.parked, s.paused_partitions
                    ));
                }
                if s.sends > 0 && first.is_none() {
                    first = Some(s);
                }
                last = s;
                if s.sends >= total {
                    break;
                }
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        bar.finish_and_clear();
        if let Err(e) = std::fs::write(&self.curve_path, &curve) {
            tracing::warn!(error = %e, "cannot write the send curve");
        }
        let Some(first) = first.filter(|_| last.sends >= total) else {
            return Err(phase_err(
                phase,
                format!("sent {} of {total} within {limit:?}", last.sends),
            ));
        };
        let secs = match (first.at, last.at) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let sent = last.sends - first.sends;
        Ok((secs.max(1e-3), sent, last.cpu_s - first.cpu_s))
    }

    /// SIGTERM, wait; returns the peak RSS in MB read just before.
    async fn stop(&mut self) -> Option<f64> {
        let peak = peak_rss_mb(self.pid());
        stop_child(&mut self.child).await;
        peak
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// SIGTERM, then SIGKILL after 20 s.
async fn stop_child(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: kill(2) with a pid this process spawned and has not reaped yet.
    unsafe {
        libc::kill(pid, libc::SIGTERM);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(Some(_)) = child.try_wait() {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = child.kill();
    let _ = child.wait();
}

fn metric_value(line: &str) -> f64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// User + system CPU seconds of a process, all threads.
fn cpu_seconds(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the parenthesised command name; utime and stime are the 12th and 13th.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks.max(1.0))
}

/// The peak resident set (VmHWM) of a process, in MB.
fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

async fn wait_for_port(port: u16, limit: Duration) -> Result<(), BenchError> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(phase_err("sink", format!("nothing listens on port {port}")))
}

async fn sink_requests(port: u16) -> Option<u64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/_sink/stats"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let body: crate::sink::CountingSummary = serde_json::from_str(&text).ok()?;
    Some(body.requests)
}

/// Server-side statements per flush from pg_stat_statements, when it is loaded.
async fn server_statements_per_flush(url: &str, flushes: f64) -> Option<f64> {
    if flushes <= 0.0 {
        return None;
    }
    let pool = crate::store::connect(url, 1, Duration::from_secs(5))
        .await
        .ok()?;
    let calls: Option<i64> = sqlx::query_scalar(
        "SELECT sum(s.calls)::int8 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
         WHERE d.datname = current_database() \
           AND (s.query ILIKE '%delivery_seconds%' OR s.query ILIKE '%job_progress%') \
           AND s.query ILIKE 'WITH marker%'",
    )
    .fetch_one(&pool)
    .await
    .ok()
    .flatten();
    pool.close().await;
    calls.map(|c| c as f64 / flushes)
}

/// `n` rates spread evenly from `lowest` up, summing to `total`.
pub fn pacing_rates(n: usize, total: f64) -> Vec<f64> {
    // An arithmetic series from total/n/10 to 2·total/n − total/n/10: mean total/n.
    let mean = total / n as f64;
    let low = mean / 10.0;
    let high = 2.0 * mean - low;
    (0..n)
        .map(|i| {
            if n == 1 {
                mean
            } else {
                low + (high - low) * i as f64 / (n - 1) as f64
            }
        })
        .collect()
}

/// |achieved − rate| / rate over every campaign-second but each campaign's first and
/// last (partial) seconds.
pub fn pacing_distribution(
    rows: &[(String, i64, i64)],
    rates: &std::collections::HashMap<String, f64>,
) -> PacingResult {
    let mut errors = Vec::new();
    let mut max_over: f64 = 0.0;
    let mut i = 0;
    while i < rows.len() {
        let id = &rows[i].0;
        let mut j = i;
        while j < rows.len() && &rows[j].0 == id {
            j += 1;
        }
        if let Some(rate) = rates.get(id) {
            let seconds = &rows[i..j];
            if seconds.len() > 2 {
                let (first, last) = (seconds[0].1, seconds[seconds.len() - 1].1);
                // Every whole second between the first and the last, gaps counted as 0.
                let counts: std::collections::HashMap<i64, i64> =
                    seconds.iter().map(|r| (r.1, r.2)).collect();
                for s in first + 1..last {
                    let n = counts.get(&s).copied().unwrap_or(0) as f64;
                    errors.push((n - rate).abs() / rate);
                    max_over = max_over.max(n / rate);
                }
            }
        }
        i = j;
    }
    errors.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if errors.is_empty() {
            0.0
        } else {
            errors[((errors.len() - 1) as f64 * p).round() as usize]
        }
    };
    PacingResult {
        campaigns: rates.len(),
        total_rate: rates.values().sum(),
        campaign_seconds: errors.len(),
        p50: pct(0.5),
        p99: pct(0.99),
        max: errors.last().copied().unwrap_or(0.0),
        max_over_rate: max_over,
    }
}

fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} {what} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} ({{per_sec}})"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_rates_sum_to_the_total_and_rise() {
        let r = pacing_rates(100, 100_000.0);
        let sum: f64 = r.iter().sum();
        assert!((sum - 100_000.0).abs() < 1e-6, "{sum}");
        assert!((r[0] - 100.0).abs() < 1e-9);
        assert!((r[99] - 1900.0).abs() < 1e-9);
        assert!(r.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_distribution_skips_partial_seconds_and_counts_gaps() {
        let rows = vec![
            ("a".to_string(), 10, 37),  // first: partial, skipped
            ("a".to_string(), 11, 100), // exact
            ("a".to_string(), 12, 102), // 2 % over
            // 13 missing: a whole second with nothing sent, 100 % off
            ("a".to_string(), 14, 99), // 1 % under
            ("a".to_string(), 15, 5),  // last: partial, skipped
        ];
        let rates = [("a".to_string(), 100.0)].into_iter().collect();
        let p = pacing_distribution(&rows, &rates);
        assert_eq!(p.campaign_seconds, 4);
        assert!((p.max - 1.0).abs() < 1e-9);
        assert!((p.max_over_rate - 1.02).abs() < 1e-9);
        // Sorted errors 0, 0.01, 0.02, 1.0: the median (index 2 of 0..=3, rounded) is 0.02.
        assert!((p.p50 - 0.02).abs() < 1e-9, "{}", p.p50);
    }
}
