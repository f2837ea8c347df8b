//! Distributed mode against the real Redis on 127.0.0.1:6379 (a unique key prefix per
//! test) and, for several workers, real `pushpace run` processes on the real broker.

use crate::harness::{produce_spread, TestWorker};
use crate::helpers::{
    brokers, fresh_database, owned_partitions, pacing_lock, spawn_logged, unique_name, wait_for,
    worker_log, Proxy,
};
use pushpace::config::RedisAlgorithm;
use pushpace::distributed::{
    redis_gcra, redis_sliding_window, LeaseAnswer, RedisConfig, RedisLimiterFactory,
};
use pushpace::limiter::{
    Algorithm, Clock, MonotonicClock, Nanos, Rate, RateLimiter, NANOS_PER_SEC,
};
use pushpace::tools::produce::ProducePlan;
use pushpace::tools::sink::{Sink, SinkConfig};
use pushpace::worker::scheduler::acquire_catching_up;
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

/// Drives a limiter like the scheduler does: takes what is ready, asking as of the
/// instant the limiter named when the wake-up was late by at most 10 ms, and of each
/// following instant it names up to now (as the scheduler does, so timer lateness is
/// not lost from the rate), then sleeps until the next instant named, until `until`.
async fn drive(lim: Arc<dyn RateLimiter>, clock: Arc<MonotonicClock>, until: Nanos, log: Log) {
    let mut planned: Option<Nanos> = None;
    loop {
        let now = clock.now();
        if now >= until {
            return;
        }
        let mut ask_at = match planned {
            Some(t) if t <= now && now - t <= 10_000_000 => t,
            _ => now,
        };
        let mut granted = 0u32;
        let next_at = loop {
            let g = lim.acquire_up_to(64 - granted, ask_at);
            granted += g.granted;
            match g.next_at {
                Some(t) if t <= now && t > ask_at && granted < 64 => ask_at = t,
                next => break next,
            }
        };
        if granted > 0 {
            let mut l = log.lock().unwrap();
            l.extend(std::iter::repeat_n(now, granted as usize));
        }
        let next = next_at.unwrap_or(now + 1_000_000).min(now + 5_000_000);
        planned = Some(next);
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
/// `secs` seconds; the first second is warm-up. The campaign's own algorithm is
/// `local` (shaping the leased permits), without burst.
async fn share_between(
    algorithm: RedisAlgorithm,
    local: Algorithm,
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
            let lim: Arc<dyn RateLimiter> = Arc::new(f.limiter(&campaign, local, rate, 0));
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
    let gcra = Algorithm::Gcra;
    let leased = share_between(RedisAlgorithm::RedisGcra, gcra, 3, 2000.0, 100, 6).await;
    // 1 ms lease slice: one permit per lease, the "no leasing" baseline.
    let single = share_between(RedisAlgorithm::RedisGcra, gcra, 3, 2000.0, 1, 6).await;
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
    let s = share_between(
        RedisAlgorithm::RedisSlidingWindow,
        Algorithm::Gcra,
        3,
        2000.0,
        100,
        6,
    )
    .await;
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
async fn paced_leaky_and_token_bucket_campaigns_shape_their_leases_and_keep_the_shared_rate() {
    let _g = pacing_lock().await;
    for local in [Algorithm::LeakyBucket, Algorithm::TokenBucket] {
        let s = share_between(RedisAlgorithm::RedisGcra, local, 3, 2000.0, 100, 5).await;
        eprintln!(
            "redis-gcra leases shaped by {local}, 3 workers, 2000/s: largest 1 s window {}, mean {:.1}/s, {:.1} round trips per 1000 sends",
            s.max_window, s.mean, s.round_trips_per_1000
        );
        // Redis keeps the total whatever shapes the permits locally.
        assert!(s.max_window <= 2041, "{local}: {}", s.max_window);
        assert!(s.mean >= 0.97 * 2000.0, "{local}: {}", s.mean);
    }
}

/// What a new limiter of `algorithm` at 100/s grants at once as soon as it holds a
/// lease, and the algorithm that shaped it.
async fn first_grant(
    f: &RedisLimiterFactory,
    clock: &MonotonicClock,
    algorithm: Algorithm,
    burst: u32,
) -> (Option<Algorithm>, u32) {
    let rate = Rate::per_second(100.0).unwrap();
    let lim = f.limiter(&unique_name("c"), algorithm, rate, burst);
    let end = Instant::now() + Duration::from_secs(3);
    while !lim.holds_lease() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(lim.holds_lease(), "{algorithm}: no lease within 3 s");
    let g = lim.acquire_up_to(1000, clock.now());
    (lim.local_algorithm(), g.granted)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leased_permits_take_the_campaigns_own_shape_but_window_algorithms_keep_the_slots() {
    let _g = pacing_lock().await;
    let clock = Arc::new(MonotonicClock::new());
    let f = RedisLimiterFactory::new(
        config(
            format!("redis://{REDIS}"),
            RedisAlgorithm::RedisGcra,
            100,
            1,
        ),
        clock.clone(),
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !f.is_connected() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // A token bucket with burst 20 sends its 21 at once from the first lease (Redis's
    // tolerance lets that lease start 20 slots back), as it would alone.
    let bucket = first_grant(&f, &clock, Algorithm::TokenBucket, 20).await;
    assert_eq!(bucket, (Some(Algorithm::TokenBucket), 21));
    // GCRA without burst is the lease's own schedule: its slots are spent at their own
    // times (no local shaping), one now, the next a slot later.
    let gcra = first_grant(&f, &clock, Algorithm::Gcra, 0).await;
    assert_eq!(gcra, (None, 1));
    // Alone, a fixed window passes its whole window at once; under a lease it falls back
    // to the lease's own slots: one or two due, not the window.
    let alone =
        pushpace::limiter::build(Algorithm::FixedWindow, Rate::per_second(100.0).unwrap(), 0);
    assert_eq!(alone.acquire_up_to(1000, clock.now()).granted, 100);
    let (shaper, granted) = first_grant(&f, &clock, Algorithm::FixedWindow, 0).await;
    assert_eq!(shaper, None, "fixed-window cannot shape a lease");
    assert!(
        (1..=2).contains(&granted),
        "fixed-window under a lease: {granted}"
    );
    for a in [Algorithm::SlidingLog, Algorithm::SlidingWindow] {
        assert_eq!(first_grant(&f, &clock, a, 0).await.0, None, "{a}");
    }
}

/// A scheduler that stalled makes up at most `quantum_min` of the stall on Redis leases
/// too: the lease's own catch-up (a slot may be spent up to 10 ms late) is counted in,
/// not added on top. Added on top, a 40 ms stall came out as 20 ms of slots at once (20
/// at 1,000/s), and three stalled workers could push a second at the provider 2% over.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stall_on_redis_leases_is_made_up_by_at_most_quantum_min() {
    const MS: Nanos = 1_000_000;
    let clock = Arc::new(MonotonicClock::new());
    let f = RedisLimiterFactory::new(
        config(
            format!("redis://{REDIS}"),
            RedisAlgorithm::RedisGcra,
            100,
            1,
        ),
        clock.clone(),
    )
    .unwrap();
    let lim = f.limiter(
        &unique_name("c"),
        Algorithm::Gcra,
        Rate::per_second(1000.0).unwrap(),
        0,
    );
    let end = Instant::now() + Duration::from_secs(3);
    while !lim.holds_lease() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    assert!(lim.holds_lease(), "no lease within 3 s");
    assert_eq!(
        lim.catch_up(),
        10 * MS,
        "slots are spent at their own times"
    );
    let quantum_min = 10 * MS;
    // Rounds on schedule for 300 ms, as the scheduler runs them.
    let (mut next_at, mut on_time) = (None, 0);
    let until = clock.now() + 300 * MS;
    while clock.now() < until {
        let g = acquire_catching_up(&lim, 1000, next_at, clock.now(), quantum_min);
        (next_at, on_time) = (g.next_at, on_time + g.granted);
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // Then 40 ms without a round (at least: a busy machine only makes it longer).
    tokio::time::sleep(Duration::from_millis(40)).await;
    let after = acquire_catching_up(&lim, 1000, next_at, clock.now(), quantum_min);
    eprintln!(
        "1,000/s on leases: {on_time} in 300 ms of rounds, then {} at once after a 40 ms stall",
        after.granted
    );
    // 300 ms at 1,000/s, plus what the first round makes up.
    assert!((250..=312).contains(&on_time), "{on_time} in 300 ms");
    // rate × quantum_min, +1 for the slot due now.
    assert!(
        (1..=11).contains(&after.granted),
        "a burst of {} after the stall",
        after.granted
    );
}

#[tokio::test]
async fn campaign_limiter_scope_is_set_kept_reset_and_validated_through_the_api() {
    let app = crate::api::spawn_app().await;
    let r = app.put("/api/campaigns/sc", r#"{"send_rate": 100}"#).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(
        r.body["limiter_scope"],
        serde_json::Value::Null,
        "{}",
        r.text
    );
    let r = app
        .put("/api/campaigns/sc", r#"{"limiter_scope": "redis"}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["limiter_scope"], "redis");
    assert_eq!(r.body["send_rate"], 100.0, "other fields kept");
    // Another field's change keeps the scope; GET shows it.
    let r = app.put("/api/campaigns/sc", r#"{"burst": 3}"#).await;
    assert_eq!(r.body["limiter_scope"], "redis", "{}", r.text);
    let r = app.get("/api/campaigns/sc").await;
    assert_eq!(r.body["limiter_scope"], "redis", "{}", r.text);
    for bad in [
        r#"{"limiter_scope": "global"}"#,
        r#"{"limiter_scope": 5}"#,
        r#"{"limiter_scope": ["redis"]}"#,
    ] {
        let r = app.put("/api/campaigns/sc", bad).await;
        assert_eq!(r.status, 422, "{bad}: {}", r.text);
        assert_eq!(r.body["field"], "limiter_scope", "{bad}: {}", r.text);
    }
    // null: back to the configured default.
    let r = app
        .put("/api/campaigns/sc", r#"{"limiter_scope": null}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body["limiter_scope"],
        serde_json::Value::Null,
        "{}",
        r.text
    );
    let stored: Option<String> =
        sqlx::query_scalar("SELECT limiter_scope FROM campaigns WHERE id = $1")
            .bind("sc")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    assert_eq!(stored, None);
    // The CHECK constraint is the backstop for plain SQL, mapped to the same field.
    let err = sqlx::query("UPDATE campaigns SET limiter_scope = $1 WHERE id = $2")
        .bind("global")
        .bind("sc")
        .execute(&app.pool)
        .await
        .unwrap_err();
    let err = pushpace::store::StoreError::from(err);
    assert_eq!(err.field(), Some("limiter_scope"), "{err}");

    // The CLI: set-scope and show.
    let url = app.app.url();
    let cli = move |list: &'static [&'static str]| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let out = crate::helpers::pushpace_bin()
                .arg("campaign")
                .args(list)
                .args(["--api", &url])
                .env("PUSHPACE_ADMIN_TOKEN", crate::api::TOKEN)
                .output()
                .unwrap();
            (
                out.status.success(),
                String::from_utf8_lossy(&out.stdout).into_owned(),
                String::from_utf8_lossy(&out.stderr).into_owned(),
            )
        })
    };
    let (ok, out, err) = cli(&["set-scope", "sc", "redis"]).await.unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("campaign sc: limiter scope redis"), "{out}");
    let (ok, out, err) = cli(&["show", "sc"]).await.unwrap();
    assert!(ok, "{err}");
    assert!(out.contains("scope       redis"), "{out}");
    let (ok, out, err) = cli(&["set-scope", "sc", "default"]).await.unwrap();
    assert!(ok, "{err}");
    assert!(
        out.contains("limiter scope default (limiter.scope)"),
        "{out}"
    );
    let (ok, _, err) = cli(&["set-scope", "sc", "global"]).await.unwrap();
    assert!(!ok);
    assert!(
        err.contains("422") && err.contains("limiter_scope"),
        "{err}"
    );
    app.app.stop().await.unwrap();
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
    let lim = Arc::new(f.limiter("c", Algorithm::Gcra, Rate::per_second(1000.0).unwrap(), 0));
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
    let (max_down, mean_down) = run(3).await;
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

/// The TAT a campaign's key holds in Redis (µs of Redis's clock), if any.
async fn tat(c: &mut redis::aio::ConnectionManager, key: &str) -> Option<f64> {
    let v: Option<String> = redis::cmd("GET").arg(key).query_async(c).await.unwrap();
    v.map(|v| v.parse().unwrap())
}

/// Sends per second the worker made over the next `span`. The scheduler publishes its
/// counts every 100 ms or so, so a count read at a random moment can be that old (20
/// sends at 200/s, 3% of 3 s): both ends are taken as a fresh count arrives, and timed
/// then.
async fn worker_rate(worker: &pushpace::worker::Worker, span: Duration) -> f64 {
    let mut stats = worker.scheduler_stats.clone();
    let (before, t0) = fresh_count(&mut stats).await;
    tokio::time::sleep(span).await;
    let (after, t1) = fresh_count(&mut stats).await;
    (after - before) as f64 / (t1 - t0).as_secs_f64()
}

/// The next count the scheduler publishes, and when it arrived.
async fn fresh_count(
    stats: &mut tokio::sync::watch::Receiver<pushpace::worker::scheduler::SchedulerStats>,
) -> (u64, Instant) {
    stats.borrow_and_update();
    stats.changed().await.expect("the scheduler runs");
    (stats.borrow().delivered, Instant::now())
}

/// How long a scope change may take to reach the limiter: the watcher's LISTEN, or its
/// re-read every second, then the scheduler's rebuild, with room for a stall.
const SCOPE_CHANGE_LIMIT: Duration = Duration::from_secs(10);
/// A campaign on leases takes one about every `redis.lease_ms` (100 ms) while it sends;
/// five of them without the schedule in Redis moving means no limiter takes leases.
const LEASES_IDLE: Duration = Duration::from_millis(500);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_campaign_moved_to_redis_scope_and_back_rebuilds_its_limiter_at_its_rate() {
    let _g = pacing_lock().await;
    let plan = ProducePlan::with_rates(
        &unique_name("scope").replace('_', "-"),
        &[(200.0, 8000)],
        250,
        Some(Algorithm::Gcra),
    )
    .unwrap();
    let prefix = unique_name("pp");
    // The configured default is local; only the campaign's own scope asks for Redis.
    let mut tw = TestWorker::options()
        .partitions(2)
        .null_sender()
        .api()
        .settings(&[
            ("limiter.scope", "local".to_string()),
            ("limiter.workers_estimate", "1".to_string()),
            ("redis.key_prefix", prefix.clone()),
            ("redis.url", format!("redis://{REDIS}")),
        ])
        .spawn_with_plan(&plan)
        .await;
    let (worker, api) = (tw.take_worker(), tw.take_api());
    let id = plan.campaigns[0].id.clone();
    let key = redis_gcra::key(&prefix, &id);
    let mut c = conn().await;

    let end = Instant::now() + Duration::from_secs(60);
    while worker.scheduler_stats.borrow().delivered < 200 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let local = worker_rate(&worker, Duration::from_secs(3)).await;
    assert_eq!(
        tat(&mut c, &key).await,
        None,
        "a local campaign never asks Redis"
    );

    let r = api
        .put(
            &format!("/api/campaigns/{id}"),
            r#"{"limiter_scope": "redis"}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let end = Instant::now() + Duration::from_secs(5);
    while tat(&mut c, &key).await.is_none() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let t1 = tat(&mut c, &key)
        .await
        .expect("leases from Redis within 5 s");
    let shared = worker_rate(&worker, Duration::from_secs(3)).await;
    let t2 = tat(&mut c, &key).await.unwrap();
    // 3 s of leases at 200/s move the schedule by about 3 s.
    assert!(
        (2.5e6..=3.6e6).contains(&(t2 - t1)),
        "the schedule in Redis moved {} µs",
        t2 - t1
    );

    let r = api
        .put(
            &format!("/api/campaigns/{id}"),
            r#"{"limiter_scope": null}"#,
        )
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    // The watcher's round trip, then the leases in hand run out: the schedule in Redis
    // stops moving.
    let end = Instant::now() + SCOPE_CHANGE_LIMIT;
    let mut before = tat(&mut c, &key).await;
    loop {
        tokio::time::sleep(LEASES_IDLE).await;
        let now = tat(&mut c, &key).await;
        if now == before {
            break;
        }
        assert!(
            Instant::now() < end,
            "leases still taken from Redis {SCOPE_CHANGE_LIMIT:?} after the scope went back to local"
        );
        before = now;
    }
    let t3 = tat(&mut c, &key).await.unwrap();
    let back = worker_rate(&worker, Duration::from_secs(3)).await;
    let t4 = tat(&mut c, &key).await.unwrap();
    eprintln!(
        "one campaign at 200/s: local {local:.1}/s, redis scope {shared:.1}/s, local again {back:.1}/s"
    );
    assert_eq!(t3, t4, "back on the default (local): no more leases");
    for (what, rate) in [("local", local), ("redis", shared), ("local again", back)] {
        assert!((194.0..=206.0).contains(&rate), "{what}: {rate:.1}/s");
    }
    worker.shutdown().await.unwrap();
    api.app.stop().await.unwrap();
}

/// Three workers at 2,000/s, settled (the test fails if the group does not settle
/// within [`SETTLE_LIMIT`]): the rate checked over 6 s.
async fn three_workers_at_2000() -> ProcessRun {
    let mut run = start_workers(&[(2000.0, 150_000)], 3, None).await;
    let id = run.campaigns[0].0.clone();
    // The 6 s check, the 30 s watch after the event, and 10 s for the test's own steps.
    let settled = run
        .settle(Duration::from_secs(6) + WATCH + Duration::from_secs(10))
        .await;
    let full = whole_seconds(&run.sink, &id, Duration::from_secs(6)).await;
    let max = full.iter().copied().max().unwrap_or(0);
    let mean = full.iter().sum::<u64>() as f64 / full.len().max(1) as f64;
    eprintln!("3 workers, 2000/s over 6 partitions (group settled after {settled:?}): seconds at the sink {full:?}");
    // ≤ 2,000 × 1.02, +1 for a request whose arrival jitters across a second boundary.
    assert!(max <= 2041, "largest second {max}: {full:?}");
    assert!(mean >= 0.97 * 2000.0, "mean {mean}: {full:?}");
    run
}

/// The issue's goal: after a worker leaves or dies, the rate is back within ±2% within
/// 10 s. Met with cooperative (incremental) rebalancing, the default
/// `kafka.assignment_strategy`: only the moving partitions are revoked. With eager
/// rebalancing tansu could revoke every partition at each heartbeat for 10–20 s after a
/// member left (15.9 s in one whole-suite run; docs/BENCHMARKS.md).
const RECOVERY: f64 = 10.0;
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

/// What [`ProcessRun::recovery`] saw.
#[derive(Debug)]
struct Recovery {
    back: Option<f64>,
    for_good: Option<f64>,
    /// The mean second from `back` to the end of the watch.
    mean_after: f64,
    seconds: Vec<u64>,
}

impl Recovery {
    /// Back within ±2% (three whole seconds in a row) within the issue's 10 s
    /// ([`RECOVERY`]); the group settled before the event (see [`ProcessRun::settle`]).
    /// "For good" is printed only.
    fn check(&self, what: &str) {
        let goal = match self.back {
            Some(b) if b <= RECOVERY => "within",
            _ => "NOT within",
        };
        eprintln!(
            "after {what}: back within ±2% after {:?} s ({goal} the {RECOVERY} s goal; three whole seconds in a row), for good after {:?} s, mean from then {:.1}/s; seconds {:?}",
            self.back, self.for_good, self.mean_after, self.seconds
        );
        assert!(
            self.back.is_some_and(|b| b <= RECOVERY),
            "{what}: rate not back within ±2% within {RECOVERY} s: {self:?}"
        );
    }
}

/// Worker processes, killed if the test fails before stopping them.
struct Children(Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The sink's counts for the whole unix seconds within the next `span`.
async fn whole_seconds(
    sink: &pushpace::tools::sink::SinkHandle,
    campaign: &str,
    span: Duration,
) -> Vec<u64> {
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs()
    };
    let first = unix() + 1;
    tokio::time::sleep(span + Duration::from_millis(1100)).await;
    let last = unix() - 1;
    sink.per_second(campaign)
        .iter()
        .filter(|s| (first..=last).contains(&s.unix_second))
        .map(|s| s.requests)
        .collect()
}

/// `pushpace run` workers in one group, scope redis, on a fresh 6-partition topic whose
/// jobs are spread round-robin, sending to a sink of the test's own.
struct ProcessRun {
    sink: pushpace::tools::sink::SinkHandle,
    campaigns: Vec<(String, f64)>,
    total: u64,
    /// What was produced, for [`ProcessRun::settle`]'s top-ups (each adds to it).
    plan: ProducePlan,
    topic: String,
    workers: Children,
    /// Each worker's log, where it reports the partitions it is assigned and revoked.
    logs: Vec<std::path::PathBuf>,
}

async fn start_workers(
    campaigns: &[(f64, usize)],
    workers: usize,
    redis_url: Option<String>,
) -> ProcessRun {
    let (_pool, db_url) = fresh_database().await;
    let topic = unique_name("jobs");
    pushpace::broker::ensure_topic(&brokers(), &topic, 6)
        .await
        .unwrap();
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let run_id = unique_name("dist").replace('_', "-");
    let plan = ProducePlan::with_rates(&run_id, campaigns, 250, None).unwrap();
    produce_spread(&topic, &plan, 6).await;
    let group = unique_name("g");
    let prefix = unique_name("pp");
    let redis_url = redis_url.unwrap_or_else(|| format!("redis://{REDIS}"));
    let env = [
        ("PUSHPACE__LIMITER__SCOPE", "redis"),
        ("PUSHPACE__LIMITER__WORKERS_ESTIMATE", "3"),
        ("PUSHPACE__REDIS__KEY_PREFIX", prefix.as_str()),
        ("PUSHPACE__REDIS__URL", redis_url.as_str()),
        ("PUSHPACE__REDIS__CONNECT_TIMEOUT_MS", "500"),
        ("PUSHPACE__KAFKA__ISOLATION_LEVEL", "read_uncommitted"),
        ("PUSHPACE__SENDER__MAX_IN_FLIGHT", "64"),
    ];
    let children = (0..workers)
        .map(|i| {
            spawn_logged(
                &topic,
                &group,
                &db_url,
                &sink.url(),
                &env,
                &format!("{prefix}-{i}"),
            )
        })
        .collect();
    ProcessRun {
        campaigns: plan
            .campaigns
            .iter()
            .map(|c| (c.id.clone(), c.send_rate.as_f64()))
            .collect(),
        total: plan.total_devices() as u64,
        plan,
        topic,
        sink,
        workers: Children(children),
        logs: (0..workers)
            .map(|i| worker_log(&format!("{prefix}-{i}")))
            .collect(),
    }
}

/// Whole seconds in a row within ±2% before a run counts as settled. tansu rebalances a
/// few times while members join, a heartbeat or a few apart; three seconds could fall
/// between two rebalances, and then the next measurement saw one (a whole-suite run read
/// 1,627–2,001 in its 6 s check). Six outlast that rhythm.
const SETTLED_SECONDS: u64 = 6;

/// How long each step of [`ProcessRun::settle`] may take: sending to start and the
/// partitions to stop moving (together), then the rate to hold within ±2%. A run whose
/// rate does not settle within this fails: its rates would measure the broker's
/// rebalancing, not pushpace.
const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Devices each campaign keeps unsent while the group settles (topped up to twice this
/// when fewer are left, so top-ups are few), so that a long settling never ends a
/// campaign: a top-up of 40 s at 2,000/s is 320 jobs, produced and read within seconds.
const SETTLING_AHEAD: Duration = Duration::from_secs(20);

impl ProcessRun {
    /// Waits for sending to start and the group to settle (tansu may rebalance a few
    /// times while members join); returns how long that took. Fails the test when the
    /// group does not settle within [`SETTLE_LIMIT`] per step.
    async fn settle(&mut self, ahead: Duration) -> Duration {
        let t = Instant::now();
        let end = t + SETTLE_LIMIT;
        while self.sink.summary().delivered < 1000 {
            assert!(
                Instant::now() < end,
                "the workers sent {} devices within {SETTLE_LIMIT:?}, not 1000; logs {:?}",
                self.sink.summary().delivered,
                self.logs
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The group settles in steps (a member joining late, tansu rebalancing again):
        // wait until every worker owns partitions, all six are owned, and nothing has
        // moved for 6 s (six heartbeats, two of tansu's 3 s join pauses). Partitions may still move at
        // the limit (cooperative moves need not disturb the rate): the rate check decides.
        let mut last = Vec::new();
        let mut unchanged_since = Instant::now();
        while Instant::now() < end {
            let owned = owned_partitions(&self.logs);
            if owned != last {
                last = owned;
                unchanged_since = Instant::now();
            }
            self.top_up(SETTLING_AHEAD, 2 * SETTLING_AHEAD).await;
            let all: usize = last.iter().map(|o| o.len()).sum();
            let union: std::collections::BTreeSet<i32> = last.iter().flatten().copied().collect();
            if last.iter().all(|o| !o.is_empty())
                && all == 6
                && union.len() == 6
                && unchanged_since.elapsed() >= Duration::from_secs(6)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(
            self.stable_within(SETTLE_LIMIT).await.is_some(),
            "the consumer group did not settle: no {SETTLED_SECONDS} whole seconds in a row \
             within ±2% of every campaign's rate within {SETTLE_LIMIT:?} (partitions owned: \
             {:?}; logs {:?}; the last seconds at the sink:\n{})",
            owned_partitions(&self.logs),
            self.logs,
            self.last_seconds(12)
        );
        let took = t.elapsed();
        self.top_up(ahead, ahead).await;
        took
    }

    /// Produces more devices (for `up_to` seconds) for each campaign that has fewer than
    /// `ahead` of its seconds left unsent, so that what the test watches after settling is never the
    /// end of its devices: settling has taken from 10 s to over 90 s (a whole-suite
    /// run: 95 s, after which a 100 s campaign ran dry in the watch). New devices join
    /// the end of the partitions; the campaigns still hold devices while they arrive.
    async fn top_up(&mut self, ahead: Duration, up_to: Duration) {
        let sink = &self.sink;
        let sent = |id: &str| sink.campaign(id).map_or(0, |c| c.distinct_delivered);
        let plan = &mut self.plan;
        let Some(more) = crate::helpers::top_up_plan(plan, (ahead, up_to), sent) else {
            return;
        };
        eprintln!(
            "topped up for {ahead:?} ahead: {:?}",
            more.campaigns.iter().map(|c| c.devices).collect::<Vec<_>>()
        );
        produce_spread(&self.topic, &more, 6).await;
        self.total += more.total_devices() as u64;
    }

    /// Each campaign's rate and its last `n` whole seconds at the sink, oldest first.
    fn last_seconds(&self, n: u64) -> String {
        let now = unix_now();
        let mut out = String::new();
        for (id, rate) in &self.campaigns {
            let mut secs = vec![0u64; n as usize];
            for s in self.sink.per_second(id) {
                if s.unix_second + n >= now && s.unix_second < now {
                    secs[(s.unix_second + n - now) as usize] += s.requests;
                }
            }
            out.push_str(&format!("{rate}/s: {secs:?}\n"));
        }
        out
    }

    /// Waits until [`SETTLED_SECONDS`] whole seconds in a row carry the summed rate, and
    /// each campaign's own, within ±2% (+1 for arrival jitter); returns how long that
    /// took, or `None` after `limit`.
    async fn stable_within(&mut self, limit: Duration) -> Option<Duration> {
        const N: usize = SETTLED_SECONDS as usize;
        let t = Instant::now();
        let since = unix_now();
        let target: f64 = self.campaigns.iter().map(|(_, r)| r).sum();
        while t.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(250)).await;
            self.top_up(SETTLING_AHEAD, 2 * SETTLING_AHEAD).await;
            let now = unix_now();
            if now < since + SETTLED_SECONDS + 1 {
                continue; // whole seconds after the call
            }
            let in_band =
                |n: u64, rate: f64| (0.98 * rate - 1.0..=1.02 * rate + 1.0).contains(&(n as f64));
            let mut sums = [0u64; N];
            let mut each_in_band = true;
            for (id, rate) in &self.campaigns {
                let mut own = [0u64; N];
                for s in self.sink.per_second(id) {
                    if s.unix_second + SETTLED_SECONDS + 1 > now && s.unix_second < now {
                        own[(now - 1 - s.unix_second) as usize] += s.requests;
                    }
                }
                each_in_band &= own.iter().all(|&n| in_band(n, *rate));
                for (sum, n) in sums.iter_mut().zip(own) {
                    *sum += n;
                }
            }
            if each_in_band
                && sums
                    .iter()
                    .all(|&n| (0.98 * target..=1.02 * target + 1.0).contains(&(n as f64)))
            {
                return Some(t.elapsed());
            }
        }
        None
    }

    /// The whole seconds of the `watch` after `event` (unix seconds), summed over the
    /// campaigns, and when the rate was back: the start of the first three seconds in a
    /// row within ±2% of the target, and the start of the last run of in-band seconds
    /// that lasts to the end of the watch ("for good"), both in seconds after `event`.
    async fn recovery(&self, event: f64, watch: Duration) -> Recovery {
        let first = event.floor() as u64 + 1;
        let last = first + watch.as_secs() - 1;
        while unix_now() <= last + 1 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let target: f64 = self.campaigns.iter().map(|(_, r)| r).sum();
        let mut seconds = vec![0u64; (last - first + 1) as usize];
        for (id, _) in &self.campaigns {
            for s in self.sink.per_second(id) {
                if (first..=last).contains(&s.unix_second) {
                    seconds[(s.unix_second - first) as usize] += s.requests;
                }
            }
        }
        let in_band = |n: u64| (0.98 * target..=1.02 * target + 1.0).contains(&(n as f64));
        let at = |i: usize| (first + i as u64) as f64 - event;
        let back_at = seconds
            .windows(3)
            .position(|w| w.iter().all(|&n| in_band(n)));
        let back = back_at.map(at);
        let for_good = match seconds.iter().rposition(|&n| !in_band(n)) {
            None => Some(at(0)),
            Some(i) if i + 1 < seconds.len() => Some(at(i + 1)),
            Some(_) => None,
        };
        // From the return to the end of the watch.
        let after = &seconds[back_at.unwrap_or(seconds.len())..];
        let mean_after = after.iter().sum::<u64>() as f64 / after.len().max(1) as f64;
        Recovery {
            back,
            for_good,
            mean_after,
            seconds,
        }
    }

    /// [`Self::finish`], and the sink's seconds within bounds over the watch, once the
    /// group has settled (unix seconds `from`..`to`). The start-up, while tansu still
    /// moves partitions, and the wind-down are left out: runs saw 2,053–2,063 there while
    /// no watched second passed 2,007.
    ///
    /// The sink counts by arrival, and the workers, the sink, tansu and PostgreSQL share
    /// two cores: a stall of any of them near a second's boundary moves sends into the
    /// next second (one run: 1,954 then 2,045, 3,999 in the two). A shift leaves the sum
    /// of two adjacent seconds alone, an excess does not; so each pair is held to the ±2%
    /// band (≤ 4,082), and a single second to the band plus a 20 ms shift (≤ 2,081).
    async fn finish_checked(self, from: f64, to: f64) {
        let id = self.campaigns[0].0.clone();
        let seconds = self.sink.per_second(&id);
        let watched: Vec<&pushpace::tools::sink::SecondCount> = seconds
            .iter()
            .filter(|s| {
                (s.unix_second as f64) >= from.ceil() && (s.unix_second as f64) < to.floor()
            })
            .collect();
        let max_watched = watched.iter().map(|s| s.requests).max().unwrap_or(0);
        let max_pair = watched
            .windows(2)
            .filter(|w| w[1].unix_second == w[0].unix_second + 1)
            .map(|w| w[0].requests + w[1].requests)
            .max()
            .unwrap_or(0);
        let max_all = seconds.iter().map(|s| s.requests).max().unwrap_or(0);
        let duplicates = self.finish().await;
        eprintln!(
            "largest second: {max_watched} from the settled group to the end of the watch \
             (largest two in a row {max_pair}), {max_all} in the whole run; duplicates {duplicates}"
        );
        // The ±2% band at 2,000/s, and 20 ms of it shifted into the next second.
        const BAND: u64 = 2_041;
        const SHIFT: u64 = 40;
        assert!(max_pair <= 2 * BAND, "largest two seconds {max_pair}");
        assert!(max_watched <= BAND + SHIFT, "largest second {max_watched}");
    }

    /// Waits until every device arrived (or 120 s), stops the workers, checks nothing
    /// was lost, and returns the duplicates.
    async fn finish(mut self) -> u64 {
        let end = Instant::now() + Duration::from_secs(120);
        while self.sink.summary().distinct_delivered < self.total && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for c in &mut self.workers.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let status = crate::helpers::sigterm_and_wait(c);
                assert!(status.success(), "{status}");
            }
        }
        let s = self.sink.summary();
        assert_eq!(s.distinct_delivered, self.total, "no device lost");
        s.duplicates
    }
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
    let first = unix_now() + 1;
    tokio::time::sleep(Duration::from_secs(7)).await;
    let last = unix_now() - 1;
    for (id, rate) in &run.campaigns {
        let secs: Vec<u64> = run
            .sink
            .per_second(id)
            .iter()
            .filter(|s| (first..=last).contains(&s.unix_second))
            .map(|s| s.requests)
            .collect();
        let max = secs.iter().copied().max().unwrap_or(0);
        let mean = secs.iter().sum::<u64>() as f64 / secs.len().max(1) as f64;
        eprintln!("{rate}/s: seconds at the sink {secs:?}");
        // ≤ rate × 1.02, +1 for a request whose arrival jitters across a second boundary.
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
    eprintln!("redis cut for 20 s, 3 workers at 2000/s: seconds at the sink {during:?} (largest {max}, mean {mean:.1})");
    // The fallback: 2000 / 3 per worker (the group's members, or the estimate of 3), so
    // never above the rate. Below it while a worker holds no partitions (a rebalance):
    // its third is not lent to the others without Redis. Sending never stops.
    assert!(max <= 2041, "largest second {max}: {during:?}");
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
    eprintln!("after redis returns: {back:?}");
    assert!(back.iter().all(|&n| n <= 2041), "{back:?}");
    let duplicates = run.finish().await;
    eprintln!("redis outage: duplicates {duplicates}");
}

fn unix_now_f64() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
