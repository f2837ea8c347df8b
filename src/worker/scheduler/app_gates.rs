//! The gates of the apps' provider slots.
//!
//! An app slot (`provider::app_slots`) is a provider like a static one (its cap, its
//! in-flight limit, its lane and ceiling, all by slot), with a gate in front: open
//! while the app router has built its provider from the app's credentials, closed while
//! the app is unknown, disabled or halted (the campaign shows `waiting for app X`), and
//! gone once the app is deleted (its jobs are dead-lettered as `unknown_app`). A closed
//! gate stops new sends only: those in flight answer through the provider they left on.
//!
//! Each install of a provider starts an epoch of the slot. An answer carries the epoch
//! it was sent in, so a halt that old credentials earned after a rotation does not halt
//! the new ones.

use super::lifecycle::End;
use super::*;
use crate::provider::app_slots::AppKey;
use crate::provider::ceiling::CeilingParams;
use crate::provider::Provider;

/// What the app router says of one app slot.
pub enum AppState {
    /// Its provider, built from the credentials with this public fingerprint.
    Ready {
        provider: Provider,
        fingerprint: Arc<str>,
    },
    /// Not registered, disabled, without this kind, not opened yet: its jobs wait.
    Waiting(Arc<str>),
    /// Halted (the store says so): its jobs wait until `apps enable` or a new PUT.
    Halted(Arc<str>),
    /// Deleted: its jobs are dead-lettered as `unknown_app`.
    Deleted,
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppState::Ready { fingerprint, .. } => write!(f, "Ready({fingerprint})"),
            AppState::Waiting(r) => write!(f, "Waiting({r})"),
            AppState::Halted(r) => write!(f, "Halted({r})"),
            AppState::Deleted => f.write_str("Deleted"),
        }
    }
}

/// One app slot's new state.
#[derive(Debug)]
pub struct AppUpdate {
    pub slot: u16,
    pub key: AppKey,
    pub state: AppState,
}

#[derive(Debug, Clone, PartialEq)]
pub(super) enum Gate {
    Open,
    /// Why its jobs wait (what the campaign shows).
    Closed(Arc<str>),
    Gone,
}

/// The limits a slot's cap, pool share and lane were built with.
type Limits = (Option<f64>, Option<u32>, Option<CeilingParams>);

pub(super) struct AppGate {
    key: AppKey,
    pub(super) gate: Gate,
    /// Bumped by each provider installed.
    epoch: u32,
    fingerprint: Option<Arc<str>>,
    limits: Option<Limits>,
}

impl Scheduler {
    /// The gate of app slot `slot`; `None` for a static provider (always open).
    pub(super) fn app_gate(&self, slot: u16) -> Option<&Gate> {
        let base = self.providers.apps().base();
        let i = usize::from(slot.checked_sub(base)?);
        self.app_gates.get(i).map(|g| &g.gate)
    }

    /// The app and kind of app slot `slot` (no lock: the scheduler's own copy).
    pub(super) fn app_key(&self, slot: u16) -> Option<&AppKey> {
        let base = self.providers.apps().base();
        let i = usize::from(slot.checked_sub(base)?);
        self.app_gates.get(i).map(|g| &g.key)
    }

    /// The epoch of `slot`'s provider (0 for a static one).
    pub(super) fn slot_epoch(&self, slot: u16) -> u32 {
        let base = self.providers.apps().base();
        slot.checked_sub(base)
            .and_then(|i| self.app_gates.get(usize::from(i)))
            .map_or(0, |g| g.epoch)
    }

    /// Why a campaign's next sends wait for their app, if they do.
    pub(super) fn waiting_for_app(&self, provider: u16) -> Option<Arc<str>> {
        match self.app_gate(provider)? {
            Gate::Closed(why) => Some(why.clone()),
            Gate::Open | Gate::Gone => None,
        }
    }

    /// Makes the per-slot state reach `slot` (app slots are given at intake, in order):
    /// each new one closed, with no cap and no ceiling until its provider is built.
    pub(super) fn ensure_slot(&mut self, slot: u16) {
        let base = self.providers.apps().base();
        if slot < base {
            return;
        }
        while usize::from(base) + self.app_gates.len() <= usize::from(slot) {
            let at = base + self.app_gates.len() as u16;
            let Some(key) = self.providers.apps().key(at) else {
                return;
            };
            let name: Arc<str> = Arc::from(key.name());
            let placeholder = Provider::closed(name.clone(), key.kind);
            Arc::make_mut(&mut self.providers).set(at, placeholder);
            self.grow_slot_vectors(usize::from(at) + 1);
            self.lanes[usize::from(at)] = lanes::Lane::named(name, None);
            let why = format!("waiting for app {}: opening", key.app_id);
            self.app_gates.push(AppGate {
                key,
                gate: Gate::Closed(Arc::from(why)),
                epoch: 0,
                fingerprint: None,
                limits: None,
            });
        }
    }

    fn grow_slot_vectors(&mut self, len: usize) {
        if self.provider_caps.len() < len {
            self.provider_caps.resize_with(len, || None);
            self.overdraft_caps.resize_with(len, || None);
            self.provider_in_flight.resize(len, 0);
            self.provider_max_in_flight.resize(len, u32::MAX);
        }
        while self.lanes.len() < len {
            let name = self.providers.get(self.lanes.len() as u16).name.clone();
            self.lanes.push(lanes::Lane::named(name, None));
        }
    }

