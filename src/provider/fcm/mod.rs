//! FCM HTTP v1: `POST /v1/projects/<project_id>/messages:send` with an OAuth2 bearer
//! token, over [`H2Pool`] (TLS, ALPN h2, several long-lived connections).
//!
//! - [`account`]: the service account JSON.
//! - [`oauth`]: the access token, cached and refreshed in a background task (sends wait
//!   only for the very first token, or when the endpoint has been down past the token's
//!   expiry; an app's, after an idle hour, also for the token its next send asks for).
//! - [`body`]: `{"message":{"token":…, <the job's payload members>}}` in one buffer; the
//!   job's options become `android` fields unless the payload has its own `android`.
//! - [`answer`]: the answer's class (docs/PROVIDERS.md).
//!
//! A 401 UNAUTHENTICATED on our own token: the token is refreshed at once and the
//! message resent once; a second 401 halts the provider. Nothing else is retried here:
//! the scheduler retries, with a rate-limiter permit each.

pub mod account;
pub mod answer;
pub mod body;
mod check;
pub mod oauth;
mod use_gate;

pub use check::check;

use crate::job::Job;
use crate::provider::h2pool::{H2Pool, PoolConfig};
use crate::provider::settings::FcmSpec;
use crate::provider::{AnswerMetrics, ProviderError};
use crate::sender::{HaltScope, SendFuture, SendOutcome, Sender};
use account::ServiceAccount;
use answer::Verdict;
use bytes::Bytes;
use http::{HeaderValue, Method};
use oauth::{Bearer, Fetcher, TokenConfig, TokenSource};
use std::sync::Arc;
use std::time::Duration;

/// `content-type` of every send.
const JSON: HeaderValue = HeaderValue::from_static("application/json; charset=UTF-8");
/// PING an idle connection this often.
const IDLE_PING: Duration = Duration::from_secs(60);
/// Metrics reason codes of answers that are not FCM's own.
const TOKEN_UNAVAILABLE: &str = "token_unavailable";
const TRANSPORT: &str = "transport";

/// The FCM adapter (`name()` is `"fcm"`).
#[derive(Clone)]
pub struct FcmSender {
    inner: Arc<Inner>,
}

struct Inner {
    pool: Arc<H2Pool>,
    /// `/v1/projects/<id>/messages:send` (the pool fills scheme and authority).
    send_uri: http::Uri,
    tokens: TokenSource,
    metrics: AnswerMetrics,
}

impl std::fmt::Debug for FcmSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FcmSender")
            .field("send_uri", &self.inner.send_uri)
            .field("tokens", &self.inner.tokens)
            .finish_non_exhaustive()
    }
}

/// The token settings a spec gives.
pub(crate) fn token_config(spec: &FcmSpec) -> TokenConfig {
    TokenConfig {
        margin: spec.token_refresh_margin,
        request_timeout: spec.common.timeout,
        wait: spec.common.timeout,
        ca_pem: spec.common.ca_pem.clone(),
        refresh_if_used_within: spec.common.app.as_ref().map(|a| a.refresh_if_used_within),
    }
}

/// `https://host[:port]` of `messages:send`, checked.
pub(crate) fn endpoint_uri(spec: &FcmSpec) -> Result<http::Uri, ProviderError> {
    let uri: http::Uri = spec.endpoint.parse().map_err(|e| ProviderError::Config {
        provider: spec.name.clone(),
        problem: format!("endpoint {:?} is not a URL: {e}", spec.endpoint),
    })?;
    if uri.scheme_str() != Some("https") || uri.host().is_none() {
        return Err(ProviderError::Config {
            provider: spec.name.clone(),
            problem: format!("endpoint {:?} is not https://host[:port]", spec.endpoint),
        });
    }
    Ok(uri)
}

