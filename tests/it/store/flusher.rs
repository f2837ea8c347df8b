//! The stats flusher: exact sums from two flushers, progress after a crash, and the batch
//! marker that makes a late copy add nothing.

use super::{fast_config, stored_seconds, BASE};
use crate::helpers::{fresh_database, unique_name};
use pushpace::stats::{Flusher, FlusherConfig, JobKey, Outcome, StatsRecorder};
use pushpace::store::{self, progress};
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

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
        let mut job = recorder.track_job(key.clone());
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
    let mut job = recorder.track_job(key);
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
    let mut stale = recorder.track_job(JobKey {
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
