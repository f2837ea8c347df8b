//! The HTTP provider sender: one POST per device. The transport follows the URL:
//! - `http://`: keep-alive HTTP/1.1 connections on hyper's connection API
//!   ([`super::http1`]), or reqwest's pool with [`Http1Client::Reqwest`];
//! - `http://` with `http2_prior_knowledge`: a few multiplexed h2c connections
//!   ([`super::h2c`]);
//! - `https://`: reqwest (rustls), HTTP/2 when TLS negotiates it, else HTTP/1.1.

use super::h2c::H2cPool;
use super::http1::Http1Pool;
use super::wire::{PushHeaders, Snippet, SENT_AT, USER_AGENT};
use super::Signal;
use super::{no_such_device, SendFuture, SendOutcome, Sender, SenderError};
use crate::job::{write_json_str, Job};
use reqwest::header::{HeaderValue, CONTENT_TYPE};
use std::sync::Arc;
use std::time::Duration;

/// Longest reason text built from a transport error chain.
const MAX_REASON_CHARS: usize = 300;

/// Settings of an [`HttpSender`].
#[derive(Debug, Clone, PartialEq)]
pub struct HttpSenderConfig {
    /// The provider endpoint, `http://` or `https://`.
    pub url: String,
    /// Bound on a whole request: connect, send, response and body.
    pub timeout: Duration,
    /// Bound on establishing a connection.
    pub connect_timeout: Duration,
    /// Idle pooled connections are closed after this long.
    pub pool_idle_timeout: Duration,
    /// Idle connections kept per host (the scheduler bounds the busy ones by `max_in_flight`).
    pub pool_max_idle_per_host: usize,
    /// Speak HTTP/2 without negotiation (h2c to a plain-text endpoint). Over TLS, HTTP/2
    /// is used whenever the server offers it, without this.
    pub http2_prior_knowledge: bool,
    /// Connections for h2c (`http2_prior_knowledge` on an `http://` URL); each carries
    /// many sends at once.
    pub http2_connections: usize,
    /// The client for HTTP/1.1 to an `http://` URL.
    pub http1_client: Http1Client,
    /// Certificates (PEM) trusted besides the webpki roots, for an `https://` URL
    /// (`ca_file`: a private CA); refused with an `http://` one, which has no TLS.
    pub ca_pem: Option<Vec<u8>>,
}

/// Which client speaks HTTP/1.1 to a plain-text (`http://`) provider.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Http1Client {
    /// hyper's connection API with a lock-free pool of our own (the lean one).
    #[default]
    Hyper,
    /// reqwest's pool, as used for `https://`.
    Reqwest,
}

impl HttpSenderConfig {
    /// Defaults: 5 s timeout, 2 s connect timeout, 90 s idle, 1024 idle connections, HTTP/1.1 or ALPN.
    pub fn new(url: impl Into<String>) -> Self {
        Self {
            url: url.into(),
            timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            pool_idle_timeout: Duration::from_secs(90),
            pool_max_idle_per_host: 1024,
            http2_prior_knowledge: false,
            http2_connections: super::h2c::DEFAULT_CONNECTIONS,
            http1_client: Http1Client::Hyper,
            ca_pem: None,
        }
    }
}

/// POSTs `{"campaign_id":…,"job_id":…,"device_token":…,"payload":…}` with an
/// `Idempotency-Key: <job_id>:<device index>` header. Cheap to clone: clones share the pool.
#[derive(Clone)]
pub struct HttpSender {
    transport: Transport,
    url: Arc<reqwest::Url>,
    timeout: Duration,
}

#[derive(Clone)]
enum Transport {
    Reqwest(reqwest::Client),
    Http1(Arc<Http1Pool>),
    H2c(Arc<H2cPool>),
}

impl Transport {
    fn name(&self) -> &'static str {
        match self {
            Transport::Reqwest(_) => "reqwest",
            Transport::Http1(_) => "http1",
            Transport::H2c(_) => "h2c",
        }
    }
}

impl std::fmt::Debug for HttpSender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The URL may carry credentials: show where it goes, not who it is.
        f.debug_struct("HttpSender")
            .field("scheme", &self.url.scheme())
            .field("host", &self.url.host_str())
            .field("port", &self.url.port_or_known_default())
            .field("path", &self.url.path())
            .field("timeout", &self.timeout)
            .field("transport", &self.transport.name())
            .finish()
    }
}

