//! The driver on tokio's paused clock: against a clock that runs apart from tokio's (the
//! worker's TSC clock and the OS clock drift by tens of ppm, which over hours is what
//! these tests compress into seconds: 1%), and with many campaigns, whose wake-ups the
//! slack gathers.

use super::*;
use crate::limiter::Algorithm;
use crate::sender::{AnySender, NullSender};
use std::sync::atomic::{AtomicU64, Ordering};

/// Reads of the clock after which the driver counts as spinning (a real run reads it a
/// few times per round; these runs have about 20,000 rounds).
const SPIN_READS: u64 = 5_000_000;

/// A clock that runs `ppm` parts per million apart from tokio's.
struct SkewedClock {
    start: tokio::time::Instant,
    ppm: i64,
    reads: AtomicU64,
}

impl SkewedClock {
    fn new(ppm: i64) -> Arc<Self> {
        Arc::new(Self {
            start: tokio::time::Instant::now(),
            ppm,
            reads: AtomicU64::new(0),
        })
    }
}

impl Clock for SkewedClock {
    fn now(&self) -> Nanos {
        let reads = self.reads.fetch_add(1, Ordering::Relaxed);
        assert!(reads < SPIN_READS, "the driver spins: {reads} clock reads");
        let real = self.start.elapsed().as_nanos() as i128;
        (real + real * self.ppm as i128 / 1_000_000) as Nanos
    }
}

#[tokio::test(start_paused = true)]
async fn an_instant_is_named_by_its_distance_from_the_clocks_now() {
    for ppm in [-10_000, 10_000] {
        let clock = SkewedClock::new(ppm);
        let time = TimeBase::new(clock.clone());
        // 1,000 s: the clocks are 10 s apart.
        tokio::time::advance(Duration::from_secs(1_000)).await;
        let at = time.instant(clock.now() + 5_000_000);
        assert_eq!(
            at - tokio::time::Instant::now(),
            Duration::from_millis(5),
            "{ppm} ppm"
        );
        let past = time.instant(clock.now().saturating_sub(5_000_000));
        assert_eq!(past, tokio::time::Instant::now(), "{ppm} ppm: due now");
    }
}

/// Runs the driver for `secs` of tokio's time with a campaign `c<i>` at each of `rates`
/// by a clock `ppm` apart, each with more devices than it can send; returns the
/// scheduler's last snapshot.
async fn drive(config: SchedulerConfig, rates: &[f64], ppm: i64, secs: u64) -> SchedulerStats {
    let (completions_tx, completions) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    let mut s = Scheduler::new(
        config,
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions_tx,
        events,
    );
    let clock = SkewedClock::new(ppm);
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    for (i, &rate) in rates.iter().enumerate() {
        let id = format!("c{i}");
        let settings =
            CampaignSettings::active(&id, Rate::per_second(rate).unwrap(), Algorithm::Gcra);
        let devices = (rate * 1.1 * secs as f64) as usize + 100;
        for (j, start) in (0..devices).step_by(10_000).enumerate() {
            let n = 10_000.min(devices - start);
            let list = (0..n).map(|d| format!("{id}-{}", start + d)).collect();
            let job = Job::new(format!("{id}-{j}"), &id, list, payload.clone()).unwrap();
            let offset = (i * 1_000 + j) as i64;
            s.add_job(
                IncomingJob::fresh(job, 0, offset, settings.clone()),
                clock.now(),
            );
        }
    }
    let (_control_tx, control) = mpsc::channel(16);
    let (stats_tx, mut stats) = tokio::sync::watch::channel(SchedulerStats::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        s,
        // Seconds end by the virtual clock, 0.65 s after its start: no run here stops
        // (5 s, 29.7 s, 30.3 s by the clock) in a second's held edge, which would keep
        // its last permits from the count.
        TimeBase::with_wall_origin(clock, Duration::from_millis(1_700_000_000_350)),
        control,
        completions,
        stop.clone(),
        Duration::from_secs(1),
        stats_tx,
    ));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.cancel();
    task.await.unwrap();
    let last = stats.borrow_and_update().clone();
    last
}

/// One campaign at 1,000/s by a clock `ppm` apart: its sends in `secs`.
async fn sends_with_skew(ppm: i64, secs: u64) -> u64 {
    drive(SchedulerConfig::default(), &[1_000.0], ppm, secs)
        .await
        .sends
}

