//! The consumer's state shared with librdkafka's callbacks (rebalances, commits,
//! statistics), all on the consumer thread: the mutex is never contended.
//!
//! A job's offset counts as finished only when the scheduler reports every device
//! finished *and* the flusher has made that progress durable, or when its dead letter
//! is durable, so a committed offset never covers unwritten work.

use super::backlog::Backlog;
use super::offsets::OffsetTracker;
use super::outcomes::{Letter, Outcomes, Record};
use super::scheduler::{Control, Event, IncomingJob};
use crate::stats::JobProgressHandle;
use rdkafka::consumer::{
    BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance, RebalanceProtocol,
};
use rdkafka::error::KafkaResult;
use rdkafka::types::RDKafkaRespErr;
use rdkafka::{ClientContext, Offset, TopicPartitionList};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;
use tokio::runtime::Handle;
use tokio::sync::mpsc;

use super::consumer::{ConsumerStats, FlushNow, Pending};

#[derive(Default)]
pub(super) struct PartitionLoad {
    pub jobs: usize,
    pub devices: usize,
    /// Paused for its backlog (too many parked jobs, or parked bytes full).
    pub backlog_pause: bool,
    /// Paused in librdkafka now (for its backlog, or the whole consumer under pressure).
    pub paused: bool,
}

pub(super) struct State {
    pub topic: String,
    pub tracker: OffsetTracker,
    pub load: HashMap<i32, PartitionLoad>,
    /// The partitions assigned to this member, kept from the rebalance callbacks: asking
    /// librdkafka (`assignment()`) is a round trip to its main thread, too slow per message.
    pub assigned: BTreeSet<i32>,
    /// Finished jobs whose progress is not durable yet.
    pub finishing: Vec<(i32, i64, JobProgressHandle)>,
    /// Messages finished by a dead letter: their offsets wait for the letter's write.
    pub lettered: Vec<(i32, i64, u64)>,
    /// Letters of messages waiting for room in the outcomes queue, oldest first.
    pub held_letters: VecDeque<Letter>,
    pub events: std::sync::mpsc::Receiver<Event>,
    pub scheduler_gone: bool,
    pub runtime: Handle,
    pub stats: ConsumerStats,
    pub backlog: Backlog,
    /// Jobs waiting for their lookups, in arrival order.
    pub pending: VecDeque<Pending>,
    /// Looked-up jobs waiting for room in the scheduler's queue, in order.
    pub ready: VecDeque<IncomingJob>,
    pub outcomes: Outcomes,
}

impl State {
    /// Applies scheduler events; moves offsets whose work is durable to finished.
    pub fn drain_events(&mut self) {
        loop {
            match self.events.try_recv() {
                Ok(Event::JobFinished {
                    partition,
                    offset,
                    devices,
                    progress,
                }) => {
                    if !self.assigned.contains(&partition) {
                        // Revoked, and forgotten: its next owner reads the job again.
                        continue;
                    }
                    self.backlog.finished(partition, offset);
                    // Its memory is freed now; only its offset waits for durability.
                    let l = self.load.entry(partition).or_default();
                    l.jobs = l.jobs.saturating_sub(1);
                    l.devices = l.devices.saturating_sub(devices as usize);
                    self.finishing.push((partition, offset, progress));
                }
                Err(std::sync::mpsc::TryRecvError::Empty) => break,
                Err(std::sync::mpsc::TryRecvError::Disconnected) => {
                    self.scheduler_gone = true;
                    break;
                }
            }
        }
        self.queue_held_letters();
        let mut i = 0;
        while i < self.finishing.len() {
            if self.finishing[i].2.is_durably_complete() {
                let (p, o, _) = self.finishing.swap_remove(i);
                self.tracker.finished(p, o);
            } else {
                i += 1;
            }
        }
        let durable = self.outcomes.durable();
        let tracker = &mut self.tracker;
        self.lettered.retain(|&(p, o, seq)| {
            let done = seq < durable;
            if done {
                tracker.finished(p, o);
            }
            !done
        });
    }

    /// Dead-letters the message at (partition, offset); its offset is finished once
    /// the letter is written.
    pub fn dead_letter_message(&mut self, letter: Letter) {
        self.stats.dead_letters += 1;
        self.held_letters.push_back(letter);
        self.queue_held_letters();
    }

