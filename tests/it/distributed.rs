//! Distributed mode against the real Redis on 127.0.0.1:6379 (a unique key prefix per
//! test) and, for several workers, real `pushpace run` processes on the real broker.

use crate::helpers::{brokers, fresh_database, pacing_lock, unique_name, Proxy};
use pushpace::config::RedisAlgorithm;
use pushpace::distributed::{
    redis_gcra, redis_sliding_window, LeaseAnswer, RedisConfig, RedisLimiterFactory,
};
use pushpace::limiter::{Clock, MonotonicClock, Nanos, Rate, RateLimiter, NANOS_PER_SEC};
use pushpace::produce::{PlannedCampaign, ProducePlan};
use pushpace::sink::{Sink, SinkConfig};
use rdkafka::producer::{FutureProducer, FutureRecord};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REDIS: &str = "127.0.0.1:6379";

async fn conn() -> redis::aio::ConnectionManager {
    let client = redis::Client::open(format!("redis://{REDIS}")).unwrap();
    redis::aio::ConnectionManager::new(client).await.unwrap()
}

fn config(url: String, algorithm: RedisAlgorithm, lease_ms: u64, workers: u32) -> RedisConfig {
    RedisConfig {
        url: url.into(),
        connect_timeout: Duration::from_millis(500),
        algorithm,
        lease: Duration::from_millis(lease_ms),
        key_prefix: unique_name("pp"),
        workers_estimate: workers,
    }
}

#[tokio::test]
async fn gcra_script_grants_consecutive_slots_then_asks_to_wait() {
    let mut c = conn().await;
    let key = redis_gcra::key(&unique_name("pp"), "c");
    // 10/s: slots 100 ms apart, so the few ms between calls do not open a new slot.
    let rate = Rate::per_second(10.0).unwrap();
    let horizon = Duration::from_secs(1);
    let first = redis_gcra::lease(&mut c, &key, rate, 0, 5, horizon)
        .await
        .unwrap();
    assert!(
        matches!(first, LeaseAnswer::Granted { permits: 5, offset_micros } if offset_micros.abs() < 1000),
        "{first:?}"
    );
    // The next lease starts where the first ends (5 slots later) and stops at the
    // horizon: the 5 slots left of the next second.
    let second = redis_gcra::lease(&mut c, &key, rate, 0, 1000, horizon)
        .await
        .unwrap();
    let LeaseAnswer::Granted {
        permits: 5,
        offset_micros,
    } = second
    else {
        panic!("{second:?}")
    };
    assert!(
        (400_000..=500_001).contains(&offset_micros),
        "{offset_micros}"
    );
    // The horizon is full: the answer is a wait of at most one interval, not a grant.
    let third = redis_gcra::lease(&mut c, &key, rate, 0, 1, horizon)
        .await
        .unwrap();
    assert!(
        matches!(third, LeaseAnswer::Wait(d) if d > Duration::ZERO && d <= Duration::from_millis(100)),
        "{third:?}"
    );
}

#[tokio::test]
async fn sliding_window_script_fills_the_window_then_asks_to_wait() {
    let mut c = conn().await;
    let key = redis_sliding_window::key(&unique_name("pp"), "c");
    let rate = Rate::per_second(100.0).unwrap();
    let mut granted = 0;
    let mut waited = None;
    for _ in 0..20 {
        match redis_sliding_window::lease(&mut c, &key, rate, 0, 25)
            .await
            .unwrap()
        {
            LeaseAnswer::Granted { permits, .. } => granted += permits,
            LeaseAnswer::Wait(d) => {
                waited = Some(d);
                break;
            }
        }
    }
    // Fresh keys: the previous window is empty, so the whole limit fits, and no more.
    assert_eq!(granted, 100);
    let d = waited.expect("a wait once the window is full");
    assert!(d > Duration::ZERO && d <= Duration::from_secs(1), "{d:?}");
}

/// Per-worker send instants.
type Log = Arc<Mutex<Vec<Nanos>>>;