#[tokio::test(start_paused = true)]
async fn a_clock_apart_from_tokios_neither_slows_nor_spins_the_driver() {
    // 30 s at 1,000/s by a clock 1% fast, then 1% slow: 30,300 and 29,700 sends by the
    // campaign's own clock. Mapped from a fixed origin, the fast clock's sleeps grew 300
    // ms late by the end (most of each lost past quantum_min), and the slow one spun.
    // Below that, at most what the slack holds back at the stop (as in the test below):
    // at 1,000/s, one send per millisecond of it.
    let held = SchedulerConfig::default().wake_slack.as_millis() as u64;
    for (ppm, want) in [(10_000i64, 30_300u64), (-10_000, 29_700)] {
        let sends = sends_with_skew(ppm, 30).await;
        // ±2: the permit due at the start and the one at the stop (virtual time, no noise).
        assert!(
            sends <= want + 2 && sends + 2 + held >= want,
            "{ppm} ppm: {sends} sends, want {want} (−{held})"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn the_wake_slack_gathers_wake_ups_and_loses_no_send() {
    // 100 campaigns at 2–2,000/s, log-spaced: someone's next permit falls in nearly
    // every millisecond, so without slack the driver wakes about once per timer tick.
    let rates: Vec<f64> = (0..100)
        .map(|i| 2.0 * 1_000f64.powf(i as f64 / 99.0))
        .collect();
    let secs = 5;
    let mut rounds = Vec::new();
    for slack_ms in [0, 4] {
        let config = SchedulerConfig {
            wake_slack: Duration::from_millis(slack_ms),
            ..SchedulerConfig::default()
        };
        let last = drive(config, &rates, 0, secs).await;
        for c in last.campaigns.iter() {
            let i: usize = c.id[1..].parse().unwrap();
            let want = rates[i] * secs as f64;
            // ±2: the permit due at the start and the one at the stop (virtual time, no
            // noise). Below that, at most what the slack holds back at the stop: a
            // late turn makes up the rest in full.
            let held = rates[i] * slack_ms as f64 / 1e3;
            let sent = c.sent as f64;
            assert!(
                sent <= want + 2.0 && sent >= want - 2.0 - held,
                "slack {slack_ms} ms: {} sent {sent}, want {want} (−{held:.1})",
                c.id,
            );
        }
        rounds.push(last.rounds);
    }
    eprintln!(
        "rounds in {secs} s: {} without slack, {} with 4 ms",
        rounds[0], rounds[1]
    );
    // With 4 ms: at most one timed round per 4 ms, plus one per snapshot published
    // (every 100 ms) and the first.
    let bound = secs * (1_000 / 4 + 10) + 1;
    assert!(
        rounds[1] <= bound,
        "{} rounds with slack, bound {bound}",
        rounds[1]
    );
    assert!(
        rounds[0] > 2 * rounds[1],
        "without slack {} rounds, with {}: the slack gathered nothing",
        rounds[0],
        rounds[1]
    );
}

#[test]
fn the_net_finds_a_campaign_whose_wake_up_was_lost() {
    const MS: Nanos = 1_000_000;
    let mut s = super::tests::with_campaign_at(10.0);
    s.run_round(0, 0);
    let sent = s.stats().sends;
    assert!(sent >= 1, "the first permit is sent at once");
    // The wake-up its turn named (100 ms) is lost.
    s.sleeping.clear();
    s.run_round(500 * MS, 0);
    assert_eq!(
        s.stats().sends,
        sent,
        "nothing marked it ready before the net"
    );
    s.run_round(1_001 * MS, 1);
    assert!(s.stats().sends > sent, "the net found it a second in");
}

#[tokio::test(start_paused = true)]
async fn the_net_gives_no_turn_to_a_campaign_whose_wake_up_is_near() {
    // 1,000 campaigns at 1–3/s for 5 s, their instants spread: each is woken by its
    // limiter one to three times a second. A net visiting every campaign each second
    // added 1,000 turns a second, half as many as the sends; now it visits those whose
    // instant passed with no turn, and there are none.
    let rates: Vec<f64> = (0..1_000).map(|i| 1.0 + (i % 100) as f64 / 50.0).collect();
    let secs = 5;
    let config = SchedulerConfig {
        max_active_campaigns: 1_000,
        ..SchedulerConfig::default()
    };
    let last = drive(config, &rates, 0, secs).await;
    for c in last.campaigns.iter() {
        let i: usize = c.id[1..].parse().unwrap();
        let want = rates[i] * secs as f64;
        // ±2: the permit due at the start and the one at the stop (virtual time).
        assert!(
            (c.sent as f64 - want).abs() <= 2.0,
            "{} sent {}",
            c.id,
            c.sent
        );
    }
    // A turn per send, and a few stale sleep entries' (a campaign woken early).
    let bound = last.sends + last.sends / 20;
    assert!(
        last.turns <= bound,
        "{} turns for {} sends (bound {bound})",
        last.turns,
        last.sends
    );
}
