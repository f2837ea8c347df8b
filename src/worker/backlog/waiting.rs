//! Jobs parked for their recipients' local-time window: a job whose zone's window is
//! closed when it is read waits here as its offset alone (about 60 bytes), whatever its
//! campaign's lookahead, and joins the campaign's parked queue when the window opens.
//! Kept apart from the lookahead's parked queue, a job waiting for Tokyo's morning does
//! not hold back the same campaign's jobs for a zone whose window is open now.

use super::{JobRef, Parked, WindowZones};
use crate::job::window::Zone;
use std::collections::HashMap;
use std::sync::Arc;

/// A job waiting for its zone's window.
#[derive(Debug, Clone, Copy)]
pub struct WaitingJob {
    pub at: JobRef,
    pub devices: u32,
    pub zone: Zone,
    /// When its window opens (unix ms).
    pub due_ms: i64,
}

/// The jobs waiting for a window, per campaign.
#[derive(Debug, Default)]
pub(super) struct Waiting {
    by_campaign: HashMap<Arc<str>, Vec<WaitingJob>>,
    per_partition: HashMap<i32, usize>,
    /// The earliest due instant of them all: nothing is looked at before it.
    next_due_ms: Option<i64>,
}

impl Waiting {
    pub fn add(&mut self, campaign: &Arc<str>, job: WaitingJob) {
        *self.per_partition.entry(job.at.partition).or_default() += 1;
        self.next_due_ms = Some(self.next_due_ms.map_or(job.due_ms, |t| t.min(job.due_ms)));
        self.by_campaign
            .entry(campaign.clone())
            .or_default()
            .push(job);
    }

    /// The jobs due at `now_ms`, per campaign in offset order, removed.
    pub fn take_due(&mut self, now_ms: i64) -> Vec<(Arc<str>, Vec<Parked>)> {
        if self.next_due_ms.is_none_or(|t| t > now_ms) {
            return Vec::new();
        }
        self.take_where(|j| j.due_ms <= now_ms)
    }

    /// Decides the campaign's waiting jobs again (its rules changed): `due` gives a job's
    /// new opening, `None` when it may go now. Returns those that may go.
    pub fn redecide(
        &mut self,
        campaign: &str,
        due: impl Fn(&Zone) -> Option<i64>,
    ) -> Vec<(Arc<str>, Vec<Parked>)> {
        let Some(list) = self.by_campaign.get_mut(campaign) else {
            return Vec::new();
        };
        for j in list.iter_mut() {
            j.due_ms = due(&j.zone).unwrap_or(i64::MIN);
        }
        self.next_due_ms = self.min_due();
        self.take_where(|j| j.due_ms == i64::MIN)
    }

    fn take_where(&mut self, go: impl Fn(&WaitingJob) -> bool) -> Vec<(Arc<str>, Vec<Parked>)> {
        let mut out = Vec::new();
        for (id, list) in self.by_campaign.iter_mut() {
            if !list.iter().any(&go) {
                continue;
            }
            let mut due: Vec<WaitingJob> = Vec::new();
            list.retain(|j| {
                let g = go(j);
                if g {
                    due.push(*j);
                }
                !g
            });
            due.sort_by_key(|j| (j.at.offset, j.at.partition));
            for j in &due {
                if let Some(n) = self.per_partition.get_mut(&j.at.partition) {
                    *n = n.saturating_sub(1);
                }
            }
            let parked = due
                .into_iter()
                .map(|j| Parked {
                    at: j.at,
                    devices: j.devices,
                    message: None,
                })
                .collect();
            out.push((id.clone(), parked));
        }
        self.by_campaign.retain(|_, l| !l.is_empty());
        self.next_due_ms = self.min_due();
        out
    }

    fn min_due(&self) -> Option<i64> {
        self.by_campaign.values().flatten().map(|j| j.due_ms).min()
    }

