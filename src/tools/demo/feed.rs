//! The demo's producer: it writes each campaign's jobs progressively, a few seconds of
//! sending ahead of what the sink has seen delivered, as a real producer feeding a paced
//! campaign would, instead of everything up front.
//!
//! The embedded broker (librdkafka's mock cluster) keeps only about 5 MB per partition
//! and drops the oldest messages past that, read or not: producing 100 campaigns' jobs
//! up front overflowed it and whole jobs vanished before the worker read them. Fed this
//! way, a partition never holds more than [`LEAD`] of its campaigns' sending unread.
//! Each delivered job's (partition, offset) is kept, so that a drop that still happens
//! is found by comparing them with the low watermarks ([`Feeder::below_low_watermark`]).

use crate::broker::{self, BrokerError};
use crate::config::KafkaSettings;
use crate::job::Job;
use crate::tools::produce::{PlannedCampaign, TokenStyle};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::value::RawValue;
use std::collections::HashMap;
use std::time::Duration;

/// How much sending each campaign has in the broker ahead of its deliveries: enough that
/// the worker never waits for the producer (a produce round trip takes milliseconds),
/// small enough that 100 campaigns summing 65,500/s stay far below the embedded broker's
/// 5 MB per partition (3 s × 65,500/s × ~35 bytes per token ≈ 6.9 MB over all partitions).
pub const LEAD: Duration = Duration::from_secs(3);
/// The most devices in one job; smaller campaigns get one second of sending per job, so
/// that a 20/s campaign is not fed 25 s at a time.
pub const MAX_JOB_DEVICES: usize = 500;
/// Jobs each campaign keeps ahead at the least, whatever its rate.
const MIN_JOBS_AHEAD: usize = 2;
/// A campaign whose deliveries have not moved for this long while it has devices in
/// flight gets one more job: devices that are never delivered (a dead token, a job the
/// broker dropped) would otherwise eat its lead until it stops. Several seconds, so that
/// a worker only joining its group is not fed past the lead.
const STALL: std::time::Duration = std::time::Duration::from_secs(5);

/// One campaign being fed.
#[derive(Debug)]
struct Fed {
    campaign: PlannedCampaign,
    /// Devices per job.
    job_size: usize,
    /// Devices produced so far (a prefix of the campaign's devices).
    produced: usize,
    /// Jobs produced so far.
    jobs: usize,
    /// `None`: open-ended (until the demo is stopped).
    devices: Option<usize>,
    /// Deliveries seen at the last top-up, and since when they have not moved.
    delivered: u64,
    still_since: std::time::Instant,
    /// Devices added to the lead for deliveries that never came ([`STALL`]).
    allowance: usize,
    /// The provider its jobs name (`None`: the default).
    provider: Option<String>,
}

/// Produces the demo's campaigns a bounded time ahead of their deliveries.
pub struct Feeder {
    producer: FutureProducer,
    kafka: KafkaSettings,
    bootstrap: String,
    topic: String,
    run_id: String,
    style: TokenStyle,
    payload: Box<RawValue>,
    campaigns: Vec<Fed>,
    /// (partition, offset, campaign index, devices) of every job produced.
    written: Vec<(i32, i64, usize, usize)>,
}

impl Feeder {
    /// A feeder for `campaigns` with devices and payload in `style`; `open_ended`
    /// campaigns are fed until [`Feeder::stop`], ignoring their planned device count.
    pub fn new(
        kafka: &KafkaSettings,
        bootstrap: &str,
        topic: &str,
        run_id: &str,
        style: TokenStyle,
        campaigns: Vec<PlannedCampaign>,
        open_ended: bool,
    ) -> Result<Self, BrokerError> {
        let producer: FutureProducer = broker::producer_config(kafka, bootstrap).create()?;
        let payload = RawValue::from_string(style.payload().to_string()).expect("static JSON");
        let campaigns = campaigns
            .into_iter()
            .map(|c| {
                let per_second = c.send_rate.as_f64().ceil() as usize;
                Fed {
                    job_size: per_second.clamp(1, MAX_JOB_DEVICES),
                    produced: 0,
                    jobs: 0,
                    devices: (!open_ended).then_some(c.devices),
                    delivered: 0,
                    still_since: std::time::Instant::now(),
                    allowance: 0,
                    provider: None,
                    campaign: c,
                }
            })
            .collect();
        Ok(Self {
            producer,
            kafka: kafka.clone(),
            bootstrap: bootstrap.to_string(),
            topic: topic.to_string(),
            run_id: run_id.to_string(),
            style,
            payload,
            campaigns,
            written: Vec::new(),
        })
    }