/// Drives a limiter like the scheduler does: takes what is ready, sleeps until the
/// instant it names, until `until`.
async fn drive(lim: Arc<dyn RateLimiter>, clock: Arc<MonotonicClock>, until: Nanos, log: Log) {
    loop {
        let now = clock.now();
        if now >= until {
            return;
        }
        let g = lim.acquire_up_to(64, now);
        if g.granted > 0 {
            let mut l = log.lock().unwrap();
            l.extend(std::iter::repeat_n(now, g.granted as usize));
        }
        let next = g.next_at.unwrap_or(now + 1_000_000).min(now + 5_000_000);
        tokio::time::sleep(Duration::from_nanos(next.saturating_sub(now).max(200_000))).await;
    }
}

/// The largest count in any 1 s window starting at `from` or later (10 ms steps), and
/// the mean rate over `[from, to)`.
fn windows(mut t: Vec<Nanos>, from: Nanos, to: Nanos) -> (u64, f64) {
    t.sort_unstable();
    let mut max = 0u64;
    let mut start = from;
    while start + NANOS_PER_SEC <= to {
        let lo = t.partition_point(|&x| x < start);
        let hi = t.partition_point(|&x| x < start + NANOS_PER_SEC);
        max = max.max((hi - lo) as u64);
        start += 10_000_000;
    }
    let lo = t.partition_point(|&x| x < from);
    let hi = t.partition_point(|&x| x < to);
    let mean = (hi - lo) as f64 / ((to - from) as f64 / NANOS_PER_SEC as f64);
    (max, mean)
}

struct Shared {
    max_window: u64,
    mean: f64,
    round_trips_per_1000: f64,
}

