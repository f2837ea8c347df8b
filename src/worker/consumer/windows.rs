//! Recipients' local-time windows at intake: a job whose zone's window is closed when
//! it is read is parked until the window opens (its offset alone, re-read then),
//! apart from its campaign's lookahead. So a multi-zone campaign's jobs for a zone
//! that is asleep take no memory and never hold back its jobs for a zone that is awake.
//! The rules come from the campaign watcher's snapshot (else the cached settings); when
//! they change, the waiting jobs are decided again. The scheduler applies the same rules
//! to the jobs it holds (a window that closes mid-job, a job read before its campaign
//! was known), so this is where jobs wait, not what decides whether they may go.

use super::*;
use crate::job::window::{self, LocalPolicy, Release, Zone};
use crate::worker::backlog::WaitingJob;

/// The next opening (unix ms) of `zone`'s window under `policy`, when it is closed at
/// `now_ms`; `None` when the job may go now (or is to be skipped: the scheduler writes
/// that letter).
fn opening(policy: &LocalPolicy, zone: Option<Zone>, now_ms: i64) -> Option<i64> {
    if policy.is_empty() {
        return None;
    }
    match window::release(policy, &zone.unwrap_or(Zone::UTC), now_ms) {
        Release::At(t) if t > now_ms => Some(t),
        _ => None,
    }
}

fn unix_ms_now() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

impl Loop {
    /// The campaign's local-time rules: as the watcher last read them, else as cached.
    fn local_policy(&self, id: &str) -> LocalPolicy {
        if let Some(c) = self.campaigns.borrow().get(id) {
            return c.local;
        }
        self.known.get(id).map(|(s, _)| s.local).unwrap_or_default()
    }

    /// Parks the job until its zone's window opens, when it is closed now; returns
    /// whether it did.
    pub(super) fn park_for_window(
        &self,
        campaign: &str,
        zone: Option<Zone>,
        at: JobRef,
        devices: u32,
    ) -> bool {
        let now_ms = unix_ms_now();
        let Some(due_ms) = opening(&self.local_policy(campaign), zone, now_ms) else {
            return false;
        };
        let id: Arc<str> = Arc::from(campaign);
        let job = WaitingJob {
            at,
            devices,
            zone: zone.unwrap_or(Zone::UTC),
            due_ms,
        };
        self.with_state(|s, _| s.backlog.park_waiting(&id, job));
        tracing::debug!(%campaign, due_ms, "job parked until its zone's window opens");
        true
    }

    /// Jobs whose window opened join their campaign's parked queue (handed over as its
    /// lookahead allows); after a rules change, the waiting jobs are decided again.
    pub(super) fn release_windows(&mut self) {
        let now_ms = unix_ms_now();
        if self.campaigns.has_changed().unwrap_or(false) {
            self.campaigns.borrow_and_update();
            let ids = self.with_state(|s, _| s.backlog.waiting_campaigns());
            for id in ids {
                let policy = self.local_policy(&id);
                let rate = self.settings_for(&id, None, None).rate.as_f64();
                let moved = self.with_state(|s, _| {
                    s.backlog.redecide_waiting(
                        &id,
                        |z| opening(&policy, Some(*z), now_ms),
                        |_| rate,
                    )
                });
                if moved > 0 {
                    tracing::info!(campaign = %id, jobs = moved, "its rules changed: jobs waiting for a window may go now");
                }
            }
        }
        let rate_of = |id: &str| self.settings_for(id, None, None).rate.as_f64();
        let mut s = self.state.lock();
        s.backlog.release_waiting(now_ms, rate_of);
    }
}
