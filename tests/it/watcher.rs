//! The campaign watcher at scale: notified changes, and the fallback re-read that must
//! read the changed rows only, against the real PostgreSQL.

use crate::helpers::fresh_database;
use pushpace::store::listen::{CampaignWatcher, WatcherConfig, WatcherStats, REREAD_OVERLAP};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// The watcher's promise: a change is published within a second, by NOTIFY or, when the
/// notification is lost, by the fallback re-read (period [`FALLBACK_PERIOD`] here).
const ARRIVAL: Duration = Duration::from_secs(1);

/// Fallback period of the watchers that test it: a fifth of [`ARRIVAL`], leaving the rest
/// for the read and for scheduling on a busy machine.
const FALLBACK_PERIOD: Duration = Duration::from_millis(200);

const BULK: i64 = 100_000;

fn config(refresh_interval: Duration) -> WatcherConfig {
    WatcherConfig {
        refresh_interval,
        reconnect_min: Duration::from_millis(50),
        reconnect_max: Duration::from_millis(200),
    }
}

/// Polls `check` every 20 ms until it holds or `limit` passes; returns whether it held.
async fn eventually(limit: Duration, mut check: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if check() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn listeners(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity \
         WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Sets `send_rate` of `ids` without the NOTIFY: replication role "replica" skips the
/// ordinary triggers for this transaction, so `updated_at` is set here as the touch
/// trigger would (the transaction's start). Holds the transaction open for `hold`.
async fn update_silently(pool: &PgPool, ids: &[&str], send_rate: f64, hold: Duration) {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    let ids: Vec<String> = ids.iter().map(|s| s.to_string()).collect();
    let updated =
        sqlx::query("UPDATE campaigns SET send_rate = $2, updated_at = now() WHERE id = ANY($1)")
            .bind(&ids)
            .bind(send_rate)
            .execute(&mut *tx)
            .await
            .unwrap()
            .rows_affected();
    assert_eq!(updated, ids.len() as u64);
    tokio::time::sleep(hold).await;
    tx.commit().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_100k_campaigns_changes_arrive_within_a_second_and_a_refresh_reads_only_them() {
    let (pool, _) = fresh_database().await;
    // Changed an hour ago: outside any re-read window.
    sqlx::query(
        "INSERT INTO campaigns (id, send_rate, algorithm, updated_at) \
         SELECT 'bulk-' || g, 100, 'gcra', now() - interval '1 hour' \
         FROM generate_series(1, $1::int8) g",
    )
    .bind(BULK)
    .execute(&pool)
    .await
    .unwrap();
    let stop = CancellationToken::new();
    // `notified` re-reads only every 10 minutes: what it sees quickly came by NOTIFY.
    let notified =
        CampaignWatcher::start(pool.clone(), config(Duration::from_secs(600)), stop.clone())
            .await
            .unwrap();
    let fallback = CampaignWatcher::start(pool.clone(), config(FALLBACK_PERIOD), stop.clone())
        .await
        .unwrap();
    assert_eq!(notified.current().len(), BULK as usize);
    assert_eq!(fallback.current().len(), BULK as usize);
    let connected = Instant::now() + Duration::from_secs(10);
    while listeners(&pool).await < 2 {
        assert!(Instant::now() < connected, "both watchers LISTEN");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Past the full re-read that follows connecting, refreshes find nothing to read.
    let settled = || {
        let s = fallback.stats();
        s.full_reads >= 2 && s.refreshes >= 2 && s.last_refresh_rows == 0
    };
    assert!(
        eventually(Duration::from_secs(10), settled).await,
        "{:?}",
        fallback.stats()
    );

    // NOTIFY path.
    let started = Instant::now();
    sqlx::query("UPDATE campaigns SET send_rate = 250 WHERE id = 'bulk-77'")
        .execute(&pool)
        .await
        .unwrap();
    let mut snapshots = notified.subscribe();
    tokio::time::timeout(
        ARRIVAL,
        snapshots.wait_for(|s| s.get("bulk-77").map(|c| c.send_rate) == Some(250.0)),
    )
    .await
    .expect("the notified change arrived within 1 s")
    .unwrap();
    eprintln!(
        "notified change with {BULK} campaigns: {:?}",
        started.elapsed()
    );
    assert!(notified.stats().notified_reads >= 1);

    // Fallback path: no NOTIFY.
    let before: WatcherStats = fallback.stats();
    let silent = ["bulk-5", "bulk-50000", "bulk-99999"];
    let started = Instant::now();
    update_silently(&pool, &silent, 33.0, Duration::ZERO).await;
    let mut snapshots = fallback.subscribe();
    tokio::time::timeout(
        ARRIVAL,
        snapshots.wait_for(|s| {
            silent
                .iter()
                .all(|id| s.get(id).map(|c| c.send_rate) == Some(33.0))
        }),
    )
    .await
    .expect("the silent change arrived within 1 s")
    .unwrap();
    eprintln!(
        "silent change with {BULK} campaigns: {:?}",
        started.elapsed()
    );
    let after = fallback.stats();
    assert_eq!(
        after.full_reads, before.full_reads,
        "found by a refresh, not a full read"
    );
    let refreshes = after.refreshes - before.refreshes;
    let rows = after.refreshed_rows - before.refreshed_rows;
    assert!(refreshes >= 1, "{before:?} {after:?}");
    // Each refresh read at most the rows changed inside its window (bulk-77 and the three
    // silent ones), and the refreshes together read the three at least once.
    let recent = 1 + silent.len() as u64;
    assert!(
        rows >= 3 && rows <= recent * refreshes,
        "{rows} rows in {refreshes} refreshes"
    );
    // The notified watcher never heard of it: the change really went without NOTIFY.
    assert_eq!(notified.get("bulk-5").unwrap().send_rate, 100.0);
    assert_eq!(fallback.current().len(), BULK as usize);
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_change_committed_after_later_refreshes_is_still_found() {
    let (pool, _) = fresh_database().await;
    sqlx::query("INSERT INTO campaigns (id, send_rate, algorithm) VALUES ('late', 10, 'gcra')")
        .execute(&pool)
        .await
        .unwrap();
    let stop = CancellationToken::new();
    let watcher = CampaignWatcher::start(pool.clone(), config(FALLBACK_PERIOD), stop.clone())
        .await
        .unwrap();
    // Several refreshes run while the writing transaction is open, each newer than its
    // `updated_at`; well inside the overlap, which is what lets the next one find it.
    let hold = FALLBACK_PERIOD * 6;
    assert!(hold * 2 < REREAD_OVERLAP);
    let before = watcher.stats();
    update_silently(&pool, &["late"], 20.0, hold).await;
    let committed = Instant::now();
    let during = watcher.stats().refreshes - before.refreshes;
    assert!(
        during >= 3,
        "{during} refreshes while the transaction was open"
    );
    let mut snapshots = watcher.subscribe();
    tokio::time::timeout(
        ARRIVAL,
        snapshots.wait_for(|s| s.get("late").map(|c| c.send_rate) == Some(20.0)),
    )
    .await
    .expect("the late commit was found within 1 s")
    .unwrap();
    eprintln!("late silent commit found after {:?}", committed.elapsed());
    stop.cancel();
}
