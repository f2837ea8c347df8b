//! A worker in this process whose campaigns use Redis scope: set through the API, an
//! outage and its fallback, a move to Redis scope and back.

use super::leases::{drive, windows, Log};
use super::*;
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
    let f = gcra_factory(
        format!("redis://127.0.0.1:{}", proxy.port),
        2,
        clock.clone(),
    )
    .await;
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
