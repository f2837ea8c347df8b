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

/// CRC-32C (Castagnoli), the RecordBatch checksum.
fn crc32c(bytes: &[u8]) -> u32 {
    let mut crc = !0u32;
    for &b in bytes {
        crc ^= u32::from(b);
        for _ in 0..8 {
            crc = if crc & 1 == 1 {
                (crc >> 1) ^ 0x82F6_3B78
            } else {
                crc >> 1
            };
        }
    }
    !crc
}

/// A RecordBatch (magic 2) of one record whose attributes say zstd and whose payload is
/// not zstd; its CRC is right, so only the decompression fails.
fn corrupt_zstd_batch() -> Vec<u8> {
    let mut after_crc = Vec::new();
    after_crc.extend_from_slice(&4i16.to_be_bytes()); // attributes: zstd
    after_crc.extend_from_slice(&0i32.to_be_bytes()); // last offset delta
    after_crc.extend_from_slice(&0i64.to_be_bytes()); // base timestamp
    after_crc.extend_from_slice(&0i64.to_be_bytes()); // max timestamp
    after_crc.extend_from_slice(&(-1i64).to_be_bytes()); // producer id
    after_crc.extend_from_slice(&(-1i16).to_be_bytes()); // producer epoch
    after_crc.extend_from_slice(&(-1i32).to_be_bytes()); // base sequence
    after_crc.extend_from_slice(&1i32.to_be_bytes()); // records
    after_crc.extend_from_slice(&[0xAB; 64]); // "compressed" records: garbage
    let mut batch = Vec::new();
    batch.extend_from_slice(&0i64.to_be_bytes()); // base offset (the broker sets it)
    let length = 4 + 1 + 4 + after_crc.len();
    batch.extend_from_slice(&(length as i32).to_be_bytes());
    batch.extend_from_slice(&(-1i32).to_be_bytes()); // partition leader epoch
    batch.push(2); // magic
    batch.extend_from_slice(&crc32c(&after_crc).to_be_bytes());
    batch.extend_from_slice(&after_crc);
    batch
}

/// One ProduceRequest (v3) of `records` to `topic`/`partition`, over a plain socket:
/// no client library would write a batch it cannot decode.
async fn produce_raw(bootstrap: &str, topic: &str, partition: i32, records: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut body = Vec::new();
    body.extend_from_slice(&0i16.to_be_bytes()); // Produce
    body.extend_from_slice(&3i16.to_be_bytes()); // v3
    body.extend_from_slice(&7i32.to_be_bytes()); // correlation id
    body.extend_from_slice(&3i16.to_be_bytes());
    body.extend_from_slice(b"raw");
    body.extend_from_slice(&(-1i16).to_be_bytes()); // no transactional id
    body.extend_from_slice(&(-1i16).to_be_bytes()); // acks=all
    body.extend_from_slice(&5000i32.to_be_bytes());
    body.extend_from_slice(&1i32.to_be_bytes()); // one topic
    body.extend_from_slice(&(topic.len() as i16).to_be_bytes());
    body.extend_from_slice(topic.as_bytes());
    body.extend_from_slice(&1i32.to_be_bytes()); // one partition
    body.extend_from_slice(&partition.to_be_bytes());
    body.extend_from_slice(&(records.len() as i32).to_be_bytes());
    body.extend_from_slice(records);
    let addr = bootstrap.split(',').next().unwrap();
    let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
    s.write_all(&(body.len() as i32).to_be_bytes())
        .await
        .unwrap();
    s.write_all(&body).await.unwrap();
    let n = s.read_i32().await.expect("produce response") as usize;
    let mut resp = vec![0; n];
    s.read_exact(&mut resp).await.unwrap();
    // correlation id, topics (1), topic name, partitions (1), partition, error code.
    let at = 4 + 4 + 2 + topic.len() + 4 + 4;
    let code = i16::from_be_bytes([resp[at], resp[at + 1]]);
    assert_eq!(code, 0, "the broker refused the raw batch");
}

/// How long the held partition is watched for anything read past the batch: many of
/// librdkafka's fetch retries (`fetch.error.backoff.ms`, 500 ms) and of the worker's
/// 200 ms stats flushes.
const HOLD_WATCH: Duration = Duration::from_secs(6);

