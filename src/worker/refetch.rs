//! Re-reads parked jobs by offset.
//!
//! A second consumer that never joins the group and never commits: it is assigned one
//! partition at the wanted offset and reads until that message arrives. Consecutive
//! re-reads forward in the same partition reuse the fetch position instead of
//! re-assigning, since a slow campaign's parked jobs are usually re-read in offset order.

use super::backlog::JobRef;
use crate::config::KafkaSettings;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::OwnedMessage;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

/// How long one re-read may take before it is retried later. Short, because the
/// consumer loop (and the group's poll interval) waits meanwhile.
const FETCH_TIMEOUT: Duration = Duration::from_secs(3);
/// Messages skipped forward rather than re-assigning: one fetch batch is cheaper than
/// a new assignment, up to about this many small jobs.
const MAX_SKIP: i64 = 64;
/// A watermark query after a failed read: short, the consumer loop waits meanwhile.
const WATERMARK_TIMEOUT: Duration = Duration::from_secs(1);

/// Why a re-read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RefetchError {
    /// Retention deleted the offset: it will never be read again.
    #[error("offset {offset} no longer exists (the partition now starts at {earliest})")]
    Gone { offset: i64, earliest: i64 },
    /// The broker did not answer, or failed: the re-read can pass later.
    #[error("{0}")]
    Transient(String),
}

pub struct Refetcher {
    consumer: BaseConsumer,
    /// The assigned partition and the offset its next message will have.
    position: Option<JobRef>,
}

impl Refetcher {
    pub fn new(kafka: &KafkaSettings, bootstrap: &str) -> Result<Self, rdkafka::error::KafkaError> {
        let mut config = crate::broker::consumer_config(kafka, bootstrap);
        // A group of its own, never joined (assign only) and never committed to.
        config
            .set("group.id", format!("{}.refetch", kafka.group_id))
            .set("enable.auto.commit", "false")
            // A re-read is on the consumer loop's path: answer in milliseconds rather
            // than the group consumer's fetch wait (`kafka.fetch_wait_max_ms`) and
            // librdkafka's 1 s queue backoff, and
            // prefetch only about MAX_SKIP messages ahead.
            .set("fetch.wait.max.ms", "10")
            .set("fetch.error.backoff.ms", "50")
            .set("fetch.queue.backoff.ms", "10")
            .set("queued.min.messages", "64")
            .set("queued.max.messages.kbytes", "2048");
        Ok(Self {
            consumer: config.create()?,
            position: None,
        })
    }

    /// The message at `at`, read again from the broker.
    pub fn fetch(&mut self, topic: &str, at: JobRef) -> Result<OwnedMessage, RefetchError> {
        let reuse = self.position.is_some_and(|p| {
            p.partition == at.partition && at.offset >= p.offset && at.offset - p.offset <= MAX_SKIP
        });
        if !reuse {
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition_offset(topic, at.partition, Offset::Offset(at.offset))
                .map_err(|e| RefetchError::Transient(e.to_string()))?;
            self.position = None;
            self.consumer
                .assign(&tpl)
                .map_err(|e| RefetchError::Transient(e.to_string()))?;
        }
        let deadline = Instant::now() + FETCH_TIMEOUT;
        while Instant::now() < deadline {
            match self.consumer.poll(Duration::from_millis(100)) {
                None => {}
                Some(Err(e)) => return self.fail(topic, at, format!("fetch failed: {e}")),
                Some(Ok(m)) if m.partition() != at.partition => {}
                Some(Ok(m)) => {
                    self.position = Some(JobRef {
                        partition: at.partition,
                        offset: m.offset() + 1,
                    });
                    if m.offset() == at.offset {
                        return Ok(m.detach());
                    }
                    if m.offset() > at.offset {
                        self.position = None;
                        return Err(RefetchError::Gone {
                            offset: at.offset,
                            earliest: m.offset(),
                        });
                    }
                }
            }
        }
        self.fail(topic, at, format!("no answer within {FETCH_TIMEOUT:?}"))
    }

    /// A failed read: `Gone` when the partition now starts past the offset (retention
    /// deleted it, or the consumer's reset policy jumped), else transient.
    fn fail(&mut self, topic: &str, at: JobRef, why: String) -> Result<OwnedMessage, RefetchError> {
        self.position = None;
        match self
            .consumer
            .fetch_watermarks(topic, at.partition, WATERMARK_TIMEOUT)
        {
            Ok((low, _)) if low > at.offset => Err(RefetchError::Gone {
                offset: at.offset,
                earliest: low,
            }),
            _ => Err(RefetchError::Transient(why)),
        }
    }
}
