//! A loopback HTTP sink standing in for the push provider, for the demo, tests and benchmarks.
//!
//! It accepts the requests of [`crate::sender::HttpSender`] (HTTP/1.1, or HTTP/2 with
//! prior knowledge), timestamps each one on arrival, and answers as its [`Behaviour`]
//! says: 200, 429 with Retry-After, 500, a slow answer, or a dropped connection, plus
//! 410 for tokens with a given prefix. From the arrivals it reports what a provider would
//! see: requests per campaign per second, the most requests in any 1 s window, the
//! distinct (job, device) pairs delivered, and duplicates (a pair delivered twice,
//! counted by its `Idempotency-Key`).
//!
//! Recording takes a mutex per request: this is test tooling, not the hot path. Memory
//! grows with every request recorded, so a long soak should use a fresh sink per phase
//! or call [`SinkHandle::clear`].
//!
//! A sink run as its own process ([`serve_until`]) is inspected and steered over HTTP:
//! `GET /_sink/stats` returns the [`SinkSummary`] as JSON, and `PUT /_sink/behaviour`
//! takes a [`BehaviourChange`]. Every other `POST` is a push.

mod bucket;
mod counting;

pub use counting::{serve_counting_until, CountingSummary};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::{JoinHandle, JoinSet};

/// Errors starting the sink.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("cannot bind the sink to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("sink i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// How the sink answers pushes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Behaviour {
    /// 200, except 410 for tokens with the gone prefix.
    #[default]
    Normal,
    /// 429, with an optional Retry-After header.
    TooManyRequests { retry_after: Option<RetryAfter> },
    /// 500.
    ServerError,
    /// Waits `delay_ms`, then answers 200 (past the sender's timeout, the sender gives up
    /// first; the push still counts as delivered if the sink gets to answer).
    Slow { delay_ms: u64 },
    /// Reads the request, then drops the connection without answering.
    Reset,
    /// A hidden quota: `per_second` pushes a second (at most `burst` at once) are
    /// answered as in `Normal`, the rest 429 with an optional Retry-After.
    Quota {
        per_second: u64,
        burst: u64,
        retry_after: Option<RetryAfter>,
    },
    /// Answers as in `Normal`, but `delay_ms` late for pushes beyond `per_second` a
    /// second (at most `burst` at once): a provider queueing past its capacity.
    SlowAbove {
        per_second: u64,
        burst: u64,
        delay_ms: u64,
    },
}

/// The form of a Retry-After header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryAfter {
    /// `Retry-After: <n>`.
    Seconds(u64),
    /// `Retry-After: <HTTP-date n seconds from now>`.
    DateIn(u64),
}

/// A change of behaviour, as taken by [`SinkHandle::apply`] and `PUT /_sink/behaviour`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BehaviourChange {
    /// The new behaviour; unchanged when absent.
    #[serde(default)]
    pub behaviour: Option<Behaviour>,
    /// Apply the behaviour to this many pushes only, then return to `Normal`.
    #[serde(default)]
    pub for_requests: Option<u64>,
    /// Answer 410 to tokens starting with this prefix (`""` turns it off); unchanged when absent.
    #[serde(default)]
    pub gone_prefix: Option<String>,
}

/// Settings of a sink.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// Where to listen; port 0 picks a free one.
    pub bind: SocketAddr,
    /// The behaviour at start.
    pub behaviour: Behaviour,
    /// Tokens starting with this get 410 Gone (a permanently unregistered device).
    pub gone_prefix: Option<String>,
    /// Keep each request's body (for byte-exact checks); off by default to save memory.
    pub keep_bodies: bool,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            behaviour: Behaviour::Normal,
            gone_prefix: None,
            keep_bodies: false,
            max_body_bytes: 64 * 1024,
        }
    }
}