    /// The distinct zones of each campaign's waiting jobs, at most `max` each.
    pub fn zones(&self, max: usize) -> Vec<(Arc<str>, Vec<Zone>)> {
        let distinct = |list: &[WaitingJob]| {
            let mut zones: Vec<Zone> = Vec::new();
            for j in list {
                if zones.len() == max {
                    break;
                }
                if !zones.contains(&j.zone) {
                    zones.push(j.zone);
                }
            }
            zones
        };
        self.by_campaign
            .iter()
            .map(|(id, l)| (id.clone(), distinct(l)))
            .collect()
    }

    /// The campaigns with jobs waiting.
    pub fn campaigns(&self) -> Vec<Arc<str>> {
        self.by_campaign.keys().cloned().collect()
    }

    /// Devices waiting, per campaign.
    pub fn devices(&self) -> impl Iterator<Item = (&Arc<str>, u64)> + '_ {
        self.by_campaign
            .iter()
            .map(|(id, l)| (id, l.iter().map(|j| u64::from(j.devices)).sum()))
    }

    pub fn in_partition(&self, partition: i32) -> usize {
        self.per_partition.get(&partition).copied().unwrap_or(0)
    }

    pub fn total(&self) -> usize {
        self.per_partition.values().sum()
    }

    /// Drops the jobs of revoked partitions: their next owner reads them again.
    pub fn forget_partitions(&mut self, partitions: &[i32]) {
        for list in self.by_campaign.values_mut() {
            list.retain(|j| !partitions.contains(&j.at.partition));
        }
        self.by_campaign.retain(|_, l| !l.is_empty());
        for p in partitions {
            self.per_partition.remove(p);
        }
        self.next_due_ms = self.min_due();
    }
}

impl super::Backlog {
    /// Parks a job until its zone's window opens (its offset only: it is re-read then).
    pub fn park_waiting(&mut self, campaign: &Arc<str>, job: WaitingJob) {
        self.waiting.add(campaign, job);
        self.parked_version += 1;
    }

    /// Moves the jobs whose window opened by `now_ms` to the front of their campaign's
    /// parked queue (they came before the ones parked there since), to be handed over as
    /// its lookahead allows. `rate_of` gives a campaign's rate when it has no backlog
    /// yet. Returns how many moved.
    pub fn release_waiting(&mut self, now_ms: i64, rate_of: impl Fn(&str) -> f64) -> usize {
        let due = self.waiting.take_due(now_ms);
        self.requeue(due, rate_of)
    }

    /// Decides the campaign's waiting jobs again after its rules changed (`due`: a
    /// zone's next opening, `None` when its jobs may go now); those that may go move as
    /// in [`Self::release_waiting`].
    pub fn redecide_waiting(
        &mut self,
        campaign: &str,
        due: impl Fn(&Zone) -> Option<i64>,
        rate_of: impl Fn(&str) -> f64,
    ) -> usize {
        let go = self.waiting.redecide(campaign, due);
        self.requeue(go, rate_of)
    }

    /// The campaigns with jobs waiting for a window.
    pub fn waiting_campaigns(&self) -> Vec<Arc<str>> {
        self.waiting.campaigns()
    }

    /// The zones of each campaign's jobs waiting for a window, at most `max` each
    /// (rebuilt only after a change: the consumer publishes it every step).
    pub fn waiting_zones(&mut self, max: usize) -> WindowZones {
        if self.zones_snapshot.0 != self.parked_version {
            let list = Arc::new(self.waiting.zones(max));
            self.zones_snapshot = (self.parked_version, list);
        }
        self.zones_snapshot.1.clone()
    }

    fn requeue(
        &mut self,
        due: Vec<(Arc<str>, Vec<Parked>)>,
        rate_of: impl Fn(&str) -> f64,
    ) -> usize {
        let mut moved = 0;
        for (id, jobs) in due {
            let slot = self.slot_for(&id);
            self.with_parked.insert(slot);
            for p in &jobs {
                *self.parked_per_partition.entry(p.at.partition).or_default() += 1;
            }
            let c = self.at(slot);
            if c.rate <= 0.0 {
                c.set_rate(rate_of(&id));
            }
            c.full_until = None;
            c.partition = c.partition.or(jobs.last().map(|p| p.at.partition));
            moved += jobs.len();
            for p in jobs.into_iter().rev() {
                c.parked_devices += u64::from(p.devices);
                c.parked.push_front(p);
            }
        }
        if moved > 0 {
            self.parked_version += 1;
        }
        moved
    }
}

