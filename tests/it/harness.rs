//! One set-up for a worker under test, [`TestWorker`], and one family of produce helpers
//! ([`Producer`], [`Record`], [`produce_plan`], [`produce_jobs`]).
//!
//! A `TestWorker` is a fresh database, a fresh topic, a loopback sink (unless the test
//! sends elsewhere), the settings, the providers, `Worker::start` and, when asked, the
//! HTTP API next to the worker. [`TestWorkerOptions::spawn`] does it all at once;
//! [`TestWorkerOptions::prepare`] stops before the worker, so that a test can produce its
//! jobs (or steer its sink) first and then call [`TestWorker::start`].

use crate::api::{spawn_app_on, TestApp, TOKEN};
use crate::helpers::{
    brokers, fresh_database, fresh_topic, fresh_topic_on, test_settings, unique_name,
};
use pushpace::config::Settings;
use pushpace::job::Job;
use pushpace::limiter::Rate;
use pushpace::provider::ceiling::CeilingParams;
use pushpace::provider::{Provider, ProviderKind, Providers};
use pushpace::sender::{AnySender, HttpSender, HttpSenderConfig};
use pushpace::tools::produce::ProducePlan;
use pushpace::tools::sink::{Sink, SinkConfig, SinkHandle};
use pushpace::worker::Worker;
use rdkafka::message::OwnedHeaders;
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::ClientConfig;
use sqlx::PgPool;
use std::sync::Arc;
use std::time::Duration;

/// Where the worker's pushes go.
enum Target {
    /// A loopback sink of the worker's own, started with this configuration.
    OwnSink(SinkConfig),
    /// A sink another worker owns, shared.
    SharedSink(Arc<SinkHandle>),
    /// `sender.kind = "null"`: the providers the settings build, sending nowhere.
    Null,
    /// Providers the test built (the provider mocks, say).
    Providers(Arc<Providers>),
}

/// What [`TestWorker`] to set up; [`TestWorker::options`] gives the defaults: one
/// partition, a sink of its own, a fresh database and group, no API.
pub struct TestWorkerOptions {
    partitions: i32,
    overrides: Vec<(String, String)>,
    database: Option<(PgPool, String)>,
    target: Target,
    adaptive: Option<CeilingParams>,
    api: bool,
    /// Connection keys of another broker than the shared plaintext one.
    broker: Option<Vec<(String, String)>>,
}

impl TestWorkerOptions {
    /// The topic and the worker on another broker: `keys` are `kafka.*` settings
    /// (brokers, security_protocol, SASL, TLS files), applied like [`Self::settings`].
    pub fn broker(mut self, keys: &[(&str, String)]) -> Self {
        let keys: Vec<(String, String)> = keys
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        self.overrides.extend(keys.iter().cloned());
        self.broker = Some(keys);
        self
    }

    /// Partitions of the fresh topic.
    pub fn partitions(mut self, partitions: i32) -> Self {
        self.partitions = partitions;
        self
    }

    /// Settings on top of the harness's own (broker, topic, group, database, sender,
    /// 200 ms stats flushes); later ones win.
    pub fn settings(mut self, overrides: &[(&str, String)]) -> Self {
        self.overrides
            .extend(overrides.iter().map(|(k, v)| (k.to_string(), v.clone())));
        self
    }

    /// This database (a pool on it and its URL) instead of a fresh one.
    pub fn database(mut self, pool: PgPool, url: String) -> Self {
        self.database = Some((pool, url));
        self
    }

    /// The sink's configuration (its starting behaviour, say).
    pub fn sink_config(mut self, config: SinkConfig) -> Self {
        self.target = Target::OwnSink(config);
        self
    }

    /// Another worker next to `other`: its database and its sink, a topic and a group of
    /// its own.
    pub fn alongside(mut self, other: &TestWorker) -> Self {
        self.database = Some((other.pool.clone(), other.db_url.clone()));
        self.target = Target::SharedSink(other.sink());
        self
    }

    /// `sender.kind = "null"`, the providers built from the settings: no sink.
    pub fn null_sender(mut self) -> Self {
        self.target = Target::Null;
        self
    }

