//! The phases that are not a worker-throughput run: the plain consumer, the backlog and
//! pacing phases, and the pacing figures.

use super::process::Sample;
use super::{
    phase_err, BenchArgs, BenchError, Ctx, Pacing1000Result, PacingResult, Phase, PhaseResult,
};
use crate::job;
use crate::tools::produce::ProducePlan;
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
        let pool = self.database_pool(db, 1).await?;
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

    /// 100 campaigns at rates summing to `pacing_total_rate`, each for `pacing_seconds`;
    /// as [`Phase::PacingSameRate`], summing to `pacing-1000`'s rate instead
    /// ([`PACING_1000_TOTAL`]): the worker's CPU a second has a part that does not grow
    /// with the rate, which weighs twice a send at half the rate, so only this baseline
    /// tells what the number of campaigns itself costs.
    pub(super) async fn pacing(
        &self,
        topic: &str,
        db: &str,
        args: &BenchArgs,
        phase: Phase,
    ) -> Result<(PhaseResult, PacingResult), BenchError> {
        let n = 100usize;
        let name = phase.name();
        let (tag, total) = if phase == Phase::PacingSameRate {
            ("s", PACING_1000_TOTAL)
        } else {
            ("p", args.pacing_total_rate)
        };
        let rates = pacing_rates(n, total);
        let (mut result, rows, rate_of) = self
            .paced_run(
                name,
                tag,
                topic,
                db,
                &rates,
                args.pacing_seconds,
                args.job_size,
            )
            .await?;
        result.note = format!(
            "100 campaigns, {:.0}–{:.0}/s, summing to {total:.0}/s",
            rates[0],
            rates[n - 1],
        );
        let pacing = PacingResult {
            phase: name,
            ..pacing_distribution(&rows, &rate_of)
        };
        Ok((result, pacing))
    }

    /// 1,000 campaigns at a long-tailed mix of rates ([`long_tail_rates`]).
    pub(super) async fn pacing_1000(
        &self,
        topic: &str,
        db: &str,
        args: &BenchArgs,
    ) -> Result<(PhaseResult, Pacing1000Result), BenchError> {
        let rates = long_tail_rates(1000, PACING_1000_TOTAL);
        // The same job size as the 100-campaign phase: a slow campaign's whole run fits
        // one job, and the CPU per send compares like with like.
        let job_size = args.job_size;
        let (mut result, rows, rate_of) = self
            .paced_run(
                "pacing-1000",
                "q",
                topic,
                db,
                &rates,
                args.pacing_seconds,
                job_size,
            )
            .await?;
        let total: f64 = rates.iter().sum();
        result.note = format!("1,000 campaigns, 1–5,000/s, summing to {total:.0}/s");
        Ok((result, pacing_1000_figures(&rows, &rate_of)))
    }

    /// Runs campaigns at `rates` for `seconds` through a null-sender worker; returns the
    /// phase's figures, its per-second rows and each campaign's rate.
    #[allow(clippy::too_many_arguments)]
    async fn paced_run(
        &self,
        name: &'static str,
        tag: &str,
        topic: &str,
        db: &str,
        rates: &[f64],
        seconds: u64,
        job_size: usize,
    ) -> Result<PacedRun, BenchError> {
        let campaigns: Vec<(f64, usize)> = rates
            .iter()
            .map(|r| (*r, (r * seconds as f64).round().max(1.0) as usize))
            .collect();
        let plan =
            ProducePlan::with_rates(&format!("{}{tag}", self.run_id), &campaigns, job_size, None)
                .map_err(|e| phase_err(name, e.to_string()))?;
        self.produce(topic, &plan).await?;
        let total = plan.total_devices() as u64;
        let active = rates.len().max(100).to_string();
        let mut w = self
            .start_worker(
                name,
                topic,
                db,
                &[
                    ("PUSHPACE__SENDER__KIND", "null".into()),
                    ("PUSHPACE__WORKER__MAX_ACTIVE_CAMPAIGNS", active),
                ],
            )
            .await?;
        let limit = Duration::from_secs(seconds * 3 + 60);
        let timed = w.time_until(name, total, limit).await;
        let peak = w.stop().await;
        let t = timed?;
        let pool = self.database_pool(db, 2).await?;
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
        let result = PhaseResult {
            peak_rss_mb: peak,
            ..PhaseResult::timed(name, total, t)
        };
        Ok((result, rows, rate_of))
    }
}

type PacedRun = (
    PhaseResult,
    Vec<(String, i64, i64)>,
    std::collections::HashMap<String, f64>,
);

/// The summed rate of the `pacing-1000` phase: issue 24's "about 50,000/s".
pub const PACING_1000_TOTAL: f64 = 50_000.0;

