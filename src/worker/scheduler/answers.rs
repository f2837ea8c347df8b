//! What the scheduler does with each answer class ([`SendOutcome`]): the device is
//! finished, retried, dead-lettered, held, or the campaign halts.
//!
//! Halts never burn through a campaign's devices:
//! - until a campaign's sends are known to be taken (any answer other than a halt, a
//!   mismatch or a provider retry), at most [`PROBE_IN_FLIGHT`] of them are in flight, so a
//!   configuration error costs at most that many sends before the campaign stops;
//! - a device answered with a halt is not finished: it waits at the head of its campaign's
//!   retries for the resume, and nothing is dead-lettered because of the halt;
//! - a provider-wide halt stops every campaign on that provider before its next send.
//!
//! A [`SendOutcome::Mismatch`] (APNs `BadDeviceToken`, FCM `SENDER_ID_MISMATCH`) is held
//! during a campaign's first [`MISMATCH_WINDOW`] answers: when most of them are
//! mismatches, the tokens belong to another environment or sender and the campaign halts
//! with its devices untouched; otherwise the held devices are settled one by one.

use super::{Completion, RetryItem, Scheduler};
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::sender::{retry_delay, HaltScope, SendOutcome};
use crate::stats::Outcome;
use crate::worker::outcomes::Record;
use std::cmp::Reverse;
use std::sync::Arc;

/// Sends in flight for a campaign whose sends are not yet known to be taken. A halt
/// stops the campaign after at most this many failed sends (the bound is 10).
pub const PROBE_IN_FLIGHT: u32 = 4;
/// Answers of a campaign watched for a majority of mismatches.
pub const MISMATCH_WINDOW: u32 = 100;
/// Mismatches needed before a majority counts: fewer are judged device by device.
pub const MISMATCH_MIN: u32 = 10;

/// A campaign's halt, as the scheduler holds it.
#[derive(Debug, Clone)]
pub(super) struct HaltState {
    pub(super) reason: Arc<str>,
    /// The store has reported the campaign halted since (so a later "active" is a resume).
    pub(super) confirmed: bool,
    /// The campaign was paused when it halted (an operator's resume ends both).
    pub(super) was_paused: bool,
}

/// The first answers of a campaign, for the mismatch rule.
#[derive(Debug, Default)]
pub(super) struct MismatchWindow {
    answers: u32,
    mismatches: u32,
    /// The first mismatch's reason, for the halt message.
    reason: Option<String>,
    held: Vec<Held>,
    closed: bool,
}

#[derive(Debug)]
struct Held {
    slot: u32,
    device: u32,
    attempt: u32,
    first_failed: Nanos,
    dead_token: bool,
    reason: String,
}

impl MismatchWindow {
    pub(super) fn holds(&self) -> bool {
        !self.held.is_empty()
    }
}

impl Scheduler {
    /// Records the outcome of one send.
    pub fn complete(&mut self, done: Completion, now: Nanos, unix_sec: u64) {
        let Completion {
            slot,
            device,
            attempt,
            first_failed,
            outcome,
            latency_ns,
            epoch,
        } = done;
        let Some(cslot) = self.release_in_flight((slot, device), &outcome, latency_ns, now) else {
            return;
        };
        let retry = (slot, device, attempt, first_failed);
        if matches!(
            outcome,
            SendOutcome::Delivered | SendOutcome::DeadToken { .. } | SendOutcome::Rejected { .. }
        ) {
            self.origin_answered(cslot, slot, device, unix_sec);
        }
        let outcome = self.app_answer(retry, epoch, outcome, now);
        if let Some(outcome) = outcome {
            if self.apply_answer(cslot, retry, outcome, now, unix_sec) {
                self.finish_device(slot, device);
            }
        }
        self.after_ended_answer(slot, now, unix_sec);
        // Room in flight, a retry to schedule: its next turn has something to look at,
        // unless its limiter named a later instant (it sleeps until then, and a retry
        // needs a permit too): a slow campaign would otherwise take two turns per send.
        let limited = self.campaigns[cslot as usize]
            .as_ref()
            .and_then(|c| c.next_at)
            .is_some_and(|t| t > now);
        if !limited {
            self.mark_ready(cslot);
        }
        self.settle_mismatches_if_idle(cslot, now, unix_sec);
        self.check_revoke_done();
    }

