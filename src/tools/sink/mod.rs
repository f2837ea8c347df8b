//! A loopback HTTP sink standing in for the push provider, for the demo, tests and benchmarks.
//!
//! It accepts the requests of [`crate::sender::HttpSender`] (HTTP/1.1, or HTTP/2 with
//! prior knowledge), timestamps each one on arrival, and answers as its [`Behaviour`]
//! says: 200, 429 with Retry-After, 500, a slow answer, or a dropped connection, plus
//! 410 for tokens with a given prefix. From the arrivals it reports what a provider would
//! see: requests per campaign per second, the most requests in any 1 s window, the
//! distinct (job, device) pairs delivered, and duplicates (a pair delivered twice,
//! counted by its `Idempotency-Key`).
//!
//! Recording takes a mutex per request: this is test tooling, not the hot path. Memory
//! grows with every request recorded, so a long soak should use a fresh sink per phase
//! or call [`SinkHandle::clear`].
//!
//! A sink run as its own process ([`serve_until`]) is inspected and steered over HTTP:
//! `GET /_sink/stats` returns the [`SinkSummary`] as JSON, and `PUT /_sink/behaviour`
//! takes a [`BehaviourChange`]. Every other `POST` is a push.

mod bucket;
mod counting;
mod handle;
mod log;
mod server;
mod state;

pub use bucket::Bucket;
pub use counting::{serve_counting_until, CountingSummary};
pub use handle::{serve_until, Sink, SinkHandle};

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

/// Errors starting the sink.
#[derive(Debug, thiserror::Error)]
pub enum SinkError {
    #[error("cannot bind the sink to {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("sink i/o error: {0}")]
    Io(#[from] std::io::Error),
}

/// How the sink answers pushes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum Behaviour {
    /// 200, except 410 for tokens with the gone prefix.
    #[default]
    Normal,
    /// 429, with an optional Retry-After header.
    TooManyRequests { retry_after: Option<RetryAfter> },
    /// 500.
    ServerError,
    /// Waits `delay_ms`, then answers 200 (past the sender's timeout, the sender gives up
    /// first; the push still counts as delivered if the sink gets to answer).
    Slow { delay_ms: u64 },
    /// Reads the request, then drops the connection without answering.
    Reset,
    /// A hidden quota: `per_second` pushes a second (at most `burst` at once) are
    /// answered as in `Normal`, the rest 429 with an optional Retry-After.
    Quota {
        per_second: u64,
        burst: u64,
        retry_after: Option<RetryAfter>,
    },
    /// Answers as in `Normal`, but `delay_ms` late for pushes beyond `per_second` a
    /// second (at most `burst` at once): a provider queueing past its capacity.
    SlowAbove {
        per_second: u64,
        burst: u64,
        delay_ms: u64,
    },
}

/// The form of a Retry-After header.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RetryAfter {
    /// `Retry-After: <n>`.
    Seconds(u64),
    /// `Retry-After: <HTTP-date n seconds from now>`.
    DateIn(u64),
}

/// A change of behaviour, as taken by [`SinkHandle::apply`] and `PUT /_sink/behaviour`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct BehaviourChange {
    /// The new behaviour; unchanged when absent.
    #[serde(default)]
    pub behaviour: Option<Behaviour>,
    /// Apply the behaviour to this many pushes only, then return to `Normal`.
    #[serde(default)]
    pub for_requests: Option<u64>,
    /// Answer 410 to tokens starting with this prefix (`""` turns it off); unchanged when absent.
    #[serde(default)]
    pub gone_prefix: Option<String>,
}

/// Settings of a sink.
#[derive(Debug, Clone)]
pub struct SinkConfig {
    /// Where to listen; port 0 picks a free one.
    pub bind: SocketAddr,
    /// The behaviour at start.
    pub behaviour: Behaviour,
    /// Tokens starting with this get 410 Gone (a permanently unregistered device).
    pub gone_prefix: Option<String>,
    /// Keep each request's body (for byte-exact checks); off by default to save memory.
    pub keep_bodies: bool,
    /// Larger request bodies get 413.
    pub max_body_bytes: usize,
}

impl Default for SinkConfig {
    fn default() -> Self {
        Self {
            bind: SocketAddr::from(([127, 0, 0, 1], 0)),
            behaviour: Behaviour::Normal,
            gone_prefix: None,
            keep_bodies: false,
            max_body_bytes: 64 * 1024,
        }
    }
}

/// One push as the sink received it.
#[derive(Debug, Clone)]
pub struct Arrival {
    pub campaign_id: Arc<str>,
    pub job_id: Arc<str>,
    pub device_token: String,
    pub idempotency_key: Option<String>,
    /// Time since the sink started (monotonic).
    pub at: Duration,
    /// When the worker released the push, on the same scale as `at` (from its
    /// `x-pushpace-sent-at` header, wall clock, µs): pacing measured without the
    /// transport's jitter.
    pub released: Option<Duration>,
    /// Wall-clock time of arrival (the sink's start time plus `at`).
    pub wall: SystemTime,
    /// The status answered, or `None` when the connection was dropped or the client
    /// went away before a slow answer.
    pub status: Option<u16>,
    /// The raw body, when [`SinkConfig::keep_bodies`] is on.
    pub body: Option<Bytes>,
}

/// Pushes of one campaign in one wall-clock second.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SecondCount {
    /// Seconds since the Unix epoch.
    pub unix_second: u64,
    /// Every push that arrived, whatever the answer (retries included).
    pub requests: u64,
    /// Pushes answered 2xx.
    pub delivered: u64,
}

/// What the sink saw of one campaign.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
pub struct CampaignSummary {
    pub campaign_id: String,
    /// Every push that arrived, whatever the answer.
    pub requests: u64,
    /// Pushes answered 2xx.
    pub delivered: u64,
    /// Distinct (job, device) pairs answered 2xx.
    pub distinct_delivered: u64,
    /// 2xx answers for a pair that had already been delivered.
    pub duplicates: u64,
    /// The most pushes (of any answer) in any 1 s window, from arrival timestamps.
    pub max_in_any_second: u64,
    /// First and last arrival, in ms since the sink started.
    pub first_ms: f64,
    pub last_ms: f64,
    /// Requests per second between the first and the last arrival.
    pub mean_rate: f64,
}

/// What the sink saw, per campaign and in total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SinkSummary {
    pub requests: u64,
    pub delivered: u64,
    pub distinct_delivered: u64,
    pub duplicates: u64,
    /// Requests whose body was not a push (bad JSON, missing fields, too large).
    pub malformed: u64,
    /// TCP connections accepted.
    pub connections: u64,
    pub campaigns: Vec<CampaignSummary>,
}
