//! The HTTP/2-over-TLS transport of the push providers: a few long-lived connections to
//! one endpoint, one stream per send.
//!
//! - Connections are made lazily, one per slot (`connections` slots), and kept for
//!   hours; sends go round-robin over the slots. Each connection's driver PINGs it when
//!   it has been idle for `idle_ping` and drops it when a PING goes unanswered within
//!   the send timeout. A new connection is used only after its first PING came back, so
//!   the server's SETTINGS (its stream limit) apply from the first stream; `h2` queues
//!   streams above the limit.
//! - `one_stream_until_ok` (APNs): until one request on a connection has answered 2xx,
//!   only one stream is in flight on it; then the SETTINGS limit applies.
//! - A connection that fails is forgotten by its slot (a generation per connection, so
//!   only the first failing stream forgets it). A slot whose connect fails backs off
//!   exponentially with jitter (100 ms doubling to 30 s); sends in the meantime fail at
//!   once instead of each trying to connect.
//! - A request the server did not process (above a GOAWAY's last stream id, refused
//!   with REFUSED_STREAM, or not sent at all) is resent on another connection, a few
//!   times at most; one that may have been processed is never resent here.
//!
//! - An app's pool (`idle_close`, `budget` set; issue 55): a connection that has had no
//!   stream for `idle_close` is closed (its slot lets go of it and h2 closes it with a
//!   GOAWAY once no send holds it; one with a stream in flight never is) instead of
//!   being kept by PINGs, and the next send reconnects. Each open first asks the
//!   worker's [`ConnectionBudget`], which at its cap closes the least recently used
//!   idle app pool's connections. A `[providers.*]` pool has neither.
//!
//! Everything a send does, resends included, is bounded by the send `timeout`.

mod budget;
mod connection;
mod counts;
mod slots;

pub use budget::ConnectionBudget;
pub use counts::TransportCounts;

use crate::provider::ceiling::Signal;
use crate::sender::SendOutcome;
use bytes::Bytes;
use http::header::CONTENT_LENGTH;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderMap, HeaderValue, Request, StatusCode, Uri};
use rustls::pki_types::ServerName;
use slots::Slot;
use std::sync::atomic::{
    AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The most answer body the pool keeps; a longer one is cut there (the status stands).
pub const MAX_ANSWER_BODY: usize = 64 * 1024;

/// Sends of a request that reached the server but that it did not process (the first
/// included).
const MAX_TRIES: u32 = 4;

/// Attempts in all, those that found their connection closing before the request left
/// included (each forgets that connection, so the next one is new).
const MAX_ATTEMPTS: u32 = 2 * MAX_TRIES;

/// What a pool connects to and how.
#[derive(Debug, Clone)]
pub struct PoolConfig {
    /// The provider's name, for errors and logs.
    pub name: Arc<str>,
    /// `https://host[:port]`; requests' paths are sent to it.
    pub endpoint: Uri,
    pub tls: Arc<rustls::ClientConfig>,
    /// Connections (slots) to keep.
    pub connections: usize,
    /// Bound on TCP connect, TLS and HTTP/2 handshakes together.
    pub connect_timeout: Duration,
    /// Bound on one send, resends and waiting for a stream included.
    pub timeout: Duration,
    /// One stream per connection until it answered a 2xx (APNs).
    pub one_stream_until_ok: bool,
    /// PING a connection idle this long.
    pub idle_ping: Duration,
    /// Close a connection with no stream for this long (`None`: keep it, PINGed).
    pub idle_close: Option<Duration>,
    /// The open-connection budget this pool shares (`None`: uncapped).
    pub budget: Option<Arc<ConnectionBudget>>,
}

/// A provider's answer. The body is at most [`MAX_ANSWER_BODY`] bytes, and may be cut
/// short (over that, or a stream reset after the status): the status is the answer.
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Bytes,
}

/// Why a send has no answer. Every case is a provider-side retry.
#[derive(Debug, thiserror::Error)]
pub enum TransportError {
    #[error("{pool}: connecting to {endpoint} failed: {reason}; next attempt in {retry_in_ms} ms")]
    Connect {
        pool: Arc<str>,
        endpoint: String,
        reason: String,
        retry_in_ms: u64,
    },
    #[error("{pool}: no answer within {ms} ms")]
    Timeout { pool: Arc<str>, ms: u128 },
    #[error("{pool}: connection failed after the request was sent: {reason}")]
    Lost { pool: Arc<str>, reason: String },
    #[error("{pool}: request not processed by the server ({tries} sent): {reason}")]
    NotProcessed {
        pool: Arc<str>,
        tries: u32,
        reason: String,
    },
}

