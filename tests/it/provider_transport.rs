//! The provider transport (`provider::h2pool`) against the loopback HTTP/2-over-TLS
//! mock (`mock::h2server`): answers, stream limits, one stream until the first 2xx,
//! GOAWAY resends, connect backoff, idle PINGs, ALPN.

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use pushpace::mock::h2server::{BoxResponse, FnHandler, Knobs, MockServer, StreamInfo};
use pushpace::mock::tls::TestCa;
use pushpace::provider::h2pool::{H2Pool, PoolConfig, TransportError};
use pushpace::provider::tls::client_config;
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
