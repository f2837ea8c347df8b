//! Senders: deliver one notification to one device (HTTP provider, or null for benchmarks).
//!
//! The scheduler calls [`Sender::send`] once per permit and does not wait for the
//! answer in its turn; it decides about retries from the [`SendOutcome`] (each retry
//! takes a new limiter permit, with [`retry_delay`] between attempts). Senders never
//! retry by themselves, so that retries can never push a campaign over its rate.
//!
//! [`SendFuture`] is an enum rather than a boxed future so that the [`NullSender`] costs
//! no allocation per send: its future is ready at once and can be unwrapped with
//! [`SendFuture::into_ready`] without being polled or spawned.

mod h2c;
mod http;
mod http1;
mod null;
mod retry;

pub use http::{push_body, Http1Client, HttpSender, HttpSenderConfig};
pub use null::NullSender;
pub use retry::{backoff_ceiling, parse_retry_after, retry_delay, MAX_RETRY_AFTER};

use crate::job::Job;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// What became of one send.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The provider accepted it (2xx).
    Delivered,
    /// Try again later: 429, 5xx, a timeout or a connection error. `after` is the
    /// provider's Retry-After, when it gave one.
    Retry {
        after: Option<Duration>,
        reason: String,
    },
    /// Will never succeed (another 4xx, or a request that cannot be built): dead-letter it.
    Failed { status: Option<u16>, reason: String },
}

impl SendOutcome {
    pub fn is_delivered(&self) -> bool {
        matches!(self, SendOutcome::Delivered)
    }
}

/// Errors setting up a sender.
#[derive(Debug, thiserror::Error)]
pub enum SenderError {
    #[error("invalid sender url {url:?}: {reason}")]
    InvalidUrl { url: String, reason: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
}

/// The future of one send. `Send + 'static`, so it can be spawned or put in a
/// `FuturesUnordered`.
pub struct SendFuture(Inner);

enum Inner {
    Ready(std::future::Ready<SendOutcome>),
    Boxed(Pin<Box<dyn Future<Output = SendOutcome> + Send + 'static>>),
}

impl SendFuture {
    /// A future that is already complete (no allocation).
    pub fn ready(outcome: SendOutcome) -> Self {
        SendFuture(Inner::Ready(std::future::ready(outcome)))
    }

    /// Wraps a real asynchronous send.
    pub fn boxed(f: impl Future<Output = SendOutcome> + Send + 'static) -> Self {
        SendFuture(Inner::Boxed(Box::pin(f)))
    }

    /// The outcome at once when the send already completed (null sender, or a request
    /// refused before it left); otherwise the future itself, to be awaited.
    pub fn into_ready(self) -> Result<SendOutcome, SendFuture> {
        match self.0 {
            Inner::Ready(r) => Ok(r.into_inner()),
            boxed @ Inner::Boxed(_) => Err(SendFuture(boxed)),
        }
    }
}

impl Future for SendFuture {
    type Output = SendOutcome;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<SendOutcome> {
        match &mut self.0 {
            Inner::Ready(r) => Pin::new(r).poll(cx),
            Inner::Boxed(f) => f.as_mut().poll(cx),
        }
    }
}

impl std::fmt::Debug for SendFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.0 {
            Inner::Ready(_) => f.write_str("SendFuture::Ready"),
            Inner::Boxed(_) => f.write_str("SendFuture::Boxed"),
        }
    }
}

/// Delivers one notification to one device.
pub trait Sender: Send + Sync {
    /// Sends `job.devices[device_index]`. An index out of range yields `Failed`.
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture;

    /// `"http"` or `"null"`.
    fn name(&self) -> &'static str;
}

/// Static dispatch over the senders pushpace has, so the scheduler needs no `dyn`.
#[derive(Debug, Clone)]
pub enum AnySender {
    Null(NullSender),
    Http(HttpSender),
}

impl Sender for AnySender {
    #[inline]
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        match self {
            AnySender::Null(s) => s.send(job, device_index),
            AnySender::Http(s) => s.send(job, device_index),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AnySender::Null(s) => s.name(),
            AnySender::Http(s) => s.name(),
        }
    }
}

impl From<NullSender> for AnySender {
    fn from(s: NullSender) -> Self {
        AnySender::Null(s)
    }
}

impl From<HttpSender> for AnySender {
    fn from(s: HttpSender) -> Self {
        AnySender::Http(s)
    }
}

/// The `Failed` outcome for a device index past the end of the job's list.
fn no_such_device(job: &Job, device_index: usize) -> SendOutcome {
    SendOutcome::Failed {
        status: None,
        reason: format!(
            "device index {device_index} is out of range: job {} has {} devices",
            job.job_id,
            job.devices.len()
        ),
    }
}