    /// Applies the app router's word on one slot.
    pub fn apply_app(&mut self, update: AppUpdate, now: Nanos, unix_sec: u64) {
        let AppUpdate { slot, key, state } = update;
        self.ensure_slot(slot);
        let base = self.providers.apps().base();
        let Some(i) = slot.checked_sub(base).map(usize::from) else {
            return;
        };
        if self.app_gates.get(i).is_none_or(|g| g.key != key) {
            tracing::error!(slot, app = %key.app_id, "an app update for a slot this worker did not give");
            return;
        }
        self.counters.live_changes += 1;
        match state {
            AppState::Ready {
                provider,
                fingerprint,
            } => self.install(slot, provider, fingerprint, now),
            AppState::Waiting(why) | AppState::Halted(why) => {
                self.app_gates[i].gate = Gate::Closed(why);
            }
            AppState::Deleted => {
                self.app_gates[i].gate = Gate::Gone;
                self.end_slot_jobs(slot, now, unix_sec);
            }
        }
    }

    /// Installs a slot's provider: a new epoch, its limits, the gate open, and the
    /// campaigns waiting on it woken.
    fn install(&mut self, slot: u16, provider: Provider, fingerprint: Arc<str>, now: Nanos) {
        let i = usize::from(slot - self.providers.apps().base());
        let s = usize::from(slot);
        let limits: Limits = (
            provider.max_rate.map(|r| r.as_f64()),
            provider.max_in_flight,
            provider.adaptive,
        );
        if self.app_gates[i].limits.as_ref() != Some(&limits) {
            let quantum_min = self.config.quantum_min.as_nanos() as Nanos;
            self.provider_caps[s] = provider.max_rate.map(|r| caps::cap_limiter(r, quantum_min));
            self.overdraft_caps[s] = caps::overdraft_limiter(
                provider.max_rate,
                self.config.policy.critical_overdraft,
                quantum_min,
            );
            self.provider_max_in_flight[s] = provider.max_in_flight.unwrap_or(u32::MAX);
            self.lanes[s] = lanes::Lane::new(&provider);
        }
        tracing::info!(provider = %provider.name, %fingerprint, "app provider installed");
        Arc::make_mut(&mut self.providers).set(slot, provider);
        let g = &mut self.app_gates[i];
        g.limits = Some(limits);
        g.epoch = g.epoch.wrapping_add(1);
        g.fingerprint = Some(fingerprint);
        g.gate = Gate::Open;
        let waiting: Vec<u32> = self
            .active
            .iter()
            .copied()
            .filter(|&c| {
                self.campaigns[c as usize]
                    .as_ref()
                    .is_some_and(|c| c.provider == slot)
            })
            .collect();
        for c in waiting {
            self.mark_ready(c);
        }
        self.rebalance(now);
    }

    /// An answer through `slot` in `epoch` says the app's credentials are refused: the
    /// gate closes and the store records the halt (the app shows `halted`, and the
    /// router's next word comes from it). An answer of an earlier epoch is not about
    /// the credentials now installed: `false`, and the device is only retried.
    pub(super) fn halt_app(&mut self, slot: u16, epoch: u32, reason: &str) -> bool {
        let base = self.providers.apps().base();
        let Some(i) = slot.checked_sub(base).map(usize::from) else {
            return false;
        };
        let Some(g) = self.app_gates.get_mut(i) else {
            return false;
        };
        if g.epoch != epoch || g.gate != Gate::Open {
            return g.epoch == epoch;
        }
        let why = format!(
            "app {} {} halted: {reason}",
            g.key.app_id,
            g.key.kind.as_str()
        );
        tracing::error!(app = %g.key.app_id, kind = g.key.kind.as_str(), reason, "app halted: its credentials were refused");
        g.gate = Gate::Closed(Arc::from(why));
        self.halts_total.increment(1);
        self.counters.live_changes += 1;
        let record = Record::AppHalt {
            app_id: g.key.app_id.clone(),
            kind: g.key.kind,
            fingerprint: g.fingerprint.clone().unwrap_or_else(|| Arc::from("")),
            reason: reason.to_string(),
        };
        self.queue_record(record, None);
        true
    }

    /// A provider-scope halt through an app slot halts the app, not the campaign: the
    /// device waits for the gate (`None`: the answer is handled). Other answers pass.
    pub(super) fn app_answer(
        &mut self,
        retry: (u32, u32, u32, Nanos),
        epoch: u32,
        outcome: SendOutcome,
        now: Nanos,
    ) -> Option<SendOutcome> {
        let SendOutcome::Halt {
            scope: crate::sender::HaltScope::Provider,
            reason,
        } = &outcome
        else {
            return Some(outcome);
        };
        let provider = self.jobs[retry.0 as usize].as_ref()?.job.provider_slot;
        if !self.is_app_slot(provider) {
            return Some(outcome);
        }
        self.halt_app(provider, epoch, reason);
        self.hold_for_resume(retry, now);
        None
    }

    /// Whether `slot` is an app's.
    pub(super) fn is_app_slot(&self, slot: u16) -> bool {
        self.app_gate(slot).is_some()
    }

    /// Ends every held job through `slot` (its app was deleted).
    pub(super) fn end_slot_jobs(&mut self, slot: u16, now: Nanos, unix_sec: u64) {
        let jobs: Vec<u32> = (0..self.jobs.len() as u32)
            .filter(|&j| {
                self.jobs[j as usize]
                    .as_ref()
                    .is_some_and(|job| job.job.provider_slot == slot)
            })
            .collect();
        let mut campaigns: Vec<u32> = Vec::new();
        for j in jobs {
            if let Some(job) = self.jobs[j as usize].as_ref() {
                campaigns.push(job.campaign);
            }
            self.end_job(j, End::AppDeleted, now, unix_sec);
        }
        campaigns.sort_unstable();
        campaigns.dedup();
        for c in campaigns {
            self.release_campaign_if_idle(c);
        }
    }
}
