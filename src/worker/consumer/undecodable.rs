//! A batch librdkafka cannot decode (corrupt bytes, or a codec the build lacks): the
//! partition holds, and says why.
//!
//! librdkafka keeps its fetch position on a decompression failure, so the partition
//! stops there by itself and nothing behind the batch is read or committed. It hands the
//! application only an error code, without the partition (rdkafka drops the message
//! that carries it), and again on every fetch. So the first such error (and then at
//! most every [`PROBE_EVERY`]) starts a probe on a thread of its own: a client outside
//! the group reads each assigned partition at the worker's position, and the partition
//! whose read fails the same way is the held one. Its reason goes to `/readyz` (through
//! [`super::ConsumerStats`]), to one ERROR log and to
//! `kafka_undecodable_batches_total{partition}`; it is forgotten when a later message of
//! that partition arrives (an operator moved the group's offset past it) or the
//! partition is revoked. See docs/RELIABILITY.md, "An undecodable batch".

use crate::config::KafkaSettings;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::error::KafkaError;
use rdkafka::types::RDKafkaErrorCode;
use rdkafka::{Offset, TopicPartitionList};
use std::collections::BTreeMap;
use std::sync::{mpsc, Arc};
use std::time::{Duration, Instant};

/// How often a new probe may start while undecodable errors keep coming: librdkafka
/// repeats the error on every fetch of the held partition, and one probe answers them all.
const PROBE_EVERY: Duration = Duration::from_secs(10);
/// How long the probe reads one partition: a fetch answers in milliseconds, an empty
/// partition at once (partition EOF); the rest is a connection and a group-offset query.
const PROBE_READ: Duration = Duration::from_secs(3);

/// A partition held at a batch it cannot decode.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct HeldPartition {
    pub topic: String,
    pub partition: i32,
    /// The first offset not read: the held batch covers it.
    pub offset: i64,
    /// The batch's codec, as librdkafka named it ("unknown" if it did not say).
    pub codec: String,
    /// librdkafka's error.
    pub cause: String,
}

impl std::fmt::Display for HeldPartition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "topic {} partition {} holds at offset {}: a batch librdkafka cannot decode \
             (codec {}): {}",
            self.topic, self.partition, self.offset, self.codec, self.cause
        )
    }
}

/// Whether a consumption error means the batch itself cannot be decoded.
pub fn is_undecodable(e: &KafkaError) -> bool {
    matches!(
        e,
        KafkaError::MessageConsumption(
            RDKafkaErrorCode::BadCompression | RDKafkaErrorCode::NotImplemented
        )
    )
}

/// The consumer loop's record of held partitions.
pub struct Undecodable {
    kafka: KafkaSettings,
    bootstrap: String,
    held: BTreeMap<i32, HeldPartition>,
    /// `held` as published, rebuilt only when it changes.
    snapshot: Arc<Vec<HeldPartition>>,
    probe: Option<mpsc::Receiver<Vec<HeldPartition>>>,
    last_probe: Option<Instant>,
}

impl Undecodable {
    pub fn new(kafka: &KafkaSettings, bootstrap: &str) -> Self {
        Self {
            kafka: kafka.clone(),
            bootstrap: bootstrap.to_string(),
            held: BTreeMap::new(),
            snapshot: Arc::default(),
            probe: None,
            last_probe: None,
        }
    }

    /// An undecodable error from the poll: probe, unless a probe ran lately.
    pub fn on_error<C: rdkafka::consumer::ConsumerContext>(
        &mut self,
        consumer: &BaseConsumer<C>,
        error: &KafkaError,
        assigned: &[i32],
    ) {
        let due = self.last_probe.is_none_or(|t| t.elapsed() >= PROBE_EVERY);
        if self.probe.is_some() || !due {
            return;
        }
        self.last_probe = Some(Instant::now());
        let positions = consumer.position().ok();
        let targets: Vec<(i32, Offset)> = assigned
            .iter()
            .filter(|p| !self.held.contains_key(p))
            .map(|&p| {
                let at = positions
                    .as_ref()
                    .and_then(|tpl| tpl.find_partition(&self.kafka.topic, p))
                    .map(|e| e.offset())
                    .filter(|o| matches!(o, Offset::Offset(_)))
                    .unwrap_or(Offset::Stored);
                (p, at)
            })
            .collect();
        if targets.is_empty() {
            return;
        }
        tracing::warn!(error = %error, "a batch cannot be decoded; finding its partition");
        let (tx, rx) = mpsc::channel();
        let (kafka, bootstrap) = (self.kafka.clone(), self.bootstrap.clone());
        let spawned = std::thread::Builder::new()
            .name("kafka-undecodable-probe".into())
            .spawn(move || {
                let _ = tx.send(probe(&kafka, &bootstrap, &targets));
            });
        match spawned {
            Ok(_) => self.probe = Some(rx),
            Err(e) => tracing::warn!(error = %e, "cannot start the undecodable-batch probe"),
        }
    }

