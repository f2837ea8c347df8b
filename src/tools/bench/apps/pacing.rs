//! The `apps` phase's paced campaigns: two per app at ≥ 100/s, every second app capped
//! by a `max_rate` below its campaigns' summed rate; each whole second judged from
//! `delivery_seconds` against the campaign's max-min share (and each capped app's sum
//! against its cap).

use super::super::process::WorkerProcess;
use super::super::{BenchArgs, BenchError, Ctx};
use super::{put_apps, send_jobs, wait_sends, App, AppsResult, Mocks};
use crate::apps::Keyring;
use crate::job::Job;
use rdkafka::producer::FutureProducer;
use std::time::Duration;

/// One paced campaign: its app (an index into the early apps), id, own send_rate and
/// the rate it should get (its max-min share of its app's cap, if capped).
struct Paced {
    app: usize,
    campaign: String,
    rate: f64,
    expected: f64,
}

/// The paced campaigns of the first `n` early apps, two each at 100 + 20j and 150 + 20j
/// per second; every second app gets a `max_rate` of 80% of its two rates' sum.
fn paced_plan(early: &[App], n: usize) -> (Vec<Paced>, Vec<(usize, f64)>) {
    let mut campaigns = Vec::new();
    let mut caps = Vec::new();
    for (j, a) in early.iter().take(n).enumerate() {
        let rates = [100.0 + 20.0 * j as f64, 150.0 + 20.0 * j as f64];
        let cap = (j % 2 == 1).then(|| 0.8 * (rates[0] + rates[1]));
        let expected = match cap {
            Some(c) => max_min(c, &rates),
            None => rates.to_vec(),
        };
        if let Some(c) = cap {
            caps.push((j, c));
        }
        for (k, (rate, exp)) in rates.iter().zip(expected).enumerate() {
            campaigns.push(Paced {
                app: j,
                campaign: format!("{}-p{k}", a.id),
                rate: *rate,
                expected: exp,
            });
        }
    }
    (campaigns, caps)
}

/// Max-min fair shares of `cap` between equal-weight `rates` (the scheduler's rule).
fn max_min(cap: f64, rates: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..rates.len()).collect();
    order.sort_by(|a, b| rates[*a].total_cmp(&rates[*b]));
    let (mut left, mut out) = (cap, vec![0.0; rates.len()]);
    for (n, &i) in order.iter().enumerate() {
        out[i] = rates[i].min(left / (rates.len() - n) as f64);
        left -= out[i];
    }
    out
}

