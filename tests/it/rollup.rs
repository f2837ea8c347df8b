//! The rollup of old seconds into minutes (issue 24) against the real PostgreSQL: exact
//! (no count lost or doubled, totals unchanged), and the long series that reads both
//! tables. The timed runs are in tests/it/rollup_scale.rs.

use crate::helpers::fresh_database;
use chrono::{DateTime, Duration, Utc};
use pushpace::store::delivery::{self, Point};
use pushpace::store::rollup::{self, whole_minute};
use pushpace::store::{self, Totals};
use sqlx::PgPool;

/// Adds counts into `delivery_seconds` the way the flusher does (INSERT … ON CONFLICT DO
/// UPDATE adding), so the totals triggers fire as they do in production.
pub async fn flush(pool: &PgPool, rows: &[(&str, DateTime<Utc>, i64)]) {
    let ids: Vec<&str> = rows.iter().map(|r| r.0).collect();
    let seconds: Vec<DateTime<Utc>> = rows.iter().map(|r| r.1).collect();
    let sent: Vec<i64> = rows.iter().map(|r| r.2).collect();
    sqlx::query(FLUSH)
        .bind(&ids)
        .bind(&seconds)
        .bind(&sent)
        .execute(pool)
        .await
        .unwrap();
}

/// `sent` as given; every other count derived from it, so each column is checked.
pub const FLUSH: &str = "\
INSERT INTO delivery_seconds AS d
    (campaign_id, second, sent, failed, retried, skipped_invalid, capped, invalid, rejected,
     expired, cancelled)
SELECT u.c, u.s, u.n, u.n % 2, u.n % 3, u.n % 5, u.n % 7, u.n % 11, u.n % 13, u.n % 17, u.n % 19
FROM UNNEST($1::text[], $2::timestamptz[], $3::int8[]) AS u(c, s, n)
ON CONFLICT (campaign_id, second) DO UPDATE SET
    sent = d.sent + EXCLUDED.sent, failed = d.failed + EXCLUDED.failed,
    retried = d.retried + EXCLUDED.retried,
    skipped_invalid = d.skipped_invalid + EXCLUDED.skipped_invalid,
    capped = d.capped + EXCLUDED.capped, invalid = d.invalid + EXCLUDED.invalid,
    rejected = d.rejected + EXCLUDED.rejected, expired = d.expired + EXCLUDED.expired,
    cancelled = d.cancelled + EXCLUDED.cancelled";

