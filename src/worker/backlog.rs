//! Per-campaign lookahead: which jobs the consumer holds in memory and which it parks.
//!
//! A partition carries many campaigns' jobs interleaved. Pausing a whole partition when
//! one slow campaign's backlog fills the buffer starves every other campaign behind it
//! (head-of-line blocking). Instead, each campaign keeps in memory only the devices it
//! will send in the next `lookahead` at its own rate (and at least one job). Later jobs
//! of that campaign are *parked*: their raw message is kept (undecoded) while all parked
//! bytes stay within a budget, beyond which only their (partition, offset) is kept, about
//! 16 bytes, and the job is re-read from Kafka when the campaign runs low. Parked jobs are
//! not finished, so the committed offset never passes them.
//!
//! This type is pure bookkeeping (no Kafka, no I/O), so its rules are unit-tested.

use rdkafka::message::OwnedMessage;
use std::collections::{BTreeSet, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

mod waiting;
pub use waiting::WaitingJob;

/// The zones of each campaign's jobs waiting for a window.
pub type WindowZones = Arc<Vec<(Arc<str>, Vec<crate::job::window::Zone>)>>;

/// A job left in Kafka, to be re-read by offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JobRef {
    pub partition: i32,
    pub offset: i64,
}

/// A job handed to the scheduler: `dispatched` is its send cursor, kept by the scheduler.
#[derive(Debug)]
struct Held {
    at: JobRef,
    total: u32,
    dispatched: Arc<AtomicU32>,
}

#[derive(Debug, Default)]
struct CampaignBacklog {
    id: Arc<str>,
    /// Sends per second (the live send_rate; paused campaigns keep theirs).
    rate: f64,
    held: Vec<Held>,
    parked: VecDeque<Parked>,
    /// Devices in `parked`.
    parked_devices: u64,
    /// The partition its latest job came from: where its next one probably is.
    partition: Option<i32>,
    /// No re-read of its parked jobs before this instant (after a failed one).
    retry_at: Option<Instant>,
    /// It held its lookahead when last looked at, with enough to spare at its rate to
    /// keep it until this instant: [`Backlog::next_to_unpark`] does not read its cursors
    /// again before then.
    full_until: Option<Instant>,
}

/// A parked job: its place, and its raw message while it fits in the byte budget.
#[derive(Debug)]
pub struct Parked {
    pub at: JobRef,
    /// Its device count (for progress).
    pub devices: u32,
    pub message: Option<OwnedMessage>,
}

fn message_bytes(m: &Option<OwnedMessage>) -> usize {
    use rdkafka::Message;
    m.as_ref().map_or(0, |m| {
        m.payload().map_or(0, <[u8]>::len) + m.key().map_or(0, <[u8]>::len)
    })
}

/// Devices worth `span` at `rate`, at least one.
fn devices_in(span: Duration, rate: f64) -> u64 {
    let d = rate * span.as_secs_f64();
    if d.is_finite() && d >= 1.0 {
        d.ceil() as u64
    } else {
        1
    }
}

impl CampaignBacklog {
    /// A new rate moves the lookahead: the wait judged at the old one ends.
    fn set_rate(&mut self, rate: f64) {
        if rate != self.rate {
            self.full_until = None;
        }
        self.rate = rate;
    }

    /// Held jobs with devices not dispatched yet.
    fn undispatched_jobs(&self) -> usize {
        self.held
            .iter()
            .filter(|h| h.dispatched.load(Ordering::Relaxed) < h.total)
            .count()
    }

    /// Devices handed to the scheduler and not dispatched yet.
    fn remaining(&self) -> u64 {
        self.held
            .iter()
            .map(|h| u64::from(h.total.saturating_sub(h.dispatched.load(Ordering::Relaxed))))
            .sum()
    }
}

/// A campaign whose held and parked jobs cover less than this of its sends is running
/// low: the partition of its latest job is read on even while parked messages fill their
/// budget. Reading a paused partition on until the campaign's next job comes took up to
/// 0.7 s in the 1,000-campaign bench (docs/BENCHMARKS.md), during which a campaign that
/// waited until nothing was parked ran dry.
const LOW_WATER: Duration = Duration::from_secs(2);

