//! Caps over several campaigns: `limiter.global_rate` over all of them, and each
//! provider's `max_rate` over the sends that go through it. A campaign's limiter sits
//! under the global cap's hierarchical limiter; a provider's cap is a gate each turn
//! asks for the sends it makes through that provider (a campaign's jobs may name
//! different providers: each device counts against the provider of its own job). A
//! campaign's rate is set to its max-min fair share of the cap of the provider its next
//! sends go through (`Campaign::provider`), then of the global cap.

use super::Scheduler;
use crate::limiter::hierarchical::HierarchicalLimiter;
use crate::limiter::{DynLimiter, Nanos, Rate};
use std::collections::HashMap;
use std::sync::Arc;

/// What a campaign asks of a cap: its rate (its own, or its share under a lower cap),
/// its weight, its slot and its class's rank (0: critical).
#[derive(Debug, Clone, Copy)]
pub(super) struct Want {
    pub rate: f64,
    pub weight: f64,
    pub slot: u32,
    pub rank: u8,
}

/// Weighted water-filling by class: each class in turn, critical first, shares what the
/// classes above left; within a class a campaign whose rate is below its weighted split
/// gets its rate and the others share what is left in proportion to their weights.
/// `critical` may take `overdraft × cap` beyond the cap. Weights are positive (0.01–100).
pub(super) fn max_min(
    cap: f64,
    overdraft: f64,
    wanted: &mut [Want],
    shares: &mut HashMap<u32, f64>,
) {
    // Class first; then smallest rate per unit of weight: those a split satisfies.
    wanted.sort_by(|a, b| {
        a.rank
            .cmp(&b.rank)
            .then((a.rate / a.weight).total_cmp(&(b.rate / b.weight)))
    });
    let mut left = cap;
    let mut start = 0;
    while start < wanted.len() {
        let rank = wanted[start].rank;
        let end = start
            + wanted[start..]
                .iter()
                .take_while(|w| w.rank == rank)
                .count();
        let class = &wanted[start..end];
        let mut room = match rank {
            0 => left + overdraft * cap,
            _ => left,
        }
        .max(0.0);
        let mut weight_left: f64 = class.iter().map(|w| w.weight).sum();
        for w in class {
            let share = w.rate.min(room * w.weight / weight_left);
            room -= share;
            weight_left -= w.weight;
            left -= share;
            shares.insert(w.slot, share);
        }
        left = left.max(0.0);
        start = end;
    }
}

/// The hierarchical limiter of a cap, with a tolerance of one `quantum_min` of sends.
pub(super) fn cap_limiter(rate: Rate, quantum_min: Nanos) -> HierarchicalLimiter {
    HierarchicalLimiter::new(rate, rate.permits_in(quantum_min).ceil() as u32)
}

/// With `limiter.critical_overdraft`, a provider's cap plus that allowance: the cap
/// `critical` turns pass, and every send counts against. (One cap at the larger rate,
/// not an allowance beside the cap: two caps each losing what they leave unused lose
/// part of the allowance.)
pub(super) fn overdraft_limiter(
    max_rate: Option<Rate>,
    overdraft: f64,
    quantum_min: Nanos,
) -> Option<HierarchicalLimiter> {
    if overdraft.is_nan() || overdraft <= 0.0 {
        return None;
    }
    let rate = Rate::per_second(max_rate?.as_f64() * (1.0 + overdraft)).ok()?;
    Some(cap_limiter(rate, quantum_min))
}

impl Scheduler {
    /// A campaign's limiter at `rate`, under the global cap when there is one (the burst
    /// then lives in the cap's soft burst bucket only, so that it uses capacity other
    /// campaigns leave unused). A provider's cap is not in it: a campaign's jobs may go
    /// through several providers, so each turn asks the cap of the provider its sends go
    /// through as a gate ([`Scheduler::provider_gate`]).
    pub(super) fn build_limiter(&self, s: &super::CampaignSettings, rate: Rate) -> DynLimiter {
        let limiters = &self.config.limiters;
        match &self.global {
            None => limiters.build_scoped(&s.id, s.algorithm, s.limiter_scope, rate, s.burst),
            Some(g) => {
                let own = limiters.build_scoped(&s.id, s.algorithm, s.limiter_scope, rate, 0);
                Arc::new(g.campaign_with(own, s.burst))
            }
        }
    }

