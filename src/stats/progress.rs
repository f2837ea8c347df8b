//! Job progress handles: the scheduler sets how many devices of a job are done, the
//! flusher writes it with the counts.

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Arc;

/// Which job, where it came from and how many devices it has.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JobKey {
    pub job_id: String,
    pub campaign_id: String,
    pub partition: i32,
    pub offset: i64,
    pub devices_total: u32,
}

/// "Nothing yet" for the flusher-side marks.
const NONE: u64 = u64::MAX;

pub(crate) struct JobCell {
    pub(crate) job_id: Arc<str>,
    pub(crate) campaign_id: Arc<str>,
    pub(crate) partition: i32,
    pub(crate) offset: i64,
    pub(crate) total: u32,
    done: AtomicU32,
    /// Last value handed to the flusher's buffer (flusher only).
    queued: AtomicU64,
    /// Last value committed to the database (flusher only).
    durable: AtomicU64,
    released: AtomicBool,
}

impl JobCell {
    pub(crate) fn new(key: JobKey) -> Self {
        Self {
            job_id: Arc::from(key.job_id),
            campaign_id: Arc::from(key.campaign_id),
            partition: key.partition,
            offset: key.offset,
            total: key.devices_total,
            done: AtomicU32::new(0),
            queued: AtomicU64::new(NONE),
            durable: AtomicU64::new(NONE),
            released: AtomicBool::new(false),
        }
    }

    pub(crate) fn done(&self) -> u32 {
        self.done.load(Ordering::Acquire)
    }

    /// The value to queue for writing, if it changed since the last one queued.
    pub(crate) fn take_change(&self) -> Option<u32> {
        let done = self.done();
        let queued = self.queued.load(Ordering::Relaxed);
        if queued != NONE && u64::from(done) <= queued {
            return None;
        }
        self.queued.store(u64::from(done), Ordering::Relaxed);
        Some(done)
    }

    pub(crate) fn mark_durable(&self, done: u32) {
        let done = u64::from(done);
        let prev = self.durable.load(Ordering::Relaxed);
        if prev == NONE || done > prev {
            self.durable.store(done, Ordering::Release);
        }
    }

    pub(crate) fn durable(&self) -> Option<u32> {
        match self.durable.load(Ordering::Acquire) {
            NONE => None,
            // Never above u32::MAX: it is always set from a u32.
            v => Some(u32::try_from(v).unwrap_or(u32::MAX)),
        }
    }

    /// Whether the flusher can forget this job: its completion is durable, or its
    /// handle is gone and its last value is durable.
    pub(crate) fn finished(&self) -> bool {
        match self.durable() {
            None => false,
            Some(durable) => {
                durable >= self.total
                    || (self.released.load(Ordering::Acquire) && durable >= self.done())
            }
        }
    }
}

/// A tracked job. Setting progress is one atomic operation.
pub struct JobProgressHandle {
    cell: Arc<JobCell>,
}

impl std::fmt::Debug for JobProgressHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JobProgressHandle")
            .field("job_id", &self.cell.job_id)
            .field("done", &self.done())
            .field("durable", &self.durable_done())
            .finish()
    }
}

impl JobProgressHandle {
    pub(crate) fn new(cell: Arc<JobCell>) -> Self {
        Self { cell }
    }

    /// Sets how many devices, in job order, are finished. Progress only moves forward
    /// (a smaller value is ignored) and is capped at the job's device count.
    #[inline]
    pub fn set_done(&self, devices_done: u32) {
        self.cell
            .done
            .fetch_max(devices_done.min(self.cell.total), Ordering::AcqRel);
    }

    /// The devices finished so far, in memory.
    pub fn done(&self) -> u32 {
        self.cell.done()
    }

    /// The devices finished as last committed to the database, if any flush has
    /// written this job. The job's Kafka offset can be stored once this equals
    /// [`devices_total`](Self::devices_total): its counts are durable too.
    pub fn durable_done(&self) -> Option<u32> {
        self.cell.durable()
    }

    /// Whether the job's completion is committed.
    pub fn is_durably_complete(&self) -> bool {
        self.durable_done().is_some_and(|d| d >= self.cell.total)
    }

    pub fn devices_total(&self) -> u32 {
        self.cell.total
    }

    pub fn job_id(&self) -> &str {
        &self.cell.job_id
    }
}

impl Drop for JobProgressHandle {
    fn drop(&mut self) {
        self.cell.released.store(true, Ordering::Release);
    }
}
