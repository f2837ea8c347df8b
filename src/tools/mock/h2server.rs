//! The HTTP/2-over-TLS server under every provider mock: a loopback listener, TLS with
//! ALPN `h2` required (a client offering no ALPN is dropped during the handshake, as
//! APNs does), `h2::server`, and one [`Handler`] call per stream with the whole body
//! (over 64 KiB: 413 without calling the handler).
//!
//! [`Controls`] count what the transport did (connections, streams, GOAWAYs, the most
//! streams seen at once on one connection, before and after its first 2xx; the
//! connections open now) and change the server's behaviour at run time: a stream limit
//! (SETTINGS), GOAWAY after N streams, stalling (no frames read or written, so PINGs go
//! unanswered), holding answers (streams wait before the handler, PINGs are answered).
//!
//! GOAWAY after N streams: h2 can only announce the highest stream it has received as
//! `last_stream_id`, so streams beyond the N-th that already arrived are refused with
//! RST_STREAM(REFUSED_STREAM) and never reach the handler; both mean "not processed"
//! (RFC 9113 §8.7), and the client may resend them. A connection that ends lingers
//! as a real server's does: closing it with the client's last frames unread would reset
//! it, and the reset would discard the GOAWAY the client has not read yet.

use bytes::Bytes;
use h2::server::SendResponse;
use http::{Request, Response, StatusCode};
use parking_lot::Mutex;
use std::future::Future;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

use super::tls::TestCa;

/// The largest request body the mocks accept.
pub const MAX_BODY: usize = 64 * 1024;

/// Answers one request. The request carries a [`StreamInfo`] in its extensions.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, req: Request<Bytes>) -> impl Future<Output = Response<Bytes>> + Send;
}

/// A handler from a closure returning a boxed future (for tests).
pub struct FnHandler<F>(pub F);

/// The boxed future an [`FnHandler`] closure returns.
pub type BoxResponse = Pin<Box<dyn Future<Output = Response<Bytes>> + Send>>;

impl<F> Handler for FnHandler<F>
where
    F: Fn(Request<Bytes>) -> BoxResponse + Send + Sync + 'static,
{
    fn handle(&self, req: Request<Bytes>) -> impl Future<Output = Response<Bytes>> + Send {
        (self.0)(req)
    }
}

/// Where a request came from: the connection (numbered from 1 per server) and the
/// stream's position on it (from 1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamInfo {
    pub connection: u64,
    pub stream: u64,
}

/// Server behaviour chosen at start (and changeable through [`Controls`]).
#[derive(Debug, Clone, Copy, Default)]
pub struct Knobs {
    /// SETTINGS_MAX_CONCURRENT_STREAMS for connections accepted from now on.
    pub max_concurrent_streams: Option<u32>,
    /// After accepting this many streams on a connection, GOAWAY; later ones are not
    /// processed.
    pub goaway_after_streams: Option<u64>,
}

/// Counters and run-time switches of a [`MockServer`].
#[derive(Debug, Default)]
pub struct Controls {
    knobs: Mutex<Knobs>,
    connections: AtomicU64,
    no_alpn: AtomicU64,
    streams: AtomicU64,
    refused: AtomicU64,
    goaways: AtomicU64,
    max_concurrent: AtomicU64,
    max_concurrent_before_ok: AtomicU64,
    stalled: AtomicBool,
    hang_up: AtomicBool,
    stall_changed: tokio::sync::Notify,
    /// Connections whose serving has not ended.
    open: AtomicU64,
    /// Streams wait before the handler while set.
    hold: AtomicBool,
    held: AtomicU64,
    hold_changed: tokio::sync::Notify,
    /// The first error a connection ended on (its in-flight answers are lost with it).
    first_error: Mutex<Option<String>>,
}

