//! The worker pipeline end to end, against the real tansu broker, real PostgreSQL and a
//! real loopback HTTP sink that timestamps every request.

use crate::helpers::{
    brokers, fresh_database, fresh_topic, pacing_lock, test_settings, unique_name,
};
use pushpace::limiter::{Algorithm, Rate};
use pushpace::produce::{PlannedCampaign, ProducePlan};
use pushpace::sender::{AnySender, HttpSender, HttpSenderConfig};
use pushpace::sink::{Sink, SinkConfig, SinkHandle};
use pushpace::worker::Worker;
use sqlx::PgPool;
use std::time::{Duration, Instant};

struct Run {
    pool: PgPool,
    sink: SinkHandle,
    worker: Option<Worker>,
    plan: ProducePlan,
}

async fn start(
    campaigns: &[(f64, usize)],
    algorithm: Option<Algorithm>,
    extra: &[(&str, String)],
) -> Run {
    let (pool, db_url) = fresh_database().await;
    let topic = fresh_topic(8).await;
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let run_id = unique_name("r");
    let plan = ProducePlan {
        campaigns: campaigns
            .iter()
            .enumerate()
            .map(|(i, (rate, devices))| PlannedCampaign {
                id: format!("{run_id}-c{i}"),
                send_rate: Rate::per_second(*rate).unwrap(),
                devices: *devices,
            })
            .collect(),
        job_size: 250,
        algorithm,
        run_id: run_id.clone(),
    };
    pushpace::produce::produce(&brokers(), &topic, &plan, |_| {})
        .await
        .expect("produce");
    let mut overrides = vec![
        ("kafka.brokers", brokers()),
        ("kafka.topic", topic),
        ("kafka.group_id", unique_name("g")),
        ("database.url", db_url),
        ("sender.url", sink.url()),
        ("worker.stats_flush_ms", "200".to_string()),
    ];
    overrides.extend(extra.iter().cloned());
    let settings = test_settings(&overrides);
    let sender = AnySender::Http(HttpSender::new(&HttpSenderConfig::new(sink.url())).unwrap());
    let worker = Worker::start(&settings, pool.clone(), brokers(), sender)
        .await
        .expect("start worker");
    Run {
        pool,
        sink,
        worker: Some(worker),
        plan,
    }
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

    async fn stop(&mut self) {
        if let Some(w) = self.worker.take() {
            w.shutdown().await.expect("graceful shutdown");
        }
    }

    async fn recorded_sent(&self, campaign: &str) -> i64 {
        sqlx::query_scalar::<_, Option<i64>>(
            "SELECT sum(sent)::bigint FROM delivery_seconds WHERE campaign_id = $1",
        )
        .bind(campaign)
        .fetch_one(&self.pool)
        .await
        .unwrap()
        .unwrap_or(0)
    }
}

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
        let max_1s = run.sink.max_in_window(&c.id, Duration::from_secs(1));
        // burst is 0; +1 covers two arrivals whose spacing the network shortened.
        let bound = (rate * 1.02).floor() as u64 + 1;
        assert!(
            max_1s <= bound,
            "{}: {max_1s} in a 1 s window > {bound}",
            c.id
        );
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
    let max_active = run
        .worker
        .as_ref()
        .unwrap()
        .scheduler_stats
        .borrow()
        .max_active_seen;
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
    // Let it run at 100/s, then raise the rate with plain SQL.
    tokio::time::sleep(Duration::from_secs(3)).await;
    sqlx::query("UPDATE campaigns SET send_rate = 400 WHERE id = $1")
        .bind(&id)
        .execute(&run.pool)
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
