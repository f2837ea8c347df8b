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
use rdkafka::consumer::{BaseConsumer, CommitMode, Consumer, ConsumerContext, Rebalance};
use rdkafka::error::KafkaResult;
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

    pub fn commit(&mut self, consumer: &BaseConsumer<Ctx>, mode: CommitMode, all: bool) {
        let marks = if all {
            self.tracker.watermarks()
        } else {
            self.tracker.take_new_watermarks()
        };
        if marks.is_empty() {
            return;
        }
        let mut tpl = TopicPartitionList::new();
        for (p, o) in &marks {
            if tpl
                .add_partition_offset(&self.topic, *p, Offset::Offset(*o))
                .is_err()
            {
                continue;
            }
        }
        match consumer.commit(&tpl, mode) {
            Ok(()) => {
                self.stats.commits += 1;
                if matches!(mode, CommitMode::Sync) {
                    // An async commit is recorded by the commit callback.
                    let _ = self.outcomes.record(Record::Committed(marks));
                }
            }
            Err(e) => tracing::warn!(error = %e, "offset commit failed; will retry"),
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

/// The rebalance, commit and statistics hooks.
pub(super) struct Ctx {
    pub state: Arc<parking_lot::Mutex<State>>,
    pub control: mpsc::Sender<Control>,
    pub drain_timeout: Duration,
    pub flush_now: FlushNow,
    pub outcomes: Outcomes,
}

impl Ctx {
    fn lock(&self) -> parking_lot::MutexGuard<'_, State> {
        self.state.lock()
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

    /// Records offsets an async commit stored, so that progress behind them may go.
    fn commit_callback(&self, result: KafkaResult<()>, offsets: &TopicPartitionList) {
        if result.is_err() {
            return;
        }
        let marks: Vec<(i32, i64)> = offsets
            .elements()
            .iter()
            .filter_map(|e| match e.offset() {
                Offset::Offset(o) => Some((e.partition(), o)),
                _ => None,
            })
            .collect();
        if !marks.is_empty() {
            // Advisory (prune only): a full queue skips it, the next commit records it.
            let _ = self.outcomes.record(Record::Committed(marks));
        }
    }
}
