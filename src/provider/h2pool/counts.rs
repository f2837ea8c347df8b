//! How the pool's sends ended below the answer: the figures that tell a resend the
//! server never processed from a send that may have arrived twice.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

/// Counts kept by the pool (one relaxed add each, and a lock for the first lost reason;
/// all off the answered path).
#[derive(Debug, Default)]
pub(super) struct Counters {
    resent: AtomicU64,
    lost: AtomicU64,
    timed_out: AtomicU64,
    gave_up: AtomicU64,
    /// Why the first lost send was lost (a lost send is rare: the lock is off the
    /// answered path), for a failure to say what the connection did.
    first_lost: Mutex<Option<String>>,
}

/// A snapshot of [`Counters`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransportCounts {
    /// Tries sent again on another connection: the server did not process them
    /// (above a GOAWAY's last stream id, REFUSED_STREAM) or they never left.
    pub resent: u64,
    /// Sends whose connection failed after the request left: they may have been
    /// processed, and the scheduler sends them again.
    pub lost: u64,
    /// Sends with no answer within the send timeout (also sent again).
    pub timed_out: u64,
    /// Sends given up after [`super::MAX_TRIES`] refusals or [`super::MAX_ATTEMPTS`]
    /// attempts without a connection to leave on; the scheduler sends them again later.
    pub gave_up: u64,
}

impl Counters {
    pub(super) fn resent(&self) {
        self.resent.fetch_add(1, Relaxed);
    }

    pub(super) fn lost(&self, reason: &str) {
        self.lost.fetch_add(1, Relaxed);
        self.first_lost
            .lock()
            .get_or_insert_with(|| reason.to_string());
    }

    pub(super) fn first_lost(&self) -> Option<String> {
        self.first_lost.lock().clone()
    }

    pub(super) fn timed_out(&self) {
        self.timed_out.fetch_add(1, Relaxed);
    }

    pub(super) fn gave_up(&self) {
        self.gave_up.fetch_add(1, Relaxed);
    }

    pub(super) fn snapshot(&self) -> TransportCounts {
        TransportCounts {
            resent: self.resent.load(Relaxed),
            lost: self.lost.load(Relaxed),
            timed_out: self.timed_out.load(Relaxed),
            gave_up: self.gave_up.load(Relaxed),
        }
    }
}
