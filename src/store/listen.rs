//! [`CampaignWatcher`]: every campaign's settings, kept fresh within a second of a change.
//!
//! A trigger on `campaigns` NOTIFYs `campaign_changed` with the row's id; the watcher
//! LISTENs, re-reads that row and publishes it. Notifications are not queued while the
//! listening connection is down, so after every (re)connection, and every
//! `refresh_interval` as a fallback, the watcher re-reads the whole table. The listener
//! runs in its own task and hands notifications over a channel, because
//! `PgListener::try_recv` must not be cancelled mid-message by a `select!`.

use super::campaigns::{self, Campaign};
use super::StoreError;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;

/// The NOTIFY channel the campaigns trigger publishes on.
pub const CHANNEL: &str = "campaign_changed";

/// Every campaign by id, as last read.
pub type CampaignSnapshot = Arc<HashMap<String, Campaign>>;

/// How often the watcher re-reads everything and how it reconnects.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// Full re-read period: the bound on staleness if a notification is lost.
    pub refresh_interval: Duration,
    /// First wait before reconnecting the listener; doubles up to `reconnect_max`.
    pub reconnect_min: Duration,
    pub reconnect_max: Duration,
}

impl Default for WatcherConfig {
    fn default() -> Self {
        Self {
            refresh_interval: Duration::from_secs(5),
            reconnect_min: Duration::from_millis(100),
            reconnect_max: Duration::from_secs(5),
        }
    }
}

/// Keeps every campaign's settings current; see the module docs.
#[derive(Debug)]
pub struct CampaignWatcher {
    snapshot: watch::Receiver<CampaignSnapshot>,
    changes: broadcast::Sender<Campaign>,
    task: JoinHandle<()>,
}

impl CampaignWatcher {
    /// Loads every campaign (failing if that is impossible), then keeps them fresh until
    /// `shutdown` turns true (or its sender is dropped) or the watcher is dropped.
    pub async fn start(
        pool: PgPool,
        config: WatcherConfig,
        shutdown: watch::Receiver<bool>,
    ) -> Result<Self, StoreError> {
        let initial: HashMap<String, Campaign> = campaigns::all(&pool)
            .await?
            .into_iter()
            .map(|c| (c.id.clone(), c))
            .collect();
        let (snapshot_tx, snapshot) = watch::channel(Arc::new(initial));
        let (changes, _) = broadcast::channel(1024);
        let task = tokio::spawn(run(pool, config, shutdown, snapshot_tx, changes.clone()));
        Ok(Self {
            snapshot,
            changes,
            task,
        })
    }

    /// The current settings of every campaign.
    pub fn current(&self) -> CampaignSnapshot {
        self.snapshot.borrow().clone()
    }

    /// One campaign's current settings.
    pub fn get(&self, id: &str) -> Option<Campaign> {
        self.snapshot.borrow().get(id).cloned()
    }

    /// A receiver that wakes on every change of the snapshot. It never misses the latest
    /// state, so it is the one to use to apply changes.
    pub fn subscribe(&self) -> watch::Receiver<CampaignSnapshot> {
        self.snapshot.clone()
    }

    /// Each campaign that was created or changed, as re-read. A slow receiver may miss
    /// some (`RecvError::Lagged`); it should then look at [`CampaignWatcher::current`].
    pub fn changes(&self) -> broadcast::Receiver<Campaign> {
        self.changes.subscribe()
    }
}

impl Drop for CampaignWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Event {
    Changed(String),
    /// The listener (re)connected: notifications may have been missed.
    Resync,
}

/// Resolves when `shutdown` is true or its sender is gone.
pub(crate) async fn shutdown_requested(shutdown: &mut watch::Receiver<bool>) {
    loop {
        if *shutdown.borrow_and_update() {
            return;
        }
        if shutdown.changed().await.is_err() {
            return;
        }
    }
}

struct Publisher {
    pool: PgPool,
    snapshot: watch::Sender<CampaignSnapshot>,
    changes: broadcast::Sender<Campaign>,
    failing: bool,
}

