//! Three `pushpace run` workers in one group: the shared rate, ten campaigns at their
//! own rates, a worker leaving or killed, Redis stopped.

use super::process_run::*;
use super::*;
/// Three workers at 2,000/s, settled (the test fails if the group does not settle
/// within [`SETTLE_LIMIT`]): the rate checked over 6 s.
async fn three_workers_at_2000() -> ProcessRun {
    let mut run = start_workers(&[(2000.0, 150_000)], 3, None).await;
    let id = run.campaigns[0].0.clone();
    // The 6 s check, the 30 s watch after the event, and 10 s for the test's own steps.
    let settled = run
        .settle(Duration::from_secs(6) + WATCH + Duration::from_secs(10))
        .await;
    let seconds = run.watch_settled(Duration::from_secs(6)).await;
    let full = run.seconds_in(&id, seconds);
    let max = full.iter().copied().max().unwrap_or(0);
    let mean = full.iter().sum::<u64>() as f64 / full.len().max(1) as f64;
    eprintln!("3 workers, 2000/s over 6 partitions (group settled after {settled:?}): seconds released {full:?}");
    // The limiter's promise (+1: one send late, the next on time) within ±2%.
    assert!(max <= 2041, "largest second {max}: {full:?}");
    assert!(mean >= 0.97 * 2000.0, "mean {mean}: {full:?}");
    run
}

/// Outlasts the session timeout (6 s) and the group's rebalancing after a member leaves,
/// so that "for good" can be seen too.
const WATCH: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_three_worker_processes_share_2000_per_second_and_recover_from_sigterm() {
    let _g = pacing_lock().await;
    let mut run = three_workers_at_2000().await;
    // One worker leaves gracefully: its partitions move to the other two.
    let event = unix_now_f64();
    let status = crate::helpers::sigterm_and_wait(&mut run.workers.0[0]);
    assert!(status.success(), "{status}");
    run.recovery(event, WATCH).await.check("SIGTERM");
    run.finish_checked(event, unix_now_f64()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_three_worker_processes_recover_from_kill_9() {
    let _g = pacing_lock().await;
    let mut run = three_workers_at_2000().await;
    // One dies: its partitions move once the group notices (session timeout, 6 s); the
    // others take its share of the leases at once.
    let event = unix_now_f64();
    let _ = run.workers.0[1].kill();
    let _ = run.workers.0[1].wait();
    run.recovery(event, WATCH).await.check("kill -9");
    run.finish_checked(event, unix_now_f64()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_three_worker_processes_keep_ten_campaigns_at_their_own_rates() {
    let _g = pacing_lock().await;
    let rates = [
        50.0, 100.0, 150.0, 200.0, 250.0, 300.0, 350.0, 400.0, 450.0, 500.0,
    ];
    // 40 s of devices each; settling tops them up while tansu moves partitions.
    let campaigns: Vec<(f64, usize)> = rates.iter().map(|&r| (r, (r * 40.0) as usize)).collect();
    let mut run = start_workers(&campaigns, 3, None).await;
    // The 7 s watch below and 10 s to spare.
    let settled = run.settle(Duration::from_secs(17)).await;
    eprintln!("ten campaigns: group settled after {settled:?}");
    let seconds = run.watch_settled(Duration::from_secs(6)).await;
    for (id, rate) in &run.campaigns {
        let secs = run.seconds_in(id, seconds.clone());
        let max = secs.iter().copied().max().unwrap_or(0);
        let mean = secs.iter().sum::<u64>() as f64 / secs.len().max(1) as f64;
        eprintln!("{rate}/s: seconds released {secs:?}");
        // The limiter's promise (+1: one send late, the next on time) within ±2%.
        assert!(max as f64 <= rate * 1.02 + 1.0, "{rate}/s: {secs:?}");
        assert!(mean >= 0.97 * rate, "{rate}/s: mean {mean}: {secs:?}");
    }
    let duplicates = run.finish().await;
    eprintln!("ten campaigns: duplicates {duplicates}");
}

/// What a worker logs when Redis stops answering and when it answers again
/// (src/distributed/mod.rs), once per outage each.
const REDIS_DOWN_LOG: &str = "redis unreachable; campaigns fall back";
const REDIS_BACK_LOG: &str = "redis answers again; campaigns back on shared leases";
/// A campaign on its fallback probes Redis every 250 ms (lease.rs `PROBE_EVERY`); the
/// rest is room for a reconnect and a stall on the shared cores.
const REDIS_BACK_LIMIT: Duration = Duration::from_secs(10);
/// 2,000 × 1.02, and one send late per worker on its own fallback limiter.
const FALLBACK_BAND: u64 = 2_040 + 3;
/// What the scheduler logs when a campaign has no work left in a worker.
const CAMPAIGN_IDLE_LOG: &str = "campaign idle";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_redis_stopped_for_20_s_the_fallback_holds_the_rate_and_nothing_is_lost() {
    let _g = pacing_lock().await;
    let proxy = Proxy::start(REDIS).await;
    let mut run = start_workers(
        &[(2000.0, 90_000)],
        3,
        Some(format!("redis://127.0.0.1:{}", proxy.port)),
    )
    .await;
    let id = run.campaigns[0].0.clone();
    // The outage's 19 s, the workers' return (REDIS_BACK_LIMIT), 3 s after, 10 s to spare.
    let settled = run
        .settle(Duration::from_secs(19 + 3 + 10) + REDIS_BACK_LIMIT)
        .await;
    eprintln!("group settled after {settled:?}");
    proxy.set_up(false);
    // The first second of the outage is the switch; the rest is the fallback.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let during = whole_seconds(&run.sink, &id, Duration::from_secs(18)).await;
    proxy.set_up(true);
    let max = during.iter().copied().max().unwrap_or(0);
    let mean = during.iter().sum::<u64>() as f64 / during.len().max(1) as f64;
    eprintln!("redis cut for 20 s, 3 workers at 2000/s: seconds released {during:?} (largest {max}, mean {mean:.1})");
    // The fallback: 2000 / 3 per worker (the group's members, or the estimate of 3), so
    // never above the rate. Below it while a worker holds no partitions (a rebalance):
    // its third is not lent to the others without Redis. Sending never stops. Three
    // limiters that do not know of each other each keep their own promise (+1: one send
    // late, the next on time), so a second may hold the ±2% band plus one per worker.
    assert!(max <= FALLBACK_BAND, "largest second {max}: {during:?}");
    assert!(during.iter().all(|&n| n > 0), "sending stopped: {during:?}");
    // Every worker that fell back is on shared leases again.
    // A worker whose share ran out during the outage released the campaign (and its
    // lease task) and has nothing to take back: it counts as back once it logged the
    // campaign idle after falling back.
    wait_for("the workers back on Redis leases", REDIS_BACK_LIMIT, || {
        let states: Vec<Option<bool>> = run
            .logs
            .iter()
            .map(|log| {
                let text = std::fs::read_to_string(log).unwrap_or_default();
                let down = text.rfind(REDIS_DOWN_LOG)?;
                let after = &text[down..];
                Some(after.contains(REDIS_BACK_LOG) || after.contains(CAMPAIGN_IDLE_LOG))
            })
            .collect();
        states.iter().any(Option::is_some) && states.iter().all(|s| s.unwrap_or(true))
    })
    .await;
    let back = whole_seconds(&run.sink, &id, Duration::from_secs(3)).await;
    eprintln!("after redis returns, released: {back:?}");
    assert!(back.iter().all(|&n| n <= 2041), "{back:?}");
    let duplicates = run.finish().await;
    eprintln!("redis outage: duplicates {duplicates}");
}
