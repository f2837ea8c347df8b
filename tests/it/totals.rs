//! `campaign_totals`: the lifetime counts that triggers on `delivery_seconds` keep in the
//! flush's own transaction, against the real PostgreSQL with the real flusher.

use crate::helpers::{fresh_database, pg_server, unique_name};
use pushpace::stats::{Flusher, FlusherConfig, Outcome, StatsRecorder};
use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch};
use pushpace::store::{self, Totals};
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::time::Duration;
use tokio_util::sync::CancellationToken;

/// An arbitrary second (2027) to record at, so tests do not depend on the wall clock.
const BASE: u64 = 1_800_000_000;

const OUTCOMES: [Outcome; 9] = [
    Outcome::Sent,
    Outcome::Failed,
    Outcome::Retried,
    Outcome::SkippedInvalid,
    Outcome::Capped,
    Outcome::Invalid,
    Outcome::Rejected,
    Outcome::Expired,
    Outcome::Cancelled,
];

fn fast_config() -> FlusherConfig {
    FlusherConfig {
        interval: Duration::from_millis(10),
        max_pending_rows: 100_000,
        retry_min: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        final_flush_timeout: Duration::from_secs(10),
        ..FlusherConfig::default()
    }
}

fn add(totals: &mut Totals, outcome: Outcome, n: u32) {
    let n = i64::from(n);
    match outcome {
        Outcome::Sent => totals.sent += n,
        Outcome::Failed => totals.failed += n,
        Outcome::Retried => totals.retried += n,
        Outcome::SkippedInvalid => totals.skipped_invalid += n,
        Outcome::Capped => totals.capped += n,
        Outcome::Invalid => totals.invalid += n,
        Outcome::Rejected => totals.rejected += n,
        Outcome::Expired => totals.expired += n,
        Outcome::Cancelled => totals.cancelled += n,
    }
}

/// Every campaign's sums over `delivery_seconds`, computed the slow way.
async fn summed(pool: &PgPool) -> BTreeMap<String, Totals> {
    type Row = (String, i64, i64, i64, i64, i64, i64, i64, i64, i64);
    let rows: Vec<Row> = sqlx::query_as(
        "SELECT campaign_id, sum(sent)::int8, sum(failed)::int8, sum(retried)::int8, \
                sum(skipped_invalid)::int8, sum(capped)::int8, sum(invalid)::int8, \
                sum(rejected)::int8, sum(expired)::int8, sum(cancelled)::int8 \
         FROM delivery_seconds GROUP BY campaign_id",
    )
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|r| {
            let totals = Totals {
                sent: r.1,
                failed: r.2,
                retried: r.3,
                skipped_invalid: r.4,
                capped: r.5,
                invalid: r.6,
                rejected: r.7,
                expired: r.8,
                cancelled: r.9,
            };
            (r.0, totals)
        })
        .collect()
}

/// Every campaign's totals as `store::totals` reads them.
async fn stored(pool: &PgPool, ids: impl IntoIterator<Item = &String>) -> BTreeMap<String, Totals> {
    let mut out = BTreeMap::new();
    for id in ids {
        out.insert(id.clone(), store::totals(pool, id).await.unwrap());
    }
    out
}

