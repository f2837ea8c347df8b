//! One provider connection: TCP, TLS (ALPN h2 checked), the HTTP/2 handshake, a driver
//! task that also PINGs the connection when idle (and, in an app pool, closes it after
//! `idle_close` without a stream), and one exchange (a stream) per send.

use super::budget::Ticket;
use super::slots::Retire;
use super::{Answer, Failure, H2Pool, MAX_ANSWER_BODY};
use bytes::{Bytes, BytesMut};
use h2::client::{ResponseFuture, SendRequest};
use h2::{Ping, PingPong, Reason};
use http::Request;
use parking_lot::Mutex;
use std::sync::atomic::{
    AtomicBool, AtomicU64, AtomicUsize, Ordering::AcqRel, Ordering::Acquire, Ordering::Relaxed,
};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::sync::{oneshot, Semaphore};

/// A live HTTP/2 connection of a slot.
pub(super) struct Conn {
    pub(super) generation: u64,
    slot: usize,
    handle: SendRequest<Bytes>,
    pool: Weak<H2Pool>,
    /// `one_stream_until_ok`: one permit until the first 2xx, then closed (all pass).
    gate: Option<Semaphore>,
    activity: Arc<Activity>,
    /// The pool closes idle connections: streams stamp their start and end.
    stamps: bool,
}

/// What a connection and its driver share.
struct Activity {
    /// When a stream last started or a PING was answered (pool clock, ms).
    active_ms: AtomicU64,
    /// Whether any stream got an answer: a connection that closes before that counts as
    /// a failed connect, so a server that hangs up at once is not redialled in a loop.
    answered: AtomicBool,
    /// Whether the connection became ready (its first PING answered).
    opened: AtomicBool,
    /// The driver (until the connection ends) and each stream in flight. The connection
    /// is judged when the last lets go: its driver may see it close before the streams
    /// whose answers came in the same read have run, and those answers count.
    holders: AtomicUsize,
    /// Why the connection ended, kept for the judgement (not touched per send).
    end_reason: Mutex<Option<String>>,
    /// Whether its early end was counted already (or it was closed on purpose).
    counted: AtomicBool,
    /// Streams in flight: a connection with one is never closed for idleness.
    streams: AtomicUsize,
    /// When a stream last started or ended (pool clock, ms); kept with `idle_close`.
    stream_ms: AtomicU64,
    /// Its place in the app connection budget.
    ticket: Option<Ticket>,
}

impl Activity {
    fn new(now_ms: u64, ticket: Option<Ticket>) -> Activity {
        Activity {
            active_ms: AtomicU64::new(now_ms),
            answered: AtomicBool::new(false),
            opened: AtomicBool::new(false),
            holders: AtomicUsize::new(1),
            end_reason: Mutex::new(None),
            counted: AtomicBool::new(false),
            streams: AtomicUsize::new(0),
            stream_ms: AtomicU64::new(now_ms),
            ticket,
        }
    }

    fn release_budget(&self) {
        if let Some(ticket) = &self.ticket {
            ticket.release();
        }
    }

    /// A stream starts: the connection is not judged before it ends.
    fn hold(&self) {
        self.holders.fetch_add(1, AcqRel);
    }

    /// The connection ended (or failed under a stream); the first reason is kept.
    fn end(&self, reason: &str) {
        self.end_reason
            .lock()
            .get_or_insert_with(|| reason.to_string());
    }

    /// A holder lets go. `Some(reason)` once, when the last one leaves a connection
    /// that ended after opening without any answer: its slot should back off.
    fn release(&self) -> Option<String> {
        // AcqRel: the last holder sees every `answered` stored before the others let go.
        if self.holders.fetch_sub(1, AcqRel) != 1 {
            return None;
        }
        let reason = self.end_reason.lock().clone()?;
        let early = self.opened.load(Relaxed) && !self.answered.load(Relaxed);
        (early && !self.counted.swap(true, Relaxed)).then_some(reason)
    }
}

/// A stream's hold on its connection's judgement, let go however the exchange ends.
struct Hold<'a>(&'a Conn);

impl<'a> Hold<'a> {
    fn new(conn: &'a Conn) -> Self {
        conn.activity.hold();
        conn.activity.streams.fetch_add(1, AcqRel);
        conn.stamp_stream();
        Hold(conn)
    }
}

impl Drop for Hold<'_> {
    fn drop(&mut self) {
        // Stamped before the count drops, so the driver never sees it idle and old.
        self.0.stamp_stream();
        self.0.activity.streams.fetch_sub(1, AcqRel);
        if let Some(reason) = self.0.activity.release() {
            if let Some(pool) = self.0.pool.upgrade() {
                pool.connection_failed(self.0.slot, &reason);
            }
        }
    }
}

