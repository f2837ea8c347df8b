//! Ramp-up: the rate climbs from `ramp_from` to the full rate on a geometric curve.

use super::*;

const RATE: f64 = 500.0;
const RAMP_S: f64 = 30.0;
const FROM: f64 = 0.1;
/// The bound on each second at 100/s or more: ±2% of the curve's sends in it,
/// and at least one send (a second's count is a whole number).
const SECOND_TOLERANCE: f64 = 0.02;
/// The bound on each 100 ms bucket during the ramp: the full rate's tenth, 10%
/// over at most.
const BUCKET_LIMIT: f64 = RATE / 10.0 * 1.1;

/// The curve's sends between `a` and `b` seconds after the ramp's start:
/// `RATE × FROM × e^(g t)` integrated, `g = ln(1 / FROM) / RAMP_S`.
fn curve(a: f64, b: f64) -> f64 {
    let g = (1.0 / FROM).ln() / RAMP_S;
    // Piecewise: climbing before RAMP_S, flat after.
    let climb = |t: f64| RATE * FROM * ((g * t.min(RAMP_S)).exp() - 1.0) / g;
    let flat = |t: f64| RATE * (t - RAMP_S).max(0.0);
    (climb(b) + flat(b)) - (climb(a) + flat(a))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_ramp_follows_its_curve_each_second_and_no_100_ms_spikes() {
    let _serial = pacing_lock().await;
    let mut tw = TestWorker::options().partitions(2).prepare().await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let campaign = name("ramp");
    store(
        &pool,
        &campaign,
        CampaignPatch {
            send_rate: Some(RATE),
            ramp_up_s: Some(Some(RAMP_S)),
            ramp_from: Some(Some(FROM)),
            ..Default::default()
        },
    )
    .await;
    // 30 s of ramp sends about 5,900; then a few seconds at the full rate.
    produce_jobs(&topic, &jobs(&campaign, RATE, 5, 2_000), None).await;
    tw.start().await;
    wait_for(
        "the ramp and a few full seconds",
        GROUP_JOIN_LIMIT + Duration::from_secs(40),
        || {
            sink.campaign(&campaign)
                .is_some_and(|s| s.delivered >= 8_000)
        },
    )
    .await;
    tw.stop().await;
    let times = released(&sink.arrivals(), &campaign);
    // The ramp starts when the worker takes the campaign's first job, which it sends at
    // once: its first release is the curve's origin.
    let t0 = times[0];
    let secs = |k: f64| Duration::from_secs_f64(k);
    let mut checked = 0;
    for k in 0..(RAMP_S as u64 + 3) {
        let (a, b) = (k as f64, k as f64 + 1.0);
        let target = curve(a, b);
        let n = count_in(&times, t0 + secs(a), t0 + secs(b)) as f64;
        if target >= 100.0 {
            checked += 1;
            assert!(
                (n - target).abs() <= (target * SECOND_TOLERANCE).max(1.0),
                "second {k}: {n} sends, the curve's {target:.1}"
            );
        }
    }
    assert!(
        checked >= 15,
        "only {checked} seconds at 100/s or more were checked"
    );
    let mut at = t0;
    while at < t0 + secs(RAMP_S) {
        let n = count_in(&times, at, at + Duration::from_millis(100)) as f64;
        assert!(
            n <= BUCKET_LIMIT,
            "{n} sends in the 100 ms from {:?} after the start",
            at - t0
        );
        at += Duration::from_millis(100);
    }
}
