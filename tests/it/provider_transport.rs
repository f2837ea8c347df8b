//! The provider transport (`provider::h2pool`) against the loopback HTTP/2-over-TLS
//! mock (`mock::h2server`): answers, stream limits, one stream until the first 2xx,
//! GOAWAY resends, connect backoff, idle PINGs, ALPN.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pushpace::provider::h2pool::{H2Pool, PoolConfig, TransportError};
use pushpace::provider::tls::client_config;
use pushpace::tools::mock::h2server::{BoxResponse, FnHandler, Knobs, MockServer, StreamInfo};
use pushpace::tools::mock::tls::TestCa;
use std::sync::Arc;
use std::time::Duration;

fn config(ca: &TestCa, url: &str) -> PoolConfig {
    PoolConfig {
        name: "test".into(),
        endpoint: url.parse().expect("url"),
        tls: client_config(Some(ca.ca_pem().as_bytes())).expect("tls"),
        connections: 1,
        connect_timeout: Duration::from_secs(5),
        timeout: Duration::from_secs(10),
        one_stream_until_ok: false,
        idle_ping: Duration::from_secs(3600),
        idle_close: None,
        budget: None,
    }
}

fn post(path: &str) -> Request<()> {
    Request::post(path).body(()).expect("request")
}

/// Echoes the body with the request's path in a header.
fn echo() -> Arc<FnHandler<impl Fn(Request<Bytes>) -> BoxResponse + Send + Sync + 'static>> {
    Arc::new(FnHandler(|req: Request<Bytes>| -> BoxResponse {
        Box::pin(async move {
            let info = req.extensions().get::<StreamInfo>().copied();
            let mut response = Response::new(req.body().clone());
            response
                .headers_mut()
                .insert("x-path", req.uri().path().parse().expect("path header"));
            response
                .headers_mut()
                .insert("x-connection", info.map_or(0, |i| i.connection).into());
            response
        })
    }))
}

#[tokio::test]
async fn a_request_gets_its_answer_over_tls_h2() {
    let ca = TestCa::new();
    let server = MockServer::start(&ca, echo(), Knobs::default()).expect("server");
    let pool = H2Pool::new(config(&ca, &server.url())).expect("pool");
    let answer = pool
        .send(post("/3/device/abc"), Bytes::from_static(b"{\"hi\":1}"))
        .await
        .expect("answer");
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.body, Bytes::from_static(b"{\"hi\":1}"));
    assert_eq!(answer.headers["x-path"], "/3/device/abc");
    assert_eq!(pool.open_connections(), 1);
    assert_eq!(server.controls().connections(), 1);
    assert_eq!(server.controls().streams(), 1);
}

#[tokio::test]
async fn a_server_without_our_ca_is_refused() {
    let ca = TestCa::new();
    let other = TestCa::new();
    let server = MockServer::start(&ca, echo(), Knobs::default()).expect("server");
    let pool = H2Pool::new(config(&other, &server.url())).expect("pool");
    let error = pool
        .send(post("/"), Bytes::new())
        .await
        .expect_err("untrusted certificate");
    assert!(matches!(error, TransportError::Connect { .. }), "{error}");
    assert!(error.to_string().contains("TLS"), "{error}");
    assert_eq!(server.controls().streams(), 0);
}

