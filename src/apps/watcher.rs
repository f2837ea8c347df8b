//! [`AppWatcher`]: the apps a worker's jobs name, each kind opened for use and kept
//! fresh within a second of a change.
//!
//! Only watched kinds are held (a worker of a platform with 10,000 apps holds the ones
//! its jobs name), so an idle registered app costs a worker nothing. [`AppWatcher::watch`]
//! answers at once from the table (a new entry is `Waiting` until its first open) and
//! asks the watcher's task to open it. The `apps` and `app_credentials` triggers NOTIFY
//! [`super::CHANNEL`] with the app id; the task LISTENs and re-opens the watched kinds
//! of the ids named. As a fallback for a lost notification it compares, every
//! `refresh_interval`, each watched row's stamp (status, master key, `updated_at`) and
//! re-opens those that moved, and after every (re)connection of the listener it
//! re-opens them all. Each change bumps a generation, which readers poll (one atomic
//! load) to know that they should look again.

use super::model::Credentials;
use super::store::{self, open};
use super::{AppKind, AppsError, Keyring, CHANNEL};
use crate::store::listen::{listen, AbortOnDrop, Event, WatcherConfig};
use chrono::{DateTime, Utc};
use parking_lot::Mutex;
use sqlx::PgPool;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// What a watched kind of an app is, for the jobs that name it.
#[derive(Clone)]
pub enum AppStatus {
    /// Opened: what its provider is built from.
    Ready(Arc<Credentials>),
    /// Not registered (yet), disabled, without this kind, or not opened yet: its jobs
    /// wait. The text is what the campaign shows (`waiting for app X: …`).
    Waiting(Arc<str>),
    /// Its credentials did not open, or a provider refused them: halted with the reason
    /// until `apps enable` or a new PUT.
    Halted(Arc<str>),
    /// The app was deleted: its jobs are dead-lettered as `unknown_app`.
    Deleted,
}

impl std::fmt::Debug for AppStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppStatus::Ready(c) => write!(f, "Ready({})", c.fingerprint()),
            AppStatus::Waiting(r) => write!(f, "Waiting({r})"),
            AppStatus::Halted(r) => write!(f, "Halted({r})"),
            AppStatus::Deleted => f.write_str("Deleted"),
        }
    }
}

/// One watched kind: its status and how many times it changed.
#[derive(Debug, Clone)]
pub struct AppEntry {
    pub status: AppStatus,
    /// Bumped by every change of `status` (a rotation is a change): a reader that built
    /// a provider from version n rebuilds when it sees another.
    pub version: u64,
    /// What the fallback compares: the row's status, master key and `updated_at`.
    stamp: Option<Stamp>,
    /// What `status` was built from, to tell a real change from the same row re-read.
    seen: String,
}

type Stamp = (String, String, DateTime<Utc>);
type Key = (Arc<str>, AppKind);

struct Inner {
    pool: PgPool,
    keyring: Option<Arc<Keyring>>,
    table: Mutex<HashMap<Key, AppEntry>>,
    generation: AtomicU64,
    /// Woken by each change, for the one reader that waits ([`AppWatcher::changed`]).
    changed: tokio::sync::Notify,
    opens: AtomicU64,
    asks: mpsc::UnboundedSender<Arc<str>>,
}

/// The watched apps; cheap to clone.
#[derive(Clone)]
pub struct AppWatcher {
    inner: Arc<Inner>,
}

impl AppWatcher {
    /// Starts the watcher's task; it ends with `stop` or when the pool closes.
    pub fn start(
        pool: PgPool,
        keyring: Option<Arc<Keyring>>,
        config: WatcherConfig,
        stop: CancellationToken,
    ) -> (AppWatcher, JoinHandle<()>) {
        let (asks, asked) = mpsc::unbounded_channel();
        let watcher = AppWatcher {
            inner: Arc::new(Inner {
                pool,
                keyring,
                table: Mutex::new(HashMap::new()),
                generation: AtomicU64::new(0),
                changed: tokio::sync::Notify::new(),
                opens: AtomicU64::new(0),
                asks,
            }),
        };
        let task = tokio::spawn(run(watcher.clone(), config, asked, stop));
        (watcher, task)
    }

