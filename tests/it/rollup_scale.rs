//! Issue 24, "history that stays cheap", timed against the real PostgreSQL: a 30-day
//! chart with 1,000 campaigns' history present, the bytes each row costs, and a rollup
//! in batches next to a flush. The figures print with `--nocapture`
//! (docs/BENCHMARKS.md, "Issue 24").

use crate::helpers::{drop_database_named, fresh_database, pacing_lock, pg_server};
use crate::rollup::{flush, stored};
use chrono::{DateTime, Duration, Utc};
use pushpace::store::delivery;
use pushpace::store::rollup::{self, whole_minute};
use sqlx::PgPool;
use std::time::{Duration as StdDuration, Instant};

/// The target for a 30-day chart of one campaign.
const CHART_TARGET: StdDuration = StdDuration::from_millis(200);
/// Campaigns whose history is present besides the one charted.
const OTHERS: i64 = 1000;
/// Each read is timed this many times; the median is held to the target.
const RUNS: usize = 7;

/// Bytes per row of `table` (heap, indexes and TOAST together) and its row count.
async fn bytes_per_row(pool: &PgPool, table: &str) -> (f64, i64) {
    let (size, rows): (i64, i64) = sqlx::query_as(
        "SELECT pg_total_relation_size($1::regclass), \
                (SELECT reltuples::int8 FROM pg_class WHERE oid = $1::regclass)",
    )
    .bind(table)
    .fetch_one(pool)
    .await
    .unwrap();
    (size as f64 / rows.max(1) as f64, rows)
}

/// Seeds, for `now` (a whole minute):
/// - 1,000 other campaigns (`h-0001` … `h-1000`): one `delivery_minutes` row every 10
///   minutes over the 30 days before `now`, 4,320 each, 4.32 M rows (every minute would
///   be 43.2 M rows: too many for a test);
/// - the charted campaign `h-target` as one that sent every second for 30 days holds it
///   after a rollup at the default 48 h: a minute row at every minute from 30 days to
///   48 h before `now` (40,320 rows), and a second row at every second of the last 48 h
///   (172,800 rows), 1 sent each.
async fn seed_history(pool: &PgPool, now: DateTime<Utc>) {
    let month_ago = now - Duration::days(30);
    let rolled_at = now - Duration::hours(48);
    sqlx::query(
        "INSERT INTO delivery_minutes (campaign_id, minute, sent) \
         SELECT 'h-' || lpad(c::text, 4, '0'), m, 600 \
         FROM generate_series(1, $1::int8) c \
         CROSS JOIN generate_series($2::timestamptz, $3::timestamptz - interval '1 minute', \
                                    interval '10 minutes') m \
         ORDER BY 1, 2",
    )
    .bind(OTHERS)
    .bind(month_ago)
    .bind(now)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO delivery_minutes (campaign_id, minute, sent) \
         SELECT 'h-target', m, 60 FROM generate_series($1::timestamptz, \
             $2::timestamptz - interval '1 minute', interval '1 minute') m",
    )
    .bind(month_ago)
    .bind(rolled_at)
    .execute(pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO delivery_seconds (campaign_id, second, sent) \
         SELECT 'h-target', s, 1 FROM generate_series($1::timestamptz, \
             $2::timestamptz - interval '1 second', interval '1 second') s",
    )
    .bind(rolled_at)
    .bind(now)
    .execute(pool)
    .await
    .unwrap();
    // What autovacuum does after a bulk load, so the plans and reltuples see the data.
    sqlx::query("VACUUM ANALYZE delivery_minutes")
        .execute(pool)
        .await
        .unwrap();
    sqlx::query("VACUUM ANALYZE delivery_seconds")
        .execute(pool)
        .await
        .unwrap();
    settle(pool).await;
}

