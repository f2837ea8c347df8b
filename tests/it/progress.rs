//! Job progress against the real PostgreSQL: keyed by campaign, the finished set beyond
//! the prefix, the migration that introduced both, and retention behind the committed
//! offsets.

use crate::helpers::{fresh_database, pg_server, unique_name};
use pushpace::job::Job;
use pushpace::limiter::{Algorithm, Rate};
use pushpace::sender::{AnySender, NullSender};
use pushpace::stats::{Flusher, FlusherConfig, JobKey, JobProgressHandle, StatsRecorder};
use pushpace::store::{self, offsets, progress, JobProgress};
use pushpace::worker::progress_loader::ProgressLoader;
use pushpace::worker::scheduler::{
    CampaignSettings, Event, IncomingJob, Scheduler, SchedulerConfig,
};
use sqlx::PgPool;
use std::time::Duration;

fn key(campaign: &str, job: &str, total: u32) -> JobKey {
    JobKey {
        job_id: job.into(),
        campaign_id: campaign.into(),
        partition: 0,
        offset: 1,
        devices_total: total,
    }
}

/// Marks `devices` finished as the scheduler does: each one, then the prefix.
fn finish(job: &mut JobProgressHandle, devices: impl IntoIterator<Item = u32>, prefix: u32) {
    for d in devices {
        job.mark(d);
    }
    job.set_done(prefix);
}

async fn stored(pool: &PgPool, campaign: &str, job: &str) -> JobProgress {
    progress::lookup(pool, campaign, job)
        .await
        .unwrap()
        .expect("progress stored")
}

#[tokio::test]
async fn the_same_job_id_under_two_campaigns_keeps_separate_progress() {
    let (pool, _) = fresh_database().await;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), FlusherConfig::default());
    let mut first = recorder.track_job(key("first", "shared-id", 10));
    finish(&mut first, 0..10, 10);
    let mut second = recorder.track_job(key("second", "shared-id", 10));
    finish(&mut second, 0..3, 3);
    let report = flusher.flush_now().await.unwrap();
    assert_eq!((report.progress_rows, report.statements), (2, 1));
    let a = stored(&pool, "first", "shared-id").await;
    let b = stored(&pool, "second", "shared-id").await;
    assert!(a.is_complete() && a.devices_done == 10);
    assert_eq!((b.devices_done, b.is_complete()), (3, false));
    // The second campaign moves on; the first one's row is untouched.
    finish(&mut second, [4], 3);
    flusher.flush_now().await.unwrap();
    let b = stored(&pool, "second", "shared-id").await;
    assert_eq!(b.finished_after_prefix().collect::<Vec<_>>(), [4]);
    assert_eq!(stored(&pool, "first", "shared-id").await, a);
    assert_eq!(
        progress::lookup(&pool, "third", "shared-id").await.unwrap(),
        None
    );
}

#[tokio::test]
async fn a_device_pinned_at_index_0_does_not_hold_back_the_others() {
    let (pool, _) = fresh_database().await;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), FlusherConfig::default());
    const N: u32 = 1_000;
    let mut job = recorder.track_job(key("pinned", "job", N));
    // Device 0 keeps retrying; 1..N finish.
    finish(&mut job, 1..N, 0);
    let report = flusher.flush_now().await.unwrap();
    assert_eq!(report.statements, 1);
    let p = stored(&pool, "pinned", "job").await;
    assert_eq!((p.devices_done, p.devices_finished), (0, N - 1));
    assert_eq!(
        p.finished_after_prefix().collect::<Vec<_>>(),
        (1..N).collect::<Vec<_>>()
    );
    assert!(!p.is_finished(0) && !p.is_complete());
    // Device 0 at last: the job is complete, the bitmap folded into the prefix.
    finish(&mut job, [0], N);
    flusher.flush_now().await.unwrap();
    assert!(job.is_durably_complete());
    let p = stored(&pool, "pinned", "job").await;
    assert_eq!((p.devices_done, p.devices_finished), (N, N));
    assert!(p.completed_at.is_some());
    assert_eq!(p.finished_after_prefix().count(), 0);
}

