//! Campaign lifecycle through the real worker, tansu and PostgreSQL: weights under a
//! cap that binds, start times, expiry and cancel.

use crate::harness::{produce_jobs, produce_plan, Producer, TestWorker, TestWorkerOptions};
use crate::helpers::{pacing_lock, unique_name, wait_for};
use pushpace::job::{Job, Lifecycle};
use pushpace::limiter::Algorithm;
use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch, CampaignStatus};
use pushpace::tools::produce::ProducePlan;
use std::time::Duration;

/// How long a worker may take to join its group and start sending (tansu's group join).
const GROUP_JOIN_LIMIT: Duration = Duration::from_secs(60);
/// The window the shares are measured over.
const WINDOW: Duration = Duration::from_secs(4);

/// Three campaigns asking 1,000/s each, weighted 1, 2 and 3, under a 600/s global cap:
/// weighted max-min gives them 100, 200 and 300/s (±5%), counted on the worker's
/// release instants; a weight changed through the store reaches the running worker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_weights_share_a_binding_cap_in_proportion() {
    let _serial = pacing_lock().await;
    let mut tw = TestWorker::options()
        .partitions(8)
        .settings(&[("limiter.global_rate", "600".into())])
        .prepare()
        .await;
    let (pool, sink) = (tw.pool.clone(), tw.sink());
    let plan = ProducePlan::with_rates(
        &unique_name("w"),
        &[(1000.0, 4000), (1000.0, 4000), (1000.0, 4000)],
        250,
        Some(Algorithm::Gcra),
    )
    .unwrap();
    let weights = [1.0, 2.0, 3.0];
    for (c, w) in plan.campaigns.iter().zip(weights) {
        let patch = CampaignPatch {
            send_rate: Some(1000.0),
            weight: Some(w),
            ..CampaignPatch::default()
        };
        campaigns::put(&pool, &c.id, &patch, &CampaignDefaults::default())
            .await
            .unwrap();
    }
    produce_plan(&tw.topic, &plan).await;
    tw.start().await;
    let worker = tw.take_worker();
    wait_for("every campaign sending", GROUP_JOIN_LIMIT, || {
        plan.campaigns
            .iter()
            .all(|c| sink.campaign(&c.id).is_some_and(|s| s.delivered >= 100))
    })
    .await;
    let from = sink.elapsed();
    tokio::time::sleep(WINDOW).await;
    let shares = |from: Duration| {
        let arrivals = sink.arrivals();
        plan.campaigns
            .iter()
            .map(|c| {
                let n = arrivals
                    .iter()
                    .filter(|a| *a.campaign_id == *c.id)
                    .filter(|a| a.released.is_some_and(|r| r >= from && r < from + WINDOW))
                    .count();
                n as f64 / WINDOW.as_secs_f64()
            })
            .collect::<Vec<f64>>()
    };
    let check = |got: Vec<f64>, weights: [f64; 3]| {
        let sum: f64 = weights.iter().sum();
        for ((c, w), got) in plan.campaigns.iter().zip(weights).zip(got) {
            let want = 600.0 * w / sum;
            assert!(
                (got - want).abs() <= want * 0.05,
                "{} (weight {w}): {got}/s, want {want}/s ± 5%",
                c.id
            );
        }
    };
    check(shares(from), weights);

    // The first campaign's weight goes to 3: the watcher brings it to the worker.
    let patch = CampaignPatch {
        weight: Some(3.0),
        ..CampaignPatch::default()
    };
    campaigns::put(
        &pool,
        &plan.campaigns[0].id,
        &patch,
        &CampaignDefaults::default(),
    )
    .await
    .unwrap();
    wait_for("the new weight applied", Duration::from_secs(2), || {
        let live = worker.scheduler_stats.borrow().campaigns.clone();
        live.iter()
            .any(|l| *l.id == *plan.campaigns[0].id && l.weight == 3.0)
    })
    .await;
    let from = sink.elapsed();
    tokio::time::sleep(WINDOW).await;
    check(shares(from), [3.0, 2.0, 3.0]);
    worker.shutdown().await.expect("graceful shutdown");
}

