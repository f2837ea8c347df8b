//! Web Push lanes, one per push-service origin (scheme, host and port of the
//! subscription's endpoint: `provider::webpush::origin_key`). A Web Push provider sends
//! to many services at once (Google, Mozilla, Apple, Microsoft, self-hosted ones); with
//! one ceiling for all of them, a few slow or unreachable endpoints cut every Web Push
//! send. Here each origin has its own adaptive ceiling, judged each second like a
//! provider's (`lanes.rs`), and paces only its own sends, at dispatch: a device whose
//! origin is at its ceiling waits as a retry (keeping its campaign's permit for the next
//! device), so the campaign's other origins go on at its rate.
//!
//! The hot path stays allocation-free: the origin key is read from the borrowed device
//! string and found in a map; a lane is built (name, metrics) only for a new origin.

use super::lanes::{Lane, LanePoint};
use super::Scheduler;
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::provider::ProviderKind;
use crate::sender::SendOutcome;
use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

/// The most origin lanes a worker keeps (over all Web Push providers). Browsers'
/// subscriptions come from a handful of push services, so this leaves room for all of
/// them and a few dozen self-hosted ones, while bounding the per-second judging and the
/// metric series (one set per origin). Origins beyond it share one overflow lane per
/// provider.
pub const MAX_ORIGIN_LANES: usize = 64;

/// An origin lane with no send and nothing in flight for this long is forgotten, its
/// slot free for another origin: ten minutes, the campaigns' own idle time
/// (`worker.forget_idle_after_ms`' default), so a service that a campaign's next wave
/// reaches again keeps its judged ceiling, and a burst of one-off self-hosted origins
/// does not hold the table.
pub const ORIGIN_IDLE: Duration = Duration::from_secs(600);

/// How far ahead a device may be given a slot under its origin's ceiling. One whose
/// slot would be later waits unreserved and asks again then, so that a ceiling that
/// rises (a service that recovers) is used within this long, and a device costs one
/// wait a second at most while its service is held down.
pub const RESERVE_AHEAD: Duration = Duration::from_secs(1);

/// Marks a waiting device's `attempt` as holding its slot under the origin's ceiling:
/// it is sent when due without asking again. Attempts are counted far below this bit.
pub(super) const RESERVED: u32 = 1 << 31;

/// The key of a provider's overflow lane (`origin_key` never returns an even key).
const OVERFLOW: u64 = 0;

/// An origin's lane as the API shows it (`GET /api/providers`, under its provider).
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct OriginLive {
    /// `https://host[:port]`, or `other origins` for the overflow lane.
    pub origin: Arc<str>,
    /// `clear`, `backing off` or `paused`.
    pub state: &'static str,
    pub paused_until_unix_ms: Option<u64>,
    pub ceiling: Option<f64>,
    pub p95_ms: Option<f64>,
    pub in_flight: u32,
    pub congestion: BTreeMap<&'static str, u64>,
    /// The last judged second.
    pub last: Option<LanePoint>,
}

struct OriginLane {
    provider: u16,
    key: u64,
    origin: Arc<str>,
    lane: Lane,
    /// The next free slot under the ceiling.
    next_slot: Nanos,
    in_flight: u32,
    last_used: Nanos,
}

/// The origin lanes of every Web Push provider.
#[derive(Default)]
pub(super) struct OriginLanes {
    by_key: HashMap<(u16, u64), u16>,
    lanes: Vec<Option<OriginLane>>,
    /// Lanes of named origins (the overflow lanes not counted).
    named: usize,
}

impl OriginLanes {
    /// One send dispatched through lane `o`.
    pub(super) fn sent(&mut self, o: u16, now: Nanos) {
        if let Some(l) = self.lanes.get_mut(usize::from(o)).and_then(Option::as_mut) {
            l.lane.sent();
            l.in_flight += 1;
            l.last_used = now;
        }
    }

    /// One answer through lane `o`.
    pub(super) fn answered(&mut self, o: u16, outcome: &SendOutcome, latency_ns: u64, now: Nanos) {
        if let Some(l) = self.lanes.get_mut(usize::from(o)).and_then(Option::as_mut) {
            l.in_flight = l.in_flight.saturating_sub(1);
            l.lane.answer(outcome, latency_ns, now);
        }
    }

    /// Judges each lane's second under its provider's demand (`demand`, by provider
    /// slot), and forgets the lanes idle for [`ORIGIN_IDLE`].
    pub(super) fn judge(&mut self, now: Nanos, demand: &[f64], unix_sec: u64) {
        let idle = ORIGIN_IDLE.as_nanos() as Nanos;
        for slot in &mut self.lanes {
            let Some(l) = slot.as_mut() else { continue };
            let d = demand.get(usize::from(l.provider)).copied().unwrap_or(0.0);
            l.lane.judge(now, d, unix_sec);
            if l.in_flight == 0 && now.saturating_sub(l.last_used) >= idle {
                self.by_key.remove(&(l.provider, l.key));
                if l.key != OVERFLOW {
                    self.named -= 1;
                }
                *slot = None;
            }
        }
    }

