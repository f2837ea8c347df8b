//! [`CampaignWatcher`]: every campaign's settings, kept fresh within a second of a change.
//!
//! A trigger on `campaigns` NOTIFYs `campaign_changed` with the row's id; the watcher
//! LISTENs, re-reads the rows named (those queued together in one query) and publishes
//! them. Notifications are not queued while the listening connection is down, so after
//! every (re)connection the watcher re-reads the whole table. As a fallback for a lost
//! notification it re-reads, every `refresh_interval`, only the rows whose `updated_at`
//! is recent (see [`REREAD_OVERLAP`]), and every [`FULL_REFRESH_INTERVAL`] the whole
//! table (which also drops rows deleted without a notification).
//!
//! The snapshot is split into shards shared between successive snapshots: a change
//! copies the shard it falls in, not every campaign, and a reader can skip the shards
//! that did not change ([`CampaignSnapshot::changed_since`]). The listener runs in its
//! own task and hands notifications over a channel, because `PgListener::try_recv` must
//! not be cancelled mid-message by a `select!`.

mod snapshot;

pub use snapshot::CampaignSnapshot;

use super::campaigns::{self, Campaign};
use super::StoreError;
use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use sqlx::postgres::PgListener;
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The NOTIFY channel the campaigns trigger publishes on.
pub const CHANNEL: &str = "campaign_changed";

/// How far before the server's clock at the previous read the fallback re-read starts.
///
/// `updated_at` is the writing transaction's start time, but the row is visible only once
/// that transaction commits, and transactions commit out of order. The clock R is read
/// just before each read, so that read sees every row committed before R. A row committed
/// later carries an `updated_at` no earlier than its transaction's start, so reading
/// `updated_at >= R - REREAD_OVERLAP` next time misses only a change whose transaction
/// stayed open longer than this and whose NOTIFY was lost too; the full re-read every
/// [`FULL_REFRESH_INTERVAL`] catches that. Rows read again inside the overlap are
/// compared with the snapshot and published only when they differ.
pub const REREAD_OVERLAP: Duration = Duration::from_secs(5);

/// How often the whole table is re-read although nothing seemed lost.
pub const FULL_REFRESH_INTERVAL: Duration = Duration::from_secs(600);

/// Most notifications handled with one read.
const MAX_NOTIFIED_BATCH: usize = 1024;

/// How often the watcher re-reads and how it reconnects.
#[derive(Debug, Clone)]
pub struct WatcherConfig {
    /// Period of the fallback re-read of recently changed rows: the bound on staleness
    /// if a notification is lost.
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

/// What the watcher has read so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WatcherStats {
    /// Fallback re-reads of the recently changed rows.
    pub refreshes: u64,
    /// Rows those re-reads returned, in all.
    pub refreshed_rows: u64,
    /// Rows the latest of them returned.
    pub last_refresh_rows: u64,
    /// Reads of the whole table (at start, after each (re)connection, and every
    /// [`FULL_REFRESH_INTERVAL`]).
    pub full_reads: u64,
    /// Reads of the rows named by notifications.
    pub notified_reads: u64,
}

/// Keeps every campaign's settings current; see the module docs.
#[derive(Debug)]
pub struct CampaignWatcher {
    snapshot: watch::Receiver<CampaignSnapshot>,
    changes: broadcast::Sender<Campaign>,
    stats: Arc<Mutex<WatcherStats>>,
    task: JoinHandle<()>,
}