impl HttpSender {
    pub fn new(config: &HttpSenderConfig) -> Result<Self, SenderError> {
        let invalid = |reason: &str| SenderError::InvalidUrl {
            url: crate::redact::url(&config.url),
            reason: reason.to_string(),
        };
        let url = reqwest::Url::parse(&config.url).map_err(|e| invalid(&e.to_string()))?;
        if !matches!(url.scheme(), "http" | "https") {
            return Err(invalid("the scheme must be http or https"));
        }
        if url.host_str().is_none() {
            return Err(invalid("the url has no host"));
        }
        // Only reqwest sends a URL's user and password (as basic auth).
        let credentials = !url.username().is_empty() || url.password().is_some();
        let plain = url.scheme() == "http";
        if plain && config.ca_pem.is_some() {
            return Err(invalid(
                "ca_file is for an https url; an http url has no TLS to trust it with",
            ));
        }
        if plain && config.http2_prior_knowledge && credentials {
            return Err(invalid(
                "h2c does not send credentials from the url; remove them or use http/1.1",
            ));
        }
        let lean_http1 = config.http1_client == Http1Client::Hyper && !credentials;
        if plain && (config.http2_prior_knowledge || lean_http1) {
            let uri: http::Uri = url
                .as_str()
                .parse()
                .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
            let transport = if config.http2_prior_knowledge {
                let pool = H2cPool::new(uri, config.connect_timeout, config.http2_connections);
                Transport::H2c(Arc::new(
                    pool.ok_or_else(|| invalid("the url has no host"))?,
                ))
            } else {
                let pool = Http1Pool::new(
                    &uri,
                    config.connect_timeout,
                    config.pool_idle_timeout,
                    config.pool_max_idle_per_host,
                );
                Transport::Http1(Arc::new(
                    pool.ok_or_else(|| invalid("the url has no host"))?,
                ))
            };
            return Ok(Self {
                transport,
                url: Arc::new(url),
                timeout: config.timeout,
            });
        }
        let mut builder = reqwest::Client::builder()
            .timeout(config.timeout)
            .connect_timeout(config.connect_timeout)
            .pool_idle_timeout(config.pool_idle_timeout)
            .pool_max_idle_per_host(config.pool_max_idle_per_host)
            .tcp_nodelay(true)
            // A redirect is a configuration problem, not something to follow per device.
            .redirect(reqwest::redirect::Policy::none())
            .no_proxy()
            .user_agent(USER_AGENT);
        if config.http2_prior_knowledge {
            builder = builder.http2_prior_knowledge();
        }
        if let Some(pem) = &config.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| SenderError::Client(format!("ca_file: {e}")))?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder
            .build()
            .map_err(|e| SenderError::Client(e.without_url().to_string()))?;
        Ok(Self {
            transport: Transport::Reqwest(client),
            url: Arc::new(url),
            timeout: config.timeout,
        })
    }

    /// Open h2c connections (`None` for the other transports).
    pub fn h2c_connections(&self) -> Option<usize> {
        match &self.transport {
            Transport::H2c(pool) => Some(pool.open_connections()),
            _ => None,
        }
    }

    /// HTTP/1.1 connections waiting between sends (`None` unless the hyper transport).
    pub fn idle_http1_connections(&self) -> Option<usize> {
        match &self.transport {
            Transport::Http1(pool) => Some(pool.idle_connections()),
            _ => None,
        }
    }

    /// `"http1"`, `"h2c"` or `"reqwest"`.
    pub fn transport(&self) -> &'static str {
        self.transport.name()
    }
}