impl TransportError {
    /// The scheduler's class: retry the provider later (after the connect backoff if
    /// that is what failed).
    pub fn into_outcome(self) -> SendOutcome {
        let after = match &self {
            TransportError::Connect { retry_in_ms, .. } => {
                Some(Duration::from_millis(*retry_in_ms))
            }
            _ => None,
        };
        let signal = match &self {
            TransportError::Timeout { .. } => Some(Signal::Timeout),
            _ => Some(Signal::Connection),
        };
        SendOutcome::RetryProvider {
            after,
            reason: self.to_string(),
            signal,
        }
    }
}

/// How one try on one connection failed.
enum Failure {
    /// The connection was closing before the request left.
    NotSent(String),
    /// The server did not process the request: it may be sent again.
    NotProcessed(String),
    /// The request may have been processed.
    Lost(String),
}

/// Long-lived HTTP/2 connections to one provider endpoint.
pub struct H2Pool {
    config: PoolConfig,
    authority: Authority,
    /// `host:port` to connect to.
    address: String,
    server_name: ServerName<'static>,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    generations: AtomicU64,
    connect_attempts: AtomicU64,
    pings_answered: AtomicU64,
    counters: counts::Counters,
    epoch: Instant,
    /// With a budget: this pool's member id and use (else unused).
    member: u64,
    usage: Usage,
}

/// What the budget reads of a pool: sends in flight and when one last started or ended
/// (the budget's clock). Kept only for a pool with a budget.
#[derive(Default)]
struct Usage {
    in_flight: AtomicUsize,
    last_used_us: AtomicU64,
}

/// One send's mark on its pool's [`Usage`], taken off however the send ends.
struct InUse<'a>(&'a H2Pool);

impl<'a> InUse<'a> {
    fn new(pool: &'a H2Pool) -> Option<InUse<'a>> {
        let budget = pool.config.budget.as_ref()?;
        pool.usage.in_flight.fetch_add(1, AcqRel);
        pool.usage.last_used_us.store(budget.now_us(), Relaxed);
        Some(InUse(pool))
    }
}

impl Drop for InUse<'_> {
    fn drop(&mut self) {
        if let Some(budget) = &self.0.config.budget {
            self.0.usage.last_used_us.store(budget.now_us(), Relaxed);
        }
        self.0.usage.in_flight.fetch_sub(1, AcqRel);
    }
}

impl budget::Member for H2Pool {
    fn idle_since(&self) -> Option<u64> {
        (self.usage.in_flight.load(Acquire) == 0).then(|| self.usage.last_used_us.load(Relaxed))
    }

    fn close_idle(&self) -> usize {
        if self.usage.in_flight.load(Acquire) > 0 {
            return 0;
        }
        let closed = (0..self.slots.len())
            .filter(|&i| self.retire_if_idle(i, None) == slots::Retire::Retired)
            .count();
        if closed > 0 {
            tracing::debug!(pool = %self.config.name, closed, "idle app connections closed for the budget");
        }
        closed
    }
}

impl std::fmt::Debug for H2Pool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H2Pool")
            .field("name", &self.config.name)
            .field("endpoint", &self.config.endpoint)
            .finish_non_exhaustive()
    }
}

impl H2Pool {
    /// A pool for `config.endpoint` (`https://host[:port]`). Connects on first use.
    pub fn new(config: PoolConfig) -> Result<Arc<H2Pool>, String> {
        let endpoint = &config.endpoint;
        if endpoint.scheme() != Some(&Scheme::HTTPS) {
            return Err(format!("endpoint {endpoint} is not https://"));
        }
        let authority = endpoint
            .authority()
            .cloned()
            .ok_or_else(|| format!("endpoint {endpoint} has no host"))?;
        let host = authority.host();
        let port = authority.port_u16().unwrap_or(443);
        let bare_host = host.trim_start_matches('[').trim_end_matches(']');
        let server_name = ServerName::try_from(bare_host.to_string())
            .map_err(|e| format!("endpoint host {host}: {e}"))?;
        Ok(Arc::new(H2Pool {
            address: format!("{host}:{port}"),
            authority,
            server_name,
            slots: (0..config.connections.max(1))
                .map(|_| Slot::default())
                .collect(),
            next: AtomicUsize::new(0),
            generations: AtomicU64::new(0),
            connect_attempts: AtomicU64::new(0),
            pings_answered: AtomicU64::new(0),
            counters: counts::Counters::default(),
            epoch: Instant::now(),
            member: config.budget.as_ref().map_or(0, |b| b.member_id()),
            usage: Usage::default(),
            config,
        }))
    }

