//! The delivery policy in the scheduler: a campaign's full rate (its send_rate, or a
//! finish-by plan under it), its ramp-up, its scheduled start's jitter, the provider
//! priority its class stamps on its jobs, and how long a class has gone without a share.

use super::caps::Want;
use super::ramp::{start_jitter_ms, Ramp, RAMP_TICK};
use super::*;
use crate::job::PriorityClass;

/// A share below this fraction of what a campaign wants counts as none: the classes
/// above it took the cap (`starved_ms`).
const STARVED_BELOW: f64 = 0.01;

impl Scheduler {
    /// What a campaign would send at with no cap: its send_rate, or its finish-by plan
    /// when lower, times its ramp's fraction now.
    pub(super) fn wanted_rate(&self, slot: u32, now: Nanos) -> f64 {
        let Some(c) = self.campaigns[slot as usize].as_ref() else {
            return 0.0;
        };
        let full = c
            .plan
            .map_or(c.settings.rate, |p| lower(p, c.settings.rate))
            .as_f64();
        let fraction = c.ramp.map_or(1.0, |r| r.fraction(now));
        (full * fraction).max(crate::limiter::rate::MIN_RATE_PER_SECOND)
    }

    /// The rate a new campaign's limiter starts at: its plan's (under its send_rate),
    /// times its ramp's first fraction when it ramps.
    pub(super) fn first_rate(&self, s: &CampaignSettings) -> Rate {
        let full = self.plans.get(&s.id).map_or(s.rate, |p| lower(*p, s.rate));
        let defaults = self.config.policy;
        let ramps = s.ramp_up_s.unwrap_or(defaults.ramp_up_s) > 0.0;
        let from = s.ramp_from.unwrap_or(defaults.ramp_from);
        if !ramps || from >= 1.0 {
            return full;
        }
        Rate::per_second((full.as_f64() * from).max(crate::limiter::rate::MIN_RATE_PER_SECOND))
            .unwrap_or(full)
    }

    /// Starts (or restarts) a campaign's ramp at `now`: when it is first held, when its
    /// start comes, and when it resumes after a pause or a halt.
    pub(super) fn start_ramp(&mut self, slot: u32, now: Nanos) {
        let defaults = self.config.policy;
        let Some(c) = self.campaigns[slot as usize].as_mut() else {
            return;
        };
        let secs = c.settings.ramp_up_s.unwrap_or(defaults.ramp_up_s);
        let from = c.settings.ramp_from.unwrap_or(defaults.ramp_from);
        c.ramp = Ramp::new(now, from, secs);
        if c.ramp.is_some() {
            tracing::debug!(campaign = %c.settings.id, secs, from, "ramp-up starts");
            if !self.ramping.contains(&slot) {
                self.ramping.push(slot);
            }
            self.next_ramp_at = now;
        }
    }

    /// After an adaptive ceiling on `provider` lifted: its campaigns climb from the rate
    /// they held to their full rate on their ramp's curve, instead of jumping.
    pub(super) fn ramp_after_lift(&mut self, provider: u16, now: Nanos) {
        let defaults = self.config.policy;
        for i in 0..self.active.len() {
            let slot = self.active[i];
            let Some(c) = self.campaigns[slot as usize].as_mut() else {
                continue;
            };
            if c.provider != provider {
                continue;
            }
            let secs = c.settings.ramp_up_s.unwrap_or(defaults.ramp_up_s);
            let from = c.settings.ramp_from.unwrap_or(defaults.ramp_from);
            let Some(curve) = Ramp::new(now, from, secs) else {
                continue;
            };
            let held = c.effective_rate.as_f64() / c.settings.rate.as_f64();
            c.ramp = curve.resumed(now, held.max(from));
            if c.ramp.is_some() && !self.ramping.contains(&slot) {
                self.ramping.push(slot);
            }
            self.next_ramp_at = now;
        }
    }

    /// Every [`RAMP_TICK`] while a campaign ramps: its rate (or everyone's share, under
    /// a cap) is set anew on the curve; a ramp that reached the full rate ends.
    pub(super) fn tick_ramps(&mut self, now: Nanos) -> Option<Nanos> {
        if self.ramping.is_empty() {
            return None;
        }
        if now < self.next_ramp_at {
            return Some(self.next_ramp_at);
        }
        let mut ramping = std::mem::take(&mut self.ramping);
        // A ramp that reached its end still gets its rate set once more: to the full.
        let mut finished: Vec<u32> = Vec::new();
        ramping.retain(|&slot| {
            let Some(c) = self.campaigns[slot as usize].as_mut() else {
                return false;
            };
            if c.ramp.is_some_and(|r| now >= r.end()) {
                c.ramp = None;
                finished.push(slot);
            }
            c.ramp.is_some()
        });
        let ended = ramping.is_empty();
        if self.is_capped() || self.shares_applied {
            self.ramping = ramping;
            self.rebalance(now);
        } else {
            for &slot in ramping.iter().chain(&finished) {
                self.set_effective_rate(slot, None, now);
            }
            self.ramping = ramping;
        }
        if ended {
            return None;
        }
        self.next_ramp_at = now + RAMP_TICK;
        Some(self.next_ramp_at)
    }

