//! A campaign's and a job's life in the scheduler: start times (the campaign's
//! `start_at`, a job's `not_before`), expiry (the campaign's or the job's `expires_at`)
//! and cancel.
//!
//! Instants arrive as unix milliseconds; the scheduler runs on its monotonic clock. The
//! driver anchors one to the other each round ([`Scheduler::set_wall`]), so a start
//! falls on the round whose wake-up it named. A campaign waiting for its start holds
//! its jobs (the consumer parks the rest, offsets uncommitted) and takes no share under
//! a cap. At the start its limiter begins as for any idle campaign: at the send_rate,
//! with no more than its burst at once, however many devices became due.
//!
//! Expiry and cancel end a job's unsent devices without a send: counted `expired` or
//! `cancelled`, marked finished so that its offset moves on. Sends in flight finish as
//! they answer; a retry they ask for is ended too. An expired job gets one dead letter
//! (not one per device) with the count, once nothing of it is in flight; one of its
//! devices is finished only when that letter is durable, so the offset never passes a
//! letter still unwritten.

use super::*;

/// The longest a start or expiry wake-up is put off: later instants are looked at again
/// then, so a wall-clock step or a far start never overflows the timer.
const MAX_GATE_WAIT: Nanos = 60 * NANOS_PER_SEC;

/// What ends a job's unsent devices.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    Expired,
    Cancelled,
    /// Its app was deleted: counted failed, one `unknown_app` letter per job.
    AppDeleted,
    /// Its recipients' local time had passed under `late_policy: skip`: counted
    /// `expired`, one letter per job.
    LateSkip,
}

impl End {
    fn outcome(self) -> Outcome {
        match self {
            End::Expired | End::LateSkip => Outcome::Expired,
            End::Cancelled => Outcome::Cancelled,
            End::AppDeleted => Outcome::Failed,
        }
    }

    /// Whether the job's end is a letter (one per job, with the count).
    fn has_letter(self) -> bool {
        matches!(self, End::Expired | End::AppDeleted | End::LateSkip)
    }
}

/// A job's end, once one of them applies.
#[derive(Debug, Default)]
pub(super) struct JobEnd {
    pub(super) end: Option<End>,
    /// Devices counted `expired` or `cancelled`.
    pub(super) count: u32,
    /// The device finished when the expiry letter is durable.
    pub(super) held: Option<u32>,
    pub(super) letter_queued: bool,
}

impl Scheduler {
    /// Anchors the monotonic clock to the wall clock, `unix_nanos` since the epoch at
    /// `now`: for start and expiry times, and for where each second ends (`edge`). The
    /// driver passes the reading it takes the round's second from.
    pub fn set_wall(&mut self, now: Nanos, unix_nanos: u128) {
        self.wall = (now, (unix_nanos / 1_000_000) as i64);
        self.edge.set(now, unix_nanos);
    }

    pub(super) fn unix_ms_at(&self, t: Nanos) -> i64 {
        let (at, ms) = self.wall;
        ms + (t as i64 - at as i64) / 1_000_000
    }

    /// The instant (monotonic) of `unix_ms`, no later than [`MAX_GATE_WAIT`] after `now`.
    fn wake_at(&self, unix_ms: i64, now: Nanos) -> Nanos {
        let ahead = unix_ms.saturating_sub(self.unix_ms_at(now)).max(0) as u64;
        now + ahead.saturating_mul(1_000_000).min(MAX_GATE_WAIT)
    }

    /// Takes a job whose `not_before` is still ahead: it waits in its campaign's
    /// `scheduled` heap instead of the queue.
    pub(super) fn queue_job(&mut self, cslot: u32, jslot: u32, now: Nanos) {
        let not_before = self.jobs[jslot as usize]
            .as_ref()
            .and_then(|j| j.job.lifecycle.not_before_ms);
        let expires = self.jobs[jslot as usize]
            .as_ref()
            .and_then(|j| j.job.lifecycle.expires_at_ms);
        let now_ms = self.unix_ms_at(now);
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        if let Some(t) = expires {
            c.next_job_expiry = Some(c.next_job_expiry.map_or(t, |e: i64| e.min(t)));
        }
        let local = !c.settings.local.is_empty();
        match not_before {
            Some(t) if t > now_ms => c.scheduled.push(Reverse((t, jslot))),
            // Due now, but its zone's window decides: the gate looks at it first.
            _ if local => c.scheduled.push(Reverse((now_ms, jslot))),
            _ => c.queue.push_back(jslot),
        }
    }