    /// How many of `want` sends through `provider` its `max_rate` cap passes now, and
    /// when the next would pass if not all; a `critical` turn is passed by the cap plus
    /// its overdraft allowance instead. Taking nothing: [`Self::provider_take`] takes
    /// what the turn then sent.
    pub(super) fn provider_gate(
        &self,
        provider: u16,
        want: u32,
        now: Nanos,
        critical: bool,
        first: bool,
    ) -> (u32, Option<Nanos>) {
        if first {
            // Served before the classes below it: its share fits under the caps, and
            // its sends are taken from them whatever their room (`provider_take`).
            return (want, None);
        }
        let p = usize::from(provider);
        let cap = self.provider_caps.get(p).and_then(Option::as_ref);
        let outer = self.overdraft_caps.get(p).and_then(Option::as_ref);
        let gates = [
            if critical && outer.is_some() {
                None
            } else {
                cap
            },
            outer,
        ];
        let (mut want, mut at) = (want, None);
        for gate in gates.into_iter().flatten() {
            if want > 0 {
                let (room, t) = gate.room(want, now);
                (want, at) = (room, at.max(t));
            }
        }
        let (passed, at) = match self.kind_cap(provider) {
            Some(kind) if want > 0 => {
                let (room, kind_at) = kind.room(want, now);
                (room, at.max(kind_at))
            }
            _ => (want, at),
        };
        (passed, at)
    }

    /// The cap of `provider`'s kind, when it is an app slot of a capped kind.
    fn kind_cap(&self, provider: u16) -> Option<&HierarchicalLimiter> {
        if self.kind_caps.is_empty() || !self.is_app_slot(provider) {
            return None;
        }
        let kind = self.providers.get(provider).kind;
        self.kind_caps
            .iter()
            .find(|(k, _)| *k == kind)
            .map(|(_, c)| c)
    }

    /// Takes `n` sends through `provider` from its cap (a critical turn's, as many as
    /// the cap has room for: the rest went on the allowance).
    pub(super) fn provider_take(
        &self,
        provider: u16,
        n: u32,
        now: Nanos,
        (critical, first): (bool, bool),
    ) {
        let p = usize::from(provider);
        let outer = self.overdraft_caps.get(p).and_then(Option::as_ref);
        if first {
            let caps = [self.provider_caps.get(p).and_then(Option::as_ref), outer];
            for cap in caps.into_iter().flatten().chain(self.kind_cap(provider)) {
                cap.force(n, now);
            }
            return;
        }
        if let Some(cap) = self.provider_caps.get(p).and_then(Option::as_ref) {
            let n = if critical && outer.is_some() {
                cap.room(n, now).0
            } else {
                n
            };
            // The gate passed them a moment ago on this one thread: nothing took the room.
            let _ = cap.take(n, now);
        }
        if let Some(outer) = outer {
            let _ = outer.take(n, now);
        }
        if let Some(kind) = self.kind_cap(provider) {
            let _ = kind.take(n, now);
        }
    }