    /// These providers instead of a sink.
    pub fn providers(mut self, providers: Providers) -> Self {
        self.target = Target::Providers(Arc::new(providers));
        self
    }

    /// The sink as the one webhook provider `sink`, with the adaptive ceiling on.
    pub fn adaptive(mut self, params: CeilingParams) -> Self {
        self.adaptive = Some(params);
        self
    }

    /// The HTTP API next to the worker (with [`TOKEN`]), reading its live state.
    pub fn api(mut self) -> Self {
        self.api = true;
        self
    }

    /// The database, topic, sink and settings; the worker is not started.
    pub async fn prepare(self) -> TestWorker {
        let (pool, db_url) = match self.database {
            Some(db) => db,
            None => fresh_database().await,
        };
        let topic = match &self.broker {
            None => fresh_topic(self.partitions).await,
            Some(keys) => {
                let kafka = test_settings(&borrowed(keys)).kafka;
                fresh_topic_on(&kafka, self.partitions).await
            }
        };
        let group = unique_name("g");
        let (sink, providers, null) = match self.target {
            Target::OwnSink(config) => {
                let sink = Sink::start(config).await.expect("start the sink");
                (Some(Arc::new(sink)), None, false)
            }
            Target::SharedSink(sink) => (Some(sink), None, false),
            Target::Null => (None, None, true),
            Target::Providers(providers) => (None, Some(providers), false),
        };
        let mut overrides = vec![
            ("kafka.brokers".to_string(), brokers()),
            ("kafka.topic".to_string(), topic.clone()),
            ("kafka.group_id".to_string(), group.clone()),
            ("database.url".to_string(), db_url.clone()),
            ("worker.stats_flush_ms".to_string(), "200".to_string()),
        ];
        if let Some(sink) = &sink {
            overrides.push(("sender.url".into(), sink.url()));
        }
        if null {
            overrides.push(("sender.kind".into(), "null".into()));
        }
        overrides.extend(self.overrides);
        let settings = test_settings(&borrowed(&overrides));
        TestWorker {
            pool,
            db_url,
            topic,
            group,
            settings,
            overrides,
            sink,
            providers,
            adaptive: self.adaptive,
            want_api: self.api,
            worker: None,
            api: None,
        }
    }

    /// [`Self::prepare`], then [`TestWorker::start`].
    pub async fn spawn(self) -> TestWorker {
        let mut tw = self.prepare().await;
        tw.start().await;
        tw
    }

    /// [`Self::prepare`], every job of `plan` produced to the topic, then
    /// [`TestWorker::start`].
    pub async fn spawn_with_plan(self, plan: &ProducePlan) -> TestWorker {
        let mut tw = self.prepare().await;
        produce_plan(&tw.topic, plan).await;
        tw.start().await;
        tw
    }

    /// [`Self::spawn_with_plan`], the worker sending to a sink of its own.
    pub async fn run_plan(self, plan: ProducePlan) -> PlannedRun {
        let tw = self.spawn_with_plan(&plan).await;
        PlannedRun {
            sink: tw.sink(),
            tw,
            plan,
        }
    }
}

/// A worker started on the jobs of a plan, and its sink. Test files add their own
/// methods (`impl PlannedRun` in the same crate).
pub struct PlannedRun {
    pub tw: TestWorker,
    pub sink: Arc<SinkHandle>,
    pub plan: ProducePlan,
}

impl PlannedRun {
    /// Shuts the worker down, if it runs; it must stop gracefully.
    pub async fn stop(&mut self) {
        self.tw.stop().await;
    }
}

fn borrowed(overrides: &[(String, String)]) -> Vec<(&str, String)> {
    overrides
        .iter()
        .map(|(k, v)| (k.as_str(), v.clone()))
        .collect()
}