#[tokio::test]
async fn totals_follow_flushes_that_insert_and_then_add_into_the_same_seconds() {
    let (pool, _) = fresh_database().await;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), pool.clone(), fast_config());
    let ids: Vec<String> = ["alpha", "beta", "gamma"].map(String::from).to_vec();
    let mut expected: BTreeMap<String, Totals> = BTreeMap::new();
    for round in 0..6u32 {
        for (c, id) in ids.iter().enumerate() {
            let counter = recorder.campaign(id);
            // Seconds BASE..BASE+3 are written by every round (updates after the first);
            // BASE+4+round is new in each round (inserts), in the same statements.
            for (s, second) in [
                BASE,
                BASE + 1,
                BASE + 2,
                BASE + 3,
                BASE + 4 + u64::from(round),
            ]
            .into_iter()
            .enumerate()
            {
                let outcome = OUTCOMES[(s + c + round as usize) % OUTCOMES.len()];
                let n = 1 + round * 7 + c as u32 * 3 + s as u32;
                counter.record(second, outcome, n);
                add(expected.entry(id.clone()).or_default(), outcome, n);
            }
        }
        let report = flusher.flush_now().await.unwrap();
        assert_eq!(report.batches, 1);
        assert_eq!(stored(&pool, &ids).await, expected, "after round {round}");
    }
    assert_eq!(summed(&pool).await, expected);

    // Plain SQL goes through the same triggers: an UPDATE (new minus old, also when it
    // lowers a count) and an INSERT.
    sqlx::query(
        "UPDATE delivery_seconds SET sent = sent + 5, failed = 0 \
         WHERE campaign_id = 'alpha' AND second = to_timestamp($1)",
    )
    .bind(BASE as f64)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO delivery_seconds (campaign_id, second, sent, capped) \
         VALUES ('delta', to_timestamp($1), 2, 9)",
    )
    .bind(BASE as f64)
    .execute(&pool)
    .await
    .unwrap();
    let sums = summed(&pool).await;
    let all: Vec<String> = sums.keys().cloned().collect();
    assert_eq!(stored(&pool, &all).await, sums);
    assert_eq!(sums["delta"].capped, 9);
    assert_eq!(
        store::totals(&pool, "nothing").await.unwrap(),
        Totals::default()
    );

    // The API's list reads the same totals.
    campaigns::put(
        &pool,
        "alpha",
        &CampaignPatch::default(),
        &CampaignDefaults::default(),
    )
    .await
    .unwrap();
    let list = campaigns::list(&pool, chrono::Utc::now()).await.unwrap();
    assert_eq!(list.len(), 1);
    let alpha = &sums["alpha"];
    assert_eq!(
        (list[0].sent, list[0].failed, list[0].retried),
        (alpha.sent, alpha.failed, alpha.retried)
    );

    // Retention deletes seconds; the totals are lifetime counts and stay.
    let cutoff = chrono::DateTime::from_timestamp(BASE as i64 + 1000, 0).unwrap();
    let report = store::prune_before(&pool, cutoff, 7).await.unwrap();
    assert!(report.seconds_deleted > 0);
    assert!(summed(&pool).await.is_empty());
    assert_eq!(stored(&pool, &all).await, sums);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_flushers_on_shared_campaigns_stay_exact() {
    const FLUSHERS: usize = 4;
    const CAMPAIGNS: usize = 6;
    let (pool, _) = fresh_database().await;
    let stop = CancellationToken::new();
    let ids: Vec<String> = (0..CAMPAIGNS).map(|c| format!("shared-{c}")).collect();
    let mut workers = Vec::new();
    for k in 0..FLUSHERS {
        let recorder = StatsRecorder::new();
        let flusher = Flusher::new(recorder.clone(), pool.clone(), fast_config());
        let task = flusher.spawn(stop.clone());
        let ids = ids.clone();
        // Each worker moves through the seconds at its own pace and visits the campaigns
        // in its own order, so that one statement inserts some campaigns' seconds while
        // adding into others' that another worker has just inserted.
        let recording = tokio::spawn(async move {
            let mut expected: BTreeMap<String, Totals> = BTreeMap::new();
            let mut rng = fastrand::Rng::with_seed(k as u64);
            for i in 0..2000u64 {
                for c in 0..CAMPAIGNS {
                    let id = &ids[(c + k) % CAMPAIGNS];
                    let second = BASE + (i * (k as u64 + 1) / 3 + c as u64) % 40;
                    let outcome = OUTCOMES[rng.usize(..OUTCOMES.len())];
                    let n = rng.u32(1..50);
                    recorder.campaign(id).record(second, outcome, n);
                    add(expected.entry(id.clone()).or_default(), outcome, n);
                }
                if i % 8 == 0 {
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }
            expected
        });
        workers.push((flusher, task, recording));
    }
    let mut expected: BTreeMap<String, Totals> = BTreeMap::new();
    let mut flushers = Vec::new();
    for (flusher, task, recording) in workers {
        for (id, t) in recording.await.unwrap() {
            let e = expected.entry(id).or_default();
            e.sent += t.sent;
            e.failed += t.failed;
            e.retried += t.retried;
            e.skipped_invalid += t.skipped_invalid;
            e.capped += t.capped;
            e.invalid += t.invalid;
            e.rejected += t.rejected;
            e.expired += t.expired;
            e.cancelled += t.cancelled;
        }
        flushers.push((flusher, task));
    }
    stop.cancel();
    for (flusher, task) in flushers {
        task.await.unwrap().unwrap();
        assert!(
            flusher.batches_committed() > 5,
            "{flusher:?} flushed several times"
        );
        // A failed flush (a deadlock, say) would be retried and hidden in the counts.
        assert_eq!(flusher.failed_writes(), 0, "{flusher:?} never failed");
    }
    assert_eq!(summed(&pool).await, expected);
    assert_eq!(stored(&pool, &ids).await, expected);
}

/// How long the injected trigger holds each flush between its UPDATE and INSERT passes:
/// long enough that two flushes surely overlap there, well under the deadlock timeout
/// (1 s) so that a lock wait alone would not fail.
const PAUSE_BETWEEN_PASSES: &str = "0.3";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flushes_crossing_between_their_update_and_insert_passes_do_not_deadlock() {
    let (pool, _) = fresh_database().await;
    // The worst interleaving, made certain: each flush pauses after the UPDATE statement
    // trigger (triggers of one event fire in name order) and before the INSERT one.
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION pause_between_passes() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN PERFORM pg_sleep({PAUSE_BETWEEN_PASSES}); RETURN NULL; END $$; \
         CREATE TRIGGER campaign_totals_add_updated_pause AFTER UPDATE ON delivery_seconds \
         FOR EACH STATEMENT EXECUTE FUNCTION pause_between_passes();"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let first = StatsRecorder::new();
    first.campaign("a").record(BASE, Outcome::Sent, 1);
    first.campaign("b").record(BASE, Outcome::Sent, 1);
    Flusher::new(first, pool.clone(), fast_config())
        .flush_now()
        .await
        .unwrap();
    // One flush adds into a's second and inserts one of b's; the other the reverse.
    let (one, two) = (StatsRecorder::new(), StatsRecorder::new());
    one.campaign("a").record(BASE, Outcome::Sent, 10);
    one.campaign("b").record(BASE + 1, Outcome::Sent, 100);
    two.campaign("b").record(BASE, Outcome::Sent, 1000);
    two.campaign("a").record(BASE + 2, Outcome::Sent, 10000);
    let one = Flusher::new(one, pool.clone(), fast_config());
    let two = Flusher::new(two, pool.clone(), fast_config());
    let (r1, r2) = tokio::join!(one.flush_now(), two.flush_now());
    r1.unwrap();
    r2.unwrap();
    assert_eq!((one.failed_writes(), two.failed_writes()), (0, 0));
    assert_eq!(store::totals(&pool, "a").await.unwrap().sent, 10011);
    assert_eq!(store::totals(&pool, "b").await.unwrap().sent, 1101);
}

#[tokio::test]
async fn the_migration_back_fills_totals_from_existing_seconds() {
    use sqlx::{Connection, Executor};
    const VERSION: i64 = 20261125000400;
    let url = format!("{}/{}", pg_server(), unique_name("pushpace_backfill"));
    store::ensure_database(&url).await.unwrap();
    let mut conn = sqlx::PgConnection::connect(&url).await.unwrap();
    // The schema as it was before this migration, with counts already in it.
    for m in store::MIGRATOR.iter().filter(|m| m.version < VERSION) {
        conn.execute(&*m.sql).await.unwrap();
    }
    sqlx::query(
        "INSERT INTO delivery_seconds (campaign_id, second, sent, failed, retried, skipped_invalid, capped) \
         SELECT 'c' || (g % 3), to_timestamp(1800000000 + g), g, g % 5, 1, g % 2, 3 \
         FROM generate_series(1, 500) g",
    )
    .execute(&mut conn)
    .await
    .unwrap();
    let migration = store::MIGRATOR
        .iter()
        .find(|m| m.version == VERSION)
        .expect("the campaign_totals migration is embedded");
    // As sqlx applies it: in a transaction of its own.
    let mut tx = conn.begin().await.unwrap();
    tx.execute(&*migration.sql).await.unwrap();
    tx.commit().await.unwrap();
    let sums: Vec<(String, i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT campaign_id, sum(sent)::int8, sum(failed)::int8, sum(retried)::int8, \
                sum(skipped_invalid)::int8, sum(capped)::int8 \
         FROM delivery_seconds GROUP BY campaign_id ORDER BY campaign_id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let totals: Vec<(String, i64, i64, i64, i64, i64)> = sqlx::query_as(
        "SELECT campaign_id, sum(sent)::int8, sum(failed)::int8, sum(retried)::int8, \
                sum(skipped_invalid)::int8, sum(capped)::int8 \
         FROM campaign_totals GROUP BY campaign_id ORDER BY campaign_id",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    assert_eq!(sums.len(), 3);
    assert_eq!(totals, sums);
    conn.close().await.unwrap();
}
