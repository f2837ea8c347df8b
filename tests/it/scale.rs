//! Issue 24 at 100,000 known campaigns, 1,000 of them active: the API's paged list and a
//! settings change reaching the campaign watcher, timed against the real PostgreSQL.
//! The figures print with `--nocapture` (docs/BENCHMARKS.md, "Issue 24").

use crate::api::{spawn_app, Reply, TestApp};
use crate::helpers::pacing_lock;
use crate::rollup_scale::drop_database;
use pushpace::store::listen::{CampaignWatcher, WatcherConfig};
use std::collections::BTreeSet;
use std::time::{Duration, Instant};
use tokio_util::sync::CancellationToken;

/// Campaigns known.
const KNOWN: i64 = 100_000;
/// Every 100th is active (1,000); of the rest, one in 99 each is paused, halted or
/// cancelled, and the others are done.
const ACTIVE_EVERY: i64 = 100;
/// Seconds of recent `delivery_seconds` rows per active campaign (10 sent each).
const RECENT_SECONDS: i64 = 300;
/// The target for a page of the list.
const PAGE_TARGET: Duration = Duration::from_millis(100);
/// The watcher's promise: a change is published within a second.
const ARRIVAL: Duration = Duration::from_secs(1);
/// Each request is timed this many times; the median is held to the target.
const RUNS: usize = 7;

/// 100,000 campaigns in one parameterised INSERT … SELECT, and the active ones' recent
/// seconds in another (their totals come from the triggers, as in production).
async fn seed(app: &TestApp) {
    sqlx::query(
        "INSERT INTO campaigns (id, send_rate, algorithm, status) \
         SELECT 'c-' || lpad(g::text, 6, '0'), 100, 'gcra', \
                CASE WHEN g % $2 = 0 THEN 'active' \
                     WHEN g % $2 = 1 THEN 'paused' \
                     WHEN g % $2 = 2 THEN 'halted' \
                     WHEN g % $2 = 3 THEN 'cancelled' \
                     ELSE 'done' END \
         FROM generate_series(1, $1::int8) g",
    )
    .bind(KNOWN)
    .bind(ACTIVE_EVERY)
    .execute(&app.pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO delivery_seconds (campaign_id, second, sent) \
         SELECT c.id, date_trunc('second', now()) - s * interval '1 second', 10 \
         FROM campaigns c CROSS JOIN generate_series(1, $1::int8) s \
         WHERE c.status = 'active'",
    )
    .bind(RECENT_SECONDS)
    .execute(&app.pool)
    .await
    .unwrap();
    // What autovacuum does after a bulk load, so the plans see the data.
    sqlx::query("ANALYZE").execute(&app.pool).await.unwrap();
}

fn ids(r: &Reply) -> Vec<String> {
    r.body
        .as_array()
        .unwrap_or_else(|| panic!("an array: {}", r.text))
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

fn next_after(r: &Reply) -> Option<String> {
    r.headers
        .get("x-next-after")
        .map(|v| v.to_str().unwrap().to_string())
}

/// Times `path` [`RUNS`] times; prints and returns the median, and the last reply.
async fn timed(app: &TestApp, path: &str) -> (Duration, Reply) {
    let mut times = Vec::new();
    let mut last = None;
    for _ in 0..RUNS {
        let started = Instant::now();
        let r = app.get(path).await;
        times.push(started.elapsed());
        assert_eq!(r.status, 200, "{path}: {}", r.text);
        last = Some(r);
    }
    times.sort();
    let median = times[RUNS / 2];
    eprintln!(
        "GET {path}: median {median:.1?}, min {:.1?}, max {:.1?} ({RUNS} runs)",
        times[0],
        times[RUNS - 1]
    );
    (median, last.unwrap())
}

/// The list at 100,000 campaigns: a page and a filtered page answer within
/// [`PAGE_TARGET`] (median of [`RUNS`] requests over HTTP, the first one included), and
/// paging by `x-next-after` walks a filter's campaigns exactly once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_pages_of_100k_campaigns_answer_within_100ms_and_changes_reach_the_watcher() {
    let _serial = pacing_lock().await;
    let app = spawn_app().await;
    let started = Instant::now();
    seed(&app).await;
    eprintln!("seeded {KNOWN} campaigns in {:.1?}", started.elapsed());
    // First, while this process has allocated little, so its RSS growth is the watcher's.
    let (watcher, stop_watcher) = start_watcher(&app).await;

    timed_pages(&app).await;
    walk_active_pages(&app).await;
    let started = Instant::now();
    let r = app.get("/api/campaigns").await;
    eprintln!(
        "GET /api/campaigns (all {KNOWN}, unpaged, {:.1} MB of JSON, parsed by the test): {:.1?}",
        r.text.len() as f64 / 1e6,
        started.elapsed()
    );
    assert_eq!(ids(&r).len(), KNOWN as usize);
    assert_eq!(next_after(&r), None, "the whole list has no next page");

    api_changes_reach(&app, &watcher).await;
    stop_watcher.cancel();
    app.app.stop().await.unwrap();
    drop_database(app.pool.clone(), &app.db_url).await;
}