#[tokio::test]
async fn finished_sets_of_odd_sizes_round_trip_and_unite() {
    let (pool, _) = fresh_database().await;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), FlusherConfig::default());
    let sizes = [1u32, 63, 64, 65, 10_000];
    // Per size: the prefix, then every third device after it, the last device included.
    let expected = |total: u32, prefix: u32| -> Vec<u32> {
        (prefix..total)
            .filter(|d| d % 3 == 2 || *d == total - 1)
            .collect()
    };
    // As stored: finished devices right at the prefix become part of it.
    let normalised = |total: u32, prefix: u32| -> (u32, Vec<u32>) {
        let mut want = expected(total, prefix);
        let mut done = prefix;
        while want.first() == Some(&done) {
            want.remove(0);
            done += 1;
        }
        (done, want)
    };
    let mut jobs = Vec::new();
    for total in sizes {
        let prefix = total / 2;
        let mut job = recorder.track_job(key("odd", &format!("job-{total}"), total));
        finish(&mut job, expected(total, prefix), prefix);
        jobs.push(job);
    }
    let report = flusher.flush_now().await.unwrap();
    assert_eq!((report.progress_rows, report.statements), (5, 1));
    for total in sizes {
        let p = stored(&pool, "odd", &format!("job-{total}")).await;
        let (done, want) = normalised(total, total / 2);
        assert_eq!(p.devices_done, done, "{total} devices");
        assert_eq!(
            p.finished_after_prefix().collect::<Vec<_>>(),
            want,
            "{total} devices"
        );
        assert_eq!(p.is_complete(), done == total, "{total} devices");
    }
    // Another worker's stale set for the 10,000-device job (prefix 100, device 101 and
    // 9,000) is united with the stored one, never written over it.
    let other = StatsRecorder::new();
    let mut stale = other.track_job(key("odd", "job-10000", 10_000));
    finish(&mut stale, [101, 9_000], 100);
    Flusher::new(other, pool.clone(), FlusherConfig::default())
        .flush_now()
        .await
        .unwrap();
    let p = stored(&pool, "odd", "job-10000").await;
    let (done, mut want) = normalised(10_000, 5_000);
    assert_eq!(p.devices_done, done);
    assert!(p.is_finished(101) && p.is_finished(9_000) && !p.is_finished(5_001));
    want.push(9_000);
    want.sort_unstable();
    assert_eq!(p.finished_after_prefix().collect::<Vec<_>>(), want);
}

