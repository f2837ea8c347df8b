//! Each provider's lane: its adaptive ceiling ([`Ceiling`]), the sends dispatched to it
//! in the current second, and the last [`HISTORY_S`] seconds of ceiling, demand and
//! achieved rate for the API's chart. A Web Push provider's ceilings are per push-service
//! origin instead (`origins.rs`), built from the same [`Lane`].
//!
//! The hot path only counts: a dispatch adds one to `sent`, an answer adds one to a
//! counter in the ceiling. Once a second [`Scheduler::tick_lanes`] judges the second,
//! and when a ceiling moved, the campaigns on that provider are re-shared max-min under
//! it (`caps.rs`). A ceiling only ever lowers campaigns' rates: at or above the summed
//! send_rate it is inactive.

use super::Scheduler;
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::provider::ceiling::{Ceiling, CeilingParams, CeilingState, Signal, SIGNALS};
use crate::sender::SendOutcome;
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;

/// The longest a provider's Retry-After pauses its whole lane; the refused device itself
/// waits the full time. Past this the ceiling, cut by then, probes again.
pub const LANE_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(60);

/// Seconds of history kept per provider: the dashboard's 5-minute chart.
pub const HISTORY_S: usize = 300;

/// One second of a provider's lane.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct LanePoint {
    pub unix_s: u64,
    /// The ceiling, when one was active.
    pub ceiling: Option<f64>,
    /// The summed send_rate of the campaigns sending through it.
    pub demand: f64,
    /// Sends dispatched to it in that second.
    pub achieved: f64,
    /// Answers it accepted in that second (any answer but a congestion signal).
    pub accepted: f64,
}

/// A provider's lane as the API shows it (`GET /api/providers`).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ProviderLive {
    pub name: Arc<str>,
    pub kind: &'static str,
    pub max_rate: Option<f64>,
    pub adaptive: bool,
    /// `clear`, `backing off` or `paused`.
    pub state: &'static str,
    /// When paused: the unix time (ms) sending resumes.
    pub paused_until_unix_ms: Option<u64>,
    pub ceiling: Option<f64>,
    /// p95 latency of the last judged second, in ms.
    pub p95_ms: Option<f64>,
    pub latency_target_ms: Option<f64>,
    /// Congested seconds since start, per signal name.
    pub congestion: BTreeMap<&'static str, u64>,
    pub history: Vec<LanePoint>,
    /// A Web Push provider's lanes, one per push-service origin (none for others).
    pub origins: Vec<super::origins::OriginLive>,
}

pub(super) struct Lane {
    name: Arc<str>,
    ceiling: Option<Ceiling>,
    sent: u32,
    history: VecDeque<LanePoint>,
    p95_ms: Option<f64>,
    gauge_ceiling: metrics::Gauge,
    gauge_active: metrics::Gauge,
    gauge_latency: metrics::Gauge,
    congestion: [metrics::Counter; SIGNALS],
}

impl Lane {
    /// A provider's lane. A Web Push provider's has no ceiling of its own: its push
    /// services are paced each in its own origin lane (`origins.rs`).
    pub(super) fn new(p: &crate::provider::Provider) -> Self {
        let per_origin = p.kind == crate::provider::ProviderKind::WebPush;
        Self::named(p.name.clone(), p.adaptive.filter(|_| !per_origin))
    }

    /// A lane called `name` (its metrics' `provider` label), with a ceiling under
    /// `params` when given.
    pub(super) fn named(name: Arc<str>, params: Option<CeilingParams>) -> Self {
        let label = name.to_string();
        Self {
            ceiling: params.map(Ceiling::new),
            sent: 0,
            // Grown as seconds pass: a lane that never sends costs no history.
            history: VecDeque::new(),
            p95_ms: None,
            gauge_ceiling: metrics::gauge!("provider_ceiling", "provider" => label.clone()),
            gauge_active: metrics::gauge!("provider_ceiling_active", "provider" => label.clone()),
            gauge_latency: metrics::gauge!("provider_latency_seconds", "provider" => label.clone(), "quantile" => "0.95"),
            congestion: Signal::ALL.map(|s| {
                metrics::counter!("provider_congestion_total", "provider" => label.clone(), "signal" => s.as_str())
            }),
            name,
        }
    }

