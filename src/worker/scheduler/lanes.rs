//! Each provider's lane: its adaptive ceiling ([`Ceiling`]), the sends dispatched to it
//! in the current second, and the last [`HISTORY_S`] seconds of ceiling, demand and
//! achieved rate for the API's chart.
//!
//! The hot path only counts: a dispatch adds one to `sent`, an answer adds one to a
//! counter in the ceiling. Once a second [`Scheduler::tick_lanes`] judges the second,
//! and when a ceiling moved, the campaigns on that provider are re-shared max-min under
//! it (`caps.rs`). A ceiling only ever lowers campaigns' rates: at or above the summed
//! send_rate it is inactive.

use super::Scheduler;
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::provider::ceiling::{Ceiling, CeilingState, Signal, SIGNALS};
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
    pub(super) fn new(p: &crate::provider::Provider) -> Self {
        let name = p.name.clone();
        let label = name.to_string();
        Self {
            ceiling: p.adaptive.map(Ceiling::new),
            sent: 0,
            history: VecDeque::with_capacity(HISTORY_S),
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
}

impl Scheduler {
    /// One send dispatched to `provider`.
    pub(super) fn lane_sent(&mut self, provider: u16) {
        if let Some(l) = self.lanes.get_mut(usize::from(provider)) {
            l.sent += 1;
        }
    }

    /// One answer from `provider`, `latency_ns` after its dispatch.
    pub(super) fn lane_answer(
        &mut self,
        provider: u16,
        outcome: &SendOutcome,
        latency_ns: u64,
        now: Nanos,
    ) {
        let Some(c) = self
            .lanes
            .get_mut(usize::from(provider))
            .and_then(|l| l.ceiling.as_mut())
        else {
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
        for (lane, &demand) in self.lanes.iter_mut().zip(&demand) {
            let sent = std::mem::take(&mut lane.sent);
            let mut point = LanePoint {
                unix_s: unix_sec.saturating_sub(1),
                ceiling: None,
                demand,
                achieved: f64::from(sent),
                accepted: 0.0,
            };
            if let Some(c) = lane.ceiling.as_mut() {
                if let Some(judged) = c.tick(now, demand, f64::from(sent)) {
                    moved |= judged.changed;
                    point.accepted = f64::from(judged.accepted);
                    lane.p95_ms = judged.p95.map(|d| d.as_secs_f64() * 1000.0);
                    if let Some(p) = judged.p95 {
                        lane.gauge_latency.set(p.as_secs_f64());
                    }
                    for (i, hit) in judged.signals.iter().enumerate() {
                        if *hit {
                            lane.congestion[i].increment(1);
                        }
                    }
                }
                point.ceiling = c.limit();
                lane.gauge_ceiling.set(c.limit().unwrap_or(demand));
                lane.gauge_active
                    .set(if c.limit().is_some() { 1.0 } else { 0.0 });
            }
            if lane.history.len() == HISTORY_S {
                lane.history.pop_front();
            }
            lane.history.push_back(point);
        }
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
            .map(|(lane, p)| {
                let state = lane.ceiling.as_ref().map(|c| c.state(now));
                let paused_until_unix_ms = match state {
                    Some(CeilingState::Paused { until, .. }) => {
                        Some(unix_ms + (until.saturating_sub(now) / 1_000_000))
                    }
                    _ => None,
                };
                let totals = lane
                    .ceiling
                    .as_ref()
                    .map(Ceiling::totals)
                    .unwrap_or_default();
                ProviderLive {
                    name: lane.name.clone(),
                    kind: p.kind.as_str(),
                    max_rate: p.max_rate.map(|r| r.as_f64()),
                    adaptive: lane.ceiling.is_some(),
                    state: match state {
                        None | Some(CeilingState::Clear) => "clear",
                        Some(CeilingState::BackingOff(_)) => "backing off",
                        Some(CeilingState::Paused { .. }) => "paused",
                    },
                    paused_until_unix_ms,
                    ceiling: lane.limit(),
                    p95_ms: lane.p95_ms,
                    latency_target_ms: lane
                        .ceiling
                        .as_ref()
                        .and_then(|c| c.params().latency_target)
                        .map(|d| d.as_secs_f64() * 1000.0),
                    congestion: Signal::ALL
                        .iter()
                        .map(|s| (s.as_str(), totals[*s as usize]))
                        .collect(),
                    history: lane.history.iter().copied().collect(),
                }
            })
            .collect()
    }
}