/// Waits (polling, bounded) until `done` holds: for states only visible as counters.
async fn until(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while !done() {
        assert!(tokio::time::Instant::now() < deadline, "timed out: {what}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// A handler that answers 200 after waiting for a permit of `gate`.
fn gated(
    gate: Arc<tokio::sync::Semaphore>,
) -> Arc<FnHandler<impl Fn(Request<Bytes>) -> BoxResponse + Send + Sync + 'static>> {
    Arc::new(FnHandler(move |_req: Request<Bytes>| -> BoxResponse {
        let gate = gate.clone();
        Box::pin(async move {
            let _permit = gate.acquire().await;
            Response::new(Bytes::new())
        })
    }))
}

#[tokio::test]
async fn streams_never_exceed_the_servers_limit() {
    let ca = TestCa::new();
    let gate = Arc::new(tokio::sync::Semaphore::new(0));
    let knobs = Knobs {
        max_concurrent_streams: Some(3),
        ..Knobs::default()
    };
    let server = MockServer::start(&ca, gated(gate.clone()), knobs).expect("server");
    let controls = server.controls();
    let pool = H2Pool::new(config(&ca, &server.url())).expect("pool");
    let sends: Vec<_> = (0..30)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.send(post("/"), Bytes::from_static(b"x")).await })
        })
        .collect();
    // Three streams reach the handler and stay there until the gate opens.
    until("3 streams in the handler", Duration::from_secs(5), || {
        controls.streams() == 3
    })
    .await;
    gate.add_permits(1000);
    for send in sends {
        let answer = send.await.expect("task").expect("answer");
        assert_eq!(answer.status, StatusCode::OK);
    }
    assert_eq!(controls.streams(), 30, "each request handled once");
    assert_eq!(controls.max_concurrent_seen(), 3);
    assert_eq!(controls.connections(), 1);
}

#[tokio::test]
async fn one_stream_until_the_first_2xx_then_the_settings_limit() {
    let ca = TestCa::new();
    let seen = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let counter = seen.clone();
    // The first two requests are refused (403) before any 2xx; later ones take 20 ms
    // so that the requests released after the first 2xx overlap in the handler.
    let handler = Arc::new(FnHandler(move |_req: Request<Bytes>| -> BoxResponse {
        let n = counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            let mut response = Response::new(Bytes::new());
            if n < 2 {
                *response.status_mut() = StatusCode::FORBIDDEN;
            }
            response
        })
    }));
    let server = MockServer::start(&ca, handler, Knobs::default()).expect("server");
    let controls = server.controls();
    let mut cfg = config(&ca, &server.url());
    cfg.one_stream_until_ok = true;
    let pool = H2Pool::new(cfg).expect("pool");
    let sends: Vec<_> = (0..20)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.send(post("/"), Bytes::new()).await })
        })
        .collect();
    let mut statuses = Vec::new();
    for send in sends {
        statuses.push(send.await.expect("task").expect("answer").status);
    }
    let refused = statuses
        .iter()
        .filter(|s| **s == StatusCode::FORBIDDEN)
        .count();
    assert_eq!(refused, 2);
    assert_eq!(controls.max_concurrent_before_ok(), 1);
    assert!(
        controls.max_concurrent_seen() > 1,
        "after the first 2xx the streams run side by side"
    );
    assert_eq!(controls.connections(), 1);
}

#[tokio::test]
async fn requests_above_a_goaway_are_resent_and_answered_once() {
    // Without a stream limit all 50 reach the server and those after the 20th are
    // refused (REFUSED_STREAM); with a limit of 25 the client still holds 25 when the
    // GOAWAY comes, and those are above its last stream id.
    for limit in [None, Some(25)] {
        let knobs = Knobs {
            max_concurrent_streams: limit,
            goaway_after_streams: Some(20),
        };
        goaway_round(knobs).await;
    }
}

async fn goaway_round(knobs: Knobs) {
    let ca = TestCa::new();
    let counts = Arc::new(parking_lot::Mutex::new(std::collections::HashMap::new()));
    let seen = counts.clone();
    // 10 ms per request keeps the 50 in flight when the GOAWAY comes.
    let handler = Arc::new(FnHandler(move |req: Request<Bytes>| -> BoxResponse {
        let id = String::from_utf8_lossy(req.body()).into_owned();
        *seen.lock().entry(id).or_insert(0u32) += 1;
        Box::pin(async move {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Response::new(Bytes::new())
        })
    }));
    let server = MockServer::start(&ca, handler, knobs).expect("server");
    let controls = server.controls();
    let pool = H2Pool::new(config(&ca, &server.url())).expect("pool");
    let sends: Vec<_> = (0..50)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.send(post("/"), Bytes::from(format!("{i}"))).await })
        })
        .collect();
    for send in sends {
        let answer = send.await.expect("task").expect("answer");
        assert_eq!(answer.status, StatusCode::OK);
    }
    let counts = counts.lock();
    for i in 0..50 {
        assert_eq!(
            counts.get(&i.to_string()),
            Some(&1),
            "request {i} ({knobs:?})"
        );
    }
    assert_eq!(counts.len(), 50);
    assert!(controls.goaways() >= 2, "GOAWAYs: {}", controls.goaways());
    assert!(controls.connections() >= 3);
}