    pub fn name(&self) -> &Arc<str> {
        &self.config.name
    }

    /// Connections currently open.
    pub fn open_connections(&self) -> usize {
        self.slots.iter().filter(|s| s.live().is_some()).count()
    }

    /// Connection attempts made so far (TCP connects started).
    pub fn connect_attempts(&self) -> u64 {
        self.connect_attempts.load(Relaxed)
    }

    /// Idle PINGs the provider answered.
    pub fn pings_answered(&self) -> u64 {
        self.pings_answered.load(Relaxed)
    }

    /// How sends ended below an answer so far: resends, lost, timed out, given up.
    pub fn transport_counts(&self) -> TransportCounts {
        self.counters.snapshot()
    }

    /// Why the first lost send (see [`TransportCounts::lost`]) was lost, if one was.
    pub fn first_lost_reason(&self) -> Option<String> {
        self.counters.first_lost()
    }

    /// Sends `request` (its URI may be a path only: scheme and authority are the
    /// endpoint's) with `body`, and reads the answer.
    pub async fn send(
        self: &Arc<Self>,
        request: Request<()>,
        body: Bytes,
    ) -> Result<Answer, TransportError> {
        let request = self.prepare(request, body.len());
        let _in_use = InUse::new(self);
        match tokio::time::timeout(self.config.timeout, self.send_with_resends(request, body)).await
        {
            Ok(result) => result,
            Err(_) => {
                self.counters.timed_out();
                Err(TransportError::Timeout {
                    pool: self.config.name.clone(),
                    ms: self.config.timeout.as_millis(),
                })
            }
        }
    }

    /// The request with the endpoint's scheme and authority and a content length.
    fn prepare(&self, mut request: Request<()>, len: usize) -> Request<()> {
        let path = request
            .uri()
            .path_and_query()
            .cloned()
            .unwrap_or_else(|| PathAndQuery::from_static("/"));
        let mut parts = http::uri::Parts::default();
        parts.scheme = Some(Scheme::HTTPS);
        parts.authority = Some(self.authority.clone());
        parts.path_and_query = Some(path);
        if let Ok(uri) = Uri::from_parts(parts) {
            *request.uri_mut() = uri;
        }
        request
            .headers_mut()
            .entry(CONTENT_LENGTH)
            .or_insert_with(|| HeaderValue::from(len));
        request
    }

    async fn send_with_resends(
        self: &Arc<Self>,
        request: Request<()>,
        body: Bytes,
    ) -> Result<Answer, TransportError> {
        let mut reason = String::new();
        let mut tries = 0;
        for attempt in 0..MAX_ATTEMPTS {
            if attempt > 0 {
                self.counters.resent();
            }
            let conn = self.connection().await?;
            match conn.exchange(copy_request(&request), body.clone()).await {
                Ok(answer) => return Ok(answer),
                Err(Failure::NotSent(why)) => reason = why,
                Err(Failure::NotProcessed(why)) => {
                    reason = why;
                    tries += 1;
                    if tries == MAX_TRIES {
                        break;
                    }
                }
                Err(Failure::Lost(reason)) => {
                    self.counters.lost(&reason);
                    return Err(TransportError::Lost {
                        pool: self.config.name.clone(),
                        reason,
                    });
                }
            }
        }
        self.counters.gave_up();
        Err(TransportError::NotProcessed {
            pool: self.config.name.clone(),
            tries,
            reason,
        })
    }

    /// Milliseconds since the pool was made (the connections' activity clock).
    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }
}

/// A copy of the request head for one try (h2 consumes the request).
fn copy_request(request: &Request<()>) -> Request<()> {
    let mut copy = Request::new(());
    *copy.method_mut() = request.method().clone();
    *copy.uri_mut() = request.uri().clone();
    *copy.headers_mut() = request.headers().clone();
    copy
}
