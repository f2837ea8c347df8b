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

use crate::config::{ConfigError, KafkaSettings};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::config::ClientConfig;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use secrecy::ExposeSecret;
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
    /// No broker could be reached or it refused us; `cause` is librdkafka's own reason.
    #[error("cannot connect to the Kafka brokers {brokers}: {cause}")]
    Connect { brokers: String, cause: String },
}

/// Base client settings shared by consumers, producers and admin clients: the
/// connection keys of `[kafka]` (TLS, SASL, `[kafka.properties]`) included, so that every
/// client pushpace makes connects the same way.
pub fn client_config(kafka: &KafkaSettings, bootstrap: &str) -> ClientConfig {
    let mut c = ClientConfig::new();
    c.set("bootstrap.servers", bootstrap)
        .set("client.id", "pushpace")
        // Fail fast on a dead broker in admin calls; consumers and producers reconnect.
        .set("socket.timeout.ms", "10000")
        .set("reconnect.backoff.max.ms", "2000");
    if bootstrap_is_embedded(kafka, bootstrap) {
        return c;
    }
    for (k, v) in kafka.properties.iter() {
        c.set(k, v);
    }
    apply_security(kafka, &mut c);
    c
}

/// The in-process mock cluster speaks plaintext only, whatever the settings say.
fn bootstrap_is_embedded(kafka: &KafkaSettings, bootstrap: &str) -> bool {
    let _ = bootstrap;
    kafka.is_embedded()
}

fn apply_security(kafka: &KafkaSettings, c: &mut ClientConfig) {
    let p = kafka.security_protocol;
    c.set("security.protocol", p.as_str());
    if p.uses_sasl() {
        if let Some(m) = kafka.sasl_mechanism {
            c.set("sasl.mechanism", m.as_str());
        }
        if let Some(u) = &kafka.sasl_username {
            c.set("sasl.username", u);
        }
        if let Some(pw) = &kafka.sasl_password {
            c.set("sasl.password", pw.expose_secret());
        }
    }
    if p.uses_tls() {
        let files = [
            ("ssl.ca.location", &kafka.ssl_ca_file),
            ("ssl.certificate.location", &kafka.ssl_cert_file),
            ("ssl.key.location", &kafka.ssl_key_file),
        ];
        for (name, file) in files {
            if let Some(path) = file {
                c.set(name, path.to_string_lossy());
            }
        }
        if let Some(pw) = &kafka.ssl_key_password {
            c.set("ssl.key.password", pw.expose_secret());
        }
        let check = if kafka.ssl_endpoint_identification {
            "https"
        } else {
            "none"
        };
        c.set("ssl.endpoint.identification.algorithm", check);
    }
}

/// Checks `[kafka.properties]` and the connection keys with librdkafka itself: an
/// unknown property or a bad value is refused at start-up, naming the key (never the
/// value, which may be a secret).
pub fn check_properties(kafka: &KafkaSettings) -> Result<(), ConfigError> {
    match client_config(kafka, &kafka.brokers).create_native_config() {
        Ok(_) => Ok(()),
        Err(KafkaError::ClientConfig(_, desc, key, _value)) => {
            let shown = if kafka.properties.iter().any(|(k, _)| k == key) {
                format!("kafka.properties.{key}")
            } else {
                format!("kafka ({key})")
            };
            Err(crate::config::invalid_key(
                shown,
                format!("librdkafka: {desc}"),
            ))
        }
        Err(e) => Err(crate::config::invalid_key("kafka", e.to_string())),
    }
}

/// A consumer-group member that stores offsets only when told to.
pub fn consumer_config(settings: &KafkaSettings, bootstrap: &str) -> ClientConfig {
    let mut c = client_config(settings, bootstrap);
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
pub fn producer_config(kafka: &KafkaSettings, bootstrap: &str) -> ClientConfig {
    let mut c = client_config(kafka, bootstrap);
    c.set("acks", "all")
        .set("message.timeout.ms", "30000")
        .set("linger.ms", "5");
    c
}

/// Creates `topic` with `partitions` partitions if it does not exist yet.
pub async fn ensure_topic(
    kafka: &KafkaSettings,
    bootstrap: &str,
    topic: &str,
    partitions: i32,
) -> Result<(), BrokerError> {
    let admin: AdminClient<DefaultClientContext> = client_config(kafka, bootstrap).create()?;
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

/// Asks the broker for metadata: the readiness probe of the broker, and the start-up
/// check. On failure the error names the brokers and the cause librdkafka reported (a
/// refused password, an untrusted certificate, a name mismatch), not only "timed out".
pub fn ping(
    kafka: &KafkaSettings,
    bootstrap: &str,
    timeout: Duration,
) -> Result<usize, BrokerError> {
    let consumer: BaseConsumer<LastError> =
        client_config(kafka, bootstrap).create_with_context(LastError::default())?;
    match consumer.fetch_metadata(None, timeout) {
        Ok(md) => Ok(md.brokers().len()),
        Err(e) => {
            // librdkafka hands its error events (authentication, TLS) to the context only
            // when the client is polled; a metadata call does not poll.
            for _ in 0..64 {
                let _ = consumer.poll(Duration::ZERO);
            }
            let cause = consumer.context().take().unwrap_or_else(|| e.to_string());
            Err(BrokerError::Connect {
                brokers: bootstrap.to_string(),
                cause,
            })
        }
    }
}

/// The start-up check: one metadata round trip within `kafka.session_timeout_ms`, so a
/// wrong password, an untrusted certificate or a name mismatch stops start-up with one
/// clear error instead of a silent retry loop.
pub async fn check_connection(
    kafka: &KafkaSettings,
    bootstrap: &str,
) -> Result<usize, BrokerError> {
    let timeout = Duration::from_millis(kafka.session_timeout_ms);
    let (kafka, bootstrap) = (kafka.clone(), bootstrap.to_string());
    // librdkafka's metadata call blocks its thread.
    tokio::task::spawn_blocking(move || ping(&kafka, &bootstrap, timeout))
        .await
        .map_err(|e| BrokerError::Embedded(format!("connection check task: {e}")))?
}

/// A client context that keeps the last error librdkafka reported (authentication, TLS),
/// which a failed metadata call would otherwise hide behind a timeout.
#[derive(Default)]
pub struct LastError(parking_lot::Mutex<Option<String>>);

impl LastError {
    fn take(&self) -> Option<String> {
        self.0.lock().take()
    }
}

impl rdkafka::ClientContext for LastError {
    /// A connection's own failure (from `log`) says more than "all brokers down".
    fn error(&self, error: KafkaError, reason: &str) {
        self.0
            .lock()
            .get_or_insert_with(|| format!("{error}: {reason}"));
    }

    /// librdkafka's connection failures (`FAIL`: TLS handshake, SASL) come as logs from
    /// its own threads, at once; the error events only when the client is polled.
    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let serious = matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        );
        if serious && fac == "FAIL" {
            // "sasl_ssl://host:port/bootstrap: <cause> (after N ms in state X)"
            let cause = message.split_once(": ").map_or(message, |(_, c)| c);
            *self.0.lock() = Some(cause.to_string());
        }
        tracing::debug!(facility = fac, "librdkafka: {message}");
    }
}

impl rdkafka::consumer::ConsumerContext for LastError {}

/// The number of partitions of `topic`, or an error if the broker does not know it.
pub fn partition_count(
    kafka: &KafkaSettings,
    bootstrap: &str,
    topic: &str,
    timeout: Duration,
) -> Result<usize, BrokerError> {
    let consumer: BaseConsumer = client_config(kafka, bootstrap).create()?;
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