    /// Takes an answered send out of the in-flight counts (job, provider, pool,
    /// campaign) and feeds its provider's lane; returns the campaign's slot, or `None`
    /// for a job that is gone.
    fn release_in_flight(
        &mut self,
        (slot, device): (u32, u32),
        outcome: &SendOutcome,
        latency_ns: u64,
        now: Nanos,
    ) -> Option<u32> {
        let job = self.jobs[slot as usize].as_mut()?;
        job.in_flight -= 1;
        let cslot = job.campaign;
        let provider = job.job.provider_slot;
        if let Some(n) = self.provider_in_flight.get_mut(usize::from(provider)) {
            *n = n.saturating_sub(1);
        }
        self.in_flight -= 1;
        self.lane_answer(slot, device, outcome, latency_ns, now);
        let c = self.campaigns[cslot as usize]
            .as_mut()
            .expect("campaign of job");
        c.in_flight -= 1;
        if !matches!(
            outcome,
            SendOutcome::Halt { .. }
                | SendOutcome::Mismatch { .. }
                | SendOutcome::RetryProvider { .. }
        ) {
            c.confirmed = true;
        }
        Some(cslot)
    }

    /// Acts on one answer's class; returns whether the device is finished.
    fn apply_answer(
        &mut self,
        cslot: u32,
        retry: (u32, u32, u32, Nanos),
        outcome: SendOutcome,
        now: Nanos,
        unix_sec: u64,
    ) -> bool {
        let (slot, device, _, _) = retry;
        match outcome {
            SendOutcome::Delivered => {
                if let Some(c) = self.campaigns[cslot as usize].as_mut() {
                    c.counter.record(unix_sec, Outcome::Sent, 1);
                    c.sent += 1;
                }
                self.counters.delivered += 1;
                self.count_answer(cslot, false);
                true
            }
            SendOutcome::DeadToken { reason } => {
                self.count_answer(cslot, false);
                self.dead_token(slot, device, reason, unix_sec);
                true
            }
            SendOutcome::RetryDevice { after, reason }
            | SendOutcome::RetryProvider { after, reason, .. } => {
                self.retry(retry, after, reason, now, unix_sec);
                false
            }
            SendOutcome::Rejected { status, reason } => {
                self.count_answer(cslot, false);
                self.rejected(slot, device, status, &reason, unix_sec);
                false
            }
            SendOutcome::Mismatch { dead_token, reason } => {
                self.mismatch(retry, dead_token, reason, now, unix_sec)
            }
            SendOutcome::Halt {
                scope: HaltScope::Majority,
                reason,
            } => {
                self.count_answer(cslot, false);
                self.refused(cslot, retry, reason, now, unix_sec);
                false
            }
            SendOutcome::Halt { scope, reason } => {
                if scope == HaltScope::Provider {
                    let provider = self.jobs[slot as usize]
                        .as_ref()
                        .map_or(0, |j| j.job.provider_slot);
                    self.halt_provider(provider, &reason);
                }
                self.halt_campaign(cslot, &reason, now);
                self.hold_after_halt(retry, &reason, now, unix_sec);
                false
            }
        }
    }

    fn finish_device(&mut self, slot: u32, device: u32) {
        let job = self.jobs[slot as usize].as_mut().expect("job");
        job.mark_done(device);
        if job.done_count == job.total() {
            self.finish_job(slot);
        }
    }

    /// Counts one answer into the campaign's mismatch window (`mismatch`: it was one).
    fn count_answer(&mut self, cslot: u32, mismatch: bool) {
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        let w = &mut c.mismatch;
        if w.closed {
            return;
        }
        w.answers += 1;
        w.mismatches += u32::from(mismatch);
    }

    fn dead_token(&mut self, slot: u32, device: u32, reason: String, unix_sec: u64) {
        let Some(job) = self.jobs[slot as usize].as_ref() else {
            return;
        };
        let c = self.campaigns[job.campaign as usize]
            .as_mut()
            .expect("campaign of job");
        c.counter.record(unix_sec, Outcome::Invalid, 1);
        c.invalid += 1;
        let record = Record::InvalidToken {
            token: job.job.devices[device as usize].clone(),
            provider: self.providers.get(job.job.provider_slot).name.clone(),
            reason,
            campaign_id: c.settings.id.clone(),
            job_id: job.job.job_id.clone(),
            device,
        };
        self.queue_record(record, None);
    }

    pub(super) fn rejected(
        &mut self,
        slot: u32,
        device: u32,
        status: Option<u16>,
        reason: &str,
        unix_sec: u64,
    ) {
        let Some(job) = self.jobs[slot as usize].as_ref() else {
            return;
        };
        let c = self.campaigns[job.campaign as usize]
            .as_mut()
            .expect("campaign of job");
        c.counter.record(unix_sec, Outcome::Rejected, 1);
        c.failed += 1;
        let reason = match status {
            Some(s) => format!("rejected by the provider (HTTP {s}): {reason}"),
            None => format!("rejected: {reason}"),
        };
        self.dead_letter(slot, device, reason);
    }

