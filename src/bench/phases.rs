//! The phases that are not a worker-throughput run: the plain consumer, the backlog and
//! pacing phases, and the pacing figures.

use super::process::Sample;
use super::{phase_err, BenchArgs, BenchError, Ctx, PacingResult, PhaseResult};
use crate::job;
use crate::produce::ProducePlan;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::Message;
use std::time::{Duration, Instant};

impl Ctx {
    /// The physical limit: read and decode every job, nothing else.
    pub(super) async fn plain_consumer(
        &self,
        topic: &str,
        plan: &ProducePlan,
    ) -> Result<PhaseResult, BenchError> {
        let mut kafka = self.settings.kafka.clone();
        kafka.group_id = format!("{}-plain", self.run_id);
        let consumer: BaseConsumer =
            crate::broker::consumer_config(&kafka, &self.settings.kafka.brokers).create()?;
        consumer.subscribe(&[topic])?;
        let jobs = plan.total_jobs();
        let total = plan.total_devices() as u64;
        let result = tokio::task::spawn_blocking(move || {
            let deadline = Instant::now() + Duration::from_secs(300);
            let mut first = None;
            let mut read = 0usize;
            let mut devices = 0u64;
            let mut bad = 0usize;
            while read < jobs && Instant::now() < deadline {
                match consumer.poll(Duration::from_millis(100)) {
                    Some(Ok(m)) => {
                        first.get_or_insert_with(Instant::now);
                        read += 1;
                        match job::decode(m.payload().unwrap_or(&[])) {
                            Ok(j) => devices += j.devices.len() as u64,
                            Err(_) => bad += 1,
                        }
                    }
                    Some(Err(e)) => tracing::warn!(error = %e, "plain consumer"),
                    None => {}
                }
            }
            (first.map(|f| f.elapsed()), read, devices, bad)
        })
        .await
        .map_err(|e| phase_err("consumer", e.to_string()))?;
        let (elapsed, read, devices, bad) = result;
        if read < jobs || bad > 0 || devices != total {
            return Err(phase_err(
                "consumer",
                format!("read {read} of {jobs} jobs ({devices} devices, {bad} undecodable)"),
            ));
        }
        let secs = elapsed.unwrap_or_default().as_secs_f64();
        Ok(PhaseResult {
            phase: "consumer".into(),
            devices,
            seconds: secs,
            per_second: devices as f64 / secs,
            note: format!(
                "plain rdkafka consumer + job decode, {:.0} jobs/s",
                jobs as f64 / secs
            ),
            ..Default::default()
        })
    }

    /// Peak RSS with a slow campaign's million devices waiting in Kafka.
    pub(super) async fn backlog(
        &self,
        topic: &str,
        db: &str,
        args: &BenchArgs,
    ) -> Result<PhaseResult, BenchError> {
        // One slow campaign (its jobs first in every partition it uses) and a fast one
        // behind it: the fast one must finish while the slow one's backlog waits.
        let fast_devices = 50_000usize;
        let mut plan = ProducePlan::with_rates(
            &format!("{}k", self.run_id),
            &[(10.0, args.backlog_devices), (5_000.0, fast_devices)],
            args.job_size,
            None,
        )
        .expect("valid rates");
        plan.run_id = format!("{}k", self.run_id);
        self.produce(topic, &plan).await?;
        let mut w = self
            .start_worker(
                "backlog",
                topic,
                db,
                &[("PUSHPACE__SENDER__KIND", "null".into())],
            )
            .await?;
        let started = Instant::now();
        let watch = Duration::from_secs(args.backlog_seconds);
        let mut last = Sample::default();
        let mut max_parked: f64 = 0.0;
        while started.elapsed() < watch {
            tokio::time::sleep(Duration::from_millis(250)).await;
            if let Ok(s) = w.sample().await {
                max_parked = max_parked.max(s.parked);
                last = s;
            }
        }
        let peak = w.stop().await;
        // The fast campaign's deliveries and their span, from its per-second rows.
        let pool = crate::store::connect(&self.database_url(db), 1, Duration::from_secs(5)).await?;
        let (fast_sent, fast_span): (i64, f64) = sqlx::query_as(
            "SELECT coalesce(sum(sent), 0)::int8, \
                    coalesce(extract(epoch FROM max(second) - min(second))::float8 + 1, 0) \
             FROM delivery_seconds WHERE campaign_id = $1",
        )
        .bind(format!("{}-c1", plan.run_id))
        .fetch_one(&pool)
        .await?;
        pool.close().await;
        Ok(PhaseResult {
            phase: "backlog".into(),
            devices: plan.total_devices() as u64,
            seconds: watch.as_secs_f64(),
            per_second: last.sends as f64 / watch.as_secs_f64(),
            peak_rss_mb: peak,
            note: format!(
                "{} devices at 10/s waiting, up to {max_parked} jobs parked; fast campaign (5,000/s): {fast_sent} of {fast_devices} delivered over {fast_span:.0} s",
                args.backlog_devices,
            ),
            ..Default::default()
        })
    }

