//! The congestion signal an answer carries: the classes the adaptive ceiling
//! (`provider::ceiling`) and the metrics count. It lives with [`super::SendOutcome`],
//! which carries it, so that the senders need nothing from the layers above them.

/// What made a second congested.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Signal {
    /// 429, FCM `QUOTA_EXCEEDED`.
    Throttled = 0,
    /// 503 and other 5xx, FCM `UNAVAILABLE`.
    Unavailable = 1,
    /// No answer in time.
    Timeout = 2,
    /// The connection failed or was lost.
    Connection = 3,
    /// The second's p95 latency passed the target.
    Latency = 4,
    /// The provider asked for a pause (`Retry-After`).
    RetryAfter = 5,
}

/// The number of [`Signal`]s.
pub const SIGNALS: usize = 6;

impl Signal {
    pub const ALL: [Signal; SIGNALS] = [
        Signal::Throttled,
        Signal::Unavailable,
        Signal::Timeout,
        Signal::Connection,
        Signal::Latency,
        Signal::RetryAfter,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Signal::Throttled => "throttled",
            Signal::Unavailable => "unavailable",
            Signal::Timeout => "timeout",
            Signal::Connection => "connection",
            Signal::Latency => "latency",
            Signal::RetryAfter => "retry_after",
        }
    }
}
