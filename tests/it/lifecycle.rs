//! Campaign lifecycle through the real worker, tansu and PostgreSQL: weights under a
//! cap that binds.

use crate::helpers::{
    brokers, fresh_database, fresh_topic, pacing_lock, sink_worker_settings, unique_name, wait_for,
};
use pushpace::limiter::Algorithm;
use pushpace::produce::ProducePlan;
use pushpace::sender::{AnySender, HttpSender, HttpSenderConfig};
use pushpace::sink::{Sink, SinkConfig};
use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch};
use pushpace::worker::Worker;
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
    let (pool, db_url) = fresh_database().await;
    let topic = fresh_topic(8).await;
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
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
    pushpace::produce::produce(&brokers(), &topic, &plan, |_| {})
        .await
        .expect("produce");
    let settings = sink_worker_settings(
        &topic,
        &db_url,
        &sink.url(),
        &[("limiter.global_rate", "600".into())],
    );
    let sender = AnySender::Http(HttpSender::new(&HttpSenderConfig::new(sink.url())).unwrap());
    let worker = Worker::start(&settings, pool.clone(), brokers(), sender)
        .await
        .expect("start worker");
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