    /// Before a campaign's turn: ends what expired, releases jobs that became due, and
    /// says whether it may send now. Returns `(may_send, wake)`.
    pub(super) fn lifecycle_gate(
        &mut self,
        slot: u32,
        now: Nanos,
        unix_sec: u64,
    ) -> (bool, Option<Nanos>) {
        let Some(c) = self.campaigns[slot as usize].as_ref() else {
            return (false, None);
        };
        let s = &c.settings;
        if s.start_at_ms.is_none()
            && s.expires_at_ms.is_none()
            && s.finish_by_ms.is_none()
            && c.scheduled.is_empty()
            && c.next_job_expiry.is_none()
            && c.next_close_ms.is_none()
            && !c.waiting_start
        {
            return (true, None);
        }
        let now_ms = self.unix_ms_at(now);
        if s.expires_at_ms.is_some_and(|t| now_ms >= t) {
            self.end_campaign_jobs(slot, End::Expired, now, unix_sec);
            return (false, None);
        }
        let mut wake = s.expires_at_ms.map(|t| self.wake_at(t, now));
        let starting = self.jittered_start_ms(s).filter(|&t| now_ms < t);
        if let Some(t) = starting {
            let w = self.wake_at(t, now);
            self.set_waiting_start(slot, true, now);
            return (false, Some(wake.map_or(w, |x| x.min(w))));
        }
        self.set_waiting_start(slot, false, now);
        if self.awaits_plan(slot, now_ms) {
            // The planner's first word comes within a second; it wakes the campaign.
            let w = now + NANOS_PER_SEC;
            return (false, Some(wake.map_or(w, |x| x.min(w))));
        }
        let next_due = self.release_due(slot, now, now_ms, unix_sec);
        let next_expiry = self.campaigns[slot as usize]
            .as_ref()
            .and_then(|c| c.next_job_expiry);
        if let Some(t) = next_due {
            let w = self.wake_at(t, now);
            wake = Some(wake.map_or(w, |x| x.min(w)));
        }
        if let Some(t) = next_expiry {
            if now_ms >= t {
                self.expire_due_jobs(slot, now_ms, now, unix_sec);
            }
            let c = self.campaigns[slot as usize].as_ref().expect("campaign");
            if let Some(t) = c.next_job_expiry {
                let w = self.wake_at(t, now);
                wake = Some(wake.map_or(w, |x| x.min(w)));
            }
        }
        (true, wake)
    }

    /// A campaign waiting for its start takes no share under a cap.
    fn set_waiting_start(&mut self, slot: u32, waiting: bool, now: Nanos) {
        let c = self.campaigns[slot as usize].as_mut().expect("campaign");
        if c.waiting_start != waiting {
            c.waiting_start = waiting;
            if !waiting {
                tracing::info!(campaign = %c.settings.id, "campaign start reached");
                c.next_at = None;
                self.start_ramp(slot, now);
                self.sync_rate(slot, now);
            }
            self.rebalance(now);
        }
    }

    /// Ends the jobs of `slot` whose own `expires_at` has passed.
    fn expire_due_jobs(&mut self, slot: u32, now_ms: i64, now: Nanos, unix_sec: u64) {
        let mut next: Option<i64> = None;
        let mut due = Vec::new();
        for (j, job) in self.jobs.iter().enumerate() {
            let Some(job) = job.as_ref().filter(|j| j.campaign == slot) else {
                continue;
            };
            match job.job.lifecycle.expires_at_ms {
                Some(t) if t <= now_ms => due.push(j as u32),
                Some(t) => next = Some(next.map_or(t, |n: i64| n.min(t))),
                None => {}
            }
        }
        if let Some(c) = self.campaigns[slot as usize].as_mut() {
            c.next_job_expiry = next;
        }
        for j in due {
            self.end_job(j, End::Expired, now, unix_sec);
        }
    }

    /// Ends every job of the campaign (its expiry, or its cancel).
    pub(super) fn end_campaign_jobs(&mut self, slot: u32, end: End, now: Nanos, unix_sec: u64) {
        let jobs: Vec<u32> = (0..self.jobs.len() as u32)
            .filter(|&j| {
                self.jobs[j as usize]
                    .as_ref()
                    .is_some_and(|job| job.campaign == slot)
            })
            .collect();
        for j in jobs {
            self.end_job(j, end, now, unix_sec);
        }
        self.release_campaign_if_idle(slot);
    }

    /// Ends a job's unsent devices: those never dispatched and those waiting for a
    /// retry. Sends in flight answer first. Called again after each answer of an ended
    /// job, so a retry it asks for ends too.
    pub(super) fn end_job(&mut self, jslot: u32, end: End, _now: Nanos, unix_sec: u64) {
        let Some(job) = self.jobs[jslot as usize].as_mut() else {
            return;
        };
        let cslot = job.campaign;
        if job.ended.end.is_none() {
            job.ended.end = Some(end);
            tracing::info!(campaign = %job.job.campaign_id, job = %job.job.job_id, ?end, "job ended");
        }
        let end = job.ended.end.unwrap_or(end);
        let Some(c) = self.campaigns[cslot as usize].as_mut() else {
            return;
        };
        c.queue.retain(|&s| s != jslot);
        c.scheduled.retain(|Reverse((_, s))| *s != jslot);
        let mut devices: Vec<u32> = Vec::new();
        c.retries.retain(|Reverse(r)| {
            let mine = r.slot == jslot;
            if mine {
                devices.push(r.device);
            }
            !mine
        });
        let job = self.jobs[jslot as usize].as_mut().expect("job");
        devices.extend((job.next..job.total()).filter(|&i| !job.is_done(i)));
        job.next = job.total();
        job.done_ahead = 0;
        job.dispatched.store(job.next, Ordering::Relaxed);
        let n = devices.len() as u32;
        for d in devices {
            if end.has_letter() && job.ended.held.is_none() {
                job.ended.held = Some(d);
                continue;
            }
            job.mark_done(d);
        }
        job.ended.count += n;
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        c.counter.record(unix_sec, end.outcome(), n);
        match end {
            End::Expired | End::LateSkip => {
                c.expired += u64::from(n);
                self.expired_total.increment(u64::from(n));
            }
            End::Cancelled => {
                c.cancelled += u64::from(n);
                self.cancelled_total.increment(u64::from(n));
            }
            End::AppDeleted => c.failed += u64::from(n),
        }
        self.settle_ended(jslot);
    }

