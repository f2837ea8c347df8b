//! The app router: keeps each app slot's provider in the scheduler current.
//!
//! Intake gives a slot to each (app, kind) its jobs name (`provider::app_slots`). The
//! router watches each one ([`AppWatcher`]) and sends the scheduler its word
//! ([`AppUpdate`]) whenever the entry changes: a provider built from the opened
//! credentials, why its jobs wait, or that the app is gone. Credentials whose secret and
//! connection settings did not change (only their limits did) keep their sender, so
//! their connections and signed tokens live on (APNs allows a key's token to be
//! re-signed only every 20 minutes). A state, not a call: the scheduler never asks.

use crate::apps::provider::{named_provider, AppDefaults};
use crate::apps::watcher::{AppEntry, AppStatus, AppWatcher};
use crate::apps::AppKind;
use crate::provider::app_slots::{AppKey, AppSlots};
use crate::provider::{build, Provider};
use crate::sender::AnySender;
use crate::worker::scheduler::{AppState, AppUpdate, Control};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

/// One routed slot: what was last sent for it.
struct Routed {
    slot: u16,
    key: AppKey,
    kind: AppKind,
    version: Option<u64>,
    /// The identity (fingerprint and connection settings) and sender last built.
    built: Option<(String, AnySender)>,
}

/// What the router starts its watcher with, once a job names an app.
pub struct WatcherStart {
    pub pool: sqlx::PgPool,
    pub keyring: Option<Arc<crate::apps::Keyring>>,
    pub config: crate::store::listen::WatcherConfig,
    /// The watcher's own stop (it outlives the router's phase).
    pub stop: CancellationToken,
}

/// Runs until `stop`, or until the scheduler is gone. The watcher (and its LISTEN
/// connection, one of the pool's) starts only when a job first names an app: a worker
/// that sends for no app holds nothing for them.
pub async fn run(
    slots: Arc<AppSlots>,
    start: WatcherStart,
    defaults: AppDefaults,
    control: mpsc::Sender<Control>,
    stop: CancellationToken,
) {
    tokio::select! {
        _ = stop.cancelled() => return,
        _ = slots.added() => {}
    }
    let (watcher, _task) = AppWatcher::start(start.pool, start.keyring, start.config, start.stop);
    let mut routed: Vec<Routed> = Vec::new();
    loop {
        for (slot, key) in slots.since(routed.len()) {
            let Some(kind) = AppKind::of(key.kind) else {
                continue;
            };
            watcher.watch(&key.app_id, kind);
            routed.push(Routed {
                slot,
                key,
                kind,
                version: None,
                built: None,
            });
        }
        for r in &mut routed {
            let Some(entry) = watcher.get(&r.key.app_id, r.kind) else {
                continue;
            };
            if r.version == Some(entry.version) {
                continue;
            }
            r.version = Some(entry.version);
            let state = state_of(r, &entry, &defaults);
            let update = AppUpdate {
                slot: r.slot,
                key: r.key.clone(),
                state,
            };
            if control.send(Control::App(update)).await.is_err() {
                return;
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = slots.added() => {}
            _ = watcher.changed() => {}
        }
    }
}

/// The scheduler's word for one entry; a provider that cannot be built is waited on
/// with the reason (the checks at PUT make that rare: a CA file gone, say).
fn state_of(r: &mut Routed, entry: &AppEntry, defaults: &AppDefaults) -> AppState {
    let creds = match &entry.status {
        AppStatus::Ready(c) => c,
        AppStatus::Waiting(why) => return AppState::Waiting(why.clone()),
        AppStatus::Halted(why) => return AppState::Halted(why.clone()),
        AppStatus::Deleted => {
            r.built = None;
            return AppState::Deleted;
        }
    };
    let fingerprint: Arc<str> = Arc::from(creds.fingerprint());
    let spec = match named_provider(&r.key.app_id, creds, defaults) {
        Ok(spec) => spec,
        Err(e) => return unbuildable(&r.key, &e),
    };
    let identity = identity(creds);
    let provider: Provider = match &r.built {
        Some((id, sender)) if *id == identity => build::with_sender(&spec, sender.clone()),
        _ => match build::build_one(&spec) {
            Ok(p) => p,
            Err(e) => return unbuildable(&r.key, &e),
        },
    };
    r.built = Some((identity, provider.sender.clone()));
    AppState::Ready {
        provider,
        fingerprint,
    }
}

fn unbuildable(key: &AppKey, e: &crate::provider::ProviderError) -> AppState {
    tracing::error!(app = %key.app_id, kind = key.kind.as_str(), error = %e, "cannot build an app's provider");
    AppState::Waiting(Arc::from(format!(
        "waiting for app {}: its {} provider cannot be built: {e}",
        key.app_id,
        key.kind.as_str()
    )))
}

/// What a sender is built from besides the limits: a digest of the secret (an FCM key
/// rotated under the same client_email has the same fingerprint) and the settings that
/// are not limits. Kept in memory only.
fn identity(creds: &crate::apps::model::Credentials) -> String {
    use secrecy::ExposeSecret;
    use sha2::{Digest, Sha256};
    let mut settings = creds.settings_json();
    if let (Some(all), Ok(serde_json::Value::Object(limits))) = (
        settings.as_object_mut(),
        serde_json::to_value(creds.limits()),
    ) {
        for k in limits.keys() {
            all.remove(k);
        }
    }
    let digest = Sha256::digest(creds.secret().expose_secret().as_bytes());
    let digest: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{digest} {settings}")
}