    /// Sets each campaign's effective rate: its own send_rate, or its max-min fair share
    /// of its provider's cap and then of the global cap. Rates change through `set_rate`,
    /// so a change never releases a burst.
    pub(super) fn rebalance(&mut self, now: Nanos) {
        // Without a cap every campaign runs at its own rate, which `sync_rate` keeps:
        // nothing to share, and a pass over every campaign per activation would make
        // registering n campaigns cost n².
        let capped = self.is_capped();
        if !capped && !self.shares_applied {
            return;
        }
        self.shares_applied = capped;
        let sending: Vec<(Want, u16)> = self
            .active
            .iter()
            .filter_map(|&slot| {
                let c = self.campaigns[slot as usize].as_ref()?;
                let sending = !c.settings.paused
                    && !c.settings.halted
                    && c.halt.is_none()
                    && !c.waiting_start;
                let want = Want {
                    rate: self.wanted_rate(slot, now),
                    weight: c.settings.weight,
                    slot,
                    rank: c.settings.priority.rank() as u8,
                };
                sending.then_some((want, c.provider))
            })
            .collect();
        let mut shares: HashMap<u32, f64> = HashMap::new();
        // Grouped by provider first: a platform has a slot per app kind, so a pass per
        // slot over every campaign would cost slots × campaigns.
        let mut by_provider: HashMap<u16, Vec<Want>> = HashMap::new();
        for &(want, provider) in &sending {
            by_provider.entry(provider).or_default().push(want);
        }
        let overdraft = self.config.policy.critical_overdraft;
        for (p, mut group) in by_provider {
            if let Some(cap) = self.provider_cap_now(usize::from(p)) {
                max_min(cap, overdraft, &mut group, &mut shares);
            }
        }
        self.share_under_kind_caps(&sending, &mut shares);
        if let Some(g) = &self.global {
            let mut wanted: Vec<Want> = sending
                .iter()
                .map(|&(w, _)| Want {
                    rate: shares.get(&w.slot).copied().unwrap_or(w.rate),
                    ..w
                })
                .collect();
            max_min(g.global_rate().as_f64(), 0.0, &mut wanted, &mut shares);
        }
        self.note_starved(&shares, now);
        self.set_precedence(&sending);
        for slot in 0..self.campaigns.len() as u32 {
            // A class above may leave a campaign nothing: the least rate, never none.
            // A share of 0 is no share: the campaign keeps its own rate and the cap's
            // room gates it (below a class served first, that room is what the class
            // above leaves). A limiter set to the least rate instead made a burst when
            // a Retry-After pause ended (the adaptive pause test: 100 in a 100 ms
            // bucket against 99, 3 runs in 7).
            let share = shares.get(&slot).and_then(|r| Rate::per_second(*r).ok());
            self.set_effective_rate(slot, share, now);
        }
    }