/// A job of `n` devices for `campaign`, with its lifecycle fields.
fn job(id: &str, campaign: &str, n: usize, lifecycle: Lifecycle) -> Job {
    let payload = serde_json::value::RawValue::from_string(r#"{"m":1}"#.into()).unwrap();
    let devices = (0..n).map(|d| format!("{id}-{d}")).collect();
    let mut job = Job::new(id, campaign, devices, payload).unwrap();
    job.lifecycle = lifecycle;
    job
}

async fn put(pool: &sqlx::PgPool, id: &str, patch: CampaignPatch) {
    campaigns::put(pool, id, &patch, &CampaignDefaults::default())
        .await
        .unwrap();
}

/// The start instant is compared at millisecond resolution (`start_at` as the worker
/// reads it), so a release may come up to 1 ms before the exact instant.
const START_RESOLUTION: Duration = Duration::from_millis(1);

/// A campaign whose start is ahead waits, its later jobs parked behind a 1 s lookahead,
/// while another campaign's jobs behind them in the same partition are sent. At its
/// start it sends at its rate: no release before the instant, and no 100 ms bucket
/// above rate/10 × 1.1 (its burst is 0), although 1,200 devices became due at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_start_time_holds_its_campaign_and_not_the_partition() {
    let _serial = pacing_lock().await;
    let mut tw = TestWorker::options()
        .settings(&[("worker.lookahead_ms", "1000".into())])
        .prepare()
        .await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let (later, other) = (unique_name("later"), unique_name("other"));
    let far = chrono::Utc::now() + chrono::Duration::hours(1);
    put(
        &pool,
        &later,
        CampaignPatch {
            send_rate: Some(200.0),
            start_at: Some(Some(far)),
            ..Default::default()
        },
    )
    .await;
    put(
        &pool,
        &other,
        CampaignPatch {
            send_rate: Some(200.0),
            ..Default::default()
        },
    )
    .await;
    let mut jobs: Vec<Job> = (0..6)
        .map(|j| job(&format!("{later}-{j}"), &later, 200, Lifecycle::default()))
        .collect();
    jobs.push(job(
        &format!("{other}-0"),
        &other,
        200,
        Lifecycle::default(),
    ));
    produce_jobs(&topic, &jobs, Some(0)).await;
    tw.start().await;
    let worker = tw.take_worker();
    wait_for("the other campaign sent", GROUP_JOIN_LIMIT, || {
        sink.campaign(&other).is_some_and(|s| s.delivered >= 200)
    })
    .await;
    assert!(sink.campaign(&later).is_none(), "sent before its start");
    assert!(
        worker.consumer_stats.borrow().parked_jobs > 0,
        "its later jobs are parked, not blocking the partition"
    );

    // The start moves to 2 s from now; the watcher brings it within a second.
    let start = std::time::SystemTime::now() + Duration::from_secs(2);
    put(
        &pool,
        &later,
        CampaignPatch {
            start_at: Some(Some(chrono::DateTime::from(start))),
            ..Default::default()
        },
    )
    .await;
    wait_for("all of it sent", Duration::from_secs(30), || {
        sink.campaign(&later).is_some_and(|s| s.delivered >= 1200)
    })
    .await;
    let arrivals = sink.arrivals();
    let first = arrivals.first().expect("arrivals");
    let sink_start = first.wall - first.at;
    let start_rel = start.duration_since(sink_start).unwrap();
    let released: Vec<Duration> = arrivals
        .iter()
        .filter(|a| *a.campaign_id == *later)
        .map(|a| a.released.expect("a release stamp"))
        .collect();
    assert_eq!(released.len(), 1200);
    let earliest = released.iter().min().unwrap();
    assert!(
        *earliest + START_RESOLUTION >= start_rel,
        "released {:?} before its start",
        start_rel - *earliest
    );
    let mut buckets = std::collections::BTreeMap::<u128, u32>::new();
    for r in &released {
        *buckets
            .entry((*r - start_rel.min(*r)).as_millis() / 100)
            .or_default() += 1;
    }
    let worst = buckets.values().max().copied().unwrap_or(0);
    assert!(
        worst <= 22,
        "a 100 ms bucket held {worst} releases (at most 200/10 × 1.1)"
    );
    worker.shutdown().await.expect("graceful shutdown");
}