impl Conn {
    /// Connects slot `slot` of `pool`; ready once the server answered a first PING
    /// (so its SETTINGS, read before, apply to the first stream).
    pub(super) async fn connect(
        pool: &Arc<H2Pool>,
        slot: usize,
        generation: u64,
        ticket: Option<Ticket>,
    ) -> Result<Arc<Conn>, String> {
        let limit = pool.config.connect_timeout;
        let setup = async {
            let tcp = tokio::net::TcpStream::connect(&pool.address)
                .await
                .map_err(|e| e.to_string())?;
            let _ = tcp.set_nodelay(true);
            let tls = tokio_rustls::TlsConnector::from(pool.config.tls.clone())
                .connect(pool.server_name.clone(), tcp)
                .await
                .map_err(|e| format!("TLS: {e}"))?;
            if tls.get_ref().1.alpn_protocol() != Some(b"h2".as_slice()) {
                return Err("the server did not negotiate HTTP/2 (ALPN h2)".to_string());
            }
            let (handle, mut connection) = h2::client::Builder::new()
                .enable_push(false)
                .handshake::<_, Bytes>(tls)
                .await
                .map_err(|e| format!("HTTP/2 handshake: {e}"))?;
            let ping = connection
                .ping_pong()
                .ok_or_else(|| "HTTP/2 PING unavailable".to_string())?;
            let activity = Arc::new(Activity::new(pool.now_ms(), ticket));
            let (ready_tx, ready_rx) = oneshot::channel();
            let driver = Driver {
                pool: Arc::downgrade(pool),
                slot,
                generation,
                activity: activity.clone(),
            };
            tokio::spawn(driver.run(connection, ping, ready_tx));
            ready_rx
                .await
                .map_err(|_| "connection closed during setup".to_string())?;
            Ok((handle, activity))
        };
        let (handle, activity) = tokio::time::timeout(limit, setup)
            .await
            .map_err(|_| format!("no HTTP/2 connection within {} ms", limit.as_millis()))??;
        Ok(Arc::new(Conn {
            generation,
            slot,
            handle,
            pool: Arc::downgrade(pool),
            gate: pool.config.one_stream_until_ok.then(|| Semaphore::new(1)),
            activity,
            stamps: pool.config.idle_close.is_some(),
        }))
    }

    /// One request and its answer on this connection.
    pub(super) async fn exchange(
        &self,
        request: Request<()>,
        body: Bytes,
    ) -> Result<Answer, Failure> {
        // Until the first 2xx: one stream at a time (the permit is held to the answer).
        let _permit = match &self.gate {
            Some(gate) => gate.acquire().await.ok(),
            None => None,
        };
        let _hold = Hold::new(self);
        if let Some(pool) = self.pool.upgrade() {
            self.activity.active_ms.store(pool.now_ms(), Relaxed);
        }
        let mut handle = self.handle.clone().ready().await.map_err(|e| {
            self.forget();
            Failure::NotSent(e.to_string())
        })?;
        let (response, mut stream) =
            handle.send_request(request, body.is_empty()).map_err(|e| {
                self.forget();
                Failure::NotSent(e.to_string())
            })?;
        if !body.is_empty() {
            if let Err(e) = stream.send_data(body, true) {
                return Err(self.body_not_sent(response, e).await);
            }
        }
        let response = response.await.map_err(|e| self.failed(e))?;
        self.activity.answered.store(true, Relaxed);
        let (answer, cut) = read_answer(response).await;
        if let Some(e) = cut {
            // The status was read, so the request was processed: the answer stands.
            // A connection-level error still retires the connection.
            let _ = self.failed(e);
        }
        if answer.status.is_success() {
            if let Some(gate) = &self.gate {
                gate.close();
            }
        }
        Ok(answer)
    }

    /// The stream ended before its body could be queued: a REFUSED_STREAM or GOAWAY
    /// between its HEADERS and DATA, the connection's end, or an answer sent before the
    /// body was read. Without its body the server never had the whole request, so it is
    /// never lost; the stream's own end says whether a refusal counts as a try.
    async fn body_not_sent(&self, response: ResponseFuture, e: h2::Error) -> Failure {
        match response.await {
            Err(ended) => match self.failed(ended) {
                Failure::Lost(why) => Failure::NotSent(why),
                failure => failure,
            },
            Ok(_) => Failure::NotSent(format!("answered before its body was sent: {e}")),
        }
    }

