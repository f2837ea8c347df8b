//! The sink's record of arrivals, per push and per campaign, and the summaries and
//! window counts drawn from it.

use super::server::PushBody;
use super::state::Shared;
use super::{CampaignSummary, SinkSummary};
use bytes::Bytes;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

pub(super) fn is_success(status: u16) -> bool {
    (200..300).contains(&status)
}

/// Two pointers over sorted timestamps: the most in any half-open window `[t, t + w)`.
pub(super) fn max_in_window(sorted_ns: &[u64], window_ns: u64) -> u64 {
    let mut best = 0usize;
    let mut lo = 0usize;
    for (hi, &t) in sorted_ns.iter().enumerate() {
        while t - sorted_ns[lo] >= window_ns {
            lo += 1;
        }
        best = best.max(hi + 1 - lo);
    }
    best as u64
}

#[derive(Default)]
pub(super) struct Log {
    pub(super) records: Vec<Record>,
    pub(super) campaigns: HashMap<Arc<str>, CampaignLog>,
    pub(super) jobs: HashSet<Arc<str>>,
    pub(super) malformed: u64,
}

pub(super) struct Record {
    pub(super) campaign: Arc<str>,
    pub(super) job: Arc<str>,
    pub(super) token: Box<str>,
    pub(super) key: Option<Box<str>>,
    pub(super) at_ns: u64,
    /// When the worker released it, from its `x-pushpace-sent-at` header.
    pub(super) released_ns: Option<u64>,
    pub(super) status: Option<u16>,
    pub(super) body: Option<Bytes>,
}

pub(super) struct CampaignLog {
    pub(super) id: Arc<str>,
    /// Arrival times in ns since start; pushed under the lock with a clock read under
    /// the same lock, so they are sorted.
    pub(super) arrivals: Vec<u64>,
    /// Unix second → (requests, delivered).
    pub(super) per_second: BTreeMap<u64, (u64, u64)>,
    /// Release times (ns since start, from `x-pushpace-sent-at`), in arrival order.
    pub(super) released: Vec<u64>,
    /// Unix second of release → requests.
    pub(super) released_per_second: BTreeMap<u64, u64>,
    pub(super) delivered: u64,
    /// Idempotency keys (or job + token without one) answered 2xx.
    pub(super) delivered_keys: HashSet<Box<str>>,
    pub(super) duplicates: u64,
}

impl CampaignLog {
    pub(super) fn summary(&self) -> CampaignSummary {
        let first = self.arrivals.first().copied().unwrap_or(0);
        let last = self.arrivals.last().copied().unwrap_or(0);
        let span_s = (last - first) as f64 / 1e9;
        CampaignSummary {
            campaign_id: self.id.to_string(),
            requests: self.arrivals.len() as u64,
            delivered: self.delivered,
            distinct_delivered: self.delivered_keys.len() as u64,
            duplicates: self.duplicates,
            max_in_any_second: max_in_window(&self.arrivals, 1_000_000_000),
            first_ms: first as f64 / 1e6,
            last_ms: last as f64 / 1e6,
            mean_rate: if span_s > 0.0 {
                self.arrivals.len() as f64 / span_s
            } else {
                0.0
            },
        }
    }
}

/// What the headers of a push said.
pub(super) struct Meta {
    pub(super) key: Option<Box<str>>,
    pub(super) sent_at_us: Option<u64>,
}

