//! A full pool on a virtual clock: sends are held until the test answers them, so the
//! pool stays full, and each answer frees one slot. Freed room must go to a campaign
//! below its share at once, not after the once-a-second net.

use super::*;
use crate::limiter::Algorithm;
use crate::sender::{AnySender, SendFuture, Sender};

const MS: Nanos = 1_000_000;
const POOL: usize = 8;

/// Sends that never answer by themselves.
struct HeldSender;

impl Sender for HeldSender {
    fn send(&self, _: &Arc<Job>, _: usize) -> SendFuture {
        SendFuture::boxed(std::future::pending())
    }

    fn name(&self) -> &'static str {
        "held"
    }
}

fn scheduler() -> Scheduler {
    let (completions, _) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 10,
            max_in_flight: POOL,
            ..SchedulerConfig::default()
        },
        AnySender::Provider(Arc::new(HeldSender)),
        StatsRecorder::new(),
        completions,
        events,
    )
}

fn incoming(id: &str, devices: usize, offset: i64) -> IncomingJob {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let tokens = (0..devices).map(|d| format!("{id}-{d}")).collect();
    let job = Job::new(id, id, tokens, payload).unwrap();
    // Fast enough that its limiter never holds it back in these tests.
    let settings =
        CampaignSettings::active(id, Rate::per_second(100_000.0).unwrap(), Algorithm::Gcra);
    IncomingJob::fresh(job, 0, offset, settings)
}

/// Answers `device` of job `slot` as delivered.
fn answer(s: &mut Scheduler, slot: u32, device: u32, now: Nanos) {
    let done = Completion {
        slot,
        device,
        attempt: 0,
        first_failed: 0,
        outcome: SendOutcome::Delivered,
        latency_ns: 0,
        epoch: 0,
    };
    s.complete(done, now, 0);
}

fn in_flight(s: &Scheduler, id: &str) -> u32 {
    s.stats()
        .campaigns
        .iter()
        .find(|c| &*c.id == id)
        .map_or(0, |c| c.in_flight)
}

#[tokio::test]
async fn freed_room_goes_to_a_campaign_below_its_share_at_once() {
    let mut s = scheduler();
    // "busy" (job slot 0) fills the pool: a probe, one answer, then the rest.
    s.add_job(incoming("busy", 1_000, 0), 0);
    s.run_round(0, 0);
    answer(&mut s, 0, 0, MS);
    let mut now = 2 * MS;
    while s.in_flight() < POOL && now < 20 * MS {
        s.run_round(now, 0);
        now += MS;
    }
    assert_eq!(in_flight(&s, "busy"), POOL as u32, "busy fills the pool");
    // "new" (job slot 1) arrives to a full pool: nothing for it yet.
    s.add_job(incoming("new", 100, 1), now);
    s.run_round(now, 0);
    assert_eq!(in_flight(&s, "new"), 0);
    // Each answer of busy frees one slot. New is below its share (POOL / 2) and takes
    // each one in the next round, until it holds its share; busy, at or above its
    // share, takes none of them meanwhile.
    for k in 1..=(POOL / 2) as u32 {
        now += MS;
        answer(&mut s, 0, k, now);
        now += MS;
        s.run_round(now, 0);
        assert_eq!(in_flight(&s, "new"), k, "after busy's answer {k}");
        assert_eq!(in_flight(&s, "busy"), POOL as u32 - k);
    }
    // At its share, new waits for room no more: the next slot is busy's again.
    now += MS;
    answer(&mut s, 0, 5, now);
    now += MS;
    s.run_round(now, 0);
    assert_eq!(in_flight(&s, "new"), (POOL / 2) as u32);
    assert_eq!(s.in_flight(), POOL, "the freed slot is used");
    assert!(now < 100 * MS, "all within a tenth of the net's second");
}