impl CampaignWatcher {
    /// Loads every campaign (failing if that is impossible), then keeps them fresh until
    /// `stop` is cancelled or the watcher is dropped.
    pub async fn start(
        pool: PgPool,
        config: WatcherConfig,
        stop: CancellationToken,
    ) -> Result<Self, StoreError> {
        let read_at = server_now(&pool).await?;
        let all = campaigns::all(&pool).await?;
        let stats = Arc::new(Mutex::new(WatcherStats {
            full_reads: 1,
            ..WatcherStats::default()
        }));
        let (snapshot_tx, snapshot) = watch::channel(CampaignSnapshot::default().replaced(all));
        let (changes, _) = broadcast::channel(1024);
        let publisher = Publisher {
            pool: pool.clone(),
            snapshot: snapshot_tx,
            changes: changes.clone(),
            stats: stats.clone(),
            since: read_at - REREAD_OVERLAP,
            last_full: Instant::now(),
            failing: false,
        };
        let task = tokio::spawn(run(pool, config, stop, publisher));
        Ok(Self {
            snapshot,
            changes,
            stats,
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

    /// What has been read so far.
    pub fn stats(&self) -> WatcherStats {
        *self.stats.lock()
    }
}

impl Drop for CampaignWatcher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn server_now(pool: &PgPool) -> Result<DateTime<Utc>, StoreError> {
    Ok(sqlx::query_scalar("SELECT now()").fetch_one(pool).await?)
}

/// What a LISTEN task hands over.
pub(crate) enum Event {
    Changed(String),
    /// The listener (re)connected: notifications may have been missed.
    Resync,
}

struct Publisher {
    pool: PgPool,
    snapshot: watch::Sender<CampaignSnapshot>,
    changes: broadcast::Sender<Campaign>,
    stats: Arc<Mutex<WatcherStats>>,
    /// Where the next fallback re-read starts; see [`REREAD_OVERLAP`].
    since: DateTime<Utc>,
    last_full: Instant,
    failing: bool,
}

impl Publisher {
    async fn refresh(&mut self) {
        if self.last_full.elapsed() >= FULL_REFRESH_INTERVAL {
            self.reload_all().await
        } else {
            self.reload_changed().await
        }
    }

    async fn reload_all(&mut self) {
        let read = async {
            let read_at = server_now(&self.pool).await?;
            Ok::<_, StoreError>((read_at, campaigns::all(&self.pool).await?))
        };
        let (read_at, fresh) = match read.await {
            Ok(read) => read,
            Err(e) => return self.failed(e),
        };
        self.recovered();
        self.since = read_at - REREAD_OVERLAP;
        self.last_full = Instant::now();
        self.stats.lock().full_reads += 1;
        metrics::counter!("campaign_watcher_rows_read_total", "read" => "all")
            .increment(fresh.len() as u64);
        let current = self.snapshot.borrow().clone();
        let mut differs = fresh.len() != current.len();
        for campaign in &fresh {
            if current.get(&campaign.id) != Some(campaign) {
                differs = true;
                // No receiver is not an error: the snapshot carries the change anyway.
                let _ = self.changes.send(campaign.clone());
            }
        }
        if differs {
            self.snapshot.send_replace(current.replaced(fresh));
        }
    }

    async fn reload_changed(&mut self) {
        let read = async {
            let read_at = server_now(&self.pool).await?;
            let rows = campaigns::changed_since(&self.pool, self.since).await?;
            Ok::<_, StoreError>((read_at, rows))
        };
        let (read_at, fresh) = match read.await {
            Ok(read) => read,
            Err(e) => return self.failed(e),
        };
        self.recovered();
        self.since = read_at - REREAD_OVERLAP;
        let rows = fresh.len() as u64;
        {
            let mut stats = self.stats.lock();
            stats.refreshes += 1;
            stats.refreshed_rows += rows;
            stats.last_refresh_rows = rows;
        }
        metrics::counter!("campaign_watcher_rows_read_total", "read" => "changed").increment(rows);
        self.publish(fresh, Vec::new());
    }

    async fn reload_ids(&mut self, ids: Vec<String>) {
        let fresh = match campaigns::get_many(&self.pool, &ids).await {
            Ok(fresh) => fresh,
            Err(e) => return self.failed(e),
        };
        self.recovered();
        self.stats.lock().notified_reads += 1;
        metrics::counter!("campaign_watcher_rows_read_total", "read" => "notified")
            .increment(fresh.len() as u64);
        let found: HashSet<&str> = fresh.iter().map(|c| c.id.as_str()).collect();
        let removed: Vec<String> = ids
            .iter()
            .filter(|id| !found.contains(id.as_str()))
            .cloned()
            .collect();
        self.publish(fresh, removed);
    }

    /// Publishes the rows that differ from the snapshot and the removals, if any.
    fn publish(&mut self, fresh: Vec<Campaign>, removed: Vec<String>) {
        let current = self.snapshot.borrow().clone();
        let changed: Vec<Campaign> = fresh
            .into_iter()
            .filter(|c| current.get(&c.id) != Some(c))
            .collect();
        let removed: Vec<String> = removed
            .into_iter()
            .filter(|id| current.get(id).is_some())
            .collect();
        if changed.is_empty() && removed.is_empty() {
            return;
        }
        for campaign in &changed {
            let _ = self.changes.send(campaign.clone());
        }
        self.snapshot
            .send_replace(current.with_changes(changed, &removed));
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

/// The notifications already queued after `first`, up to [`MAX_NOTIFIED_BATCH`]: the
/// distinct ids, or `None` when one of them asks for a full re-read.
fn batch(first: Event, rx: &mut mpsc::Receiver<Event>) -> Option<Vec<String>> {
    let mut ids = Vec::new();
    let mut resync = false;
    let mut next = Some(first);
    while let Some(event) = next {
        match event {
            Event::Changed(id) => ids.push(id),
            Event::Resync => resync = true,
        }
        next = if ids.len() < MAX_NOTIFIED_BATCH {
            rx.try_recv().ok()
        } else {
            None
        };
    }
    if resync {
        return None;
    }
    ids.sort_unstable();
    ids.dedup();
    Some(ids)
}

async fn run(
    pool: PgPool,
    config: WatcherConfig,
    stop: CancellationToken,
    mut publisher: Publisher,
) {
    let (tx, mut rx) = mpsc::channel(1024);
    let listener = AbortOnDrop(tokio::spawn(listen(pool, CHANNEL, config.clone(), tx)));
    let mut refresh = tokio::time::interval(config.refresh_interval);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    refresh.tick().await; // the first tick is immediate; start() has just loaded
    loop {
        tokio::select! {
            _ = stop.cancelled() => break,
            event = rx.recv() => match event.map(|first| batch(first, &mut rx)) {
                Some(Some(ids)) => publisher.reload_ids(ids).await,
                Some(None) => publisher.reload_all().await,
                None => break,
            },
            _ = refresh.tick() => publisher.refresh().await,
        }
    }
    drop(listener);
}

pub(crate) struct AbortOnDrop(pub(crate) JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// LISTENs on `channel` until `tx` closes or the pool does, reconnecting with backoff;
/// a [`Event::Resync`] after every (re)connection. Its own task: `try_recv` must not be
/// cancelled mid-message.
pub(crate) async fn listen(
    pool: PgPool,
    channel: &'static str,
    config: WatcherConfig,
    tx: mpsc::Sender<Event>,
) {
    let mut backoff = config.reconnect_min;
    let mut outage = false;
    loop {
        let mut listener = match subscribe(&pool, channel).await {
            Ok(listener) => listener,
            Err(sqlx::Error::PoolClosed) => return,
            Err(e) => {
                if !outage {
                    tracing::warn!(error = %e, channel, "cannot LISTEN; retrying");
                    outage = true;
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(config.reconnect_max);
                continue;
            }
        };
        if outage {
            tracing::info!(channel, "listening again");
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
                        tracing::warn!(error = %e, channel, "LISTEN connection failed; reconnecting");
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

async fn subscribe(pool: &PgPool, channel: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect_with(pool).await?;
    listener.listen(channel).await?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queued_notifications_are_read_together() {
        let (tx, mut rx) = mpsc::channel(16);
        for id in ["b", "a", "b"] {
            tx.try_send(Event::Changed(id.to_string())).ok();
        }
        let first = rx.try_recv().ok();
        let ids = first.and_then(|e| batch(e, &mut rx));
        assert_eq!(ids, Some(vec!["a".to_string(), "b".to_string()]));
        tx.try_send(Event::Changed("c".to_string())).ok();
        tx.try_send(Event::Resync).ok();
        let first = rx.try_recv().ok();
        assert!(first.is_some_and(|e| batch(e, &mut rx).is_none()));
    }
}
