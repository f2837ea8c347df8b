//! A revocation whose drain times out, followed by the same partitions coming back: the
//! jobs read again must wait for the revoked sends, never be dropped (docs/RELIABILITY.md,
//! "Revocation"). Through the real worker, broker, database and sink.

use crate::harness::{produce_spread, TestWorker};
use crate::helpers::{brokers, fresh_topic, unique_name, wait_for};
use pushpace::limiter::Algorithm;
use pushpace::sender::{AnySender, HttpSender, HttpSenderConfig};
use pushpace::tools::produce::ProducePlan;
use pushpace::tools::sink::{Behaviour, Sink, SinkConfig, SinkHandle};
use rdkafka::consumer::{BaseConsumer, Consumer};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The drain the worker gives a revocation: far shorter than the stall.
const DRAIN_TIMEOUT_MS: u64 = 500;
/// How long the stalled pushes go unanswered: past the drain, the rest of the
/// rebalance (tansu answers in steps of the 1 s heartbeat) and the re-read jobs' lookups.
const STALL: Duration = Duration::from_secs(20);
/// The test's provider gives a send this long: past the stall, so the stalled sends
/// stay in flight. Built by the test, not from the settings: the settings' own check
/// (drain_timeout_ms at least every provider's timeout_ms) does not see it, so a send
/// outlasts the drain as nothing configured can.
const SEND_TIMEOUT: Duration = Duration::from_secs(60);
/// Sends in flight at most: the stalled pushes fill the pool.
const IN_FLIGHT: u64 = 8;
/// How long the group may take to settle (tansu rebalances in steps of the members'
/// heartbeats; the same limit as the other group tests).
const GROUP_LIMIT: Duration = Duration::from_secs(60);
/// After the stall, what is left (about 1,000 devices at 2 × 100/s) is sent in about
/// 5 s; the rest is slack for the shared cores.
const DELIVERY_LIMIT: Duration = Duration::from_secs(60);
/// Commits run every second (kafka.commit_interval_ms); a few intervals of slack.
const COMMIT_LIMIT: Duration = Duration::from_secs(10);

/// A member of the worker's group that subscribes to a topic of its own: its joining
/// makes an eager rebalance that revokes every partition of the worker and gives them
/// all back. Polled on a thread of its own until dropped.
struct OtherMember {
    consumer: Arc<BaseConsumer>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl OtherMember {
    async fn join(tw: &TestWorker) -> Self {
        let own_topic = fresh_topic(1).await;
        let config = pushpace::broker::consumer_config(&tw.settings.kafka, &brokers());
        let consumer: Arc<BaseConsumer> = Arc::new(config.create().expect("consumer"));
        consumer.subscribe(&[&own_topic]).expect("subscribe");
        let stop = Arc::new(AtomicBool::new(false));
        let (c, s) = (consumer.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                let _ = c.poll(Duration::from_millis(50));
            }
        });
        Self {
            consumer,
            stop,
            thread: Some(thread),
        }
    }

    /// Whether the group gave it its own topic's partition (the rebalance is through).
    fn assigned(&self) -> bool {
        self.consumer.assignment().is_ok_and(|a| a.count() > 0)
    }
}

