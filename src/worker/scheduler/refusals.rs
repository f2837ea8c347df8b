//! Answers judged by majority per (campaign, origin) ([`HaltScope::Majority`]: Web Push
//! 401/403/413, FCM `THIRD_PARTY_AUTH_ERROR`), and the resume cap of a device that halts
//! its campaign.
//!
//! Push services give these answers per subscription (one made under an older VAPID
//! key, a host an end user registered), so one device must not halt a campaign. A
//! refusal opens a window on its origin (a Web Push endpoint's scheme, host and port; for
//! other providers the provider): the last [`REFUSAL_WINDOW`] answers of the campaign
//! from there. The refused device is held; when at least [`REFUSAL_MIN`] of the window's
//! answers are refusals and they are most of it, the campaign halts with the held devices
//! waiting for the resume. Otherwise each held device is dead-lettered with its reason
//! once its window has decided (half of a full window answered otherwise, or a full
//! window without a majority), once the campaign has answered [`HOLD_ANSWERS`] times
//! since, or when the campaign has nothing else to send. At most [`MAX_ORIGINS`] windows
//! per campaign: a new origin takes the place of the one refused least lately.
//!
//! Campaigns without a recent refusal pay nothing per answer; while a window is open,
//! each answer costs reading its device's origin (a scan of the device text, no
//! allocation).
//!
//! A device that halts its campaign (any halt answer, or held in a majority) is held for
//! at most [`MAX_HALT_RESUMES`] resumes; halting it once more dead-letters it with the
//! reason, so a resume always gets past it.

use super::Scheduler;
use crate::limiter::Nanos;
use crate::provider::webpush::answer::Origin;
use crate::provider::ProviderKind;
use crate::stats::Outcome;
use std::collections::HashMap;

/// Answers of a campaign from one origin watched for a majority of refusals (the last
/// ones: a sliding window; at most 127, the ring's bits).
pub const REFUSAL_WINDOW: u32 = 100;
/// Refusals needed before a majority counts: fewer are judged device by device.
pub const REFUSAL_MIN: u32 = super::MISMATCH_MIN;
/// Resumes a device that halted its campaign waits for at the head of its work; halting
/// it once more dead-letters it with the halt's reason.
pub const MAX_HALT_RESUMES: u32 = 3;
/// Origins judged at once per campaign.
pub const MAX_ORIGINS: usize = 8;
/// A held refusal is settled once its campaign has answered this many times since: an
/// origin with a few devices never fills its window, and its job must finish.
pub const HOLD_ANSWERS: u64 = REFUSAL_WINDOW as u64;
/// A window holding nothing is dropped once its campaign has answered this many times
/// since its last refusal (or when its refusals have all slid out): an origin refused
/// once long ago no longer costs each answer an origin read.
pub const FORGET_ANSWERS: u64 = 10 * REFUSAL_WINDOW as u64;

/// A send's identity as the scheduler retries it: (job slot, device, attempt, first
/// failure).
type Retry = (u32, u32, u32, Nanos);

/// A campaign's refusal windows and the devices that halted it.
#[derive(Debug, Default)]
pub(super) struct Refusals {
    windows: Vec<Window>,
    /// The campaign's answers counted while a window was open.
    answers: u64,
    /// (partition, offset, device) → how often it halted the campaign.
    halted_by: HashMap<(i32, i64, u32), u32>,
}

#[derive(Debug)]
struct Window {
    key: u64,
    label: String,
    /// The last `len` answers, newest in bit 0: 1 a refusal.
    bits: u128,
    len: u32,
    refused: u32,
    /// `answers` at its last refusal (the least lately refused gives way).
    last_refused: u64,
    /// The first refusal's reason, for the halt.
    reason: String,
    held: Vec<HeldRefusal>,
}

#[derive(Debug)]
struct HeldRefusal {
    retry: Retry,
    /// Its job, to tell it from a later job in the same slot.
    job: (i32, i64),
    /// The campaign's `answers` when it was held.
    at: u64,
    reason: String,
}

impl Window {
    fn push(&mut self, refused: bool) {
        self.bits = (self.bits << 1) | u128::from(refused);
        self.refused += u32::from(refused);
        if self.len == REFUSAL_WINDOW {
            self.refused -= ((self.bits >> REFUSAL_WINDOW) & 1) as u32;
            self.bits &= (1u128 << REFUSAL_WINDOW) - 1;
        } else {
            self.len += 1;
        }
    }

    fn majority(&self) -> bool {
        self.refused >= REFUSAL_MIN && self.refused * 2 > self.len
    }

    /// Its refusals are not most of its answers, and will not be soon.
    fn decided(&self) -> bool {
        (self.len - self.refused) * 2 >= REFUSAL_WINDOW || self.len >= REFUSAL_WINDOW
    }
}

impl Refusals {
    pub(super) fn holds(&self) -> bool {
        self.windows.iter().any(|w| !w.held.is_empty())
    }

