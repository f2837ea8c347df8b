//! The sink's HTTP side: accepting connections, the `/_sink` control routes, and
//! answering each push as the state decided.

use super::log::Meta;
use super::state::{Action, Shared};
use super::{BehaviourChange, RetryAfter};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{HeaderValue, CONTENT_TYPE, RETRY_AFTER};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioExecutor, TokioIo};
use serde::{Deserialize, Serialize};
use std::borrow::Cow;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;
use tokio::task::JoinSet;

/// The body the sender posts. Strings borrow from the request when they have no escapes.
#[derive(Deserialize)]
pub(super) struct PushBody<'a> {
    #[serde(borrow)]
    pub(super) campaign_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) job_id: Cow<'a, str>,
    #[serde(borrow)]
    pub(super) device_token: Cow<'a, str>,
    #[allow(dead_code)]
    #[serde(borrow)]
    payload: &'a serde_json::value::RawValue,
}

/// Makes hyper drop the connection without an answer.
#[derive(Debug)]
struct DropConnection;

impl std::fmt::Display for DropConnection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped on purpose")
    }
}

impl std::error::Error for DropConnection {}

type SinkResponse = Response<Full<Bytes>>;

pub(super) async fn accept_loop(
    listener: TcpListener,
    shared: Arc<Shared>,
    mut stop: oneshot::Receiver<()>,
) {
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            // A send or a dropped handle both mean stop.
            _ = &mut stop => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => {
                    shared.connections.fetch_add(1, Ordering::Relaxed);
                    connections.spawn(serve_connection(stream, Arc::clone(&shared)));
                }
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "sink accept failed");
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
            }
        }
    }
    connections.abort_all();
    while connections.join_next().await.is_some() {}
}

async fn serve_connection(stream: TcpStream, shared: Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let service = hyper::service::service_fn(move |req| handle(Arc::clone(&shared), req));
    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn handle(
    shared: Arc<Shared>,
    req: Request<Incoming>,
) -> Result<SinkResponse, DropConnection> {
    match (req.method(), req.uri().path()) {
        (&Method::GET, "/_sink/stats") => Ok(json_response(&shared.summary())),
        (&Method::PUT, "/_sink/behaviour") => {
            let body = match read_body(req, shared.max_body_bytes).await {
                Ok(b) => b,
                Err(status) => return Ok(text(status, "unreadable body")),
            };
            match serde_json::from_slice::<BehaviourChange>(&body) {
                Ok(change) => {
                    shared.apply(change);
                    Ok(text(StatusCode::OK, "ok"))
                }
                Err(e) => Ok(text(
                    StatusCode::BAD_REQUEST,
                    &format!("bad behaviour: {e}"),
                )),
            }
        }
        (&Method::POST, _) => push(shared, req).await,
        _ => Ok(text(StatusCode::METHOD_NOT_ALLOWED, "POST a push")),
    }
}

async fn read_body(req: Request<Incoming>, limit: usize) -> Result<Bytes, StatusCode> {
    match Limited::new(req.into_body(), limit).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(StatusCode::PAYLOAD_TOO_LARGE),
        Err(_) => Err(StatusCode::BAD_REQUEST),
    }
}

async fn push(shared: Arc<Shared>, req: Request<Incoming>) -> Result<SinkResponse, DropConnection> {
    let header = |name: &str| req.headers().get(name).and_then(|v| v.to_str().ok());
    let key = Meta {
        key: header("idempotency-key").map(Box::<str>::from),
        sent_at_us: header(crate::sender::SENT_AT).and_then(|v| v.parse().ok()),
    };
    let body = match read_body(req, shared.max_body_bytes).await {
        Ok(b) => b,
        Err(status) => {
            shared.log().malformed += 1;
            return Ok(text(status, "body too large or unreadable"));
        }
    };
    let parsed: PushBody<'_> = match serde_json::from_slice(&body) {
        Ok(p) => p,
        Err(e) => {
            shared.log().malformed += 1;
            return Ok(text(StatusCode::BAD_REQUEST, &format!("not a push: {e}")));
        }
    };
    let action = shared.decide(&parsed.device_token);
    let kept = shared.keep_bodies.then(|| body.clone());
    match action {
        Action::Answer {
            status,
            retry_after,
        } => {
            shared.record(&parsed, key, kept, Some(status.as_u16()));
            let mut response = text(status, answer_text(status));
            if let Some(ra) = retry_after {
                let value = match ra {
                    RetryAfter::Seconds(s) => s.to_string(),
                    RetryAfter::DateIn(s) => {
                        httpdate::fmt_http_date(SystemTime::now() + Duration::from_secs(s))
                    }
                };
                if let Ok(v) = HeaderValue::from_str(&value) {
                    response.headers_mut().insert(RETRY_AFTER, v);
                }
            }
            Ok(response)
        }
        Action::Slow(delay) => {
            let index = shared.record(&parsed, key, kept, None);
            drop(parsed);
            tokio::time::sleep(delay).await;
            shared.complete(index, 200);
            Ok(text(StatusCode::OK, answer_text(StatusCode::OK)))
        }
        Action::Reset => {
            shared.record(&parsed, key, kept, None);
            Err(DropConnection)
        }
    }
}

fn answer_text(status: StatusCode) -> &'static str {
    match status {
        StatusCode::OK => "{\"status\":\"delivered\"}",
        StatusCode::GONE => {
            "{\"error\":\"Unregistered\",\"message\":\"device token is not registered\"}"
        }
        StatusCode::TOO_MANY_REQUESTS => {
            "{\"error\":\"TooManyRequests\",\"message\":\"rate limited (simulated)\"}"
        }
        _ => "{\"error\":\"Internal\",\"message\":\"provider failure (simulated)\"}",
    }
}

fn text(status: StatusCode, body: &str) -> SinkResponse {
    let mut response = Response::new(Full::new(Bytes::copy_from_slice(body.as_bytes())));
    *response.status_mut() = status;
    let content_type = if body.starts_with('{') {
        "application/json"
    } else {
        "text/plain; charset=utf-8"
    };
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

fn json_response<T: Serialize>(value: &T) -> SinkResponse {
    match serde_json::to_vec(value) {
        Ok(bytes) => {
            let mut response = Response::new(Full::new(Bytes::from(bytes)));
            response
                .headers_mut()
                .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
            response
        }
        Err(e) => text(StatusCode::INTERNAL_SERVER_ERROR, &e.to_string()),
    }
}