#[tokio::test]
async fn prune_keeps_completed_progress_until_its_offset_is_committed() {
    let (pool, _) = fresh_database().await;
    sqlx::query(
        "INSERT INTO job_progress \
             (job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, completed_at) \
         VALUES ('at-5', 'p', 0, 5, 10, 10, now() - interval '40 days'), \
                ('at-9', 'p', 0, 9, 10, 10, now() - interval '40 days'), \
                ('other-partition', 'p', 1, 5, 10, 10, now() - interval '40 days')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let prune = || store::prune(&pool, chrono::Duration::days(30), 100);
    let left = || async {
        sqlx::query_scalar::<_, String>("SELECT job_id FROM job_progress ORDER BY job_id")
            .fetch_all(&pool)
            .await
            .unwrap()
    };
    assert_eq!(
        prune().await.unwrap().progress_deleted,
        0,
        "nothing committed yet"
    );

    // The commit of "jobs" is past offset 5; another topic's commit on partition 0 is not.
    offsets::record_committed(&pool, "jobs", &[(0, 6)])
        .await
        .unwrap();
    offsets::record_committed(&pool, "older", &[(0, 3)])
        .await
        .unwrap();
    assert_eq!(prune().await.unwrap().progress_deleted, 0);
    offsets::record_committed(&pool, "older", &[(0, 100)])
        .await
        .unwrap();
    assert_eq!(prune().await.unwrap().progress_deleted, 1);
    assert_eq!(left().await, ["at-9", "other-partition"]);

    // Offsets only move forward; one partition twice in a call keeps the higher.
    offsets::record_committed(&pool, "jobs", &[(0, 2), (1, 7), (1, 5)])
        .await
        .unwrap();
    assert_eq!(offsets::committed(&pool, "jobs", 0).await.unwrap(), Some(6));
    assert_eq!(offsets::committed(&pool, "jobs", 1).await.unwrap(), Some(7));
    assert_eq!(
        prune().await.unwrap().progress_deleted,
        1,
        "partition 1 is past 5"
    );
    // A committed offset equal to the job's is the job itself, not yet consumed past.
    offsets::record_committed(&pool, "jobs", &[(0, 9)])
        .await
        .unwrap();
    assert_eq!(prune().await.unwrap().progress_deleted, 0);
    offsets::record_committed(&pool, "jobs", &[(0, 10)])
        .await
        .unwrap();
    assert_eq!(prune().await.unwrap().progress_deleted, 1);
    assert!(left().await.is_empty());
    offsets::record_committed(&pool, "jobs", &[]).await.unwrap();
}

#[tokio::test]
async fn the_migration_keeps_existing_progress() {
    let url = format!("{}/{}", pg_server(), unique_name("pushpace_test"));
    store::ensure_database(&url).await.unwrap();
    let pool = store::connect(&url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    const MINE: i64 = 20261125000200;
    for m in store::MIGRATOR.iter().filter(|m| m.version < MINE) {
        sqlx::raw_sql(&m.sql).execute(&pool).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO job_progress \
             (job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, completed_at) \
         VALUES ('old', 'c', 2, 7, 10, 4, NULL), ('done', 'c', 2, 8, 5, 5, now())",
    )
    .execute(&pool)
    .await
    .unwrap();
    for m in store::MIGRATOR.iter().filter(|m| m.version >= MINE) {
        sqlx::raw_sql(&m.sql).execute(&pool).await.unwrap();
    }
    let old = stored(&pool, "c", "old").await;
    assert_eq!((old.partition, old.kafka_offset), (2, 7));
    assert_eq!(
        (old.devices_total, old.devices_done, old.devices_finished),
        (10, 4, 4)
    );
    assert!(stored(&pool, "c", "done").await.is_complete());
}

/// A re-consumed job's stored set reaches the scheduler: only the devices not finished
/// before are sent, and those finished before are not counted as skipped.
#[tokio::test]
async fn the_scheduler_sends_only_the_devices_not_finished_before() {
    let (pool, _) = fresh_database().await;
    const N: u32 = 10;
    {
        let recorder = StatsRecorder::new();
        let mut job = recorder.track_job(key("resume", "job", N));
        finish(&mut job, [0, 1, 5, 7], 2);
        Flusher::new(recorder, pool.clone(), FlusherConfig::default())
            .flush_now()
            .await
            .unwrap();
    }
    let found = stored(&pool, "resume", "job").await;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), FlusherConfig::default());
    let (ctx, mut crx) = tokio::sync::mpsc::unbounded_channel();
    let (etx, erx) = std::sync::mpsc::channel();
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 10,
            max_in_flight: 100,
            max_attempts: 5,
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        recorder.clone(),
        ctx,
        etx,
    );
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let devices = (0..N).map(|d| format!("dev-{d}")).collect();
    let job = Job::new("job", "resume", devices, payload).unwrap();
    let rate = Rate::per_second(1_000_000.0).unwrap();
    let settings = CampaignSettings::active("resume", rate, Algorithm::Gcra);
    let mut incoming = IncomingJob::fresh(job, 0, 1, settings);
    incoming.already_done = found.devices_done;
    incoming.skip_done = found.finished_after_prefix().collect();
    s.add_job(incoming, 0);
    let mut now = 0;
    let finished = loop {
        s.run_round(now, 1_800_000_000);
        while let Ok(c) = crx.try_recv() {
            s.complete(c, now, 1_800_000_000);
        }
        if let Ok(Event::JobFinished { progress, .. }) = erx.try_recv() {
            break progress;
        }
        assert!(now < 10_000_000_000, "the job never finished");
        now += 1_000_000;
        tokio::task::yield_now().await;
    };
    let stats = s.stats();
    assert_eq!((stats.sends, stats.skipped_invalid), (6, 0));
    flusher.flush_now().await.unwrap();
    assert!(finished.is_durably_complete());
    assert!(stored(&pool, "resume", "job").await.is_complete());
}

/// The enrich stage's loader: lookups asked together are answered each with its own
/// job's progress (or none), and a connection the server ends is replaced.
#[tokio::test]
async fn the_progress_loader_answers_lookups_together_and_outlives_its_connection() {
    let (pool, _) = fresh_database().await;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), FlusherConfig::default());
    let handles: Vec<_> = (1..=20u32)
        .map(|j| {
            let mut h = recorder.track_job(key("loaded", &format!("job-{j}"), 10));
            finish(&mut h, 0..j.min(10), j.min(10));
            h
        })
        .collect();
    flusher.flush_now().await.unwrap();
    let loader = ProgressLoader::spawn(&pool, Default::default());
    // Jobs 21..=40 have no progress; every job is asked twice, all at once.
    let asks = (1..=40u32).chain(1..=40).map(|j| {
        let loader = loader.clone();
        async move { (j, loader.progress("loaded", &format!("job-{j}")).await) }
    });
    for (j, got) in futures::future::join_all(asks).await {
        let got = got.expect("a lookup that can be answered is answered");
        match got {
            Some(p) => assert_eq!((j, p.devices_done), (j, j.min(10))),
            None => assert!(j > 20, "job-{j} has progress stored"),
        }
    }
    // The server ends every other session on this database, the loader's among them.
    let ended: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid()) AS t",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!(ended >= 1, "the loader's connection was open");
    let again = tokio::time::timeout(Duration::from_secs(10), loader.progress("loaded", "job-5"))
        .await
        .expect("answered within 10 s")
        .expect("answered")
        .expect("stored");
    assert_eq!(again.devices_done, 5);
    drop(handles);
}