/// A batch that cannot be decoded, between good jobs in partition 0: the partition holds
/// there (the job behind it is not delivered, its offset not committed), /readyz says
/// why, the metric counts it, partition 1 keeps delivering. (The operator's way past it,
/// moving the group's offset beyond the batch, is not tested here: librdkafka's mock
/// cluster refuses a commit from outside the group, UnknownMemberId.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_batch_holds_its_partition_and_says_why() {
    pushpace::metrics::install().expect("install the metrics recorder");
    let topic = unique_name("jobs");
    let mock = pushpace::broker::EmbeddedBroker::start(&[(&topic, 2)]).expect("mock cluster");
    let bootstrap = mock.bootstrap_servers().to_string();
    let run_id = unique_name("undec");
    let job = |name: &str, campaign: &str| {
        let devices: Vec<String> = (0..5).map(|d| format!("{run_id}-{name}-{d}")).collect();
        crate::harness::job_at(&format!("{run_id}-{name}"), campaign, 1000.0, &devices)
    };
    let (before, behind, other) = (job("a", "c-held"), job("b", "c-held"), job("c", "c-other"));
    let producer = crate::harness::Producer::on(&bootstrap);
    assert_eq!(producer.job(&topic, &before, Some(0)).await, (0, 0));
    produce_raw(&bootstrap, &topic, 0, &corrupt_zstd_batch()).await;
    assert_eq!(producer.job(&topic, &behind, Some(0)).await, (0, 2));
    producer.job(&topic, &other, Some(1)).await;

    let (pool, db_url) = fresh_database().await;
    let sink = std::sync::Arc::new(Sink::start(SinkConfig::default()).await.expect("sink"));
    let group = unique_name("g");
    let overrides = vec![
        ("kafka.brokers", bootstrap.clone()),
        ("kafka.topic", topic.clone()),
        ("kafka.group_id", group.clone()),
        ("database.url", db_url.clone()),
        ("worker.stats_flush_ms", "200".into()),
        ("sender.url", sink.url()),
    ];
    let settings = test_settings(&overrides);
    let start = || async {
        let sender = AnySender::Http(HttpSender::new(&HttpSenderConfig::new(sink.url())).unwrap());
        let providers = std::sync::Arc::from(pushpace::provider::Providers::from(sender));
        Worker::start(&settings, pool.clone(), bootstrap.clone(), providers)
            .await
            .expect("start worker")
    };
    let worker = start().await;
    let view = pushpace::api::WorkerView::of(&worker);
    let api = crate::api::spawn_app_on(
        pool.clone(),
        db_url.clone(),
        crate::api::TOKEN,
        Some(view),
        None,
        &overrides,
    )
    .await;
    let s = sink.clone();
    wait_for("the jobs around the hold delivered", DELIVERY_LIMIT, || {
        s.summary().distinct_delivered >= 10
    })
    .await;
    let mut ready = api.get("/readyz").await;
    let deadline = std::time::Instant::now() + DELIVERY_LIMIT;
    while ready.status == 200 && std::time::Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        ready = api.get("/readyz").await;
    }
    assert_eq!(ready.status, 503, "{}", ready.text);
    let detail = ready.body["checks"]["consumer"]["detail"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(
        detail.contains(&format!("topic {topic} partition 0 holds at offset 1"))
            && detail.contains("zstd"),
        "{detail}"
    );
    tokio::time::sleep(HOLD_WATCH).await;
    assert_eq!(
        sink.summary().distinct_delivered,
        10,
        "nothing behind the batch"
    );
    assert_eq!(
        crate::helpers::requests_for(&sink, &format!("{run_id}-b-0")),
        0
    );
    let metrics = api.get("/metrics").await.text;
    assert!(
        metrics.contains("kafka_undecodable_batches_total{partition=\"0\"} 1"),
        "{metrics}"
    );
    worker.shutdown().await.expect("graceful shutdown");
    let committed = committed_offset(&settings, &group, &topic).await;
    assert!(
        committed <= Some(1),
        "committed past the batch: {committed:?}"
    );

    drop(mock);
}

fn group_consumer(
    settings: &pushpace::config::Settings,
    group: &str,
) -> rdkafka::consumer::BaseConsumer {
    pushpace::broker::client_config(&settings.kafka, &settings.kafka.brokers)
        .set("group.id", group)
        .set("enable.auto.commit", "false")
        .create()
        .expect("consumer")
}

async fn committed_offset(
    settings: &pushpace::config::Settings,
    group: &str,
    topic: &str,
) -> Option<i64> {
    use rdkafka::consumer::Consumer;
    let (settings, group, topic) = (settings.clone(), group.to_string(), topic.to_string());
    tokio::task::spawn_blocking(move || {
        let c = group_consumer(&settings, &group);
        let mut tpl = rdkafka::TopicPartitionList::new();
        tpl.add_partition(&topic, 0);
        let got = c
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed");
        match got.find_partition(&topic, 0).map(|e| e.offset()) {
            Some(rdkafka::Offset::Offset(o)) => Some(o),
            _ => None,
        }
    })
    .await
    .unwrap()
}
