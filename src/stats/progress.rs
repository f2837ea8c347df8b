//! Job progress handles: the scheduler marks each finished device and sets the contiguous
//! finished prefix; the flusher writes both with the counts.
//!
//! A finished device is one bit in the job's bitmap (two stores by the job's one writer),
//! so what is written is the whole finished set, not only the prefix: a device that keeps
//! retrying does not hold back what a crash would re-send.

use crate::store::progress::set_bits;
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
    /// One bit per device (bit `i % 64` of word `i / 64`): finished.
    bits: Box<[AtomicU64]>,
    /// Bits set so far, so that the flusher sees a change without scanning.
    marked: AtomicU32,
    /// Last prefix handed to the flusher's buffer (flusher only).
    queued: AtomicU64,
    /// `marked` as of the last snapshot handed to the flusher (flusher only).
    queued_marked: AtomicU32,
    /// Last prefix committed to the database (flusher only).
    durable: AtomicU64,
    /// `marked` as of the last committed snapshot (flusher only).
    durable_marked: AtomicU32,
    released: AtomicBool,
}

/// A job's finished set as read by the flusher: the prefix `done`, then `after`, one bit
/// per device from `done` on (bit `k % 64` of word `k / 64` is device `done + k`), with
/// no trailing zero words.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Snapshot {
    pub(crate) done: u32,
    pub(crate) marked: u32,
    pub(crate) after: Vec<u64>,
}

impl Snapshot {
    /// The set of both (each holds only finished devices), for one job tracked twice.
    pub(crate) fn union(&mut self, other: &Snapshot) {
        let (mut keep, from) = if other.done > self.done {
            (other.clone(), &*self)
        } else {
            (self.clone(), other)
        };
        for device in set_bits(&from.after).map(|k| u64::from(from.done) + k) {
            if let Some(k) = device.checked_sub(u64::from(keep.done)) {
                set_bit(&mut keep.after, k);
            }
        }
        keep.marked = self.marked.max(other.marked);
        *self = keep;
    }

    /// `after` as a bit string in PostgreSQL's order (first device in the high bit of
    /// the first byte), trailing zero bytes dropped.
    pub(crate) fn after_bytes(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.after.len() * 8);
        for w in &self.after {
            out.extend((0..8).map(|b| ((w >> (b * 8)) as u8).reverse_bits()));
        }
        while out.last() == Some(&0) {
            out.pop();
        }
        out
    }
}

fn set_bit(words: &mut Vec<u64>, k: u64) {
    let word = (k / 64) as usize;
    if words.len() <= word {
        words.resize(word + 1, 0);
    }
    words[word] |= 1 << (k % 64);
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
            bits: (0..key.devices_total.div_ceil(64))
                .map(|_| AtomicU64::new(0))
                .collect(),
            marked: AtomicU32::new(0),
            queued: AtomicU64::new(NONE),
            queued_marked: AtomicU32::new(0),
            durable: AtomicU64::new(NONE),
            durable_marked: AtomicU32::new(0),
            released: AtomicBool::new(false),
        }
    }

    pub(crate) fn done(&self) -> u32 {
        self.done.load(Ordering::Acquire)
    }

    /// The finished set to queue for writing, if it grew since the last one queued.
    pub(crate) fn take_change(&self) -> Option<Snapshot> {
        // `marked` before the bits: a mark counted here is in the bits read below, and a
        // later one raises `marked` past what is queued, so it is seen next time.
        let marked = self.marked.load(Ordering::Acquire);
        let done = self.done();
        let queued = self.queued.load(Ordering::Relaxed);
        if queued != NONE
            && u64::from(done) <= queued
            && marked <= self.queued_marked.load(Ordering::Relaxed)
        {
            return None;
        }
        self.queued.store(u64::from(done), Ordering::Relaxed);
        self.queued_marked.store(marked, Ordering::Relaxed);
        Some(Snapshot {
            done,
            marked,
            after: self.after(done),
        })
    }

    /// The bits from device `from` on, shifted to start at bit 0, trailing zeros dropped.
    fn after(&self, from: u32) -> Vec<u64> {
        let first = (from / 64) as usize;
        let shift = from % 64;
        // Acquire: a device seen finished has its count recorded before (the scheduler
        // counts, then marks), so the counts drained after this include it.
        let word = |i: usize| self.bits.get(i).map_or(0, |w| w.load(Ordering::Acquire));
        let mut out: Vec<u64> = (first..self.bits.len())
            .map(|i| {
                let w = word(i) >> shift;
                if shift == 0 {
                    w
                } else {
                    w | (word(i + 1) << (64 - shift))
                }
            })
            .collect();
        // Bits past the job's end are never set (`mark` ignores them).
        while out.last() == Some(&0) {
            out.pop();
        }
        out
    }

    pub(crate) fn mark_durable(&self, snapshot: &Snapshot) {
        let done = u64::from(snapshot.done);
        let prev = self.durable.load(Ordering::Relaxed);
        if prev == NONE || done > prev {
            self.durable.store(done, Ordering::Release);
        }
        self.durable_marked
            .fetch_max(snapshot.marked, Ordering::AcqRel);
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
                    || (self.released.load(Ordering::Acquire)
                        && durable >= self.done()
                        && self.durable_marked.load(Ordering::Acquire)
                            >= self.marked.load(Ordering::Acquire))
            }
        }
    }
}

