//! What leaves the scheduler: dead letters and other records on their way to the
//! outcomes stage (a device is done only once its letter is durable), finished jobs,
//! revocation of partitions, and the drain at shutdown.

use super::*;

/// Revocations under way, and the jobs of their partitions that came meanwhile.
#[derive(Default)]
pub(super) struct Revocations {
    /// Partitions being revoked, each set with the answer it waits for.
    pub(super) pending: Vec<(Vec<i32>, oneshot::Sender<()>)>,
    /// Jobs of a partition assigned again while still being revoked (its drain timed
    /// out in intake, the rebalance gave it back), in arrival order: added once no
    /// revocation of their partition is pending.
    pub(super) held: VecDeque<IncomingJob>,
}

/// A job read again while its earlier copy `old` was being revoked: the devices that
/// copy finished (its in-flight sends came back) are finished for it too, so they are
/// not sent twice.
fn carry_done(held: &mut VecDeque<IncomingJob>, old: &ActiveJob) {
    let same = |h: &&mut IncomingJob| {
        h.partition == old.partition && h.offset == old.offset && h.job.job_id == old.job.job_id
    };
    for h in held.iter_mut().filter(same) {
        h.skip_done
            .extend((0..old.total()).filter(|&i| old.is_done(i)));
        h.skip_done.sort_unstable();
        h.skip_done.dedup();
    }
}

impl Scheduler {
    pub(super) fn dead_letter(&mut self, slot: u32, device: u32, reason: String) {
        let job = self.jobs[slot as usize].as_ref().expect("job");
        let letter = Letter {
            kind: DeadLetterKind::Undeliverable,
            partition: job.partition,
            offset: job.offset,
            campaign_id: Some(Arc::from(job.job.campaign_id.as_str())),
            job_id: Some(job.job.job_id.clone()),
            device: Some(device),
            device_token: Some(job.job.devices[device as usize].clone()),
            reason,
            key: None,
            raw: Vec::new(),
            replay: Some(Arc::clone(&job.job)),
        };
        let at = LetterFor {
            slot,
            partition: job.partition,
            offset: job.offset,
            device,
        };
        self.queue_record(Record::DeadLetter(Box::new(letter)), Some(at));
    }

    pub(super) fn finish_job(&mut self, slot: u32) {
        let job = self.jobs[slot as usize].take().expect("job");
        self.free_jobs.push(slot);
        let cslot = job.campaign;
        let devices = job.total();
        if self.intake_gave_up(job.partition) {
            // Intake forgot the partition when it stopped waiting for its revocation;
            // a copy read again since counts instead.
            carry_done(&mut self.revoking.held, &job);
        } else {
            let _ = self.events.send(Event::JobFinished {
                partition: job.partition,
                offset: job.offset,
                devices,
                progress: job.progress,
            });
        }
        if let Some(c) = self.campaigns[cslot as usize].as_mut() {
            c.open_jobs -= 1;
        }
        self.release_campaign_if_idle(cslot);
    }

    /// Starts revoking partitions: their jobs leave the queues (no more dispatches, no
    /// retries); the answer goes once their in-flight sends are back. Several
    /// revocations may overlap, each answered on its own. Jobs of these partitions held
    /// for an earlier revocation go: intake forgets them now, and their next owner
    /// reads them again.
    pub fn start_revoke(&mut self, partitions: Vec<i32>, done: oneshot::Sender<()>) {
        for slot in 0..self.jobs.len() as u32 {
            let Some(job) = self.jobs[slot as usize].as_ref() else {
                continue;
            };
            if !partitions.contains(&job.partition) {
                continue;
            }
            if let Some(c) = self.campaigns[job.campaign as usize].as_mut() {
                c.queue.retain(|s| *s != slot);
                c.retries.retain(|Reverse(r)| r.slot != slot);
            }
        }
        self.revoking
            .held
            .retain(|j| !partitions.contains(&j.partition));
        self.revoking.pending.push((partitions, done));
        self.check_revoke_done();
    }

    pub(super) fn is_revoking(&self, partition: i32) -> bool {
        self.revoking
            .pending
            .iter()
            .any(|(p, _)| p.contains(&partition))
    }

    /// Whether intake stopped waiting for the revocation of `partition` (its drain
    /// timed out): it has forgotten the partition's offsets, so a job finished now must
    /// not reach it (the partition may be assigned again, its jobs read again).
    pub(super) fn intake_gave_up(&self, partition: i32) -> bool {
        self.revoking
            .pending
            .iter()
            .any(|(p, done)| p.contains(&partition) && done.is_closed())
    }

    /// Holds a job of a partition still being revoked (assigned again before the
    /// revoked sends came back): intake counts it, so it is added once the revocation
    /// completes, never dropped.
    pub(super) fn hold_until_revoked(&mut self, job: IncomingJob) {
        tracing::debug!(
            partition = job.partition,
            offset = job.offset,
            "job of a partition still being revoked; held until its sends are back"
        );
        self.revoking.held.push_back(job);
    }

