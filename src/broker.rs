//! Kafka client configuration, topic creation and the embedded mock broker.
//!
//! Every rdkafka client pushpace makes is configured here, from [`KafkaSettings`], so
//! that the at-least-once rules live in one place: offsets are stored by hand
//! (`enable.auto.offset.store=false`) only after a job is finished, and the isolation
//! level is a setting (tansu on PostgreSQL 15 needs `read_uncommitted`).
//!
//! `kafka.brokers = "embedded"` starts librdkafka's in-process mock cluster
//! ([`EmbeddedBroker`]) so that the demo needs no broker install. Tests that prove
//! pushpace works with Kafka use a real broker instead.

use crate::config::KafkaSettings;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use std::time::Duration;

/// Errors at the broker boundary.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("kafka: {0}")]
    Kafka(#[from] KafkaError),
    #[error("could not create topic {topic}: {reason}")]
    CreateTopic { topic: String, reason: String },
    #[error("embedded broker: {0}")]
    Embedded(String),
}

/// Base client settings shared by consumers, producers and admin clients.
pub fn client_config(bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", "pushpace")
        // Fail fast on a dead broker in admin calls; consumers and producers reconnect.
        .set("socket.timeout.ms", "10000")
        .set("reconnect.backoff.max.ms", "2000");
    c
}

/// A consumer-group member that stores offsets only when told to.
pub fn consumer_config(settings: &KafkaSettings, bootstrap: &str) -> ClientConfig {
    let mut c = client_config(bootstrap);
    c.set("group.id", &settings.group_id)
        .set("enable.auto.commit", "false")
        .set("enable.auto.offset.store", "false")
        .set("auto.offset.reset", "earliest")
        .set("isolation.level", settings.isolation_level.as_str())
        .set(
            "session.timeout.ms",
            settings.session_timeout_ms.to_string(),
        )
        .set(
            "heartbeat.interval.ms",
            settings.heartbeat_interval_ms.to_string(),
        )
        // Also the rebalance timeout: how long the group waits for a member that died
        // without leaving (kill -9). The poll loop polls every 50 ms, so a short bound is safe.
        .set(
            "max.poll.interval.ms",
            (settings.session_timeout_ms * 2).max(10_000).to_string(),
        )
        .set(
            "partition.assignment.strategy",
            settings.assignment_strategy.as_str(),
        )
        .set("enable.partition.eof", "false")
        .set("fetch.wait.max.ms", settings.fetch_wait_max_ms.to_string());
    c
}

/// A producer that waits for all in-sync replicas, for jobs and dead letters.
pub fn producer_config(bootstrap: &str) -> ClientConfig {
    let mut c = client_config(bootstrap);
    c.set("acks", "all")
        .set("message.timeout.ms", "30000")
        .set("linger.ms", "5");
    c
}

/// Creates `topic` with `partitions` partitions if it does not exist yet.
pub async fn ensure_topic(
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<(), BrokerError> {
    let admin: AdminClient<DefaultClientContext> = client_config(bootstrap).create()?;
    let new = NewTopic::new(topic, partitions, TopicReplication::Fixed(1));
    let opts = AdminOptions::new().operation_timeout(Some(Duration::from_secs(10)));
    let results = admin.create_topics([&new], &opts).await?;
    for r in results {
        match r {
            Ok(_) => {}
            Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((name, code)) => {
                return Err(BrokerError::CreateTopic {
                    topic: name,
                    reason: code.to_string(),
                })
            }
        }
    }
    Ok(())
}

/// Asks the broker for metadata: the readiness probe of the broker.
pub fn ping(bootstrap: &str, timeout: Duration) -> Result<usize, BrokerError> {
    let consumer: BaseConsumer = client_config(bootstrap).create()?;
    let md = consumer.fetch_metadata(None, timeout)?;
    Ok(md.brokers().len())
}

/// The number of partitions of `topic`, or an error if the broker does not know it.
pub fn partition_count(
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> Result<usize, BrokerError> {
    let consumer: BaseConsumer = client_config(bootstrap).create()?;
    let md = consumer.fetch_metadata(Some(topic), timeout)?;
    Ok(md
        .topics()
        .iter()
        .find(|t| t.name() == topic && t.error().is_none())
        .map(|t| t.partitions().len())
        .unwrap_or(0))
}

/// librdkafka's in-process mock cluster, running on its own thread (the handle is not
/// `Send`). It keeps only about 5 MB per partition, so it suits the demo, not real runs.
pub struct EmbeddedBroker {
    bootstrap: String,
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl EmbeddedBroker {
    /// Starts the mock cluster and creates `topics` (name, partitions) on it.
    pub fn start(topics: &[(&str, i32)]) -> Result<Self, BrokerError> {
        let topics: Vec<(String, i32)> = topics.iter().map(|(t, p)| (t.to_string(), *p)).collect();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel::<Result<String, String>>();
        let (stop_tx, stop_rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("embedded-kafka".into())
            .spawn(move || {
                let cluster = match rdkafka::mocking::MockCluster::new(1) {
                    Ok(c) => c,
                    Err(e) => {
                        let _ = ready_tx.send(Err(e.to_string()));
                        return;
                    }
                };
                for (t, p) in &topics {
                    if let Err(e) = cluster.create_topic(t, *p, 1) {
                        let _ = ready_tx.send(Err(format!("create topic {t}: {e}")));
                        return;
                    }
                }
                let _ = ready_tx.send(Ok(cluster.bootstrap_servers()));
                // Hold the cluster until told to stop (or the handle is dropped).
                let _ = stop_rx.recv();
                drop(cluster);
            })
            .map_err(|e| BrokerError::Embedded(e.to_string()))?;
        let bootstrap = ready_rx
            .recv()
            .map_err(|_| BrokerError::Embedded("mock cluster thread died".into()))?
            .map_err(BrokerError::Embedded)?;
        Ok(Self {
            bootstrap,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// The `host:port` list clients connect to.
    pub fn bootstrap_servers(&self) -> &str {
        &self.bootstrap
    }
}

impl Drop for EmbeddedBroker {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
