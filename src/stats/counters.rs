//! [`StatsRecorder`] and [`CampaignCounter`]: lock-free per-campaign, per-second counts.
//!
//! Each campaign owns a ring of [`RING_SECONDS`] slots, one per second modulo the ring,
//! with one 64-bit word per [`Outcome`]. A word packs the second's *lap* (`second / 64`)
//! in its top 26 bits and the count in its low 38 bits, so the second a count belongs to
//! and the count itself change in one compare-and-swap. That closes the slot-reuse race:
//!
//! - a writer adds only to a word that is empty or already tagged with its own lap;
//! - the flusher takes a word with a single `swap(0)`, getting the count and its second
//!   together, so a count can never be credited to the wrong second, nor lost, however
//!   writers and the flusher interleave.
//!
//! A writer then sets its slot's bit in the campaign's `dirty` mask (one bit per slot),
//! and the flusher visits only the slots whose bits it takes: a ring is 4.6 KB, and
//! scanning every word of a thousand campaigns each second read 4.6 MB and pushed the
//! scheduler's own state out of the caches. The bit is set after the count (release) and
//! taken before the words (acquire), so a drain that takes a bit sees its counts, and a
//! count added after its slot was visited leaves the bit set for the next drain.
//!
//! When a word still holds another second's count (the flusher is more than a minute
//! behind, or the writer's clock is), when a count would overflow 38 bits, or for a
//! second past 2^32 (year 2106), the writer takes the campaign's own spill mutex and
//! appends there instead: slower, still exact, and never the case in normal running.

use super::progress::{JobCell, JobKey, JobProgressHandle};
use chrono::{DateTime, Utc};
use std::collections::HashMap;
use std::sync::atomic::{fence, AtomicBool, AtomicU64, Ordering};
// parking_lot: no poisoning to recover from; the counts stay consistent between
// statements whatever a panicking holder did.
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

const RING_BITS: u32 = 6;
/// Seconds covered by a campaign's ring: the flusher must drain more often than this.
pub const RING_SECONDS: u64 = 1 << RING_BITS;
const RING_MASK: u64 = RING_SECONDS - 1;
const COUNT_BITS: u32 = 38;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;
const LAP_LIMIT: u64 = 1 << (64 - COUNT_BITS);
/// How many campaigns ahead a drain hints: a few memory latencies' worth of drains
/// (each a handful of loads when its mask names one or two slots).
const DRAIN_AHEAD: usize = 4;

/// What happened to one device send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// Delivered (2xx).
    Sent = 0,
    /// Failed for good.
    Failed = 1,
    /// Failed for now, to be tried again.
    Retried = 2,
    /// Not sent: the token is recorded invalid (token hygiene).
    SkippedInvalid = 3,
    /// Not sent: the device is over its frequency cap (a policy outcome).
    Capped = 4,
    /// The provider said the token is dead (it goes to `invalid_tokens`).
    Invalid = 5,
    /// The provider refused it for good, for this device only (dead-lettered).
    Rejected = 6,
    /// Not sent by its campaign's or job's `expires_at` (one dead letter per job).
    Expired = 7,
    /// Not sent: its campaign was cancelled.
    Cancelled = 8,
}

/// How many [`Outcome`]s there are (one counter word each).
pub const OUTCOMES: usize = 9;