impl FcmSender {
    /// Parses the service account, opens the pool and starts the token refresher (so it
    /// must be called inside a tokio runtime).
    pub fn new(spec: &FcmSpec) -> Result<Self, ProviderError> {
        if tokio::runtime::Handle::try_current().is_err() {
            return Err(ProviderError::Config {
                provider: spec.name.clone(),
                problem: "the FCM sender must be built inside the tokio runtime".into(),
            });
        }
        let account = Arc::new(ServiceAccount::parse(&spec.service_account, &spec.name)?);
        let send_uri: http::Uri = format!("/v1/projects/{}/messages:send", account.project_id)
            .parse()
            .map_err(|e| ProviderError::Config {
                provider: spec.name.clone(),
                problem: format!("project_id makes no valid path: {e}"),
            })?;
        let cfg = token_config(spec);
        let fetcher = Fetcher::new(&spec.name, account, &cfg)?;
        let tls = |problem: String| ProviderError::Tls {
            provider: spec.name.clone(),
            problem,
        };
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let pool = H2Pool::new(PoolConfig {
            name: Arc::clone(&name),
            endpoint: endpoint_uri(spec)?,
            tls: crate::provider::tls::client_config(spec.common.ca_pem.as_deref()).map_err(tls)?,
            connections: spec.connections.max(1),
            connect_timeout: spec.common.timeout,
            timeout: spec.common.timeout,
            one_stream_until_ok: false,
            idle_ping: IDLE_PING,
            idle_close: spec.common.app.as_ref().map(|a| a.idle_close),
            budget: spec.common.app.as_ref().map(|a| a.budget.clone()),
        })
        .map_err(|problem| ProviderError::Config {
            provider: spec.name.clone(),
            problem,
        })?;
        let tokens = TokenSource::start(&spec.name, fetcher, &cfg);
        Ok(Self {
            inner: Arc::new(Inner {
                pool,
                send_uri,
                tokens,
                metrics: AnswerMetrics::new(&name),
            }),
        })
    }

    /// Access tokens received so far (for tests and `providers check`).
    pub fn tokens_granted(&self) -> u64 {
        self.inner.tokens.generation()
    }
}

impl Sender for FcmSender {
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        let Some(device) = job.devices.get(device_index) else {
            let outcome = SendOutcome::Rejected {
                status: None,
                reason: format!(
                    "device index {device_index} is out of range: job {} has {} devices",
                    job.job_id,
                    job.devices.len()
                ),
            };
            return SendFuture::ready(outcome);
        };
        let priority = job.push_priority();
        let body = match body::build(device, &job.payload, &job.options, priority, now_unix()) {
            Ok(body) => body,
            Err(e) => {
                let outcome = SendOutcome::Halt {
                    scope: HaltScope::Campaign,
                    reason: e.to_string(),
                };
                self.inner.metrics.record(&outcome, "payload");
                return SendFuture::ready(outcome);
            }
        };
        let inner = Arc::clone(&self.inner);
        SendFuture::boxed(async move { inner.deliver(body).await })
    }

    fn name(&self) -> &'static str {
        "fcm"
    }
}

impl Inner {
    async fn deliver(&self, body: Bytes) -> SendOutcome {
        let (outcome, code) = self.exchange(body).await;
        self.metrics.record(&outcome, code);
        outcome
    }

    async fn exchange(&self, body: Bytes) -> (SendOutcome, &'static str) {
        let bearer = match self.tokens.bearer().await {
            Ok(b) => b,
            Err(e) => return (e.to_outcome(), TOKEN_UNAVAILABLE),
        };
        // Bytes clones share the buffer: the resend costs no copy.
        match self.post(&bearer, body.clone()).await {
            Ok(Verdict::Done(outcome, code)) => return (outcome, code),
            Err(outcome) => return (outcome, TRANSPORT),
            Ok(Verdict::Unauthenticated(_)) => {}
        }
        let fresh = match self.tokens.refresh_after(&bearer).await {
            Ok(b) => b,
            Err(e) => return (e.to_outcome(), TOKEN_UNAVAILABLE),
        };
        match self.post(&fresh, body).await {
            Ok(Verdict::Done(outcome, code)) => (outcome, code),
            Err(outcome) => (outcome, TRANSPORT),
            Ok(Verdict::Unauthenticated(reason)) => (
                SendOutcome::Halt {
                    scope: HaltScope::Provider,
                    reason: format!("{reason} (again with a fresh access token)"),
                },
                "UNAUTHENTICATED",
            ),
        }
    }

    async fn post(&self, bearer: &Bearer, body: Bytes) -> Result<Verdict, SendOutcome> {
        let request = http::Request::builder()
            .method(Method::POST)
            .uri(self.send_uri.clone())
            .header(http::header::AUTHORIZATION, bearer.header.clone())
            .header(http::header::CONTENT_TYPE, JSON)
            .body(())
            .map_err(|e| SendOutcome::Rejected {
                status: None,
                reason: format!("cannot build the FCM request: {e}"),
            })?;
        let answer = self
            .pool
            .send(request, body)
            .await
            .map_err(|e| e.into_outcome())?;
        Ok(answer::classify(
            answer.status,
            &answer.headers,
            &answer.body,
        ))
    }
}

fn now_unix() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}
