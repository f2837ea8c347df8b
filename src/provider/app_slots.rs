//! The provider slots of registered apps: each (app, kind) a job names gets a slot
//! after the static `[providers.*]` ones, the first time a job names it, and keeps it
//! for the worker's life (a slot is two words here and a few in the scheduler).
//!
//! Intake asks for a job's slot (one short lock per job, never per send); the app
//! router (`worker::app_router`) learns of each new slot through [`AppSlots::added`]
//! and keeps the scheduler's provider in that slot current. Until it has, the slot
//! holds a [`ClosedSender`] and the scheduler's gate for it is closed: its jobs wait.

use super::ProviderKind;
use crate::job::{Job, JobError};
use crate::sender::{SendFuture, SendOutcome, Sender};
use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// An app's kind in one slot.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct AppKey {
    pub app_id: Arc<str>,
    pub kind: ProviderKind,
}

impl AppKey {
    /// The provider name it sends as (`app/<id>/<kind>`), in logs, metrics and the API.
    pub fn name(&self) -> String {
        format!("app/{}/{}", self.app_id, self.kind.as_str())
    }
}

#[derive(Default)]
struct Table {
    by_key: HashMap<AppKey, u16>,
    keys: Vec<AppKey>,
}

/// The app slots of one worker; shared by intake and the app router.
pub struct AppSlots {
    base: u16,
    table: Mutex<Table>,
    added: tokio::sync::Notify,
}

impl std::fmt::Debug for AppSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppSlots")
            .field("base", &self.base)
            .field("len", &self.len())
            .finish()
    }
}

/// The kinds an app can have, by the name a job gives in `provider`.
pub fn app_kind(name: &str) -> Option<ProviderKind> {
    match name {
        "apns" => Some(ProviderKind::Apns),
        "fcm" => Some(ProviderKind::Fcm),
        "webpush" => Some(ProviderKind::WebPush),
        _ => None,
    }
}

impl AppSlots {
    /// Slots from `base` (the number of static providers) on.
    pub fn new(base: u16) -> Self {
        Self {
            base,
            table: Mutex::new(Table::default()),
            added: tokio::sync::Notify::new(),
        }
    }

    /// The slot of the app and kind `job` names (`app_id`, and `provider` naming one of
    /// the app's kinds), given now if it had none. Checks the kind's job rules.
    pub fn resolve(&self, job: &mut Job) -> Result<(), JobError> {
        let Some(app_id) = job.app_id.as_deref() else {
            return Err(JobError::field_problem("app_id", "missing"));
        };
        let kind = match job.provider.as_deref() {
            None => {
                return Err(JobError::field_problem(
                    "provider",
                    "a job with app_id names the app's kind: apns, fcm or webpush",
                ))
            }
            Some(name) => app_kind(name).ok_or_else(|| {
                JobError::field_problem(
                    "provider",
                    format!(
                        "{} is not an app's kind; with app_id it is apns, fcm or webpush",
                        crate::job::echo(name)
                    ),
                )
            })?,
        };
        crate::job::check_for_provider(job, kind)?;
        job.provider_slot = self.slot(app_id, kind)?;
        Ok(())
    }

    /// The slot of `app_id`'s `kind`, given now if it had none.
    pub fn slot(&self, app_id: &str, kind: ProviderKind) -> Result<u16, JobError> {
        let mut t = self.table.lock();
        let key = AppKey {
            app_id: Arc::from(app_id),
            kind,
        };
        if let Some(&slot) = t.by_key.get(&key) {
            return Ok(slot);
        }
        let next = usize::from(self.base) + t.keys.len();
        let Ok(slot) = u16::try_from(next) else {
            return Err(JobError::field_problem(
                "app_id",
                "this worker already sends for 65,535 provider slots; restart it to free the \
                 slots of apps no longer used",
            ));
        };
        t.by_key.insert(key.clone(), slot);
        t.keys.push(key);
        drop(t);
        self.added.notify_one();
        Ok(slot)
    }

    /// The app and kind in `slot`, if it is an app's.
    pub fn key(&self, slot: u16) -> Option<AppKey> {
        let i = usize::from(slot.checked_sub(self.base)?);
        self.table.lock().keys.get(i).cloned()
    }

    /// The slots given so far, from `from` on (an index among the app slots).
    pub fn since(&self, from: usize) -> Vec<(u16, AppKey)> {
        let t = self.table.lock();
        t.keys
            .iter()
            .enumerate()
            .skip(from)
            .map(|(i, k)| (self.base + i as u16, k.clone()))
            .collect()
    }

    /// Waits until a slot is given (at once if one was since the last wait).
    pub async fn added(&self) {
        self.added.notified().await;
    }

    /// The first app slot.
    pub fn base(&self) -> u16 {
        self.base
    }

    /// App slots given.
    pub fn len(&self) -> usize {
        self.table.lock().keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// How long a send through a slot not yet open waits before it is tried again. The
/// scheduler never sends through a closed slot; this only keeps a mistake harmless.
const CLOSED_RETRY: Duration = Duration::from_secs(1);

/// The sender of an app slot before its provider is built: every send is "not yet".
#[derive(Debug, Clone, Copy)]
pub struct ClosedSender;

impl Sender for ClosedSender {
    fn send(&self, _job: &Arc<Job>, _device_index: usize) -> SendFuture {
        SendFuture::ready(SendOutcome::RetryProvider {
            after: Some(CLOSED_RETRY),
            reason: "the app's provider is not open yet".into(),
            signal: None,
        })
    }

    fn name(&self) -> &'static str {
        "closed"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(app: &str, provider: Option<&str>) -> Job {
        let payload = serde_json::value::RawValue::from_string(r#"{"aps":{}}"#.into()).unwrap();
        let mut j = Job::new("j", "c", vec!["a".repeat(64)], payload)
            .unwrap()
            .with_app(Some(app.into()));
        j.provider = provider.map(str::to_string);
        j
    }

    #[test]
    fn each_app_kind_gets_one_slot_after_the_static_ones() {
        let slots = AppSlots::new(2);
        let mut a = job("acme", Some("apns"));
        slots.resolve(&mut a).unwrap();
        let mut b = job("beta", Some("apns"));
        slots.resolve(&mut b).unwrap();
        let mut a2 = job("acme", Some("apns"));
        slots.resolve(&mut a2).unwrap();
        assert_eq!(
            (a.provider_slot, b.provider_slot, a2.provider_slot),
            (2, 3, 2)
        );
        assert_eq!(slots.key(3).unwrap().name(), "app/beta/apns");
        assert_eq!(slots.key(1), None);
        assert_eq!(slots.since(1).len(), 1);
    }

    #[test]
    fn an_app_job_names_a_kind_of_the_app() {
        let slots = AppSlots::new(0);
        let e = slots.resolve(&mut job("acme", None)).unwrap_err();
        assert!(e.to_string().contains("provider"), "{e}");
        let e = slots
            .resolve(&mut job("acme", Some("webhook")))
            .unwrap_err();
        assert!(e.to_string().contains("apns, fcm or webpush"), "{e}");
        assert!(slots.is_empty());
    }
}