/// `n` rates in issue 24's long-tailed mix summing to `total`: 90% at 1–50/s, 9% at
/// 100–1,000/s, 1% at 2,000–5,000/s. Within a tier of `m` campaigns the i-th rate is
/// `lo · (hi/lo)^(u^k)`, `u = i/(m−1)`: log-uniform at `k = 1` (which sums to about
/// 79,600/s for 1,000), skewed towards each tier's low end as `k` grows. One `k` for all
/// tiers is found by bisection so that the sum is `total` (clamped to what the tiers
/// allow). No randomness: the same `n` and `total` give the same rates.
pub fn long_tail_rates(n: usize, total: f64) -> Vec<f64> {
    let draw = |k: f64| -> Vec<f64> {
        let tier = |count: usize, lo: f64, hi: f64| {
            (0..count).map(move |i| {
                let u = if count == 1 {
                    0.5
                } else {
                    i as f64 / (count - 1) as f64
                };
                (lo * (hi / lo).powf(u.powf(k)) * 1000.0).round() / 1000.0
            })
        };
        let (top, mid) = ((n / 100).max(1), (n * 9 / 100).max(1));
        let low = n.saturating_sub(top + mid);
        tier(low, 1.0, 50.0)
            .chain(tier(mid, 100.0, 1000.0))
            .chain(tier(top, 2000.0, 5000.0))
            .collect()
    };
    let sum = |k: f64| draw(k).iter().sum::<f64>();
    // The sum falls as k grows; k = 1/64 is near each tier's top, 64 near its bottom.
    let (mut lo, mut hi) = (1.0f64 / 64.0, 64.0f64);
    for _ in 0..60 {
        let mid = (lo * hi).sqrt();
        if sum(mid) > total {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    draw((lo * hi).sqrt())
}

/// The pacing figures of issue 24: for campaigns at ≥ 100/s, |achieved − rate| / rate
/// per campaign-second (p50, p99); for slower ones, the largest |achieved − rate| in
/// sends in any whole second. First and last (partial) seconds are left out.
pub fn pacing_1000_figures(
    rows: &[(String, i64, i64)],
    rates: &std::collections::HashMap<String, f64>,
) -> Pacing1000Result {
    let fast: std::collections::HashMap<String, f64> = rates
        .iter()
        .filter(|(_, r)| **r >= 100.0)
        .map(|(k, v)| (k.clone(), *v))
        .collect();
    let fast_rows: Vec<(String, i64, i64)> = rows
        .iter()
        .filter(|r| fast.contains_key(&r.0))
        .cloned()
        .collect();
    let fast_dist = pacing_distribution(&fast_rows, &fast);
    let mut slow_max_off: f64 = 0.0;
    let mut slow_seconds = 0usize;
    let mut i = 0;
    while i < rows.len() {
        let mut j = i;
        while j < rows.len() && rows[j].0 == rows[i].0 {
            j += 1;
        }
        if let Some(rate) = rates.get(&rows[i].0).filter(|r| **r < 100.0) {
            let (first, last) = (rows[i].1, rows[j - 1].1);
            let counts: std::collections::HashMap<i64, i64> =
                rows[i..j].iter().map(|r| (r.1, r.2)).collect();
            for s in first + 1..last {
                let n = counts.get(&s).copied().unwrap_or(0) as f64;
                slow_max_off = slow_max_off.max((n - rate).abs());
                slow_seconds += 1;
            }
        }
        i = j;
    }
    Pacing1000Result {
        campaigns: rates.len(),
        total_rate: rates.values().sum(),
        fast_campaign_seconds: fast_dist.campaign_seconds,
        fast_p50: fast_dist.p50,
        fast_p99: fast_dist.p99,
        fast_over_1pct: fast_dist.over_1pct,
        slow_campaign_seconds: slow_seconds,
        slow_max_sends_off: slow_max_off,
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
        phase: "pacing",
        campaigns: rates.len(),
        total_rate: rates.values().sum(),
        campaign_seconds: errors.len(),
        p50: pct(0.5),
        p99: pct(0.99),
        max: errors.last().copied().unwrap_or(0.0),
        max_over_rate: max_over,
        over_1pct: errors.iter().filter(|&&e| e > 0.01).count(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_long_tail_has_the_issues_tiers() {
        let r = long_tail_rates(1000, PACING_1000_TOTAL);
        assert_eq!(r.len(), 1000);
        let sum: f64 = r.iter().sum();
        assert!((sum - 50_000.0).abs() < 1.0, "{sum}");
        assert_eq!(r, long_tail_rates(1000, PACING_1000_TOTAL));
        let count = |lo: f64, hi: f64| r.iter().filter(|x| **x >= lo && **x <= hi).count();
        assert_eq!(
            (
                count(1.0, 50.0),
                count(100.0, 1000.0),
                count(2000.0, 5000.0)
            ),
            (900, 90, 10)
        );
    }

    #[test]
    fn slow_campaigns_are_judged_in_sends_and_fast_ones_in_percent() {
        let rates: std::collections::HashMap<String, f64> =
            [("s".to_string(), 2.0), ("f".to_string(), 200.0)].into();
        let rows: Vec<(String, i64, i64)> = [
            ("f", 10, 50),
            ("f", 11, 200),
            ("f", 12, 202),
            ("f", 13, 9),
            ("s", 10, 1),
            ("s", 11, 2),
            ("s", 12, 4),
            ("s", 13, 2),
            ("s", 14, 1),
        ]
        .iter()
        .map(|(c, s, n)| (c.to_string(), *s, *n))
        .collect();
        let p = pacing_1000_figures(&rows, &rates);
        assert_eq!((p.fast_campaign_seconds, p.slow_campaign_seconds), (2, 3));
        assert!((p.fast_p99 - 0.01).abs() < 1e-9, "{}", p.fast_p99);
        assert_eq!(p.slow_max_sends_off, 2.0);
    }

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