impl Controls {
    /// TLS connections accepted with ALPN h2.
    pub fn connections(&self) -> u64 {
        self.connections.load(SeqCst)
    }
    /// HTTP/2 connections open now (accepted, not yet closed by either side).
    pub fn open_connections(&self) -> u64 {
        self.open.load(SeqCst)
    }
    /// While set, each new stream waits before the handler (its send stays in flight);
    /// clearing it lets them all go on.
    pub fn set_hold(&self, hold: bool) {
        self.hold.store(hold, SeqCst);
        self.hold_changed.notify_waiters();
    }
    /// Streams waiting on [`Controls::set_hold`] now.
    pub fn held_streams(&self) -> u64 {
        self.held.load(SeqCst)
    }
    /// Handshakes dropped because the client offered no ALPN or not h2.
    pub fn refused_handshakes(&self) -> u64 {
        self.no_alpn.load(SeqCst)
    }
    /// Streams passed to the handler (or answered 413).
    pub fn streams(&self) -> u64 {
        self.streams.load(SeqCst)
    }
    /// Streams refused (REFUSED_STREAM) after a GOAWAY, never processed.
    pub fn refused_streams(&self) -> u64 {
        self.refused.load(SeqCst)
    }
    /// GOAWAYs started.
    pub fn goaways(&self) -> u64 {
        self.goaways.load(SeqCst)
    }
    /// The first error a connection ended on, if one did.
    pub fn first_connection_error(&self) -> Option<String> {
        self.first_error.lock().clone()
    }
    /// The most streams in the handler at once on one connection.
    pub fn max_concurrent_seen(&self) -> u64 {
        self.max_concurrent.load(SeqCst)
    }
    /// The same, counted only until the connection's first 2xx answer.
    pub fn max_concurrent_before_ok(&self) -> u64 {
        self.max_concurrent_before_ok.load(SeqCst)
    }
    pub fn knobs(&self) -> Knobs {
        *self.knobs.lock()
    }
    /// Applies to connections accepted from now on.
    pub fn set_max_concurrent_streams(&self, max: Option<u32>) {
        self.knobs.lock().max_concurrent_streams = max;
    }
    /// Applies to every connection's next stream.
    pub fn set_goaway_after_streams(&self, after: Option<u64>) {
        self.knobs.lock().goaway_after_streams = after;
    }
    /// A stalled server reads and writes nothing on its connections (PINGs unanswered).
    pub fn set_stalled(&self, stalled: bool) {
        self.stalled.store(stalled, SeqCst);
        self.stall_changed.notify_waiters();
    }

    /// A server that hangs up answers every stream by closing its connection.
    pub fn set_hang_up(&self, hang_up: bool) {
        self.hang_up.store(hang_up, SeqCst);
    }

    async fn wait_unstalled(&self) {
        loop {
            let changed = self.stall_changed.notified();
            if !self.stalled.load(SeqCst) {
                return;
            }
            changed.await;
        }
    }

    async fn wait_unheld(&self) {
        loop {
            let changed = self.hold_changed.notified();
            if !self.hold.load(SeqCst) {
                return;
            }
            changed.await;
        }
    }

    async fn wait_stalled(&self) {
        loop {
            let changed = self.stall_changed.notified();
            if self.stalled.load(SeqCst) {
                return;
            }
            changed.await;
        }
    }
}

/// A running mock server; stops on [`MockServer::shutdown`] or drop.
pub struct MockServer {
    addr: SocketAddr,
    controls: Arc<Controls>,
    stop: watch::Sender<bool>,
}

impl MockServer {
    /// Listens on 127.0.0.1 (a free port). Must be called inside a tokio runtime.
    pub fn start<H: Handler>(
        ca: &TestCa,
        handler: Arc<H>,
        knobs: Knobs,
    ) -> std::io::Result<MockServer> {
        Self::start_on(([127, 0, 0, 1], 0).into(), ca, handler, knobs)
    }

