//! Counts through database trouble: an unreachable server, killed connections and a
//! flapping network lose and double nothing.

use super::{eventually, fast_config, stored_seconds, BASE};
use crate::helpers::{fresh_database, unique_name, Proxy};
use pushpace::stats::{Flusher, FlusherConfig, JobKey, Outcome, StatsRecorder};
use pushpace::store::{self, progress};
use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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
    let mut job = recorder.track_job(JobKey {
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

    proxy.take_down().await;
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
