//! The plain-text HTTP/1.1 transport of [`super::HttpSender`] (an `http://` URL without
//! `http2_prior_knowledge`, unless `sender.http1_client = "reqwest"`): keep-alive
//! connections driven by hyper's connection API, with a lock-free pool of our own.
//!
//! Why not reqwest here: over HTTP/1.1 a send is one request on one connection, so the
//! client's own bookkeeping is paid once per send, and reqwest's (its pool's map and
//! locks, the URL and header maps built twice, its layers) cost about twice what the
//! exchange itself does. A send here takes an idle connection from a lock-free queue (or
//! connects), writes one request head and body, reads the answer to its end and gives the
//! connection back.
//!
//! HTTP/1.1 carries one request at a time per connection, so connections grow to the
//! sends in flight (bounded by the scheduler's `max_in_flight`); up to `max_idle` wait
//! between sends, each for at most `idle_timeout`. A connection the provider closed is
//! noticed when it is taken (or by the send, which hyper then hands back unsent) and the
//! send goes out on a new one; a send that may have reached the provider is never
//! repeated here (the scheduler decides about retries).

use super::wire::PushHeaders;
use super::wire::{connect_tcp, Snippet, USER_AGENT};
use super::SendOutcome;
use super::Signal;
use bytes::Bytes;
use crossbeam_queue::ArrayQueue;
use http::header::{CONTENT_TYPE, HOST, USER_AGENT as USER_AGENT_HEADER};
use http::{HeaderValue, Method, Request, Uri};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// Connection attempts (connect and handshake) at once per pool. A burst of sends on a
/// cold pool would otherwise open a connection per send at the same instant, and a
/// provider's accept queue (often 128) drops the SYNs beyond it, which then wait a
/// whole second for their retransmission. 32 stay well inside it, and a cold pool still
/// reaches hundreds of connections within a few round trips.
const MAX_CONNECTING: usize = 32;

/// How often idle connections are checked for `idle_timeout`. A tenth of the default
/// 90 s timeout: an idle connection lives at most 10% longer than asked.
const REAP_EVERY: Duration = Duration::from_secs(9);

/// Keep-alive HTTP/1.1 connections to one provider endpoint.
pub(super) struct Http1Pool {
    /// The request target (origin form, `/path?query`).
    target: Uri,
    /// `host[:port]`, as the Host header.
    host: HeaderValue,
    /// `host:port` to connect to.
    address: String,
    connect_timeout: Duration,
    idle_timeout: Duration,
    idle: ArrayQueue<Idle>,
    connecting: tokio::sync::Semaphore,
    reaper_started: AtomicBool,
}

/// A connection waiting for its next send.
struct Idle {
    handle: SendRequest<Full<Bytes>>,
    since: Instant,
}

/// Why a send failed before it had an answer.
enum Failure {
    /// The connection could not be made, or hyper gave the request back unsent (boxed:
    /// this path is rare, and the error stays small on the common one).
    NotSent(String, Option<Box<Request<Full<Bytes>>>>),
    /// The request may have reached the provider.
    Sent(String),
}

impl Http1Pool {
    pub(super) fn new(
        uri: &Uri,
        connect_timeout: Duration,
        idle_timeout: Duration,
        max_idle: usize,
    ) -> Option<Self> {
        let host = uri.host()?;
        let port = uri.port_u16().unwrap_or(80);
        let authority = match uri.port_u16() {
            Some(p) => format!("{host}:{p}"),
            None => host.to_string(),
        };
        let target = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .parse()
            .ok()?;
        Some(Self {
            target,
            host: HeaderValue::from_str(&authority).ok()?,
            // An IPv6 literal keeps its brackets in `host()`, as connect wants it.
            address: format!("{host}:{port}"),
            connect_timeout,
            idle_timeout,
            idle: ArrayQueue::new(max_idle.max(1)),
            connecting: tokio::sync::Semaphore::new(MAX_CONNECTING),
            reaper_started: AtomicBool::new(false),
        })
    }

    /// Connections waiting between sends (for tests and debugging).
    pub(super) fn idle_connections(&self) -> usize {
        self.idle.len()
    }

    /// One POST of `body` (the caller bounds it by the send timeout).
    pub(super) async fn exchange(self: Arc<Self>, body: Bytes, push: PushHeaders) -> SendOutcome {
        let mut request = self.request(body, push);
        // Stale idle connections are skipped without counting; after one that failed
        // unsent, the next try is on a connection of its own.
        let mut fresh_only = false;
        let (handle, response) = loop {
            match self.start(request, fresh_only).await {
                Ok(started) => break started,
                Err(Failure::NotSent(_, Some(unsent))) if !fresh_only => {
                    request = *unsent;
                    fresh_only = true;
                }
                Err(Failure::NotSent(reason, _) | Failure::Sent(reason)) => {
                    return SendOutcome::RetryProvider {
                        after: None,
                        reason: format!("connection error: {reason}"),
                        signal: Some(Signal::Connection),
                    }
                }
            }
        };
        let (outcome, read_to_end) = read_response(response).await;
        // An answer read to its end leaves the connection ready for the next send.
        if let Some(handle) = handle.filter(|_| read_to_end) {
            self.give_back(handle);
        }
        outcome
    }

