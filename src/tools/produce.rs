//! `pushpace produce`: a load generator that writes jobs to the jobs topic.
//!
//! Jobs of all campaigns are interleaved (round-robin), keyed by campaign id, so that a
//! worker sees every campaign at once, as in production.

use crate::broker::{self, BrokerError};
use crate::config::KafkaSettings;
use crate::job::Job;
use crate::limiter::{Algorithm, Rate};
use rdkafka::producer::{FutureProducer, FutureRecord};
use serde_json::value::RawValue;
use std::time::Duration;

/// What to produce.
#[derive(Debug, Clone)]
pub struct ProducePlan {
    /// Campaign ids, each with its send_rate and device count.
    pub campaigns: Vec<PlannedCampaign>,
    /// Devices per job.
    pub job_size: usize,
    pub algorithm: Option<Algorithm>,
    /// A prefix making job ids and device tokens unique to this run.
    pub run_id: String,
}

#[derive(Debug, Clone)]
pub struct PlannedCampaign {
    pub id: String,
    pub send_rate: Rate,
    pub devices: usize,
}

impl ProducePlan {
    /// `campaigns` campaigns named `<prefix>-<i>`, each with `devices` devices at `rate`.
    pub fn uniform(
        prefix: &str,
        campaigns: usize,
        devices: usize,
        rate: Rate,
        job_size: usize,
    ) -> Self {
        ProducePlan {
            campaigns: (0..campaigns)
                .map(|i| PlannedCampaign {
                    id: format!("{prefix}-{i}"),
                    send_rate: rate,
                    devices,
                })
                .collect(),
            job_size: job_size.clamp(1, crate::job::MAX_DEVICES),
            algorithm: None,
            run_id: prefix.to_string(),
        }
    }

    /// Campaigns `<run_id>-c0`, `<run_id>-c1`, … with the given (send_rate, devices).
    pub fn with_rates(
        run_id: &str,
        campaigns: &[(f64, usize)],
        job_size: usize,
        algorithm: Option<Algorithm>,
    ) -> Result<Self, crate::limiter::RateError> {
        Ok(ProducePlan {
            campaigns: campaigns
                .iter()
                .enumerate()
                .map(|(i, (rate, devices))| {
                    Ok(PlannedCampaign {
                        id: format!("{run_id}-c{i}"),
                        send_rate: Rate::per_second(*rate)?,
                        devices: *devices,
                    })
                })
                .collect::<Result<_, _>>()?,
            job_size: job_size.clamp(1, crate::job::MAX_DEVICES),
            algorithm,
            run_id: run_id.to_string(),
        })
    }

    pub fn total_devices(&self) -> usize {
        self.campaigns.iter().map(|c| c.devices).sum()
    }

    pub fn total_jobs(&self) -> usize {
        self.campaigns
            .iter()
            .map(|c| c.devices.div_ceil(self.job_size))
            .sum()
    }

    /// The jobs, interleaved across campaigns, with plain tokens.
    pub fn jobs(&self) -> impl Iterator<Item = Job> + '_ {
        self.jobs_with(&TokenStyle::Plain)
    }

    /// The jobs with devices and payload shaped for one kind of provider.
    pub fn jobs_with<'a>(&'a self, style: &'a TokenStyle) -> impl Iterator<Item = Job> + 'a {
        let payload: Box<RawValue> =
            RawValue::from_string(style.payload().to_string()).expect("static JSON");
        let max_jobs = self
            .campaigns
            .iter()
            .map(|c| c.devices.div_ceil(self.job_size))
            .max()
            .unwrap_or(0);
        (0..max_jobs).flat_map(move |j| {
            let payload = payload.clone();
            self.campaigns
                .iter()
                .enumerate()
                .filter_map(move |(ci, c)| {
                    let start = j * self.job_size;
                    if start >= c.devices {
                        return None;
                    }
                    let end = (start + self.job_size).min(c.devices);
                    let devices = (start..end)
                        .map(|d| style.device(&self.run_id, &c.id, ci, d))
                        .collect();
                    let job = Job::new(
                        format!("{}-{}-job-{j:05}", self.run_id, c.id),
                        c.id.clone(),
                        devices,
                        payload.clone(),
                    )
                    .expect("generated jobs follow the rules")
                    .with_send_rate(c.send_rate);
                    Some(match self.algorithm {
                        Some(a) => job.with_algorithm(a),
                        None => job,
                    })
                })
        })
    }
}