/// Expiry through the real worker: a campaign's expiry ends its jobs with one dead
/// letter each and counts the rest `expired`; a job that arrives already expired is not
/// sent at all; every offset moves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_counts_the_unsent_and_letters_each_job_once() {
    let mut tw = TestWorker::options().prepare().await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let exp = unique_name("exp");
    put(
        &pool,
        &exp,
        CampaignPatch {
            send_rate: Some(20.0),
            ..Default::default()
        },
    )
    .await;
    let past = Lifecycle {
        expires_at_ms: Some(chrono::Utc::now().timestamp_millis() - 1000),
        ..Default::default()
    };
    let mut jobs: Vec<Job> = (0..3)
        .map(|j| job(&format!("{exp}-{j}"), &exp, 100, Lifecycle::default()))
        .collect();
    jobs.push(job(&format!("{exp}-past"), &exp, 50, past));
    produce_jobs(&topic, &jobs, Some(0)).await;
    tw.start().await;
    let worker = tw.take_worker();
    wait_for("sending", GROUP_JOIN_LIMIT, || {
        sink.campaign(&exp).is_some_and(|s| s.delivered >= 10)
    })
    .await;
    put(
        &pool,
        &exp,
        CampaignPatch {
            expires_at: Some(Some(chrono::Utc::now() + chrono::Duration::seconds(2))),
            ..Default::default()
        },
    )
    .await;
    let totals = || async {
        pushpace::store::delivery::totals(&pool, &exp)
            .await
            .unwrap()
    };
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let t = loop {
        let t = totals().await;
        if t.sent + t.expired == 350 || std::time::Instant::now() > end {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(t.sent + t.expired, 350, "{t:?}");
    assert!(t.expired >= 50 + 100, "{t:?}");
    assert_eq!(
        t.sent as u64,
        sink.campaign(&exp).unwrap().delivered,
        "{t:?}"
    );
    let letters: Vec<(String, Option<String>, String)> = sqlx::query_as(
        "SELECT kind, job_id, reason FROM dead_letters WHERE campaign_id = $1 ORDER BY kafka_offset",
    )
    .bind(&exp)
    .fetch_all(&pool)
    .await
    .unwrap();
    // One per job with devices left: the two untouched ones, the one cut short, the past one.
    assert_eq!(letters.len(), 4, "{letters:?}");
    assert!(
        letters.iter().all(|(k, _, _)| k == "expired"),
        "{letters:?}"
    );
    let past_letter = letters
        .iter()
        .find(|(_, j, _)| j.as_deref() == Some(&format!("{exp}-past")))
        .expect("the past job's letter");
    assert!(
        past_letter
            .2
            .starts_with("50 of 50 devices not sent by the job's expires_at"),
        "{}",
        past_letter.2
    );
    let expired_in_letters: i64 = letters
        .iter()
        .map(|(_, _, r)| r.split(' ').next().unwrap().parse::<i64>().unwrap())
        .sum();
    assert_eq!(expired_in_letters, t.expired);
    wait_for("every job finished", Duration::from_secs(10), || {
        worker.scheduler_stats.borrow().open_jobs == 0
    })
    .await;
    worker.shutdown().await.expect("graceful shutdown");
}

/// Cancel through the real worker: held and parked jobs finish without a send, counted
/// `cancelled`, and so does a job that arrives later; the status change is in the
/// campaign's history.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_ends_held_parked_and_later_jobs() {
    let mut tw = TestWorker::options()
        .settings(&[("worker.lookahead_ms", "1000".into())])
        .prepare()
        .await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let can = unique_name("can");
    put(
        &pool,
        &can,
        CampaignPatch {
            send_rate: Some(20.0),
            ..Default::default()
        },
    )
    .await;
    let jobs: Vec<Job> = (0..5)
        .map(|j| job(&format!("{can}-{j}"), &can, 100, Lifecycle::default()))
        .collect();
    produce_jobs(&topic, &jobs, Some(0)).await;
    tw.start().await;
    let worker = tw.take_worker();
    wait_for("sending, later jobs parked", GROUP_JOIN_LIMIT, || {
        sink.campaign(&can).is_some_and(|s| s.delivered >= 10)
            && worker.consumer_stats.borrow().parked_jobs > 0
    })
    .await;
    campaigns::set_status_by(&pool, &can, CampaignStatus::Cancelled, Some("test"))
        .await
        .unwrap();
    produce_jobs(
        &topic,
        &[job(&format!("{can}-late"), &can, 30, Lifecycle::default())],
        Some(0),
    )
    .await;
    let end = std::time::Instant::now() + Duration::from_secs(30);
    let t = loop {
        let t = pushpace::store::delivery::totals(&pool, &can)
            .await
            .unwrap();
        if t.sent + t.cancelled == 530 || std::time::Instant::now() > end {
            break t;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!(t.sent + t.cancelled, 530, "{t:?}");
    assert!(t.cancelled >= 400 + 30, "{t:?}");
    // Nothing more is sent after the cancel reached the worker.
    let delivered = sink.campaign(&can).unwrap().delivered;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(sink.campaign(&can).unwrap().delivered, delivered);
    assert_eq!(t.sent as u64, delivered);
    wait_for("every job finished", Duration::from_secs(10), || {
        let c = worker.consumer_stats.borrow().clone();
        worker.scheduler_stats.borrow().open_jobs == 0 && c.parked_jobs == 0
    })
    .await;
    let events = pushpace::store::events::list(&pool, &can, 100)
        .await
        .unwrap();
    assert!(
        events.iter().any(|e| e.field == "status"
            && e.actor == "test"
            && e.new.as_deref() == Some("cancelled")),
        "{events:?}"
    );
    worker.shutdown().await.expect("graceful shutdown");
}

/// A rate so slow that after its first send (at once) nothing moves for 100 s: the
/// figures the API reads stay still while the test compares them.
const STILL_RATE: f64 = 0.01;

/// A worker with the null sender and a 1 s lookahead over `partitions`, the API next to
/// it.
fn still_api_worker(partitions: i32) -> TestWorkerOptions {
    TestWorker::options()
        .partitions(partitions)
        .null_sender()
        .api()
        .settings(&[("worker.lookahead_ms", "1000".into())])
}

/// Progress and ETA through the API next to a real worker: the devices it holds and has
/// parked are `known_remaining`; with `campaign_total_devices` the ETA rests on the
/// stated total; the effective rate is the one used.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_and_eta_count_held_and_parked_devices() {
    let mut tw = still_api_worker(1).prepare().await;
    let (pool, topic) = (tw.pool.clone(), tw.topic.clone());
    let (slow, sized) = (unique_name("slow"), unique_name("sized"));
    for id in [&slow, &sized] {
        put(
            &pool,
            id,
            CampaignPatch {
                send_rate: Some(STILL_RATE),
                ..Default::default()
            },
        )
        .await;
    }
    let stated = Lifecycle {
        campaign_total_devices: Some(5_000),
        ..Default::default()
    };
    let mut jobs: Vec<Job> = (0..5)
        .map(|j| job(&format!("{slow}-{j}"), &slow, 100, Lifecycle::default()))
        .collect();
    jobs.push(job(&format!("{sized}-0"), &sized, 100, stated));
    produce_jobs(&topic, &jobs, Some(0)).await;
    tw.start().await;
    let (worker, api) = (tw.take_worker(), tw.take_api());
    wait_for(
        "both held, slow's later jobs parked",
        GROUP_JOIN_LIMIT,
        || {
            let live = worker.scheduler_stats.borrow().campaigns.clone();
            // Three or four of slow's jobs stay parked: until the consumer has the
            // stored rate it sizes the lookahead on the default, and the first send
            // may unpark one more job.
            live.len() == 2
                && live.iter().all(|c| c.sent == 1)
                && worker.consumer_stats.borrow().parked_jobs >= 3
        },
    )
    .await;
    // The published figures (rewritten every second) catch up with the snapshot: 499
    // devices of slow are unfinished, split between held and parked.
    let mut r = api.get(&format!("/api/campaigns/{slow}")).await;
    let end = std::time::Instant::now() + Duration::from_secs(5);
    let split = |r: &crate::api::Reply| {
        r.body["live"]["held_devices"].as_u64().unwrap_or(0)
            + r.body["live"]["parked_devices"].as_u64().unwrap_or(0)
    };
    while (r.body["progress"]["known_remaining"].as_u64() != Some(499) || split(&r) != 499)
        && std::time::Instant::now() < end
    {
        tokio::time::sleep(Duration::from_millis(200)).await;
        r = api.get(&format!("/api/campaigns/{slow}")).await;
    }
    let p = &r.body["progress"];
    let parked = r.body["live"]["parked_devices"].as_u64().unwrap();
    assert!(parked == 300 || parked == 400, "{}", r.text);
    assert_eq!(
        r.body["live"]["held_devices"].as_u64(),
        Some(499 - parked),
        "{}",
        r.text
    );
    assert_eq!(p["known_remaining"].as_u64(), Some(499), "{}", r.text);
    assert_eq!(p["workers"].as_u64(), Some(1), "{}", r.text);
    assert!(p["total"].is_null(), "{}", r.text);
    let eta = &r.body["eta"];
    assert_eq!(eta["basis"], "known", "{}", r.text);
    assert_eq!(eta["rate"].as_f64(), Some(STILL_RATE), "{}", r.text);
    let secs = eta["seconds"].as_f64().unwrap();
    assert!((secs - 499.0 / STILL_RATE).abs() < 1e-6, "{}", r.text);

    let r = api.get(&format!("/api/campaigns/{sized}")).await;
    assert_eq!(
        r.body["progress"]["total"].as_u64(),
        Some(5_000),
        "{}",
        r.text
    );
    assert_eq!(r.body["eta"]["basis"], "total", "{}", r.text);
    let finished = r.body["progress"]["finished"].as_i64().unwrap();
    let secs = r.body["eta"]["seconds"].as_f64().unwrap();
    assert!(
        (secs - (5_000 - finished) as f64 / STILL_RATE).abs() < 1e-6,
        "{}",
        r.text
    );
    // The list gives the same fields.
    let list = api.get("/api/campaigns").await;
    let item = list
        .body
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == *sized)
        .unwrap();
    assert_eq!(item["eta"]["basis"], "total");
    worker.shutdown().await.expect("graceful shutdown");
    // Its rows go with it.
    let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM worker_campaigns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(rows, 0);
    api.app.stop().await.expect("server stops");
}

