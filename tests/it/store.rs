//! Storage and stats flusher tests against the real PostgreSQL, each in a fresh database.

use crate::helpers::{fresh_database, unique_name};
use pushpace::limiter::{Algorithm, Rate};
use pushpace::stats::{Flusher, FlusherConfig, JobKey, Outcome, StatsRecorder};
use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch, CampaignStatus};
use pushpace::store::dead_letters::{self, DeadLetter, MAX_RAW_BYTES};
use pushpace::store::{self, progress, CampaignWatcher, DeadLetterKind, StoreError, WatcherConfig};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// An arbitrary second (2027) to record at, so tests do not depend on the wall clock.
const BASE: u64 = 1_800_000_000;

fn at(second: u64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(second as i64, 0).unwrap()
}

/// Polls `check` until it holds or `limit` passes; returns whether it held.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// (sent, failed, retried) per second of a campaign, as stored.
async fn stored_seconds(pool: &PgPool, campaign: &str) -> BTreeMap<u64, [i64; 3]> {
    let rows: Vec<(chrono::DateTime<chrono::Utc>, i64, i64, i64)> = sqlx::query_as(
        "SELECT second, sent, failed, retried FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(campaign)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(s, a, b, c)| (s.timestamp() as u64, [a, b, c]))
        .collect()
}

fn fast_config() -> FlusherConfig {
    FlusherConfig {
        interval: Duration::from_millis(20),
        max_pending_rows: 10_000,
        retry_min: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        final_flush_timeout: Duration::from_secs(10),
    }
}

fn rate(r: f64) -> Rate {
    Rate::per_second(r).unwrap()
}

#[tokio::test]
async fn invalid_campaign_values_are_refused_naming_the_field() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    for bad in [0.0, -1.0, 1e12, f64::NAN] {
        let patch = CampaignPatch {
            send_rate: Some(bad),
            ..Default::default()
        };
        let err = campaigns::put(&pool, "c", &patch, &defaults)
            .await
            .unwrap_err();
        assert_eq!(err.field(), Some("send_rate"), "{bad}: {err}");
        assert!(err.to_string().contains("send_rate"), "{err}");
    }
    let long = "x".repeat(200);
    let err = campaigns::put(&pool, &long, &CampaignPatch::default(), &defaults)
        .await
        .unwrap_err();
    assert_eq!(err.field(), Some("id"), "{err}");
    let patch = CampaignPatch {
        burst: Some(-1),
        ..Default::default()
    };
    let err = campaigns::put(&pool, "c", &patch, &defaults)
        .await
        .unwrap_err();
    assert_eq!(err.field(), Some("burst"), "{err}");

    // The schema refuses the same values written with plain SQL, and the error is
    // mapped to the field by the constraint's name.
    let cases: [(&str, f64, i32, &str); 5] = [
        ("raw", 0.0, 0, "send_rate"),
        ("raw", -1.0, 0, "send_rate"),
        ("raw", 1e12, 0, "send_rate"),
        ("raw", f64::NAN, 0, "send_rate"),
        ("raw", 10.0, -1, "burst"),
    ];
    for (id, send_rate, burst, field) in cases {
        let err: StoreError = sqlx::query(
            "INSERT INTO campaigns (id, send_rate, algorithm, burst) VALUES ($1, $2, 'gcra', $3)",
        )
        .bind(id)
        .bind(send_rate)
        .bind(burst)
        .execute(&pool)
        .await
        .unwrap_err()
        .into();
        assert_eq!(err.field(), Some(field), "{send_rate}/{burst}: {err}");
    }
    let err: StoreError = sqlx::query(
        "INSERT INTO campaigns (id, send_rate, algorithm) VALUES (repeat('x', 200), 10, 'gcra')",
    )
    .execute(&pool)
    .await
    .unwrap_err()
    .into();
    assert_eq!(err.field(), Some("id"), "{err}");
    let err: StoreError =
        sqlx::query("INSERT INTO campaigns (id, send_rate, algorithm) VALUES ('a', 10, 'magic')")
            .execute(&pool)
            .await
            .unwrap_err()
            .into();
    assert_eq!(err.field(), Some("algorithm"), "{err}");
    assert!(campaigns::all(&pool).await.unwrap().is_empty());
}

