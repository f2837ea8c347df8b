//! APNs (Apple Push Notification service) over its HTTP/2 provider API, with token
//! (JWT) authentication.
//!
//! One send is `POST /3/device/<token>` on one of the provider's long-lived HTTP/2
//! connections ([`H2Pool`], one stream per connection until a request succeeds, as
//! Apple requires). The provider token is signed once and shared ([`jwt`]); the answer
//! is mapped to a [`SendOutcome`] by [`answer`]. The adapter's one resend of its own is
//! after `403 ExpiredProviderToken`: it re-signs once and sends that request again.

pub mod answer;
pub mod jwt;
pub mod request;
mod shared;

use crate::job::Job;
use crate::provider::h2pool::{H2Pool, PoolConfig};
use crate::provider::settings::ApnsSpec;
use crate::provider::{tls, AnswerMetrics, ProviderError};
use crate::sender::{SendFuture, SendOutcome, Sender};
use bytes::Bytes;
use jwt::{Clock, TokenSigner};
use request::Topics;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Bound on opening one connection (TCP + TLS + HTTP/2 preface).
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// PING an idle connection this often, so that it is kept for hours.
const IDLE_PING: Duration = Duration::from_secs(60);

/// The APNs adapter: register it as `AnySender::Provider(Arc::new(sender))`.
#[derive(Clone)]
pub struct ApnsSender {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    pool: Arc<H2Pool>,
    signer: Arc<TokenSigner>,
    topics: Topics,
    metrics: AnswerMetrics,
}

impl std::fmt::Debug for ApnsSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApnsSender")
            .field("name", &self.inner.name)
            .field("signer", &self.inner.signer)
            .finish_non_exhaustive()
    }
}

impl ApnsSender {
    /// Reads the key, signs the first token and sets up the connection pool (which
    /// connects on first use). Call inside a tokio runtime.
    pub fn new(spec: &ApnsSpec) -> Result<Self, ProviderError> {
        Self::build(spec, shared::signer(spec)?)
    }

    /// [`ApnsSender::new`] with the token signer reading `clock` (tests run time
    /// forward with it).
    pub fn with_clock(spec: &ApnsSpec, clock: Clock) -> Result<Self, ProviderError> {
        Self::build(spec, Arc::new(signer(spec, clock)?))
    }

    fn build(spec: &ApnsSpec, signer: Arc<TokenSigner>) -> Result<Self, ProviderError> {
        let name: Arc<str> = Arc::from(spec.name.as_str());
        let config = |problem: String| ProviderError::Config {
            provider: spec.name.clone(),
            problem,
        };
        let topics = Topics::new(&spec.topic).map_err(config)?;
        let endpoint: http::Uri = spec
            .endpoint
            .parse()
            .map_err(|e| config(format!("endpoint {:?}: {e}", spec.endpoint)))?;
        let tls = tls::client_config(spec.common.ca_pem.as_deref()).map_err(|problem| {
            ProviderError::Tls {
                provider: spec.name.clone(),
                problem,
            }
        })?;
        let pool = H2Pool::new(PoolConfig {
            name: Arc::clone(&name),
            endpoint,
            tls,
            connections: spec.connections.max(1),
            connect_timeout: CONNECT_TIMEOUT,
            timeout: spec.common.timeout,
            one_stream_until_ok: true,
            idle_ping: IDLE_PING,
            idle_close: spec.common.app.as_ref().map(|a| a.idle_close),
            budget: spec.common.app.as_ref().map(|a| a.budget.clone()),
        })
        .map_err(config)?;
        let metrics = AnswerMetrics::new(&name);
        Ok(Self {
            inner: Arc::new(Inner {
                name,
                pool,
                signer,
                topics,
                metrics,
            }),
        })
    }

    /// The connection pool (its counters, for tests and stats).
    pub fn pool(&self) -> &Arc<H2Pool> {
        &self.inner.pool
    }
}

impl Sender for ApnsSender {
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        let Some(token) = job.devices.get(device_index) else {
            return SendFuture::ready(SendOutcome::Rejected {
                status: None,
                reason: format!(
                    "device index {device_index} is out of range: job {} has {} devices",
                    job.job_id,
                    job.devices.len()
                ),
            });
        };
        if let Some(reason) = request::check_token(token) {
            let outcome = SendOutcome::Rejected {
                status: None,
                reason,
            };
            self.inner.metrics.record(&outcome, "BadDeviceToken");
            return SendFuture::ready(outcome);
        }
        let inner = Arc::clone(&self.inner);
        let job = Arc::clone(job);
        SendFuture::boxed(async move { inner.deliver(job, device_index).await })
    }

    fn name(&self) -> &'static str {
        "apns"
    }
}

/// The job's payload as the request body without copying it.
struct Payload(Arc<Job>);

impl AsRef<[u8]> for Payload {
    fn as_ref(&self) -> &[u8] {
        self.0.payload.get().as_bytes()
    }
}