    /// A provider's `max_rate`, lowered by its adaptive ceiling while one binds.
    fn provider_cap_now(&self, p: usize) -> Option<f64> {
        let fixed = self
            .provider_caps
            .get(p)
            .and_then(Option::as_ref)
            .map(|c| c.global_rate().as_f64());
        let ceiling = self.lanes.get(p).and_then(|l| l.limit());
        match (fixed, ceiling) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The apps' kind caps (`apps.max_rate_<kind>`): the campaigns sending through any
    /// app of a capped kind share it, each wanting its share under its app's cap.
    fn share_under_kind_caps(&self, sending: &[(Want, u16)], shares: &mut HashMap<u32, f64>) {
        for (kind, cap) in &self.kind_caps {
            let mut group: Vec<Want> = sending
                .iter()
                .filter(|(_, p)| self.is_app_slot(*p) && self.providers.get(*p).kind == *kind)
                .map(|&(w, _)| Want {
                    rate: shares.get(&w.slot).copied().unwrap_or(w.rate),
                    ..w
                })
                .collect();
            if !group.is_empty() {
                max_min(cap.global_rate().as_f64(), 0.0, &mut group, shares);
            }
        }
    }

    /// Whether a cap applies now: the global one, a provider's `max_rate`, or an
    /// adaptive ceiling that binds.
    pub(super) fn is_capped(&self) -> bool {
        self.global.is_some()
            || !self.kind_caps.is_empty()
            || self.provider_caps.iter().any(Option::is_some)
            || self.lanes.iter().any(|l| l.limit().is_some())
    }

    /// After a campaign's settings changed: its fair share under the caps, or its own
    /// rate when none applies.
    pub(super) fn sync_rate(&mut self, slot: u32, now: Nanos) {
        if self.is_capped() || self.shares_applied {
            self.rebalance(now);
        } else {
            self.set_effective_rate(slot, None, now);
        }
    }

    /// Sets a campaign's limiter to `share`, or to its own send_rate without one.
    pub(super) fn set_effective_rate(&mut self, slot: u32, share: Option<Rate>, now: Nanos) {
        let wanted = self.wanted_rate(slot, now);
        let Some(c) = self.campaigns[slot as usize].as_mut() else {
            return;
        };
        let target = match share {
            Some(r) => r,
            None => Rate::per_second(wanted).unwrap_or(c.settings.rate),
        };
        if target != c.effective_rate {
            c.limiter.set_rate(target, now);
            c.effective_rate = target;
            // While a ramp (10 times a second) or a plan (once a second) sets its rate,
            // a permit already due keeps its instant, so that the turn still makes up
            // its lateness (asked anew, a few were lost per change: the simulated
            // finish-by run missed its deadline by 5 devices). Otherwise the next is
            // asked anew: a due instant kept across a lane's Retry-After pause made a
            // burst when the pause ended (the adaptive pause test: 101-103 in the first
            // 100 ms against 99, 6 runs in 6).
            c.next_at = if c.ramp.is_some() || c.plan.is_some() {
                c.next_at.filter(|&t| t <= now)
            } else {
                None
            };
            self.counters.live_changes += 1;
            self.mark_ready(slot);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::{CampaignSettings, IncomingJob, SchedulerConfig};
    use super::*;
    use crate::job::Job;
    use crate::limiter::Algorithm;
    use crate::provider::{Provider, ProviderKind, Providers};
    use crate::sender::{AnySender, NullSender};
    use crate::stats::StatsRecorder;

    fn provider(name: &str, max_rate: Option<f64>) -> Provider {
        Provider {
            name: Arc::from(name),
            kind: ProviderKind::Null,
            max_rate: max_rate.map(|r| Rate::per_second(r).unwrap()),
            max_in_flight: None,
            adaptive: None,
            sender: AnySender::Null(NullSender),
        }
    }

    #[test]
    fn a_provider_cap_is_shared_max_min_by_its_campaigns_only() {
        let providers = Providers::new(
            vec![provider("capped", Some(100.0)), provider("free", None)],
            "capped",
        )
        .unwrap();
        let (completions, _crx) = tokio::sync::mpsc::unbounded_channel();
        let (events, _) = std::sync::mpsc::channel();
        let mut s = Scheduler::new(
            SchedulerConfig::default(),
            Arc::new(providers),
            StatsRecorder::new(),
            completions,
            events,
        );
        for (campaign, rate, slot) in [("a", 1000.0, 0), ("b", 20.0, 0), ("c", 1000.0, 1)] {
            let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
            let mut job = Job::new(campaign, campaign, vec!["t".into(); 10], payload).unwrap();
            job.provider_slot = slot;
            let settings = CampaignSettings::active(
                campaign,
                Rate::per_second(rate).unwrap(),
                Algorithm::Gcra,
            );
            s.add_job(IncomingJob::fresh(job, 0, 0, settings), 0);
        }
        let rate = |id: &str| {
            let slot = s.by_id[id];
            s.campaigns[slot as usize]
                .as_ref()
                .unwrap()
                .effective_rate
                .as_f64()
        };
        assert_eq!((rate("a"), rate("b"), rate("c")), (80.0, 20.0, 1000.0));
    }

    #[test]
    fn max_min_gives_small_asks_in_full_and_splits_the_rest() {
        let mut shares = HashMap::new();
        let mut wanted = wants(&[(500.0, 1.0, 1), (10.0, 1.0, 2), (1000.0, 1.0, 3)]);
        max_min(600.0, 0.0, &mut wanted, &mut shares);
        assert_eq!(shares[&2], 10.0);
        assert_eq!(shares[&1], 295.0);
        assert_eq!(shares[&3], 295.0);
    }

    #[test]
    fn weights_split_in_proportion_and_never_above_a_rate() {
        let mut shares = HashMap::new();
        let mut wanted = wants(&[(1000.0, 1.0, 1), (1000.0, 2.0, 2), (1000.0, 3.0, 3)]);
        max_min(600.0, 0.0, &mut wanted, &mut shares);
        assert_eq!((shares[&1], shares[&2], shares[&3]), (100.0, 200.0, 300.0));
        // The heavy one asks little: it gets that, the rest split 1:2 what is left.
        let mut shares = HashMap::new();
        let mut wanted = wants(&[(1000.0, 1.0, 1), (1000.0, 2.0, 2), (30.0, 3.0, 3)]);
        max_min(600.0, 0.0, &mut wanted, &mut shares);
        assert_eq!(shares[&3], 30.0);
        assert!((shares[&1] - 190.0).abs() < 1e-9 && (shares[&2] - 380.0).abs() < 1e-9);
    }

    fn wants(list: &[(f64, f64, u32)]) -> Vec<Want> {
        list.iter()
            .map(|&(rate, weight, slot)| Want {
                rate,
                weight,
                slot,
                rank: 2,
            })
            .collect()
    }

    #[test]
    fn a_class_is_served_before_the_ones_below_and_shares_within() {
        // A critical 300/s, two high 400/s, three bulk: under 1,000/s.
        let mut wanted = vec![
            Want {
                rate: 1000.0,
                weight: 1.0,
                slot: 10,
                rank: 3,
            },
            Want {
                rate: 1000.0,
                weight: 3.0,
                slot: 11,
                rank: 3,
            },
            Want {
                rate: 300.0,
                weight: 1.0,
                slot: 1,
                rank: 0,
            },
            Want {
                rate: 400.0,
                weight: 1.0,
                slot: 2,
                rank: 1,
            },
            Want {
                rate: 400.0,
                weight: 1.0,
                slot: 3,
                rank: 1,
            },
        ];
        let mut shares = HashMap::new();
        max_min(1000.0, 0.0, &mut wanted, &mut shares);
        assert_eq!(shares[&1], 300.0);
        // The high ones share the 700 left: 350 each, below their 400.
        assert_eq!((shares[&2], shares[&3]), (350.0, 350.0));
        assert_eq!((shares[&10], shares[&11]), (0.0, 0.0));
        // Bulk shares what is left by weight once the classes above ask less.
        let mut wanted = vec![
            Want {
                rate: 1000.0,
                weight: 1.0,
                slot: 10,
                rank: 3,
            },
            Want {
                rate: 1000.0,
                weight: 3.0,
                slot: 11,
                rank: 3,
            },
            Want {
                rate: 200.0,
                weight: 1.0,
                slot: 1,
                rank: 0,
            },
        ];
        let mut shares = HashMap::new();
        max_min(1000.0, 0.0, &mut wanted, &mut shares);
        assert_eq!(
            (shares[&1], shares[&10], shares[&11]),
            (200.0, 200.0, 600.0)
        );
    }

    #[test]
    fn critical_may_overdraw_the_cap_by_its_allowance_only() {
        let mut wanted = vec![
            Want {
                rate: 2000.0,
                weight: 1.0,
                slot: 1,
                rank: 0,
            },
            Want {
                rate: 1000.0,
                weight: 1.0,
                slot: 2,
                rank: 2,
            },
        ];
        let mut shares = HashMap::new();
        max_min(1000.0, 0.2, &mut wanted, &mut shares);
        assert_eq!((shares[&1], shares[&2]), (1200.0, 0.0));
        // Within the allowance it takes what it wants, and leaves the rest of the cap.
        let mut wanted = vec![
            Want {
                rate: 400.0,
                weight: 1.0,
                slot: 1,
                rank: 0,
            },
            Want {
                rate: 1000.0,
                weight: 1.0,
                slot: 2,
                rank: 2,
            },
        ];
        let mut shares = HashMap::new();
        max_min(1000.0, 0.2, &mut wanted, &mut shares);
        assert_eq!((shares[&1], shares[&2]), (400.0, 600.0));
    }
}