impl Sender for HttpSender {
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        let Some(token) = job.devices.get(device_index) else {
            return SendFuture::ready(no_such_device(job, device_index));
        };
        let mut body = Vec::with_capacity(push_body_len(job, token));
        push_body(job, token, &mut body);
        let key = match HeaderValue::try_from(format!("{}:{device_index}", job.job_id)) {
            Ok(v) => v,
            Err(_) => {
                return SendFuture::ready(SendOutcome::Rejected {
                    status: None,
                    reason: "job_id cannot be sent in an Idempotency-Key header".into(),
                })
            }
        };
        let headers = PushHeaders {
            key,
            sent_at: HeaderValue::from(unix_micros()),
        };
        let timeout = self.timeout;
        let client = match &self.transport {
            Transport::Reqwest(client) => client,
            Transport::Http1(pool) => {
                let exchange = Arc::clone(pool).exchange(body.into(), headers);
                return SendFuture::boxed(bounded(timeout, exchange));
            }
            Transport::H2c(pool) => {
                let exchange = Arc::clone(pool).exchange(body.into(), headers);
                return SendFuture::boxed(bounded(timeout, exchange));
            }
        };
        let request = client
            .post((*self.url).clone())
            .header(CONTENT_TYPE, HeaderValue::from_static("application/json"))
            .header("idempotency-key", headers.key)
            .header(SENT_AT, headers.sent_at)
            .body(body);
        SendFuture::boxed(async move {
            match request.send().await {
                Ok(response) => classify_response(response).await,
                Err(e) => classify_error(e, timeout),
            }
        })
    }

    fn name(&self) -> &'static str {
        "http"
    }
}

fn push_body_len(job: &Job, token: &str) -> usize {
    // Field names and punctuation, plus room for a few escapes.
    64 + job.campaign_id.len() + job.job_id.len() + token.len() + job.payload.get().len()
}

/// Writes the provider request body for one device into `out`. Strings are escaped by
/// serde_json; the payload's raw JSON is copied byte for byte.
pub fn push_body(job: &Job, device_token: &str, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"campaign_id\":");
    write_json_str(out, &job.campaign_id);
    out.extend_from_slice(b",\"job_id\":");
    write_json_str(out, &job.job_id);
    out.extend_from_slice(b",\"device_token\":");
    write_json_str(out, device_token);
    out.extend_from_slice(b",\"payload\":");
    out.extend_from_slice(job.payload.get().as_bytes());
    out.push(b'}');
}

async fn classify_response(mut response: reqwest::Response) -> SendOutcome {
    let status = response.status();
    if status.is_success() {
        // Read the body to its end so the connection goes back to the pool. The provider
        // has already accepted the notification, so a failure here changes nothing.
        while let Ok(Some(_)) = response.chunk().await {}
        return SendOutcome::Delivered;
    }
    let mut snippet = Snippet::default();
    while let Ok(Some(chunk)) = response.chunk().await {
        snippet.push(&chunk);
        if snippet.is_full() {
            break;
        }
    }
    snippet.outcome(status.as_u16(), response.headers())
}
fn unix_micros() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}
/// Bounds a whole exchange by `timeout`; running out is a retry, like any timeout.
async fn bounded(
    timeout: Duration,
    exchange: impl std::future::Future<Output = SendOutcome>,
) -> SendOutcome {
    match tokio::time::timeout(timeout, exchange).await {
        Ok(outcome) => outcome,
        Err(_) => SendOutcome::RetryProvider {
            after: None,
            reason: format!("timeout after {} ms", timeout.as_millis()),
            signal: Some(Signal::Timeout),
        },
    }
}
fn classify_error(e: reqwest::Error, timeout: Duration) -> SendOutcome {
    if e.is_timeout() {
        return SendOutcome::RetryProvider {
            after: None,
            reason: format!("timeout after {} ms", timeout.as_millis()),
            signal: Some(Signal::Timeout),
        };
    }
    if e.is_builder() {
        return SendOutcome::Rejected {
            status: None,
            reason: format!("request cannot be built: {}", error_chain(e)),
        };
    }
    SendOutcome::RetryProvider {
        after: None,
        reason: format!("connection error: {}", error_chain(e)),
        signal: Some(Signal::Connection),
    }
}

/// The error and its causes on one line, without the URL (it may hold credentials).
fn error_chain(e: reqwest::Error) -> String {
    use std::error::Error as _;
    let e = e.without_url();
    let mut text = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            text.push_str(": ");
            text.push_str(&cause_text);
        }
        source = cause.source();
    }
    if let Some((cut, _)) = text.char_indices().nth(MAX_REASON_CHARS) {
        text.truncate(cut);
        text.push('…');
    }
    text
}