    /// A retry after `after` (or the backoff), or, once the retries and the time to give
    /// up are both spent, a dead letter.
    fn retry(
        &mut self,
        (slot, device, attempt, first_failed): (u32, u32, u32, Nanos),
        after: Option<std::time::Duration>,
        reason: String,
        now: Nanos,
        unix_sec: u64,
    ) {
        let Some(job) = self.jobs[slot as usize].as_ref() else {
            return;
        };
        let (cslot, partition) = (job.campaign, job.partition);
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        c.counter.record(unix_sec, Outcome::Retried, 1);
        c.retried += 1;
        self.retries_total.increment(1);
        // Reasons never hold a secret (the adapters keep tokens and keys out of them).
        tracing::debug!(campaign = %c.settings.id, device, attempt, reason = %reason, "send to be retried");
        let since = if attempt == 0 { now } else { first_failed };
        if self.is_revoking(partition) {
            // Its next owner sends it; a retry here would outlast the drain.
            return;
        }
        let give_up_ns = self.config.give_up_after.as_nanos() as Nanos;
        if attempt + 1 >= self.config.max_attempts && now.saturating_sub(since) >= give_up_ns {
            let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
            c.counter.record(unix_sec, Outcome::Failed, 1);
            c.failed += 1;
            let reason = format!(
                "gave up after {} attempts over {:.1} s; last: {reason}",
                attempt + 1,
                now.saturating_sub(since) as f64 / NANOS_PER_SEC as f64
            );
            self.dead_letter(slot, device, reason);
            return;
        }
        let delay = retry_delay(
            attempt + 1,
            after,
            self.config.retry_base,
            self.config.retry_max,
        );
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        c.retries.push(Reverse(RetryItem {
            not_before: now + delay.as_nanos() as Nanos,
            slot,
            device,
            attempt: attempt + 1,
            first_failed: since,
        }));
    }

    /// Puts a device back at the head of its campaign's work, unchanged, for when the
    /// campaign sends again.
    pub(super) fn hold_for_resume(
        &mut self,
        (slot, device, attempt, first_failed): (u32, u32, u32, Nanos),
        now: Nanos,
    ) {
        let Some(job) = self.jobs[slot as usize].as_ref() else {
            return;
        };
        if self.is_revoking(job.partition) {
            return;
        }
        let c = self.campaigns[job.campaign as usize]
            .as_mut()
            .expect("campaign");
        c.retries.push(Reverse(RetryItem {
            not_before: now,
            slot,
            device,
            attempt,
            first_failed,
        }));
    }

    fn mismatch(
        &mut self,
        retry: (u32, u32, u32, Nanos),
        dead_token: bool,
        reason: String,
        now: Nanos,
        unix_sec: u64,
    ) -> bool {
        let (slot, device, attempt, first_failed) = retry;
        let cslot = self.jobs[slot as usize].as_ref().map_or(0, |j| j.campaign);
        let closed = self.campaigns[cslot as usize]
            .as_ref()
            .is_none_or(|c| c.mismatch.closed);
        if closed {
            return self.settle_one(slot, device, dead_token, reason, unix_sec);
        }
        self.count_answer(cslot, true);
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        c.mismatch.reason.get_or_insert_with(|| reason.clone());
        c.mismatch.held.push(Held {
            slot,
            device,
            attempt,
            first_failed,
            dead_token,
            reason,
        });
        self.judge_mismatches(cslot, false, now, unix_sec);
        false
    }

    /// A held mismatch settled as what it is for one device: a dead token (finished) or
    /// a rejection (dead-lettered). True when the device is finished now.
    fn settle_one(
        &mut self,
        slot: u32,
        device: u32,
        dead_token: bool,
        reason: String,
        unix_sec: u64,
    ) -> bool {
        if dead_token {
            self.dead_token(slot, device, reason, unix_sec);
            true
        } else {
            self.rejected(slot, device, None, &reason, unix_sec);
            false
        }
    }

    /// Halts the campaign when most of its first answers were mismatches; closes the
    /// window (settling what it held) once they cannot be, or when the campaign has
    /// nothing else to learn from (`idle`).
    fn judge_mismatches(&mut self, cslot: u32, idle: bool, now: Nanos, unix_sec: u64) {
        let Some(c) = self.campaigns[cslot as usize].as_mut() else {
            return;
        };
        let w = &mut c.mismatch;
        if w.closed {
            return;
        }
        let majority = w.mismatches >= MISMATCH_MIN && w.mismatches * 2 > w.answers;
        if majority {
            let reason = format!(
                "{} of the campaign's first {} answers were: {}; the tokens belong to \
                 another environment (sandbox/production) or sender than the provider's",
                w.mismatches,
                w.answers,
                w.reason.as_deref().unwrap_or("a mismatch")
            );
            let held = std::mem::take(&mut w.held);
            *w = super::answers::MismatchWindow::default();
            self.halt_campaign(cslot, &reason, now);
            for h in held {
                let retry = (h.slot, h.device, h.attempt, h.first_failed);
                self.hold_after_halt(retry, &reason, now, unix_sec);
            }
            return;
        }
        let decided = (w.answers - w.mismatches) * 2 >= MISMATCH_WINDOW
            || w.answers >= MISMATCH_WINDOW
            || (idle && w.mismatches * 2 <= w.answers)
            || (idle && w.mismatches < MISMATCH_MIN);
        if !decided {
            return;
        }
        w.closed = true;
        for h in std::mem::take(&mut w.held) {
            if self.settle_one(h.slot, h.device, h.dead_token, h.reason, unix_sec) {
                self.finish_device(h.slot, h.device);
            }
        }
    }