#[tokio::test]
async fn a_job_creates_its_campaign_and_stored_values_win_afterwards() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults {
        send_rate: rate(42.0),
        algorithm: Algorithm::TokenBucket,
        burst: 3,
    };
    let first = campaigns::upsert_from_job(
        &pool,
        "spring",
        Some(rate(500.0)),
        Some(Algorithm::Gcra),
        &defaults,
    )
    .await
    .unwrap();
    assert_eq!(
        (first.send_rate, first.algorithm, first.burst, first.status),
        (500.0, Algorithm::Gcra, 3, CampaignStatus::Active)
    );
    // A later job saying otherwise changes nothing.
    let again = campaigns::upsert_from_job(
        &pool,
        "spring",
        Some(rate(1.0)),
        Some(Algorithm::SlidingLog),
        &defaults,
    )
    .await
    .unwrap();
    assert_eq!(again, first);
    // A job without values gets the defaults.
    let plain = campaigns::upsert_from_job(&pool, "plain", None, None, &defaults)
        .await
        .unwrap();
    assert_eq!(
        (plain.send_rate, plain.algorithm, plain.burst),
        (42.0, Algorithm::TokenBucket, 3)
    );
    // The API changes one field and keeps the others; jobs then see the API's value.
    let patch = CampaignPatch {
        send_rate: Some(250.0),
        ..Default::default()
    };
    let put = campaigns::put(&pool, "spring", &patch, &defaults)
        .await
        .unwrap();
    assert_eq!((put.send_rate, put.algorithm), (250.0, Algorithm::Gcra));
    assert!(put.updated_at >= first.updated_at);
    let seen = campaigns::upsert_from_job(&pool, "spring", Some(rate(9.0)), None, &defaults)
        .await
        .unwrap();
    assert_eq!(seen.send_rate, 250.0);
    // The API creates a campaign too.
    let created = campaigns::put(
        &pool,
        "api",
        &CampaignPatch {
            send_rate: Some(7.5),
            algorithm: Some(Algorithm::LeakyBucket),
            burst: Some(10),
            limiter_scope: None,
            weight: None,
            start_at: None,
            expires_at: None,
        },
        &defaults,
    )
    .await
    .unwrap();
    assert_eq!(
        (created.send_rate, created.algorithm, created.burst),
        (7.5, Algorithm::LeakyBucket, 10)
    );
    let paused = campaigns::set_status(&pool, "api", CampaignStatus::Paused)
        .await
        .unwrap();
    assert_eq!(paused.status, CampaignStatus::Paused);
    assert!(matches!(
        campaigns::set_status(&pool, "nope", CampaignStatus::Done).await,
        Err(StoreError::CampaignNotFound(_))
    ));
    assert_eq!(
        campaigns::get(&pool, "api").await.unwrap().unwrap().status,
        CampaignStatus::Paused
    );
    assert_eq!(campaigns::get(&pool, "nope").await.unwrap(), None);
}

#[tokio::test]
async fn concurrent_first_jobs_create_one_campaign() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    let tasks: Vec<_> = (0..8)
        .map(|i| {
            let pool = pool.clone();
            tokio::spawn(async move {
                campaigns::upsert_from_job(
                    &pool,
                    "race",
                    Some(rate(10.0 + f64::from(i))),
                    None,
                    &defaults,
                )
                .await
                .unwrap()
            })
        })
        .collect();
    let mut rates = Vec::new();
    for t in tasks {
        rates.push(t.await.unwrap().send_rate);
    }
    rates.dedup();
    assert_eq!(
        rates.len(),
        1,
        "every job sees the one stored row: {rates:?}"
    );
}

/// How long the writers below write at least, and at most while waiting for their
/// flusher's batches (a whole-suite run with 3 test threads once committed 10 or fewer
/// batches in a fixed 800 ms).
const MIN_WRITES: Duration = Duration::from_millis(800);
const MAX_WRITES: Duration = Duration::from_secs(15);