impl Inner {
    /// Sends one device's notification; after `ExpiredProviderToken`, re-signs once and
    /// sends it again.
    async fn deliver(&self, job: Arc<Job>, device_index: usize) -> SendOutcome {
        let token = job.devices.get(device_index).map_or("", String::as_str);
        let body = Bytes::from_owner(Payload(Arc::clone(&job)));
        let mut auth = self.signer.current();
        let mut resigned = false;
        loop {
            let now = self.signer.now();
            let req = match request::build(&job, token, &auth.header, &self.topics, now) {
                Ok(req) => req,
                Err(outcome) => {
                    self.metrics.record(&outcome, "BadCollapseId");
                    return outcome;
                }
            };
            let answer = match self.pool.send(req, body.clone()).await {
                Ok(answer) => answer,
                Err(e) => {
                    let outcome = e.into_outcome();
                    self.metrics.record(&outcome, "transport");
                    return outcome;
                }
            };
            let (outcome, code) = answer::classify(
                answer.status,
                &answer.headers,
                &answer.body,
                SystemTime::now(),
            );
            if code == answer::EXPIRED_PROVIDER_TOKEN && !resigned {
                if let Some(next) = self.signer.on_expired(auth.generation) {
                    tracing::info!(
                        provider = %self.name,
                        "APNs answered ExpiredProviderToken: token re-signed, request sent again"
                    );
                    // Counted as what it is: a provider-level retry.
                    let retry = SendOutcome::RetryProvider {
                        after: None,
                        reason: String::new(),
                        signal: None,
                    };
                    self.metrics.record(&retry, code);
                    auth = next;
                    resigned = true;
                    continue;
                }
            }
            self.metrics.record(&outcome, code);
            return outcome;
        }
    }
}

fn signer(spec: &ApnsSpec, clock: Clock) -> Result<TokenSigner, ProviderError> {
    TokenSigner::new(
        &spec.name,
        &spec.team_id,
        &spec.key_id,
        &spec.key_pem,
        spec.token_refresh,
        clock,
    )
}

/// `pushpace providers check`: signs a token and opens one TLS connection with ALPN h2
/// to the endpoint, with the HTTP/2 preface; sends no notification.
pub async fn check(spec: &ApnsSpec) -> Result<String, ProviderError> {
    let signer = signer(spec, Clock::system())?;
    let tls_problem = |problem: String| ProviderError::Tls {
        provider: spec.name.clone(),
        problem,
    };
    let endpoint: http::Uri = spec.endpoint.parse().map_err(|e| ProviderError::Config {
        provider: spec.name.clone(),
        problem: format!("endpoint {:?}: {e}", spec.endpoint),
    })?;
    let host = endpoint
        .host()
        .unwrap_or("")
        .trim_matches(['[', ']'])
        .to_string();
    let port = endpoint.port_u16().unwrap_or(443);
    let config = tls::client_config(spec.common.ca_pem.as_deref()).map_err(tls_problem)?;
    let timeout = spec.common.timeout.max(CONNECT_TIMEOUT);
    let connected = tokio::time::timeout(timeout, handshake(config, &host, port)).await;
    match connected {
        Ok(result) => result.map_err(tls_problem)?,
        Err(_) => {
            return Err(tls_problem(format!(
                "{host}:{port}: no answer in {timeout:?}"
            )))
        }
    }
    Ok(format!(
        "signed an ES256 JWT for team {} key {}; TLS + h2 to {host}:{port} ok",
        signer.team_id(),
        signer.key_id()
    ))
}

/// TCP, TLS (the server must pick ALPN h2) and the HTTP/2 client preface.
async fn handshake(config: Arc<rustls::ClientConfig>, host: &str, port: u16) -> Result<(), String> {
    let name = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| format!("{host:?} is no server name: {e}"))?;
    let tcp = tokio::net::TcpStream::connect((host, port))
        .await
        .map_err(|e| format!("{host}:{port}: {e}"))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| format!("{host}:{port}: {e}"))?;
    if tls.get_ref().1.alpn_protocol() != Some(tls::ALPN_H2) {
        return Err(format!("{host}:{port} did not agree to HTTP/2 (ALPN h2)"));
    }
    let (send, mut connection) = h2::client::handshake(tls)
        .await
        .map_err(|e| format!("{host}:{port}: HTTP/2: {e}"))?;
    let mut ping = connection
        .ping_pong()
        .ok_or_else(|| "HTTP/2 PING unavailable".to_string())?;
    let driver = tokio::spawn(async move {
        let _ = connection.await;
    });
    // A PONG proves the server speaks HTTP/2 (it answered after its SETTINGS).
    let pong = ping.ping(h2::Ping::opaque()).await;
    driver.abort();
    drop(send);
    pong.map(drop)
        .map_err(|e| format!("{host}:{port}: HTTP/2 PING: {e}"))
}