/// A tracked job: its progress cell's only writer. Setting progress is a store or two.
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
    ///
    /// `&mut self`: this handle is the cell's only writer of `done`, `bits` and `marked`
    /// (the flusher only reads them), so a load and a release store do what a locked
    /// read-modify-write did. A locked instruction also waited for every store before
    /// it, which with a thousand campaigns' cold lines was most of its cost.
    #[inline]
    pub fn set_done(&mut self, devices_done: u32) {
        let done = &self.cell.done;
        let v = devices_done.min(self.cell.total);
        if v > done.load(Ordering::Relaxed) {
            done.store(v, Ordering::Release);
        }
    }

    /// Brings in the shared cell a [`Self::mark`] touches (a cache hint).
    pub fn prefetch(&self) {
        crate::prefetch::line(Arc::as_ptr(&self.cell));
    }

    /// Brings in the bitmap word a [`Self::mark`] of `device` touches; reads the cell,
    /// so best after [`Self::prefetch`] had time to bring it in.
    pub fn prefetch_word(&self, device: u32) {
        if let Some(word) = self.cell.bits.get((device / 64) as usize) {
            crate::prefetch::line(word);
        }
    }

    /// Marks device `device` (its index in the job) finished: its bit and, the first
    /// time, `marked`, each a release store by the only writer (see [`Self::set_done`]).
    /// An index past the job's end is ignored. The device's counts must be recorded
    /// before, so that a flush that writes it writes them too.
    #[inline]
    pub fn mark(&mut self, device: u32) {
        if device >= self.cell.total {
            return;
        }
        let Some(word) = self.cell.bits.get((device / 64) as usize) else {
            return;
        };
        let bit = 1u64 << (device % 64);
        let bits = word.load(Ordering::Relaxed);
        if bits & bit == 0 {
            // The bit before `marked`: a flusher that reads the new `marked` (acquire)
            // reads this bit too.
            word.store(bits | bit, Ordering::Release);
            let marked = &self.cell.marked;
            marked.store(marked.load(Ordering::Relaxed) + 1, Ordering::Release);
        }
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cell(total: u32) -> (Arc<JobCell>, JobProgressHandle) {
        let cell = Arc::new(JobCell::new(JobKey {
            job_id: "j".into(),
            campaign_id: "c".into(),
            partition: 0,
            offset: 0,
            devices_total: total,
        }));
        (cell.clone(), JobProgressHandle::new(cell))
    }

    fn devices(s: &Snapshot) -> Vec<u64> {
        set_bits(&s.after).map(|k| u64::from(s.done) + k).collect()
    }

    #[test]
    fn a_snapshot_holds_the_prefix_and_the_finished_devices_after_it() {
        let (cell, mut job) = cell(200);
        for d in [0, 1, 2, 70, 130, 199] {
            job.mark(d);
        }
        job.mark(70);
        job.mark(200);
        job.set_done(3);
        let s = cell.take_change().expect("changed");
        assert_eq!((s.done, s.marked), (3, 6), "a repeated mark counts once");
        assert_eq!(devices(&s), [70, 130, 199]);
        assert_eq!(cell.take_change(), None, "nothing new");
        job.mark(5);
        assert_eq!(devices(&cell.take_change().unwrap()), [5, 70, 130, 199]);
        job.set_done(4);
        assert_eq!(
            cell.take_change().unwrap().done,
            4,
            "a prefix move is a change"
        );
    }

    #[test]
    fn the_prefix_only_moves_forward_and_stops_at_the_jobs_end() {
        let (cell, mut job) = cell(10);
        job.set_done(6);
        job.set_done(4);
        assert_eq!(cell.done(), 6, "a smaller prefix is ignored");
        job.set_done(99);
        assert_eq!(cell.done(), 10, "capped at the device count");
    }

    /// The flusher reads `marked`, then the bits, while the scheduler marks: every
    /// device a snapshot counts must be in its set, or a flush could record a count
    /// whose device it does not mark finished.
    #[test]
    fn a_snapshot_taken_while_marking_holds_every_device_it_counts() {
        const N: u32 = 20_000;
        let (cell, mut job) = cell(N);
        let writer = std::thread::spawn(move || {
            let mut rng = fastrand::Rng::with_seed(7);
            let mut order: Vec<u32> = (0..N).collect();
            rng.shuffle(&mut order);
            let mut prefix = 0;
            let mut done = vec![false; N as usize];
            for d in order {
                job.mark(d);
                done[d as usize] = true;
                while prefix < N && done[prefix as usize] {
                    prefix += 1;
                }
                job.set_done(prefix);
            }
        });
        let mut seen = 0;
        while seen < N {
            if let Some(s) = cell.take_change() {
                let set = u64::from(s.done) + set_bits(&s.after).count() as u64;
                assert!(
                    set >= u64::from(s.marked),
                    "{set} in the set, {} counted",
                    s.marked
                );
                seen = s.marked;
            }
        }
        writer.join().unwrap();
    }

    #[test]
    fn a_released_job_is_kept_until_its_last_marks_are_durable() {
        let (cell, mut job) = cell(10);
        job.mark(3);
        let first = cell.take_change().unwrap();
        cell.mark_durable(&first);
        job.mark(5);
        drop(job);
        assert!(!cell.finished(), "device 5 is not durable yet");
        let last = cell.take_change().unwrap();
        cell.mark_durable(&last);
        assert!(cell.finished());
    }

    #[test]
    fn the_bit_string_puts_the_first_device_in_the_high_bit() {
        let s = Snapshot {
            done: 0,
            marked: 0,
            after: vec![0b1 | 1 << 9, 1],
        };
        assert_eq!(s.after_bytes(), [0x80, 0x40, 0, 0, 0, 0, 0, 0, 0x80]);
        let none = Snapshot {
            done: 5,
            marked: 0,
            after: vec![],
        };
        assert!(none.after_bytes().is_empty());
    }

    #[test]
    fn a_union_keeps_every_finished_device() {
        let mut a = Snapshot {
            done: 10,
            marked: 3,
            after: vec![0b101],
        };
        let b = Snapshot {
            done: 11,
            marked: 2,
            after: vec![1 << 63],
        };
        a.union(&b);
        assert_eq!((a.done, a.marked), (11, 3));
        assert_eq!(devices(&a), [12, 74]);
        let mut c = Snapshot {
            done: 0,
            marked: 0,
            after: vec![],
        };
        c.union(&a);
        assert_eq!((c.done, devices(&c)), (11, vec![12, 74]));
    }

    #[test]
    fn snapshots_of_odd_sizes_start_at_any_prefix() {
        for total in [1u32, 63, 64, 65, 10_000] {
            for prefix in [0, 1, 63, 64, 65, total / 2, total] {
                let prefix = prefix.min(total);
                let (cell, mut job) = cell(total);
                let odd: Vec<u64> = (prefix..total)
                    .filter(|d| d % 3 == 1)
                    .map(u64::from)
                    .collect();
                for &d in &odd {
                    job.mark(d as u32);
                }
                job.set_done(prefix);
                let s = cell.take_change().unwrap();
                assert_eq!(devices(&s), odd, "total {total}, prefix {prefix}");
                assert!(s.after.len() as u32 * 64 <= total - prefix + 63);
            }
        }
    }
}