/// The longest a campaign that held its lookahead is left unread by the hand-over (and
/// at most a tenth of the lookahead). At its rate it could go longer, but a cursor can
/// move faster than the rate: devices skipped at intake or capped take no permit. The
/// hand-over runs at every intake pass (up to 200 a second), and re-reading every held
/// cursor of the campaigns with parked jobs at each was most of its cost at 1,000
/// campaigns (docs/BENCHMARKS.md); a campaign whose cursor jumps gets its next job at
/// most this much later, with the default 10-s lookahead a hundredth of what it holds.
const RECHECK_MAX: Duration = Duration::from_millis(100);

/// Devices in each campaign's parked jobs.
pub type ParkedDevices = Arc<Vec<(Arc<str>, u64)>>;

/// The consumer's lookahead bookkeeping, per campaign.
#[derive(Debug)]
pub struct Backlog {
    lookahead: Duration,
    /// The slot of each campaign with held or parked jobs.
    index: HashMap<Arc<str>, u32>,
    /// Campaigns by slot (`None`: free, in `free`). The walks go by slot: looking each
    /// campaign up by its id (hashing and comparing the string, on lines no other walk
    /// touched) was most of [`Self::next_to_unpark`]'s cost at 1,000 campaigns.
    slots: Vec<Option<CampaignBacklog>>,
    free: Vec<u32>,
    /// The campaigns with parked jobs, the only ones [`Self::next_to_unpark`] and
    /// [`Self::parked_devices`] visit: at 1,000 campaigns about a tenth (most hold their
    /// whole run), and walking all of them at every step of the intake was a per-campaign
    /// cost of its own.
    with_parked: HashSet<u32>,
    /// Campaign of each held job, to find it again when the job finishes.
    held_at: HashMap<(i32, i64), u32>,
    parked_per_partition: HashMap<i32, usize>,
    /// Payload and key bytes of the parked messages kept in memory.
    parked_bytes: usize,
    /// Changes whenever a job is parked or leaves the parked queues.
    parked_version: u64,
    /// [`Self::parked_devices`] as of a version: rebuilt only when that changed.
    parked_snapshot: (u64, ParkedDevices),
    /// Jobs waiting for their zone's local-time window, apart from the lookahead.
    waiting: waiting::Waiting,
    /// [`Self::waiting_zones`] as of a `parked_version`.
    zones_snapshot: (u64, WindowZones),
}

impl Backlog {
    pub fn new(lookahead: Duration) -> Self {
        Self {
            lookahead,
            index: HashMap::new(),
            slots: Vec::new(),
            free: Vec::new(),
            with_parked: HashSet::new(),
            held_at: HashMap::new(),
            parked_per_partition: HashMap::new(),
            parked_bytes: 0,
            parked_version: 0,
            parked_snapshot: (0, Arc::default()),
            waiting: waiting::Waiting::default(),
            zones_snapshot: (0, Arc::default()),
        }
    }

    fn get(&self, id: &str) -> Option<&CampaignBacklog> {
        let slot = *self.index.get(id)?;
        self.slots[slot as usize].as_ref()
    }

    fn live(&self) -> impl Iterator<Item = &CampaignBacklog> {
        self.slots.iter().flatten()
    }

    /// The campaign's slot, taken (a free one first) if it has none.
    fn slot_for(&mut self, id: &Arc<str>) -> u32 {
        if let Some(&slot) = self.index.get(id.as_ref()) {
            return slot;
        }
        let c = CampaignBacklog {
            id: id.clone(),
            ..CampaignBacklog::default()
        };
        let slot = match self.free.pop() {
            Some(slot) => {
                self.slots[slot as usize] = Some(c);
                slot
            }
            None => {
                self.slots.push(Some(c));
                (self.slots.len() - 1) as u32
            }
        };
        self.index.insert(id.clone(), slot);
        slot
    }

