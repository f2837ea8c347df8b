//! Push providers: the named set a worker sends through, and the adapters for APNs, FCM
//! HTTP v1 and Web Push (the generic webhook is [`crate::sender::HttpSender`]).
//!
//! Each adapter is a [`Sender`] that builds the provider's request for one device, sends
//! it over [`h2pool`] (TLS with ALPN h2, several long-lived HTTP/2 connections) and maps
//! the answer to one [`SendOutcome`] class. Authentication (APNs JWT, FCM OAuth token,
//! VAPID) is cached and refreshed off the send path. The scheduler acts on the class
//! only; docs/PROVIDERS.md has each provider's table.
//!
//! A job names its provider (`"provider": "<name>"`) or gets `sender.default_provider`.
//! [`Providers::resolve`] checks the name and the provider's own job rules at intake, so
//! a job that no provider could take is dead-lettered before it is scheduled. A job that
//! names an `app_id` gets its app kind's slot instead ([`app_slots`]), after the static
//! ones; the scheduler holds that slot's provider, built from the app's credentials.

pub mod apns;
pub mod app_slots;
pub mod build;
pub mod ceiling;
pub mod check;
pub mod fcm;
pub mod h2pool;
pub mod settings;
pub mod tls;
pub mod webpush;

pub use crate::job::ProviderKind;
use crate::job::{Job, JobError};
use crate::limiter::Rate;
use crate::sender::{AnySender, SendFuture, SendOutcome, Sender};
use std::sync::Arc;

/// Errors setting up a provider: configuration, key material, TLS.
#[derive(Debug, thiserror::Error)]
pub enum ProviderError {
    #[error("provider {provider}: {problem}")]
    Config { provider: String, problem: String },
    #[error("provider {provider}: cannot read {what}: {problem}")]
    Key {
        provider: String,
        what: &'static str,
        problem: String,
    },
    #[error("provider {provider}: TLS: {problem}")]
    Tls { provider: String, problem: String },
    #[error(transparent)]
    Sender(#[from] crate::sender::SenderError),
}

/// One named provider of a worker.
#[derive(Clone)]
pub struct Provider {
    pub name: Arc<str>,
    pub kind: ProviderKind,
    /// A cap on the sends of all campaigns using this provider.
    pub max_rate: Option<Rate>,
    /// Sends in flight through this provider at most (within `sender.max_in_flight`).
    pub max_in_flight: Option<u32>,
    /// Its adaptive ceiling's law (`None`: no ceiling).
    pub adaptive: Option<ceiling::CeilingParams>,
    pub sender: AnySender,
}

impl Provider {
    /// An app slot's placeholder until its provider is built: sends nothing.
    pub fn closed(name: Arc<str>, kind: ProviderKind) -> Self {
        Provider {
            name,
            kind,
            max_rate: None,
            max_in_flight: None,
            adaptive: None,
            sender: AnySender::Provider(Arc::new(app_slots::ClosedSender)),
        }
    }
}

impl std::fmt::Debug for Provider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Provider")
            .field("name", &self.name)
            .field("kind", &self.kind)
            .field("max_rate", &self.max_rate)
            .field("max_in_flight", &self.max_in_flight)
            .field("adaptive", &self.adaptive)
            .finish()
    }
}

/// The providers of one worker, by slot (a job's `provider_slot`): the static ones,
/// then the apps' (filled in by the scheduler as the app router builds them).
#[derive(Debug, Clone)]
pub struct Providers {
    list: Vec<Provider>,
    default: u16,
    apps: Arc<app_slots::AppSlots>,
}

impl Providers {
    /// One provider, the default, named `name`: a bare sender, with no cap and no
    /// adaptive ceiling.
    pub fn single(name: &str, kind: ProviderKind, sender: AnySender) -> Self {
        Self {
            list: vec![Provider {
                name: Arc::from(name),
                kind,
                max_rate: None,
                max_in_flight: None,
                adaptive: None,
                sender,
            }],
            default: 0,
            apps: Arc::new(app_slots::AppSlots::new(1)),
        }
    }

    /// Several providers; `default` names the one for jobs that name none.
    pub fn new(list: Vec<Provider>, default: &str) -> Result<Self, ProviderError> {
        let config = |problem: String| ProviderError::Config {
            provider: default.to_string(),
            problem,
        };
        if list.len() > usize::from(u16::MAX) {
            return Err(config(format!("{} providers; at most 65535", list.len())));
        }
        let Some(slot) = list.iter().position(|p| &*p.name == default) else {
            return Err(config(
                "sender.default_provider names no configured provider".into(),
            ));
        };
        Ok(Self {
            apps: Arc::new(app_slots::AppSlots::new(list.len() as u16)),
            list,
            default: slot as u16,
        })
    }