    /// The ceiling in sends/s, when one binds.
    pub(super) fn limit(&self) -> Option<f64> {
        self.ceiling.as_ref().and_then(Ceiling::limit)
    }

    /// Until when nothing may be sent, if that is later than `now`.
    pub(super) fn paused_until(&self, now: Nanos) -> Option<Nanos> {
        let until = self.ceiling.as_ref()?.paused_until();
        (until > now).then_some(until)
    }

    /// One send dispatched through it.
    pub(super) fn sent(&mut self) {
        self.sent += 1;
    }

    /// One answer, `latency_ns` after its dispatch.
    pub(super) fn answer(&mut self, outcome: &SendOutcome, latency_ns: u64, now: Nanos) {
        let Some(c) = self.ceiling.as_mut() else {
            return;
        };
        match outcome {
            SendOutcome::RetryProvider {
                signal: Some(signal),
                after,
                ..
            } => {
                c.answer(Some(*signal), latency_ns, now);
                if let (Some(after), Signal::RetryAfter) = (after, signal) {
                    let pause = (*after).min(LANE_PAUSE_MAX);
                    c.pause(now, now.saturating_add(pause.as_nanos() as Nanos));
                }
            }
            // Says nothing of the provider's load (its OAuth endpoint is down).
            SendOutcome::RetryProvider { signal: None, .. } => {}
            _ => c.answer(None, latency_ns, now),
        }
    }

    /// Judges the second that ended under `demand`; returns whether the ceiling moved.
    pub(super) fn judge(&mut self, now: Nanos, demand: f64, unix_sec: u64) -> bool {
        let sent = std::mem::take(&mut self.sent);
        let mut moved = false;
        let mut point = LanePoint {
            unix_s: unix_sec.saturating_sub(1),
            ceiling: None,
            demand,
            achieved: f64::from(sent),
            accepted: 0.0,
        };
        if let Some(c) = self.ceiling.as_mut() {
            if let Some(judged) = c.tick(now, demand, f64::from(sent)) {
                moved = judged.changed;
                point.accepted = f64::from(judged.accepted);
                self.p95_ms = judged.p95.map(|d| d.as_secs_f64() * 1000.0);
                if let Some(p) = judged.p95 {
                    self.gauge_latency.set(p.as_secs_f64());
                }
                for (i, hit) in judged.signals.iter().enumerate() {
                    if *hit {
                        self.congestion[i].increment(1);
                    }
                }
            }
            point.ceiling = c.limit();
            self.gauge_ceiling.set(c.limit().unwrap_or(demand));
            self.gauge_active
                .set(if c.limit().is_some() { 1.0 } else { 0.0 });
        }
        if self.history.len() == HISTORY_S {
            self.history.pop_front();
        }
        self.history.push_back(point);
        moved
    }

    /// `state` as the API names it, and when a pause ends (unix ms).
    pub(super) fn state_live(&self, now: Nanos, unix_ms: u64) -> (&'static str, Option<u64>) {
        match self.ceiling.as_ref().map(|c| c.state(now)) {
            None | Some(CeilingState::Clear) => ("clear", None),
            Some(CeilingState::BackingOff(_)) => ("backing off", None),
            Some(CeilingState::Paused { until, .. }) => (
                "paused",
                Some(unix_ms + (until.saturating_sub(now) / 1_000_000)),
            ),
        }
    }

    /// Congested seconds since start, per signal name.
    pub(super) fn congestion_live(&self) -> BTreeMap<&'static str, u64> {
        let totals = self
            .ceiling
            .as_ref()
            .map(Ceiling::totals)
            .unwrap_or_default();
        Signal::ALL
            .iter()
            .map(|s| (s.as_str(), totals[*s as usize]))
            .collect()
    }

    pub(super) fn p95_ms(&self) -> Option<f64> {
        self.p95_ms
    }

    pub(super) fn history(&self) -> impl Iterator<Item = &LanePoint> {
        self.history.iter()
    }
}