/// One push as the sink received it.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub campaign_id: Arc<str>,
    pub job_id: Arc<str>,
    pub device_token: String,
    pub idempotency_key: Option<String>,
    /// Time since the sink started (monotonic).
    pub at: Duration,
    /// When the worker released the push, on the same scale as `at` (from its
    /// `x-pushpace-sent-at` header, wall clock, µs): pacing measured without the
    /// transport's jitter.
    pub released: Option<Duration>,
    /// Wall-clock time of arrival (the sink's start time plus `at`).
    pub wall: SystemTime,
    /// The status answered, or `None` when the connection was dropped or the client
    /// went away before a slow answer.
    pub status: Option<u16>,
    /// The raw body, when [`SinkConfig::keep_bodies`] is on.
    pub body: Option<Bytes>,
}

/// Pushes of one campaign in one wall-clock second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondCount {
    /// Seconds since the Unix epoch.
    pub unix_second: u64,
    /// Every push that arrived, whatever the answer (retries included).
    pub requests: u64,
    /// Pushes answered 2xx.
    pub delivered: u64,
}

/// What the sink saw of one campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CampaignSummary {
    pub campaign_id: String,
    /// Every push that arrived, whatever the answer.
    pub requests: u64,
    /// Pushes answered 2xx.
    pub delivered: u64,
    /// Distinct (job, device) pairs answered 2xx.
    pub distinct_delivered: u64,
    /// 2xx answers for a pair that had already been delivered.
    pub duplicates: u64,
    /// The most pushes (of any answer) in any 1 s window, from arrival timestamps.
    pub max_in_any_second: u64,
    /// First and last arrival, in ms since the sink started.
    pub first_ms: f64,
    pub last_ms: f64,
    /// Requests per second between the first and the last arrival.
    pub mean_rate: f64,
}

/// What the sink saw, per campaign and in total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkSummary {
    pub requests: u64,
    pub delivered: u64,
    pub distinct_delivered: u64,
    pub duplicates: u64,
    /// Requests whose body was not a push (bad JSON, missing fields, too large).
    pub malformed: u64,
    /// TCP connections accepted.
    pub connections: u64,
    pub campaigns: Vec<CampaignSummary>,
}

/// The sink server. See [`Sink::start`].
pub struct Sink;

impl Sink {
    /// Binds `config.bind` and serves in a background task until the handle is shut
    /// down or dropped. Needs a Tokio runtime.
    pub async fn start(config: SinkConfig) -> Result<SinkHandle, SinkError> {
        let listener = TcpListener::bind(config.bind)
            .await
            .map_err(|source| SinkError::Bind {
                addr: config.bind,
                source,
            })?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared::new(&config));
        let (stop_tx, stop_rx) = oneshot::channel();
        let task = tokio::spawn(accept_loop(listener, Arc::clone(&shared), stop_rx));
        Ok(SinkHandle {
            addr,
            shared,
            stop: Some(stop_tx),
            task: Some(task),
        })
    }
}

/// Runs a sink until `shutdown` completes, then returns what it saw. For running the
/// sink as its own process (`pushpace sink`).
pub async fn serve_until(
    config: SinkConfig,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<SinkSummary, SinkError> {
    let handle = Sink::start(config).await?;
    tracing::info!(addr = %handle.addr(), "sink listening");
    shutdown.await;
    Ok(handle.shutdown().await)
}

/// Controls and inspects a running sink. Dropping it stops the sink.
pub struct SinkHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    stop: Option<oneshot::Sender<()>>,
    task: Option<JoinHandle<()>>,
}

impl SinkHandle {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The URL to configure as `sender.url`.
    pub fn url(&self) -> String {
        format!("http://{}/push", self.addr)
    }

    /// Switches behaviour from the next push on.
    pub fn set_behaviour(&self, behaviour: Behaviour) {
        self.apply(BehaviourChange {
            behaviour: Some(behaviour),
            ..Default::default()
        });
    }

