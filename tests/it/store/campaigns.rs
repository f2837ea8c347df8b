//! Campaign rows: validation, creation from jobs and the API, the list with its totals,
//! and the watcher that sees changes made with SQL.

use super::{at, eventually, fast_config, rate, BASE};
use crate::helpers::fresh_database;
use pushpace::limiter::Algorithm;
use pushpace::stats::{Flusher, Outcome, StatsRecorder};
use pushpace::store::campaigns::{
    self, CampaignDefaults, CampaignPatch, CampaignStatus, JobCampaign,
};
use pushpace::store::{CampaignWatcher, StoreError, WatcherConfig};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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
            ..Default::default()
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

/// Many first jobs at once (a worker starting on a backlog): one statement set creates
/// the missing campaigns, keeps the stored ones, and answers a bad id alone.
#[tokio::test]
async fn a_batch_of_first_jobs_creates_each_missing_campaign_and_keeps_stored_ones() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults {
        send_rate: rate(42.0),
        algorithm: Algorithm::TokenBucket,
        burst: 3,
    };
    campaigns::upsert_from_job(&pool, "known", Some(rate(5.0)), None, &defaults)
        .await
        .unwrap();
    let job = |id: &str, r: Option<f64>, a: Option<Algorithm>| JobCampaign {
        id: id.into(),
        send_rate: r.map(rate),
        algorithm: a,
    };
    let long = "x".repeat(200);
    let wanted = [
        job("known", Some(99.0), Some(Algorithm::Gcra)),
        job("fresh", Some(10.0), Some(Algorithm::Gcra)),
        job("plain", None, None),
        job(&long, Some(1.0), None),
        // What a careless producer sends: none reaches the statement the others share.
        job("", None, None),
        job("nul\0id", None, None),
        job("caf\u{e9}", None, None),
    ];
    let got = campaigns::upsert_many_from_jobs(&pool, &wanted, &defaults)
        .await
        .unwrap();
    assert_eq!(got.len(), 7);
    let ok = |id: &str| got[id].as_ref().unwrap();
    assert_eq!(
        (ok("known").send_rate, ok("known").algorithm),
        (5.0, Algorithm::TokenBucket)
    );
    assert_eq!(
        (
            ok("fresh").send_rate,
            ok("fresh").algorithm,
            ok("fresh").burst
        ),
        (10.0, Algorithm::Gcra, 3)
    );
    assert_eq!(
        (ok("plain").send_rate, ok("plain").algorithm),
        (42.0, Algorithm::TokenBucket)
    );
    for bad in [long.as_str(), "", "nul\0id", "caf\u{e9}"] {
        let err = got[bad].as_ref().unwrap_err();
        assert_eq!(err.field(), Some("id"), "{bad:?}: {err}");
    }
    // The rows are the ones answered, and the bad ids made none.
    for id in ["known", "fresh", "plain"] {
        assert_eq!(&campaigns::get(&pool, id).await.unwrap().unwrap(), ok(id));
    }
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM campaigns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 3);

    // Overlapping batches at once (two workers' first jobs): one row per campaign, and
    // every batch sees it.
    let ids: Vec<String> = (0..50).map(|i| format!("race-{i}")).collect();
    let tasks: Vec<_> = (0..4)
        .map(|t| {
            let (pool, defaults) = (pool.clone(), defaults);
            let wanted: Vec<JobCampaign> = ids
                .iter()
                .map(|id| job(id, Some(100.0 + f64::from(t)), None))
                .collect();
            tokio::spawn(async move {
                campaigns::upsert_many_from_jobs(&pool, &wanted, &defaults)
                    .await
                    .unwrap()
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    for id in &ids {
        let stored = campaigns::get(&pool, id).await.unwrap().unwrap();
        for a in &answers {
            assert_eq!(a[id].as_ref().unwrap(), &stored, "{id}");
        }
    }
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