    /// Moves held letters into the outcomes queue while it has room.
    fn queue_held_letters(&mut self) {
        while let Some(letter) = self.held_letters.pop_front() {
            let at = (letter.partition, letter.offset);
            match self.outcomes.record(Record::DeadLetter(Box::new(letter))) {
                Ok(seq) => self.lettered.push((at.0, at.1, seq)),
                Err(Record::DeadLetter(back)) => {
                    self.held_letters.push_front(*back);
                    return;
                }
                Err(_) => unreachable!("the queue hands back what it was given"),
            }
        }
    }

    pub fn commit(&mut self, consumer: &impl CommitOffsets, mode: CommitMode, all: bool) {
        let Some(marks) = commit_watermarks(&mut self.tracker, &self.topic, consumer, mode, all)
        else {
            return;
        };
        self.stats.commits += 1;
        if matches!(mode, CommitMode::Sync) {
            // An async commit is recorded by the commit callback.
            let _ = self.outcomes.record(Record::Committed(marks));
        }
    }

    /// Forgets everything of partitions this member no longer owns.
    fn forget(&mut self, partitions: &[i32]) {
        for p in partitions {
            self.tracker.forget(*p);
            self.load.remove(p);
            self.assigned.remove(p);
        }
        self.backlog.forget_partitions(partitions);
        self.finishing.retain(|(p, ..)| !partitions.contains(p));
        self.lettered.retain(|(p, ..)| !partitions.contains(p));
        // Not handed over yet: their next owner reads them again.
        self.pending.retain(|p| {
            let keep = !partitions.contains(&p.partition);
            if !keep {
                p.lookups.abort();
            }
            keep
        });
        self.ready.retain(|j| !partitions.contains(&j.partition));
    }
}

/// Where offset commits go: the consumer, or a test's stand-in.
pub(super) trait CommitOffsets {
    fn commit_offsets(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()>;
}

impl<C: ConsumerContext> CommitOffsets for BaseConsumer<C> {
    fn commit_offsets(&self, offsets: &TopicPartitionList, mode: CommitMode) -> KafkaResult<()> {
        self.commit(offsets, mode)
    }
}

/// Commits the watermarks (`all`, or those that moved since the last commit); returns
/// what was committed (for an async commit: handed to librdkafka). A failed commit's
/// watermarks are handed out again, so the commit timer retries them even when the
/// watermark stays where it is.
pub(super) fn commit_watermarks(
    tracker: &mut OffsetTracker,
    topic: &str,
    to: &impl CommitOffsets,
    mode: CommitMode,
    all: bool,
) -> Option<Vec<(i32, i64)>> {
    let marks = if all {
        tracker.watermarks()
    } else {
        tracker.take_new_watermarks()
    };
    if marks.is_empty() {
        return None;
    }
    let mut tpl = TopicPartitionList::new();
    for (p, o) in &marks {
        // Only a negative partition is refused; none comes from the broker.
        let _ = tpl.add_partition_offset(topic, *p, Offset::Offset(*o));
    }
    match to.commit_offsets(&tpl, mode) {
        Ok(()) => Some(marks),
        Err(e) => {
            tracing::warn!(error = %e, "offset commit failed; retried at the next commit interval");
            tracker.commit_failed(&marks);
            None
        }
    }
}

/// An async commit's result: a failed one's watermarks are handed out again, so the
/// commit timer retries them.
fn async_commit_done(tracker: &mut OffsetTracker, result: &KafkaResult<()>, marks: &[(i32, i64)]) {
    if let Err(e) = result {
        tracing::warn!(error = %e, "async offset commit failed; retried at the next commit interval");
        tracker.commit_failed(marks);
    }
}

/// The marks of a commit's offset list.
fn marks_of(offsets: &TopicPartitionList) -> Vec<(i32, i64)> {
    offsets
        .elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// The rebalance, commit and statistics hooks.
pub(super) struct Ctx {
    pub state: Arc<parking_lot::Mutex<State>>,
    pub control: mpsc::Sender<Control>,
    pub drain_timeout: Duration,
    pub flush_now: FlushNow,
    pub outcomes: Outcomes,
    /// The group's rebalance protocol once asked (0: not yet, 1: cooperative, 2: eager).
    pub protocol: std::sync::atomic::AtomicU8,
}

impl Ctx {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
    }

    /// Whether the group rebalances incrementally. Asked of librdkafka once, at the
    /// first rebalance (the consumer is live then), and kept: asking it again from the
    /// rebalance of the consumer's close blocks for ever on the group thread, which
    /// waits for that very rebalance (seen as a hung shutdown under a rebalance).
    fn cooperative(&self, consumer: &BaseConsumer<Self>) -> bool {
        use std::sync::atomic::Ordering::Relaxed;
        match self.protocol.load(Relaxed) {
            1 => true,
            2 => false,
            _ => {
                let coop = matches!(
                    consumer.rebalance_protocol(),
                    RebalanceProtocol::Cooperative
                );
                self.protocol.store(if coop { 1 } else { 2 }, Relaxed);
                coop
            }
        }
    }
}

impl ClientContext for Ctx {
    /// librdkafka's statistics (every `statistics.interval.ms`): the consumer lag per partition.
    fn stats(&self, statistics: rdkafka::Statistics) {
        let state = self.lock();
        if let Some(topic) = statistics.topics.get(&state.topic) {
            for (p, part) in &topic.partitions {
                if *p >= 0 && part.consumer_lag >= 0 {
                    metrics::gauge!("consumer_lag", "partition" => p.to_string())
                        .set(part.consumer_lag as f64);
                }
            }
        }
    }
}

impl ConsumerContext for Ctx {
    /// rdkafka's own handling (pre, assign or unassign, post), with the protocol kept
    /// from the first rebalance ([`Ctx::cooperative`]).
    fn rebalance(
        &self,
        consumer: &BaseConsumer<Self>,
        err: RDKafkaRespErr,
        tpl: &mut TopicPartitionList,
    ) {
        let tpl = &*tpl;
        let rebalance = match err {
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS => Rebalance::Assign(tpl),
            RDKafkaRespErr::RD_KAFKA_RESP_ERR__REVOKE_PARTITIONS => Rebalance::Revoke(tpl),
            other => Rebalance::Error(rdkafka::error::KafkaError::Rebalance(other.into())),
        };
        self.pre_rebalance(consumer, &rebalance);
        let assign = err == RDKafkaRespErr::RD_KAFKA_RESP_ERR__ASSIGN_PARTITIONS;
        let done = match (assign, self.cooperative(consumer)) {
            (true, true) => consumer.incremental_assign(tpl),
            (true, false) => consumer.assign(tpl),
            (false, true) => consumer.incremental_unassign(tpl),
            (false, false) => consumer.unassign(),
        };
        if let Err(e) = done {
            tracing::warn!(error = %e, assign, "the rebalance's (un)assign failed");
        }
        self.post_rebalance(consumer, &rebalance);
    }