/// Each of two workers (own recorder, own flusher, own pool) adds into the same
/// campaign-seconds while the other does; the sums must be exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_flushers_adding_into_the_same_seconds_give_exact_sums() {
    let (pool, url) = fresh_database().await;
    let stop = CancellationToken::new();
    let mut flushers = Vec::new();
    let mut writers = Vec::new();
    for _ in 0..2 {
        let recorder = StatsRecorder::new();
        let worker_pool = store::connect(&url, 4, Duration::from_secs(10))
            .await
            .unwrap();
        let flusher = Flusher::new(
            recorder.clone(),
            worker_pool,
            FlusherConfig {
                interval: Duration::from_millis(5),
                ..fast_config()
            },
        );
        flushers.push((flusher.clone(), flusher.spawn(stop.clone())));
        for w in 0..2u64 {
            let counter = recorder.campaign("shared");
            let own = flusher.clone();
            writers.push(std::thread::spawn(move || {
                let mut expected = [[0i64; 3]; 20];
                let start = Instant::now();
                let mut i = w;
                // Writes go on until their flusher has committed several batches under
                // them, not for a fixed time: on a loaded machine a batch takes longer.
                while start.elapsed() < MIN_WRITES
                    || (own.batches_committed() <= 10 && start.elapsed() < MAX_WRITES)
                {
                    for _ in 0..100 {
                        let s = (i % 20) as usize;
                        let outcome = match i % 7 {
                            0 => Outcome::Failed,
                            1 => Outcome::Retried,
                            _ => Outcome::Sent,
                        };
                        let n = (i % 3 + 1) as u32;
                        counter.record(BASE + s as u64, outcome, n);
                        expected[s][outcome as usize] += i64::from(n);
                        i += 1;
                    }
                    std::thread::yield_now();
                }
                expected
            }));
        }
    }
    let mut expected = [[0i64; 3]; 20];
    for w in writers {
        let got = tokio::task::spawn_blocking(move || w.join().unwrap())
            .await
            .unwrap();
        for s in 0..20 {
            for k in 0..3 {
                expected[s][k] += got[s][k];
            }
        }
    }
    stop.cancel();
    let mut statements = 0;
    for (flusher, task) in flushers {
        task.await.unwrap().unwrap();
        assert!(
            flusher.batches_committed() > 10,
            "flushes ran during the writes"
        );
        statements += flusher.statements();
    }
    let stored = stored_seconds(&pool, "shared").await;
    assert_eq!(stored.len(), 20);
    for (s, counts) in expected.iter().enumerate() {
        assert_eq!(stored[&(BASE + s as u64)], *counts, "second {s}");
    }
    assert!(statements > 0);
}

#[tokio::test]
async fn after_a_crash_progress_resumes_from_the_last_flush() {
    let (pool, _) = fresh_database().await;
    let key = JobKey {
        job_id: "job-1".into(),
        campaign_id: "crash".into(),
        partition: 3,
        offset: 42,
        devices_total: 100,
    };
    {
        let recorder = StatsRecorder::new();
        let flusher = Flusher::new(recorder.clone(), pool.clone(), fast_config());
        let counter = recorder.campaign("crash");
        let job = recorder.track_job(key.clone());
        counter.record(BASE, Outcome::Sent, 38);
        counter.record(BASE, Outcome::Failed, 2);
        job.set_done(40);
        let report = flusher.flush_now().await.unwrap();
        assert_eq!((report.seconds_rows, report.progress_rows), (1, 1));
        assert_eq!(
            report.statements, 1,
            "one statement for counts and progress together"
        );
        assert_eq!(job.durable_done(), Some(40));
        // More work, then the process dies before the next flush.
        counter.record(BASE + 1, Outcome::Sent, 30);
        job.set_done(70);
        assert_eq!(job.durable_done(), Some(40));
    }
    let stored = progress::lookup(&pool, "crash", "job-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (
            stored.campaign_id.as_str(),
            stored.partition,
            stored.kafka_offset,
            stored.devices_total,
            stored.devices_done
        ),
        ("crash", 3, 42, 100, 40)
    );
    assert!(!stored.is_complete() && stored.completed_at.is_none());
    let totals = store::totals(&pool, "crash").await.unwrap();
    assert_eq!(
        (totals.sent, totals.failed),
        (38, 2),
        "exactly what was flushed"
    );

    // The restarted worker re-consumes the job and starts at device 40.
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), fast_config());
    let counter = recorder.campaign("crash");
    let job = recorder.track_job(key);
    job.set_done(stored.devices_done);
    counter.record(BASE + 2, Outcome::Sent, 60);
    job.set_done(100);
    flusher.flush_now().await.unwrap();
    assert!(job.is_durably_complete());
    assert_eq!(
        recorder.jobs_tracked(),
        0,
        "a job is forgotten once its completion is durable"
    );
    let done = progress::lookup(&pool, "crash", "job-1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(done.devices_done, 100);
    assert!(done.completed_at.is_some());
    assert_eq!(store::totals(&pool, "crash").await.unwrap().sent, 98);
    // Progress never goes backwards, even if an old value is written late.
    let stale = recorder.track_job(JobKey {
        job_id: "job-1".into(),
        campaign_id: "crash".into(),
        partition: 3,
        offset: 42,
        devices_total: 100,
    });
    stale.set_done(10);
    flusher.flush_now().await.unwrap();
    assert_eq!(
        progress::lookup(&pool, "crash", "job-1")
            .await
            .unwrap()
            .unwrap()
            .devices_done,
        100
    );
    drop(stale);
    flusher.flush_now().await.unwrap();
    assert_eq!(recorder.jobs_tracked(), 0, "a dropped handle is forgotten");
    assert_eq!(
        progress::lookup(&pool, "crash", "unknown").await.unwrap(),
        None
    );
}