    /// Takes a finished probe's answer; forgets partitions no longer assigned. Returns
    /// whether the held set changed.
    pub fn bookkeeping(&mut self, assigned: &std::collections::BTreeSet<i32>) {
        if self.probe.is_none() && self.held.is_empty() {
            return;
        }
        let mut changed = false;
        if let Some(rx) = &self.probe {
            match rx.try_recv() {
                Ok(found) => {
                    self.probe = None;
                    for h in found {
                        if assigned.contains(&h.partition) && !self.held.contains_key(&h.partition)
                        {
                            tracing::error!(
                                topic = %self.kafka.topic,
                                partition = h.partition,
                                offset = h.offset,
                                codec = %h.codec,
                                cause = %h.cause,
                                "a batch cannot be decoded: the partition holds here, nothing \
                                 behind it is read or committed (docs/RELIABILITY.md, \
                                 \"An undecodable batch\")"
                            );
                            metrics::counter!(
                                "kafka_undecodable_batches_total",
                                "partition" => h.partition.to_string()
                            )
                            .increment(1);
                            self.held.insert(h.partition, h);
                            changed = true;
                        }
                    }
                }
                Err(mpsc::TryRecvError::Empty) => {}
                Err(mpsc::TryRecvError::Disconnected) => self.probe = None,
            }
        }
        let before = self.held.len();
        self.held.retain(|p, _| assigned.contains(p));
        changed |= self.held.len() != before;
        if changed {
            self.changed();
        }
    }

    fn changed(&mut self) {
        metrics::gauge!("kafka_held_partitions").set(self.held.len() as f64);
        self.snapshot = Arc::new(self.held.values().cloned().collect());
    }

    /// Whether a probe runs or a partition is held (the bookkeeping has work).
    pub fn active(&self) -> bool {
        self.probe.is_some() || !self.held.is_empty()
    }

    /// A message was read: its partition has moved past a held batch.
    pub fn read(&mut self, partition: i32, offset: i64) {
        if self.held.is_empty() {
            return;
        }
        if self
            .held
            .get(&partition)
            .is_some_and(|h| offset >= h.offset)
        {
            let h = self.held.remove(&partition).expect("checked");
            tracing::info!(
                partition,
                offset,
                held_at = h.offset,
                "the held partition reads again past the undecodable batch"
            );
            self.changed();
        }
    }

    pub fn held(&self) -> Arc<Vec<HeldPartition>> {
        Arc::clone(&self.snapshot)
    }
}

/// Keeps the codec librdkafka names in its `CONSUME` debug line for the probe's fetch:
/// "Enqueue 0 message(s) (… bytes, 1 ops) on T [p] fetch queue (…, zstd)".
#[derive(Default)]
struct ProbeContext(parking_lot::Mutex<Option<String>>);

impl rdkafka::ClientContext for ProbeContext {
    fn log(&self, _level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        if fac == "CONSUME" && message.contains("fetch queue") {
            if let Some((_, tail)) = message.trim_end_matches(')').rsplit_once(", ") {
                *self.0.lock() = Some(tail.to_string());
            }
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ProbeContext {}

/// Reads each target partition at its offset outside the group; the ones whose read
/// fails undecodable are held.
fn probe(kafka: &KafkaSettings, bootstrap: &str, targets: &[(i32, Offset)]) -> Vec<HeldPartition> {
    let mut config = crate::broker::consumer_config(kafka, bootstrap);
    // The group's id, for its committed offsets, but assign only: never joins, never commits.
    config
        .set("enable.partition.eof", "true")
        .set("debug", "msg")
        // rdkafka derives librdkafka's log level from the `log` crate's, off here.
        .set_log_level(rdkafka::config::RDKafkaLogLevel::Debug);
    let consumer: BaseConsumer<ProbeContext> = match config.create_with_context(Default::default())
    {
        Ok(c) => c,
        Err(e) => {
            tracing::warn!(error = %e, "undecodable-batch probe: no client");
            return Vec::new();
        }
    };
    let mut held = Vec::new();
    for &(partition, at) in targets {
        let mut tpl = TopicPartitionList::new();
        if tpl
            .add_partition_offset(&kafka.topic, partition, at)
            .is_err()
            || consumer.assign(&tpl).is_err()
        {
            continue;
        }
        *consumer.context().0.lock() = None;
        let deadline = Instant::now() + PROBE_READ;
        while Instant::now() < deadline {
            match consumer.poll(Duration::from_millis(100)) {
                None => continue,
                Some(Ok(_)) | Some(Err(KafkaError::PartitionEOF(_))) => break,
                Some(Err(e)) if is_undecodable(&e) => {
                    let offset = match at {
                        Offset::Offset(o) => o,
                        _ => committed(&consumer, &kafka.topic, partition),
                    };
                    let codec = consumer.context().0.lock().take();
                    held.push(HeldPartition {
                        topic: kafka.topic.clone(),
                        partition,
                        offset,
                        codec: codec.unwrap_or_else(|| "unknown".into()),
                        cause: e.to_string(),
                    });
                    break;
                }
                Some(Err(_)) => {}
            }
        }
    }
    held
}

/// The group's committed offset of `partition` (if none, the partition's first offset:
/// the group reads from the start).
fn committed(consumer: &BaseConsumer<ProbeContext>, topic: &str, partition: i32) -> i64 {
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    consumer
        .committed_offsets(tpl, Duration::from_secs(2))
        .ok()
        .and_then(|t| t.find_partition(topic, partition).map(|e| e.offset()))
        .and_then(|o| match o {
            Offset::Offset(o) => Some(o),
            _ => None,
        })
        .or_else(|| {
            consumer
                .fetch_watermarks(topic, partition, Duration::from_secs(2))
                .ok()
                .map(|(low, _)| low)
        })
        .unwrap_or(0)
}