/// Each kind of page, timed and checked; the slowest median is held to [`PAGE_TARGET`].
async fn timed_pages(app: &TestApp) {
    let mut slowest = Duration::ZERO;
    let (t, r) = timed(app, "/api/campaigns?limit=100").await;
    slowest = slowest.max(t);
    assert_eq!(ids(&r).len(), 100);
    assert_eq!(ids(&r)[0], "c-000001");
    assert_eq!(next_after(&r).as_deref(), Some("c-000100"));
    let (t, r) = timed(app, "/api/campaigns?limit=100&after=c-050000").await;
    slowest = slowest.max(t);
    assert_eq!(ids(&r)[0], "c-050001");
    let (t, r) = timed(app, "/api/campaigns?status=active&limit=100").await;
    slowest = slowest.max(t);
    let page = r.body.as_array().unwrap();
    assert_eq!(page.len(), 100);
    assert!(page.iter().all(|c| c["status"] == "active"));
    assert_eq!(page[0]["sent"], 10 * RECENT_SECONDS, "{}", page[0]);
    let (t, _) = timed(app, "/api/campaigns?status=active&limit=100&after=c-050000").await;
    slowest = slowest.max(t);
    let (t, r) = timed(app, "/api/campaigns?status=paused&limit=100").await;
    slowest = slowest.max(t);
    assert!(r
        .body
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == "paused"));
    let (t, r) = timed(app, "/api/campaigns?order=active_first&limit=100").await;
    slowest = slowest.max(t);
    assert!(r
        .body
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["status"] == "active"));
    assert_eq!(next_after(&r).as_deref(), Some("active:c-010000"));
    let (t, r) = timed(
        app,
        "/api/campaigns?order=active_first&limit=100&after=active:c-099000",
    )
    .await;
    slowest = slowest.max(t);
    let page = ids(&r);
    assert_eq!(page.len(), 100);
    assert_eq!(
        page[..2],
        ["c-099100", "c-099200"],
        "the last active, then the rest"
    );
    assert_eq!(page[10], "c-000001");
    assert!(
        slowest <= PAGE_TARGET,
        "the slowest median page took {slowest:?}; the target is {PAGE_TARGET:?}"
    );
}

/// Every active campaign once, in order, through `x-next-after`.
async fn walk_active_pages(app: &TestApp) {
    let mut seen = Vec::new();
    let mut after: Option<String> = None;
    let started = Instant::now();
    loop {
        let path = match &after {
            None => "/api/campaigns?status=active&limit=300".to_string(),
            Some(a) => format!("/api/campaigns?status=active&limit=300&after={a}"),
        };
        let r = app.get(&path).await;
        assert_eq!(r.status, 200, "{}", r.text);
        seen.extend(ids(&r));
        after = next_after(&r);
        if after.is_none() {
            break;
        }
    }
    eprintln!(
        "walked {} active campaigns in pages of 300: {:.1?}",
        seen.len(),
        started.elapsed()
    );
    let distinct: BTreeSet<&String> = seen.iter().collect();
    assert_eq!(seen.len(), (KNOWN / ACTIVE_EVERY) as usize);
    assert_eq!(distinct.len(), seen.len(), "no campaign twice");
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "by id");
}

/// Resident memory of this process, in bytes (Linux).
fn rss_bytes() -> u64 {
    let statm = std::fs::read_to_string("/proc/self/statm").unwrap_or_default();
    let pages: u64 = statm
        .split_whitespace()
        .nth(1)
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    pages * 4096
}

/// A campaign watcher holding all 100,000 campaigns and LISTENing; prints its load time
/// and this process's RSS growth.
async fn start_watcher(app: &TestApp) -> (CampaignWatcher, CancellationToken) {
    let stop = CancellationToken::new();
    let rss_before = rss_bytes();
    let started = Instant::now();
    let config = WatcherConfig {
        refresh_interval: Duration::from_secs(600),
        ..WatcherConfig::default()
    };
    let watcher = CampaignWatcher::start(app.pool.clone(), config, stop.clone())
        .await
        .unwrap();
    let grown = rss_bytes().saturating_sub(rss_before);
    eprintln!(
        "watcher loaded {} campaigns in {:.1?}; RSS grew {:.1} MB ({} bytes per campaign)",
        watcher.current().len(),
        started.elapsed(),
        grown as f64 / 1e6,
        grown / KNOWN as u64
    );
    assert_eq!(watcher.current().len(), KNOWN as usize);
    // Its LISTEN is in place once the first full re-read after connecting is done.
    let listening = Instant::now() + Duration::from_secs(10);
    while watcher.stats().full_reads < 2 {
        assert!(Instant::now() < listening, "the watcher LISTENs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    (watcher, stop)
}

/// A `PUT` through the API reaches the watcher within [`ARRIVAL`], each of five times.
async fn api_changes_reach(app: &TestApp, watcher: &CampaignWatcher) {
    let mut arrivals = Vec::new();
    for (i, id) in ["c-000007", "c-050000", "c-099999", "c-012345", "c-077777"]
        .into_iter()
        .enumerate()
    {
        let rate = 200.0 + i as f64;
        let mut snapshots = watcher.subscribe();
        let started = Instant::now();
        let r = app
            .put(
                &format!("/api/campaigns/{id}"),
                &format!("{{\"send_rate\": {rate}}}"),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.text);
        tokio::time::timeout(
            ARRIVAL,
            snapshots.wait_for(|s| s.get(id).map(|c| c.send_rate) == Some(rate)),
        )
        .await
        .unwrap_or_else(|_| panic!("the change of {id} arrived within {ARRIVAL:?}"))
        .unwrap();
        arrivals.push(started.elapsed());
    }
    eprintln!("API change to watcher with {KNOWN} campaigns: {arrivals:.1?}");
}