use crate::helpers::Proxy;

fn with_port(url: &str, port: u16) -> String {
    let name = url.rsplit('/').next().unwrap();
    format!("postgres://postgres@127.0.0.1:{port}/{name}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_database_loses_no_counts_and_raises_backpressure() {
    let (direct, url) = fresh_database().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let proxied = store::connect(&with_port(&url, proxy.port), 2, Duration::from_millis(300))
        .await
        .unwrap();
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(
        recorder.clone(),
        proxied,
        FlusherConfig {
            max_pending_rows: 50,
            ..fast_config()
        },
    );
    let stop = CancellationToken::new();
    let task = flusher.spawn(stop.clone());
    let counter = recorder.campaign("outage");
    let job = recorder.track_job(JobKey {
        job_id: "job-outage".into(),
        campaign_id: "outage".into(),
        partition: 0,
        offset: 7,
        devices_total: 1000,
    });
    for s in 0..10 {
        counter.record(BASE + s, Outcome::Sent, 10);
    }
    job.set_done(100);
    assert!(
        eventually(Duration::from_secs(5), || async {
            store::totals(&direct, "outage").await.unwrap().sent == 100
        })
        .await
    );

    proxy.set_up(false);
    let failures_before = flusher.failed_writes();
    for s in 10..110 {
        counter.record(BASE + s, Outcome::Sent, 1);
        counter.record(BASE + s, Outcome::Failed, 2);
        tokio::task::yield_now().await;
    }
    job.set_done(900);
    assert!(
        eventually(Duration::from_secs(5), || async { recorder.backpressure() }).await,
        "100 pending seconds exceed the bound of 50"
    );
    // Let it fail a few times: nothing reaches the table, nothing is dropped.
    assert!(
        eventually(Duration::from_secs(5), || async {
            flusher.failed_writes() >= failures_before + 3
        })
        .await
    );
    assert_eq!(store::totals(&direct, "outage").await.unwrap().sent, 100);
    assert!(flusher.pending_rows() > 50);

    proxy.set_up(true);
    assert!(
        eventually(Duration::from_secs(10), || async {
            flusher.pending_rows() == 0 && !recorder.backpressure()
        })
        .await,
        "the backlog is written after recovery"
    );
    let stored = stored_seconds(&direct, "outage").await;
    assert_eq!(stored.len(), 110);
    for s in 0..10 {
        assert_eq!(stored[&(BASE + s)], [10, 0, 0]);
    }
    for s in 10..110 {
        assert_eq!(stored[&(BASE + s)], [1, 2, 0], "second {s}");
    }
    let progress = progress::lookup(&direct, "outage", "job-outage")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(progress.devices_done, 900);
    stop.cancel();
    task.await.unwrap().unwrap();
}

/// Connections are killed with pg_terminate_backend again and again while counts flow,
/// including (by chance) during COMMIT: the batch markers keep the totals exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_connections_lose_and_double_no_counts() {
    /// Batches that must commit while connections are being killed, for the test to
    /// have exercised recovery at all.
    const MIN_BATCHES_UNDER_KILLS: u64 = 6;
    /// The kill phase goes on at most this long waiting for them.
    const KILL_PHASE_LIMIT: Duration = Duration::from_secs(15);
    let (direct, url) = fresh_database().await;
    let app = unique_name("flusher");
    let options = store::connect_options(&url).unwrap().application_name(&app);
    let pool = sqlx::postgres::PgPoolOptions::new()
        .max_connections(2)
        .acquire_timeout(Duration::from_millis(500))
        .connect_with(options)
        .await
        .unwrap();
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(
        recorder.clone(),
        pool,
        FlusherConfig {
            interval: Duration::from_millis(2),
            retry_min: Duration::from_millis(2),
            retry_max: Duration::from_millis(20),
            ..fast_config()
        },
    );
    let stop = CancellationToken::new();
    let task = flusher.spawn(stop.clone());
    let stop_killing = Arc::new(AtomicBool::new(false));
    let killer = {
        let direct = direct.clone();
        let app = app.clone();
        let stop = stop_killing.clone();
        let flusher = flusher.clone();
        tokio::spawn(async move {
            let mut killed = 0i64;
            let mut seen = flusher.batches_committed();
            while !stop.load(Ordering::Relaxed) {
                // Kill again only once a batch has committed since the last kill: on a
                // busy machine a new connection's set-up alone can outlast 7 ms, and
                // killing it every time would test starvation, not recovery.
                let now_committed = flusher.batches_committed();
                if now_committed == seen {
                    tokio::time::sleep(Duration::from_millis(1)).await;
                    continue;
                }
                seen = now_committed;
                let n: i64 = sqlx::query_scalar(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                     WHERE application_name = $1",
                )
                .bind(&app)
                .fetch_one(&direct)
                .await
                .unwrap();
                killed += n;
                tokio::time::sleep(Duration::from_millis(7)).await;
            }
            killed
        })
    };
    let counter = recorder.campaign("killed");
    let mut expected = BTreeMap::<u64, i64>::new();
    // Until enough batches committed between kills, not for a fixed time: a new
    // connection's first flush also starts plpgsql for the campaign_totals triggers
    // (about 1.5 ms), so on a busy machine few batches fit between kills 7 ms apart.
    let started = Instant::now();
    let mut i = 0u64;
    while started.elapsed() < Duration::from_millis(1500)
        || (flusher.batches_committed() < MIN_BATCHES_UNDER_KILLS
            && started.elapsed() < KILL_PHASE_LIMIT)
    {
        let s = BASE + (i / 50) % 300;
        counter.record(s, Outcome::Sent, 1);
        *expected.entry(s).or_default() += 1;
        i += 1;
        if i % 50 == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    stop_killing.store(true, Ordering::Relaxed);
    let killed = killer.await.unwrap();
    assert!(killed > 5, "connections were terminated ({killed})");
    let committed_under_kills = flusher.batches_committed();
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(
        committed_under_kills >= MIN_BATCHES_UNDER_KILLS,
        "only {committed_under_kills} batches committed while connections were killed"
    );
    let stored = stored_seconds(&direct, "killed").await;
    let stored: BTreeMap<u64, i64> = stored.into_iter().map(|(s, c)| (s, c[0])).collect();
    assert_eq!(stored, expected);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_rate_changed_with_sql_reaches_the_watcher_within_a_second() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    let patch = CampaignPatch {
        send_rate: Some(100.0),
        ..Default::default()
    };
    campaigns::put(&pool, "watched", &patch, &defaults)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    // A long refresh period: only NOTIFY (or a reconnection's re-read) can be this fast.
    let config = WatcherConfig {
        refresh_interval: Duration::from_secs(600),
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(200),
    };
    let watcher = CampaignWatcher::start(pool.clone(), config, stop.clone())
        .await
        .unwrap();
    assert_eq!(watcher.get("watched").unwrap().send_rate, 100.0);
    let listening = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n == 1
    };
    assert!(eventually(Duration::from_secs(5), listening).await);

    let mut snapshots = watcher.subscribe();
    let mut changes = watcher.changes();
    let started = Instant::now();
    sqlx::query("UPDATE campaigns SET send_rate = 250 WHERE id = 'watched'")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(1),
        snapshots.wait_for(|s| s.get("watched").map(|c| c.send_rate) == Some(250.0)),
    )
    .await
    .expect("the change arrived within 1 s")
    .unwrap();
    let latency = started.elapsed();
    let changed = changes.recv().await.unwrap();
    assert_eq!((changed.id.as_str(), changed.send_rate), ("watched", 250.0));
    assert!(latency < Duration::from_secs(1), "{latency:?}");

    // A campaign created with SQL appears too.
    sqlx::query("INSERT INTO campaigns (id, send_rate, algorithm) VALUES ('new', 5, 'governor')")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(1),
        snapshots.wait_for(|s| s.get("new").map(|c| c.algorithm) == Some(Algorithm::Governor)),
    )
    .await
    .expect("the new campaign arrived within 1 s")
    .unwrap();

    // The listening connection is killed: the watcher reconnects and catches up.
    sqlx::query(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("UPDATE campaigns SET send_rate = 75, burst = 4 WHERE id = 'watched'")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(5),
        snapshots.wait_for(|s| s.get("watched").map(|c| (c.send_rate, c.burst)) == Some((75.0, 4))),
    )
    .await
    .expect("the watcher survived losing its connection")
    .unwrap();
    assert!(eventually(Duration::from_secs(5), listening).await);
    sqlx::query("UPDATE campaigns SET send_rate = 80 WHERE id = 'watched'")
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::timeout(
        Duration::from_secs(1),
        snapshots.wait_for(|s| s.get("watched").map(|c| c.send_rate) == Some(80.0)),
    )
    .await
    .expect("notifications flow again after the reconnection")
    .unwrap();
    stop.cancel();
}