    /// Classifies a stream error: only GOAWAY (a stream above its last id) and
    /// REFUSED_STREAM tell that the server did not process the request.
    fn failed(&self, e: h2::Error) -> Failure {
        let refused = e.is_reset() && e.is_remote() && e.reason() == Some(Reason::REFUSED_STREAM);
        let above_goaway = e.is_go_away() && e.is_remote();
        if above_goaway {
            // An orderly GOAWAY: reconnect at once.
            self.forget();
        } else if !e.is_reset() {
            // An I/O or protocol error: no new streams on this connection.
            self.forget();
            self.activity.end(&e.to_string());
        }
        if refused || above_goaway {
            Failure::NotProcessed(e.to_string())
        } else {
            Failure::Lost(e.to_string())
        }
    }

    fn forget(&self) {
        if let Some(pool) = self.pool.upgrade() {
            pool.forget(self.slot, self.generation);
        }
    }

    /// No stream in flight.
    pub(super) fn idle(&self) -> bool {
        self.activity.streams.load(Acquire) == 0
    }

    /// Its slot let go of it on purpose (idle): no failure to judge, its budget place
    /// given back now (h2 closes it once the last send holding it is done).
    pub(super) fn retire(&self) {
        self.activity.counted.store(true, Relaxed);
        self.release_budget();
    }

    pub(super) fn release_budget(&self) {
        self.activity.release_budget();
    }

    fn stamp_stream(&self) {
        if !self.stamps {
            return;
        }
        if let Some(pool) = self.pool.upgrade() {
            self.activity.stream_ms.store(pool.now_ms(), Relaxed);
        }
    }
}

/// How the connection future ended, as a reason.
fn closed(result: Result<(), h2::Error>) -> String {
    match result {
        Ok(()) => "closed".to_string(),
        Err(e) => e.to_string(),
    }
}

/// Reads the answer: at most [`MAX_ANSWER_BODY`] bytes of its body are kept (the rest is
/// dropped, which resets the stream), and a body cut short by a stream or connection
/// error keeps what came (the error is returned beside it). Once the status is read the
/// request was processed, so neither case may make it a failure and a resend.
async fn read_answer(response: http::Response<h2::RecvStream>) -> (Answer, Option<h2::Error>) {
    let (head, mut body) = response.into_parts();
    let mut collected = BytesMut::new();
    let mut single: Option<Bytes> = None;
    let mut cut = None;
    while let Some(chunk) = body.data().await {
        let chunk = match chunk {
            Ok(chunk) => chunk,
            Err(e) => {
                cut = Some(e);
                break;
            }
        };
        let _ = body.flow_control().release_capacity(chunk.len());
        let held = single.as_ref().map_or(0, Bytes::len) + collected.len();
        if held + chunk.len() > MAX_ANSWER_BODY {
            let room = MAX_ANSWER_BODY - held;
            collected.extend_from_slice(single.take().as_deref().unwrap_or_default());
            collected.extend_from_slice(&chunk[..room]);
            break;
        }
        // The usual answer is one DATA frame: keep it without copying.
        match single.take() {
            None if collected.is_empty() => single = Some(chunk),
            first => {
                if let Some(first) = first {
                    collected.extend_from_slice(&first);
                }
                collected.extend_from_slice(&chunk);
            }
        }
    }
    let answer = Answer {
        status: head.status,
        headers: head.headers,
        body: single.unwrap_or_else(|| collected.freeze()),
    };
    (answer, cut)
}

/// Drives a connection and keeps it alive; forgets it in its slot when it ends.
struct Driver {
    pool: Weak<H2Pool>,
    slot: usize,
    generation: u64,
    activity: Arc<Activity>,
}

/// Why the driver stopped keeping its connection alive.
enum Stop {
    /// The connection itself ended.
    Ended(String),
    /// A PING failed, or the pool is gone: dropped at once.
    Failed(String),
    /// Idle past `idle_close` and let go of by its slot: driven on until h2 has sent
    /// its GOAWAY and closed it, for at most `grace` (a send that took it just before
    /// may still finish on it; sends are bounded by the send timeout).
    Idle { grace: Duration },
}

/// Beyond the send timeout, how long an idle-closed connection may take to close.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

impl Driver {
    async fn run<C>(self, connection: C, mut ping: PingPong, ready: oneshot::Sender<()>)
    where
        C: std::future::Future<Output = Result<(), h2::Error>>,
    {
        tokio::pin!(connection);
        let stop = tokio::select! {
            result = &mut connection => Stop::Ended(closed(result)),
            stop = self.keep_alive(&mut ping, ready) => stop,
        };
        let ended = match stop {
            Stop::Ended(reason) | Stop::Failed(reason) => reason,
            Stop::Idle { grace } => match tokio::time::timeout(grace, &mut connection).await {
                Ok(result) => format!("closed when idle ({})", closed(result)),
                Err(_) => "closed when idle (dropped: not closed within the grace)".into(),
            },
        };
        self.activity.end(&ended);
        let early = self.activity.release();
        self.activity.release_budget();
        if let Some(pool) = self.pool.upgrade() {
            tracing::debug!(pool = %pool.config.name, reason = %ended, "provider connection ended");
            pool.forget(self.slot, self.generation);
            if let Some(reason) = early {
                pool.connection_failed(self.slot, &reason);
            }
        }
    }