    fn at(&mut self, slot: u32) -> &mut CampaignBacklog {
        self.slots[slot as usize].as_mut().expect("a live slot")
    }

    /// Frees the slot of a campaign with nothing held or parked.
    fn release_if_empty(&mut self, slot: u32) {
        let empty = self.slots[slot as usize]
            .as_ref()
            .is_some_and(|c| c.held.is_empty() && c.parked.is_empty());
        if let Some(c) = empty.then(|| self.slots[slot as usize].take()).flatten() {
            self.index.remove(&c.id);
            self.with_parked.remove(&slot);
            self.free.push(slot);
        }
    }

    /// Devices worth `lookahead` at `rate`, at least one.
    fn lookahead_devices(&self, rate: f64) -> u64 {
        devices_in(self.lookahead, rate)
    }

    /// Whether a new job of `campaign` should be held in memory: the campaign has less
    /// than its lookahead waiting and no earlier job parked (its jobs stay in order).
    pub fn wants(&self, campaign: &str) -> bool {
        match self.get(campaign) {
            None => true,
            Some(c) => c.parked.is_empty() && c.remaining() < self.lookahead_devices(c.rate),
        }
    }

    /// Whether `campaign` may take a job even past the worker-wide memory bound: its
    /// first, or its next one while fewer than two of its held jobs have work left. A
    /// held job counts against the bound until its last send is answered, so without
    /// this a campaign would idle at every job boundary whenever the bound is full. The
    /// bound is thus soft by at most two jobs per campaign.
    pub fn guaranteed(&self, campaign: &str) -> bool {
        self.get(campaign)
            .is_none_or(|c| c.undispatched_jobs() <= 1)
    }

    /// Records a job handed to the scheduler.
    pub fn hold(
        &mut self,
        campaign: &Arc<str>,
        rate: f64,
        at: JobRef,
        total: u32,
        dispatched: Arc<AtomicU32>,
    ) {
        let slot = self.slot_for(campaign);
        let c = self.at(slot);
        c.set_rate(rate);
        c.partition = Some(at.partition);
        c.held.push(Held {
            at,
            total,
            dispatched,
        });
        self.held_at.insert((at.partition, at.offset), slot);
    }

    /// Parks a job; [`next_to_unpark`](Self::next_to_unpark) returns it later. `message`
    /// is its raw message when the caller keeps it in memory, `None` to re-read it.
    pub fn park(
        &mut self,
        campaign: &Arc<str>,
        rate: f64,
        at: JobRef,
        devices: u32,
        message: Option<OwnedMessage>,
    ) {
        let slot = self.slot_for(campaign);
        self.parked_bytes += message_bytes(&message);
        self.parked_version += 1;
        self.with_parked.insert(slot);
        let c = self.at(slot);
        c.set_rate(rate);
        c.partition = Some(at.partition);
        c.parked_devices += u64::from(devices);
        c.parked.push_back(Parked {
            at,
            devices,
            message,
        });
        *self.parked_per_partition.entry(at.partition).or_default() += 1;
    }

    /// Puts back a parked job whose re-read failed, at the head of its campaign's queue.
    pub fn unpark_failed(
        &mut self,
        campaign: &Arc<str>,
        at: JobRef,
        devices: u32,
        retry_at: Instant,
    ) {
        let slot = self.slot_for(campaign);
        self.parked_version += 1;
        self.with_parked.insert(slot);
        let c = self.at(slot);
        c.retry_at = Some(retry_at);
        c.parked_devices += u64::from(devices);
        c.parked.push_front(Parked {
            at,
            devices,
            message: None,
        });
        *self.parked_per_partition.entry(at.partition).or_default() += 1;
    }

    /// Whether a campaign whose latest job came from `partition` is running low: below
    /// its lookahead with nothing parked, or below [`LOW_WATER`] (at most the lookahead)
    /// of its sends held and parked. Reading that partition on is how it gets its next jobs.
    pub fn starving_in(&self, partition: i32) -> bool {
        !self
            .starving_partitions(&BTreeSet::from([partition]))
            .is_empty()
    }

