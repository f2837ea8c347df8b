//! The per-second delivery rows: series with zero-filled gaps and a bounded range, and
//! pruning by age.

use super::{at, fast_config, BASE};
use crate::helpers::fresh_database;
use pushpace::stats::{Flusher, Outcome, StatsRecorder};
use pushpace::store;

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
