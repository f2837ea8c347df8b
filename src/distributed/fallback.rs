//! What happens when Redis is unreachable: each campaign runs on a local limiter at
//! send_rate / workers, so the group together stays near the rate (off by the error of
//! the workers count) and sending never stops. The refill task keeps probing Redis and
//! switches back on the first answer; the switch is logged once per outage.
//!
//! The workers count is the number of live members of the consumer group, read from
//! the broker's group metadata every few seconds when [`watch_group`] runs, else
//! `limiter.workers_estimate`.

use super::Inner;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::Weak;
use std::time::Duration;

/// How often the group's membership is read.
const WATCH_EVERY: Duration = Duration::from_secs(5);

/// The number of workers a campaign's rate is divided among.
#[derive(Debug)]
pub struct Membership {
    estimate: u32,
    /// Live group members last seen; 0 when unknown.
    live: AtomicU32,
}

impl Membership {
    pub fn new(estimate: u32) -> Membership {
        Membership {
            estimate: estimate.max(1),
            live: AtomicU32::new(0),
        }
    }

    /// Live members when known, else the configured estimate; at least 1.
    pub fn workers(&self) -> u32 {
        match self.live.load(Relaxed) {
            0 => self.estimate,
            n => n,
        }
    }

    /// Records the live members seen (0: unknown, use the estimate).
    pub fn set_live(&self, members: u32) {
        self.live.store(members, Relaxed);
    }
}

/// Reads the group's members from the broker every [`WATCH_EVERY`] on a blocking
/// thread, until the factory is dropped. A broker that cannot describe the group leaves
/// the estimate in force.
pub(crate) fn watch_group(
    inner: Weak<Inner>,
    kafka: &crate::config::KafkaSettings,
    bootstrap: &str,
    group_id: &str,
) {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let Some(i) = inner.upgrade() else { return };
    let runtime = i.runtime.clone();
    drop(i);
    let consumer: BaseConsumer = match crate::broker::client_config(kafka, bootstrap).create() {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "cannot watch the consumer group; using limiter.workers_estimate");
            return;
        }
    };
    let group = group_id.to_string();
    runtime.spawn_blocking(move || loop {
        let Some(i) = inner.upgrade() else { return };
        let members = consumer
            .fetch_group_list(Some(&group), Duration::from_secs(2))
            .ok()
            .and_then(|list| {
                list.groups()
                    .iter()
                    .find(|g| g.name() == group)
                    .map(|g| g.members().len())
            })
            .unwrap_or(0);
        let members = u32::try_from(members).unwrap_or(u32::MAX);
        if members != i.membership.live.load(Relaxed) {
            tracing::info!(members, "consumer group membership");
        }
        i.membership.set_live(members);
        drop(i);
        std::thread::sleep(WATCH_EVERY);
    });
}