/// How generated devices and payloads look, per provider kind.
#[derive(Debug, Clone)]
pub enum TokenStyle {
    /// `<run>-<campaign>-dev-<n>`, a generic JSON body (the webhook).
    Plain,
    /// 64 hex digits (campaign index + 1, device index), an `aps` payload. The first
    /// device of campaign `dead` (an index), if given, gets a token the APNs mock
    /// answers `410 Unregistered` (the demo shows it recorded as invalid).
    ApnsHex { dead: Option<usize> },
    /// A plain token and the fields of an FCM `message` (a notification).
    Fcm,
    /// Subscription JSON of the Web Push mock's deterministic scheme.
    WebPush(crate::tools::mock::webpush::SeededSubscriptions),
}

impl TokenStyle {
    /// The payload of every job in this style.
    pub fn payload(&self) -> &'static str {
        match self {
            TokenStyle::Plain | TokenStyle::WebPush(_) => {
                r#"{"title":"pushpace","body":"paced hello"}"#
            }
            TokenStyle::ApnsHex { .. } => {
                r#"{"aps":{"alert":{"title":"pushpace","body":"paced hello"}}}"#
            }
            TokenStyle::Fcm => r#"{"notification":{"title":"pushpace","body":"paced hello"}}"#,
        }
    }

    /// Device `d` of campaign `campaign` (its index `ci` in the plan).
    pub fn device(&self, run_id: &str, campaign: &str, ci: usize, d: usize) -> String {
        match self {
            TokenStyle::Plain | TokenStyle::Fcm => format!("{run_id}-{campaign}-dev-{d:07}"),
            // Leading zeros: never one of the mock's error markers (`410a`, `5000`…).
            TokenStyle::ApnsHex { dead } if *dead == Some(ci) && d == 0 => {
                format!("410a{:012x}{:048x}", ci + 1, d)
            }
            TokenStyle::ApnsHex { .. } => format!("{:016x}{:048x}", ci + 1, d),
            TokenStyle::WebPush(subs) => subs.subscription((ci as u64) << 32 | d as u64),
        }
    }
}

/// Writes every job of `plan` to `topic`; calls `progress(devices)` after each job.
pub async fn produce(
    kafka: &KafkaSettings,
    bootstrap: &str,
    topic: &str,
    plan: &ProducePlan,
    progress: impl FnMut(usize),
) -> Result<usize, BrokerError> {
    produce_styled(kafka, bootstrap, topic, plan, &TokenStyle::Plain, progress).await
}

/// [`produce`] with devices and payload in a provider's shape.
pub async fn produce_styled(
    kafka: &KafkaSettings,
    bootstrap: &str,
    topic: &str,
    plan: &ProducePlan,
    style: &TokenStyle,
    mut progress: impl FnMut(usize),
) -> Result<usize, BrokerError> {
    let producer: FutureProducer = broker::producer_config(kafka, bootstrap).create()?;
    let mut pending = futures::stream::FuturesUnordered::new();
    let mut sent = 0usize;
    use futures::StreamExt;
    for job in plan.jobs_with(style) {
        let value = job.to_json();
        let key = job.campaign_id.clone();
        let devices = job.devices.len();
        let producer = producer.clone();
        let topic = topic.to_string();
        pending.push(async move {
            producer
                .send(
                    FutureRecord::to(&topic).key(&key).payload(&value),
                    Duration::from_secs(60),
                )
                .await
                .map(|_| devices)
                .map_err(|(e, _)| BrokerError::Kafka(e))
        });
        // Bound the messages in flight, so memory stays flat for large plans.
        while pending.len() >= 256 {
            if let Some(r) = pending.next().await {
                let d = r?;
                sent += 1;
                progress(d);
            }
        }
    }
    while let Some(r) = pending.next().await {
        let d = r?;
        sent += 1;
        progress(d);
    }
    Ok(sent)
}