    /// Switches behaviour for the next `requests` pushes, then back to `Normal`.
    pub fn set_behaviour_for(&self, behaviour: Behaviour, requests: u64) {
        self.apply(BehaviourChange {
            behaviour: Some(behaviour),
            for_requests: Some(requests),
            gone_prefix: None,
        });
    }

    /// Answers 410 to tokens starting with `prefix`; `None` turns it off.
    pub fn set_gone_prefix(&self, prefix: Option<&str>) {
        self.apply(BehaviourChange {
            gone_prefix: Some(prefix.unwrap_or("").to_string()),
            ..Default::default()
        });
    }

    /// Applies a [`BehaviourChange`].
    pub fn apply(&self, change: BehaviourChange) {
        self.shared.apply(change);
    }

    /// The current behaviour.
    pub fn behaviour(&self) -> Behaviour {
        self.shared.control().behaviour.clone()
    }

    /// Totals and per-campaign figures.
    pub fn summary(&self) -> SinkSummary {
        self.shared.summary()
    }

    /// One campaign's figures, if any push of it arrived.
    pub fn campaign(&self, campaign_id: &str) -> Option<CampaignSummary> {
        let log = self.shared.log();
        log.campaigns.get(campaign_id).map(CampaignLog::summary)
    }

    /// Requests and deliveries of a campaign per wall-clock second, in order.
    pub fn per_second(&self, campaign_id: &str) -> Vec<SecondCount> {
        let log = self.shared.log();
        log.campaigns
            .get(campaign_id)
            .map(|c| {
                c.per_second
                    .iter()
                    .map(|(&unix_second, &(requests, delivered))| SecondCount {
                        unix_second,
                        requests,
                        delivered,
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Pushes of a campaign that arrived in the last `window` (for a live display).
    pub fn recent_requests(&self, campaign_id: &str, window: Duration) -> u64 {
        let now = self.shared.started.elapsed().as_nanos() as u64;
        let from = now.saturating_sub(window.as_nanos() as u64);
        let log = self.shared.log();
        log.campaigns.get(campaign_id).map_or(0, |c| {
            let start = c.arrivals.partition_point(|&t| t < from);
            (c.arrivals.len() - start) as u64
        })
    }

    /// The most pushes of a campaign (of any answer) in any window of length `window`.
    pub fn max_in_window(&self, campaign_id: &str, window: Duration) -> u64 {
        let log = self.shared.log();
        log.campaigns
            .get(campaign_id)
            .map_or(0, |c| max_in_window(&c.arrivals, window.as_nanos() as u64))
    }

    /// Time since the sink started: the scale of [`Arrival::at`] and
    /// [`Arrival::released`].
    pub fn elapsed(&self) -> Duration {
        self.shared.started.elapsed()
    }

    /// Every push received, in arrival order.
    pub fn arrivals(&self) -> Vec<Arrival> {
        let log = self.shared.log();
        log.records
            .iter()
            .map(|r| Arrival {
                campaign_id: Arc::clone(&r.campaign),
                job_id: Arc::clone(&r.job),
                device_token: r.token.to_string(),
                idempotency_key: r.key.as_deref().map(str::to_string),
                at: Duration::from_nanos(r.at_ns),
                released: r.released_ns.map(Duration::from_nanos),
                wall: self.shared.started_wall + Duration::from_nanos(r.at_ns),
                status: r.status,
                body: r.body.clone(),
            })
            .collect()
    }

    /// The distinct (job_id, device_token) pairs answered 2xx.
    pub fn delivered_devices(&self) -> HashSet<(String, String)> {
        let log = self.shared.log();
        log.records
            .iter()
            .filter(|r| r.status.is_some_and(is_success))
            .map(|r| (r.job.to_string(), r.token.to_string()))
            .collect()
    }

    /// Pushes received so far.
    pub fn request_count(&self) -> u64 {
        self.shared.log().records.len() as u64
    }

    /// TCP connections accepted so far (keep-alive shows as few connections).
    pub fn connections(&self) -> u64 {
        self.shared.connections.load(Ordering::Relaxed)
    }

    /// Forgets every recorded push, keeping the behaviour.
    pub fn clear(&self) {
        let mut log = self.shared.log();
        *log = Log::default();
    }

    /// Stops accepting, drops open connections and returns the final summary.
    pub async fn shutdown(mut self) -> SinkSummary {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
        self.shared.summary()
    }
}

impl Drop for SinkHandle {
    fn drop(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
    }
}

fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

/// Two pointers over sorted timestamps: the most in any half-open window `[t, t + w)`.
fn max_in_window(sorted_ns: &[u64], window_ns: u64) -> u64 {
    let mut best = 0usize;
    let mut lo = 0usize;
    for (hi, &t) in sorted_ns.iter().enumerate() {
        while t - sorted_ns[lo] >= window_ns {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best as u64
}

struct Shared {
    started: Instant,
    started_wall: SystemTime,
    started_unix: Duration,
    keep_bodies: bool,
    max_body_bytes: usize,
    connections: AtomicU64,
    control: Mutex<Control>,
    log: Mutex<Log>,
}

struct Control {
    behaviour: Behaviour,
    remaining: Option<u64>,
    gone_prefix: Option<Arc<str>>,
    /// The token bucket of `Quota` and `SlowAbove`.
    bucket: Option<bucket::Bucket>,
}

#[derive(Default)]
struct Log {
    records: Vec<Record>,
    campaigns: HashMap<Arc<str>, CampaignLog>,
    jobs: HashSet<Arc<str>>,
    malformed: u64,
}

struct Record {
    campaign: Arc<str>,
    job: Arc<str>,
    token: Box<str>,
    key: Option<Box<str>>,
    at_ns: u64,
    /// When the worker released it, from its `x-pushpace-sent-at` header.
    released_ns: Option<u64>,
    status: Option<u16>,
    body: Option<Bytes>,
}

struct CampaignLog {
    id: Arc<str>,
    /// Arrival times in ns since start; pushed under the lock with a clock read under
    /// the same lock, so they are sorted.
    arrivals: Vec<u64>,
    /// Unix second → (requests, delivered).
    per_second: BTreeMap<u64, (u64, u64)>,
    delivered: u64,
    /// Idempotency keys (or job + token without one) answered 2xx.
    delivered_keys: HashSet<Box<str>>,
    duplicates: u64,
}

impl CampaignLog {
    fn summary(&self) -> CampaignSummary {
        let first = self.arrivals.first().copied().unwrap_or(0);
        let last = self.arrivals.last().copied().unwrap_or(0);
        let span_s = (last - first) as f64 / 1e9;
        CampaignSummary {
            campaign_id: self.id.to_string(),
            requests: self.arrivals.len() as u64,
            delivered: self.delivered,
            distinct_delivered: self.delivered_keys.len() as u64,
            duplicates: self.duplicates,
            max_in_any_second: max_in_window(&self.arrivals, 1_000_000_000),
            first_ms: first as f64 / 1e6,
            last_ms: last as f64 / 1e6,
            mean_rate: if span_s > 0.0 {
                self.arrivals.len() as f64 / span_s
            } else {
                0.0
            },
        }
    }
}

/// What the headers of a push said.
struct Meta {
    key: Option<Box<str>>,
    sent_at_us: Option<u64>,
}

/// What to do with one push, decided from the behaviour when it arrives.
enum Action {
    Answer {
        status: StatusCode,
        retry_after: Option<RetryAfter>,
    },
    Slow(Duration),
    Reset,
}

impl Control {
    /// One token of the quota's bucket (a new bucket when the quota changed).
    fn take_token(&mut self, per_second: u64, burst: u64) -> bool {
        if !self
            .bucket
            .as_ref()
            .is_some_and(|b| b.is_for(per_second, burst))
        {
            self.bucket = Some(bucket::Bucket::new(per_second, burst));
        }
        self.bucket.as_mut().is_some_and(|b| b.take(Instant::now()))
    }
}

impl Shared {
    fn new(config: &SinkConfig) -> Self {
        let started_wall = SystemTime::now();
        Self {
            started: Instant::now(),
            started_wall,
            started_unix: started_wall.duration_since(UNIX_EPOCH).unwrap_or_default(),
            keep_bodies: config.keep_bodies,
            max_body_bytes: config.max_body_bytes,
            connections: AtomicU64::new(0),
            control: Mutex::new(Control {
                behaviour: config.behaviour.clone(),
                remaining: None,
                bucket: None,
                gone_prefix: config
                    .gone_prefix
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .map(Arc::from),
            }),
            log: Mutex::new(Log::default()),
        }
    }

    // A panic while holding these locks leaves plain data behind; keep serving.
    fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn apply(&self, change: BehaviourChange) {
        let mut control = self.control();
        if let Some(b) = change.behaviour {
            control.behaviour = b;
            control.remaining = change.for_requests;
        } else if change.for_requests.is_some() {
            control.remaining = change.for_requests;
        }
        if let Some(prefix) = change.gone_prefix {
            control.gone_prefix = (!prefix.is_empty()).then(|| Arc::from(prefix));
        }
    }

    fn decide(&self, token: &str) -> Action {
        let mut control = self.control();
        let behaviour = control.behaviour.clone();
        if behaviour != Behaviour::Normal {
            if let Some(left) = control.remaining.as_mut() {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    control.behaviour = Behaviour::Normal;
                    control.remaining = None;
                }
            }
        }
        let normal = |control: &Control| {
            let gone = control
                .gone_prefix
                .as_deref()
                .is_some_and(|p| token.starts_with(p));
            Action::Answer {
                status: if gone {
                    StatusCode::GONE
                } else {
                    StatusCode::OK
                },
                retry_after: None,
            }
        };
        match behaviour {
            Behaviour::Normal => normal(&control),
            Behaviour::Quota {
                per_second,
                burst,
                retry_after,
            } => {
                if control.take_token(per_second, burst) {
                    normal(&control)
                } else {
                    Action::Answer {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        retry_after,
                    }
                }
            }
            Behaviour::SlowAbove {
                per_second,
                burst,
                delay_ms,
            } => {
                if control.take_token(per_second, burst) {
                    normal(&control)
                } else {
                    Action::Slow(Duration::from_millis(delay_ms))
                }
            }
            Behaviour::TooManyRequests { retry_after } => Action::Answer {
                status: StatusCode::TOO_MANY_REQUESTS,
                retry_after,
            },
            Behaviour::ServerError => Action::Answer {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                retry_after: None,
            },
            Behaviour::Slow { delay_ms } => Action::Slow(Duration::from_millis(delay_ms)),
            Behaviour::Reset => Action::Reset,
        }
    }

    /// Records an arrival and returns its index (to complete a slow answer later).
    fn record(
        &self,
        push: &PushBody<'_>,
        meta: Meta,
        body: Option<Bytes>,
        status: Option<u16>,
    ) -> usize {
        let Meta { key, sent_at_us } = meta;
        let started_ns = self.started_unix.as_nanos() as u64;
        let released_ns = sent_at_us.map(|us| us.saturating_mul(1000).saturating_sub(started_ns));
        let mut guard = self.log();
        let log = &mut *guard;
        let at_ns = self.started.elapsed().as_nanos() as u64;
        let job = match log.jobs.get(push.job_id.as_ref()) {
            Some(j) => Arc::clone(j),
            None => {
                let j: Arc<str> = Arc::from(push.job_id.as_ref());
                log.jobs.insert(Arc::clone(&j));
                j
            }
        };
        if !log.campaigns.contains_key(push.campaign_id.as_ref()) {
            let id: Arc<str> = Arc::from(push.campaign_id.as_ref());
            log.campaigns.insert(
                Arc::clone(&id),
                CampaignLog {
                    id,
                    arrivals: Vec::new(),
                    per_second: BTreeMap::new(),
                    delivered: 0,
                    delivered_keys: HashSet::new(),
                    duplicates: 0,
                },
            );
        }
        let Some(campaign) = log.campaigns.get_mut(push.campaign_id.as_ref()) else {
            unreachable!("inserted above");
        };
        campaign.arrivals.push(at_ns);
        let second = (self.started_unix + Duration::from_nanos(at_ns)).as_secs();
        campaign.per_second.entry(second).or_insert((0, 0)).0 += 1;
        let record = Record {
            campaign: Arc::clone(&campaign.id),
            job,
            token: Box::from(push.device_token.as_ref()),
            key,
            at_ns,
            released_ns,
            status,
            body,
        };
        log.records.push(record);
        let index = log.records.len() - 1;
        if status.is_some_and(is_success) {
            self.count_delivery(log, index);
        }
        index
    }

    fn complete(&self, index: usize, status: u16) {
        let mut guard = self.log();
        let log = &mut *guard;
        if let Some(r) = log.records.get_mut(index) {
            r.status = Some(status);
            if is_success(status) {
                self.count_delivery(log, index);
            }
        }
    }

    fn count_delivery(&self, log: &mut Log, index: usize) {
        let Some(r) = log.records.get(index) else {
            return;
        };
        let Some(campaign) = log.campaigns.get_mut(&r.campaign) else {
            return;
        };
        let delivery_key: Box<str> = match &r.key {
            Some(k) => k.clone(),
            None => format!("{}\n{}", r.job, r.token).into_boxed_str(),
        };
        campaign.delivered += 1;
        if !campaign.delivered_keys.insert(delivery_key) {
            campaign.duplicates += 1;
        }
        let second = (self.started_unix + Duration::from_nanos(r.at_ns)).as_secs();
        campaign.per_second.entry(second).or_insert((0, 0)).1 += 1;
    }

    fn summary(&self) -> SinkSummary {
        let log = self.log();
        let mut campaigns: Vec<CampaignSummary> =
            log.campaigns.values().map(CampaignLog::summary).collect();
        campaigns.sort_by(|a, b| a.campaign_id.cmp(&b.campaign_id));
        SinkSummary {
            requests: log.records.len() as u64,
            delivered: campaigns.iter().map(|c| c.delivered).sum(),
            distinct_delivered: campaigns.iter().map(|c| c.distinct_delivered).sum(),
            duplicates: campaigns.iter().map(|c| c.duplicates).sum(),
            malformed: log.malformed,
            connections: self.connections.load(Ordering::Relaxed),
            campaigns,
        }
    }
}

/// The body the sender posts. Strings borrow from the request when they have no escapes.
#[derive(Deserialize)]
struct PushBody<'a> {
    #[serde(borrow)]
    campaign_id: Cow<'a, str>,
    #[serde(borrow)]
    job_id: Cow<'a, str>,
    #[serde(borrow)]
    device_token: Cow<'a, str>,
    #[allow(dead_code)]
    #[serde(borrow)]
    payload: &'a serde_json::value::RawValue,
}

/// Makes hyper drop the connection without an answer.
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for DropConnection {}

type SinkResponse = Response<Full<Bytes>>;

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, mut stop: oneshot::Receiver<()>) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // A send or a dropped handle both mean stop.
            _ = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.connections.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve_connection(stream, Arc::clone(&shared)));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "sink accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |req| handle(Arc::clone(&shared), req));
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<SinkResponse, DropConnection> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/_sink/stats") => Ok(json_response(&shared.summary())),
        (&Method::PUT, "/_sink/behaviour") => {
            let body = match read_body(req, shared.max_body_bytes).await {
                Ok(b) => b,
                Err(status) => return Ok(text(status, "unreadable body")),
            };
            match serde_json::from_slice::<BehaviourChange>(&body) {
                Ok(change) => {
                    shared.apply(change);
                    Ok(text(StatusCode::OK, "ok"))
                }
                Err(e) => Ok(text(
                    StatusCode::BAD_REQUEST,
                    &format!("bad behaviour: {e}"),
                )),
            }
        }
        (&Method::POST, _) => push(shared, req).await,
        _ => Ok(text(StatusCode::METHOD_NOT_ALLOWED, "POST a push")),
    }
}

async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, StatusCode> {
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(StatusCode::PAYLOAD_TOO_LARGE),
        Err(_) => Err(StatusCode::BAD_REQUEST),
    }
}