/// Two workers in one group, each holding one partition of a campaign: the API next to
/// one of them sums both workers' held and parked devices.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_sums_over_the_workers_that_hold_a_campaign() {
    let mut tw = still_api_worker(2).prepare().await;
    let (pool, topic) = (tw.pool.clone(), tw.topic.clone());
    let shared = unique_name("shared");
    put(
        &pool,
        &shared,
        CampaignPatch {
            send_rate: Some(STILL_RATE),
            ..Default::default()
        },
    )
    .await;
    let producer = Producer::new();
    for j in 0..6 {
        let job = job(&format!("{shared}-{j}"), &shared, 100, Lifecycle::default());
        producer.job(&topic, &job, Some(j % 2)).await;
    }
    // Two workers in one group; the API reads the first.
    tw.start().await;
    let b = tw.start_another().await;
    let (a, api) = (tw.take_worker(), tw.take_api());
    let path = format!("/api/campaigns/{shared}");
    let end = std::time::Instant::now() + GROUP_JOIN_LIMIT;
    let r = loop {
        let r = api.get(&path).await;
        let p = &r.body["progress"];
        let done = p["workers"].as_u64() == Some(2)
            && p["known_remaining"].as_u64().unwrap_or(0) + p["finished"].as_u64().unwrap_or(0)
                == 600;
        if done || std::time::Instant::now() > end {
            break r;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let p = &r.body["progress"];
    assert_eq!(p["workers"].as_u64(), Some(2), "{}", r.text);
    let known = p["known_remaining"].as_u64().unwrap();
    assert_eq!(known + p["finished"].as_u64().unwrap(), 600, "{}", r.text);
    // This worker alone holds about half of it.
    let here = r.body["live"]["held_devices"].as_u64().unwrap_or(0)
        + r.body["live"]["parked_devices"].as_u64().unwrap_or(0);
    assert!(here < known, "this worker's {here} of {known}: {}", r.text);
    // Both workers' effective rates (local scope: each applies the whole rate).
    assert_eq!(
        r.body["eta"]["rate"].as_f64(),
        Some(2.0 * STILL_RATE),
        "{}",
        r.text
    );
    b.shutdown().await.expect("graceful shutdown");
    a.shutdown().await.expect("graceful shutdown");
    api.app.stop().await.expect("server stops");
}
