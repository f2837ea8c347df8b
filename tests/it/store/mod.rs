//! Storage and stats flusher tests against the real PostgreSQL, each in a fresh database.
//!
//! This file holds the shared helpers; the tests are in the files below, by topic.

mod campaigns;
mod dead_letters;
mod delivery;
mod flusher;
mod outages;
mod policy;
mod tls;

use pushpace::limiter::Rate;
use pushpace::stats::FlusherConfig;
use sqlx::PgPool;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::{Duration, Instant};

/// An arbitrary second (2027) to record at, so tests do not depend on the wall clock.
const BASE: u64 = 1_800_000_000;

fn at(second: u64) -> chrono::DateTime<chrono::Utc> {
    chrono::DateTime::from_timestamp(second as i64, 0).unwrap()
}

/// Polls `check` until it holds or `limit` passes; returns whether it held.
async fn eventually<F, Fut>(limit: Duration, mut check: F) -> bool
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + limit;
    loop {
        if check().await {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// (sent, failed, retried) per second of a campaign, as stored.
async fn stored_seconds(pool: &PgPool, campaign: &str) -> BTreeMap<u64, [i64; 3]> {
    let rows: Vec<(chrono::DateTime<chrono::Utc>, i64, i64, i64)> = sqlx::query_as(
        "SELECT second, sent, failed, retried FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(campaign)
    .fetch_all(pool)
    .await
    .unwrap();
    rows.into_iter()
        .map(|(s, a, b, c)| (s.timestamp() as u64, [a, b, c]))
        .collect()
}

fn fast_config() -> FlusherConfig {
    FlusherConfig {
        interval: Duration::from_millis(20),
        max_pending_rows: 10_000,
        retry_min: Duration::from_millis(20),
        retry_max: Duration::from_millis(200),
        final_flush_timeout: Duration::from_secs(10),
        ..FlusherConfig::default()
    }
}

fn rate(r: f64) -> Rate {
    Rate::per_second(r).unwrap()
}
