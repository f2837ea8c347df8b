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
mod signal;
mod wire;

pub use http::{push_body, Http1Client, HttpSender, HttpSenderConfig};
pub use null::NullSender;
pub use retry::{backoff_ceiling, parse_retry_after, retry_delay, MAX_RETRY_AFTER};
pub use signal::{Signal, SIGNALS};
pub use wire::SENT_AT;

use crate::job::Job;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

/// What became of one send: the one vocabulary every provider's answer is mapped to
/// (docs/PROVIDERS.md has each provider's table). The scheduler acts on the class, never
/// on a provider's status code.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SendOutcome {
    /// The provider accepted it.
    Delivered,
    /// The token will not work again through this provider (APNs 410 `Unregistered`, FCM
    /// `UNREGISTERED`, Web Push 404/410, webhook 410): recorded in `invalid_tokens` under
    /// the provider, until `hygiene.invalid_ttl` passes; counted `invalid`, and the device
    /// is finished without a dead letter.
    DeadToken { reason: String },
    /// Too many sends to this one device (APNs 429 `TooManyRequests`): that device alone
    /// is retried after `after`; the campaign keeps sending.
    RetryDevice {
        after: Option<Duration>,
        reason: String,
    },
    /// The provider is failing or busy (5xx, quota, timeout, a connection error): try
    /// again after `after` (the provider's `retry-after`, when it gave one). Every retry
    /// takes a new permit.
    RetryProvider {
        after: Option<Duration>,
        reason: String,
        /// What it says of the provider's load, for its adaptive ceiling (`None`: it
        /// says nothing, e.g. the OAuth endpoint is down).
        signal: Option<Signal>,
    },
    /// Permanent for this device only (a request that can never be accepted):
    /// dead-lettered with the provider's reason.
    Rejected { status: Option<u16>, reason: String },
    /// A per-device answer that means a configuration error when most of a campaign's
    /// first sends get it (APNs `BadDeviceToken`: a sandbox/production mismatch; FCM
    /// `SENDER_ID_MISMATCH`). The scheduler holds such devices until it knows which;
    /// `dead_token` says what the device is when it turns out to be only that device.
    Mismatch { dead_token: bool, reason: String },
    /// A configuration error: the campaign (or, with [`HaltScope::Provider`], every
    /// campaign on this provider) stops sending until an operator resumes it. The device
    /// is not finished and nothing is dead-lettered because of the halt. With
    /// [`HaltScope::Majority`] it is one only when most of the campaign's recent answers
    /// from the device's origin say so; otherwise the device alone is rejected.
    Halt { scope: HaltScope, reason: String },
}

/// Who a [`SendOutcome::Halt`] stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HaltScope {
    /// This campaign's jobs are wrong for the provider (payload, push type, priority…).
    Campaign,
    /// The provider's own configuration is wrong (key, topic, credentials): every
    /// campaign that sends through it.
    Provider,
    /// An answer that real services give per device as well (Web Push 401/403/413, FCM
    /// `THIRD_PARTY_AUTH_ERROR`): the campaign halts only when most of its recent answers
    /// from the device's origin carry it; else the device is dead-lettered with `reason`.
    Majority,
}

impl SendOutcome {
    pub fn is_delivered(&self) -> bool {
        matches!(self, SendOutcome::Delivered)
    }

    /// A short class name for metrics and logs.
    pub fn class(&self) -> &'static str {
        match self {
            SendOutcome::Delivered => "delivered",
            SendOutcome::DeadToken { .. } => "dead_token",
            SendOutcome::RetryDevice { .. } => "retry_device",
            SendOutcome::RetryProvider { .. } => "retry_provider",
            SendOutcome::Rejected { .. } => "rejected",
            SendOutcome::Mismatch { .. } => "mismatch",
            SendOutcome::Halt { .. } => "halt",
        }
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

    /// `"http"`, `"null"`, `"apns"`, `"fcm"` or `"webpush"`.
    fn name(&self) -> &'static str;
}

/// Static dispatch over the senders pushpace has, so the null sender costs no `dyn`.
#[derive(Clone)]
pub enum AnySender {
    Null(NullSender),
    Http(HttpSender),
    /// A push provider's adapter ([`crate::provider`]): APNs, FCM or Web Push. Its sends
    /// are real network exchanges (a boxed future each), so one more indirection is lost
    /// in them.
    Provider(Arc<dyn Sender>),
}

impl std::fmt::Debug for AnySender {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AnySender::Null(s) => s.fmt(f),
            AnySender::Http(s) => s.fmt(f),
            AnySender::Provider(s) => write!(f, "Provider({})", s.name()),
        }
    }
}

impl Sender for AnySender {
    #[inline]
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        match self {
            AnySender::Null(s) => s.send(job, device_index),
            AnySender::Http(s) => s.send(job, device_index),
            AnySender::Provider(s) => s.send(job, device_index),
        }
    }

    fn name(&self) -> &'static str {
        match self {
            AnySender::Null(s) => s.name(),
            AnySender::Http(s) => s.name(),
            AnySender::Provider(s) => s.name(),
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
    SendOutcome::Rejected {
        status: None,
        reason: format!(
            "device index {device_index} is out of range: job {} has {} devices",
            job.job_id,
            job.devices.len()
        ),
    }
}
