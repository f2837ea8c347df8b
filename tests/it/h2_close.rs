//! The provider transport (`provider::h2pool`) when an answer's status arrives but its
//! body cannot be read: over 64 KiB, or the stream reset after the 200 headers. The
//! status decides; the request is never sent again (each token is counted once).

use bytes::Bytes;
use h2::Reason;
use http::{Request, Response, StatusCode};
use pushpace::provider::apns::answer::classify;
use pushpace::provider::h2pool::{H2Pool, PoolConfig};
use pushpace::provider::tls::client_config;
use pushpace::sender::SendOutcome;
use pushpace::tools::mock::tls::TestCa;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};
use tokio::net::TcpListener;

/// Requests seen per path (the device token is the path's last segment).
type Seen = Arc<Mutex<HashMap<String, u32>>>;

/// Well above the pool's 64 KiB answer limit.
const BIG_BODY: usize = 200 * 1024;

/// Loopback flushes a queued frame in microseconds; this leaves room for a busy machine.
const FLUSH_BEFORE_RESET: Duration = Duration::from_millis(50);

/// A loopback TLS HTTP/2 server. Its answer depends on the path's first segment:
/// `/big/..` 200 with a [`BIG_BODY`] body, `/reset/..` 200 headers then RST_STREAM,
/// `/gone/..` 410 headers then RST_STREAM.
async fn start(ca: &TestCa) -> (String, Seen) {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!(
        "https://localhost:{}",
        listener.local_addr().expect("addr").port()
    );
    let seen: Seen = Arc::default();
    let acceptor = tokio_rustls::TlsAcceptor::from(ca.server_config());
    let counts = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, counts) = (acceptor.clone(), counts.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let Ok(mut conn) = h2::server::handshake(tls).await else {
                    return;
                };
                while let Some(Ok((request, mut respond))) = conn.accept().await {
                    let path = request.uri().path().to_string();
                    *counts.lock().unwrap().entry(path.clone()).or_default() += 1;
                    let status = if path.starts_with("/gone/") {
                        StatusCode::GONE
                    } else {
                        StatusCode::OK
                    };
                    let head = Response::builder().status(status).body(()).unwrap();
                    let Ok(mut stream) = respond.send_response(head, false) else {
                        continue;
                    };
                    if path.starts_with("/big/") {
                        let _ = stream.send_data(Bytes::from(vec![b'x'; BIG_BODY]), true);
                    } else {
                        let _ = stream.send_data(Bytes::from_static(b"{\"rea"), false);
                        // A reset drops the stream's unsent frames: let the connection
                        // (polled by `accept`) flush the head first.
                        tokio::spawn(async move {
                            let _request = request;
                            tokio::time::sleep(FLUSH_BEFORE_RESET).await;
                            stream.send_reset(Reason::INTERNAL_ERROR);
                        });
                    }
                }
            });
        }
    });
    (url, seen)
}

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

/// Sends to `devices` tokens under `kind` and returns (status, APNs outcome) of each.
async fn send_all(pool: &Arc<H2Pool>, kind: &str, devices: u32) -> Vec<(StatusCode, SendOutcome)> {
    let mut out = Vec::new();
    for i in 0..devices {
        let request = Request::post(format!("/{kind}/token{i}")).body(()).unwrap();
        let answer = pool
            .send(request, Bytes::from_static(b"{}"))
            .await
            .unwrap_or_else(|e| panic!("{kind} token{i}: the status was answered, yet: {e}"));
        let (outcome, _) = classify(
            answer.status,
            &answer.headers,
            &answer.body,
            SystemTime::now(),
        );
        out.push((answer.status, outcome));
    }
    out
}

fn assert_each_once(seen: &Seen, kind: &str, devices: u32) {
    let seen = seen.lock().unwrap();
    for i in 0..devices {
        let path = format!("/{kind}/token{i}");
        assert_eq!(seen.get(&path), Some(&1), "{path} requests");
    }
}

#[tokio::test]
async fn a_200_with_a_body_over_the_limit_is_delivered_once() {
    let ca = TestCa::new();
    let (url, seen) = start(&ca).await;
    let pool = H2Pool::new(config(&ca, &url)).expect("pool");
    for (status, outcome) in send_all(&pool, "big", 5).await {
        assert_eq!(status, StatusCode::OK);
        assert!(matches!(outcome, SendOutcome::Delivered), "{outcome:?}");
    }
    assert_each_once(&seen, "big", 5);
    assert_eq!(pool.transport_counts().resent, 0);
}

#[tokio::test]
async fn a_200_whose_stream_is_reset_after_its_headers_is_delivered_once() {
    let ca = TestCa::new();
    let (url, seen) = start(&ca).await;
    let pool = H2Pool::new(config(&ca, &url)).expect("pool");
    for (status, outcome) in send_all(&pool, "reset", 5).await {
        assert_eq!(status, StatusCode::OK);
        assert!(matches!(outcome, SendOutcome::Delivered), "{outcome:?}");
    }
    assert_each_once(&seen, "reset", 5);
}

#[tokio::test]
async fn a_410_whose_body_is_cut_is_judged_on_its_status_and_not_sent_again() {
    let ca = TestCa::new();
    let (url, seen) = start(&ca).await;
    let pool = H2Pool::new(config(&ca, &url)).expect("pool");
    for (status, outcome) in send_all(&pool, "gone", 3).await {
        assert_eq!(status, StatusCode::GONE);
        assert!(
            !matches!(outcome, SendOutcome::RetryProvider { .. }),
            "an answered 410 must not be retried: {outcome:?}"
        );
    }
    assert_each_once(&seen, "gone", 3);
}
