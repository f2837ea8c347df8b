//! Provider settings: the `[providers.<name>]` sections of the configuration, checked
//! into one typed spec per kind. Key files are read here, once, at start; secrets are
//! [`SecretString`]s and never printed.

use crate::limiter::Rate;
use secrecy::SecretString;
use std::path::PathBuf;
use std::time::Duration;

/// Settings every kind has.
#[derive(Clone)]
pub struct CommonSpec {
    /// Extra trusted roots (PEM) besides the webpki roots: tests and private gateways.
    pub ca_pem: Option<Vec<u8>>,
    /// The file it came from, for messages.
    pub ca_file: Option<PathBuf>,
    /// A cap on all campaigns using this provider.
    pub max_rate: Option<Rate>,
    /// Bound on one whole exchange.
    pub timeout: Duration,
    /// Sends in flight through this provider, at most.
    pub max_in_flight: usize,
}

/// APNs environment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApnsEnvironment {
    Production,
    Sandbox,
}

impl ApnsEnvironment {
    /// The provider API's endpoint for this environment.
    pub fn endpoint(self) -> &'static str {
        match self {
            ApnsEnvironment::Production => "https://api.push.apple.com",
            ApnsEnvironment::Sandbox => "https://api.sandbox.push.apple.com",
        }
    }
}

/// `kind = "apns"`.
#[derive(Clone)]
pub struct ApnsSpec {
    pub name: String,
    /// 10-character team id (the JWT's `iss`).
    pub team_id: String,
    /// 10-character key id (the JWT header's `kid`).
    pub key_id: String,
    /// The `.p8` file's PEM text (a PKCS#8 P-256 key).
    pub key_pem: SecretString,
    /// The app's bundle id (`apns-topic`).
    pub topic: String,
    pub environment: ApnsEnvironment,
    /// `https://host[:port]`, from the environment unless overridden.
    pub endpoint: String,
    /// HTTP/2 connections to keep open.
    pub connections: usize,
    /// Re-sign the JWT after this long (Apple: at most 60 min, at least 20 min apart).
    pub token_refresh: Duration,
    pub common: CommonSpec,
}

/// `kind = "fcm"`.
#[derive(Clone)]
pub struct FcmSpec {
    pub name: String,
    /// The service account JSON (`client_email`, `private_key`, `token_uri`, `project_id`).
    pub service_account: SecretString,
    /// `https://host[:port]` of `messages:send` (default `https://fcm.googleapis.com`).
    pub endpoint: String,
    pub connections: usize,
    /// Refresh the access token this long before it expires (default 5 minutes).
    pub token_refresh_margin: Duration,
    pub common: CommonSpec,
}

/// `kind = "webpush"`.
#[derive(Clone)]
pub struct WebPushSpec {
    pub name: String,
    /// The VAPID key's PEM text (a P-256 key, PKCS#8 or SEC1).
    pub vapid_key_pem: SecretString,
    /// `mailto:` or `https:` contact (the JWT's `sub`).
    pub vapid_subject: String,
    /// VAPID JWT lifetime (at most 24 h).
    pub vapid_lifetime: Duration,
    pub common: CommonSpec,
}