#[tokio::test]
async fn series_fill_gaps_with_zeros_and_refuse_long_ranges() {
    let (pool, _) = fresh_database().await;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), fast_config());
    let counter = recorder.campaign("graph");
    counter.record(BASE, Outcome::Sent, 5);
    counter.record(BASE + 2, Outcome::Sent, 7);
    counter.record(BASE + 2, Outcome::Failed, 1);
    counter.record(BASE + 5, Outcome::Retried, 3);
    recorder
        .campaign("other")
        .record(BASE + 1, Outcome::Sent, 100);
    flusher.flush_now().await.unwrap();

    let points = store::series(&pool, "graph", at(BASE), at(BASE + 6))
        .await
        .unwrap();
    let got: Vec<(u64, i64, i64, i64)> = points
        .iter()
        .map(|p| (p.t.timestamp() as u64 - BASE, p.sent, p.failed, p.retried))
        .collect();
    assert_eq!(
        got,
        vec![
            (0, 5, 0, 0),
            (1, 0, 0, 0),
            (2, 7, 1, 0),
            (3, 0, 0, 0),
            (4, 0, 0, 0),
            (5, 0, 0, 3)
        ]
    );
    // Sub-second bounds are truncated to their second.
    let shifted = store::series(
        &pool,
        "graph",
        at(BASE) + chrono::Duration::milliseconds(300),
        at(BASE + 1) + chrono::Duration::milliseconds(999),
    )
    .await
    .unwrap();
    assert_eq!(shifted.len(), 1);
    assert_eq!(shifted[0].sent, 5);
    let full_day = store::series(&pool, "graph", at(BASE), at(BASE + 86_400))
        .await
        .unwrap();
    assert_eq!(full_day.len(), 86_400);
    assert_eq!(full_day.iter().map(|p| p.sent).sum::<i64>(), 12);
    let err = store::series(&pool, "graph", at(BASE), at(BASE + 86_401))
        .await
        .unwrap_err();
    assert_eq!(err.field(), Some("to"));
    assert!(err.to_string().contains("24 h"), "{err}");
    let err = store::series(&pool, "graph", at(BASE + 5), at(BASE))
        .await
        .unwrap_err();
    assert_eq!(err.field(), Some("to"));
    assert!(store::series(&pool, "graph", at(BASE), at(BASE))
        .await
        .unwrap()
        .is_empty());

    let totals = store::totals(&pool, "graph").await.unwrap();
    assert_eq!((totals.sent, totals.failed, totals.retried), (12, 1, 3));
    assert_eq!(store::totals(&pool, "nothing").await.unwrap().sent, 0);
}

