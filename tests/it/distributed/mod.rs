//! Distributed mode against the real Redis on 127.0.0.1:6379 (a unique key prefix per
//! test) and, for several workers, real `pushpace run` processes on the real broker.
//!
//! - `leases`: the Redis scripts and limiters shared by several limiters in one process;
//! - `scope`: one in-process worker whose campaigns move between local and Redis scope;
//! - `processes` (with its harness `process_run`): groups of `pushpace run` workers;
//! - `tls`: the same over `rediss://` with an ACL user (`scripts/redis-tls.sh`), and
//!   what each wrong credential or certificate looks like.

mod leases;
mod process_run;
mod processes;
mod scope;
mod tls;

use crate::harness::{produce_spread, TestWorker};
use crate::helpers::{
    brokers, fresh_database, group_moves, owned_partitions, pacing_lock, spawn_logged, unique_name,
    wait_for, worker_log, Proxy,
};
use pushpace::config::RedisAlgorithm;
use pushpace::distributed::{
    redis_gcra, redis_sliding_window, LeaseAnswer, RedisConfig, RedisLimiterFactory,
};
use pushpace::limiter::{
    Algorithm, Clock, MonotonicClock, Nanos, Rate, RateLimiter, NANOS_PER_SEC,
};
use pushpace::redis_link::RedisTarget;
use pushpace::tools::produce::ProducePlan;
use pushpace::tools::sink::{Sink, SinkConfig};
use pushpace::worker::scheduler::acquire_catching_up;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

const REDIS: &str = "127.0.0.1:6379";

async fn conn() -> redis::aio::ConnectionManager {
    let client = redis::Client::open(format!("redis://{REDIS}")).unwrap();
    redis::aio::ConnectionManager::new(client).await.unwrap()
}

fn config(
    target: RedisTarget,
    algorithm: RedisAlgorithm,
    lease_ms: u64,
    workers: u32,
) -> RedisConfig {
    RedisConfig {
        target,
        connect_timeout: Duration::from_millis(500),
        algorithm,
        lease: Duration::from_millis(lease_ms),
        key_prefix: unique_name("pp"),
        workers_estimate: workers,
    }
}

/// A factory on 100 ms GCRA leases at `url`, sized for `workers`, once it has connected
/// (or after 5 s: the test's own checks then fail on the fallback).
async fn gcra_factory(url: String, workers: u32, clock: Arc<dyn Clock>) -> RedisLimiterFactory {
    let target = RedisTarget::url(url);
    let f = RedisLimiterFactory::new(
        config(target, RedisAlgorithm::RedisGcra, 100, workers),
        clock,
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !f.is_connected() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f
}

pub(super) fn unix_now_f64() -> f64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

pub(super) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}