#[tokio::test]
async fn a_dead_endpoint_gets_few_connect_attempts() {
    // A port nobody listens on (bound, then released).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let ca = TestCa::new();
    let pool = H2Pool::new(config(&ca, &format!("https://127.0.0.1:{port}"))).expect("pool");
    let sends: Vec<_> = (0..200)
        .map(|_| {
            let pool = pool.clone();
            tokio::spawn(async move { pool.send(post("/"), Bytes::new()).await })
        })
        .collect();
    for send in sends {
        let error = send.await.expect("task").expect_err("nobody listens");
        assert!(matches!(error, TransportError::Connect { .. }), "{error}");
        assert!(error.to_string().contains("next attempt in"), "{error}");
        let outcome = error.into_outcome();
        assert!(matches!(
            outcome,
            pushpace::sender::SendOutcome::RetryProvider { after: Some(_), .. }
        ));
    }
    assert_eq!(pool.connect_attempts(), 1, "one attempt, then the backoff");
    assert_eq!(pool.open_connections(), 0);
}

#[tokio::test]
async fn connect_attempts_back_off_exponentially() {
    // A server that accepts TCP and closes at once: every TLS handshake fails.
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let port = listener.local_addr().expect("addr").port();
    let accepted = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = accepted.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            count.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            drop(tcp);
        }
    });
    let ca = TestCa::new();
    let pool = H2Pool::new(config(&ca, &format!("https://127.0.0.1:{port}"))).expect("pool");
    // Sends every 5 ms for one second. The backoff starts at 50-100 ms and doubles, so
    // one second holds at most 5 attempts (0, ≥50, ≥150, ≥350, ≥750 ms).
    let start = tokio::time::Instant::now();
    let mut sends = 0;
    while start.elapsed() < Duration::from_secs(1) {
        let error = pool
            .send(post("/"), Bytes::new())
            .await
            .expect_err("refused");
        assert!(matches!(error, TransportError::Connect { .. }), "{error}");
        sends += 1;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let attempts = accepted.load(std::sync::atomic::Ordering::SeqCst);
    assert!(sends > 50, "sends: {sends}");
    assert!((2..=5).contains(&attempts), "attempts: {attempts}");
    assert_eq!(pool.connect_attempts(), attempts);
}

#[tokio::test]
async fn idle_connections_are_pinged_and_dropped_when_unanswered() {
    let ca = TestCa::new();
    let server = MockServer::start(&ca, echo(), Knobs::default()).expect("server");
    let controls = server.controls();
    let mut cfg = config(&ca, &server.url());
    cfg.idle_ping = Duration::from_millis(100);
    cfg.timeout = Duration::from_millis(500);
    let pool = H2Pool::new(cfg).expect("pool");
    pool.send(post("/"), Bytes::new()).await.expect("answer");
    until("two idle PINGs answered", Duration::from_secs(5), || {
        pool.pings_answered() >= 2
    })
    .await;
    assert_eq!(pool.open_connections(), 1, "an answered PING keeps it");
    controls.set_stalled(true);
    until(
        "the silent connection dropped",
        Duration::from_secs(5),
        || pool.open_connections() == 0,
    )
    .await;
    controls.set_stalled(false);
    pool.send(post("/"), Bytes::new()).await.expect("answer");
    assert_eq!(controls.connections(), 2);
}