/// Drops a test's database once it passed: these hold up to 700 MB each.
pub async fn drop_database(pool: PgPool, url: &str) {
    pool.close().await;
    let name = url.rsplit('/').next().unwrap();
    let admin = pushpace::store::connect(
        &format!("{}/postgres", pg_server()),
        1,
        StdDuration::from_secs(10),
    )
    .await
    .unwrap();
    drop_database_named(&admin, name).await.unwrap();
    admin.close().await;
}

/// Writes the seeding's dirty pages out now (a CHECKPOINT), so that neither they nor an
/// earlier test's stall the statements timed next.
async fn settle(pool: &PgPool) {
    sqlx::query("CHECKPOINT").execute(pool).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_30_day_chart_with_1000_campaigns_history_answers_within_200ms() {
    let _serial = pacing_lock().await;
    let (pool, url) = fresh_database().await;
    let now = whole_minute(Utc::now());
    let started = Instant::now();
    seed_history(&pool, now).await;
    eprintln!("seeded the history in {:.1?}", started.elapsed());
    let (minute_bytes, minutes) = bytes_per_row(&pool, "delivery_minutes").await;
    let (second_bytes, seconds) = bytes_per_row(&pool, "delivery_seconds").await;
    eprintln!(
        "delivery_minutes: {minutes} rows, {minute_bytes:.1} bytes per row, \
         {:.0} kB per campaign-day at every minute",
        minute_bytes * 1440.0 / 1000.0
    );
    eprintln!(
        "delivery_seconds: {seconds} rows, {second_bytes:.1} bytes per row, \
         {:.1} MB per campaign-day at every second",
        second_bytes * 86_400.0 / 1e6
    );

    let from = now - Duration::days(30);
    let step = delivery::auto_step_long(from, now);
    let mut times = Vec::new();
    for _ in 0..RUNS {
        let started = Instant::now();
        let points = delivery::series_long(&pool, "h-target", from, now, step)
            .await
            .unwrap();
        times.push(started.elapsed());
        assert!((240..=241).contains(&points.len()), "{}", points.len());
        let sent: i64 = points.iter().map(|p| p.sent).sum();
        assert_eq!(sent, 30 * 86_400, "every second of the 30 days, once");
    }
    times.sort();
    let median = times[RUNS / 2];
    eprintln!(
        "30-day chart of h-target (step {step} s, about 240 points, 40,320 minutes + 172,800 \
         seconds read): median {median:.1?}, min {:.1?}, max {:.1?} ({RUNS} runs)",
        times[0],
        times[RUNS - 1]
    );
    assert!(
        median <= CHART_TARGET,
        "the 30-day chart took {median:?}; the target is {CHART_TARGET:?}"
    );
    drop_database(pool, &url).await;
}

/// Old seconds to roll up: 1,000 campaigns × 300 s, three days ago.
const OLD_SECONDS: i64 = 300;
/// Rows per rollup statement: `stats prune`'s default batch.
const BATCH: i64 = 10_000;
/// Scheduling slack on two shared cores, on top of a batch and a flush's own time.
const SLACK: StdDuration = StdDuration::from_millis(50);

/// One flush like the flusher's: 100 campaigns' current second, and one old second of
/// another campaign that a rollup batch may hold at that moment.
async fn timed_flush(pool: &PgPool, i: i64, old: DateTime<Utc>) -> StdDuration {
    let now = Utc::now();
    let ids: Vec<String> = (1..=100).map(|c| format!("live-{c:03}")).collect();
    let mut rows: Vec<(&str, DateTime<Utc>, i64)> =
        ids.iter().map(|c| (c.as_str(), now, 1)).collect();
    let victim = format!("o-{:04}", i % OTHERS + 1);
    rows.push((&victim, old + Duration::seconds(i * 7 % OLD_SECONDS), 1));
    let started = Instant::now();
    flush(pool, &rows).await;
    started.elapsed()
}

fn summary(name: &str, times: &mut [StdDuration]) -> StdDuration {
    times.sort();
    let max = times[times.len() - 1];
    eprintln!(
        "{name}: {} runs, median {:.1?}, min {:.1?}, max {max:.1?}",
        times.len(),
        times[times.len() / 2],
        times[0]
    );
    max
}

/// A rollup of 300,000 old seconds in batches of 10,000 while flushes run every 10 ms, one
/// old second each (which a batch may hold locked): no flush waits longer than the
/// longest batch plus a flush's own time (plus [`SLACK`]), and afterwards every
/// campaign's seconds and minutes add up to its totals.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_rollup_in_batches_holds_a_concurrent_flush_for_at_most_one_batch() {
    let _serial = pacing_lock().await;
    let (pool, url) = fresh_database().await;
    let old = whole_minute(Utc::now()) - Duration::days(3);
    sqlx::query(
        "INSERT INTO delivery_seconds (campaign_id, second, sent) \
         SELECT 'o-' || lpad(c::text, 4, '0'), $2::timestamptz + s * interval '1 second', 2 \
         FROM generate_series(1, $1::int8) c CROSS JOIN generate_series(0, $3::int8 - 1) s",
    )
    .bind(OTHERS)
    .bind(old)
    .bind(OLD_SECONDS)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query("VACUUM ANALYZE delivery_seconds")
        .execute(&pool)
        .await
        .unwrap();
    settle(&pool).await;
    let mut baseline = Vec::new();
    for i in 0..50 {
        baseline.push(timed_flush(&pool, i, old).await);
        tokio::time::sleep(StdDuration::from_millis(10)).await;
    }
    let baseline_max = summary("flush alone", &mut baseline);

    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let flusher_pool = pool.clone();
    let flushes = tokio::spawn(async move {
        let mut times = Vec::new();
        let mut i = 50;
        while !*stop_rx.borrow_and_update() {
            times.push(timed_flush(&flusher_pool, i, old).await);
            i += 1;
            tokio::time::sleep(StdDuration::from_millis(10)).await;
        }
        times
    });
    let cutoff = old + Duration::days(1);
    let mut batches = Vec::new();
    let mut rolled = 0;
    let started = Instant::now();
    loop {
        let t = Instant::now();
        let (seconds, _) = rollup::roll_up_batch(&pool, cutoff, BATCH).await.unwrap();
        batches.push(t.elapsed());
        rolled += seconds;
        if seconds < BATCH as u64 {
            break;
        }
    }
    let total = started.elapsed();
    stop_tx.send(true).unwrap();
    let mut during = flushes.await.unwrap();
    eprintln!(
        "rolled up {rolled} seconds in {} batches of {BATCH}: {total:.1?}",
        batches.len()
    );
    let batch_max = summary("rollup batch", &mut batches);
    let flush_max = summary("flush during the rollup", &mut during);
    let held = during.iter().filter(|t| **t > baseline_max).count();
    eprintln!(
        "flushes slower than the slowest flush alone: {held} of {}",
        during.len()
    );
    assert!(rolled >= (OTHERS * OLD_SECONDS) as u64);
    assert!(
        flush_max <= batch_max + baseline_max + SLACK,
        "a flush waited {flush_max:?}: more than a batch ({batch_max:?}) and a flush \
         ({baseline_max:?})"
    );

    // Exact: for every campaign, seconds + minutes = its totals.
    let mismatched: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM (SELECT campaign_id, sum(sent) AS sent FROM campaign_totals \
                               GROUP BY 1) t \
         FULL JOIN (SELECT campaign_id, sum(sent) AS sent FROM \
                        (SELECT campaign_id, sent FROM delivery_seconds \
                         UNION ALL SELECT campaign_id, sent FROM delivery_minutes) r \
                    GROUP BY 1) s USING (campaign_id) \
         WHERE t.sent IS DISTINCT FROM s.sent",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        mismatched, 0,
        "every campaign's counts add up to its totals"
    );
    let victim = stored(&pool, "o-0001").await;
    assert!(victim.sent >= 2 * OLD_SECONDS, "{victim:?}");
    drop_database(pool, &url).await;
}