impl Publisher {
    async fn reload_all(&mut self) {
        let fresh = match campaigns::all(&self.pool).await {
            Ok(all) => all,
            Err(e) => return self.failed(e),
        };
        self.recovered();
        let fresh: HashMap<String, Campaign> =
            fresh.into_iter().map(|c| (c.id.clone(), c)).collect();
        let current = self.snapshot.borrow().clone();
        if *current == fresh {
            return;
        }
        for campaign in fresh.values() {
            if current.get(&campaign.id) != Some(campaign) {
                // No receiver is not an error: the snapshot carries the change anyway.
                let _ = self.changes.send(campaign.clone());
            }
        }
        self.snapshot.send_replace(Arc::new(fresh));
    }

    async fn reload_one(&mut self, id: &str) {
        let fresh = match campaigns::get(&self.pool, id).await {
            Ok(fresh) => fresh,
            Err(e) => return self.failed(e),
        };
        self.recovered();
        let current = self.snapshot.borrow().clone();
        if current.get(id) == fresh.as_ref() {
            return;
        }
        let mut next = (*current).clone();
        match fresh {
            Some(campaign) => {
                let _ = self.changes.send(campaign.clone());
                next.insert(campaign.id.clone(), campaign);
            }
            None => {
                next.remove(id);
            }
        }
        self.snapshot.send_replace(Arc::new(next));
    }

    fn failed(&mut self, e: StoreError) {
        // Once per outage: the periodic re-read retries on its own.
        if !self.failing {
            tracing::warn!(error = %e, "cannot read campaigns; keeping the last settings read");
            self.failing = true;
        }
    }

    fn recovered(&mut self) {
        if self.failing {
            tracing::info!("reading campaigns again");
            self.failing = false;
        }
    }
}

async fn run(
    pool: PgPool,
    config: WatcherConfig,
    mut shutdown: watch::Receiver<bool>,
    snapshot: watch::Sender<CampaignSnapshot>,
    changes: broadcast::Sender<Campaign>,
) {
    let (tx, mut rx) = mpsc::channel(1024);
    let listener = AbortOnDrop(tokio::spawn(listen(pool.clone(), config.clone(), tx)));
    let mut publisher = Publisher {
        pool,
        snapshot,
        changes,
        failing: false,
    };
    let mut refresh = tokio::time::interval(config.refresh_interval);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    refresh.tick().await; // the first tick is immediate; start() has just loaded
    loop {
        tokio::select! {
            _ = shutdown_requested(&mut shutdown) => break,
            event = rx.recv() => match event {
                Some(Event::Changed(id)) => publisher.reload_one(&id).await,
                Some(Event::Resync) => publisher.reload_all().await,
                None => break,
            },
            _ = refresh.tick() => publisher.reload_all().await,
        }
    }
    drop(listener);
}

struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn listen(pool: PgPool, config: WatcherConfig, tx: mpsc::Sender<Event>) {
    let mut backoff = config.reconnect_min;
    let mut outage = false;
    loop {
        let mut listener = match subscribe(&pool).await {
            Ok(listener) => listener,
            Err(sqlx::Error::PoolClosed) => return,
            Err(e) => {
                if !outage {
                    tracing::warn!(error = %e, channel = CHANNEL, "cannot LISTEN; retrying");
                    outage = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(config.reconnect_max);
                continue;
            }
        };
        if outage {
            tracing::info!(channel = CHANNEL, "listening again");
            outage = false;
        }
        backoff = config.reconnect_min;
        // LISTEN is in place, so a full re-read now misses nothing.
        if tx.send(Event::Resync).await.is_err() {
            return;
        }
        loop {
            let event = match listener.try_recv().await {
                Ok(Some(notification)) => Event::Changed(notification.payload().to_string()),
                // The connection was lost and sqlx has reconnected and re-LISTENed.
                Ok(None) => Event::Resync,
                Err(sqlx::Error::PoolClosed) => return,
                Err(e) => {
                    if !outage {
                        tracing::warn!(error = %e, channel = CHANNEL, "LISTEN connection failed; reconnecting");
                        outage = true;
                    }
                    break;
                }
            };
            if tx.send(event).await.is_err() {
                return;
            }
        }
        drop(listener);
        tokio::time::sleep(backoff).await;
    }
}

async fn subscribe(pool: &PgPool) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(CHANNEL).await?;
    Ok(listener)
}