/// Seconds since the Unix epoch (0 for a time before it).
#[inline]
pub fn unix_second(t: SystemTime) -> u64 {
    t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// Shared counters of one campaign.
pub(crate) struct CampaignCells {
    pub(crate) id: Arc<str>,
    ring: [[AtomicU64; OUTCOMES]; RING_SECONDS as usize],
    /// Bit `i`: slot `i` may hold counts not drained yet.
    dirty: AtomicU64,
    spill: Mutex<Vec<(u64, [u64; OUTCOMES])>>,
}

impl CampaignCells {
    fn new(id: Arc<str>) -> Self {
        Self {
            id,
            ring: [const { [const { AtomicU64::new(0) }; OUTCOMES] }; RING_SECONDS as usize],
            dirty: AtomicU64::new(0),
            spill: Mutex::new(Vec::new()),
        }
    }

    /// Hints what a drain reads first: the handle count (just before the cells in
    /// their `Arc`'s allocation) and the dirty mask.
    fn prefetch_head(self: &Arc<Self>) {
        crate::prefetch::arc(self);
        crate::prefetch::line(&self.dirty);
    }

    /// Hints what a drain reads next: the id (counted once per row) and the slots the
    /// mask names. Reads the mask, so best after [`Self::prefetch_head`] brought it in.
    fn prefetch_dirty(&self) {
        crate::prefetch::arc(&self.id);
        let mut dirty = self.dirty.load(Ordering::Relaxed);
        while dirty != 0 {
            let index = dirty.trailing_zeros() as usize;
            dirty &= dirty - 1;
            let slot = &self.ring[index];
            crate::prefetch::bytes(slot, std::mem::size_of_val(slot));
        }
    }

    #[cold]
    fn spill(&self, second: u64, outcome: Outcome, n: u64) {
        let mut spill = self.spill.lock();
        if let Some(entry) = spill.iter_mut().rev().find(|(s, _)| *s == second) {
            entry.1[outcome as usize] += n;
        } else {
            let mut counts = [0; OUTCOMES];
            counts[outcome as usize] = n;
            spill.push((second, counts));
        }
    }

    /// Takes every count out, calling `sink(second, outcome index, count)`.
    fn drain(&self, mut sink: impl FnMut(u64, usize, u64)) {
        let mut dirty = self.dirty.swap(0, Ordering::Acquire);
        while dirty != 0 {
            let index = dirty.trailing_zeros() as usize;
            dirty &= dirty - 1;
            for (outcome, word) in self.ring[index].iter().enumerate() {
                // Read first: most words are empty, and a swap would dirty their cache line.
                if word.load(Ordering::Relaxed) == 0 {
                    continue;
                }
                let taken = word.swap(0, Ordering::Relaxed);
                let count = taken & COUNT_MASK;
                if count != 0 {
                    let second = ((taken >> COUNT_BITS) << RING_BITS) | index as u64;
                    sink(second, outcome, count);
                }
            }
        }
        let mut spill = self.spill.lock();
        for (second, counts) in spill.drain(..) {
            for (outcome, count) in counts.into_iter().enumerate() {
                if count != 0 {
                    sink(second, outcome, count);
                }
            }
        }
    }
}

/// A campaign's counters: cheap to clone, lock-free to use.
#[derive(Clone)]
pub struct CampaignCounter {
    cells: Arc<CampaignCells>,
}

impl std::fmt::Debug for CampaignCounter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CampaignCounter")
            .field("campaign_id", &self.cells.id)
            .finish_non_exhaustive()
    }
}

impl CampaignCounter {
    /// Brings in the words a [`Self::record`] at `second` touches (a cache hint).
    pub fn prefetch(&self, second: u64) {
        crate::prefetch::line(&self.cells.ring[(second & RING_MASK) as usize]);
        crate::prefetch::line(&self.cells.dirty);
    }

    /// Adds `n` devices with `outcome` to the second `second` (Unix seconds). Lock-free and
    /// allocation-free in normal running; see the module docs for the rare slow path.
    #[inline]
    pub fn record(&self, second: u64, outcome: Outcome, n: u32) {
        if n == 0 {
            return;
        }
        let n = u64::from(n);
        let lap = second >> RING_BITS;
        if lap < LAP_LIMIT {
            let slot = (second & RING_MASK) as usize;
            let word = &self.cells.ring[slot][outcome as usize];
            let mut current = word.load(Ordering::Relaxed);
            loop {
                let count = current & COUNT_MASK;
                if count != 0 && current >> COUNT_BITS != lap {
                    break; // another second's count is still here
                }
                let new_count = count + n;
                if new_count > COUNT_MASK {
                    break;
                }
                match word.compare_exchange_weak(
                    current,
                    (lap << COUNT_BITS) | new_count,
                    Ordering::Relaxed,
                    Ordering::Relaxed,
                ) {
                    Ok(_) => {
                        self.cells.dirty.fetch_or(1 << slot, Ordering::Release);
                        return;
                    }
                    Err(actual) => current = actual,
                }
            }
        }
        self.cells.spill(second, outcome, n);
    }

    /// [`record`](Self::record) at the second containing `at` (second 0 before 1970).
    #[inline]
    pub fn record_at(&self, at: DateTime<Utc>, outcome: Outcome, n: u32) {
        self.record(u64::try_from(at.timestamp()).unwrap_or(0), outcome, n);
    }

    pub fn campaign_id(&self) -> &str {
        &self.cells.id
    }
}

