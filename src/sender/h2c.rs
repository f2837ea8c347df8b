//! The h2c transport of [`super::HttpSender`] (`sender.http2_prior_knowledge` on an
//! `http://` URL): a few long-lived HTTP/2 connections driven by the `h2` crate directly,
//! one stream per send.
//!
//! Why not reqwest here: at tens of thousands of sends a second most of a send's cost was
//! the general client around the protocol (its pool's bookkeeping, request and header
//! maps built twice, layers per request), not HTTP/2 itself. A send here is a clone of
//! the connection's handle, one request head, one DATA frame, and the response head;
//! `h2` writes the frames of all streams that are ready in one `write`.
//!
//! Connections are made lazily, one per slot; sends go round-robin over the slots. A
//! connection that fails or that the provider closes is forgotten (its slot's
//! generation checked, so that only the first of many failing streams forgets it), and
//! the next send through that slot connects again. A send that finds its connection dead
//! before its request left is tried once on a new one; a send that may have reached the
//! provider is never repeated here (the scheduler decides about retries).

use super::wire::PushHeaders;
use super::wire::{connect_tcp, Snippet, USER_AGENT};
use super::SendOutcome;
use super::Signal;
use bytes::Bytes;
use h2::client::SendRequest;
use http::header::{CONTENT_LENGTH, CONTENT_TYPE, USER_AGENT as USER_AGENT_HEADER};
use http::{HeaderValue, Method, Request, Uri};
use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Connections per sender. Two let a provider (or the loopback sink) serve them on two
/// cores; more only add handshakes, since each carries as many streams as the provider
/// allows (typically 100–250 at once, more are queued by `h2`).
pub const DEFAULT_CONNECTIONS: usize = 2;

/// A set of h2c connections to one provider endpoint.
pub(super) struct H2cPool {
    uri: Uri,
    /// `host:port` to connect to.
    address: String,
    connect_timeout: Duration,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    generations: AtomicU64,
}

#[derive(Default)]
struct Slot {
    /// The live connection's handle and generation. Held only to clone or replace it.
    live: Mutex<Option<(u64, SendRequest<Bytes>)>>,
    /// One connection attempt at a time per slot; the other sends wait for it.
    connecting: tokio::sync::Mutex<()>,
}

/// Why a send failed before it had an answer.
enum Failure {
    /// The connection could not be made or was dead before the request left.
    NotSent(String),
    /// The request may have reached the provider.
    Sent(String),
}

impl H2cPool {
    pub(super) fn new(uri: Uri, connect_timeout: Duration, connections: usize) -> Option<Self> {
        let host = uri.host()?;
        let port = uri.port_u16().unwrap_or(80);
        // An IPv6 literal keeps its brackets in `host()`, as connect wants it.
        let address = format!("{host}:{port}");
        Some(Self {
            uri,
            address,
            connect_timeout,
            slots: (0..connections.max(1)).map(|_| Slot::default()).collect(),
            next: AtomicUsize::new(0),
            generations: AtomicU64::new(0),
        })
    }

    /// Connections currently open (for tests and debugging).
    pub(super) fn open_connections(&self) -> usize {
        self.slots
            .iter()
            .filter(|s| s.live.lock().is_some())
            .count()
    }

    /// One POST of `body` (the caller bounds it by the send timeout).
    pub(super) async fn exchange(self: Arc<Self>, body: Bytes, push: PushHeaders) -> SendOutcome {
        let slot = self.next.fetch_add(1, Relaxed) % self.slots.len();
        let mut tries = 0;
        let response = loop {
            tries += 1;
            let request = self.request(body.len(), push.clone());
            match self.start(slot, request, body.clone()).await {
                Ok(response) => break response,
                // Nothing reached the provider: one more try on a new connection.
                Err(Failure::NotSent(_)) if tries < 2 => continue,
                Err(Failure::NotSent(reason) | Failure::Sent(reason)) => {
                    return SendOutcome::RetryProvider {
                        after: None,
                        reason: format!("connection error: {reason}"),
                        signal: Some(Signal::Connection),
                    }
                }
            }
        };
        read_response(response).await
    }

