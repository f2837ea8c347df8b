//! The counting sink of `pushpace sink --count-only`, for throughput benchmarks.

use super::SinkError;
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE};
use hyper::{Method, Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// What the counting sink saw.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct CountingSummary {
    pub requests: u64,
    pub bytes: u64,
    pub connections: u64,
}

#[derive(Default)]
struct Counters {
    requests: AtomicU64,
    bytes: AtomicU64,
    connections: AtomicU64,
}

/// A sink for throughput benchmarks (`pushpace sink --count-only`): it reads each push,
/// counts it and answers 200, recording nothing else, so that the sink is not what limits
/// the measurement. `GET /_sink/stats` returns the [`CountingSummary`].
pub async fn serve_counting_until(
    bind: SocketAddr,
    shutdown: impl Future<Output = ()> + Send,
) -> Result<CountingSummary, SinkError> {
    let listener = TcpListener::bind(bind)
        .await
        .map_err(|source| SinkError::Bind { addr: bind, source })?;
    tracing::info!(addr = %listener.local_addr()?, "counting sink listening");
    let counters = Arc::new(Counters::default());
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    counters.connections.fetch_add(1, Ordering::Relaxed);
                    let _ = stream.set_nodelay(true);
                    let c = Arc::clone(&counters);
                    let service = hyper::service::service_fn(move |req| count(Arc::clone(&c), req));
                    connections.spawn(async move {
                        let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    });
                }
                Err(e) => {
                    tracing::warn!(error = %e, "sink accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    connections.abort_all();
    Ok(counters.summary())
}

impl Counters {
    fn summary(&self) -> CountingSummary {
        CountingSummary {
            requests: self.requests.load(Ordering::Relaxed),
            bytes: self.bytes.load(Ordering::Relaxed),
            connections: self.connections.load(Ordering::Relaxed),
        }
    }
}

async fn count(
    counters: Arc<Counters>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, hyper::Error> {
    if req.method() == Method::GET && req.uri().path() == "/_sink/stats" {
        let body = serde_json::to_vec(&counters.summary()).unwrap_or_default();
        let mut resp = Response::new(Full::new(Bytes::from(body)));
        resp.headers_mut()
            .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        return Ok(resp);
    }
    let body = req.into_body().collect().await?.to_bytes();
    counters.requests.fetch_add(1, Ordering::Relaxed);
    counters
        .bytes
        .fetch_add(body.len() as u64, Ordering::Relaxed);
    Ok(Response::new(Full::new(Bytes::new())))
}