/// `workers` factories (one per simulated worker) share one campaign at `rate` for
/// `secs` seconds; the first second is warm-up.
async fn share_between(
    algorithm: RedisAlgorithm,
    workers: u32,
    rate: f64,
    lease_ms: u64,
    secs: u64,
) -> Shared {
    let clock = Arc::new(MonotonicClock::new());
    let prefix = unique_name("pp");
    let campaign = unique_name("c");
    let rate = Rate::per_second(rate).unwrap();
    let factories: Vec<RedisLimiterFactory> = (0..workers)
        .map(|_| {
            let mut c = config(format!("redis://{REDIS}"), algorithm, lease_ms, workers);
            c.key_prefix = prefix.clone();
            RedisLimiterFactory::new(c, clock.clone()).unwrap()
        })
        .collect();
    let end = Instant::now() + Duration::from_secs(5);
    while !factories.iter().all(|f| f.is_connected()) && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let start = clock.now();
    let until = start + secs * NANOS_PER_SEC;
    let log: Log = Arc::default();
    let tasks: Vec<_> = factories
        .iter()
        .map(|f| {
            let lim: Arc<dyn RateLimiter> = Arc::new(f.limiter(&campaign, rate, 0));
            tokio::spawn(drive(lim, clock.clone(), until, log.clone()))
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let t = std::mem::take(&mut *log.lock().unwrap());
    let sends = t.len() as f64;
    let (max_window, mean) = windows(t, start + NANOS_PER_SEC, until);
    let trips: u64 = factories.iter().map(|f| f.round_trips()).sum();
    Shared {
        max_window,
        mean,
        round_trips_per_1000: trips as f64 * 1000.0 / sends.max(1.0),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_redis_gcra_leases_share_one_rate_between_three_workers() {
    let _g = pacing_lock().await;
    let leased = share_between(RedisAlgorithm::RedisGcra, 3, 2000.0, 100, 6).await;
    // 1 ms lease slice: one permit per lease, the "no leasing" baseline.
    let single = share_between(RedisAlgorithm::RedisGcra, 3, 2000.0, 1, 6).await;
    eprintln!(
        "redis-gcra, 3 workers, 2000/s: leased (100 ms): largest 1 s window {}, mean {:.1}/s, {:.1} round trips per 1000 sends; unleased: largest {}, mean {:.1}/s, {:.1} round trips per 1000 sends",
        leased.max_window, leased.mean, leased.round_trips_per_1000,
        single.max_window, single.mean, single.round_trips_per_1000
    );
    // +1: a slot on the window's edge.
    assert!(leased.max_window <= 2041, "{}", leased.max_window);
    assert!(leased.mean >= 0.97 * 2000.0, "{}", leased.mean);
    assert!(
        leased.round_trips_per_1000 < 60.0,
        "{}",
        leased.round_trips_per_1000
    );
    assert!(single.max_window <= 2041, "{}", single.max_window);
    assert!(
        single.round_trips_per_1000 > 500.0,
        "{}",
        single.round_trips_per_1000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_redis_sliding_window_leases_share_one_rate_between_three_workers() {
    let _g = pacing_lock().await;
    let s = share_between(RedisAlgorithm::RedisSlidingWindow, 3, 2000.0, 100, 6).await;
    eprintln!(
        "redis-sliding-window, 3 workers, 2000/s, 100 ms leases: largest 1 s window {}, mean {:.1}/s, {:.1} round trips per 1000 sends",
        s.max_window, s.mean, s.round_trips_per_1000
    );
    // The approximation's error is what the comparison measures; it still holds the
    // long-run rate.
    assert!(
        s.mean <= 2000.0 * 1.05 && s.mean >= 0.9 * 2000.0,
        "{}",
        s.mean
    );
    assert!(s.max_window <= 2000 * 3 / 2, "{}", s.max_window);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_redis_outage_falls_back_to_rate_over_workers_and_comes_back() {
    let _g = pacing_lock().await;
    let proxy = Proxy::start(REDIS).await;
    let clock = Arc::new(MonotonicClock::new());
    let f = RedisLimiterFactory::new(
        config(
            format!("redis://127.0.0.1:{}", proxy.port),
            RedisAlgorithm::RedisGcra,
            100,
            2,
        ),
        clock.clone(),
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !f.is_connected() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let lim = Arc::new(f.limiter("c", Rate::per_second(1000.0).unwrap(), 0));
    let run = |secs: u64| {
        let log: Log = Arc::default();
        let start = clock.now();
        let until = start + secs * NANOS_PER_SEC;
        let task = tokio::spawn(drive(lim.clone(), clock.clone(), until, log.clone()));
        async move {
            task.await.unwrap();
            let t = std::mem::take(&mut *log.lock().unwrap());
            windows(t, start + NANOS_PER_SEC / 2, until)
        }
    };
    let (_, mean_up) = run(2).await;
    assert!(!lim.on_fallback());
    assert!(
        mean_up > 900.0,
        "with redis, alone: the full rate ({mean_up})"
    );

    proxy.set_up(false);
    let cut = Instant::now();
    while !lim.on_fallback() && cut.elapsed() < Duration::from_secs(10) {
        let _ = lim.acquire_up_to(1, clock.now());
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let switch = cut.elapsed();
    assert!(switch < Duration::from_secs(2), "fallback after {switch:?}");
    let watch = {
        let lim = lim.clone();
        tokio::spawn(async move {
            let mut flips = 0;
            let mut last = true;
            for _ in 0..300 {
                let on = lim.on_fallback();
                flips += u32::from(on != last);
                last = on;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            flips
        })
    };
    let (max_down, mean_down) = run(3).await;
    eprintln!("flips {}", watch.await.unwrap());
    assert!(lim.on_fallback(), "on the fallback while redis is cut");
    // The fallback: 1000 / 2 workers, and sending never stopped.
    assert!(
        (400.0..=520.0).contains(&mean_down),
        "fallback mean {mean_down}"
    );
    assert!(max_down <= 520, "fallback window {max_down}");

    proxy.set_up(true);
    let back = Instant::now() + Duration::from_secs(10);
    while lim.on_fallback() && Instant::now() < back {
        let _ = lim.acquire_up_to(1, clock.now());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!lim.on_fallback(), "back on redis once it answers");
    let (_, mean_back) = run(2).await;
    assert!(mean_back > 900.0, "full rate again ({mean_back})");
    eprintln!("outage: fallback {switch:?} after the cut; largest fallback window {max_down}, fallback mean {mean_down:.1}/s");
}

/// Jobs of `plan` spread round-robin over `partitions` partitions.
async fn produce_spread(topic: &str, plan: &ProducePlan, partitions: i32) {
    let producer: FutureProducer = pushpace::broker::producer_config(&brokers())
        .create()
        .unwrap();
    for (i, job) in plan.jobs().enumerate() {
        let value = job.to_json();
        producer
            .send(
                FutureRecord::to(topic)
                    .key(&job.campaign_id)
                    .payload(&value)
                    .partition(i as i32 % partitions),
                Duration::from_secs(30),
            )
            .await
            .map_err(|(e, _)| e)
            .unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_three_worker_processes_share_2000_per_second_and_survive_kills() {
    let _g = pacing_lock().await;
    let (_pool, db_url) = fresh_database().await;
    let topic = unique_name("jobs");
    pushpace::broker::ensure_topic(&brokers(), &topic, 6)
        .await
        .unwrap();
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let run_id = unique_name("dist").replace('_', "-");
    let campaign = format!("{run_id}-c");
    let total = 40_000usize;
    let plan = ProducePlan {
        campaigns: vec![PlannedCampaign {
            id: campaign.clone(),
            send_rate: Rate::per_second(2000.0).unwrap(),
            devices: total,
        }],
        job_size: 250,
        algorithm: None,
        run_id,
    };
    produce_spread(&topic, &plan, 6).await;
    let group = unique_name("g");
    let prefix = unique_name("pp");
    let env = [
        ("PUSHPACE__LIMITER__SCOPE", "redis"),
        ("PUSHPACE__LIMITER__WORKERS_ESTIMATE", "3"),
        ("PUSHPACE__REDIS__KEY_PREFIX", prefix.as_str()),
        ("PUSHPACE__KAFKA__ISOLATION_LEVEL", "read_uncommitted"),
        ("PUSHPACE__SENDER__MAX_IN_FLIGHT", "64"),
    ];
    let spawn = || {
        crate::helpers::spawn_worker_process(&brokers(), &topic, &group, &db_url, &sink.url(), &env)
    };
    let mut workers: Vec<_> = (0..3).map(|_| spawn()).collect();
    // Wait for the group to settle and sending to start, then measure 6 s.
    let end = Instant::now() + Duration::from_secs(60);
    while sink.summary().delivered < 4000 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_secs(6)).await;
    let seconds = sink.per_second(&campaign);
    // Whole seconds between the first full one and the last full one.
    let full: Vec<u64> = seconds
        .iter()
        .skip(1)
        .take(seconds.len().saturating_sub(2))
        .map(|s| s.requests)
        .collect();
    let max = full.iter().copied().max().unwrap_or(0);
    let mean = full.iter().sum::<u64>() as f64 / full.len().max(1) as f64;
    eprintln!("3 workers, 2000/s over 6 partitions: seconds at the sink {full:?}");
    // ≤ 2,000 × 1.02, +1 for a request whose arrival jitters across a second boundary.
    assert!(max <= 2041, "largest second {max}: {full:?}");
    assert!(mean >= 0.97 * 2000.0, "mean {mean}: {full:?}");

    // One worker leaves gracefully, another dies: their partitions move, nothing is lost.
    let status = crate::helpers::sigterm_and_wait(&mut workers[0]);
    assert!(status.success(), "{status}");
    let _ = workers[1].kill();
    let _ = workers[1].wait();
    let end = Instant::now() + Duration::from_secs(120);
    while sink.summary().distinct_delivered < total as u64 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let s = sink.summary();
    let status = crate::helpers::sigterm_and_wait(&mut workers[2]);
    assert!(status.success(), "{status}");
    assert_eq!(s.distinct_delivered, total as u64, "no device lost");
    let after = sink.per_second(&campaign);
    let max_after = after.iter().map(|s| s.requests).max().unwrap_or(0);
    eprintln!(
        "after the kills: largest second {max_after}, duplicates {}",
        s.duplicates
    );
    assert!(max_after <= 2041, "largest second {max_after}");
}