    /// Provider `provider`'s origin lanes, for the API.
    pub(super) fn live(&self, provider: u16, now: Nanos, unix_ms: u64) -> Vec<OriginLive> {
        self.lanes
            .iter()
            .flatten()
            .filter(|l| l.provider == provider)
            .map(|l| {
                let (state, paused_until_unix_ms) = l.lane.state_live(now, unix_ms);
                OriginLive {
                    origin: l.origin.clone(),
                    state,
                    paused_until_unix_ms,
                    ceiling: l.lane.limit(),
                    p95_ms: l.lane.p95_ms(),
                    in_flight: l.in_flight,
                    congestion: l.lane.congestion_live(),
                    last: l.lane.history().last().copied(),
                }
            })
            .collect()
    }

    fn lookup(&self, provider: u16, key: u64) -> Option<u16> {
        let named = self.by_key.get(&(provider, key));
        named
            .or_else(|| self.by_key.get(&(provider, OVERFLOW)))
            .copied()
    }

    /// The lane of `key` through `provider`, made when new (or the overflow lane when
    /// [`MAX_ORIGIN_LANES`] are held).
    fn lane_for(
        &mut self,
        provider: &crate::provider::Provider,
        slot: u16,
        key: u64,
        label: impl FnOnce() -> Option<String>,
    ) -> u16 {
        if let Some(&o) = self.by_key.get(&(slot, key)) {
            return o;
        }
        let key = if self.named < MAX_ORIGIN_LANES {
            key
        } else {
            OVERFLOW
        };
        if let Some(&o) = self.by_key.get(&(slot, key)) {
            return o;
        }
        let origin: Arc<str> = match key {
            OVERFLOW => Arc::from("other origins"),
            _ => Arc::from(label().unwrap_or_else(|| "unknown origin".into())),
        };
        let name = Arc::from(format!("{} {origin}", provider.name));
        let lane = OriginLane {
            provider: slot,
            key,
            origin,
            lane: Lane::named(name, provider.adaptive),
            next_slot: 0,
            in_flight: 0,
            last_used: 0,
        };
        if key != OVERFLOW {
            self.named += 1;
        }
        let o = match self.lanes.iter().position(Option::is_none) {
            Some(i) => {
                self.lanes[i] = Some(lane);
                i
            }
            None => {
                self.lanes.push(Some(lane));
                self.lanes.len() - 1
            }
        } as u16;
        self.by_key.insert((slot, key), o);
        o
    }

    /// Whether a device may go through lane `o` now; if not, until when it waits and
    /// whether it holds a slot then. `tolerance`: how early a slot may be used.
    fn gate(
        &mut self,
        o: u16,
        reserved: bool,
        now: Nanos,
        tolerance: Nanos,
    ) -> Option<(Nanos, bool)> {
        let l = self.lanes.get_mut(usize::from(o))?.as_mut()?;
        if let Some(until) = l.lane.paused_until(now) {
            // The service asked for a pause (Retry-After): nothing until then.
            return Some((until, false));
        }
        if reserved {
            return None;
        }
        let ceiling = l.lane.limit()?;
        let interval = (NANOS_PER_SEC as f64 / ceiling.max(f64::MIN_POSITIVE)) as Nanos;
        let slot = l.next_slot.max(now);
        if slot <= now + tolerance {
            l.next_slot = slot + interval;
            return None;
        }
        if slot <= now + RESERVE_AHEAD.as_nanos() as Nanos {
            l.next_slot = slot + interval;
            return Some((slot, true));
        }
        Some((now + RESERVE_AHEAD.as_nanos() as Nanos, false))
    }
}

impl Scheduler {
    /// The origin lane of device `device` of job `jslot`, made when new; `None` when
    /// its provider is not Web Push or has no adaptive ceiling.
    fn origin_of(&mut self, jslot: u32, device: u32) -> Option<u16> {
        let job = &self.jobs[jslot as usize].as_ref()?.job;
        let slot = job.provider_slot;
        let provider = self.providers.get(slot);
        if provider.kind != ProviderKind::WebPush || provider.adaptive.is_none() {
            return None;
        }
        let text = job.devices.get(device as usize)?;
        let key = crate::provider::webpush::origin_key(text).unwrap_or(OVERFLOW);
        let label = || crate::provider::webpush::origin_label(text);
        Some(self.origins.lane_for(provider, slot, key, label))
    }

    /// The origin lane an answer of device `device` of job `jslot` goes to, if held.
    pub(super) fn origin_lookup(&self, jslot: u32, device: u32) -> Option<u16> {
        let job = &self.jobs[jslot as usize].as_ref()?.job;
        if self.providers.get(job.provider_slot).kind != ProviderKind::WebPush {
            return None;
        }
        let text = job.devices.get(device as usize)?;
        let key = crate::provider::webpush::origin_key(text).unwrap_or(OVERFLOW);
        self.origins.lookup(job.provider_slot, key)
    }

    /// The origin lane of a send about to go, and whether its origin's ceiling or pause
    /// holds it: `Err((not_before, reserved))` when the device must wait.
    pub(super) fn origin_gate(
        &mut self,
        jslot: u32,
        device: u32,
        reserved: bool,
        now: Nanos,
    ) -> Result<Option<u16>, (Nanos, bool)> {
        let Some(o) = self.origin_of(jslot, device) else {
            return Ok(None);
        };
        let tolerance = self.config.quantum_min.as_nanos() as Nanos;
        match self.origins.gate(o, reserved, now, tolerance) {
            None => Ok(Some(o)),
            Some(wait) => Err(wait),
        }
    }
}