/// Every count of `campaign` over both tables.
pub async fn stored(pool: &PgPool, campaign: &str) -> Totals {
    sqlx::query_as(
        "SELECT COALESCE(sum(sent), 0)::int8 AS sent, COALESCE(sum(failed), 0)::int8 AS failed, \
                COALESCE(sum(retried), 0)::int8 AS retried, \
                COALESCE(sum(skipped_invalid), 0)::int8 AS skipped_invalid, \
                COALESCE(sum(capped), 0)::int8 AS capped, \
                COALESCE(sum(invalid), 0)::int8 AS invalid, \
                COALESCE(sum(rejected), 0)::int8 AS rejected, \
                COALESCE(sum(expired), 0)::int8 AS expired, \
                COALESCE(sum(cancelled), 0)::int8 AS cancelled \
         FROM (SELECT sent, failed, retried, skipped_invalid, capped, invalid, rejected, \
                      expired, cancelled FROM delivery_seconds WHERE campaign_id = $1 \
               UNION ALL \
               SELECT sent, failed, retried, skipped_invalid, capped, invalid, rejected, \
                      expired, cancelled FROM delivery_minutes WHERE campaign_id = $1) r",
    )
    .bind(campaign)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn count(pool: &PgPool, table_sql: &str) -> i64 {
    sqlx::query_scalar(table_sql).fetch_one(pool).await.unwrap()
}

fn sum_sent(points: &[Point]) -> i64 {
    points.iter().map(|p| p.sent).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_seconds_become_minutes_exactly_and_totals_stay() {
    let (pool, _) = fresh_database().await;
    let now = whole_minute(Utc::now());
    let old = now - Duration::days(3);
    // Two campaigns, 7 minutes of old seconds (some seconds empty), and recent ones.
    let mut rows = Vec::new();
    for s in (0..420).filter(|s| s % 4 != 1) {
        rows.push(("ra", old + Duration::seconds(s), s % 23 + 1));
        rows.push(("rb", old + Duration::seconds(s * 2), s % 5 + 1));
    }
    for s in 0..30 {
        rows.push(("ra", now - Duration::minutes(5) + Duration::seconds(s), 3));
    }
    flush(&pool, &rows).await;
    let old_rows = count(
        &pool,
        "SELECT count(*) FROM delivery_seconds WHERE second < now() - interval '2 days'",
    )
    .await;
    let totals = (
        store::totals(&pool, "ra").await.unwrap(),
        store::totals(&pool, "rb").await.unwrap(),
    );
    assert_eq!(stored(&pool, "ra").await, totals.0);
    let range = (old - Duration::hours(1), now);
    let before = delivery::series_long(&pool, "ra", range.0, range.1, 60)
        .await
        .unwrap();
    let before_b = delivery::series_long(&pool, "rb", range.0, range.1, 300)
        .await
        .unwrap();

    let report = rollup::roll_up(&pool, Duration::hours(48), 7)
        .await
        .unwrap();
    assert_eq!(report.seconds_rolled as i64, old_rows);
    assert_eq!(report.batches as i64, old_rows / 7 + 1, "{report:?}");
    assert_eq!(
        count(&pool, "SELECT count(*) FROM delivery_seconds").await,
        30,
        "the recent ones stay"
    );
    // 7 minutes of ra and 14 of rb.
    assert_eq!(
        count(&pool, "SELECT count(*) FROM delivery_minutes").await,
        21
    );
    assert_eq!(
        (
            store::totals(&pool, "ra").await.unwrap(),
            store::totals(&pool, "rb").await.unwrap()
        ),
        totals,
        "no trigger fired: the totals did not change"
    );
    assert_eq!(
        stored(&pool, "ra").await,
        totals.0,
        "nothing lost or doubled"
    );
    assert_eq!(stored(&pool, "rb").await, totals.1);
    let after = delivery::series_long(&pool, "ra", range.0, range.1, 60)
        .await
        .unwrap();
    assert_eq!(after, before, "the same chart from minutes as from seconds");
    let after_b = delivery::series_long(&pool, "rb", range.0, range.1, 300)
        .await
        .unwrap();
    assert_eq!(after_b, before_b);
    let minutes = delivery::series_minutes(&pool, "ra", old, old + Duration::minutes(10))
        .await
        .unwrap();
    assert_eq!(minutes.len(), 10, "zeros filled");
    assert_eq!(
        minutes[..7],
        before[60..67],
        "ra's old minutes, an hour into the range"
    );
    assert_eq!(sum_sent(&minutes[7..]), 0);

    // A late flush into a second already rolled up: a new second, added into its minute
    // by the next rollup.
    flush(&pool, &[("ra", old + Duration::seconds(5), 1000)]).await;
    let totals_late = store::totals(&pool, "ra").await.unwrap();
    assert_eq!(totals_late.sent, totals.0.sent + 1000);
    let again = rollup::roll_up(&pool, Duration::hours(48), 7)
        .await
        .unwrap();
    assert_eq!((again.seconds_rolled, again.minutes_written), (1, 1));
    assert_eq!(stored(&pool, "ra").await, totals_late);
    assert_eq!(
        count(&pool, "SELECT count(*) FROM delivery_minutes").await,
        21
    );
    let late = delivery::series_long(&pool, "ra", range.0, range.1, 60)
        .await
        .unwrap();
    assert_eq!(late[60].sent, before[60].sent + 1000);
    assert_eq!(sum_sent(&late), sum_sent(&before) + 1000);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_whole_minutes_before_the_cutoff_are_rolled_and_retention_deletes_minutes() {
    let (pool, _) = fresh_database().await;
    let t = whole_minute(Utc::now()) - Duration::days(10);
    flush(
        &pool,
        &[
            ("w", t - Duration::seconds(1), 1),
            ("w", t + Duration::seconds(10), 2),
            ("w", t + Duration::seconds(40), 4),
        ],
    )
    .await;
    // The cutoff is 30 s into the minute: that minute is not rolled up at all.
    let report = rollup::roll_up_before(&pool, t + Duration::seconds(30), 100)
        .await
        .unwrap();
    assert_eq!(
        (
            report.seconds_rolled,
            report.minutes_written,
            report.batches
        ),
        (1, 1, 1)
    );
    assert_eq!(
        count(&pool, "SELECT count(*) FROM delivery_seconds").await,
        2
    );
    assert_eq!(
        rollup::roll_up_batch(&pool, t, 0)
            .await
            .unwrap_err()
            .field(),
        Some("batch")
    );
    // A minute row that is not a whole minute is refused by the schema.
    let bad = sqlx::query("INSERT INTO delivery_minutes (campaign_id, minute) VALUES ('w', $1)")
        .bind(t + Duration::seconds(1))
        .execute(&pool)
        .await;
    assert!(bad.is_err());
    // Retention deletes minutes as it deletes seconds.
    let pruned = store::prune_before(&pool, t, 10).await.unwrap();
    assert_eq!((pruned.minutes_deleted, pruned.seconds_deleted), (1, 0));
    assert_eq!(stored(&pool, "w").await.sent, 6);
}

#[tokio::test]
async fn long_series_check_their_step_and_range() {
    let (pool, _) = fresh_database().await;
    let to = Utc::now();
    let month = to - Duration::days(30);
    for bad in [0, 59, 90, 86_460] {
        let e = delivery::series_long(&pool, "x", month, to, bad)
            .await
            .unwrap_err();
        assert_eq!(e.field(), Some("step"), "{bad}");
    }
    // 30 days a minute apiece is 43,200 points: too many.
    let e = delivery::series_long(&pool, "x", month, to, 60)
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("step"));
    let e = delivery::series_long(&pool, "x", to, month, 3600)
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("to"));
    let e = delivery::series_long(&pool, "x", to - Duration::days(401), to, 86_400)
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("to"));
    let e = delivery::series_minutes(&pool, "x", to - Duration::days(32), to)
        .await
        .unwrap_err();
    assert_eq!(e.field(), Some("to"));
    assert!(delivery::series_long(&pool, "x", to, to, 60)
        .await
        .unwrap()
        .is_empty());
    let step = delivery::auto_step_long(month, to);
    assert_eq!(step, 10_800, "30 days in 240 points of 3 h");
    let points = delivery::series_long(&pool, "x", month, to, step)
        .await
        .unwrap();
    assert!((240..=241).contains(&points.len()), "{}", points.len());
    assert_eq!(delivery::auto_step_long(to - Duration::hours(6), to), 60);
}