    fn request(&self, len: usize, push: PushHeaders) -> Request<()> {
        let mut request = Request::new(());
        *request.method_mut() = Method::POST;
        *request.uri_mut() = self.uri.clone();
        let headers = request.headers_mut();
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        headers.insert(CONTENT_LENGTH, HeaderValue::from(len));
        headers.insert(USER_AGENT_HEADER, HeaderValue::from_static(USER_AGENT));
        push.insert_into(headers);
        request
    }

    /// Sends the request head and body on `slot`'s connection; the response head.
    async fn start(
        self: &Arc<Self>,
        slot: usize,
        request: Request<()>,
        body: Bytes,
    ) -> Result<http::Response<h2::RecvStream>, Failure> {
        let (generation, handle) = self.handle(slot).await.map_err(Failure::NotSent)?;
        let mut handle = match handle.ready().await {
            Ok(h) => h,
            Err(e) => {
                self.forget(slot, generation);
                return Err(Failure::NotSent(e.to_string()));
            }
        };
        let sent = handle
            .send_request(request, false)
            .and_then(|(response, mut stream)| {
                stream.send_data(body, true)?;
                Ok(response)
            });
        let result = match sent {
            Ok(response) => response.await,
            Err(e) => Err(e),
        };
        result.map_err(|e| {
            // A refused or reset stream leaves the connection usable; anything else
            // (I/O, GOAWAY, a protocol error) ends it.
            if !e.is_reset() {
                self.forget(slot, generation);
            }
            Failure::Sent(e.to_string())
        })
    }

    /// The slot's live connection, connecting first if it has none.
    async fn handle(self: &Arc<Self>, slot: usize) -> Result<(u64, SendRequest<Bytes>), String> {
        if let Some(live) = self.live(slot) {
            return Ok(live);
        }
        let _connecting = self.slots[slot].connecting.lock().await;
        if let Some(live) = self.live(slot) {
            return Ok(live);
        }
        let (generation, handle) = self.connect(slot).await?;
        *self.slots[slot].live.lock() = Some((generation, handle.clone()));
        Ok((generation, handle))
    }

    fn live(&self, slot: usize) -> Option<(u64, SendRequest<Bytes>)> {
        self.slots[slot].live.lock().clone()
    }

    fn forget(&self, slot: usize, generation: u64) {
        let mut live = self.slots[slot].live.lock();
        if live.as_ref().is_some_and(|(g, _)| *g == generation) {
            *live = None;
        }
    }

    /// A new connection for `slot`, its generation, and a task driving it.
    async fn connect(self: &Arc<Self>, slot: usize) -> Result<(u64, SendRequest<Bytes>), String> {
        let tcp = connect_tcp(&self.address, self.connect_timeout).await?;
        let (handle, connection) = tokio::time::timeout(
            self.connect_timeout,
            h2::client::Builder::new().enable_push(false).handshake(tcp),
        )
        .await
        .map_err(|_| "HTTP/2 handshake timeout".to_string())?
        .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
        let generation = self.generations.fetch_add(1, Relaxed) + 1;
        let pool: Weak<Self> = Arc::downgrade(self);
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                tracing::debug!(error = %e, "provider connection ended");
            }
            // Closed by either side: the next send through this slot connects again.
            if let Some(pool) = pool.upgrade() {
                pool.forget(slot, generation);
            }
        });
        Ok((generation, handle))
    }
}

/// Reads the response to its end: the outcome, with the first bytes of an error body.
async fn read_response(response: http::Response<h2::RecvStream>) -> SendOutcome {
    let (head, mut body) = response.into_parts();
    let success = head.status.is_success();
    let mut snippet = Snippet::default();
    while let Some(chunk) = body.data().await {
        let Ok(chunk) = chunk else { break };
        let _ = body.flow_control().release_capacity(chunk.len());
        if !success {
            snippet.push(&chunk);
        }
    }
    if success {
        return SendOutcome::Delivered;
    }
    snippet.outcome(head.status.as_u16(), &head.headers)
}
