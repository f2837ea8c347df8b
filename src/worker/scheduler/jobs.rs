//! A job the scheduler holds: its send cursor and the finished bitmap (a bit per
//! device), and a device waiting for its retry.

use super::*;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) struct RetryItem {
    pub(super) not_before: Nanos,
    pub(super) slot: u32,
    pub(super) device: u32,
    pub(super) attempt: u32,
    pub(super) first_failed: Nanos,
}

pub(super) struct ActiveJob {
    pub(super) job: Arc<Job>,
    /// Its devices: kept here, since every turn asks, and reading it from `job` costs a
    /// cache miss per turn with a thousand campaigns' jobs about.
    pub(super) total: u32,
    pub(super) campaign: u32,
    pub(super) partition: i32,
    pub(super) offset: i64,
    /// The next device never dispatched.
    pub(super) next: u32,
    /// One bit per device: finished.
    pub(super) done: Vec<u64>,
    pub(super) done_count: u32,
    /// Devices 0..done_prefix are all finished.
    pub(super) done_prefix: u32,
    pub(super) in_flight: u32,
    pub(super) progress: JobProgressHandle,
    /// Devices at or after `next` already marked done (skipped invalid tokens).
    pub(super) done_ahead: u32,
    /// `next`, published for the consumer's lookahead (one relaxed store per send).
    pub(super) dispatched: Arc<AtomicU32>,
    /// Its expiry or cancel, once one applies.
    pub(super) ended: lifecycle::JobEnd,
    /// When its zone's send window closes (unix ms), while it is queued in one.
    pub(super) closes_ms: Option<i64>,
}

impl ActiveJob {
    pub(super) fn total(&self) -> u32 {
        self.total
    }

    pub(super) fn is_done(&self, i: u32) -> bool {
        self.done[(i / 64) as usize] & (1 << (i % 64)) != 0
    }

    pub(super) fn mark_done(&mut self, i: u32) {
        self.done[(i / 64) as usize] |= 1 << (i % 64);
        self.done_count += 1;
        self.progress.mark(i);
        let before = self.done_prefix;
        while self.done_prefix < self.total() && self.is_done(self.done_prefix) {
            self.done_prefix += 1;
        }
        if self.done_prefix != before {
            self.progress.set_done(self.done_prefix);
        }
    }
}
