//! `[sender]`: the shared send settings (retries, in-flight bound) and the implicit
//! provider named `webhook` it has always defined (`kind = "http"` → a webhook,
//! `kind = "null"` → sends nothing), plus `default_provider`.

use super::{by_name, redact_url};

use serde::Deserialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SenderKind {
    Http,
    Null,
}

/// `Debug` shows `url` through [`redact_url`]: it may carry a user and password.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SenderSettings {
    #[serde(deserialize_with = "by_name")]
    pub kind: SenderKind,
    pub url: String,
    pub timeout_ms: u64,
    pub max_in_flight: usize,
    pub max_attempts: u32,
    /// First retry delay; doubles per attempt (with full jitter) up to `retry_max_ms`.
    pub retry_base_ms: u64,
    pub retry_max_ms: u64,
    /// Transient failures are given up only after `max_attempts` and this long since
    /// the device's first failure.
    pub give_up_after_ms: u64,
    /// Speak HTTP/2 without negotiation (h2c) to a plain-text provider.
    pub http2_prior_knowledge: bool,
    /// h2c connections; each carries many sends at once.
    pub http2_connections: usize,
    /// The HTTP/1.1 client for an `http://` URL: `hyper` (lean) or `reqwest`.
    #[serde(deserialize_with = "by_name")]
    pub http1_client: crate::sender::Http1Client,
    /// The provider of jobs that name none: `webhook` (this section's own) or the name
    /// of a `[providers.<name>]` section.
    #[serde(default = "default_provider")]
    pub default_provider: String,
}

/// The name of the provider `[sender]` defines.
pub const IMPLICIT_PROVIDER: &str = "webhook";

fn default_provider() -> String {
    IMPLICIT_PROVIDER.to_string()
}

impl std::fmt::Debug for SenderSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SenderSettings")
            .field("kind", &self.kind)
            .field("url", &redact_url(&self.url))
            .field("timeout_ms", &self.timeout_ms)
            .field("max_in_flight", &self.max_in_flight)
            .field("max_attempts", &self.max_attempts)
            .field("retry_base_ms", &self.retry_base_ms)
            .field("retry_max_ms", &self.retry_max_ms)
            .field("give_up_after_ms", &self.give_up_after_ms)
            .field("http2_prior_knowledge", &self.http2_prior_knowledge)
            .field("http2_connections", &self.http2_connections)
            .field("http1_client", &self.http1_client)
            .field("default_provider", &self.default_provider)
            .finish()
    }
}
