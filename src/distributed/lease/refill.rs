//! The background task of each leased campaign: it keeps the next lease ready, and
//! switches the campaign to its local fallback while Redis is unreachable and back.

use super::{share, Shared, PROBE_EVERY};
use crate::distributed::{Inner, LeaseAnswer};
use crate::limiter::{Rate, NANOS_PER_SEC};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

/// Keeps the next lease ready; switches the campaign to and from its fallback.
pub(super) async fn refill(shared: Arc<Shared>, inner: Arc<Inner>) {
    let gauge = metrics::gauge!("redis_lease_permits", "campaign" => shared.campaign.to_string());
    let slice = inner.config.lease;
    let slice_ns = u64::try_from(slice.as_nanos()).unwrap_or(u64::MAX);
    loop {
        let now = inner.clock.now();
        let (len, rate, burst) = {
            let s = shared.state.lock();
            (s.len, s.rate, s.burst)
        };
        let fallback = shared.fallback_on.load(Relaxed);
        let idle = now.saturating_sub(shared.last_demand.load(Relaxed)) > 2 * slice_ns;
        if !fallback && (len >= 2 || idle) {
            shared.wanted.store(false, Relaxed);
            tokio::select! {
                _ = shared.notify.notified() => {}
                _ = tokio::time::sleep(slice) => {}
            }
            continue;
        }
        let workers = inner.membership.workers();
        let opening = len == 0 && shared.own.is_some();
        let n = lease_size(rate, slice, workers, burst, opening);
        match inner.lease(&shared.key, rate, burst, n).await {
            Ok(answer) => {
                if shared.fallback_on.swap(false, Relaxed) {
                    tracing::debug!(campaign = %shared.campaign, "back on redis leases");
                }
                inner.recovered();
                match answer {
                    LeaseAnswer::Granted {
                        permits,
                        offset_micros,
                        redis_now_micros,
                    } => {
                        gauge.set(f64::from(permits));
                        // Never early; late by the quickest recent round trip (Redis's
                        // clock), or by this one (a lease that starts on receipt).
                        let at = inner.clock.now();
                        let start = match redis_now_micros {
                            Some(now) => {
                                inner
                                    .redis_clock
                                    .place(now, now.saturating_add(offset_micros), at)
                            }
                            None => at.saturating_add_signed(offset_micros.saturating_mul(1000)),
                        };
                        shared
                            .state
                            .lock()
                            .push_grant(permits, start, at, rate.interval_fp());
                    }
                    LeaseAnswer::Wait(d) => {
                        let d = d.min(slice);
                        shared.state.lock().hint =
                            now + u64::try_from(d.as_nanos()).unwrap_or(NANOS_PER_SEC);
                        tokio::time::sleep(d).await;
                    }
                }
            }
            Err(e) => {
                fall_back(&shared, &inner, share(rate, workers));
                inner.outage(&e);
                tokio::time::sleep(PROBE_EVERY).await;
            }
        }
    }
}

/// Permits to ask Redis for: this worker's part of a slice at `rate`, at least one;
/// plus `burst` when a shaped campaign `opening` a lease (starting, or after a gap) may
/// send it at once (Redis grants it only if its tolerance has it).
fn lease_size(rate: Rate, slice: Duration, workers: u32, burst: u32, opening: bool) -> u32 {
    let n = (rate.as_f64() * slice.as_secs_f64() / f64::from(workers))
        .ceil()
        .clamp(1.0, f64::from(u32::MAX)) as u32;
    if opening {
        n.saturating_add(burst)
    } else {
        n
    }
}

/// Redis failed: the campaign runs on its local fallback at `fallback_rate`, and the
/// leases in hand are dropped (they would be stale when Redis is back).
fn fall_back(shared: &Shared, inner: &Inner, fallback_rate: Rate) {
    if shared.fallback.rate() != fallback_rate {
        shared.fallback.set_rate(fallback_rate, inner.clock.now());
    }
    if !shared.fallback_on.load(Relaxed) {
        let mut s = shared.state.lock();
        s.len = 0;
        drop(s);
        shared.fallback_on.store(true, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::lease_size;
    use crate::limiter::Rate;
    use std::time::Duration;

    #[test]
    fn a_lease_is_this_workers_part_of_a_slice() {
        let rate = Rate::per_second(1000.0).unwrap();
        let slice = Duration::from_millis(100);
        assert_eq!(lease_size(rate, slice, 4, 5, false), 25);
        // Opening a shaped lease leaves room for the campaign's burst.
        assert_eq!(lease_size(rate, slice, 4, 5, true), 30);
        // Rounded up, and never zero.
        assert_eq!(lease_size(rate, slice, 3, 0, false), 34);
        let slow = Rate::per_second(0.5).unwrap();
        assert_eq!(lease_size(slow, slice, 8, 0, false), 1);
    }
}