impl Drop for OtherMember {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The group's committed offsets as the broker has them, by partition.
fn group_committed(tw: &TestWorker, partitions: i32) -> Vec<(i32, i64)> {
    let config = pushpace::broker::consumer_config(&tw.settings.kafka, &brokers());
    let consumer: BaseConsumer = config.create().expect("consumer");
    let mut tpl = rdkafka::TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(&tw.topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .map(|e| (e.partition(), e.offset().to_raw().unwrap_or(-1)))
        .collect()
}

/// Each partition's end offset (read without joining the group).
fn end_offsets(tw: &TestWorker, partitions: i32) -> Vec<(i32, i64)> {
    let config = pushpace::broker::consumer_config(&tw.settings.kafka, &brokers());
    let consumer: BaseConsumer = config.create().expect("consumer");
    (0..partitions)
        .map(|p| {
            let (_, high) = consumer
                .fetch_watermarks(&tw.topic, p, Duration::from_secs(10))
                .expect("watermarks");
            (p, high)
        })
        .collect()
}

async fn start_worker(sink: &SinkHandle, plan: &ProducePlan) -> TestWorker {
    let mut config = HttpSenderConfig::new(sink.url());
    config.timeout = SEND_TIMEOUT;
    let sender = AnySender::Http(HttpSender::new(&config).expect("sender"));
    let ms = DRAIN_TIMEOUT_MS.to_string();
    let mut tw = TestWorker::options()
        .partitions(2)
        .providers(sender.into())
        .settings(&[
            ("kafka.assignment_strategy", "range".into()),
            ("worker.drain_timeout_ms", ms.clone()),
            // What the settings' check compares the drain with (the provider's real
            // timeout is SEND_TIMEOUT).
            ("sender.timeout_ms", ms),
            ("sender.max_in_flight", IN_FLIGHT.to_string()),
        ])
        .prepare()
        .await;
    produce_spread(&tw.topic, plan, 2).await;
    tw.start().await;
    tw
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn partitions_given_back_while_their_revoked_sends_stall_lose_no_job() {
    // The worker's log, shown if the test fails (rebalances, drains, commits).
    let _ = tracing_subscriber::fmt()
        .with_env_filter("warn,pushpace=info")
        .with_test_writer()
        .try_init();
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let run_id = unique_name("rv").replace('_', "-");
    let plan = ProducePlan::with_rates(
        &run_id,
        &[(100.0, 600), (100.0, 600)],
        50,
        Some(Algorithm::Gcra),
    )
    .unwrap();
    let total = plan.total_devices() as u64;
    let mut tw = start_worker(&sink, &plan).await;
    wait_for("the first sends", GROUP_LIMIT, || {
        sink.summary().distinct_delivered >= 100
    })
    .await;
    // The next pushes stall: the pool fills with sends that outlast the drain.
    let before = sink.request_count();
    sink.set_behaviour_for(
        Behaviour::Slow {
            delay_ms: STALL.as_millis() as u64,
        },
        IN_FLIGHT,
    );
    let stalled_at = Instant::now();
    wait_for(
        "the pool full of stalled sends",
        Duration::from_secs(10),
        || sink.request_count() >= before + IN_FLIGHT,
    )
    .await;
    let read = tw.worker().consumer_stats.borrow().jobs_received;
    let other = OtherMember::join(&tw).await;
    // The rebalance is through and the worker read its partitions again.
    wait_for(
        "the partitions given back and read again",
        GROUP_LIMIT,
        || other.assigned() && tw.worker().consumer_stats.borrow().jobs_received > read,
    )
    .await;
    assert!(
        stalled_at.elapsed() < STALL,
        "the rebalance outlasted the stall ({:?}): the test shows nothing",
        stalled_at.elapsed()
    );
    // Every device is delivered once the stalled sends are back.
    let end = Instant::now() + STALL + DELIVERY_LIMIT;
    while sink.summary().distinct_delivered < total && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let delivered = sink.summary().distinct_delivered;
    // And the group's committed offsets reach each partition's end.
    let ends = end_offsets(&tw, 2);
    let end = Instant::now() + COMMIT_LIMIT;
    let mut committed = group_committed(&tw, 2);
    while committed != ends && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(200)).await;
        committed = group_committed(&tw, 2);
    }
    eprintln!("delivered {delivered} of {total}; committed {committed:?}, ends {ends:?}");
    drop(other);
    tw.stop().await;
    assert_eq!(delivered, total, "devices lost across the rebalance");
    assert_eq!(
        committed, ends,
        "committed offsets stuck behind dropped jobs"
    );
}