async fn push(shared: Arc<Shared>, req: Request<Incoming>) -> Result<SinkResponse, DropConnection> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let key = Meta {
        key: header("idempotency-key").map(Box::<str>::from),
        sent_at_us: header(crate::sender::SENT_AT).and_then(|v| v.parse().ok()),
    };
    let body = match read_body(req, shared.max_body_bytes).await {
        Ok(b) => b,
        Err(status) => {
            shared.log().malformed += 1;
            return Ok(text(status, "body too large or unreadable"));
        }
    };
    let parsed: PushBody<'_> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            shared.log().malformed += 1;
            return Ok(text(StatusCode::BAD_REQUEST, &format!("not a push: {e}")));
        }
    };
    let action = shared.decide(&parsed.device_token);
    let kept = shared.keep_bodies.then(|| body.clone());
    match action {
        Action::Answer {
            status,
            retry_after,
        } => {
            shared.record(&parsed, key, kept, Some(status.as_u16()));
            let mut response = text(status, answer_text(status));
            if let Some(ra) = retry_after {
                let value = match ra {
                    RetryAfter::Seconds(s) => s.to_string(),
                    RetryAfter::DateIn(s) => {
                        httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(s))
                    }
                };
                if let Ok(v) = HeaderValue::from_str(&value) {
                    response.headers_mut().insert(RETRY_AFTER, v);
                }
            }
            Ok(response)
        }
        Action::Slow(delay) => {
            let index = shared.record(&parsed, key, kept, None);
            drop(parsed);
            tokio::time::sleep(delay).await;
            shared.complete(index, 200);
            Ok(text(StatusCode::OK, answer_text(StatusCode::OK)))
        }
        Action::Reset => {
            shared.record(&parsed, key, kept, None);
            Err(DropConnection)
        }
    }
}