#[tokio::test]
async fn the_campaign_list_carries_totals_and_the_last_ten_seconds_rate() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    for id in ["a", "b"] {
        campaigns::put(&pool, id, &CampaignPatch::default(), &defaults)
            .await
            .unwrap();
    }
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), fast_config());
    let a = recorder.campaign("a");
    let now = BASE + 1000;
    for s in 1..=10 {
        a.record(now - s, Outcome::Sent, 5);
    }
    a.record(now - 30, Outcome::Sent, 1000); // outside the 10 s window
    a.record(now, Outcome::Sent, 1000); // the current, partial second
    a.record(now - 3, Outcome::Failed, 4);
    flusher.flush_now().await.unwrap();
    let list = campaigns::list(&pool, at(now) + chrono::Duration::milliseconds(500))
        .await
        .unwrap();
    assert_eq!(list.len(), 2);
    assert_eq!(list[0].campaign.id, "a");
    assert_eq!((list[0].sent, list[0].failed), (2050, 4));
    assert_eq!(list[0].rate_10s, 5.0);
    assert_eq!((list[1].campaign.id.as_str(), list[1].sent), ("b", 0));
    assert_eq!(list[1].rate_10s, 0.0);
}

#[tokio::test]
async fn dead_letters_are_paged_newest_first() {
    let (pool, _) = fresh_database().await;
    let raw = b"{\"job_id\": 1}".to_vec();
    let mut ids = Vec::new();
    for i in 0..25 {
        let token = format!("tok-{i}");
        let letter = DeadLetter {
            kind: DeadLetterKind::Undeliverable,
            topic: "pushpace.jobs",
            partition: 2,
            kafka_offset: 100 + i,
            campaign_id: Some("dl"),
            job_id: Some("job-dl"),
            device_token: Some(&token),
            reason: "410 Gone: the token is no longer registered",
            raw: &raw,
            key: None,
            device: None,
        };
        ids.push(dead_letters::insert(&pool, &letter).await.unwrap().unwrap());
    }
    let huge = vec![b'x'; MAX_RAW_BYTES + 10];
    for i in 0..5 {
        let letter = DeadLetter {
            kind: DeadLetterKind::MalformedJob,
            topic: "pushpace.jobs",
            partition: 0,
            kafka_offset: i,
            campaign_id: None,
            job_id: None,
            device_token: None,
            reason: "not valid JSON: expected value at line 1 column 1",
            raw: &huge,
            key: None,
            device: None,
        };
        dead_letters::insert(&pool, &letter).await.unwrap();
    }

    let mut seen = Vec::new();
    let mut before = None;
    let mut pages = 0;
    loop {
        let page = dead_letters::list(&pool, Some("dl"), before, 10)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        pages += 1;
        assert!(page.len() <= 10);
        assert!(page.windows(2).all(|w| w[0].id > w[1].id), "newest first");
        assert!(page.iter().all(|d| d.campaign_id.as_deref() == Some("dl")));
        before = page.last().map(|d| d.id);
        seen.extend(page);
    }
    assert_eq!(pages, 3);
    let mut seen_ids: Vec<i64> = seen.iter().map(|d| d.id).collect();
    seen_ids.reverse();
    assert_eq!(seen_ids, ids);
    let first = seen.last().unwrap();
    assert_eq!(
        (
            first.kind,
            first.topic.as_str(),
            first.partition,
            first.kafka_offset,
            first.device_token.as_deref(),
            first.raw_prefix.as_slice()
        ),
        (
            DeadLetterKind::Undeliverable,
            "pushpace.jobs",
            2,
            100,
            Some("tok-0"),
            raw.as_slice()
        )
    );
    let all = dead_letters::list(&pool, None, None, 1000).await.unwrap();
    assert_eq!(all.len(), 30);
    let malformed = &all[0];
    assert_eq!(malformed.kind, DeadLetterKind::MalformedJob);
    assert_eq!(
        malformed.raw_len, MAX_RAW_BYTES,
        "raw is truncated at 1 MiB"
    );
    assert_eq!(malformed.campaign_id, None);
}

