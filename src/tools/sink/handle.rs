//! The running sink: [`Sink::start`], [`serve_until`] and the [`SinkHandle`] that steers
//! and inspects it.

use super::log::{is_success, max_in_window, CampaignLog, Log};
use super::server::accept_loop;
use super::state::Shared;
use super::{
    Arrival, Behaviour, BehaviourChange, CampaignSummary, SecondCount, SinkConfig, SinkError,
    SinkSummary,
};
use std::collections::{BTreeMap, HashSet};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

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

    /// Pushes of a campaign per unix second of their release by the worker (its
    /// `x-pushpace-sent-at` header; pushes without one are not counted): pacing as the
    /// worker did it, without the loopback's and the sink's jitter.
    pub fn released_per_second(&self, campaign_id: &str) -> BTreeMap<u64, u64> {
        let log = self.shared.log();
        log.campaigns
            .get(campaign_id)
            .map(|c| c.released_per_second.clone())
            .unwrap_or_default()
    }

    /// The most pushes of a campaign released in any window of length `window`.
    pub fn max_released_in_window(&self, campaign_id: &str, window: Duration) -> u64 {
        let mut released = {
            let log = self.shared.log();
            log.campaigns
                .get(campaign_id)
                .map(|c| c.released.clone())
                .unwrap_or_default()
        };
        released.sort_unstable();
        max_in_window(&released, window.as_nanos() as u64)
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