    pub(super) fn check_revoke_done(&mut self) {
        let mut k = 0;
        let mut completed = false;
        while k < self.revoking.pending.len() {
            let partitions = &self.revoking.pending[k].0;
            let busy = self
                .jobs
                .iter()
                .flatten()
                .any(|j| partitions.contains(&j.partition) && j.in_flight > 0);
            if busy {
                k += 1;
                continue;
            }
            let (partitions, done) = self.revoking.pending.remove(k);
            self.carry_done_to_held(&partitions);
            self.drop_partitions(&partitions);
            let _ = done.send(());
            completed = true;
        }
        if completed {
            self.admit_held();
        }
    }

    /// Adds the held jobs whose partitions are no longer being revoked, in arrival
    /// order. Not during a round (a turn may be walking the queues): the next round's
    /// start admits them then.
    pub(super) fn admit_held(&mut self) {
        if self.in_round || self.revoking.held.is_empty() {
            return;
        }
        let held = std::mem::take(&mut self.revoking.held);
        let now = self.now_hint;
        for job in held {
            if self.is_revoking(job.partition) {
                self.revoking.held.push_back(job);
            } else {
                self.add_job(job, now);
            }
        }
    }

    /// Carries what the revoked jobs of `partitions` finished to their held copies.
    fn carry_done_to_held(&mut self, partitions: &[i32]) {
        if self.revoking.held.is_empty() {
            return;
        }
        for old in self.jobs.iter().flatten() {
            if partitions.contains(&old.partition) {
                carry_done(&mut self.revoking.held, old);
            }
        }
    }

    /// Queues a record for the outcomes stage; `at`: the device it finishes once durable.
    pub(super) fn queue_record(&mut self, record: Record, at: Option<LetterFor>) {
        let Some(outcomes) = &self.outcomes else {
            if let Some(at) = at {
                self.letter_durable(at);
            }
            return;
        };
        // Behind records still waiting for room, to keep their order.
        let waiting = self.letters.back().is_some_and(|l| l.seq.is_none());
        let (seq, record) = if waiting {
            (None, Some(record))
        } else {
            match outcomes.record(record) {
                Ok(seq) => (Some(seq), None),
                Err(r) => (None, Some(r)),
            }
        };
        self.letters.push_back(AwaitLetter { seq, record, at });
    }

    /// Queues the records that waited for room, and finishes the devices whose letters
    /// are durable.
    pub(super) fn settle_letters(&mut self) {
        if self.letters.is_empty() {
            return;
        }
        let Some(outcomes) = self.outcomes.clone() else {
            return;
        };
        for l in self.letters.iter_mut() {
            let Some(record) = l.record.take() else {
                continue;
            };
            match outcomes.record(record) {
                Ok(seq) => l.seq = Some(seq),
                Err(r) => {
                    l.record = Some(r);
                    break;
                }
            }
        }
        let durable = outcomes.durable();
        let mut k = 0;
        while k < self.letters.len() {
            match self.letters[k].seq {
                Some(seq) if seq < durable => {
                    let l = self.letters.remove(k).expect("index in range");
                    if let Some(at) = l.at {
                        self.letter_durable(at);
                    }
                }
                _ => k += 1,
            }
        }
    }

    /// A device's dead letter is stored: the device is finished.
    pub(super) fn letter_durable(&mut self, at: LetterFor) {
        let Some(job) = self.jobs[at.slot as usize].as_mut() else {
            return;
        };
        // The slot may hold another job by now (this one was revoked).
        if job.partition != at.partition || job.offset != at.offset || job.is_done(at.device) {
            return;
        }
        job.mark_done(at.device);
        if job.done_count == job.total() {
            self.finish_job(at.slot);
        }
        self.check_revoke_done();
    }

    /// While letters wait, the driver comes back soon to settle them.
    pub(super) fn letters_wake(&self, now: Nanos) -> Option<Nanos> {
        (!self.letters.is_empty()).then_some(now + LETTER_POLL.as_nanos() as Nanos)
    }

    /// Forgets the jobs of `partitions` (their next owner re-reads them).
    pub(super) fn drop_partitions(&mut self, partitions: &[i32]) {
        let slots: Vec<u32> = self
            .jobs
            .iter()
            .enumerate()
            .filter_map(|(i, j)| {
                j.as_ref()
                    .filter(|j| partitions.contains(&j.partition))
                    .map(|_| i as u32)
            })
            .collect();
        for slot in &slots {
            let job = self.jobs[*slot as usize].take().expect("job");
            self.free_jobs.push(*slot);
            if let Some(c) = self.campaigns[job.campaign as usize].as_mut() {
                c.open_jobs -= 1;
                c.queue.retain(|s| s != slot);
                c.retries.retain(|Reverse(r)| r.slot != *slot);
            }
        }
        let campaigns: Vec<u32> = (0..self.campaigns.len() as u32).collect();
        for c in campaigns {
            self.release_campaign_if_idle(c);
        }
    }

    /// Stops dispatching; in-flight sends still complete.
    pub fn drain(&mut self) {
        self.draining = true;
    }

    pub fn in_flight(&self) -> usize {
        self.in_flight
    }
}
