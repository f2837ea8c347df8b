//! Jobs written by a third-party producer (confluent-kafka, `scripts/produce-codecs.py`)
//! with each `compression.type`, read by the real worker: every device delivered once,
//! and each campaign's count in PostgreSQL.
//!
//! tansu stores a batch's records, not its bytes: it inflates a produced batch and
//! compresses it again on fetch with the codec its attributes name. It has no snappy
//! encoder (tansu-sans-io 0.6.0 `record/deflated.rs`, `into_record_data`: gzip, lz4
//! and zstd only, else `UnexpectedType("Snappy")`), so a snappy batch breaks its fetch.
//! So none, gzip, lz4 and zstd run through tansu (the worker decodes tansu's own
//! encoding of each), and all five codecs run again through librdkafka's mock cluster,
//! which keeps the batch bytes the producer sent.

use crate::harness::TestWorker;
use crate::helpers::{fresh_database, test_settings, unique_name, wait_for};
use pushpace::sender::{AnySender, HttpSender, HttpSenderConfig};
use pushpace::tools::produce::ProducePlan;
use pushpace::tools::sink::{Sink, SinkConfig, SinkHandle};
use pushpace::worker::Worker;
use sqlx::PgPool;
use std::io::Write;
use std::time::Duration;

/// Devices per campaign, and per job (several jobs per campaign, so a batch holds more
/// than one message).
const DEVICES: usize = 240;
const JOB_SIZE: usize = 40;

/// Delivery of 5 × 240 devices at 2,000/s each takes well under a second; the rest is
/// the group join (about 3 s on the mock cluster) and a busy 2-core machine.
const DELIVERY_LIMIT: Duration = Duration::from_secs(90);

fn produce_with(bootstrap: &str, topic: &str, codec: &str, lines: &[String]) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/scripts/produce-codecs.py");
    let mut child = std::process::Command::new("python3")
        .args([script, bootstrap, topic, codec])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("python3 (confluent-kafka is installed by scripts/services.sh)");
    {
        let mut stdin = child.stdin.take().unwrap();
        for l in lines {
            writeln!(stdin, "{l}").unwrap();
        }
    }
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "produce with {codec}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The jobs of one campaign per codec, each campaign's written with its codec.
fn plan_for(codecs: &[&str]) -> (ProducePlan, Vec<Vec<String>>) {
    let run_id = unique_name("codec");
    let rates: Vec<(f64, usize)> = codecs.iter().map(|_| (2000.0, DEVICES)).collect();
    let plan = ProducePlan::with_rates(&run_id, &rates, JOB_SIZE, None).unwrap();
    let lines = plan
        .campaigns
        .iter()
        .map(|c| {
            plan.jobs()
                .filter(|j| j.campaign_id == c.id)
                .map(|j| String::from_utf8(j.to_json()).unwrap())
                .collect::<Vec<_>>()
        })
        .collect();
    (plan, lines)
}

/// Every device once at the sink, and each campaign's count in PostgreSQL.
async fn assert_delivered(plan: &ProducePlan, sink: &SinkHandle, pool: &PgPool) {
    let total = plan.total_devices() as u64;
    wait_for("every device delivered", DELIVERY_LIMIT, || {
        sink.summary().distinct_delivered >= total
    })
    .await;
    let s = sink.summary();
    assert_eq!(s.distinct_delivered, total, "{s:?}");
    assert_eq!(s.delivered, total, "no device twice: {s:?}");
    let mut want: Vec<(String, i64)> = plan
        .campaigns
        .iter()
        .map(|c| (c.id.clone(), DEVICES as i64))
        .collect();
    want.sort();
    let mut last = Vec::new();
    for _ in 0..60 {
        last = sqlx::query_as::<_, (String, i64)>(
            "SELECT campaign_id, sum(sent)::int8 FROM delivery_seconds \
             GROUP BY campaign_id ORDER BY campaign_id",
        )
        .fetch_all(pool)
        .await
        .unwrap();
        if last == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(last, want, "per-campaign sent counts in PostgreSQL");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_tansu_serves_is_decoded_and_delivered_once() {
    let codecs = ["none", "gzip", "lz4", "zstd"];
    let (plan, lines) = plan_for(&codecs);
    let mut tw = TestWorker::options().partitions(2).prepare().await;
    for (codec, jobs) in codecs.iter().zip(&lines) {
        produce_with(&tw.settings.kafka.brokers, &tw.topic, codec, jobs);
    }
    tw.start().await;
    assert_delivered(&plan, &tw.sink(), &tw.pool).await;
    tw.stop().await;
}

/// The mock cluster cannot create topics through the admin API (it times out), so the
/// topic is made with the cluster and the worker is set up here rather than by
/// [`TestWorker`], which creates its topic that way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_codec_as_the_producer_wrote_it_through_the_mock_cluster() {
    let codecs = ["none", "gzip", "snappy", "lz4", "zstd"];
    let (plan, lines) = plan_for(&codecs);
    let topic = unique_name("jobs");
    let mock = pushpace::broker::EmbeddedBroker::start(&[(&topic, 2)]).expect("mock cluster");
    let bootstrap = mock.bootstrap_servers().to_string();
    for (codec, jobs) in codecs.iter().zip(&lines) {
        produce_with(&bootstrap, &topic, codec, jobs);
    }
    let (pool, db_url) = fresh_database().await;
    let sink = Sink::start(SinkConfig::default()).await.expect("sink");
    let settings = test_settings(&[
        ("kafka.brokers", bootstrap.clone()),
        ("kafka.topic", topic.clone()),
        ("kafka.group_id", unique_name("g")),
        ("database.url", db_url),
        ("worker.stats_flush_ms", "200".into()),
        ("sender.url", sink.url()),
    ]);
    let sender = AnySender::Http(HttpSender::new(&HttpSenderConfig::new(sink.url())).unwrap());
    let worker = Worker::start(
        &settings,
        pool.clone(),
        bootstrap,
        std::sync::Arc::from(pushpace::provider::Providers::from(sender)),
    )
    .await
    .expect("start worker");
    assert_delivered(&plan, &sink, &pool).await;
    worker.shutdown().await.expect("graceful shutdown");
    drop(mock);
}
