//! A slow campaign's backlog parked while the partition keeps going, parked offsets
//! re-read, and a partition paused when its parked jobs pass their share.

use super::*;

/// Produces `jobs` jobs of `devices` devices for `campaign` at `rate`, all to `partition`.
async fn produce_to_partition(
    topic: &str,
    partition: i32,
    campaign: &str,
    rate: u32,
    jobs: std::ops::Range<usize>,
    devices: usize,
) {
    let jobs: Vec<_> = jobs
        .map(|i| {
            let list: Vec<String> = (0..devices)
                .map(|d| format!("{campaign}-{i}-{d}"))
                .collect();
            job_at(&format!("{campaign}-j{i}"), campaign, rate.into(), &list)
        })
        .collect();
    produce_jobs(topic, &jobs, Some(partition)).await;
}

/// The head-of-line case the soak found: a fast campaign whose jobs sit behind a slow
/// campaign's 200,000 devices in the SAME partition. The slow campaign's backlog is
/// parked (left in Kafka), memory holds about one lookahead of it, and the fast campaign
/// runs at its full rate meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_slow_campaign_parks_its_backlog_and_the_fast_one_behind_it_runs() {
    let _serial = pacing_lock().await;
    let mut tw = TestWorker::options().partitions(2).prepare().await;
    let (topic, sink) = (tw.topic.clone(), tw.sink());
    let slow = unique_name("slow").replace('_', "-");
    let fast = unique_name("fast").replace('_', "-");
    produce_to_partition(&topic, 0, &slow, 5, 0..400, 500).await;
    produce_to_partition(&topic, 0, &fast, 1000, 0..10, 300).await;
    tw.start().await;
    let worker = tw.take_worker();
    let end = Instant::now() + Duration::from_secs(40);
    let (mut max_buffered, mut max_parked) = (0, 0);
    while Instant::now() < end {
        let cs = worker.consumer_stats.borrow().clone();
        max_buffered = max_buffered.max(cs.buffered_devices);
        max_parked = max_parked.max(cs.parked_jobs);
        if sink
            .campaign(&fast)
            .is_some_and(|c| c.distinct_delivered == 3000)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    worker.shutdown().await.unwrap();
    let f = sink.campaign(&fast).expect("fast campaign ran");
    assert_eq!(
        f.distinct_delivered, 3000,
        "the fast campaign behind the slow one finished"
    );
    assert!(
        f.mean_rate >= 0.97 * 1000.0,
        "fast campaign ran near full rate: {}",
        f.mean_rate
    );
    // 10 s of lookahead at 5/s is 50 devices: the slow campaign holds its first job
    // (500) and parks the other 399; the fast one holds its 3,000 (under 10 s at 1000/s).
    assert!(
        max_parked >= 390,
        "the slow backlog was parked: {max_parked}"
    );
    assert!(
        max_buffered <= 500 + 3000,
        "buffered devices reached {max_buffered}"
    );
    let slow_sent = sink.campaign(&slow).map_or(0, |c| c.delivered);
    assert!(
        slow_sent < 1000,
        "the slow campaign kept its pace ({slow_sent} sent)"
    );
}

/// With no byte budget every parked job is kept as an offset only and re-read from
/// Kafka when its campaign runs low: all delivered once, and the re-reads keep up with
/// a 2,000/s campaign whose lookahead (100 ms = 200 devices) is one job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_parked_offsets_are_re_read_and_keep_up_with_the_rate() {
    let _serial = pacing_lock().await;
    let mut tw = TestWorker::options()
        .partitions(2)
        .settings(&[
            ("worker.lookahead_ms", "100".into()),
            ("worker.max_parked_bytes", "0".into()),
        ])
        .prepare()
        .await;
    let (topic, sink) = (tw.topic.clone(), tw.sink());
    let id = unique_name("reread").replace('_', "-");
    produce_to_partition(&topic, 0, &id, 2000, 0..40, 200).await;
    tw.start().await;
    let worker = tw.take_worker();
    let end = Instant::now() + Duration::from_secs(40);
    let mut max_parked = 0;
    while Instant::now() < end {
        max_parked = max_parked.max(worker.consumer_stats.borrow().parked_jobs);
        if sink
            .campaign(&id)
            .is_some_and(|c| c.distinct_delivered == 8000)
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let rereads = worker.consumer_stats.borrow().parked_rereads;
    worker.shutdown().await.unwrap();
    let c = sink.campaign(&id).expect("campaign ran");
    assert_eq!(c.distinct_delivered, 8000, "every re-read job delivered");
    assert!(
        rereads >= max_parked as u64,
        "{rereads} re-reads counted, {max_parked} jobs parked as offsets at once"
    );
    assert_eq!(c.duplicates, 0);
    assert!(
        max_parked >= 30,
        "jobs were parked as offsets: {max_parked}"
    );
    assert!(
        c.mean_rate >= 0.97 * 2000.0,
        "re-reads kept up with the rate: {}",
        c.mean_rate
    );
}

