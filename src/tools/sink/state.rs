//! The state a sink's connections share, and how it decides each push's answer from
//! the current [`Behaviour`] (with its countdown and the quota's token bucket).

use super::bucket;
use super::log::Log;
use super::{Behaviour, BehaviourChange, RetryAfter, SinkConfig};
use hyper::StatusCode;
use parking_lot::{Mutex, MutexGuard};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// What the handle and every connection share: start instants, limits, the behaviour
/// and the log.
pub(super) struct Shared {
    pub(super) started: Instant,
    pub(super) started_wall: SystemTime,
    pub(super) started_unix: Duration,
    pub(super) keep_bodies: bool,
    pub(super) max_body_bytes: usize,
    pub(super) connections: AtomicU64,
    pub(super) control: Mutex<Control>,
    pub(super) log: Mutex<Log>,
}

pub(super) struct Control {
    pub(super) behaviour: Behaviour,
    pub(super) remaining: Option<u64>,
    pub(super) gone_prefix: Option<Arc<str>>,
    /// The token bucket of `Quota` and `SlowAbove`.
    pub(super) bucket: Option<bucket::Bucket>,
}

/// What to do with one push, decided from the behaviour when it arrives.
pub(super) enum Action {
    Answer {
        status: StatusCode,
        retry_after: Option<RetryAfter>,
    },
    Slow(Duration),
    Reset,
}

impl Control {
    /// One token of the quota's bucket (a new bucket when the quota changed).
    fn take_token(&mut self, per_second: u64, burst: u64) -> bool {
        if !self
            .bucket
            .as_ref()
            .is_some_and(|b| b.is_for(per_second, burst))
        {
            self.bucket = Some(bucket::Bucket::new(per_second, burst));
        }
        self.bucket.as_mut().is_some_and(|b| b.take(Instant::now()))
    }
}

impl Shared {
    pub(super) fn new(config: &SinkConfig) -> Self {
        let started_wall = SystemTime::now();
        Self {
            started: Instant::now(),
            started_wall,
            started_unix: started_wall.duration_since(UNIX_EPOCH).unwrap_or_default(),
            keep_bodies: config.keep_bodies,
            max_body_bytes: config.max_body_bytes,
            connections: AtomicU64::new(0),
            control: Mutex::new(Control {
                behaviour: config.behaviour.clone(),
                remaining: None,
                bucket: None,
                gone_prefix: config
                    .gone_prefix
                    .as_deref()
                    .filter(|p| !p.is_empty())
                    .map(Arc::from),
            }),
            log: Mutex::new(Log::default()),
        }
    }

    // parking_lot locks are not poisoned: a panic while holding one leaves plain data
    // behind, and the sink keeps serving.
    pub(super) fn control(&self) -> MutexGuard<'_, Control> {
        self.control.lock()
    }

    pub(super) fn log(&self) -> MutexGuard<'_, Log> {
        self.log.lock()
    }

    pub(super) fn apply(&self, change: BehaviourChange) {
        let mut control = self.control();
        if let Some(b) = change.behaviour {
            control.behaviour = b;
            control.remaining = change.for_requests;
        } else if change.for_requests.is_some() {
            control.remaining = change.for_requests;
        }
        if let Some(prefix) = change.gone_prefix {
            control.gone_prefix = (!prefix.is_empty()).then(|| Arc::from(prefix));
        }
    }

    pub(super) fn decide(&self, token: &str) -> Action {
        let mut control = self.control();
        let behaviour = control.behaviour.clone();
        if behaviour != Behaviour::Normal {
            if let Some(left) = control.remaining.as_mut() {
                *left = left.saturating_sub(1);
                if *left == 0 {
                    control.behaviour = Behaviour::Normal;
                    control.remaining = None;
                }
            }
        }
        let normal = |control: &Control| {
            let gone = control
                .gone_prefix
                .as_deref()
                .is_some_and(|p| token.starts_with(p));
            Action::Answer {
                status: if gone {
                    StatusCode::GONE
                } else {
                    StatusCode::OK
                },
                retry_after: None,
            }
        };
        match behaviour {
            Behaviour::Normal => normal(&control),
            Behaviour::Quota {
                per_second,
                burst,
                retry_after,
            } => {
                if control.take_token(per_second, burst) {
                    normal(&control)
                } else {
                    Action::Answer {
                        status: StatusCode::TOO_MANY_REQUESTS,
                        retry_after,
                    }
                }
            }
            Behaviour::SlowAbove {
                per_second,
                burst,
                delay_ms,
            } => {
                if control.take_token(per_second, burst) {
                    normal(&control)
                } else {
                    Action::Slow(Duration::from_millis(delay_ms))
                }
            }
            Behaviour::TooManyRequests { retry_after } => Action::Answer {
                status: StatusCode::TOO_MANY_REQUESTS,
                retry_after,
            },
            Behaviour::ServerError => Action::Answer {
                status: StatusCode::INTERNAL_SERVER_ERROR,
                retry_after: None,
            },
            Behaviour::Slow { delay_ms } => Action::Slow(Duration::from_millis(delay_ms)),
            Behaviour::Reset => Action::Reset,
        }
    }
}