    /// A window is open: each answer reads its device's origin.
    pub(super) fn watching(&self) -> bool {
        !self.windows.is_empty()
    }
}

impl Scheduler {
    /// The key a device's answers are judged under: its endpoint's origin for Web Push,
    /// else its provider. `None`: no origin can be read (judged alone).
    fn origin_key(&self, slot: u32, device: u32) -> Option<u64> {
        let job = self.jobs[slot as usize].as_ref()?;
        let provider = job.job.provider_slot;
        if self.providers.get(provider).kind != ProviderKind::WebPush {
            return Some(u64::from(provider));
        }
        let origin = Origin::of(job.job.devices.get(device as usize)?)?;
        let mix = u64::from(provider).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        Some(origin.key().wrapping_add(mix))
    }

    /// What a window is named in a halt's reason.
    fn origin_label(&self, slot: u32, device: u32) -> String {
        let Some(job) = self.jobs[slot as usize].as_ref() else {
            return String::new();
        };
        let provider = self.providers.get(job.job.provider_slot);
        let origin = job.job.devices.get(device as usize).and_then(|d| {
            (provider.kind == ProviderKind::WebPush)
                .then(|| Origin::of(d))
                .flatten()
        });
        match origin {
            Some(o) => o.text(),
            None => format!("provider {}", provider.name),
        }
    }

    /// An answer that is not a refusal (delivered, dead token, rejected), for the window
    /// of its device's origin when the campaign has any.
    pub(super) fn origin_answered(&mut self, cslot: u32, slot: u32, device: u32, unix_sec: u64) {
        let watching = self.campaigns[cslot as usize]
            .as_ref()
            .is_some_and(|c| c.refusals.watching());
        if !watching {
            return;
        }
        let key = self.origin_key(slot, device);
        let r = &mut self.campaigns[cslot as usize]
            .as_mut()
            .expect("campaign")
            .refusals;
        r.answers += 1;
        if let Some(w) = r.windows.iter_mut().find(|w| Some(w.key) == key) {
            w.push(false);
        }
        self.settle_refusals(cslot, false, unix_sec);
    }

    /// A [`HaltScope::Majority`] answer: the device is held in its origin's window, and
    /// the window judged.
    pub(super) fn refused(
        &mut self,
        cslot: u32,
        retry: Retry,
        reason: String,
        now: Nanos,
        unix_sec: u64,
    ) {
        let (slot, device, ..) = retry;
        let Some(c) = self.campaigns[cslot as usize].as_ref() else {
            return;
        };
        if c.halt.is_some() {
            // Sent before the halt: it waits with the others.
            self.hold_for_resume(retry, now);
            return;
        }
        let (Some(key), Some(job)) = (self.origin_key(slot, device), self.job_id(slot)) else {
            self.rejected(slot, device, None, &reason, unix_sec);
            return;
        };
        let idx = self.refusal_window(cslot, key, slot, device, &reason, unix_sec);
        let r = &mut self.campaigns[cslot as usize]
            .as_mut()
            .expect("campaign")
            .refusals;
        r.answers += 1;
        let at = r.answers;
        let w = &mut r.windows[idx];
        w.push(true);
        w.last_refused = at;
        w.held.push(HeldRefusal {
            retry,
            job,
            at,
            reason,
        });
        if r.windows[idx].majority() {
            self.halt_on_refusals(cslot, idx, now, unix_sec);
        } else {
            self.settle_refusals(cslot, false, unix_sec);
        }
    }

    /// The index of `key`'s window, opened (in the place of the least lately refused
    /// one when [`MAX_ORIGINS`] are open) if it has none.
    fn refusal_window(
        &mut self,
        cslot: u32,
        key: u64,
        slot: u32,
        device: u32,
        reason: &str,
        unix_sec: u64,
    ) -> usize {
        let r = &self.campaigns[cslot as usize]
            .as_ref()
            .expect("campaign")
            .refusals;
        if let Some(i) = r.windows.iter().position(|w| w.key == key) {
            return i;
        }
        if r.windows.len() >= MAX_ORIGINS {
            let oldest = (0..r.windows.len())
                .min_by_key(|&i| r.windows[i].last_refused)
                .expect("windows");
            let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
            let gone = c.refusals.windows.swap_remove(oldest);
            for h in gone.held {
                self.settle_refusal(h, unix_sec);
            }
        }
        let label = self.origin_label(slot, device);
        let r = &mut self.campaigns[cslot as usize]
            .as_mut()
            .expect("campaign")
            .refusals;
        r.windows.push(Window {
            key,
            label,
            bits: 0,
            len: 0,
            refused: 0,
            last_refused: 0,
            reason: reason.to_string(),
            held: Vec::new(),
        });
        r.windows.len() - 1
    }