    /// Produces, for each campaign, the jobs that bring it to [`LEAD`] (or two jobs)
    /// ahead of `delivered(campaign id)`, and waits until the broker has them. Returns
    /// the number of jobs written.
    pub async fn top_up(&mut self, delivered: impl Fn(&str) -> u64) -> Result<usize, BrokerError> {
        let mut pending = Vec::new();
        let (producer, topic) = (&self.producer, self.topic.as_str());
        for (ci, fed) in self.campaigns.iter_mut().enumerate() {
            let rate = fed.campaign.send_rate.as_f64();
            let ahead =
                ((rate * LEAD.as_secs_f64()).ceil() as usize).max(MIN_JOBS_AHEAD * fed.job_size);
            let done = delivered(&fed.campaign.id);
            if done != fed.delivered {
                (fed.delivered, fed.still_since) = (done, std::time::Instant::now());
            } else if done > 0 && fed.produced as u64 > done && fed.still_since.elapsed() >= STALL {
                fed.allowance += fed.job_size;
                fed.still_since = std::time::Instant::now();
            }
            let want = done as usize + ahead + fed.allowance;
            while fed.produced < want {
                let end = match fed.devices {
                    Some(total) if fed.produced >= total => break,
                    Some(total) => (fed.produced + fed.job_size).min(total),
                    None => fed.produced + fed.job_size,
                };
                let job = job(&self.run_id, &self.style, ci, fed, end, &self.payload);
                fed.produced = end;
                fed.jobs += 1;
                pending.push((ci, job.devices.len(), send(producer, topic, job)));
            }
        }
        let n = pending.len();
        for (ci, devices, delivery) in pending {
            let (partition, offset) = delivery.await?;
            self.written.push((partition, offset, ci, devices));
        }
        Ok(n)
    }

    /// Has the jobs of campaign `ci` name `provider`.
    pub fn set_provider(&mut self, ci: usize, provider: &str) {
        if let Some(fed) = self.campaigns.get_mut(ci) {
            fed.provider = Some(provider.to_string());
        }
    }

    /// Stops open-ended campaigns where they are: what was produced is what they have.
    pub fn stop(&mut self) {
        for fed in &mut self.campaigns {
            fed.devices = Some(fed.produced);
        }
    }

    /// Whether every campaign has all its devices produced.
    pub fn all_produced(&self) -> bool {
        self.campaigns
            .iter()
            .all(|f| f.devices.is_some_and(|d| f.produced >= d))
    }

    /// Devices produced for campaign `ci` so far.
    pub fn produced(&self, ci: usize) -> usize {
        self.campaigns.get(ci).map_or(0, |f| f.produced)
    }

    /// The campaigns, in order.
    pub fn campaigns(&self) -> impl Iterator<Item = &PlannedCampaign> {
        self.campaigns.iter().map(|f| &f.campaign)
    }

    /// Devices per campaign index in jobs now below their partition's low watermark:
    /// gone from the broker, read or not. Those of a campaign's devices that were never
    /// delivered and are among these were dropped by the broker before the worker could
    /// read them. Asks the broker for the watermarks.
    pub fn below_low_watermark(&self) -> Result<HashMap<usize, usize>, BrokerError> {
        let consumer: BaseConsumer =
            broker::client_config(&self.kafka, &self.bootstrap).create()?;
        let mut low: HashMap<i32, i64> = HashMap::new();
        let mut dropped = HashMap::new();
        for &(partition, offset, ci, devices) in &self.written {
            let lw = match low.get(&partition) {
                Some(lw) => *lw,
                None => {
                    let (lw, _) = consumer.fetch_watermarks(
                        &self.topic,
                        partition,
                        Duration::from_secs(5),
                    )?;
                    low.insert(partition, lw);
                    lw
                }
            };
            if offset < lw {
                *dropped.entry(ci).or_insert(0) += devices;
            }
        }
        Ok(dropped)
    }
}

/// Writes one job; its (partition, offset) once the broker has it.
fn send(
    producer: &FutureProducer,
    topic: &str,
    job: Job,
) -> impl std::future::Future<Output = Result<(i32, i64), BrokerError>> + 'static {
    let producer = producer.clone();
    let topic = topic.to_string();
    async move {
        let value = job.to_json();
        let record = FutureRecord::to(&topic)
            .key(&job.campaign_id)
            .payload(&value);
        producer
            .send(record, Duration::from_secs(30))
            .await
            .map(|d| (d.partition, d.offset))
            .map_err(|(e, _)| BrokerError::Kafka(e))
    }
}

/// The next job of campaign `ci`: devices `fed.produced..end`.
fn job(
    run_id: &str,
    style: &TokenStyle,
    ci: usize,
    fed: &Fed,
    end: usize,
    payload: &RawValue,
) -> Job {
    let c = &fed.campaign;
    let devices = (fed.produced..end)
        .map(|d| style.device(run_id, &c.id, ci, d))
        .collect();
    Job::new(
        format!("{run_id}-{}-job-{:06}", c.id, fed.jobs),
        c.id.clone(),
        devices,
        payload.to_owned(),
    )
    .expect("generated jobs follow the job rules")
    .with_send_rate(c.send_rate)
    .with_provider(fed.provider.clone())
}
