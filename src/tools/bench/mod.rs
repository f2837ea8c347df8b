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
//!   the distribution of |achieved − send_rate| / send_rate over campaign-seconds;
//! - `apps`: registered apps at scale against the three provider mocks (issue 55), see
//!   [`apps`].
//!
//! Throughput is timed from the worker's `/metrics` (`delivered_total`, which the
//! scheduler publishes within 100 ms of a change), polled every 20 ms: from the first
//! sample that shows a send to the first that shows them all. Both ends lag by the same
//! publishing delay, which mostly cancels. Each phase's send curve is written to
//! `<out-dir>/<run>-<phase>-sends.csv`.

mod apps;
pub mod mockcmd;
mod phases;
mod process;
mod providers;
mod report;

pub use apps::AppsResult;
pub use phases::{
    long_tail_rates, pacing_1000_figures, pacing_distribution, pacing_rates, PACING_1000_TOTAL,
};
pub use report::{render_table, BenchReport, Pacing1000Result, PacingResult, PhaseResult};

use crate::config::Settings;
use crate::limiter::Rate;
use crate::tools::produce::{self, ProducePlan};
use process::{
    cpu_seconds, free_port, progress_bar, server_statements_per_flush, sink_requests, stop_child,
    wait_for_port, WorkerProcess,
};
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
    /// 100 campaigns at `pacing-1000`'s summed rate: its baseline at the same rate.
    #[value(name = "pacing-same-rate")]
    #[serde(rename = "pacing-same-rate")]
    PacingSameRate,
    /// 1,000 campaigns at a long-tailed mix of rates (issue 24).
    #[value(name = "pacing-1000")]
    #[serde(rename = "pacing-1000")]
    Pacing1000,
    /// APNs over TLS + HTTP/2 to `pushpace mock apns` (a process).
    Apns,
    /// FCM HTTP v1 to `pushpace mock fcm`.
    Fcm,
    /// Web Push (encryption + VAPID) to `pushpace mock webpush`.
    Webpush,
    /// Registered apps at scale through the three mocks (issue 55).
    Apps,
}

impl Phase {
    const ALL: [Phase; 13] = [
        Phase::Consumer,
        Phase::Null,
        Phase::Http1,
        Phase::Http1Reqwest,
        Phase::H2c,
        Phase::Apns,
        Phase::Fcm,
        Phase::Webpush,
        Phase::Apps,
        Phase::Backlog,
        Phase::Pacing,
        Phase::PacingSameRate,
        Phase::Pacing1000,
    ];

