//! The driver against a clock that runs apart from tokio's, on tokio's paused clock: the
//! worker's TSC clock and the OS clock drift by tens of ppm, which over hours is what
//! these tests compress into seconds (1%).

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

/// Runs the driver for `secs` of tokio's time with one campaign at 1,000/s by a clock
/// `ppm` apart, and returns its sends.
async fn sends_with_skew(ppm: i64, secs: u64) -> u64 {
    let (completions_tx, completions) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    let mut s = Scheduler::new(
        SchedulerConfig::default(),
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions_tx,
        events,
    );
    let clock = SkewedClock::new(ppm);
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let rate = Rate::per_second(1_000.0).unwrap();
    let settings = CampaignSettings::active("c", rate, Algorithm::Gcra);
    // 40,000 devices: more than the campaign can send in the run.
    for j in 0..4 {
        let devices = (0..10_000).map(|d| format!("dev-{j}-{d}")).collect();
        let job = Job::new(format!("j{j}"), "c", devices, payload.clone()).unwrap();
        s.add_job(IncomingJob::fresh(job, 0, j, settings.clone()), clock.now());
    }
    let (_control_tx, control) = mpsc::channel(16);
    let (stats_tx, mut stats) = tokio::sync::watch::channel(SchedulerStats::default());
    let stop = tokio_util::sync::CancellationToken::new();
    let task = tokio::spawn(run(
        s,
        TimeBase::new(clock),
        control,
        completions,
        stop.clone(),
        Duration::from_secs(1),
        stats_tx,
    ));
    tokio::time::sleep(Duration::from_secs(secs)).await;
    stop.cancel();
    task.await.unwrap();
    let sends = stats.borrow_and_update().sends;
    sends
}

#[tokio::test(start_paused = true)]
async fn a_clock_apart_from_tokios_neither_slows_nor_spins_the_driver() {
    // 30 s at 1,000/s by a clock 1% fast, then 1% slow: 30,300 and 29,700 sends by the
    // campaign's own clock. Mapped from a fixed origin, the fast clock's sleeps grew 300
    // ms late by the end (most of each lost past quantum_min), and the slow one spun.
    for (ppm, want) in [(10_000, 30_300), (-10_000, 29_700)] {
        let sends = sends_with_skew(ppm, 30).await;
        // ±2: the permit due at the start and the one at the stop (virtual time, no noise).
        assert!(
            sends.abs_diff(want) <= 2,
            "{ppm} ppm: {sends} sends, want {want}"
        );
    }
}
