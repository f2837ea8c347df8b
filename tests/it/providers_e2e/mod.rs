//! Each provider answer class end to end: jobs produced to the real broker (tansu), the
//! real worker scheduling them, PostgreSQL recording what happened, and the strict
//! loopback mocks (TLS, ALPN h2, HTTP/2) answering as APNs, FCM and Web Push do.
//!
//! The tests wait on observable state (the mocks' counts, PostgreSQL rows) with generous
//! limits; each limit's reason is in its const.

mod apns;
mod fcm;
mod webpush;

use crate::harness::{Producer, Record, TestWorker};
use crate::helpers::{brokers, unique_name};
use pushpace::provider::{Provider, ProviderKind, Providers};
use pushpace::sender::{AnySender, Sender};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker's first sends: tansu's group join takes seconds (a rebalance per 3 s
/// heartbeat while it settles), on 2 cores shared with other tests.
pub const GROUP_JOIN: Duration = Duration::from_secs(60);

/// Writes the worker makes after an event: stats are flushed every 200 ms here, records
/// (invalid tokens, halts, offsets) are written at once; 30 s covers a loaded machine.
pub const DB_WRITE: Duration = Duration::from_secs(30);

/// One test's database, topic and worker (a [`TestWorker`] without a sink).
pub struct Env(TestWorker);

impl std::ops::Deref for Env {
    type Target = TestWorker;

    fn deref(&self) -> &TestWorker {
        &self.0
    }
}

impl Env {
    /// A fresh database and one-partition topic, and a worker on them sending through
    /// `provider` (named `name`, the default).
    pub async fn start(name: &str, kind: ProviderKind, sender: impl Sender + 'static) -> Env {
        let provider = Provider {
            name: Arc::from(name),
            kind,
            max_rate: None,
            max_in_flight: None,
            // As `pushpace run` builds them: the adaptive ceiling on.
            adaptive: Some(pushpace::provider::ceiling::CeilingParams::default()),
            sender: AnySender::Provider(Arc::new(sender)),
        };
        let providers = Providers::new(vec![provider], name).expect("providers");
        let tw = TestWorker::options()
            .providers(providers)
            .settings(&[("hygiene.reload_ms", "200".into())])
            .spawn()
            .await;
        Env(tw)
    }

    /// The provider's lane (adaptive ceiling) as the worker reports it.
    pub fn lane(&self) -> pushpace::worker::scheduler::ProviderLive {
        self.worker().scheduler_stats.borrow().providers[0].clone()
    }

    /// Produces one job (`devices` as JSON values: strings or subscription objects).
    pub async fn produce(&self, job: serde_json::Value) {
        self.produce_raw(&job.to_string()).await;
    }

    /// Produces one job's exact text (byte-exact payloads), without a key.
    pub async fn produce_raw(&self, text: &str) {
        let record = Record::of(text.as_bytes());
        Producer::new().send(&self.topic, record).await;
    }

    pub async fn counts(&self, campaign: &str) -> Counts {
        let row: (i64, i64, i64, i64, i64, i64) = sqlx::query_as(
            "SELECT coalesce(sum(sent), 0)::int8, coalesce(sum(failed), 0)::int8, \
                    coalesce(sum(retried), 0)::int8, coalesce(sum(invalid), 0)::int8, \
                    coalesce(sum(rejected), 0)::int8, coalesce(sum(skipped_invalid), 0)::int8 \
             FROM delivery_seconds WHERE campaign_id = $1",
        )
        .bind(campaign)
        .fetch_one(&self.pool)
        .await
        .expect("delivery_seconds");
        let (sent, failed, retried, invalid, rejected, skipped_invalid) = row;
        Counts {
            sent,
            failed,
            retried,
            invalid,
            rejected,
            skipped_invalid,
        }
    }

    /// Scalar `sql` with one text parameter.
    pub async fn scalar(&self, sql: &str, arg: &str) -> i64 {
        sqlx::query_scalar::<_, i64>(sql)
            .bind(arg)
            .fetch_one(&self.pool)
            .await
            .expect("scalar query")
    }

    pub async fn dead_letters(&self, campaign: &str) -> i64 {
        self.scalar(
            "SELECT count(*) FROM dead_letters WHERE campaign_id = $1",
            campaign,
        )
        .await
    }

    /// Rows of `invalid_tokens` (the database is the test's own).
    pub async fn invalid_tokens(&self) -> i64 {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM invalid_tokens")
            .fetch_one(&self.pool)
            .await
            .expect("invalid_tokens")
    }

    /// The group's offset committed in the broker for partition 0 (the next one to
    /// consume; -1 when none is).
    pub async fn committed(&self) -> i64 {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        use rdkafka::{ClientConfig, Offset, TopicPartitionList};
        let (topic, group) = (self.topic.clone(), self.group.clone());
        let ask = move || {
            let consumer: BaseConsumer = ClientConfig::new()
                .set("bootstrap.servers", brokers())
                .set("group.id", &group)
                .create()
                .expect("consumer");
            let mut tpl = TopicPartitionList::new();
            tpl.add_partition(&topic, 0);
            let got = consumer
                .committed_offsets(tpl, Duration::from_secs(10))
                .expect("committed offsets");
            let offset = got.elements().first().map(|e| e.offset());
            match offset {
                Some(Offset::Offset(o)) => o,
                _ => -1,
            }
        };
        tokio::task::spawn_blocking(ask).await.expect("committed")
    }

    pub async fn stop(mut self) {
        self.0.stop().await;
    }
}

/// A campaign's answer classes, summed over its seconds in `delivery_seconds`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub sent: i64,
    pub failed: i64,
    pub retried: i64,
    pub invalid: i64,
    pub rejected: i64,
    pub skipped_invalid: i64,
}

/// A campaign id of the test's own.
pub fn campaign(prefix: &str) -> String {
    unique_name(prefix).replace('_', "-")
}

/// A job naming `provider`, at `rate` sends/s.
pub fn job(
    campaign: &str,
    provider: &str,
    rate: f64,
    devices: &[serde_json::Value],
    payload: serde_json::Value,
) -> serde_json::Value {
    serde_json::json!({
        "job_id": format!("{campaign}-j{}", fastrand::u32(..)),
        "campaign_id": campaign,
        "provider": provider,
        "send_rate": rate,
        "devices": devices,
        "payload": payload,
    })
}

/// Polls `done` every 100 ms; fails the test after `limit`.
pub async fn wait_until<F, Fut>(what: &str, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