/// A worker under test and what it runs on.
pub struct TestWorker {
    pub pool: PgPool,
    pub db_url: String,
    pub topic: String,
    pub group: String,
    /// What the worker starts with.
    pub settings: Settings,
    overrides: Vec<(String, String)>,
    sink: Option<Arc<SinkHandle>>,
    providers: Option<Arc<Providers>>,
    adaptive: Option<CeilingParams>,
    want_api: bool,
    worker: Option<Worker>,
    api: Option<TestApp>,
}

impl TestWorker {
    pub fn options() -> TestWorkerOptions {
        TestWorkerOptions {
            partitions: 1,
            overrides: Vec::new(),
            database: None,
            target: Target::OwnSink(SinkConfig::default()),
            adaptive: None,
            api: false,
            broker: None,
        }
    }

    /// Starts the worker (and the API, if asked for).
    pub async fn start(&mut self) {
        assert!(self.worker.is_none(), "the worker is running already");
        let worker = self.start_another().await;
        if self.want_api {
            let view = pushpace::api::WorkerView::of(&worker);
            let (pool, url) = (self.pool.clone(), self.db_url.clone());
            let extra = borrowed(&self.overrides);
            self.api = Some(spawn_app_on(pool, url, TOKEN, Some(view), None, &extra).await);
        }
        self.worker = Some(worker);
    }

    /// One more worker with the same settings (the same group), owned by the caller.
    pub async fn start_another(&self) -> Worker {
        Worker::start(
            &self.settings,
            self.pool.clone(),
            self.settings.kafka.brokers.clone(),
            self.build_providers(),
        )
        .await
        .expect("start worker")
    }

    fn build_providers(&self) -> Arc<Providers> {
        if let Some(providers) = &self.providers {
            return Arc::clone(providers);
        }
        let Some(sink) = &self.sink else {
            let built = pushpace::provider::build::build(
                &self.settings.providers,
                &self.settings.sender.default_provider,
            )
            .expect("providers");
            return Arc::new(built);
        };
        let sender = AnySender::Http(HttpSender::new(&HttpSenderConfig::new(sink.url())).unwrap());
        let Some(params) = self.adaptive else {
            return sender.into();
        };
        let provider = Provider {
            name: Arc::from("sink"),
            kind: ProviderKind::Webhook,
            max_rate: None,
            max_in_flight: None,
            adaptive: Some(params),
            sender,
        };
        Arc::new(Providers::new(vec![provider], "sink").expect("providers"))
    }

    /// The running worker.
    pub fn worker(&self) -> &Worker {
        self.worker.as_ref().expect("the worker runs")
    }

    /// The running worker, handed to the caller (to shut it down itself).
    pub fn take_worker(&mut self) -> Worker {
        self.worker.take().expect("the worker runs")
    }

    /// Shuts the worker down, if it runs; it must stop gracefully.
    pub async fn stop(&mut self) {
        if let Some(w) = self.worker.take() {
            w.shutdown().await.expect("graceful shutdown");
        }
    }

    /// The sink the worker sends to.
    pub fn sink(&self) -> Arc<SinkHandle> {
        Arc::clone(self.sink.as_ref().expect("the worker sends to a sink"))
    }

    /// The API, handed to the caller (to stop it itself).
    pub fn take_api(&mut self) -> TestApp {
        self.api
            .take()
            .expect("the API runs (TestWorkerOptions::api)")
    }
}

/// A job for `campaign` at `rate` sends/s, with the payload `{"t":1}`.
pub fn job_at(job_id: &str, campaign: &str, rate: f64, devices: &[impl AsRef<str>]) -> Job {
    let payload = serde_json::value::RawValue::from_string(r#"{"t":1}"#.into()).unwrap();
    let devices = devices.iter().map(|d| d.as_ref().to_string()).collect();
    let mut job = Job::new(job_id, campaign, devices, payload).expect("a valid job");
    job.send_rate = Some(Rate::per_second(rate).expect("a valid rate"));
    job
}

/// One message for [`Producer::send`]: its value (or none), and optionally a key, a
/// partition (else the producer's partitioner chooses) and headers.
#[derive(Default)]
pub struct Record<'a> {
    pub payload: Option<&'a [u8]>,
    pub key: Option<&'a [u8]>,
    pub partition: Option<i32>,
    pub headers: Option<OwnedHeaders>,
}