    /// A finish-by campaign's planned rate from the planner (`None`: its send_rate).
    pub fn apply_plan(&mut self, campaign: Arc<str>, rate: Option<Rate>, now: Nanos) {
        match rate {
            Some(r) => self.plans.insert(campaign.clone(), r),
            None => self.plans.remove(&campaign),
        };
        let Some(&slot) = self.by_id.get(&campaign) else {
            return;
        };
        if let Some(c) = self.campaigns[slot as usize].as_mut() {
            if c.plan == rate {
                return;
            }
            c.plan = rate;
            self.counters.live_changes += 1;
        }
        self.sync_rate(slot, now);
        self.mark_ready(slot);
    }

    /// A finish-by campaign whose deadline is ahead sends nothing until its first plan:
    /// its send_rate alone (the largest rate, when only the deadline was given) would
    /// send everything it holds at once.
    pub(super) fn awaits_plan(&self, slot: u32, now_ms: i64) -> bool {
        self.campaigns[slot as usize].as_ref().is_some_and(|c| {
            c.plan.is_none() && c.settings.finish_by_ms.is_some_and(|t| t > now_ms)
        })
    }

    /// Its `start_at`, put off by its jitter (the same on every worker).
    pub(super) fn jittered_start_ms(&self, s: &CampaignSettings) -> Option<i64> {
        let max = self.config.policy.start_jitter.as_millis() as u64;
        s.start_at_ms.map(|t| t + start_jitter_ms(&s.id, max))
    }

    /// Stamps a job with its campaign class's provider priority (the job's own wins at
    /// send time).
    pub(super) fn stamp_class(&self, job: &Job, class: PriorityClass) {
        job.class_priority.set(class.provider_priority());
    }

    /// After a class change: the campaign's held jobs take the new class's priority.
    pub(super) fn restamp_jobs(&self, slot: u32, class: PriorityClass) {
        for j in self.jobs.iter().flatten().filter(|j| j.campaign == slot) {
            self.stamp_class(&j.job, class);
        }
    }

    /// Notes which sending campaigns the shares left (almost) nothing: the classes
    /// above took the cap. `shares` by campaign slot; a campaign absent has no cap.
    pub(super) fn note_starved(&mut self, shares: &HashMap<u32, f64>, now: Nanos) {
        for i in 0..self.active.len() {
            let slot = self.active[i];
            let wanted = self.wanted_rate(slot, now);
            let Some(c) = self.campaigns[slot as usize].as_mut() else {
                continue;
            };
            let starved = c.has_work()
                && shares
                    .get(&slot)
                    .is_some_and(|&s| s < wanted * STARVED_BELOW);
            match (starved, c.starved_since) {
                (true, None) => {
                    c.starved_since = Some(now);
                    self.counters.live_changes += 1;
                }
                (false, Some(_)) => {
                    c.starved_since = None;
                    self.counters.live_changes += 1;
                }
                _ => {}
            }
        }
    }

    /// After the shares: which campaigns are served before others under each cap. The
    /// lowest class sending through a provider (or under the global cap) is gated by
    /// the cap's room; every class above it takes its sends from the cap whatever the
    /// room, since its shares fit under the cap, so that the class below cannot take
    /// the room first between turns and it never loses a permit to it.
    pub(super) fn set_precedence(&mut self, sending: &[(Want, u16)]) {
        self.lowest_rank.clear();
        let mut global_lowest = 0u8;
        for &(w, p) in sending {
            let p = usize::from(p);
            if self.lowest_rank.len() <= p {
                self.lowest_rank.resize(p + 1, 0);
            }
            self.lowest_rank[p] = self.lowest_rank[p].max(w.rank);
            global_lowest = global_lowest.max(w.rank);
        }
        let global = self.global.is_some();
        for &(w, _) in sending {
            if let Some(c) = self.campaigns[w.slot as usize].as_mut() {
                let first = global && w.rank < global_lowest;
                if c.first_under_global != first {
                    c.first_under_global = first;
                    c.limiter.set_first(first);
                }
            }
        }
    }

    /// Whether a turn of class `class` through `provider` is served first there.
    pub(super) fn served_first(&self, provider: u16, class: PriorityClass) -> bool {
        let lowest = self
            .lowest_rank
            .get(usize::from(provider))
            .copied()
            .unwrap_or(0);
        (class.rank() as u8) < lowest
    }

    /// How long a campaign has gone without a share, for the snapshot.
    pub(super) fn starved_ms(&self, c: &Campaign) -> Option<u64> {
        c.starved_since
            .map(|t| self.now_hint.saturating_sub(t) / 1_000_000)
    }
}

/// The lower of two rates.
fn lower(a: Rate, b: Rate) -> Rate {
    if a.as_f64() <= b.as_f64() {
        a
    } else {
        b
    }
}