    fn pre_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        let Rebalance::Revoke(tpl) = rebalance else {
            return;
        };
        let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
        tracing::info!(?partitions, "partitions revoked; draining them");
        let rt = {
            let mut s = self.lock();
            s.pending.retain(|p| {
                let keep = !partitions.contains(&p.partition);
                if !keep {
                    p.lookups.abort();
                }
                keep
            });
            s.ready.retain(|j| !partitions.contains(&j.partition));
            s.runtime.clone()
        };
        let (done_tx, done_rx) = tokio::sync::oneshot::channel();
        let sent = self
            .control
            .blocking_send(Control::Revoke {
                partitions: partitions.clone(),
                done: done_tx,
            })
            .is_ok();
        if sent {
            let waited = rt.block_on(tokio::time::timeout(self.drain_timeout, done_rx));
            if waited.is_err() {
                tracing::warn!("revoked partitions still had sends in flight at the drain timeout");
            }
        }
        // Make progress durable, so the finished jobs can be committed now.
        rt.block_on(tokio::time::timeout(self.drain_timeout, (self.flush_now)()))
            .ok();
        let mut s = self.lock();
        s.drain_events();
        s.commit(consumer, CommitMode::Sync, true);
        s.forget(&partitions);
    }

    fn post_rebalance(&self, consumer: &BaseConsumer<Self>, rebalance: &Rebalance<'_>) {
        if let Rebalance::Assign(tpl) = rebalance {
            let partitions: Vec<i32> = tpl.elements().iter().map(|e| e.partition()).collect();
            tracing::info!(?partitions, "partitions assigned");
            self.lock().assigned.extend(partitions.iter().copied());
            // librdkafka keeps a partition's pause across revoke and re-assign, but the
            // revoke forgot our paused flag: without this a partition paused before a
            // rebalance would never be read again.
            if let Err(e) = consumer.resume(tpl) {
                tracing::warn!(error = %e, "cannot resume the assigned partitions");
            }
        }
    }