impl Shared {
    /// Records an arrival and returns its index (to complete a slow answer later).
    pub(super) fn record(
        &self,
        push: &PushBody<'_>,
        meta: Meta,
        body: Option<Bytes>,
        status: Option<u16>,
    ) -> usize {
        let Meta { key, sent_at_us } = meta;
        let started_ns = self.started_unix.as_nanos() as u64;
        let released_ns = sent_at_us.map(|us| us.saturating_mul(1000).saturating_sub(started_ns));
        let mut guard = self.log();
        let log = &mut *guard;
        let at_ns = self.started.elapsed().as_nanos() as u64;
        let job = match log.jobs.get(push.job_id.as_ref()) {
            Some(j) => Arc::clone(j),
            None => {
                let j: Arc<str> = Arc::from(push.job_id.as_ref());
                log.jobs.insert(Arc::clone(&j));
                j
            }
        };
        if !log.campaigns.contains_key(push.campaign_id.as_ref()) {
            let id: Arc<str> = Arc::from(push.campaign_id.as_ref());
            log.campaigns.insert(
                Arc::clone(&id),
                CampaignLog {
                    id,
                    arrivals: Vec::new(),
                    per_second: BTreeMap::new(),
                    released: Vec::new(),
                    released_per_second: BTreeMap::new(),
                    delivered: 0,
                    delivered_keys: HashSet::new(),
                    duplicates: 0,
                },
            );
        }
        let Some(campaign) = log.campaigns.get_mut(push.campaign_id.as_ref()) else {
            unreachable!("inserted above");
        };
        campaign.arrivals.push(at_ns);
        let second = (self.started_unix + Duration::from_nanos(at_ns)).as_secs();
        campaign.per_second.entry(second).or_insert((0, 0)).0 += 1;
        if let Some(r) = released_ns {
            campaign.released.push(r);
            let second = (self.started_unix + Duration::from_nanos(r)).as_secs();
            *campaign.released_per_second.entry(second).or_insert(0) += 1;
        }
        let record = Record {
            campaign: Arc::clone(&campaign.id),
            job,
            token: Box::from(push.device_token.as_ref()),
            key,
            at_ns,
            released_ns,
            status,
            body,
        };
        log.records.push(record);
        let index = log.records.len() - 1;
        if status.is_some_and(is_success) {
            self.count_delivery(log, index);
        }
        index
    }

    pub(super) fn complete(&self, index: usize, status: u16) {
        let mut guard = self.log();
        let log = &mut *guard;
        if let Some(r) = log.records.get_mut(index) {
            r.status = Some(status);
            if is_success(status) {
                self.count_delivery(log, index);
            }
        }
    }

    fn count_delivery(&self, log: &mut Log, index: usize) {
        let Some(r) = log.records.get(index) else {
            return;
        };
        let Some(campaign) = log.campaigns.get_mut(&r.campaign) else {
            return;
        };
        let delivery_key: Box<str> = match &r.key {
            Some(k) => k.clone(),
            None => format!("{}\n{}", r.job, r.token).into_boxed_str(),
        };
        campaign.delivered += 1;
        if !campaign.delivered_keys.insert(delivery_key) {
            campaign.duplicates += 1;
        }
        let second = (self.started_unix + Duration::from_nanos(r.at_ns)).as_secs();
        campaign.per_second.entry(second).or_insert((0, 0)).1 += 1;
    }

    pub(super) fn summary(&self) -> SinkSummary {
        let log = self.log();
        let mut campaigns: Vec<CampaignSummary> =
            log.campaigns.values().map(CampaignLog::summary).collect();
        campaigns.sort_by(|a, b| a.campaign_id.cmp(&b.campaign_id));
        SinkSummary {
            requests: log.records.len() as u64,
            delivered: campaigns.iter().map(|c| c.delivered).sum(),
            distinct_delivered: campaigns.iter().map(|c| c.distinct_delivered).sum(),
            duplicates: campaigns.iter().map(|c| c.duplicates).sum(),
            malformed: log.malformed,
            connections: self.connections.load(Ordering::Relaxed),
            campaigns,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::max_in_window;

    #[test]
    fn window_counts_half_open() {
        let s = 1_000_000_000;
        assert_eq!(max_in_window(&[], s), 0);
        assert_eq!(max_in_window(&[0, 10, 20], s), 3);
        // An arrival exactly one window later starts a new window.
        assert_eq!(max_in_window(&[0, s, 2 * s], s), 1);
        assert_eq!(max_in_window(&[0, 1, s - 1, s, s + 1], s), 3);
    }
}