    /// [`MockServer::start`] on a given address (`pushpace mock --bind`).
    pub fn start_on<H: Handler>(
        bind: SocketAddr,
        ca: &TestCa,
        handler: Arc<H>,
        knobs: Knobs,
    ) -> std::io::Result<MockServer> {
        let std_listener = std::net::TcpListener::bind(bind)?;
        std_listener.set_nonblocking(true)?;
        let listener = TcpListener::from_std(std_listener)?;
        let addr = listener.local_addr()?;
        let controls = Arc::new(Controls {
            knobs: Mutex::new(knobs),
            ..Controls::default()
        });
        let (stop, stopped) = watch::channel(false);
        let shared = Arc::new(Shared {
            tls: ca.server_config(),
            handler,
            controls: controls.clone(),
        });
        tokio::spawn(accept_loop(listener, shared, stopped));
        Ok(MockServer {
            addr,
            controls,
            stop,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https://127.0.0.1:PORT` (the certificate also names `localhost`).
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.addr.port())
    }

    pub fn controls(&self) -> Arc<Controls> {
        self.controls.clone()
    }

    /// Stops listening and closes every connection.
    pub fn shutdown(&self) {
        let _ = self.stop.send(true);
    }
}

impl Drop for MockServer {
    fn drop(&mut self) {
        self.shutdown();
    }
}

struct Shared<H> {
    tls: Arc<rustls::ServerConfig>,
    handler: Arc<H>,
    controls: Arc<Controls>,
}

async fn accept_loop<H: Handler>(
    listener: TcpListener,
    shared: Arc<Shared<H>>,
    mut stopped: watch::Receiver<bool>,
) {
    loop {
        let tcp = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((tcp, _)) => tcp,
                Err(_) => continue,
            },
            _ = stopped.wait_for(|s| *s) => return,
        };
        let shared = shared.clone();
        let mut stopped = stopped.clone();
        tokio::spawn(async move {
            tokio::select! {
                _ = serve_connection(tcp, shared) => {}
                _ = stopped.wait_for(|s| *s) => {}
            }
        });
    }
}

/// Counts a connection open until its serving ends, however it ends.
struct OpenGuard<'a>(&'a Controls);

impl<'a> OpenGuard<'a> {
    fn new(controls: &'a Controls) -> Self {
        controls.open.fetch_add(1, SeqCst);
        OpenGuard(controls)
    }
}

impl Drop for OpenGuard<'_> {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, SeqCst);
    }
}

/// Per-connection stream accounting.
#[derive(Default)]
struct ConnState {
    in_flight: AtomicU64,
    ok_seen: AtomicBool,
}

async fn serve_connection<H: Handler>(tcp: TcpStream, shared: Arc<Shared<H>>) {
    let _ = tcp.set_nodelay(true);
    // The same socket, kept open past the TLS and h2 layers for a lingering close.
    let socket = tcp.as_fd().try_clone_to_owned().ok();
    let acceptor = tokio_rustls::LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp);
    let Ok(start) = acceptor.await else { return };
    let offers_h2 = start
        .client_hello()
        .alpn()
        .is_some_and(|mut protocols| protocols.any(|p| p == b"h2"));
    if !offers_h2 {
        // Dropping the socket mid-handshake fails the client's handshake.
        shared.controls.no_alpn.fetch_add(1, SeqCst);
        return;
    }
    let Ok(tls) = start.into_stream(shared.tls.clone()).await else {
        return;
    };
    let controls = &shared.controls;
    let mut builder = h2::server::Builder::new();
    if let Some(max) = controls.knobs().max_concurrent_streams {
        builder.max_concurrent_streams(max);
    }
    let Ok(mut conn) = builder.handshake::<_, Bytes>(tls).await else {
        return;
    };
    let connection = controls.connections.fetch_add(1, SeqCst) + 1;
    let _open = OpenGuard::new(controls);
    let state = Arc::new(ConnState::default());
    let mut accepted = 0u64;
    let mut going_away = false;
    loop {
        let next = tokio::select! {
            next = conn.accept() => next,
            _ = controls.wait_stalled() => {
                controls.wait_unstalled().await;
                continue;
            }
        };
        let (request, mut respond) = match next {
            Some(Ok(stream)) => stream,
            Some(Err(e)) => {
                controls
                    .first_error
                    .lock()
                    .get_or_insert_with(|| format!("connection {connection}: {e}"));
                break;
            }
            None => {
                drop(conn);
                if let Some(socket) = socket {
                    linger(socket).await;
                }
                return;
            }
        };
        if controls.hang_up.load(SeqCst) {
            conn.abrupt_shutdown(h2::Reason::NO_ERROR);
            drop(respond);
            continue;
        }
        if going_away {
            controls.refused.fetch_add(1, SeqCst);
            respond.send_reset(h2::Reason::REFUSED_STREAM);
            continue;
        }
        accepted += 1;
        if controls.knobs().goaway_after_streams == Some(accepted) {
            controls.goaways.fetch_add(1, SeqCst);
            conn.graceful_shutdown();
            going_away = true;
        }
        let info = StreamInfo {
            connection,
            stream: accepted,
        };
        tokio::spawn(serve_stream(
            request,
            respond,
            info,
            shared.clone(),
            state.clone(),
        ));
    }
}