    pub(super) fn name(self) -> &'static str {
        match self {
            Phase::Consumer => "consumer",
            Phase::Null => "null",
            Phase::Http1 => "http1",
            Phase::Http1Reqwest => "http1-reqwest",
            Phase::H2c => "h2c",
            Phase::Backlog => "backlog",
            Phase::Pacing => "pacing",
            Phase::PacingSameRate => "pacing-same-rate",
            Phase::Pacing1000 => "pacing-1000",
            Phase::Apns => "apns",
            Phase::Fcm => "fcm",
            Phase::Webpush => "webpush",
            Phase::Apps => "apps",
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
    /// Devices in the webpush phase (each message is encrypted: far slower).
    #[arg(long, default_value_t = 20_000)]
    pub webpush_devices: usize,
    /// `connections` of the APNs and FCM providers (default: the provider's default).
    #[arg(long)]
    pub provider_connections: Option<usize>,
    /// Apps registered in the `apps` phase.
    #[arg(long, default_value_t = 10_000)]
    pub apps_registered: usize,
    /// Of those, the apps that send (a third each APNs, FCM, Web Push).
    #[arg(long, default_value_t = 1_000)]
    pub apps_sending: usize,
    /// Of the sending apps, those put while their jobs wait (PUT to first send).
    #[arg(long, default_value_t = 30)]
    pub apps_late: usize,
    /// Devices per APNs or FCM app in the `apps` throughput runs.
    #[arg(long, default_value_t = 600)]
    pub apps_devices: usize,
    /// Devices per Web Push app there (each message is encrypted).
    #[arg(long, default_value_t = 30)]
    pub apps_webpush_devices: usize,
    /// Apps with two paced campaigns each (every second one capped), for
    /// `pacing_seconds`.
    #[arg(long, default_value_t = 12)]
    pub apps_paced: usize,
    /// Where worker and sink logs go.
    #[arg(long, default_value = "target/bench")]
    pub out_dir: PathBuf,
    /// Also write the results as JSON to this file.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Keep the bench databases afterwards (topics are always kept).
    #[arg(long)]
    pub keep: bool,
    /// Runs the phases this many times over, in turn, each on a topic and database of
    /// its own: a machine whose speed drifts then shows it in the spread, and a ratio
    /// between phases is read from neighbours (median over the rounds).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=20))]
    pub rounds: u32,
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
    let plan = if throughput {
        Some(ctx.throughput_plan(args).await?)
    } else {
        None
    };
    for round in 1..=args.rounds {
        let ctx = ctx.round(round);
        for &phase in &phases {
            eprintln!("[bench] phase {} (round {round})", phase.name());
            let mut result = ctx
                .run_phase(phase, plan.as_ref(), args, &mut databases, &mut report)
                .await?;
            result.round = round;
            eprintln!("[bench] {}", report::one_line(&result));
            report.phases.push(result);
            // A phase that gave several rows (`apps`) left the others' round unset.
            for r in report.phases.iter_mut().filter(|r| r.round == 0) {
                r.round = round;
            }
        }
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

impl Ctx {
    /// The throughput phases' shared topic and plan, produced once.
    async fn throughput_plan(&self, args: &BenchArgs) -> Result<(String, ProducePlan), BenchError> {
        let per_campaign = args.devices.div_ceil(args.campaigns.max(1));
        // 1 M/s each: far above what a worker reaches, so the limiters never bind.
        let p = ProducePlan::uniform(
            &format!("{}t", self.run_id),
            args.campaigns.max(1),
            per_campaign,
            Rate::per_second(1_000_000.0).expect("a valid rate"),
            args.job_size,
        );
        let topic = self.topic("throughput");
        self.produce(&topic, &p).await?;
        Ok((topic, p))
    }

    /// Runs one phase on a database of its own (named in `databases` for the clean-up);
    /// the pacing phases also fill in their part of `report`.
    async fn run_phase(
        &self,
        phase: Phase,
        plan: Option<&(String, ProducePlan)>,
        args: &BenchArgs,
        databases: &mut Vec<String>,
        report: &mut BenchReport,
    ) -> Result<PhaseResult, BenchError> {
        let mut database = |name: &str| {
            let db = self.database(name);
            databases.push(db.clone());
            db
        };
        Ok(match phase {
            Phase::Consumer => {
                let (topic, p) = plan.expect("produced for the throughput phases");
                self.plain_consumer(topic, p).await?
            }
            Phase::Null | Phase::Http1 | Phase::Http1Reqwest | Phase::H2c => {
                let (topic, p) = plan.expect("produced for the throughput phases");
                let db = database(&phase.name().replace('-', "_"));
                self.worker_throughput(phase, topic, p, &db).await?
            }
            Phase::Backlog => {
                let db = database("backlog");
                self.backlog(&self.topic("backlog"), &db, args).await?
            }
            Phase::Apns | Phase::Fcm | Phase::Webpush => {
                let db = database(phase.name());
                self.provider_phase(phase, args, &db).await?
            }
            Phase::Apps => {
                let db = database("apps");
                let (mut rows, apps) = self.apps_phase(args, &db).await?;
                report.apps.push(apps);
                let last = rows.pop().ok_or_else(|| phase_err("apps", "no app sent"))?;
                report.phases.extend(rows);
                last
            }
            Phase::Pacing => {
                let db = database("pacing");
                let (r, pacing) = self.pacing(&self.topic("pacing"), &db, args, phase).await?;
                report.pacing.push(pacing);
                r
            }
            Phase::PacingSameRate => {
                let db = database("pacing_same_rate");
                let (r, pacing) = self
                    .pacing(&self.topic("pacing_same_rate"), &db, args, phase)
                    .await?;
                report.pacing.push(pacing);
                r
            }
            Phase::Pacing1000 => {
                let db = database("pacing_1000");
                let (r, pacing) = self
                    .pacing_1000(&self.topic("pacing_1000"), &db, args)
                    .await?;
                report.pacing_1000.push(pacing);
                r
            }
        })
    }
}

#[derive(Clone)]
struct Ctx {
    settings: Settings,
    run_id: String,
    out_dir: PathBuf,
    exe: PathBuf,
    max_in_flight: u32,
}

impl Ctx {
    /// The context of round `n` (1-based): after the first, its topics, databases,
    /// groups and files carry the round in their names.
    fn round(&self, n: u32) -> Ctx {
        let mut ctx = self.clone();
        if n > 1 {
            ctx.run_id = format!("{}r{n}", self.run_id);
        }
        ctx
    }

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

    /// A pool on database `name` of the configured server, with `[database]`'s TLS and
    /// password.
    async fn database_pool(
        &self,
        name: &str,
        max_connections: u32,
    ) -> Result<sqlx::PgPool, crate::store::StoreError> {
        let options = self.settings.database.connect_options_for(name)?;
        crate::store::connect_with(options, max_connections, Duration::from_secs(5)).await
    }

    async fn produce(&self, topic: &str, plan: &ProducePlan) -> Result<(), BenchError> {
        self.produce_styled(topic, plan, &produce::TokenStyle::Plain)
            .await
    }

    async fn produce_styled(
        &self,
        topic: &str,
        plan: &ProducePlan,
        style: &produce::TokenStyle,
    ) -> Result<(), BenchError> {
        let brokers = &self.settings.kafka.brokers;
        crate::broker::ensure_topic(
            &self.settings.kafka,
            brokers,
            topic,
            self.settings.kafka.partitions,
        )
        .await?;
        let bar = progress_bar(plan.total_devices() as u64, "producing");
        produce::produce_styled(&self.settings.kafka, brokers, topic, plan, style, |d| {
            bar.inc(d as u64)
        })
        .await?;
        bar.finish_and_clear();
        eprintln!(
            "[bench] produced {} jobs, {} devices to {topic}",
            plan.total_jobs(),
            plan.total_devices()
        );
        Ok(())
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
        // PUSHPACE_BENCH_WORKER_WRAPPER runs the worker under a profiler, e.g.
        // "valgrind --tool=callgrind" (its figures then measure the profiler too).
        let wrapper = std::env::var("PUSHPACE_BENCH_WORKER_WRAPPER").unwrap_or_default();
        let mut words = wrapper.split_whitespace();
        let mut cmd = match words.next() {
            Some(program) => {
                let mut c = Command::new(program);
                c.args(words).arg(&self.exe);
                c
            }
            None => Command::new(&self.exe),
        };
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
        // Its own process group, so that stopping it also stops a wrapper's worker.
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let child = cmd.spawn()?;
        let w = WorkerProcess {
            child,
            wrapped: !wrapper.trim().is_empty(),
            curve_path: self
                .out_dir
                .join(format!("{}-{phase}-sends.csv", self.run_id)),
            // The bench samples every 20 ms: without the per-campaign series, so that the
            // sampling does not cost the worker more with more campaigns.
            metrics_url: format!("http://127.0.0.1:{port}/metrics?per_campaign=false"),
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
        let (sink, extra) = self.sender_for(phase).await?;
        let total = plan.total_devices() as u64;
        let mut w = self.start_worker(name, topic, db, &extra).await?;
        let timed = w.time_until(name, total, Duration::from_secs(600)).await;
        let flush = w.sample().await.unwrap_or_default();
        let server = match self.database_pool(db, 1).await {
            Ok(pool) => server_statements_per_flush(&pool, flush.flushes).await,
            Err(_) => None,
        };
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
        let t = timed?;
        let sent = t.sent;
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
            peak_rss_mb: peak,
            statements_per_flush: (flush.flushes > 0.0).then(|| flush.statements / flush.flushes),
            server_statements_per_flush: server,
            peer_cpu_s_per_million: sink_cpu.map(|c| c / (sent as f64 / 1e6)),
            note,
            ..PhaseResult::timed(name, total, t)
        })
    }

    /// The worker's sender settings for a throughput phase, and for the HTTP phases the
    /// counting sink process they send to (with its port).
    async fn sender_for(
        &self,
        phase: Phase,
    ) -> Result<(Option<(Child, u16)>, Vec<(&'static str, String)>), BenchError> {
        let mut extra: Vec<(&str, String)> = vec![
            // Every send in flight is a job device held; room for the HTTP round trips.
            (
                "PUSHPACE__SENDER__MAX_IN_FLIGHT",
                self.max_in_flight.to_string(),
            ),
        ];
        if phase == Phase::Null {
            extra.push(("PUSHPACE__SENDER__KIND", "null".into()));
            return Ok((None, extra));
        }
        let port = free_port()?;
        let log = std::fs::File::create(self.out_dir.join(format!(
            "{}-{}-sink.log",
            self.run_id,
            phase.name()
        )))?;
        let child = Command::new(&self.exe)
            .args(["sink", "--count-only", "--bind"])
            .arg(format!("127.0.0.1:{port}"))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
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
        Ok((Some((child, port)), extra))
    }

    /// Drops the bench databases. Topics are left in place: tansu 0.6.0 answers a
    /// DeleteTopics request for one topic by deleting every topic it has.
    async fn clean_up(&self, databases: &[String]) {
        let Ok(pool) = self.database_pool("postgres", 1).await else {
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