    /// The app slots, shared by every clone (intake gives them, the router fills them).
    pub fn apps(&self) -> &Arc<app_slots::AppSlots> {
        &self.apps
    }

    /// Puts `provider` in app slot `slot`, filling the slots before it with closed
    /// placeholders named from the app slots. The scheduler's own copy only.
    pub fn set(&mut self, slot: u16, provider: Provider) {
        let slot = usize::from(slot);
        while self.list.len() < slot {
            let at = self.list.len() as u16;
            let key = self.apps.key(at);
            let (name, kind) = key.map_or_else(
                || (Arc::from("app/unknown"), ProviderKind::Null),
                |k| (Arc::from(k.name()), k.kind),
            );
            self.list.push(Provider::closed(name, kind));
        }
        if slot == self.list.len() {
            self.list.push(provider);
        } else {
            self.list[slot] = provider;
        }
    }

    /// Sets `job.provider_slot` from the name the job gives (or the default) and checks
    /// the provider's own rules for the job (payload size, FCM data values, Web Push
    /// subscriptions…).
    pub fn resolve(&self, job: &mut Job) -> Result<(), JobError> {
        if job.app_id.is_some() {
            // Never through a static provider: it holds another app's credentials.
            return self.apps.resolve(job);
        }
        let slot = match job.provider.as_deref() {
            None => self.default,
            Some(name) => match self.list.iter().position(|p| &*p.name == name) {
                Some(slot) => slot as u16,
                None => return Err(crate::job::unknown_provider(name, self.names())),
            },
        };
        crate::job::check_for_provider(job, self.list[usize::from(slot)].kind)?;
        job.provider_slot = slot;
        Ok(())
    }

    /// The provider at `slot`. An app slot the scheduler has not filled yet is a closed
    /// one: never the default, which holds another app's credentials.
    #[inline]
    pub fn get(&self, slot: u16) -> &Provider {
        static CLOSED: std::sync::OnceLock<Provider> = std::sync::OnceLock::new();
        self.list.get(usize::from(slot)).unwrap_or_else(|| {
            CLOSED.get_or_init(|| Provider::closed(Arc::from("app/unknown"), ProviderKind::Null))
        })
    }

    /// Sends `job.devices[device_index]` through the job's provider.
    #[inline]
    pub fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        self.get(job.provider_slot).sender.send(job, device_index)
    }

    pub fn len(&self) -> usize {
        self.list.len()
    }

    pub fn is_empty(&self) -> bool {
        self.list.is_empty()
    }

    pub fn iter(&self) -> impl Iterator<Item = &Provider> {
        self.list.iter()
    }

    pub fn default_slot(&self) -> u16 {
        self.default
    }

    fn names(&self) -> impl Iterator<Item = &str> {
        self.list.iter().map(|p| &*p.name)
    }
}

/// Counts each provider answer as `provider_answers_total{provider, class,
/// reason}`. The delivered counter is registered once, so a delivered send costs one
/// atomic add; the others are rare and looked up by label.
#[derive(Clone)]
pub struct AnswerMetrics {
    provider: Arc<str>,
    delivered: metrics::Counter,
}

impl AnswerMetrics {
    pub fn new(provider: &Arc<str>) -> Self {
        let delivered = metrics::counter!(
            "provider_answers_total",
            "provider" => provider.to_string(),
            "class" => "delivered",
            "reason" => "ok"
        );
        Self {
            provider: Arc::clone(provider),
            delivered,
        }
    }

    /// Counts `outcome`; `reason` is the provider's reason code from a known list
    /// (`"other"` for one it did not know), so that the label set stays bounded.
    pub fn record(&self, outcome: &SendOutcome, reason: &'static str) {
        if outcome.is_delivered() {
            self.delivered.increment(1);
            return;
        }
        metrics::counter!(
            "provider_answers_total",
            "provider" => self.provider.to_string(),
            "class" => outcome.class(),
            "reason" => reason
        )
        .increment(1);
    }
}

impl From<AnySender> for Providers {
    /// One default provider named "webhook" (or "null" for the null sender).
    fn from(sender: AnySender) -> Self {
        let kind = match &sender {
            AnySender::Null(_) => ProviderKind::Null,
            _ => ProviderKind::Webhook,
        };
        Providers::single(kind.as_str(), kind, sender)
    }
}

impl From<AnySender> for Arc<Providers> {
    fn from(sender: AnySender) -> Self {
        Arc::new(Providers::from(sender))
    }
}

/// The dyn form adapters take in [`AnySender::Provider`].
pub type DynSender = Arc<dyn Sender>;