    /// Most of an origin's recent answers refused: the campaign halts; the devices held
    /// there halted it, those held for other origins only wait.
    fn halt_on_refusals(&mut self, cslot: u32, idx: usize, now: Nanos, unix_sec: u64) {
        let r = &mut self.campaigns[cslot as usize]
            .as_mut()
            .expect("campaign")
            .refusals;
        let w = &r.windows[idx];
        let reason = format!(
            "{} of the campaign's last {} answers from {} were refusals: {}",
            w.refused, w.len, w.label, w.reason
        );
        let windows = std::mem::take(&mut r.windows);
        r.answers = 0;
        let provider = self.campaigns[cslot as usize]
            .as_ref()
            .map_or(0, |c| c.provider);
        if self.is_app_slot(provider) {
            // The app's VAPID key is refused: the app halts, its devices wait for it.
            self.halt_app(provider, self.slot_epoch(provider), &reason);
            for w in windows {
                for h in w.held {
                    if self.job_id(h.retry.0) == Some(h.job) {
                        self.hold_for_resume(h.retry, now);
                    }
                }
            }
            return;
        }
        self.halt_campaign(cslot, &reason, now);
        for (i, w) in windows.into_iter().enumerate() {
            for h in w.held {
                if self.job_id(h.retry.0) != Some(h.job) {
                    continue;
                }
                if i == idx {
                    self.hold_after_halt(h.retry, &reason, now, unix_sec);
                } else {
                    self.hold_for_resume(h.retry, now);
                }
            }
        }
    }

    /// Dead-letters the held refusals that are only their device's: every one when
    /// `idle` or its window decided, else those held [`HOLD_ANSWERS`] answers ago. Drops
    /// the windows whose refusals have all slid out.
    pub(super) fn settle_refusals(&mut self, cslot: u32, idle: bool, unix_sec: u64) {
        let Some(c) = self.campaigns[cslot as usize].as_mut() else {
            return;
        };
        let r = &mut c.refusals;
        let mut settled = Vec::new();
        for w in &mut r.windows {
            let cut = if idle || w.decided() {
                w.held.len()
            } else {
                w.held
                    .iter()
                    .take_while(|h| r.answers - h.at >= HOLD_ANSWERS)
                    .count()
            };
            settled.extend(w.held.drain(..cut));
        }
        let answers = r.answers;
        r.windows.retain(|w| {
            !w.held.is_empty() || (w.refused > 0 && answers - w.last_refused < FORGET_ANSWERS)
        });
        for h in settled {
            self.settle_refusal(h, unix_sec);
        }
    }

    /// One held refusal dead-lettered with its reason (unless its job has gone).
    fn settle_refusal(&mut self, h: HeldRefusal, unix_sec: u64) {
        let (slot, device, ..) = h.retry;
        if self.job_id(slot) != Some(h.job) {
            return;
        }
        self.rejected(slot, device, None, &h.reason, unix_sec);
    }

    /// (partition, offset) of the job in `slot`.
    fn job_id(&self, slot: u32) -> Option<(i32, i64)> {
        let job = self.jobs.get(slot as usize)?.as_ref()?;
        Some((job.partition, job.offset))
    }

    /// A device whose answer halted its campaign waits for the resume, at most
    /// [`MAX_HALT_RESUMES`] times; once more, it is dead-lettered with `reason`.
    pub(super) fn hold_after_halt(
        &mut self,
        retry: Retry,
        reason: &str,
        now: Nanos,
        unix_sec: u64,
    ) {
        let (slot, device, ..) = retry;
        let Some(job) = self.jobs[slot as usize].as_ref() else {
            return;
        };
        let (cslot, partition, offset) = (job.campaign, job.partition, job.offset);
        if self.is_revoking(partition) {
            return;
        }
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        let halts = c
            .refusals
            .halted_by
            .entry((partition, offset, device))
            .or_insert(0);
        *halts += 1;
        let halts = *halts;
        if halts <= MAX_HALT_RESUMES {
            self.hold_for_resume(retry, now);
            return;
        }
        c.refusals.halted_by.remove(&(partition, offset, device));
        c.counter.record(unix_sec, Outcome::Failed, 1);
        c.failed += 1;
        let reason = format!(
            "halted its campaign {halts} times, resumed {} times; not held again: {reason}",
            halts - 1
        );
        self.dead_letter(slot, device, reason);
    }

    /// After a resume: the windows start again; the halt counts of devices whose job is
    /// still held stay.
    pub(super) fn restart_refusals(&mut self, cslot: u32) {
        let live: Vec<(i32, i64)> = self
            .jobs
            .iter()
            .flatten()
            .filter(|j| j.campaign == cslot)
            .map(|j| (j.partition, j.offset))
            .collect();
        let Some(c) = self.campaigns[cslot as usize].as_mut() else {
            return;
        };
        c.refusals.windows.clear();
        c.refusals.answers = 0;
        c.refusals
            .halted_by
            .retain(|(p, o, _), _| live.contains(&(*p, *o)));
    }
}

// The ring holds a full window and the bit leaving it.
const _: () = assert!(REFUSAL_WINDOW < 128);
