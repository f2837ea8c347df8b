//! Finish-by pacing: the rate planned from what remains and the time left.

use super::*;
use chrono::{DateTime, Utc};
use pushpace::job::Job;

/// A release stamp on the wall clock: stamps count from the sink's start, which is any
/// arrival's wall time less its own time since that start.
fn wall(arrivals: &[pushpace::tools::sink::Arrival], released: Duration) -> DateTime<Utc> {
    let a = arrivals.first().expect("an arrival");
    DateTime::<Utc>::from(a.wall - a.at + released)
}

/// `n` jobs of `devices` for `campaign`, stating the campaign's total (the plan's
/// `total` basis).
fn sized_jobs(campaign: &str, n: usize, devices: usize) -> Vec<Job> {
    let mut list = jobs(campaign, 1.0, n, devices);
    for j in &mut list {
        j.send_rate = None;
        j.lifecycle.campaign_total_devices = Some((n * devices) as u64);
    }
    list
}

/// A planned rate is held within this (the plan aims a second early and is worked out
/// again every second from the store's counts, which lag by a flush).
const PLAN_TOLERANCE: f64 = 0.03;
/// "Within 2 s of its deadline" (the bound): the plan aims 1 s early.
const DEADLINE_SLACK: chrono::Duration = chrono::Duration::seconds(2);

/// Starts the worker on a warm-up campaign (so that the deadline does not count the
/// group join), then stores `campaign` due in `secs` and produces `n` jobs of
/// `devices` for it; returns the deadline.
async fn due_in(
    tw: &mut TestWorker,
    campaign: &str,
    secs: i64,
    n: usize,
    devices: usize,
) -> DateTime<Utc> {
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let warm = name("warm");
    produce_jobs(&topic, &jobs(&warm, 1_000.0, 1, 10), None).await;
    tw.start().await;
    wait_for("the worker sending", GROUP_JOIN_LIMIT, || {
        sink.campaign(&warm).is_some_and(|s| s.delivered == 10)
    })
    .await;
    let deadline = Utc::now() + chrono::Duration::seconds(secs);
    let patch = CampaignPatch {
        finish_by: Some(Some(deadline)),
        ..Default::default()
    };
    store(&pool, campaign, patch).await;
    produce_jobs(&topic, &sized_jobs(campaign, n, devices), None).await;
    deadline
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_120000_devices_due_in_60_s_run_at_about_2000_per_s_and_finish_on_time() {
    let _serial = pacing_lock().await;
    let mut tw = TestWorker::options().partitions(2).prepare().await;
    let sink = tw.sink();
    let campaign = name("due");
    let deadline = due_in(&mut tw, &campaign, 60, 12, 10_000).await;
    wait_for("every device sent", Duration::from_secs(75), || {
        sink.campaign(&campaign)
            .is_some_and(|s| s.distinct_delivered == 120_000)
    })
    .await;
    tw.stop().await;
    let arrivals = sink.arrivals();
    let times = released(&arrivals, &campaign);
    let (first, last) = (times[0], times[times.len() - 1]);
    // The middle of the run, away from the first plan's second and the last devices.
    let (from, to) = (
        first + Duration::from_secs(5),
        first + Duration::from_secs(45),
    );
    let rate = count_in(&times, from, to) as f64 / 40.0;
    let planned = 120_000.0 / 59.0;
    eprintln!(
        "{rate}/s in seconds 5-45; last device {:?} after the first, deadline {deadline}",
        last - first
    );
    assert!(
        (rate - planned).abs() <= planned * PLAN_TOLERANCE,
        "sent {rate}/s in the middle of the run; 120,000 devices in the 59 s aimed at is {planned}/s"
    );
    let ended = wall(&arrivals, last);
    eprintln!(
        "last device at {ended}, {} from the deadline",
        ended - deadline
    );
    assert!(
        (ended - deadline).abs() <= DEADLINE_SLACK,
        "the last device went at {ended}, the deadline is {deadline}"
    );
}

/// `limiter.global_rate` in the halving test: room for the plan (30,000 devices in
/// 29 s, about 1,034/s) until a second campaign shares it.
const HALVED_CAP: f64 = 1_100.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_cap_that_halves_the_rate_midway_shows_behind_and_the_projected_finish() {
    let _serial = pacing_lock().await;
    let mut tw = TestWorker::options()
        .partitions(2)
        .api()
        .settings(&[("limiter.global_rate", HALVED_CAP.to_string())])
        .prepare()
        .await;
    let (sink, topic) = (tw.sink(), tw.topic.clone());
    let campaign = name("halved");
    let deadline = due_in(&mut tw, &campaign, 30, 3, 10_000).await;
    let api = tw.take_api();
    wait_for("a third sent", Duration::from_secs(30), || {
        sink.campaign(&campaign)
            .is_some_and(|s| s.delivered >= 10_000)
    })
    .await;
    // A second campaign under the same cap, wanting more than half of it: weighted
    // max-min gives each half, about half of the plan (1,034/s), so the deadline cannot
    // be met. (20,000 devices: it outlasts the test at its share.)
    let rival = name("rival");
    produce_jobs(&topic, &jobs(&rival, 1_000.0, 4, 5_000), None).await;
    let half = HALVED_CAP / 2.0;
    wait_for("the rival sending", Duration::from_secs(10), || {
        sink.campaign(&rival).is_some_and(|s| s.delivered > 0)
    })
    .await;
    // The share reaches the limiter at once, and the progress two flushes later.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let view = api.get(&format!("/api/campaigns/{campaign}")).await.body;
    let now = Utc::now();
    let delivered = sink.campaign(&campaign).map_or(0, |s| s.distinct_delivered);
    tw.stop().await;
    api.app.stop().await.expect("server stops");
    let policy = &view["policy"];
    assert_eq!(policy["behind"], true, "{view:#}");
    // Its jobs state campaign_total_devices: the plan counts from the total.
    assert_eq!(policy["plan_basis"], "total", "{view:#}");
    let projected: DateTime<Utc> = policy["projected_finish"]
        .as_str()
        .and_then(|t| t.parse().ok())
        .unwrap_or_else(|| panic!("a projected finish: {view:#}"));
    let expected =
        now + chrono::Duration::milliseconds(((30_000 - delivered) as f64 / half * 1000.0) as i64);
    eprintln!(
        "halved: projected {projected}, expected {expected} ({delivered} of 30,000 sent, \
         {half}/s), deadline {deadline}; eta {}",
        view["eta"]
    );
    // The view is as old as the progress it read (a flush and a publish: 2 s), and the
    // devices in flight count as remaining.
    assert!(
        (projected - expected).abs() <= chrono::Duration::seconds(3),
        "projected {projected}, expected about {expected} ({delivered} of 30,000 sent, {half}/s)"
    );
    assert!(projected > deadline, "the projection is past the deadline");
}