fn answer_text(status: StatusCode) -> &'static str {
    match status {
        StatusCode::OK => "{\"status\":\"delivered\"}",
        StatusCode::GONE => {
            "{\"error\":\"Unregistered\",\"message\":\"device token is not registered\"}"
        }
        StatusCode::TOO_MANY_REQUESTS => {
            "{\"error\":\"TooManyRequests\",\"message\":\"rate limited (simulated)\"}"
        }
        _ => "{\"error\":\"Internal\",\"message\":\"provider failure (simulated)\"}",
    }
}

fn text(status: StatusCode, body: &str) -> SinkResponse {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = status;
    let content_type = if body.starts_with('{') {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response<T: Serialize>(value: &T) -> SinkResponse {
    match serde_json::to_vec(value) {
        Ok(bytes) => {
            let mut response = Response::new(Full::new(Bytes::from(bytes)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::max_in_window;

    #[test]
    fn window_counts_half_open() {
        let s = 1_000_000_000;
        assert_eq!(max_in_window(&[], s), 0);
        assert_eq!(max_in_window(&[0, 10, 20], s), 3);
        // An arrival exactly one window later starts a new window.
        assert_eq!(max_in_window(&[0, s, 2 * s], s), 1);
        assert_eq!(max_in_window(&[0, 1, s - 1, s, s + 1], s), 3);
    }
}