#[tokio::test]
async fn a_client_without_h2_alpn_fails_the_handshake() {
    let ca = TestCa::new();
    let server = MockServer::start(&ca, echo(), Knobs::default()).expect("server");
    let base = client_config(Some(ca.ca_pem().as_bytes())).expect("tls");
    for alpn in [vec![], vec![b"http/1.1".to_vec()]] {
        let mut tls = (*base).clone();
        tls.alpn_protocols = alpn;
        let mut cfg = config(&ca, &server.url());
        cfg.tls = Arc::new(tls);
        let pool = H2Pool::new(cfg).expect("pool");
        let error = pool.send(post("/"), Bytes::new()).await.expect_err("no h2");
        assert!(matches!(error, TransportError::Connect { .. }), "{error}");
    }
    assert_eq!(server.controls().refused_handshakes(), 2);
    assert_eq!(server.controls().connections(), 0);
}

#[tokio::test]
async fn sends_spread_over_the_configured_connections() {
    let ca = TestCa::new();
    let server = MockServer::start(&ca, echo(), Knobs::default()).expect("server");
    let mut cfg = config(&ca, &server.url());
    cfg.connections = 3;
    let pool = H2Pool::new(cfg).expect("pool");
    let mut used = std::collections::HashSet::new();
    for _ in 0..30 {
        let answer = pool.send(post("/"), Bytes::new()).await.expect("answer");
        used.insert(
            answer.headers["x-connection"]
                .to_str()
                .expect("id")
                .to_string(),
        );
    }
    assert_eq!(used.len(), 3);
    assert_eq!(pool.open_connections(), 3);
    assert_eq!(server.controls().connections(), 3);
}

#[tokio::test]
async fn an_oversized_answer_keeps_its_status_and_a_slow_one_is_a_provider_retry() {
    let ca = TestCa::new();
    let handler = Arc::new(FnHandler(|req: Request<Bytes>| -> BoxResponse {
        Box::pin(async move {
            if req.uri().path() == "/slow" {
                tokio::time::sleep(Duration::from_secs(30)).await;
            }
            Response::new(Bytes::from(vec![b'x'; 70 * 1024]))
        })
    }));
    let server = MockServer::start(&ca, handler, Knobs::default()).expect("server");
    let mut cfg = config(&ca, &server.url());
    cfg.timeout = Duration::from_millis(300);
    let pool = H2Pool::new(cfg).expect("pool");
    // The status was answered: the body is cut at the limit, the answer stands.
    let answer = pool
        .send(post("/big"), Bytes::new())
        .await
        .expect("an oversized body keeps its answer");
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(
        answer.body.len(),
        pushpace::provider::h2pool::MAX_ANSWER_BODY
    );
    let error = pool
        .send(post("/slow"), Bytes::new())
        .await
        .expect_err("slow");
    assert!(matches!(error, TransportError::Timeout { .. }), "{error}");
    assert!(matches!(
        error.into_outcome(),
        pushpace::sender::SendOutcome::RetryProvider { .. }
    ));
}

#[tokio::test]
async fn a_server_that_hangs_up_is_not_redialled_in_a_loop() {
    let ca = TestCa::new();
    let server = MockServer::start(&ca, echo(), Knobs::default()).expect("server");
    let controls = server.controls();
    controls.set_hang_up(true);
    let pool = H2Pool::new(config(&ca, &server.url())).expect("pool");
    // 50 sends in a row, each failing in well under the first backoff (50-100 ms).
    for _ in 0..50 {
        let error = pool
            .send(post("/"), Bytes::new())
            .await
            .expect_err("hung up");
        let outcome = error.into_outcome();
        assert!(matches!(
            outcome,
            pushpace::sender::SendOutcome::RetryProvider { .. }
        ));
    }
    assert!(
        controls.connections() <= 2,
        "connections: {}",
        controls.connections()
    );
    assert_eq!(controls.streams(), 0);
}