    fn request(&self, body: Bytes, push: PushHeaders) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(body));
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.target.clone();
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(USER_AGENT_HEADER, HeaderValue::from_static(USER_AGENT));
        push.insert_into(headers);
        request
    }

    /// Sends the request on an idle connection (or a new one): the connection's handle,
    /// unless it must not be reused, and the response head.
    async fn start(
        self: &Arc<Self>,
        request: Request<Full<Bytes>>,
        fresh_only: bool,
    ) -> Result<
        (
            Option<SendRequest<Full<Bytes>>>,
            hyper::Response<hyper::body::Incoming>,
        ),
        Failure,
    > {
        let mut handle = match self.take_idle(fresh_only) {
            Some(h) => h,
            None => match self.idle_or_connect(fresh_only).await {
                Ok(h) => h,
                Err(reason) => return Err(Failure::NotSent(reason, None)),
            },
        };
        // A kept connection is ready at once; a new one after its handshake.
        if let Err(e) = handle.ready().await {
            return Err(Failure::NotSent(e.to_string(), Some(Box::new(request))));
        }
        match handle.try_send_request(request).await {
            Ok(response) => {
                // `Connection: close` (or HTTP/1.0) ends the connection after this answer.
                let reusable = !response
                    .headers()
                    .get(http::header::CONNECTION)
                    .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"close"));
                Ok((reusable.then_some(handle), response))
            }
            Err(mut e) => {
                let reason = e.error().to_string();
                match e.take_message() {
                    Some(unsent) => Err(Failure::NotSent(reason, Some(Box::new(unsent)))),
                    None => Err(Failure::Sent(reason)),
                }
            }
        }
    }

    /// An idle connection that is still open and not past its idle time.
    fn take_idle(&self, fresh_only: bool) -> Option<SendRequest<Full<Bytes>>> {
        if fresh_only {
            return None;
        }
        while let Some(idle) = self.idle.pop() {
            if !idle.handle.is_closed() && idle.since.elapsed() < self.idle_timeout {
                return Some(idle.handle);
            }
        }
        None
    }

    fn give_back(&self, handle: SendRequest<Full<Bytes>>) {
        if handle.is_closed() {
            return;
        }
        // A full queue drops (and so closes) the connection: more than `max_idle` wait.
        let _ = self.idle.push(Idle {
            handle,
            since: Instant::now(),
        });
    }

    /// Waits for a turn to connect; a connection given back meanwhile is taken instead.
    async fn idle_or_connect(
        self: &Arc<Self>,
        fresh_only: bool,
    ) -> Result<SendRequest<Full<Bytes>>, String> {
        let _turn = self
            .connecting
            .acquire()
            .await
            .map_err(|_| "the connection pool is closed".to_string())?;
        match self.take_idle(fresh_only) {
            Some(h) => Ok(h),
            None => self.connect().await,
        }
    }

    /// A new connection and a task driving it.
    async fn connect(self: &Arc<Self>) -> Result<SendRequest<Full<Bytes>>, String> {
        self.start_reaper();
        let tcp = connect_tcp(&self.address, self.connect_timeout).await?;
        let (handle, connection) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
            .await
            .map_err(|e| format!("HTTP/1.1 handshake: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "provider connection ended");
            }
        });
        Ok(handle)
    }

    /// Closes connections idle longer than `idle_timeout`, also when no sends come.
    fn start_reaper(self: &Arc<Self>) {
        if self.reaper_started.swap(true, Relaxed) {
            return;
        }
        let pool: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(REAP_EVERY).await;
                let Some(pool) = pool.upgrade() else { return };
                for _ in 0..pool.idle.len() {
                    let Some(idle) = pool.idle.pop() else { break };
                    if !idle.handle.is_closed() && idle.since.elapsed() < pool.idle_timeout {
                        let _ = pool.idle.push(idle);
                    }
                }
            }
        });
    }
}

/// Reads the response to its end: the outcome, with the first bytes of an error body,
/// and whether the body ended cleanly.
async fn read_response(response: hyper::Response<hyper::body::Incoming>) -> (SendOutcome, bool) {
    let (head, mut body) = response.into_parts();
    let success = head.status.is_success();
    let mut snippet = Snippet::default();
    let mut clean = true;
    while let Some(frame) = body.frame().await {
        let Ok(frame) = frame else {
            clean = false;
            break;
        };
        if let Some(chunk) = frame.data_ref().filter(|_| !success) {
            snippet.push(chunk);
        }
    }
    if success {
        // The provider accepted it; a broken body only costs the connection.
        return (SendOutcome::Delivered, clean);
    }
    (snippet.outcome(head.status.as_u16(), &head.headers), clean)
}