    /// A campaign holding mismatches or refusals with nothing else in flight or to send
    /// decides now.
    fn settle_mismatches_if_idle(&mut self, cslot: u32, now: Nanos, unix_sec: u64) {
        let Some(c) = self.campaigns[cslot as usize].as_ref() else {
            return;
        };
        let (mismatches, refusals) = (c.mismatch.holds(), c.refusals.holds());
        if !(mismatches || refusals) || c.in_flight > 0 || c.halt.is_some() {
            return;
        }
        let more = !c.retries.is_empty()
            || c.queue.iter().any(|&j| {
                self.jobs[j as usize]
                    .as_ref()
                    .is_some_and(|job| job.next < job.total())
            });
        if more {
            return;
        }
        if mismatches {
            self.judge_mismatches(cslot, true, now, unix_sec);
        }
        if refusals {
            self.settle_refusals(cslot, true, unix_sec);
        }
    }

    /// Stops a campaign's sends until an operator resumes it, and records why.
    pub(super) fn halt_campaign(&mut self, cslot: u32, reason: &str, now: Nanos) {
        let Some(c) = self.campaigns[cslot as usize].as_mut() else {
            return;
        };
        if c.halt.is_some() {
            return;
        }
        tracing::warn!(campaign = %c.settings.id, reason, "campaign halted by its provider's answer");
        c.halt = Some(HaltState {
            reason: Arc::from(reason),
            confirmed: false,
            was_paused: c.settings.paused,
        });
        c.next_at = None;
        self.counters.live_changes += 1;
        self.halts_total.increment(1);
        let record = Record::Halt {
            campaign_id: c.settings.id.clone(),
            reason: reason.to_string(),
        };
        self.queue_record(record, None);
        self.rebalance(now);
    }

    /// Marks a provider halted: every campaign on it halts before its next send.
    fn halt_provider(&mut self, provider: u16, reason: &str) {
        let slot = usize::from(provider);
        if self.provider_halts.len() <= slot {
            self.provider_halts.resize(slot + 1, None);
        }
        if self.provider_halts[slot].is_none() {
            let name = self.providers.get(provider).name.clone();
            tracing::error!(provider = %name, reason, "provider halted: its configuration was refused");
            self.provider_halts[slot] = Some(Arc::from(format!("provider {name}: {reason}")));
        }
    }

    /// The halt of the provider a job sends through, if any.
    pub(super) fn provider_halt(&self, provider: u16) -> Option<Arc<str>> {
        self.provider_halts
            .get(usize::from(provider))
            .and_then(Clone::clone)
    }

    /// Applies the store's view of a halted campaign: a halt it has recorded is
    /// confirmed; an "active" after that (or after a pause the halt began in) is the
    /// operator's resume: the campaign probes its provider again, and the providers its
    /// work goes to are trusted again.
    pub(super) fn apply_halt_settings(&mut self, cslot: u32, halted: bool, paused: bool) {
        let Some(c) = self.campaigns[cslot as usize].as_mut() else {
            return;
        };
        let Some(h) = c.halt.as_mut() else {
            return;
        };
        if halted {
            h.confirmed = true;
            return;
        }
        if paused || !(h.confirmed || h.was_paused) {
            return;
        }
        tracing::info!(campaign = %c.settings.id, "campaign resumed after a halt");
        c.halt = None;
        c.confirmed = false;
        c.mismatch = MismatchWindow::default();
        self.restart_refusals(cslot);
        let Some(c) = self.campaigns[cslot as usize].as_ref() else {
            return;
        };
        let mut providers: Vec<u16> = c
            .retries
            .iter()
            .map(|Reverse(r)| r.slot)
            .chain(c.queue.iter().copied())
            .filter_map(|j| self.jobs[j as usize].as_ref().map(|j| j.job.provider_slot))
            .collect();
        providers.sort_unstable();
        providers.dedup();
        for p in providers {
            if let Some(h) = self.provider_halts.get_mut(usize::from(p)) {
                *h = None;
            }
        }
    }
}