    /// The entry of `id`'s `kind`, watching it from now on (a first call answers
    /// `Waiting` and asks the task to open it).
    pub fn watch(&self, id: &str, kind: AppKind) -> AppEntry {
        let mut table = self.inner.table.lock();
        if let Some(e) = table.get(&(Arc::from(id), kind)) {
            return e.clone();
        }
        let entry = AppEntry {
            status: AppStatus::Waiting(Arc::from(format!("waiting for app {id}: opening"))),
            version: 0,
            stamp: None,
            seen: String::new(),
        };
        table.insert((Arc::from(id), kind), entry.clone());
        drop(table);
        let _ = self.inner.asks.send(Arc::from(id));
        entry
    }

    /// The entry, if `id`'s `kind` is watched.
    pub fn get(&self, id: &str, kind: AppKind) -> Option<AppEntry> {
        let table = self.inner.table.lock();
        table.get(&(Arc::from(id), kind)).cloned()
    }

    /// Bumped by every change of any entry.
    pub fn generation(&self) -> u64 {
        self.inner.generation.load(Ordering::Acquire)
    }

    /// Waits for a change of any entry (at once if one came since the last wait). For
    /// one reader: the app router.
    pub async fn changed(&self) {
        self.inner.changed.notified().await;
    }

    /// How many times a kind was opened (each a decryption): for tests and metrics.
    pub fn opens(&self) -> u64 {
        self.inner.opens.load(Ordering::Relaxed)
    }

    /// The watched kinds.
    pub fn watched(&self) -> usize {
        self.inner.table.lock().len()
    }

    fn kinds_of(&self, id: &str) -> Vec<AppKind> {
        let table = self.inner.table.lock();
        AppKind::ALL
            .into_iter()
            .filter(|&k| table.contains_key(&(Arc::from(id), k)))
            .collect()
    }

    fn ids(&self) -> Vec<Arc<str>> {
        let table = self.inner.table.lock();
        let ids: HashSet<Arc<str>> = table.keys().map(|(id, _)| id.clone()).collect();
        ids.into_iter().collect()
    }

    /// Re-opens every watched kind of `id`. A database error keeps what was there (the
    /// next notification or re-read tries again).
    async fn reload(&self, id: &Arc<str>) -> Result<(), sqlx::Error> {
        for kind in self.kinds_of(id) {
            let (status, seen, stamp) = self.read(id, kind).await?;
            let mut table = self.inner.table.lock();
            let Some(e) = table.get_mut(&(id.clone(), kind)) else {
                continue;
            };
            e.stamp = stamp;
            if e.seen != seen {
                tracing::info!(app = %id, kind = %kind, status = ?status, "app credentials changed");
                e.seen = seen;
                e.status = status;
                e.version += 1;
                self.inner.generation.fetch_add(1, Ordering::AcqRel);
                self.inner.changed.notify_one();
            }
        }
        Ok(())
    }

    /// What `id`'s `kind` is now, with what it was built from and its row's stamp.
    async fn read(
        &self,
        id: &str,
        kind: AppKind,
    ) -> Result<(AppStatus, String, Option<Stamp>), sqlx::Error> {
        let pool = &self.inner.pool;
        let stamp = stamp_of(pool, id, kind).await?;
        self.inner.opens.fetch_add(1, Ordering::Relaxed);
        let waiting = |why: String| {
            let text = format!("waiting for app {id}: {why}");
            (AppStatus::Waiting(Arc::from(text.as_str())), text)
        };
        let (status, seen) = match open(pool, self.inner.keyring.as_deref(), id, kind).await {
            Ok(creds) => {
                let seen = format!("ready {} {}", creds.fingerprint(), creds.settings_json());
                (AppStatus::Ready(Arc::new(creds)), seen)
            }
            Err(AppsError::Database(e)) => return Err(e),
            Err(AppsError::NotFound(_)) if was_deleted(pool, id).await? => {
                (AppStatus::Deleted, "deleted".to_string())
            }
            Err(AppsError::NotFound(_)) => waiting("not registered".into()),
            Err(AppsError::NoCredentials { .. }) => {
                waiting(format!("it has no {kind} credentials"))
            }
            Err(AppsError::Disabled { .. }) => {
                waiting(format!("its {kind} credentials are disabled"))
            }
            Err(AppsError::NoMasterKey) => waiting("this worker has no master key".into()),
            Err(AppsError::Halted { reason, .. }) => {
                let text = format!("app {id} {kind} halted: {reason}");
                (AppStatus::Halted(Arc::from(text.as_str())), text)
            }
            Err(e) => waiting(e.to_string()),
        };
        Ok((status, seen, stamp))
    }