    /// 100 campaigns at rates summing to `pacing_total_rate`, each for `pacing_seconds`.
    pub(super) async fn pacing(
        &self,
        topic: &str,
        db: &str,
        args: &BenchArgs,
    ) -> Result<(PhaseResult, PacingResult), BenchError> {
        let n = 100usize;
        let rates = pacing_rates(n, args.pacing_total_rate);
        let campaigns: Vec<(f64, usize)> = rates
            .iter()
            .map(|r| (*r, (r * args.pacing_seconds as f64).round() as usize))
            .collect();
        let plan = ProducePlan::with_rates(
            &format!("{}p", self.run_id),
            &campaigns,
            args.job_size,
            None,
        )
        .map_err(|e| phase_err("pacing", e.to_string()))?;
        self.produce(topic, &plan).await?;
        let total = plan.total_devices() as u64;
        let mut w = self
            .start_worker(
                "pacing",
                topic,
                db,
                &[("PUSHPACE__SENDER__KIND", "null".into())],
            )
            .await?;
        let limit = Duration::from_secs(args.pacing_seconds * 3 + 60);
        let timed = w.time_until("pacing", total, limit).await;
        let peak = w.stop().await;
        let (secs, sent, cpu) = timed?;
        let pool = crate::store::connect(&self.database_url(db), 2, Duration::from_secs(5)).await?;
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT campaign_id, extract(epoch FROM second)::int8, sent FROM delivery_seconds ORDER BY campaign_id, second",
        )
        .fetch_all(&pool)
        .await?;
        pool.close().await;
        let rate_of: std::collections::HashMap<String, f64> = plan
            .campaigns
            .iter()
            .map(|c| (c.id.clone(), c.send_rate.as_f64()))
            .collect();
        let pacing = pacing_distribution(&rows, &rate_of);
        let result = PhaseResult {
            phase: "pacing".into(),
            devices: total,
            seconds: secs,
            per_second: sent as f64 / secs,
            cpu_s_per_million: Some(cpu / (sent as f64 / 1e6)),
            peak_rss_mb: peak,
            note: format!(
                "100 campaigns, {:.0}–{:.0}/s, summing to {:.0}/s",
                rates[0],
                rates[n - 1],
                args.pacing_total_rate
            ),
            ..Default::default()
        };
        Ok((result, pacing))
    }
}

/// `n` rates spread evenly from `lowest` up, summing to `total`.
pub fn pacing_rates(n: usize, total: f64) -> Vec<f64> {
    // An arithmetic series from total/n/10 to 2·total/n − total/n/10: mean total/n.
    let mean = total / n as f64;
    let low = mean / 10.0;
    let high = 2.0 * mean - low;
    (0..n)
        .map(|i| {
            if n == 1 {
                mean
            } else {
                low + (high - low) * i as f64 / (n - 1) as f64
            }
        })
        .collect()
}

/// |achieved − rate| / rate over every campaign-second but each campaign's first and
/// last (partial) seconds.
pub fn pacing_distribution(
    rows: &[(String, i64, i64)],
    rates: &std::collections::HashMap<String, f64>,
) -> PacingResult {
    let mut errors = Vec::new();
    let mut max_over: f64 = 0.0;
    let mut i = 0;
    while i < rows.len() {
        let id = &rows[i].0;
        let mut j = i;
        while j < rows.len() && &rows[j].0 == id {
            j += 1;
        }
        if let Some(rate) = rates.get(id) {
            let seconds = &rows[i..j];
            if seconds.len() > 2 {
                let (first, last) = (seconds[0].1, seconds[seconds.len() - 1].1);
                // Every whole second between the first and the last, gaps counted as 0.
                let counts: std::collections::HashMap<i64, i64> =
                    seconds.iter().map(|r| (r.1, r.2)).collect();
                for s in first + 1..last {
                    let n = counts.get(&s).copied().unwrap_or(0) as f64;
                    errors.push((n - rate).abs() / rate);
                    max_over = max_over.max(n / rate);
                }
            }
        }
        i = j;
    }
    errors.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if errors.is_empty() {
            0.0
        } else {
            errors[((errors.len() - 1) as f64 * p).round() as usize]
        }
    };
    PacingResult {
        campaigns: rates.len(),
        total_rate: rates.values().sum(),
        campaign_seconds: errors.len(),
        p50: pct(0.5),
        p99: pct(0.99),
        max: errors.last().copied().unwrap_or(0.0),
        max_over_rate: max_over,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacing_rates_sum_to_the_total_and_rise() {
        let r = pacing_rates(100, 100_000.0);
        let sum: f64 = r.iter().sum();
        assert!((sum - 100_000.0).abs() < 1e-6, "{sum}");
        assert!((r[0] - 100.0).abs() < 1e-9);
        assert!((r[99] - 1900.0).abs() < 1e-9);
        assert!(r.windows(2).all(|w| w[0] < w[1]));
    }

    #[test]
    fn the_distribution_skips_partial_seconds_and_counts_gaps() {
        let rows = vec![
            ("a".to_string(), 10, 37),  // first: partial, skipped
            ("a".to_string(), 11, 100), // exact
            ("a".to_string(), 12, 102), // 2 % over
            // 13 missing: a whole second with nothing sent, 100 % off
            ("a".to_string(), 14, 99), // 1 % under
            ("a".to_string(), 15, 5),  // last: partial, skipped
        ];
        let rates = [("a".to_string(), 100.0)].into_iter().collect();
        let p = pacing_distribution(&rows, &rates);
        assert_eq!(p.campaign_seconds, 4);
        assert!((p.max - 1.0).abs() < 1e-9);
        assert!((p.max_over_rate - 1.02).abs() < 1e-9);
        // Sorted errors 0, 0.01, 0.02, 1.0: the median (index 2 of 0..=3, rounded) is 0.02.
        assert!((p.p50 - 0.02).abs() < 1e-9, "{}", p.p50);
    }
}