    /// The first PING (readiness), then one per idle period; with `idle_close`, the
    /// connection's slot lets go of it once it has had no stream that long.
    async fn keep_alive(&self, ping: &mut PingPong, ready: oneshot::Sender<()>) -> Stop {
        if let Err(reason) = self.ping(ping).await {
            return Stop::Failed(reason);
        }
        self.activity.opened.store(true, Relaxed);
        let _ = ready.send(());
        loop {
            let Some(pool) = self.pool.upgrade() else {
                return Stop::Failed("pool dropped".into());
            };
            let now = pool.now_ms();
            let idle_ping = pool.config.idle_ping.max(Duration::from_millis(1));
            let idle = now.saturating_sub(self.activity.active_ms.load(Relaxed));
            let mut wait = idle_ping.saturating_sub(Duration::from_millis(idle));
            if let Some(close) = pool.config.idle_close {
                let close = close.max(Duration::from_millis(1));
                if self.activity.streams.load(Acquire) > 0 {
                    // Looked at again at least every `close` while streams run.
                    wait = wait.min(close);
                } else {
                    let unused = now.saturating_sub(self.activity.stream_ms.load(Relaxed));
                    let left = close.saturating_sub(Duration::from_millis(unused));
                    if left.is_zero() {
                        match pool.retire_if_idle(self.slot, Some(self.generation)) {
                            // A stream started meanwhile: kept.
                            Retire::Busy => continue,
                            Retire::Retired | Retire::Gone => {
                                tracing::debug!(pool = %pool.config.name, unused_ms = unused,
                                    "idle provider connection closing");
                                return Stop::Idle {
                                    grace: pool.config.timeout + CLOSE_GRACE,
                                };
                            }
                        }
                    }
                    wait = wait.min(left);
                }
            }
            drop(pool);
            if !wait.is_zero() {
                tokio::time::sleep(wait).await;
                continue;
            }
            if let Err(reason) = self.ping(ping).await {
                return Stop::Failed(reason);
            }
            if let Some(pool) = self.pool.upgrade() {
                pool.pings_answered.fetch_add(1, Relaxed);
            }
        }
    }

    async fn ping(&self, ping: &mut PingPong) -> Result<(), String> {
        let limit = match self.pool.upgrade() {
            Some(pool) => pool.config.timeout.max(Duration::from_millis(1)),
            None => return Err("pool dropped".into()),
        };
        match tokio::time::timeout(limit, ping.ping(Ping::opaque())).await {
            Ok(Ok(_pong)) => {
                if let Some(pool) = self.pool.upgrade() {
                    self.activity.active_ms.store(pool.now_ms(), Relaxed);
                }
                Ok(())
            }
            Ok(Err(e)) => Err(format!("PING failed: {e}")),
            Err(_) => Err(format!("PING unanswered for {} ms", limit.as_millis())),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Activity;
    use std::sync::atomic::Ordering::Relaxed;

    fn opened() -> Activity {
        let activity = Activity::new(0, None);
        activity.opened.store(true, Relaxed);
        activity
    }

    #[test]
    fn a_close_seen_before_the_streams_read_their_answers_is_no_failure() {
        let activity = opened();
        activity.hold();
        activity.hold();
        // The driver sees the clean close first; the answers are not read yet.
        activity.end("closed");
        assert_eq!(activity.release(), None);
        activity.answered.store(true, Relaxed);
        assert_eq!(activity.release(), None);
        assert_eq!(activity.release(), None);
    }

    #[test]
    fn a_connection_that_ends_unanswered_backs_off_once() {
        let activity = opened();
        activity.hold();
        activity.end("closed");
        assert_eq!(activity.release(), None, "a stream still holds it");
        assert_eq!(activity.release().as_deref(), Some("closed"));
        // A late send finds it closed: judged again, counted no more.
        activity.hold();
        assert_eq!(activity.release(), None);
    }

    #[test]
    fn a_stream_failure_is_judged_when_the_driver_ends_too() {
        let activity = opened();
        activity.hold();
        activity.end("broken pipe");
        assert_eq!(activity.release(), None);
        activity.end("closed");
        assert_eq!(activity.release().as_deref(), Some("broken pipe"));
    }

    #[test]
    fn a_connection_that_never_opened_is_the_connect_attempts_failure() {
        let activity = Activity::new(0, None);
        activity.end("closed");
        assert_eq!(activity.release(), None);
    }
}