#[cfg(test)]
mod tests {
    use super::super::Backlog;
    use super::*;
    use std::sync::atomic::AtomicU32;
    use std::time::{Duration, Instant};

    fn job(partition: i32, offset: i64, due_ms: i64, zone: &str) -> WaitingJob {
        WaitingJob {
            at: JobRef { partition, offset },
            devices: 50,
            zone: Zone::parse(zone).expect("zone"),
            due_ms,
        }
    }

    fn next(b: &mut Backlog, now: Instant) -> Option<JobRef> {
        b.next_to_unpark(true, now).map(|(_, p)| p.at)
    }

    #[test]
    fn a_job_waiting_for_its_window_does_not_hold_back_the_campaigns_open_zones() {
        let mut b = Backlog::new(Duration::from_secs(10));
        let id: Arc<str> = Arc::from("multi");
        b.park_waiting(&id, job(0, 0, 5_000, "Asia/Tokyo"));
        b.park_waiting(&id, job(0, 1, 5_000, "Asia/Tokyo"));
        // Tokyo's jobs take none of the lookahead: Madrid's is wanted at once.
        assert!(b.wants("multi"));
        b.hold(
            &id,
            10.0,
            JobRef {
                partition: 0,
                offset: 2,
            },
            50,
            Arc::new(AtomicU32::new(0)),
        );
        assert!(b.wants("multi"), "50 devices < 10 s at 10/s");
        assert_eq!(
            (b.parked_total(), b.waiting_total(), b.parked_in(0)),
            (2, 2, 2)
        );
        assert_eq!(b.parked_devices().as_slice(), &[(id.clone(), 100)]);
        let tokyo = Zone::parse("Asia/Tokyo").unwrap();
        assert_eq!(b.waiting_zones(24).as_slice(), &[(id.clone(), vec![tokyo])]);
        let now = Instant::now();
        assert_eq!(next(&mut b, now), None, "nothing is due");
        assert_eq!(b.release_waiting(4_999, |_| 10.0), 0);
        assert_eq!(b.release_waiting(5_000, |_| 10.0), 2);
        assert_eq!(b.waiting_total(), 0);
        assert_eq!(b.parked_total(), 2);
        // Due, they are parked behind the lookahead, in offset order.
        assert!(!b.wants("multi"), "its due jobs come before new ones");
        let first = JobRef {
            partition: 0,
            offset: 0,
        };
        assert_eq!(next(&mut b, now), Some(first));
        b.hold(&id, 10.0, first, 50, Arc::new(AtomicU32::new(0)));
        let later = now + Duration::from_secs(1);
        assert_eq!(
            next(&mut b, later),
            None,
            "50 + 50 devices fill 10 s at 10/s"
        );
    }

    #[test]
    fn a_rules_change_decides_the_waiting_jobs_again_and_revocation_drops_them() {
        let mut b = Backlog::new(Duration::from_secs(10));
        let id: Arc<str> = Arc::from("c");
        b.park_waiting(&id, job(0, 0, 9_000, "Asia/Tokyo"));
        b.park_waiting(&id, job(1, 0, 9_000, "Europe/Madrid"));
        b.park_waiting(&id, job(1, 1, 9_000, "Europe/Madrid"));
        // Madrid's window now opens at once; Tokyo's later than before.
        let tokyo = Zone::parse("Asia/Tokyo").unwrap();
        let moved = b.redecide_waiting("c", |z| (*z == tokyo).then_some(20_000), |_| 10.0);
        assert_eq!(moved, 2);
        assert_eq!(b.waiting_total(), 1);
        assert_eq!(
            b.release_waiting(9_000, |_| 10.0),
            0,
            "Tokyo's moved to 20 s"
        );
        b.forget_partitions(&[0]);
        assert_eq!(b.waiting_total(), 0);
        assert_eq!(b.release_waiting(i64::MAX, |_| 10.0), 0);
        assert_eq!(b.parked_in(1), 2);
    }
}