    /// Which of `among` (the assigned partitions) [`starving_in`](Self::starving_in)
    /// holds for, in one pass over the campaigns: asking per partition costs partitions
    /// × campaigns at every consumer step. The pass ends once all of `among` are found,
    /// which at 1,000 campaigns is usually long before the last campaign.
    pub fn starving_partitions(&self, among: &BTreeSet<i32>) -> Vec<i32> {
        let mut out = Vec::new();
        for c in self.live() {
            if out.len() >= among.len() {
                break;
            }
            let Some(p) = c.partition else { continue };
            if !among.contains(&p) || out.contains(&p) {
                continue;
            }
            let left = c.remaining();
            let starving = c.parked.is_empty() && left < self.lookahead_devices(c.rate);
            let low = devices_in(LOW_WATER.min(self.lookahead), c.rate);
            if starving || left + c.parked_devices < low {
                out.push(p);
            }
        }
        out
    }

    /// When parked messages fill `max_bytes` and one campaign holds half of them or more
    /// (a paused campaign's backlog, say), drops that campaign's newest parked messages,
    /// keeping their offsets, until the total is back to ¾ of the budget. Otherwise that
    /// campaign alone would keep memory full, and so every partition paused. Returns how
    /// many were dropped.
    pub fn evict_hog(&mut self, max_bytes: usize) -> usize {
        if max_bytes == 0 || self.parked_bytes < max_bytes {
            return 0;
        }
        let Some(c) = self.slots.iter_mut().flatten().max_by_key(|c| {
            c.parked
                .iter()
                .map(|p| message_bytes(&p.message))
                .sum::<usize>()
        }) else {
            return 0;
        };
        let hog: usize = c.parked.iter().map(|p| message_bytes(&p.message)).sum();
        if hog < max_bytes / 2 {
            return 0;
        }
        let mut dropped = 0;
        for p in c.parked.iter_mut().rev() {
            if self.parked_bytes <= max_bytes / 4 * 3 {
                break;
            }
            if p.message.is_some() {
                self.parked_bytes -= message_bytes(&p.message);
                p.message = None;
                dropped += 1;
            }
        }
        dropped
    }

    /// Bytes of the parked messages kept in memory.
    pub fn parked_bytes(&self) -> usize {
        self.parked_bytes
    }

    /// A held job is finished: it no longer counts toward its campaign's lookahead.
    pub fn finished(&mut self, partition: i32, offset: i64) {
        let Some(slot) = self.held_at.remove(&(partition, offset)) else {
            return;
        };
        if let Some(c) = self.slots[slot as usize].as_mut() {
            c.held.retain(|h| h.at != JobRef { partition, offset });
            // It may have finished early (devices skipped take no permit).
            c.full_until = None;
            self.release_if_empty(slot);
        }
    }

    /// The campaign's live rate changed (the lookahead follows it).
    pub fn set_rate(&mut self, campaign: &str, rate: f64) {
        if let Some(&slot) = self.index.get(campaign) {
            self.at(slot).set_rate(rate);
        }
    }