pub(crate) struct RecorderInner {
    campaigns: Mutex<HashMap<Arc<str>, Arc<CampaignCells>>>,
    pub(crate) jobs: Mutex<Vec<Arc<JobCell>>>,
    pub(crate) backpressure: AtomicBool,
}

/// The worker's stats: per-campaign counters and tracked job progress, drained by a
/// [`Flusher`](super::Flusher). Cheap to clone; clones share everything.
#[derive(Clone)]
pub struct StatsRecorder {
    pub(crate) inner: Arc<RecorderInner>,
}

impl Default for StatsRecorder {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for StatsRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatsRecorder")
            .field("backpressure", &self.backpressure())
            .finish_non_exhaustive()
    }
}

impl StatsRecorder {
    pub fn new() -> Self {
        Self {
            inner: Arc::new(RecorderInner {
                campaigns: Mutex::new(HashMap::new()),
                jobs: Mutex::new(Vec::new()),
                backpressure: AtomicBool::new(false),
            }),
        }
    }

    /// The counters of campaign `id`, registering it on first use. This takes the
    /// recorder's lock: call it once per campaign, not per send.
    pub fn campaign(&self, id: &str) -> CampaignCounter {
        let mut campaigns = self.inner.campaigns.lock();
        if let Some(cells) = campaigns.get(id) {
            return CampaignCounter {
                cells: cells.clone(),
            };
        }
        let id: Arc<str> = Arc::from(id);
        let cells = Arc::new(CampaignCells::new(id.clone()));
        campaigns.insert(id, cells.clone());
        CampaignCounter { cells }
    }

    /// Starts tracking a job's progress. The flusher writes it with the counts and stops
    /// tracking it once its completion is durable, or once the handle is dropped and its
    /// last value is durable.
    pub fn track_job(&self, key: JobKey) -> JobProgressHandle {
        let cell = Arc::new(JobCell::new(key));
        self.inner.jobs.lock().push(cell.clone());
        JobProgressHandle::new(cell)
    }

    /// True while the flusher holds more unwritten rows than its bound (the database is
    /// unreachable): the scheduler must pause sending rather than let counts pile up.
    #[inline]
    pub fn backpressure(&self) -> bool {
        self.inner.backpressure.load(Ordering::Relaxed)
    }

    /// Takes every campaign's counts out, calling `sink(campaign, second, outcome, n)`,
    /// and forgets campaigns that no handle refers to any more.
    pub(crate) fn drain_counts(&self, mut sink: impl FnMut(&Arc<str>, u64, usize, u64)) {
        let mut campaigns = self.inner.campaigns.lock();
        let mut unused = Vec::new();
        // A thousand campaigns' cells are cold once a second: hint each a few campaigns
        // ahead (its handle count and mask, then its id and dirty slots), so that the
        // misses overlap instead of queueing (docs/BENCHMARKS.md, fourteenth session).
        let all: Vec<(&Arc<str>, &Arc<CampaignCells>)> = campaigns.iter().collect();
        for (k, &(id, cells)) in all.iter().enumerate() {
            if let Some((_, ahead)) = all.get(k + 2 * DRAIN_AHEAD) {
                ahead.prefetch_head();
            }
            if let Some((_, ahead)) = all.get(k + DRAIN_AHEAD) {
                ahead.prefetch_dirty();
            }
            // Checked before draining: no handle now means no write after this point,
            // and none can be made while we hold the registry lock.
            if Arc::strong_count(cells) == 1 {
                fence(Ordering::Acquire);
                unused.push(id.clone());
            }
            cells.drain(|second, outcome, n| sink(&cells.id, second, outcome, n));
        }
        drop(all);
        for id in unused {
            campaigns.remove(&id);
        }
    }

    /// Campaigns currently registered (for tests and metrics).
    pub fn campaigns_registered(&self) -> usize {
        self.inner.campaigns.lock().len()
    }

