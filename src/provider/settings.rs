//! Provider settings: the `[providers.<name>]` sections of the configuration, checked
//! into one typed spec per kind (by `crate::config::providers`, which reads the key
//! files once, at start). Secrets are [`SecretString`]s, and every `Debug` here is
//! written by hand so that none is ever printed (`pushpace config` prints `Debug`).

use super::ceiling::CeilingParams;
use super::h2pool::ConnectionBudget;
use super::ProviderKind;
use crate::limiter::Rate;
use secrecy::SecretString;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// What `Debug` shows in place of a secret.
const HIDDEN: &str = "[hidden]";

/// One configured provider: its name (what jobs give as `"provider"`) and its spec.
#[derive(Debug, Clone)]
pub struct NamedProvider {
    pub name: String,
    pub spec: ProviderSpec,
}

/// A provider's checked settings, by kind.
#[derive(Debug, Clone)]
pub enum ProviderSpec {
    Apns(ApnsSpec),
    Fcm(FcmSpec),
    WebPush(WebPushSpec),
    Webhook(WebhookSpec),
    /// Sends nothing (`[sender] kind = "null"`: benchmarks).
    Null,
}

impl ProviderSpec {
    pub fn kind(&self) -> ProviderKind {
        match self {
            ProviderSpec::Apns(_) => ProviderKind::Apns,
            ProviderSpec::Fcm(_) => ProviderKind::Fcm,
            ProviderSpec::WebPush(_) => ProviderKind::WebPush,
            ProviderSpec::Webhook(_) => ProviderKind::Webhook,
            ProviderSpec::Null => ProviderKind::Null,
        }
    }

    /// The settings every kind has (`None` for the null provider).
    pub fn common(&self) -> Option<&CommonSpec> {
        match self {
            ProviderSpec::Apns(s) => Some(&s.common),
            ProviderSpec::Fcm(s) => Some(&s.common),
            ProviderSpec::WebPush(s) => Some(&s.common),
            ProviderSpec::Webhook(s) => Some(&s.common),
            ProviderSpec::Null => None,
        }
    }
}

/// `kind = "webhook"` (and the implicit `webhook` of `[sender]`): the generic JSON POST
/// of [`crate::sender::HttpSender`].
#[derive(Clone)]
pub struct WebhookSpec {
    pub name: String,
    /// `http://` or `https://`; may hold a user and password (shown redacted).
    pub url: String,
    /// Speak HTTP/2 without negotiation (h2c) to a plain-text endpoint.
    pub http2_prior_knowledge: bool,
    /// h2c connections.
    pub http2_connections: usize,
    /// The HTTP/1.1 client for an `http://` URL.
    pub http1_client: crate::sender::Http1Client,
    pub common: CommonSpec,
}

impl fmt::Debug for WebhookSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebhookSpec")
            .field("name", &self.name)
            .field("url", &crate::redact::url(&self.url))
            .field("http2_prior_knowledge", &self.http2_prior_knowledge)
            .field("http2_connections", &self.http2_connections)
            .field("http1_client", &self.http1_client)
            .field("common", &self.common)
            .finish()
    }
}

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
    /// The adaptive ceiling's law (`None`: `adaptive = false`).
    pub adaptive: Option<CeilingParams>,
    /// An app's provider: what it shares with the worker's other apps. `None` for a
    /// `[providers.*]` provider, which keeps its connections and tokens as always.
    pub app: Option<AppPooling>,
}

/// How an app's provider holds its connections and tokens (`[apps]`, issue 55): many
/// apps are registered, few send at a time, so idle ones let go of what they hold.
#[derive(Clone, Debug)]
pub struct AppPooling {
    /// Close a connection that has had no stream for this long (`apps.idle_close_ms`).
    pub idle_close: Duration,
    /// The worker's open-connection budget, one for all app pools
    /// (`apps.max_open_connections`).
    pub budget: Arc<ConnectionBudget>,
    /// FCM: refresh the access token in the background only while the app sent within
    /// this long; after that, its next send fetches one.
    pub refresh_if_used_within: Duration,
}

impl CommonSpec {
    /// Trusts `ca_pem` besides the webpki roots, 10 s timeout, 100 in flight, no cap:
    /// a provider on a private gateway or a loopback mock.
    pub fn trusting(ca_pem: impl Into<Vec<u8>>) -> Self {
        Self {
            ca_pem: Some(ca_pem.into()),
            ca_file: None,
            max_rate: None,
            timeout: Duration::from_secs(10),
            max_in_flight: 100,
            adaptive: Some(CeilingParams::default()),
            app: None,
        }
    }
}

impl fmt::Debug for CommonSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CommonSpec")
            .field("ca_file", &self.ca_file)
            .field("ca_pem_bytes", &self.ca_pem.as_ref().map(Vec::len))
            .field("max_rate", &self.max_rate.map(|r| r.as_f64()))
            .field("timeout", &self.timeout)
            .field("max_in_flight", &self.max_in_flight)
            .field("adaptive", &self.adaptive)
            .field("app", &self.app)
            .finish()
    }
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

impl fmt::Debug for ApnsSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ApnsSpec")
            .field("name", &self.name)
            .field("team_id", &self.team_id)
            .field("key_id", &self.key_id)
            .field("key_pem", &HIDDEN)
            .field("topic", &self.topic)
            .field("environment", &self.environment)
            .field("endpoint", &self.endpoint)
            .field("connections", &self.connections)
            .field("token_refresh", &self.token_refresh)
            .field("common", &self.common)
            .finish()
    }
}

impl fmt::Debug for FcmSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FcmSpec")
            .field("name", &self.name)
            .field("service_account", &HIDDEN)
            .field("endpoint", &self.endpoint)
            .field("connections", &self.connections)
            .field("token_refresh_margin", &self.token_refresh_margin)
            .field("common", &self.common)
            .finish()
    }
}

impl fmt::Debug for WebPushSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WebPushSpec")
            .field("name", &self.name)
            .field("vapid_key_pem", &HIDDEN)
            .field("vapid_subject", &self.vapid_subject)
            .field("vapid_lifetime", &self.vapid_lifetime)
            .field("common", &self.common)
            .finish()
    }
}
