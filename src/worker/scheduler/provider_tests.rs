//! Each send counts against the provider of its own job, on a virtual clock: a campaign
//! whose first job went through one provider and whose later jobs go through another
//! sends those within the other's `max_rate`, and is not held to the first's.

use super::*;
use crate::provider::{Provider, ProviderKind};
use crate::sender::{AnySender, NullSender};

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;

/// Provider slots in [`scheduler`].
const FREE: u16 = 0;
const CAPPED: u16 = 1;
/// The capped provider's `max_rate`.
const CAP: f64 = 100.0;
/// The most one second may count under it: the rate, plus the cap's tolerance (one
/// `quantum_min` of its sends, 1 at 100/s) and the permit at the window's edge.
const CAP_SECOND_MAX: f64 = CAP + 2.0;
/// The campaigns' own send_rate, far above the cap.
const RATE: f64 = 1_000.0;

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

fn scheduler() -> Scheduler {
    let providers = Providers::new(
        vec![provider("free", None), provider("capped", Some(CAP))],
        "free",
    )
    .unwrap();
    let (completions, _) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 10,
            max_in_flight: 10_000,
            ..SchedulerConfig::default()
        },
        Arc::new(providers),
        StatsRecorder::new(),
        completions,
        events,
    )
}

/// A job of campaign `campaign` with `devices` devices through provider `slot`.
fn job(id: &str, campaign: &str, devices: usize, slot: u16, offset: i64) -> IncomingJob {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let tokens = (0..devices).map(|d| format!("{id}-{d}")).collect();
    let mut job = Job::new(id, campaign, tokens, payload).unwrap();
    job.provider_slot = slot;
    let rate = Rate::per_second(RATE).unwrap();
    let settings = CampaignSettings::active(campaign, rate, Algorithm::Gcra);
    IncomingJob::fresh(job, 0, offset, settings)
}

/// Drives rounds as the driver does, each 1 ms after the instant asked for, to `until`.
fn drive(s: &mut Scheduler, until: Nanos) {
    let mut now = 0;
    while now < until {
        let wake = s.run_round(now, now / SEC);
        let round_end = now + s.quantum().as_nanos() as Nanos;
        now = wake.map_or(round_end, |w| w.min(round_end)).max(now) + MS;
    }
    // A last round in the next second, so that the lanes judge the one that ended.
    s.run_round(until + MS, until / SEC);
}

/// Sends dispatched through provider `slot` in each whole second (its lane's history).
fn sent_per_second(s: &Scheduler, slot: u16) -> Vec<f64> {
    let stats = s.stats();
    stats.providers[usize::from(slot)]
        .history
        .iter()
        .map(|p| p.achieved)
        .collect()
}

#[test]
fn a_later_jobs_provider_cap_holds_though_the_first_job_went_elsewhere() {
    let mut s = scheduler();
    // The first job goes through the free provider, the next two through the capped one.
    s.add_job(job("first", "c", 50, FREE, 0), 0);
    s.add_job(job("second", "c", 2_000, CAPPED, 1), 0);
    s.add_job(job("third", "c", 2_000, CAPPED, 2), 0);
    drive(&mut s, 4 * SEC);
    let capped = sent_per_second(&s, CAPPED);
    assert!(capped.len() >= 4, "{capped:?}");
    // The old code put the campaign under its first job's provider (no cap) and sent
    // the capped provider's jobs at the campaign's 1,000/s.
    assert!(
        capped.iter().all(|&n| n <= CAP_SECOND_MAX),
        "per second through the capped provider: {capped:?}"
    );
    // And the cap is used, not starved: from the second second on, near its rate.
    assert!(
        capped[1..4].iter().all(|&n| n >= CAP - 2.0),
        "per second through the capped provider: {capped:?}"
    );
    assert_eq!(sent_per_second(&s, FREE).iter().sum::<f64>(), 50.0);
}

#[test]
fn a_first_jobs_provider_cap_does_not_hold_a_later_job_elsewhere() {
    let mut s = scheduler();
    // The first job through the capped provider, a short one, then the free provider.
    s.add_job(job("first", "c", 100, CAPPED, 0), 0);
    s.add_job(job("second", "c", 5_000, FREE, 1), 0);
    drive(&mut s, 4 * SEC);
    let free = sent_per_second(&s, FREE);
    assert!(free.len() >= 4, "{free:?}");
    // Once the capped job is sent (about 1 s), the free provider's job goes at the
    // campaign's own rate; the old code held it to the first provider's cap share.
    assert!(
        free[2..4].iter().all(|&n| n >= RATE * 0.95),
        "per second through the free provider: {free:?}"
    );
    let capped = sent_per_second(&s, CAPPED);
    assert!(capped.iter().all(|&n| n <= CAP_SECOND_MAX), "{capped:?}");
    assert_eq!(capped.iter().sum::<f64>(), 100.0);
}

#[test]
fn two_campaigns_share_a_cap_max_min_when_one_came_from_another_provider() {
    let mut s = scheduler();
    // "a" starts on the free provider and moves to the capped one; "b" is on it from
    // the start. Under the cap both take half: a's first provider does not exempt it.
    s.add_job(job("a1", "a", 10, FREE, 0), 0);
    s.add_job(job("a2", "a", 5_000, CAPPED, 1), 0);
    s.add_job(job("b1", "b", 2_000, CAPPED, 2), 0);
    drive(&mut s, 3 * SEC);
    let rate = |id: &str| {
        let slot = s.by_id[id];
        s.campaigns[slot as usize]
            .as_ref()
            .unwrap()
            .effective_rate
            .as_f64()
    };
    assert_eq!((rate("a"), rate("b")), (CAP / 2.0, CAP / 2.0));
    let capped = sent_per_second(&s, CAPPED);
    assert!(capped.iter().all(|&n| n <= CAP_SECOND_MAX), "{capped:?}");
}