/// How long a closed connection's socket stays open to read what the client still
/// sends: Go's HTTP/2 server waits 1 s after its last GOAWAY before closing, far
/// above a loopback round trip.
const LINGER: Duration = Duration::from_secs(1);

/// Closes a connection the way a real server does: its write side is already shut down
/// (h2 sends close_notify and FIN), and reading on until the client closes or `LINGER`
/// passes keeps the kernel from answering the client's last frames with a reset, which
/// would discard the GOAWAY and answers the client has not read yet.
async fn linger(fd: OwnedFd) {
    let std = std::net::TcpStream::from(fd);
    if std.set_nonblocking(true).is_err() {
        return;
    }
    let Ok(mut tcp) = TcpStream::from_std(std) else {
        return;
    };
    let _ = tcp.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async { while matches!(tcp.read(&mut sink).await, Ok(n) if n > 0) {} };
    let _ = tokio::time::timeout(LINGER, drain).await;
}

async fn serve_stream<H: Handler>(
    request: Request<h2::RecvStream>,
    mut respond: SendResponse<Bytes>,
    info: StreamInfo,
    shared: Arc<Shared<H>>,
    state: Arc<ConnState>,
) {
    let controls = &shared.controls;
    controls.streams.fetch_add(1, SeqCst);
    let now = state.in_flight.fetch_add(1, SeqCst) + 1;
    controls.max_concurrent.fetch_max(now, SeqCst);
    if !state.ok_seen.load(SeqCst) {
        controls.max_concurrent_before_ok.fetch_max(now, SeqCst);
    }
    if controls.hold.load(SeqCst) {
        controls.held.fetch_add(1, SeqCst);
        controls.wait_unheld().await;
        controls.held.fetch_sub(1, SeqCst);
    }
    let (head, body) = request.into_parts();
    let response = match read_body(body).await {
        Ok(body) => {
            let mut request = Request::from_parts(head, body);
            request.extensions_mut().insert(info);
            shared.handler.handle(request).await
        }
        Err(status) => status_only(status),
    };
    if response.status().is_success() {
        state.ok_seen.store(true, SeqCst);
    }
    // Out of the count before the answer can reach the client.
    state.in_flight.fetch_sub(1, SeqCst);
    let (head, body) = response.into_parts();
    let Ok(mut stream) = respond.send_response(Response::from_parts(head, ()), body.is_empty())
    else {
        return;
    };
    if !body.is_empty() {
        let _ = stream.send_data(body, true);
    }
}

/// The whole request body, or the status to answer instead.
async fn read_body(mut body: h2::RecvStream) -> Result<Bytes, StatusCode> {
    let mut collected = Vec::new();
    while let Some(chunk) = body.data().await {
        let chunk = chunk.map_err(|_| StatusCode::BAD_REQUEST)?;
        let _ = body.flow_control().release_capacity(chunk.len());
        if collected.len() + chunk.len() > MAX_BODY {
            return Err(StatusCode::PAYLOAD_TOO_LARGE);
        }
        collected.extend_from_slice(&chunk);
    }
    Ok(Bytes::from(collected))
}

/// An empty response with `status`.
pub fn status_only(status: StatusCode) -> Response<Bytes> {
    let mut response = Response::new(Bytes::new());
    *response.status_mut() = status;
    response
}