impl Ctx {
    /// The capped apps' new `max_rate`, then the paced campaigns' jobs, until all sent.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn paced_sends(
        &self,
        args: &BenchArgs,
        w: &WorkerProcess,
        producer: &FutureProducer,
        topic: &str,
        pool: &sqlx::PgPool,
        keyring: &Keyring,
        mocks: &Mocks,
        early: &[App],
        out: &mut AppsResult,
    ) -> Result<(), BenchError> {
        let (plan, caps) = paced_plan(early, args.apps_paced);
        if plan.is_empty() {
            return Ok(());
        }
        let capped: Vec<&App> = caps.iter().map(|(j, _)| &early[*j]).collect();
        let renumbered: Vec<(usize, f64)> =
            caps.iter().enumerate().map(|(i, c)| (i, c.1)).collect();
        put_apps(pool, keyring, mocks, &capped, &renumbered).await?;
        // The watcher hears of a change within a second (LISTEN).
        tokio::time::sleep(Duration::from_secs(2)).await;
        let secs = args.pacing_seconds as f64;
        let mut jobs: Vec<Vec<Job>> = Vec::new();
        for p in &plan {
            let a = &early[p.app];
            let total = (p.expected * secs).round() as usize;
            let tag = p.campaign.rsplit('-').next().unwrap_or("p");
            let list = (0..total.div_ceil(args.job_size))
                .map(|j| {
                    let from = j * args.job_size;
                    let n = (total - from).min(args.job_size);
                    let mut job = self.app_job(mocks, a, tag, from as u64, n, p.rate);
                    job.job_id = format!("{}-j{j}", job.job_id);
                    job
                })
                .collect();
            jobs.push(list);
        }
        // Interleaved across campaigns, as `pushpace produce` does.
        let longest = jobs.iter().map(Vec::len).max().unwrap_or(0);
        let mut all = Vec::new();
        for j in 0..longest {
            all.extend(
                jobs.iter_mut()
                    .filter_map(|l| (j < l.len()).then(|| l[j].clone())),
            );
        }
        let total: u64 = all.iter().map(|j| j.devices.len() as u64).sum();
        out.paced_campaigns = plan.len();
        out.capped_apps = caps.len();
        let base = w.sample().await?.sends;
        send_jobs(producer, topic, &all).await?;
        let limit = Duration::from_secs(args.pacing_seconds * 3 + 60);
        wait_sends(w, base + total, limit).await
    }

    /// The paced campaigns' whole seconds from `delivery_seconds`, after the worker
    /// stopped (its last flush written).
    pub(super) async fn apps_pacing_figures(
        &self,
        pool: &sqlx::PgPool,
        args: &BenchArgs,
        early: &[App],
        out: &mut AppsResult,
    ) -> Result<(), BenchError> {
        let (plan, caps) = paced_plan(early, args.apps_paced);
        if plan.is_empty() {
            return Ok(());
        }
        let ids: Vec<String> = plan.iter().map(|p| p.campaign.clone()).collect();
        let rows: Vec<(String, i64, i64)> = sqlx::query_as(
            "SELECT campaign_id, extract(epoch FROM second)::int8, sent FROM delivery_seconds \
             WHERE campaign_id = ANY($1) ORDER BY campaign_id, second",
        )
        .bind(&ids)
        .fetch_all(pool)
        .await?;
        let rate_of = plan
            .iter()
            .map(|p| (p.campaign.clone(), p.expected))
            .collect();
        let d = super::super::pacing_distribution(&rows, &rate_of);
        out.campaign_worst = d.max;
        out.campaign_seconds = d.campaign_seconds;
        out.campaign_over_1pct = d.over_1pct;
        // Each capped app's two campaigns summed per second, against its cap.
        let mut by_app: Vec<(String, i64, i64)> = Vec::new();
        for (j, cap) in &caps {
            let mine: Vec<&String> = plan
                .iter()
                .filter(|p| p.app == *j)
                .map(|p| &p.campaign)
                .collect();
            let mut per_second = std::collections::BTreeMap::new();
            for r in rows.iter().filter(|r| mine.contains(&&r.0)) {
                *per_second.entry(r.1).or_insert(0i64) += r.2;
            }
            let name = format!("cap{j}@{cap}");
            by_app.extend(per_second.into_iter().map(|(s, n)| (name.clone(), s, n)));
        }
        let cap_of = caps
            .iter()
            .map(|(j, c)| (format!("cap{j}@{c}"), *c))
            .collect();
        let c = super::super::pacing_distribution(&by_app, &cap_of);
        out.cap_worst = c.max;
        out.cap_seconds = c.campaign_seconds;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn max_min_gives_the_slow_campaign_its_rate_and_splits_the_rest() {
        assert_eq!(max_min(300.0, &[100.0, 400.0]), vec![100.0, 200.0]);
        assert_eq!(max_min(300.0, &[200.0, 250.0]), vec![150.0, 150.0]);
        assert_eq!(max_min(1000.0, &[200.0, 250.0]), vec![200.0, 250.0]);
    }

    #[test]
    fn every_paced_campaign_is_at_least_100_per_second_and_caps_bind() {
        let early: Vec<App> = (0..6)
            .map(|i| App {
                id: format!("r-app-{i:05}"),
                kind: super::super::KINDS[i % 3],
            })
            .collect();
        let (plan, caps) = paced_plan(&early, 6);
        assert_eq!((plan.len(), caps.len()), (12, 3));
        assert!(
            plan.iter().all(|p| p.expected >= 100.0),
            "a share under 100/s"
        );
        for (j, cap) in &caps {
            let mine: Vec<&Paced> = plan.iter().filter(|p| p.app == *j).collect();
            let own: f64 = mine.iter().map(|p| p.rate).sum();
            let got: f64 = mine.iter().map(|p| p.expected).sum();
            assert!(
                *cap < own && (got - cap).abs() < 1e-9,
                "{j}: {own} {got} {cap}"
            );
        }
    }
}
