//! Recipients' local time in the scheduler: a campaign's `send_window`,
//! `deliver_at_local` and `late_policy`, in the zone each job states (`tz`; UTC when it
//! states none). The decision itself is [`crate::job::window::release`]; here a job
//! waits in its campaign's `scheduled` heap, as one with a `not_before` does, until its
//! zone's window opens, goes back there when the window closes with devices left, and
//! ends (counted `expired`, one letter) when its local time passed under `skip`.
//!
//! Most jobs never wait here: the intake parks a job whose window is closed when it is
//! read (`worker::consumer::windows`), as its offset alone. Here wait the jobs whose
//! window closed while they were sending, and those read before their campaign's rules
//! were known; while one waits, it covers its campaign's lookahead.

use super::lifecycle::End;
use super::*;
use crate::job::window::{self, format_local_time, LatePolicy, Release, Zone};

/// Zones shown per campaign: a producer groups devices by zone, and a page of a few
/// dozen rows is what a person reads.
pub const MAX_ZONES_SHOWN: usize = 24;

impl Scheduler {
    /// Moves `slot`'s scheduled jobs that became due at `now_ms` to its queue, each once
    /// its zone's local time allows; first, jobs whose window closed leave the queue.
    /// Returns the next instant (unix ms) a scheduled job comes due or a window closes.
    pub(super) fn release_due(
        &mut self,
        slot: u32,
        now: Nanos,
        now_ms: i64,
        unix_sec: u64,
    ) -> Option<i64> {
        self.close_windows(slot, now_ms);
        let Scheduler {
            campaigns, jobs, ..
        } = self;
        let c = campaigns[slot as usize].as_mut()?;
        let policy = c.settings.local;
        let mut skipped: Vec<u32> = Vec::new();
        let next_due = loop {
            let Some(&Reverse((t, jslot))) = c.scheduled.peek() else {
                break None;
            };
            if t > now_ms {
                break Some(t);
            }
            c.scheduled.pop();
            let Some(job) = jobs[jslot as usize].as_mut() else {
                continue;
            };
            let zone = job.job.zone.unwrap_or(Zone::UTC);
            // A job that was sending when its window closed is not late: it resumes.
            let decide = if job.closes_ms.is_some() {
                window::resume
            } else {
                window::release
            };
            match decide(&policy, &zone, now_ms) {
                Release::Now { closes_ms } => {
                    job.closes_ms = closes_ms;
                    if let Some(t) = closes_ms {
                        c.next_close_ms = Some(c.next_close_ms.map_or(t, |n| n.min(t)));
                    }
                    c.queue.push_back(jslot);
                }
                // Never at `now_ms` itself: a window that has just closed is not open.
                Release::At(t) => c.scheduled.push(Reverse((t.max(now_ms + 1), jslot))),
                Release::Skip => skipped.push(jslot),
            }
        };
        let next_close = c.next_close_ms;
        for j in skipped {
            self.end_job(j, End::LateSkip, now, unix_sec);
        }
        [next_due, next_close].into_iter().flatten().min()
    }

    /// Jobs whose window closed go back to wait for the next one; sends in flight and
    /// retries already asked for finish.
    fn close_windows(&mut self, slot: u32, now_ms: i64) {
        let Scheduler {
            campaigns, jobs, ..
        } = self;
        let Some(c) = campaigns[slot as usize].as_mut() else {
            return;
        };
        if c.next_close_ms.is_none_or(|t| t > now_ms) {
            return;
        }
        let mut next = None;
        let mut i = 0;
        while i < c.queue.len() {
            let jslot = c.queue[i];
            let closes = jobs[jslot as usize].as_ref().and_then(|j| j.closes_ms);
            match closes {
                Some(t) if t <= now_ms => {
                    c.queue.remove(i);
                    c.scheduled.push(Reverse((now_ms, jslot)));
                    tracing::debug!(campaign = %c.settings.id, "local window closed; the job waits for the next");
                }
                Some(t) => {
                    next = Some(next.map_or(t, |n: i64| n.min(t)));
                    i += 1;
                }
                None => i += 1,
            }
        }
        c.next_close_ms = next;
    }

    /// The distinct zones of `slot`'s held jobs (at most [`MAX_ZONES_SHOWN`]), for the
    /// API's next window per zone; none without local-time rules.
    pub(super) fn zones_of(&self, slot: u32) -> Vec<Zone> {
        let mut zones = Vec::new();
        let Some(c) = self.campaigns[slot as usize].as_ref() else {
            return zones;
        };
        if c.settings.local.is_empty() {
            return zones;
        }
        let held = c
            .queue
            .iter()
            .chain(c.scheduled.iter().map(|Reverse((_, j))| j));
        for &j in held {
            let zone = self.jobs[j as usize]
                .as_ref()
                .map(|j| j.job.zone.unwrap_or(Zone::UTC));
            if let Some(z) = zone.filter(|z| !zones.contains(z)) {
                zones.push(z);
                if zones.len() == MAX_ZONES_SHOWN {
                    break;
                }
            }
        }
        zones
    }

    /// After its local-time rules changed: every queued job is looked at again under
    /// the new ones (waiting ones are when they come due).
    pub(super) fn recheck_windows(&mut self, slot: u32, now: Nanos) {
        let now_ms = self.unix_ms_at(now);
        let Some(c) = self.campaigns[slot as usize].as_mut() else {
            return;
        };
        while let Some(j) = c.queue.pop_front() {
            c.scheduled.push(Reverse((now_ms, j)));
        }
        c.next_close_ms = None;
        self.mark_ready(slot);
    }

    /// The letter of a job whose local time had passed when it came due, under
    /// `late_policy: skip`.
    pub(super) fn late_skip_letter(&self, jslot: u32) -> Letter {
        let job = self.jobs[jslot as usize].as_ref().expect("job");
        let local = self.campaigns[job.campaign as usize]
            .as_ref()
            .map(|c| c.settings.local)
            .unwrap_or_default();
        let zone = job.job.zone.unwrap_or(Zone::UTC);
        let rule = match (local.deliver_at_local, local.window) {
            (Some(at), _) => format!("deliver_at_local {}", format_local_time(at)),
            (None, Some(w)) => format!(
                "send_window {}-{}",
                format_local_time(w.from_min),
                format_local_time(w.to_min)
            ),
            (None, None) => "its local time".to_string(),
        };
        let reason = format!(
            "{} of {} devices not sent: {rule} had passed in zone {zone} and the campaign's \
             late_policy is {}",
            job.ended.count,
            job.total(),
            LatePolicy::Skip
        );
        super::lifecycle::job_letter(job, DeadLetterKind::Expired, reason, Vec::new())
    }
}