    /// The watched ids whose row moved since it was last read (the fallback).
    async fn moved(&self) -> Result<Vec<Arc<str>>, sqlx::Error> {
        let ids = self.ids();
        let names: Vec<String> = ids.iter().map(|i| i.to_string()).collect();
        let rows: Vec<(String, String, String, String, DateTime<Utc>)> = sqlx::query_as(
            "SELECT app_id, kind, status, master_key_id, updated_at FROM app_credentials \
             WHERE app_id = ANY($1)",
        )
        .bind(&names)
        .fetch_all(&self.inner.pool)
        .await?;
        let now: HashMap<(String, String), Stamp> = rows
            .into_iter()
            .map(|(id, kind, status, key, at)| ((id, kind), (status, key, at)))
            .collect();
        let table = self.inner.table.lock();
        let mut out: Vec<Arc<str>> = table
            .iter()
            .filter(|((id, kind), e)| {
                let key = (id.to_string(), kind.as_str().to_string());
                now.get(&key) != e.stamp.as_ref()
            })
            .map(|((id, _), _)| id.clone())
            .collect();
        out.sort_unstable();
        out.dedup();
        Ok(out)
    }
}

async fn stamp_of(pool: &PgPool, id: &str, kind: AppKind) -> Result<Option<Stamp>, sqlx::Error> {
    sqlx::query_as(
        "SELECT status, master_key_id, updated_at FROM app_credentials \
         WHERE app_id = $1 AND kind = $2",
    )
    .bind(id)
    .bind(kind.as_str())
    .fetch_optional(pool)
    .await
}

/// Whether the app's last app-level event is its deletion (an id never registered is
/// only waited for: the operator may be adding it now).
async fn was_deleted(pool: &PgPool, id: &str) -> Result<bool, sqlx::Error> {
    let last: Option<String> = sqlx::query_scalar(
        "SELECT new_value FROM app_events WHERE app_id = $1 AND field = 'app' \
         ORDER BY at DESC, id DESC LIMIT 1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    Ok(last.as_deref() == Some("deleted"))
}

async fn run(
    watcher: AppWatcher,
    config: WatcherConfig,
    mut asked: mpsc::UnboundedReceiver<Arc<str>>,
    stop: CancellationToken,
) {
    let (tx, mut events) = mpsc::channel(1024);
    let pool = watcher.inner.pool.clone();
    let _listener = AbortOnDrop(tokio::spawn(listen(pool, CHANNEL, config.clone(), tx)));
    let mut tick = tokio::time::interval(config.refresh_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let ids: Vec<Arc<str>> = tokio::select! {
            _ = stop.cancelled() => return,
            Some(id) = asked.recv() => vec![id],
            event = events.recv() => match event {
                Some(Event::Changed(id)) => vec![Arc::from(id)],
                Some(Event::Resync) => watcher.ids(),
                None => return,
            },
            _ = tick.tick() => match watcher.moved().await {
                Ok(ids) => ids,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot re-read the watched apps; retrying");
                    Vec::new()
                }
            },
        };
        for id in ids {
            if store::check_id(&id).is_err() {
                continue;
            }
            if let Err(e) = watcher.reload(&id).await {
                tracing::warn!(app = %id, error = %e, "cannot open the app's credentials; retrying");
            }
        }
    }
}