    /// The parked job of the most starved campaign (least lookahead left) that wants
    /// more, removed from the parked set; `None` when no campaign does.
    /// With `room` false (the worker-wide bound is full), only campaigns that are
    /// [`guaranteed`](Self::guaranteed) a job are considered.
    pub fn next_to_unpark(&mut self, room: bool, now: Instant) -> Option<(Arc<str>, Parked)> {
        let mut best: Option<(u32, f64)> = None;
        let lookahead = self.lookahead;
        let max_wait = RECHECK_MAX.min(lookahead / 10).as_secs_f64();
        for &slot in &self.with_parked {
            let Some(c) = self.slots[slot as usize].as_mut() else {
                continue;
            };
            if c.parked.is_empty()
                || c.retry_at.is_some_and(|t| t > now)
                || c.full_until.is_some_and(|t| t > now)
            {
                continue;
            }
            let want = devices_in(lookahead, c.rate);
            let left = c.remaining();
            if left >= want {
                let spare = (left - want) as f64 / c.rate;
                let wait = max_wait.min(spare.max(0.0));
                c.full_until = Some(now + Duration::from_secs_f64(wait));
                continue;
            }
            // It reads every held job's cursor: only for a campaign that wants a job.
            if !room && c.undispatched_jobs() > 1 {
                continue;
            }
            let fill = left as f64 / want as f64;
            if best.is_none_or(|(_, f)| fill < f) {
                best = Some((slot, fill));
            }
        }
        let slot = best?.0;
        let c = self.slots[slot as usize].as_mut()?;
        c.retry_at = None;
        let p = c.parked.pop_front()?;
        c.parked_devices -= u64::from(p.devices);
        let (id, emptied) = (c.id.clone(), c.parked.is_empty());
        if emptied {
            self.with_parked.remove(&slot);
            // Nothing held either (its job may still be dead-lettered, not held): the
            // caller goes on by id, so the slot can go.
            self.release_if_empty(slot);
        }
        self.parked_version += 1;
        if let Some(n) = self.parked_per_partition.get_mut(&p.at.partition) {
            *n = n.saturating_sub(1);
        }
        self.parked_bytes -= message_bytes(&p.message);
        Some((id, p))
    }

    /// Drops every job of revoked partitions: their next owner reads them again.
    pub fn forget_partitions(&mut self, partitions: &[i32]) {
        self.held_at.retain(|(p, _), _| !partitions.contains(p));
        self.waiting.forget_partitions(partitions);
        for c in self.slots.iter_mut().flatten() {
            c.full_until = None;
            c.held.retain(|h| !partitions.contains(&h.at.partition));
            c.parked.retain(|r| !partitions.contains(&r.at.partition));
            c.parked_devices = c.parked.iter().map(|p| u64::from(p.devices)).sum();
            // Where its next job probably is now: a partition it still reads.
            if c.partition.is_some_and(|p| partitions.contains(&p)) {
                let last_parked = c.parked.back().map(|r| r.at.partition);
                c.partition = last_parked.or(c.held.last().map(|h| h.at.partition));
            }
        }
        self.parked_version += 1;
        self.parked_bytes = self
            .live()
            .flat_map(|c| c.parked.iter())
            .map(|p| message_bytes(&p.message))
            .sum();
        for slot in 0..self.slots.len() as u32 {
            self.release_if_empty(slot);
        }
        self.with_parked = (0..self.slots.len() as u32)
            .filter(|&slot| {
                self.slots[slot as usize]
                    .as_ref()
                    .is_some_and(|c| !c.parked.is_empty())
            })
            .collect();
        for p in partitions {
            self.parked_per_partition.remove(p);
        }
    }

    /// Jobs of `partition` parked, for the lookahead or for a window.
    pub fn parked_in(&self, partition: i32) -> usize {
        let parked = self.parked_per_partition.get(&partition).copied();
        parked.unwrap_or(0) + self.waiting.in_partition(partition)
    }

    pub fn parked_total(&self) -> usize {
        self.parked_per_partition.values().sum::<usize>() + self.waiting.total()
    }

    /// Jobs waiting for their zone's window.
    pub fn waiting_total(&self) -> usize {
        self.waiting.total()
    }

    /// Devices in each campaign's parked jobs, for campaigns that have some (rebuilt
    /// only after a change: the consumer publishes it every step).
    pub fn parked_devices(&mut self) -> ParkedDevices {
        if self.parked_snapshot.0 != self.parked_version {
            let mut by_id: HashMap<Arc<str>, u64> = self
                .with_parked
                .iter()
                .filter_map(|&slot| self.slots[slot as usize].as_ref())
                .map(|c| (c.id.clone(), c.parked_devices))
                .collect();
            for (id, n) in self.waiting.devices() {
                *by_id.entry(id.clone()).or_default() += n;
            }
            self.parked_snapshot = (self.parked_version, Arc::new(by_id.into_iter().collect()));
        }
        self.parked_snapshot.1.clone()
    }
}

#[cfg(test)]
#[path = "backlog_tests.rs"]
mod tests;