    /// Once an ended job has nothing in flight: its expiry letter, or its finish.
    fn settle_ended(&mut self, jslot: u32) {
        let Some(job) = self.jobs[jslot as usize].as_mut() else {
            return;
        };
        if job.in_flight > 0 {
            return;
        }
        if let (Some(held), false) = (job.ended.held, job.ended.letter_queued) {
            job.ended.letter_queued = true;
            let letter = match job.ended.end {
                Some(End::AppDeleted) => self.unknown_app_letter(jslot),
                Some(End::LateSkip) => self.late_skip_letter(jslot),
                _ => self.expiry_letter(jslot),
            };
            let job = self.jobs[jslot as usize].as_ref().expect("job");
            let at = LetterFor {
                slot: jslot,
                partition: job.partition,
                offset: job.offset,
                device: held,
            };
            self.queue_record(Record::DeadLetter(Box::new(letter)), Some(at));
            return;
        }
        let job = self.jobs[jslot as usize].as_ref().expect("job");
        if job.done_count == job.total() {
            self.finish_job(jslot);
        }
    }

    fn expiry_letter(&self, jslot: u32) -> Letter {
        let job = self.jobs[jslot as usize].as_ref().expect("job");
        let c = self.campaigns[job.campaign as usize].as_ref();
        let campaign_end = c.and_then(|c| c.settings.expires_at_ms);
        let job_end = job.job.lifecycle.expires_at_ms;
        let (whose, at) = match (job_end, campaign_end) {
            (Some(j), Some(c)) if c < j => ("the campaign's", c),
            (Some(j), _) => ("the job's", j),
            (None, Some(c)) => ("the campaign's", c),
            (None, None) => ("an", 0),
        };
        let at = chrono::DateTime::from_timestamp_millis(at)
            .map_or_else(|| at.to_string(), |t| t.to_rfc3339());
        let reason = format!(
            "{} of {} devices not sent by {whose} expires_at ({at})",
            job.ended.count,
            job.total()
        );
        job_letter(job, DeadLetterKind::Expired, reason, Vec::new())
    }

    /// The letter of a job whose app was deleted: the job itself, to replay once the
    /// app is registered again (its finished devices are skipped by its progress).
    fn unknown_app_letter(&self, jslot: u32) -> Letter {
        let job = self.jobs[jslot as usize].as_ref().expect("job");
        let app = job.job.app_id.as_deref().unwrap_or("");
        let reason = format!(
            "app {} was deleted: {} of {} devices not sent",
            crate::job::echo(app),
            job.ended.count,
            job.total()
        );
        job_letter(job, DeadLetterKind::UnknownApp, reason, job.job.to_json())
    }

    /// After an answer for an ended job: ends what the answer left (a retry), and
    /// finishes it once nothing is in flight.
    pub(super) fn after_ended_answer(&mut self, jslot: u32, now: Nanos, unix_sec: u64) {
        let end = self.jobs[jslot as usize].as_ref().and_then(|j| j.ended.end);
        if let Some(end) = end {
            self.end_job(jslot, end, now, unix_sec);
        }
    }

    /// Cancels a campaign: every job it holds ends, and so does each later one.
    pub(super) fn cancel_campaign(&mut self, slot: u32, now: Nanos) {
        let unix_sec = u64::try_from(self.unix_ms_at(now) / 1000).unwrap_or(0);
        self.end_campaign_jobs(slot, End::Cancelled, now, unix_sec);
    }
}

/// A whole job's letter (not one device's), with `raw` as the message kept.
pub(super) fn job_letter(
    job: &ActiveJob,
    kind: DeadLetterKind,
    reason: String,
    raw: Vec<u8>,
) -> Letter {
    Letter {
        kind,
        partition: job.partition,
        offset: job.offset,
        campaign_id: Some(Arc::from(job.job.campaign_id.as_str())),
        job_id: Some(job.job.job_id.clone()),
        device: None,
        device_token: None,
        reason,
        key: None,
        raw,
        replay: None,
    }
}
