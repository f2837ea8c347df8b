//! Web Push lanes per push-service origin, on a virtual clock: one campaign's devices
//! alternate between a service that answers every send 503 and one that takes them.
//! The failing origin's ceiling drops to its floor; the other's stays clear and keeps
//! the campaign's rate. With one ceiling for the whole provider, the failing origin's
//! 503s cut the campaign, and the healthy origin with it.

use super::*;
use crate::provider::ceiling::{CeilingParams, Signal};
use crate::provider::{Provider, ProviderKind};
use crate::sender::{AnySender, SendFuture, Sender};
use std::sync::atomic::AtomicU64;

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;
/// The campaign's send_rate.
const RATE: f64 = 1_000.0;
const GOOD: &str = "https://good.push.test";
const BAD: &str = "https://bad.push.test:8443";

/// Answers a device by its endpoint's origin: 503 from [`BAD`], delivered elsewhere.
#[derive(Default)]
struct ByOrigin {
    good: AtomicU64,
    bad: AtomicU64,
}

impl Sender for ByOrigin {
    fn send(&self, job: &Arc<Job>, device: usize) -> SendFuture {
        if job.devices[device].contains(BAD) {
            self.bad.fetch_add(1, Ordering::Relaxed);
            return SendFuture::ready(SendOutcome::RetryProvider {
                after: None,
                reason: "503".into(),
                signal: Some(Signal::Unavailable),
            });
        }
        self.good.fetch_add(1, Ordering::Relaxed);
        SendFuture::ready(SendOutcome::Delivered)
    }

    fn name(&self) -> &'static str {
        "by-origin"
    }
}

fn scheduler(sender: Arc<ByOrigin>) -> Scheduler {
    let provider = Provider {
        name: Arc::from("webpush"),
        kind: ProviderKind::WebPush,
        max_rate: None,
        max_in_flight: None,
        adaptive: Some(CeilingParams::default()),
        sender: AnySender::Provider(sender),
    };
    let providers = Providers::new(vec![provider], "webpush").unwrap();
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

fn subscription(origin: &str, d: usize) -> String {
    format!(r#"{{"endpoint":"{origin}/wpush/{d}","keys":{{"p256dh":"k","auth":"a"}}}}"#)
}

/// Job `offset` of 10,000 devices, alternating between the two origins.
fn job(offset: i64) -> IncomingJob {
    let devices = 10_000;
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let tokens = (0..devices)
        .map(|d| subscription(if d % 2 == 0 { GOOD } else { BAD }, d))
        .collect();
    let job = Job::new(format!("j{offset}"), "c", tokens, payload).unwrap();
    let rate = Rate::per_second(RATE).unwrap();
    let settings = CampaignSettings::active("c", rate, Algorithm::Gcra);
    IncomingJob::fresh(job, 0, offset, settings)
}

/// Drives rounds (each 1 ms after the instant asked for) for `seconds`; returns the
/// sends to each origin in each second, (good, bad).
fn drive(s: &mut Scheduler, sender: &ByOrigin, seconds: u64) -> Vec<(u64, u64)> {
    let mut per_second = Vec::new();
    let mut last = (0, 0);
    let mut now = 0;
    for second in 1..=seconds {
        while now < second * SEC {
            let wake = s.run_round(now, now / SEC);
            let round_end = now + s.quantum().as_nanos() as Nanos;
            now = wake.map_or(round_end, |w| w.min(round_end)).max(now) + MS;
        }
        let counts = (
            sender.good.load(Ordering::Relaxed),
            sender.bad.load(Ordering::Relaxed),
        );
        per_second.push((counts.0 - last.0, counts.1 - last.1));
        last = counts;
    }
    per_second
}

#[test]
fn a_failing_origin_does_not_cut_another_origins_throughput() {
    let sender = Arc::new(ByOrigin::default());
    let mut s = scheduler(sender.clone());
    s.add_job(job(0), 0);
    s.add_job(job(1), 0);
    let per_second = drive(&mut s, &sender, 6);
    eprintln!("sent per second (good origin, bad origin): {per_second:?}");
    // From the third second on, the bad origin is held near its ceiling's floor (10/s)
    // and the campaign's permits go to the good origin's devices: near the campaign's
    // rate. With one ceiling for the provider, the bad origin's 503s cut it every other
    // second and the good origin fell with it.
    for (k, &(good, bad)) in per_second.iter().enumerate().skip(2) {
        assert!(
            good as f64 >= RATE * 0.9,
            "second {k}: {good} sent to the good origin: {per_second:?}"
        );
        assert!(
            bad <= 20,
            "second {k}: {bad} sent to the bad origin: {per_second:?}"
        );
    }
}

#[test]
fn each_origin_has_its_own_lane_and_ceiling() {
    let sender = Arc::new(ByOrigin::default());
    let mut s = scheduler(sender.clone());
    s.add_job(job(0), 0);
    s.add_job(job(1), 0);
    drive(&mut s, &sender, 4);
    let stats = s.stats();
    let provider = &stats.providers[0];
    // The provider itself has no ceiling: its origins have one each.
    assert_eq!(provider.ceiling, None);
    let lane = |origin: &str| {
        provider
            .origins
            .iter()
            .find(|o| &*o.origin == origin)
            .unwrap_or_else(|| panic!("no lane for {origin}: {:?}", provider.origins))
    };
    assert_eq!(provider.origins.len(), 2);
    let (good, bad) = (lane(GOOD), lane(BAD));
    assert_eq!((good.state, good.ceiling), ("clear", None), "{good:?}");
    assert_eq!(bad.state, "backing off", "{bad:?}");
    assert_eq!(bad.ceiling, Some(CeilingParams::default().floor), "{bad:?}");
    assert!(bad.congestion["unavailable"] >= 1, "{bad:?}");
    // No device was dropped: all are sent, waiting, or dead-lettered after retries.
    assert_eq!(s.stats().open_jobs, 2);
}