    /// Jobs currently tracked (for tests and metrics).
    pub fn jobs_tracked(&self) -> usize {
        self.inner.jobs.lock().len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn drained(recorder: &StatsRecorder) -> BTreeMap<(String, u64), [u64; OUTCOMES]> {
        let mut out = BTreeMap::new();
        recorder.drain_counts(|id, second, outcome, n| {
            let entry: &mut [u64; OUTCOMES] = out.entry((id.to_string(), second)).or_default();
            entry[outcome] += n;
        });
        out
    }

    #[test]
    fn counts_land_in_their_second() {
        let recorder = StatsRecorder::new();
        let a = recorder.campaign("a");
        a.record(1_700_000_000, Outcome::Sent, 3);
        a.record(1_700_000_000, Outcome::Failed, 1);
        a.record(1_700_000_001, Outcome::Sent, 2);
        a.record(1_700_000_001, Outcome::Retried, 7);
        a.record(1_700_000_000, Outcome::Sent, 0);
        let got = drained(&recorder);
        assert_eq!(
            got[&("a".into(), 1_700_000_000)],
            [3, 1, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            got[&("a".into(), 1_700_000_001)],
            [2, 0, 7, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(got.len(), 2);
        assert!(
            drained(&recorder).is_empty(),
            "a drain takes the counts out"
        );
    }

    #[test]
    fn a_slot_still_holding_an_older_second_spills_exactly() {
        let recorder = StatsRecorder::new();
        let a = recorder.campaign("a");
        // Same slot, one lap apart, with no drain in between: the flusher is late.
        a.record(1000, Outcome::Sent, 5);
        a.record(1000 + RING_SECONDS, Outcome::Sent, 7);
        a.record(1000 + RING_SECONDS, Outcome::Sent, 1);
        // A writer whose clock is behind finds a newer lap there.
        a.record(1000 - RING_SECONDS, Outcome::Sent, 2);
        let got = drained(&recorder);
        assert_eq!(got[&("a".into(), 1000)], [5, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(
            got[&("a".into(), 1000 + RING_SECONDS)],
            [8, 0, 0, 0, 0, 0, 0, 0, 0]
        );
        assert_eq!(
            got[&("a".into(), 1000 - RING_SECONDS)],
            [2, 0, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn huge_counts_and_far_seconds_are_exact() {
        let recorder = StatsRecorder::new();
        let a = recorder.campaign("a");
        for _ in 0..100 {
            a.record(5, Outcome::Sent, u32::MAX);
        }
        a.record(u64::from(u32::MAX) + 10, Outcome::Failed, 4);
        let got = drained(&recorder);
        assert_eq!(got[&("a".into(), 5)][0], 100 * u64::from(u32::MAX));
        assert_eq!(
            got[&("a".into(), u64::from(u32::MAX) + 10)],
            [0, 4, 0, 0, 0, 0, 0, 0, 0]
        );
    }

    #[test]
    fn concurrent_writers_and_drains_lose_nothing() {
        let recorder = StatsRecorder::new();
        let stop = Arc::new(AtomicBool::new(false));
        let total = Arc::new(Mutex::new(BTreeMap::<u64, u64>::new()));
        let drainer = {
            let (recorder, stop, total) = (recorder.clone(), stop.clone(), total.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    recorder.drain_counts(|_, second, _, n| {
                        *total.lock().entry(second).or_default() += n;
                    });
                }
            })
        };
        let writers: Vec<_> = (0..4)
            .map(|w| {
                let counter = recorder.campaign("c");
                std::thread::spawn(move || {
                    for i in 0..200_000u64 {
                        // Sweep many laps so slots are reused while the drainer runs.
                        counter.record((i / 1000) + w, Outcome::Sent, 1);
                    }
                })
            })
            .collect();
        for w in writers {
            w.join().unwrap();
        }
        stop.store(true, Ordering::Relaxed);
        drainer.join().unwrap();
        recorder.drain_counts(|_, second, _, n| {
            *total.lock().entry(second).or_default() += n;
        });
        let total = total.lock();
        assert_eq!(total.values().sum::<u64>(), 800_000);
        for (second, count) in total.iter() {
            let writers_covering = (0..4u64)
                .filter(|w| *second >= *w && *second < 200 + *w)
                .count() as u64;
            assert_eq!(*count, writers_covering * 1000, "second {second}");
        }
    }

    #[test]
    fn unused_campaigns_are_forgotten_after_their_last_drain() {
        let recorder = StatsRecorder::new();
        let a = recorder.campaign("a");
        a.record(10, Outcome::Sent, 1);
        drop(a);
        assert_eq!(recorder.campaigns_registered(), 1);
        assert_eq!(
            drained(&recorder).len(),
            1,
            "counts of a dropped handle still drain"
        );
        assert_eq!(recorder.campaigns_registered(), 0);
    }
}