impl<'a> Record<'a> {
    pub fn of(payload: &'a [u8]) -> Self {
        Record {
            payload: Some(payload),
            ..Record::default()
        }
    }

    pub fn key(mut self, key: &'a [u8]) -> Self {
        self.key = Some(key);
        self
    }

    pub fn partition(mut self, partition: i32) -> Self {
        self.partition = Some(partition);
        self
    }

    pub fn headers(mut self, headers: OwnedHeaders) -> Self {
        self.headers = Some(headers);
        self
    }
}

/// A producer that waits for each message's acknowledgement and fails the test on an
/// error.
pub struct Producer(FutureProducer);

impl Producer {
    /// On the shared broker.
    pub fn new() -> Producer {
        Producer::on(&brokers())
    }

    /// On the broker at `bootstrap`.
    pub fn on(bootstrap: &str) -> Producer {
        Producer::with(&pushpace::broker::producer_config(
            &crate::helpers::kafka(),
            bootstrap,
        ))
    }

    /// With a configuration of the test's own.
    pub fn with(config: &ClientConfig) -> Producer {
        Producer(config.create().expect("producer"))
    }

    /// Sends `record` to `topic`; returns the partition and offset it landed at.
    pub async fn send(&self, topic: &str, record: Record<'_>) -> (i32, i64) {
        let mut r: FutureRecord<'_, [u8], [u8]> = FutureRecord::to(topic);
        if let Some(p) = record.partition {
            r = r.partition(p);
        }
        if let Some(k) = record.key {
            r = r.key(k);
        }
        if let Some(v) = record.payload {
            r = r.payload(v);
        }
        if let Some(h) = record.headers {
            r = r.headers(h);
        }
        let delivery = self
            .0
            .send(r, Duration::from_secs(30))
            .await
            .unwrap_or_else(|(e, _)| panic!("produce to {topic}: {e}"));
        (delivery.partition, delivery.offset)
    }

    /// Sends `job`, keyed by its campaign, to `partition` (or where the key hashes).
    pub async fn job(&self, topic: &str, job: &Job, partition: Option<i32>) -> (i32, i64) {
        let value = job.to_json();
        let record = Record {
            partition,
            ..Record::of(&value).key(job.campaign_id.as_bytes())
        };
        self.send(topic, record).await
    }
}

impl Default for Producer {
    fn default() -> Self {
        Producer::new()
    }
}

/// Sends `job` to `topic` on the shared broker, keyed by its campaign.
pub async fn produce_job(topic: &str, job: &Job) {
    Producer::new().job(topic, job, None).await;
}

/// Sends `jobs` in order, each keyed by its campaign, to `partition` (or where the key
/// hashes).
pub async fn produce_jobs(topic: &str, jobs: &[Job], partition: Option<i32>) {
    let producer = Producer::new();
    for job in jobs {
        producer.job(topic, job, partition).await;
    }
}

/// Every job of `plan` to `topic` on the shared broker, keyed by campaign.
pub async fn produce_plan(topic: &str, plan: &ProducePlan) {
    pushpace::tools::produce::produce(&crate::helpers::kafka(), &brokers(), topic, plan, |_| {})
        .await
        .expect("produce");
}

/// The jobs of `plan` over `partitions` partitions: each campaign's in turn, from a
/// partition of its own, so that every member of a group gets a like part of each.
/// (Dealt in the plan's order instead, ten campaigns' jobs on six partitions put each
/// campaign on every other partition: one worker of three had most of a campaign.)
pub async fn produce_spread(topic: &str, plan: &ProducePlan, partitions: i32) {
    let producer = Producer::new();
    let mut next: std::collections::HashMap<String, i32> = std::collections::HashMap::new();
    for job in plan.jobs() {
        let first = next.len() as i32;
        let p = next.entry(job.campaign_id.clone()).or_insert(first);
        producer.job(topic, &job, Some(*p % partitions)).await;
        *p += 1;
    }
}
