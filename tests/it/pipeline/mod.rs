//! The worker pipeline end to end, against the real tansu broker, real PostgreSQL and a
//! real loopback HTTP sink that timestamps every request.

mod parking;

use crate::harness::{
    job_at, produce_jobs, produce_plan, PlannedRun as Run, Producer, Record, TestWorker,
};
use crate::helpers::{brokers, fresh_database, fresh_topic, pacing_lock, unique_name, wait_for};
use pushpace::limiter::{Algorithm, Rate};
use pushpace::tools::produce::{PlannedCampaign, ProducePlan};
use pushpace::tools::sink::{Sink, SinkConfig};
use pushpace::worker::Worker;
use std::time::{Duration, Instant};

async fn start(
    campaigns: &[(f64, usize)],
    algorithm: Option<Algorithm>,
    extra: &[(&str, String)],
) -> Run {
    let run_id = unique_name("r");
    let plan = ProducePlan::with_rates(&run_id.clone(), campaigns, 250, algorithm).unwrap();
    TestWorker::options()
        .partitions(8)
        .settings(extra)
        .run_plan(plan)
        .await
}

impl Run {
    fn total(&self) -> u64 {
        self.plan.total_devices() as u64
    }

    async fn wait_all_delivered(&self, limit: Duration) {
        let end = Instant::now() + limit;
        while self.sink.summary().distinct_delivered < self.total() && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn recorded_sent(&self, campaign: &str) -> i64 {
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT sum(sent)::bigint FROM delivery_seconds WHERE campaign_id = $1",
        )
        .bind(campaign)
        .fetch_one(&self.tw.pool)
        .await
        .unwrap()
        .unwrap_or(0)
    }
}