/// `worker.max_parked_jobs` in the pause tests below.
const MAX_PARKED_JOBS: usize = 100;
/// A partition's share of it: `parked_share` (consumer/parking.rs) divides it by the
/// partitions assigned, two here.
const PARKED_SHARE: usize = MAX_PARKED_JOBS / 2;
/// The most parked jobs a paused partition can show: exactly its share. The step after
/// each read judges the partition read (`pause_after_read`, consumer/parking.rs) before
/// the loop polls again, so a message is parked only when the count was under the share
/// at that check. librdkafka's prefetch (up to `queued.max.messages.kbytes` = 8 MiB,
/// hundreds of these small jobs) adds nothing: pausing raises the partition's version
/// barrier at once, and `poll` drops the messages fetched before it (rdkafka_partition.c
/// `rd_kafka_toppar_op_pause_resume`, rdkafka_queue.c `rd_kafka_op_filter`); resuming
/// fetches again from the next offset.
const MAX_PARKED_WHEN_PAUSED: usize = PARKED_SHARE;
/// Below the share: the slow campaign (5/s, jobs of 10 devices) may run low in the very
/// step its partition reaches the share and unpark a job before the 50 ms sampling sees
/// it; its first jobs are still being looked up then, so a few can go at once.
const PARKED_SEEN_AT_LEAST: usize = PARKED_SHARE - 5;

/// A worker over two partitions with `worker.max_parked_jobs` = [`MAX_PARKED_JOBS`], a
/// slow campaign's 300 jobs (5/s, 10 devices each) in partition 0 before it starts.
async fn slow_backlog_worker() -> (TestWorker, Worker) {
    let mut tw = TestWorker::options()
        .partitions(2)
        .settings(&[
            // Two partitions: a share of PARKED_SHARE parked jobs each.
            ("worker.max_parked_jobs", MAX_PARKED_JOBS.to_string()),
        ])
        .prepare()
        .await;
    let slow = unique_name("slow").replace('_', "-");
    produce_to_partition(&tw.topic, 0, &slow, 5, 0..300, 10).await;
    tw.start().await;
    let worker = tw.take_worker();
    (tw, worker)
}

/// Parking is bounded too: past its share of `worker.max_parked_jobs` a partition is
/// paused (its backlog then waits unread in Kafka), and resumed below half.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_pauses_when_its_parked_jobs_pass_their_share() {
    let (_tw, worker) = slow_backlog_worker().await;
    let end = Instant::now() + Duration::from_secs(30);
    let (mut saw_paused, mut max_parked) = (false, 0);
    while Instant::now() < end && !saw_paused {
        let cs = worker.consumer_stats.borrow().clone();
        max_parked = max_parked.max(cs.parked_jobs);
        saw_paused |= cs.paused_partitions == vec![0];
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Let it run a little longer in the paused state: parking stays bounded.
    tokio::time::sleep(Duration::from_secs(2)).await;
    max_parked = max_parked.max(worker.consumer_stats.borrow().parked_jobs);
    worker.shutdown().await.unwrap();
    eprintln!("parked jobs: at most {max_parked} seen (share {PARKED_SHARE})");
    assert!(saw_paused, "partition 0 was paused");
    assert!(
        (PARKED_SEEN_AT_LEAST..=MAX_PARKED_WHEN_PAUSED).contains(&max_parked),
        "parked jobs {max_parked}: expected {PARKED_SEEN_AT_LEAST}..={MAX_PARKED_WHEN_PAUSED} (the share)"
    );
}