impl Scheduler {
    /// One send dispatched to `provider` (and to its Web Push origin's lane).
    pub(super) fn lane_sent(&mut self, provider: u16, origin: Option<u16>, now: Nanos) {
        if let Some(l) = self.lanes.get_mut(usize::from(provider)) {
            l.sent();
        }
        if let Some(o) = origin {
            self.origins.sent(o, now);
        }
    }

    /// One answer for device `device` of job `jslot`, `latency_ns` after its dispatch:
    /// it feeds the lane of the job's provider, or of the device's Web Push origin.
    pub(super) fn lane_answer(
        &mut self,
        jslot: u32,
        device: u32,
        outcome: &SendOutcome,
        latency_ns: u64,
        now: Nanos,
    ) {
        let Some(job) = self.jobs[jslot as usize].as_ref() else {
            return;
        };
        let provider = job.job.provider_slot;
        if let Some(origin) = self.origin_lookup(jslot, device) {
            self.origins.answered(origin, outcome, latency_ns, now);
        }
        if let Some(l) = self.lanes.get_mut(usize::from(provider)) {
            l.answer(outcome, latency_ns, now);
        }
    }

    /// Judges the second that ended, once per second: each ceiling moves, metrics and
    /// history are updated, and the campaigns are re-shared when a ceiling moved.
    pub(super) fn tick_lanes(&mut self, now: Nanos, unix_sec: u64) {
        let second = now / NANOS_PER_SEC;
        if second == self.lanes_second || self.lanes.is_empty() {
            return;
        }
        self.lanes_second = second;
        let mut demand = std::mem::take(&mut self.lane_demand);
        demand.clear();
        demand.resize(self.lanes.len(), 0.0);
        for &slot in &self.active {
            let Some(c) = self.campaigns[slot as usize].as_ref() else {
                continue;
            };
            if !c.settings.paused && !c.settings.halted && c.halt.is_none() {
                if let Some(d) = demand.get_mut(usize::from(c.provider)) {
                    *d += c.settings.rate.as_f64();
                }
            }
        }
        // Under a fixed max_rate the campaigns cannot send more than it together.
        for (d, p) in demand.iter_mut().zip(self.providers.iter()) {
            if let Some(max) = p.max_rate {
                *d = d.min(max.as_f64());
            }
        }
        let mut moved = false;
        let mut lifted = Vec::new();
        for (p, (lane, &demand)) in self.lanes.iter_mut().zip(&demand).enumerate() {
            let limited = lane.limit().is_some();
            moved |= lane.judge(now, demand, unix_sec);
            if limited && lane.limit().is_none() {
                lifted.push(p as u16);
            }
        }
        for p in lifted {
            self.ramp_after_lift(p, now);
        }
        // An origin's ceiling paces its own sends at dispatch: no campaign is re-shared.
        self.origins.judge(now, &demand, unix_sec);
        self.lane_demand = demand;
        if moved {
            self.rebalance(now);
        }
    }

    /// Until when `provider`'s lane is paused, if it is.
    pub(super) fn lane_paused(&self, provider: u16, now: Nanos) -> Option<Nanos> {
        self.lanes.get(usize::from(provider))?.paused_until(now)
    }

    /// Every provider's lane, for the API (allocates: a few times a second at most).
    pub(super) fn lanes_live(&self, now: Nanos, unix_ms: u64) -> Vec<ProviderLive> {
        self.lanes
            .iter()
            .zip(self.providers.iter())
            .enumerate()
            .map(|(slot, (lane, p))| {
                let (state, paused_until_unix_ms) = lane.state_live(now, unix_ms);
                ProviderLive {
                    name: lane.name.clone(),
                    kind: p.kind.as_str(),
                    max_rate: p.max_rate.map(|r| r.as_f64()),
                    adaptive: p.adaptive.is_some(),
                    state,
                    paused_until_unix_ms,
                    ceiling: lane.limit(),
                    p95_ms: lane.p95_ms,
                    latency_target_ms: p
                        .adaptive
                        .and_then(|c| c.latency_target)
                        .map(|d| d.as_secs_f64() * 1000.0),
                    congestion: lane.congestion_live(),
                    history: lane.history.iter().copied().collect(),
                    origins: self.origins.live(slot as u16, now, unix_ms),
                }
            })
            .collect()
    }
}