/// How long a worker may take to join its group and start sending: tansu's group
/// join takes seconds (a rebalance per heartbeat while it settles).
const GROUP_JOIN_LIMIT: Duration = Duration::from_secs(60);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_five_campaigns_delivered_once_and_recorded() {
    let _serial = pacing_lock().await;
    // About 5 s of work per campaign.
    let rates = [
        (20.0, 100),
        (100.0, 500),
        (500.0, 2500),
        (1000.0, 5000),
        (2000.0, 10000),
    ];
    let mut run = start(&rates, Some(Algorithm::Gcra), &[]).await;
    run.wait_all_delivered(Duration::from_secs(60)).await;
    run.stop().await;

    let summary = run.sink.summary();
    assert_eq!(
        summary.distinct_delivered,
        run.total(),
        "every (job, device) arrived"
    );
    assert_eq!(summary.duplicates, 0, "no duplicates in a clean run");
    for (c, (rate, devices)) in run.plan.campaigns.iter().zip(rates) {
        let s = run.sink.campaign(&c.id).expect("campaign reached the sink");
        crate::helpers::assert_paced(&run.sink, &c.id, rate);
        let mean = devices as f64 / ((s.last_ms - s.first_ms) / 1000.0 + 1.0 / rate);
        assert!(
            mean >= 0.97 * rate,
            "{}: mean {mean:.1}/s < 0.97 × {rate}",
            c.id
        );
        assert_eq!(
            run.recorded_sent(&c.id).await,
            s.delivered as i64,
            "{}: delivery_seconds == sink",
            c.id
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_campaigns_than_slots_all_complete_with_at_most_100_active() {
    let campaigns: Vec<(f64, usize)> = (0..120).map(|_| (1000.0, 20)).collect();
    let mut run = start(&campaigns, None, &[]).await;
    run.wait_all_delivered(Duration::from_secs(60)).await;
    let max_active = run.tw.worker().scheduler_stats.borrow().max_active_seen;
    run.stop().await;
    assert_eq!(run.sink.summary().distinct_delivered, run.total());
    assert!(
        max_active <= 100,
        "{max_active} campaigns were active at once"
    );
    assert!(max_active > 1, "campaigns ran concurrently");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_rate_change_in_the_table_reaches_the_sink_within_a_second() {
    let _serial = pacing_lock().await;
    let mut run = start(&[(100.0, 3000)], Some(Algorithm::Gcra), &[]).await;
    let id = run.plan.campaigns[0].id.clone();
    // Let it run at 100/s for 2 s (joining the group comes first), then raise the rate
    // with plain SQL.
    wait_for("200 sends at 100/s", GROUP_JOIN_LIMIT, || {
        run.sink.campaign(&id).is_some_and(|c| c.delivered >= 200)
    })
    .await;
    sqlx::query("UPDATE campaigns SET send_rate = 400 WHERE id = $1")
        .bind(&id)
        .execute(&run.tw.pool)
        .await
        .unwrap();
    // The sink's clock at the change: its latest arrival (one arrives every 10 ms).
    let changed_at = run.sink.arrivals().iter().map(|a| a.at).max().unwrap();
    run.wait_all_delivered(Duration::from_secs(30)).await;
    run.stop().await;
    let per_second: Vec<Duration> = run
        .sink
        .arrivals()
        .iter()
        .filter(|a| *a.campaign_id == *id)
        .map(|a| a.at)
        .collect();
    // From 1 s after the change, the rate seen over the next full second is near 400/s.
    let from = changed_at + Duration::from_secs(1);
    let in_next_second = per_second
        .iter()
        .filter(|t| **t >= from && **t < from + Duration::from_secs(1))
        .count();
    assert!(
        (350..=410).contains(&in_next_second),
        "{in_next_second} sends in the second after the change took effect"
    );
    assert_eq!(run.sink.summary().distinct_delivered, run.total());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_global_rate_is_shared_max_min_fairly() {
    let _serial = pacing_lock().await;
    // 10 campaigns asking 500/s each under a 1000/s global cap: 100/s each.
    let campaigns: Vec<(f64, usize)> = (0..10).map(|_| (500.0, 2000)).collect();
    let mut run = start(
        &campaigns,
        Some(Algorithm::Gcra),
        &[("limiter.global_rate", "1000".to_string())],
    )
    .await;
    // Measure a 4 s window once every campaign has sent for a second at its share.
    wait_for(
        "every campaign sending at its share",
        GROUP_JOIN_LIMIT,
        || {
            run.plan
                .campaigns
                .iter()
                .all(|c| run.sink.campaign(&c.id).is_some_and(|s| s.delivered >= 100))
        },
    )
    .await;
    // Counted on the worker's release stamps, not on arrival: the transport's jitter is
    // not pushpace's pacing.
    let released = |a: &pushpace::tools::sink::Arrival| a.released.expect("release stamp");
    let from = run.sink.arrivals().iter().map(released).max().unwrap();
    // A second past the window, so that every push released in it has arrived.
    tokio::time::sleep(Duration::from_secs(5)).await;
    let to = from + Duration::from_secs(4);
    let arrivals = run.sink.arrivals();
    run.stop().await;
    let rates: Vec<f64> = run
        .plan
        .campaigns
        .iter()
        .map(|c| {
            let n = arrivals
                .iter()
                .filter(|a| *a.campaign_id == *c.id && (from..to).contains(&released(a)))
                .count();
            n as f64 / 4.0
        })
        .collect();
    let total: f64 = rates.iter().sum::<f64>() * 4.0;
    assert!(
        rates.iter().all(|r| (95.0..=105.0).contains(r)),
        "rates {rates:?}/s, each expected 100/s ± 5%"
    );
    assert!(
        total / 4.0 <= 1000.0 * 1.02 + 1.0,
        "global cap exceeded: {total} in 4 s"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_messages_are_dead_lettered_and_valid_jobs_around_them_delivered() {
    let mut tw = TestWorker::options().partitions(2).prepare().await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let producer = Producer::new();
    let campaign = unique_name("bad").replace('_', "-");
    let valid = |i: usize| {
        let devices = [format!("d{i}a"), format!("d{i}b")];
        job_at(&format!("{campaign}-j{i}"), &campaign, 1000.0, &devices).to_json()
    };
    // (what, message, kind, what the reason must name)
    let bad: Vec<(&str, Vec<u8>, &str, &str)> = vec![
        ("not json", b"{not json".to_vec(), "malformed_job", "not valid JSON"),
        ("invalid utf-8", vec![0xff, 0xfe, 0x7b], "malformed_job", "not valid UTF-8"),
        ("no devices", format!(r#"{{"job_id":"x1","campaign_id":"{campaign}","devices":[],"payload":{{}}}}"#).into_bytes(), "invalid_job", "devices"),
        ("zero rate", format!(r#"{{"job_id":"x2","campaign_id":"{campaign}","send_rate":0,"devices":["a"],"payload":{{}}}}"#).into_bytes(), "invalid_job", "send_rate"),
        ("sql in id", format!(r#"{{"job_id":"x'; DROP TABLE campaigns;--","campaign_id":"{campaign}","devices":["a"],"payload":{{}}}}"#).into_bytes(), "invalid_job", "job_id"),
        // A message over 1 MiB cannot pass this broker (its message.max.bytes is about
        // 1 MiB too); the decoder's own limit is covered in job::tests.
        ("over 4 KiB payload", oversized(8 * 1024), "invalid_job", "payload"),
    ];
    let mut expected_valid = 0;
    // Where each bad message landed, as the broker acknowledged it.
    let mut bad_at = Vec::new();
    for (i, (_, value, _, _)) in bad.iter().enumerate() {
        for (j, v) in [valid(2 * i), value.clone(), valid(2 * i + 1)]
            .iter()
            .enumerate()
        {
            let at = producer
                .send(&topic, Record::of(v).key(campaign.as_bytes()))
                .await;
            if j == 1 {
                bad_at.push(at);
            }
        }
        expected_valid += 2;
    }
    tw.start().await;
    let worker = tw.take_worker();
    let end = Instant::now() + Duration::from_secs(60);
    while sink.summary().distinct_delivered < expected_valid * 2 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    worker.shutdown().await.unwrap();
    assert_eq!(
        sink.summary().distinct_delivered,
        expected_valid * 2,
        "every valid job delivered"
    );
    let letters = pushpace::store::dead_letters::list(&pool, None, None, 100)
        .await
        .unwrap();
    assert_eq!(
        letters.len(),
        bad.len(),
        "one dead letter per bad message: {letters:#?}"
    );
    // Each bad message has its own letter: the one at its partition and offset, of its
    // kind, keeping its bytes, with a reason that names the problem.
    for ((name, value, kind, names), (partition, offset)) in bad.iter().zip(&bad_at) {
        let at: Vec<_> = letters
            .iter()
            .filter(|l| l.topic == topic && l.partition == *partition && l.kafka_offset == *offset)
            .collect();
        assert_eq!(
            at.len(),
            1,
            "{name}: one dead letter at {partition}/{offset}: {letters:#?}"
        );
        let l = at[0];
        assert_eq!(l.kind.as_str(), *kind, "{name}: {l:?}");
        assert_eq!(l.raw_len, value.len(), "{name}: the raw message is kept");
        assert_eq!(
            &l.raw_prefix[..],
            &value[..value.len().min(l.raw_prefix.len())],
            "{name}: the raw message is kept"
        );
        assert!(l.reason.contains(names), "{name}: reason {:?}", l.reason);
    }
    // The SQL meta-characters were stored as data, and the table is still there.
    let campaigns: i64 = sqlx::query_scalar("SELECT count(*) FROM campaigns")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(campaigns, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_provider_trouble_loses_nothing_and_keeps_the_rate() {
    use pushpace::tools::sink::{Behaviour, RetryAfter};
    let _serial = pacing_lock().await;
    let rate = 200.0;
    let mut run = start(
        &[(rate, 1600)],
        Some(Algorithm::Gcra),
        &[("sender.retry_base_ms", "50".into())],
    )
    .await;
    let id = run.plan.campaigns[0].id.clone();
    // The trouble starts once the campaign sends (the group's join takes a while).
    wait_for("100 sends before the trouble", GROUP_JOIN_LIMIT, || {
        run.sink.campaign(&id).is_some_and(|s| s.delivered >= 100)
    })
    .await;
    run.sink.set_behaviour(Behaviour::TooManyRequests {
        retry_after: Some(RetryAfter::Seconds(1)),
    });
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.sink.set_behaviour(Behaviour::ServerError);
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.sink.set_behaviour(Behaviour::Normal);
    run.wait_all_delivered(Duration::from_secs(60)).await;
    run.stop().await;
    let s = run.sink.campaign(&id).unwrap();
    assert_eq!(s.distinct_delivered, run.total(), "nothing lost");
    assert!(s.requests > s.delivered, "the trouble caused retries");
    // Retries count against the rate: every request, whatever its answer.
    crate::helpers::assert_paced(&run.sink, &id, rate);
    let retried: i64 = sqlx::query_scalar(
        "SELECT sum(retried)::bigint FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(&id)
    .fetch_one(&run.tw.pool)
    .await
    .unwrap();
    assert_eq!(retried as u64, s.requests - s.delivered, "retries recorded");
}

/// Answers slower than the sender's timeout, then connections reset without an answer:
/// every push is retried until delivered, retries count against the rate, and the
/// recorded totals are exactly the devices (a push the sink answered after the sender
/// gave up is a duplicate at the sink, never a second count).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_slow_and_reset_provider_loses_nothing_and_keeps_the_rate() {
    use pushpace::tools::sink::Behaviour;
    let _serial = pacing_lock().await;
    let rate = 200.0;
    let mut run = start(
        &[(rate, 1600)],
        Some(Algorithm::Gcra),
        &[
            ("sender.retry_base_ms", "50".into()),
            ("sender.timeout_ms", "300".into()),
        ],
    )
    .await;
    let id = run.plan.campaigns[0].id.clone();
    // The trouble starts once the campaign sends (the group's join takes a while).
    wait_for("100 sends before the trouble", GROUP_JOIN_LIMIT, || {
        run.sink.campaign(&id).is_some_and(|s| s.delivered >= 100)
    })
    .await;
    run.sink.set_behaviour(Behaviour::Slow { delay_ms: 1000 });
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.sink.set_behaviour(Behaviour::Reset);
    tokio::time::sleep(Duration::from_secs(2)).await;
    run.sink.set_behaviour(Behaviour::Normal);
    run.wait_all_delivered(Duration::from_secs(60)).await;
    run.stop().await;
    let s = run.sink.campaign(&id).unwrap();
    assert_eq!(s.distinct_delivered, run.total(), "nothing lost");
    assert!(
        s.requests > s.distinct_delivered + 100,
        "the trouble caused retries: {} requests for {} devices",
        s.requests,
        s.distinct_delivered
    );
    // Retries count against the rate: every request, whatever its answer.
    crate::helpers::assert_paced(&run.sink, &id, rate);
    let (sent, failed): (i64, i64) = sqlx::query_as(
        "SELECT sum(sent)::bigint, sum(failed)::bigint FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(&id)
    .fetch_one(&run.tw.pool)
    .await
    .unwrap();
    assert_eq!(sent as u64, run.total(), "each device recorded once");
    assert_eq!(failed, 0, "transient trouble is retried, not failed");
}

/// A device that keeps failing transiently is given up only when it has had
/// `max_attempts` AND `give_up_after` has passed since its first failure; it is then
/// dead-lettered with a reason that says so, and counted as failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_failing_past_its_give_up_budget_is_dead_lettered_with_the_reason() {
    use pushpace::tools::sink::Behaviour;
    let mut run = start(
        &[(100.0, 5)],
        Some(Algorithm::Gcra),
        &[
            ("sender.max_attempts", "2".into()),
            ("sender.give_up_after_ms", "1500".into()),
            ("sender.retry_base_ms", "50".into()),
            ("sender.retry_max_ms", "200".into()),
        ],
    )
    .await;
    // Joining the group takes seconds on this broker: nothing is sent before this.
    run.sink.set_behaviour(Behaviour::ServerError);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut reasons: Vec<String> = Vec::new();
    while Instant::now() < deadline && reasons.len() < 5 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        reasons =
            sqlx::query_scalar("SELECT reason FROM dead_letters WHERE kind = 'undeliverable'")
                .fetch_all(&run.tw.pool)
                .await
                .unwrap();
    }
    run.stop().await;
    assert_eq!(reasons.len(), 5, "every device given up once: {reasons:?}");
    let id = run.plan.campaigns[0].id.clone();
    let s = run.sink.campaign(&id).unwrap();
    // Two attempts would fit in 50 ms; the budget of 1.5 s at ≤ 200 ms per retry
    // means several more before giving up.
    assert!(
        s.requests >= 5 * 4,
        "retried past max_attempts until the budget ran out: {} requests",
        s.requests
    );
    for r in &reasons {
        assert!(
            r.starts_with("gave up after ") && r.contains("HTTP 500"),
            "{r}"
        );
        let secs: f64 = r
            .split(" over ")
            .nth(1)
            .and_then(|t| t.split(" s;").next())
            .and_then(|t| t.parse().ok())
            .unwrap_or(-1.0);
        assert!(secs >= 1.5, "given up only after the budget: {r}");
    }
    let failed: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(failed), 0)::bigint FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(&id)
    .fetch_one(&run.tw.pool)
    .await
    .unwrap();
    assert_eq!(failed, 5);
}

/// A job whose payload makes the message `size` bytes long.
fn oversized(size: usize) -> Vec<u8> {
    let mut v =
        br#"{"job_id":"big","campaign_id":"big","devices":["a"],"payload":{"pad":""#.to_vec();
    v.resize(size - 3, b'x');
    v.extend_from_slice(br#""}}"#);
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_mid_run_then_restart_loses_nothing() {
    let (_pool, db_url) = fresh_database().await;
    let topic = fresh_topic(4).await;
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let run_id = unique_name("term").replace('_', "-");
    let plan = ProducePlan {
        campaigns: vec![PlannedCampaign {
            id: format!("{run_id}-c"),
            send_rate: Rate::per_second(500.0).unwrap(),
            devices: 3000,
        }],
        job_size: 200,
        algorithm: Some(Algorithm::Gcra),
        run_id,
    };
    produce_plan(&topic, &plan).await;
    let group = unique_name("g");

    let mut first =
        crate::helpers::spawn_worker_process(&brokers(), &topic, &group, &db_url, &sink.url(), &[]);
    // Wait until it is sending, then stop it mid-run.
    let end = Instant::now() + Duration::from_secs(30);
    while sink.summary().delivered < 800 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let status = crate::helpers::sigterm_and_wait(&mut first);
    assert!(status.success(), "graceful exit after SIGTERM: {status}");
    let at_stop = sink.summary().distinct_delivered;
    assert!(at_stop < 3000, "stopped mid-run ({at_stop} delivered)");

    let mut second =
        crate::helpers::spawn_worker_process(&brokers(), &topic, &group, &db_url, &sink.url(), &[]);
    let end = Instant::now() + Duration::from_secs(60);
    while sink.summary().distinct_delivered < 3000 && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let status = crate::helpers::sigterm_and_wait(&mut second);
    assert!(status.success(), "{status}");
    let s = sink.summary();
    assert_eq!(s.distinct_delivered, 3000, "no device missing");
    // Duplicates are bounded by the sends in flight at the signal (max_in_flight = 8).
    assert!(s.duplicates <= 8, "{} duplicates", s.duplicates);
}