/// librdkafka keeps a partition paused across a rebalance (revoke, then assign again),
/// while the worker forgets its revoked partitions: a partition paused before a rebalance
/// must still be read after it. Found when a worker left a three-worker group and the
/// other two never got back to the rate.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_partition_paused_before_a_rebalance_is_read_again_after_it() {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    let (tw, worker) = slow_backlog_worker().await;
    let topic = tw.topic.clone();
    let paused = |w: &Worker| w.consumer_stats.borrow().paused_partitions == vec![0];
    let end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < end && !paused(&worker) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        paused(&worker),
        "partition 0 was paused before the rebalance"
    );

    // A second member joins the group and leaves: two rebalances, each revoking and
    // re-assigning the worker's partitions.
    // The worker's settings name its group.
    let kafka = tw.settings.kafka.clone();
    let member: BaseConsumer = pushpace::broker::consumer_config(&kafka, &brokers())
        .create()
        .unwrap();
    member.subscribe(&[&topic]).unwrap();
    let end = Instant::now() + Duration::from_secs(60);
    while member.assignment().map_or(0, |a| a.count()) == 0 && Instant::now() < end {
        let _ = member.poll(Duration::from_millis(100));
        tokio::task::yield_now().await;
    }
    assert!(
        member.assignment().map_or(0, |a| a.count()) > 0,
        "the second member joined the group"
    );
    member.unsubscribe();
    drop(member);

    // Back with both partitions, the worker reads partition 0 again: its backlog is
    // re-read, parked and paused anew (without the resume, nothing is read and no
    // partition shows as paused).
    let mut back_paused = false;
    let end = Instant::now() + Duration::from_secs(60);
    tokio::time::sleep(Duration::from_secs(1)).await;
    while Instant::now() < end {
        let cs = worker.consumer_stats.borrow().clone();
        if cs.paused_partitions == vec![0] && cs.parked_jobs >= PARKED_SHARE {
            back_paused = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let cs = worker.consumer_stats.borrow().clone();
    worker.shutdown().await.unwrap();
    assert!(
        back_paused,
        "partition 0 was read again after the rebalance: {cs:?}"
    );
}

/// A rate changed in the store reaches the intake's lookahead. The campaign waits for a
/// start an hour away, so nothing is sent and no job finishes: at 0.01/s its 1 s
/// lookahead is one device, so it holds its first job and parks four; at 1,000/s the
/// lookahead covers all 500 devices, and only the new rate can take the parked ones up.
/// A null-sender worker (not started) whose campaigns hold 1 s of sends, its pool and
/// topic, and a fresh campaign id.
async fn one_second_lookahead(prefix: &str) -> (TestWorker, sqlx::PgPool, String, String) {
    let tw = TestWorker::options()
        .null_sender()
        .settings(&[("worker.lookahead_ms", "1000".into())])
        .prepare()
        .await;
    let (pool, topic) = (tw.pool.clone(), tw.topic.clone());
    (tw, pool, topic, unique_name(prefix).replace('_', "-"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_change_moves_the_intakes_lookahead_before_any_send() {
    use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch};
    let (mut tw, pool, topic, id) = one_second_lookahead("follow").await;
    let far = chrono::Utc::now() + chrono::Duration::hours(1);
    let set = |rate: f64| CampaignPatch {
        send_rate: Some(rate),
        start_at: Some(Some(far)),
        ..Default::default()
    };
    let defaults = CampaignDefaults::default();
    campaigns::put(&pool, &id, &set(0.01), &defaults)
        .await
        .unwrap();
    produce_to_partition(&topic, 0, &id, 1, 0..5, 100).await;
    tw.start().await;
    let worker = tw.take_worker();
    wait_for(
        "four jobs parked behind the first",
        GROUP_JOIN_LIMIT,
        || worker.consumer_stats.borrow().parked_jobs == 4,
    )
    .await;
    campaigns::put(&pool, &id, &set(1000.0), &defaults)
        .await
        .unwrap();
    let held = || {
        let live = worker.scheduler_stats.borrow().campaigns.clone();
        let c = live.iter().find(|c| *c.id == *id).cloned();
        c
    };
    wait_for(
        "every job held at the new rate",
        Duration::from_secs(10),
        || {
            worker.consumer_stats.borrow().parked_jobs == 0
                && held().is_some_and(|c| c.held_devices == 500)
        },
    )
    .await;
    let c = held().expect("campaign held");
    assert_eq!(c.rate, 1000.0);
    assert_eq!(c.sent, 0, "its start is an hour away");
    worker.shutdown().await.unwrap();
}

/// A job parked behind its campaign's lookahead is only peeked at when read (campaign,
/// rate, device count); a bad one among them is dead-lettered when its turn comes, with
/// the full decode's reason, and the jobs around it go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_job_parked_behind_the_lookahead_is_dead_lettered_when_handed_over() {
    use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch};
    let (mut tw, pool, topic, id) = one_second_lookahead("peeked").await;
    let far = chrono::Utc::now() + chrono::Duration::hours(1);
    let defaults = CampaignDefaults::default();
    let slow = CampaignPatch {
        send_rate: Some(0.01),
        start_at: Some(Some(far)),
        ..Default::default()
    };
    campaigns::put(&pool, &id, &slow, &defaults).await.unwrap();
    produce_to_partition(&topic, 0, &id, 1, 0..2, 100).await;
    // No payload: the peek reads what parking needs; only the full decode refuses it.
    let bad = serde_json::json!({
        "job_id": format!("{id}-bad"),
        "campaign_id": id,
        "devices": ["t-1", "t-2"],
    })
    .to_string();
    let (_, bad_offset) = Producer::new()
        .send(&topic, Record::of(bad.as_bytes()).partition(0))
        .await;
    // A NUL inside a token, as a careless producer writes it: the peek counts the token,
    // the full decode refuses it.
    let nul = serde_json::json!({
        "job_id": format!("{id}-nul"),
        "campaign_id": id,
        "devices": ["t-3", "t\u{0}4"],
        "payload": {"t": 1},
    })
    .to_string();
    let (_, nul_offset) = Producer::new()
        .send(&topic, Record::of(nul.as_bytes()).partition(0))
        .await;
    produce_to_partition(&topic, 0, &id, 1, 2..4, 100).await;
    tw.start().await;
    let worker = tw.take_worker();
    let letters = || async {
        sqlx::query_as::<_, (i64, String, String)>(
            "SELECT kafka_offset, kind, reason FROM dead_letters WHERE campaign_id = $1 OR topic = $2",
        )
        .bind(&id)
        .bind(&topic)
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    wait_for(
        "five jobs parked behind the first",
        GROUP_JOIN_LIMIT,
        || worker.consumer_stats.borrow().parked_jobs == 5,
    )
    .await;
    assert!(letters().await.is_empty(), "parked, so not decoded yet");
    let fast = CampaignPatch {
        send_rate: Some(1000.0),
        start_at: Some(None),
        ..Default::default()
    };
    campaigns::put(&pool, &id, &fast, &defaults).await.unwrap();
    let end = Instant::now() + Duration::from_secs(20);
    while letters().await.len() < 2 {
        assert!(Instant::now() < end, "the bad job was never dead-lettered");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Delivered over the worker: the campaign leaves the live list once it is done.
    wait_for("every good device sent", Duration::from_secs(20), || {
        worker.scheduler_stats.borrow().delivered == 400
    })
    .await;
    let mut got = letters().await;
    got.sort();
    assert_eq!(got.len(), 2, "{got:?}");
    let (offset, kind, reason) = &got[0];
    assert_eq!(
        (*offset, kind.as_str()),
        (bad_offset, "invalid_job"),
        "{got:?}"
    );
    assert!(reason.contains("payload"), "{reason}");
    assert_eq!(
        (got[1].0, got[1].1.as_str()),
        (nul_offset, "invalid_job"),
        "{got:?}"
    );
    worker.shutdown().await.unwrap();
}
