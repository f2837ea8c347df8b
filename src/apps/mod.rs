//! The app registry: customer apps, each with its own
//! credentials per provider kind, kept in PostgreSQL with the secrets sealed.
//!
//! - [`crypto`]: the master keys, the [`crypto::Keyring`] (current key and older ones)
//!   and AES-256-GCM sealing bound to the app and kind.
//! - [`model`]: the credentials of each kind, their checks (each refusal names its
//!   field) and their fingerprints; no `Debug` shows a secret.
//! - [`provider`]: opened credentials as a provider spec, for the adapters.
//! - [`watcher`]: the apps a worker's jobs name, opened and kept fresh through LISTEN
//!   (within a second of a change) with a fallback re-read.
//! - [`check`]: each kind's authentication round trip with the app's credentials.
//! - [`store`]: put, get, list, disable, enable, delete, the master-key rotation and
//!   opening a row for use (a row that does not open halts that app's kind).
//!
//! A job naming an `app_id` gets a provider slot of its own at intake
//! (`provider::app_slots`); the worker's app router builds that slot's provider from
//! what [`watcher`] opened, and the scheduler gates the slot while the app is not
//! ready. The triggers NOTIFY [`CHANNEL`], which [`watcher`] LISTENs on.

pub mod check;
pub mod crypto;
pub mod model;
mod parse;
pub mod provider;
pub mod store;
#[cfg(test)]
mod tests;
pub mod watcher;

pub use crypto::{CryptoError, Keyring, MasterKey};
pub use model::{AppInput, Credentials};
pub use parse::parse_app;

/// The NOTIFY channel the `apps` and `app_credentials` triggers publish on, with the
/// app id as payload (as `campaign_changed` does for campaigns).
pub const CHANNEL: &str = "app_changed";

/// The provider kinds an app can hold credentials for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum AppKind {
    Apns,
    Fcm,
    WebPush,
}

impl AppKind {
    pub const ALL: [AppKind; 3] = [AppKind::Apns, AppKind::Fcm, AppKind::WebPush];

    /// The name in the database, the API and the configuration.
    pub fn as_str(self) -> &'static str {
        match self {
            AppKind::Apns => "apns",
            AppKind::Fcm => "fcm",
            AppKind::WebPush => "webpush",
        }
    }

    pub fn parse(s: &str) -> Option<AppKind> {
        AppKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// The app kind of a provider kind (none for the webhook and null senders).
    pub fn of(kind: crate::provider::ProviderKind) -> Option<AppKind> {
        use crate::provider::ProviderKind as P;
        match kind {
            P::Apns => Some(AppKind::Apns),
            P::Fcm => Some(AppKind::Fcm),
            P::WebPush => Some(AppKind::WebPush),
            P::Webhook | P::Null => None,
        }
    }
}

impl std::fmt::Display for AppKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A value refused, with the field it belongs to (`apns.key`,
/// `fcm.service_account.private_key`…). The reason never quotes a secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {field}: {reason}")]
pub struct FieldError {
    pub field: String,
    pub reason: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, reason: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            reason: reason.into(),
        }
    }
}

/// Errors of the registry.
#[derive(Debug, thiserror::Error)]
pub enum AppsError {
    #[error(transparent)]
    Invalid(#[from] FieldError),
    #[error("app {0:?} not found")]
    NotFound(String),
    #[error("app {app:?} has no {kind} credentials")]
    NoCredentials { app: String, kind: AppKind },
    /// The operator disabled the kind: nothing opens it until `enable`.
    #[error("app {app:?} {kind} credentials are disabled")]
    Disabled { app: String, kind: AppKind },
    /// DELETE while campaigns still send through the app.
    #[error("app {app:?} still has {campaigns} campaign(s) sending through it; pass force=true to delete it anyway")]
    InUse { app: String, campaigns: i64 },
    /// No master key is configured, so nothing can be sealed or opened.
    #[error("no master key is configured: set apps.master_key_file or PUSHPACE__APPS__MASTER_KEY")]
    NoMasterKey,
    /// The row did not open or did not read back; the kind is now halted with this reason.
    #[error("app {app:?} {kind} credentials are halted: {reason}")]
    Halted {
        app: String,
        kind: AppKind,
        reason: String,
    },
    #[error("database error: {0}")]
    Database(#[from] sqlx::Error),
}