#[tokio::test]
async fn prune_deletes_old_seconds_and_completed_progress_in_batches() {
    let (pool, _) = fresh_database().await;
    sqlx::query(
        "INSERT INTO delivery_seconds (campaign_id, second, sent) \
         SELECT 'p', now() - interval '40 days' + s * interval '1 second', 1 \
         FROM generate_series(0, 9) AS s",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO delivery_seconds (campaign_id, second, sent) \
         SELECT 'p', date_trunc('second', now()) - s * interval '1 second', 1 \
         FROM generate_series(0, 4) AS s",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO job_progress \
             (job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, completed_at) \
         VALUES ('old-done', 'p', 0, 1, 10, 10, now() - interval '40 days'), \
                ('old-running', 'p', 0, 2, 10, 3, NULL), \
                ('new-done', 'p', 0, 3, 10, 10, now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    // Completed progress goes only once its offset is committed (tests/it/progress.rs).
    store::offsets::record_committed(&pool, "jobs", &[(0, 4)])
        .await
        .unwrap();
    let report = store::prune(&pool, chrono::Duration::days(30), 3)
        .await
        .unwrap();
    assert_eq!(report.seconds_deleted, 10);
    assert_eq!(report.progress_deleted, 1);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM delivery_seconds")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 5);
    let jobs: Vec<String> = sqlx::query_scalar("SELECT job_id FROM job_progress ORDER BY job_id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(jobs, ["new-done", "old-running"]);
    let again = store::prune(&pool, chrono::Duration::days(30), 3)
        .await
        .unwrap();
    assert_eq!((again.seconds_deleted, again.progress_deleted), (0, 0));
    assert_eq!(
        store::prune(&pool, chrono::Duration::days(30), 0)
            .await
            .unwrap_err()
            .field(),
        Some("batch")
    );
}

/// The network between the flusher and PostgreSQL is cut again and again, so that some
/// COMMITs reach the server while their answer is lost: totals stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flapping_network_loses_and_doubles_no_counts() {
    let (direct, url) = fresh_database().await;
    let proxy = Proxy::start("127.0.0.1:5432").await;
    let pool = store::connect(&with_port(&url, proxy.port), 2, Duration::from_millis(300))
        .await
        .unwrap();
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(
        recorder.clone(),
        pool,
        FlusherConfig {
            interval: Duration::from_millis(1),
            retry_min: Duration::from_millis(1),
            retry_max: Duration::from_millis(5),
            ..fast_config()
        },
    );
    let stop = CancellationToken::new();
    let task = flusher.spawn(stop.clone());
    let counter = recorder.campaign("flap");
    let mut expected = BTreeMap::<u64, i64>::new();
    let until = Instant::now() + Duration::from_millis(2000);
    let mut i = 0u64;
    let mut cuts = 0;
    while Instant::now() < until {
        let s = BASE + (i / 20) % 500;
        counter.record(s, Outcome::Sent, 1);
        *expected.entry(s).or_default() += 1;
        i += 1;
        if i % 20 == 0 {
            tokio::time::sleep(Duration::from_micros(500)).await;
        }
        if i % 400 == 0 {
            proxy.set_up(false);
            cuts += 1;
            tokio::time::sleep(Duration::from_millis(1)).await;
            proxy.set_up(true);
        }
    }
    proxy.set_up(true);
    stop.cancel();
    task.await.unwrap().unwrap();
    assert!(
        cuts > 20 && flusher.failed_writes() > 5,
        "{cuts} cuts, {} failures",
        flusher.failed_writes()
    );
    let stored = stored_seconds(&direct, "flap").await;
    let stored: BTreeMap<u64, i64> = stored.into_iter().map(|(s, c)| (s, c[0])).collect();
    assert_eq!(stored, expected);
}

/// A late copy of a committed batch (sent on a connection that was lost, reaching the
/// server after the retry committed and a later batch followed) adds nothing: the
/// flusher's marker only moves forward. The whole-suite run that found this doubled one
/// batch in `a_flapping_network_loses_and_doubles_no_counts`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_late_copy_of_an_older_batch_adds_nothing() {
    use pushpace::store::flush::{write, FlushRows};
    let (pool, _) = fresh_database().await;
    let second = chrono::DateTime::from_timestamp(BASE as i64, 0).unwrap();
    let batch = |seq: i64| {
        let mut counts: [Vec<i64>; pushpace::store::flush::COUNT_COLUMNS] = Default::default();
        for (i, c) in counts.iter_mut().enumerate() {
            c.push(i64::from(i == 0));
        }
        (seq, counts)
    };
    let flusher = unique_name("f");
    for seq in [1, 2, 1, 2, 3, 1] {
        let (seq, counts) = batch(seq);
        let rows = FlushRows {
            flusher_id: &flusher,
            seq,
            campaigns: &["late"],
            seconds: &[second],
            counts,
            jobs: &[],
            job_campaigns: &[],
            partitions: &[],
            offsets: &[],
            totals: &[],
            done: &[],
            after: &[],
        };
        write(&pool, &rows).await.unwrap();
    }
    // Batches 1, 2 and 3 once each.
    assert_eq!(stored_seconds(&pool, "late").await[&BASE][0], 3);
}