    /// Records offsets an async commit stored, so that progress behind them may go; a
    /// failed one's watermarks are handed out again for the commit timer.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        let marks = marks_of(offsets);
        if marks.is_empty() {
            return;
        }
        if result.is_err() {
            // Served from a poll, outside any use of the state (try_lock: never a
            // re-entrant deadlock should librdkafka call it from within a commit).
            if let Some(mut s) = self.state.try_lock() {
                async_commit_done(&mut s.tracker, &result, &marks);
            }
            return;
        }
        // Advisory (prune only): a full queue skips it, the next commit records it.
        let _ = self.outcomes.record(Record::Committed(marks));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;

    /// Fails the first `fail` commits, records the others.
    struct Flaky {
        fail: std::cell::Cell<usize>,
        committed: RefCell<Vec<Vec<(i32, i64)>>>,
    }

    impl CommitOffsets for Flaky {
        fn commit_offsets(&self, offsets: &TopicPartitionList, _: CommitMode) -> KafkaResult<()> {
            if self.fail.get() > 0 {
                self.fail.set(self.fail.get() - 1);
                return Err(rdkafka::error::KafkaError::ConsumerCommit(
                    rdkafka::types::RDKafkaErrorCode::RequestTimedOut,
                ));
            }
            self.committed.borrow_mut().push(marks_of(offsets));
            Ok(())
        }
    }

    /// The consumer's commit timer: a tick commits what moved since the last one.
    fn tick(tracker: &mut OffsetTracker, to: &Flaky) -> Option<Vec<(i32, i64)>> {
        commit_watermarks(tracker, "jobs", to, CommitMode::Async, false)
    }

    #[test]
    fn a_failed_commit_is_retried_at_the_next_tick_though_the_watermark_stays() {
        let mut tracker = OffsetTracker::default();
        for o in 0..5 {
            tracker.started(1, o);
            tracker.finished(1, o);
        }
        let to = Flaky {
            fail: 1.into(),
            committed: RefCell::default(),
        };
        assert_eq!(tick(&mut tracker, &to), None, "the first commit fails");
        // Nothing new finished: the same watermark goes again.
        assert_eq!(tick(&mut tracker, &to), Some(vec![(1, 5)]));
        assert_eq!(*to.committed.borrow(), vec![vec![(1, 5)]]);
        assert_eq!(tick(&mut tracker, &to), None, "committed once, not again");
    }

    #[test]
    fn the_periodic_full_commit_resends_a_watermark_whose_failure_went_unreported() {
        let mut tracker = OffsetTracker::default();
        tracker.started(2, 0);
        tracker.finished(2, 0);
        let to = Flaky {
            fail: 0.into(),
            committed: RefCell::default(),
        };
        // Handed over; its failure never reported: the moved-only tick has nothing.
        assert!(tick(&mut tracker, &to).is_some());
        assert_eq!(tick(&mut tracker, &to), None);
        // The timer's full commit (RECOMMIT_EVERY) sends it again.
        let full = commit_watermarks(&mut tracker, "jobs", &to, CommitMode::Async, true);
        assert_eq!(full, Some(vec![(2, 1)]));
        assert_eq!(to.committed.borrow().len(), 2);
    }

    #[test]
    fn an_async_commit_that_fails_later_is_retried_at_the_next_tick() {
        let mut tracker = OffsetTracker::default();
        tracker.started(0, 7);
        tracker.finished(0, 7);
        let to = Flaky {
            fail: 0.into(),
            committed: RefCell::default(),
        };
        // Handed to librdkafka; the broker refuses it later (the commit callback).
        let marks = tick(&mut tracker, &to).expect("a commit");
        let refused = Err(rdkafka::error::KafkaError::ConsumerCommit(
            rdkafka::types::RDKafkaErrorCode::NotCoordinator,
        ));
        async_commit_done(&mut tracker, &refused, &marks);
        assert_eq!(tick(&mut tracker, &to), Some(vec![(0, 8)]), "retried");
        async_commit_done(&mut tracker, &Ok(()), &[(0, 8)]);
        assert_eq!(tick(&mut tracker, &to), None);
    }
}
