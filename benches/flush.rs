//! Stats flush cost for 100 campaigns against the real PostgreSQL.
//!
//! Each flush writes one new second for each of 100 campaigns plus the progress of 100
//! jobs (200 rows). Each job has the most devices a job may have, its device 0 keeps
//! retrying and 50 more devices finish every second, so every progress row carries the
//! finished bitmap past a prefix of 0 (the largest progress rows there are); a full job
//! completes and the next one takes its place. `batched` is the [`Flusher`]: one transaction, two UNNEST upserts.
//! `naive` is the baseline in the same run: the same rows, one single-row upsert each,
//! in one transaction. After criterion's report the bench prints the rows per second of
//! both, their ratio, and statements per flush.
//!
//! It also measures the hot path, `CampaignCounter::record`.
//!
//! Database: `PUSHPACE_BENCH_DATABASE_URL`, by default
//! `postgres://postgres@127.0.0.1:5432/pushpace_bench_flush` (created and migrated; its
//! stats tables are emptied at start).
//!
//! Run: `cargo bench --bench flush`; `cargo bench --bench flush -- known` runs only the
//! flush of 1,000 active campaigns with 1,000 and with 100,000 known (issue 24).

use criterion::{black_box, Criterion, Throughput};
use pushpace::stats::CampaignCounter;
use pushpace::stats::{Flusher, FlusherConfig, JobKey, JobProgressHandle, Outcome, StatsRecorder};
use sqlx::PgPool;
use std::time::{Duration, Instant};
use tokio::runtime::Runtime;

const CAMPAIGNS: usize = 100;
const ROWS_PER_FLUSH: usize = 2 * CAMPAIGNS;
const BASE: u64 = 1_800_000_000;
const DEVICES: u32 = pushpace::job::MAX_DEVICES as u32;
/// Devices finished per job per second.
const STEP: u32 = 50;

/// After `seconds` seconds of a job stream: its generation and the last device finished
/// in the current job (devices 1..=that are finished, device 0 is not).
fn position(seconds: u32) -> (u32, u32) {
    let per_job = (DEVICES - 1) / STEP;
    (seconds / per_job, (seconds % per_job + 1) * STEP)
}

struct Setup {
    rt: Runtime,
    pool: PgPool,
}

fn setup() -> Setup {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .expect("tokio runtime");
    let url = std::env::var("PUSHPACE_BENCH_DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/pushpace_bench_flush".to_string());
    let pool = rt.block_on(async {
        pushpace::store::ensure_database(&url)
            .await
            .expect("create bench database");
        let pool = pushpace::store::connect(&url, 2, Duration::from_secs(10))
            .await
            .expect("connect to bench database");
        pushpace::store::migrate(&pool).await.expect("migrate");
        sqlx::query("TRUNCATE delivery_seconds, job_progress, stats_flushes")
            .execute(&pool)
            .await
            .expect("empty stats tables");
        pool
    });
    Setup { rt, pool }
}

/// 100 campaigns and their jobs, plus the next second to write.
struct Load {
    prefix: String,
    counters: Vec<CampaignCounter>,
    jobs: Vec<JobProgressHandle>,
    next_second: u64,
    seconds: u32,
    generation: u32,
}

impl Load {
    fn new(recorder: &StatsRecorder, prefix: &str) -> Self {
        let counters = (0..CAMPAIGNS)
            .map(|i| recorder.campaign(&format!("{prefix}-campaign-{i}")))
            .collect();
        let jobs = Self::jobs(recorder, prefix, 0);
        Self {
            prefix: prefix.to_string(),
            counters,
            jobs,
            next_second: BASE,
            seconds: 0,
            generation: 0,
        }
    }

    fn jobs(recorder: &StatsRecorder, prefix: &str, generation: u32) -> Vec<JobProgressHandle> {
        (0..CAMPAIGNS)
            .map(|i| {
                recorder.track_job(JobKey {
                    job_id: format!("{prefix}-job-{i}-{generation}"),
                    campaign_id: format!("{prefix}-campaign-{i}"),
                    partition: (i % 8) as i32,
                    offset: i64::from(generation) * CAMPAIGNS as i64 + i as i64,
                    devices_total: DEVICES,
                })
            })
            .collect()
    }

    /// One second of sends for every campaign, and progress for every job.
    fn record_second(&mut self, recorder: &StatsRecorder) {
        let second = self.next_second;
        self.next_second += 1;
        let (generation, last) = position(self.seconds);
        self.seconds += 1;
        if generation != self.generation {
            // The pinned device finally finishes: the old jobs complete.
            for j in &mut self.jobs {
                j.mark(0);
                j.set_done(DEVICES);
            }
            self.jobs = Self::jobs(recorder, &self.prefix, generation);
            self.generation = generation;
        }
        for c in &self.counters {
            c.record(second, Outcome::Sent, 990);
            c.record(second, Outcome::Failed, 3);
            c.record(second, Outcome::Retried, 7);
        }
        for j in &mut self.jobs {
            for d in last + 1 - STEP..=last {
                j.mark(d);
            }
        }
    }
}

/// The bitmap the flusher sends for a job whose devices 1..=last are finished.
fn bitmap(last: u32) -> Vec<u8> {
    let mut bytes = vec![0u8; (last / 8 + 1) as usize];
    for d in 1..=last {
        bytes[(d / 8) as usize] |= 0x80 >> (d % 8);
    }
    bytes
}

/// The baseline: the same 200 rows, one single-row statement each, after `seconds`.
async fn naive_flush(pool: &PgPool, prefix: &str, second: u64, seconds: u32) {
    let (generation, last) = position(seconds);
    let after = bitmap(last);
    let at = chrono::DateTime::from_timestamp(second as i64, 0).expect("second in range");
    let mut tx = pool.begin().await.expect("begin");
    for i in 0..CAMPAIGNS {
        sqlx::query(
            "INSERT INTO delivery_seconds AS d (campaign_id, second, sent, failed, retried) \
             VALUES ($1, $2, $3, $4, $5) \
             ON CONFLICT (campaign_id, second) DO UPDATE SET sent = d.sent + EXCLUDED.sent, \
                 failed = d.failed + EXCLUDED.failed, retried = d.retried + EXCLUDED.retried",
        )
        .bind(format!("{prefix}-campaign-{i}"))
        .bind(at)
        .bind(990i64)
        .bind(3i64)
        .bind(7i64)
        .execute(&mut *tx)
        .await
        .expect("naive seconds upsert");
    }
    for i in 0..CAMPAIGNS {
        sqlx::query(
            "INSERT INTO job_progress AS p \
                 (job_id, campaign_id, partition, kafka_offset, devices_total, devices_done, \
                  done_after) \
             SELECT $1, $2, $3, $4, $5, n.devices_done, n.done_after \
             FROM job_progress_union(0, ('x' || encode($6, 'hex'))::bit varying, 0, B'') AS n \
             ON CONFLICT (campaign_id, job_id) DO UPDATE SET \
                 (devices_done, done_after) = (SELECT m.devices_done, m.done_after \
                     FROM job_progress_union(p.devices_done, p.done_after, \
                                             EXCLUDED.devices_done, EXCLUDED.done_after) AS m), \
                 updated_at = now()",
        )
        .bind(format!("{prefix}-job-{i}-{generation}"))
        .bind(format!("{prefix}-campaign-{i}"))
        .bind((i % 8) as i32)
        .bind(i64::from(generation) * CAMPAIGNS as i64 + i as i64)
        .bind(DEVICES as i32)
        .bind(&after)
        .execute(&mut *tx)
        .await
        .expect("naive progress upsert");
    }
    tx.commit().await.expect("commit");
}

fn flush_benches(c: &mut Criterion, s: &Setup) {
    let mut group = c.benchmark_group("stats_flush_100_campaigns");
    group.throughput(Throughput::Elements(ROWS_PER_FLUSH as u64));
    group.sample_size(30);
    group.measurement_time(Duration::from_secs(10));

    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), s.pool.clone(), FlusherConfig::default());
    let mut load = Load::new(&recorder, "crit-batched");
    group.bench_function("batched", |b| {
        b.iter(|| {
            load.record_second(&recorder);
            s.rt.block_on(flusher.flush_now()).expect("flush");
        })
    });

    let mut second = BASE;
    let mut seconds = 0;
    group.bench_function("naive", |b| {
        b.iter(|| {
            second += 1;
            s.rt.block_on(naive_flush(&s.pool, "crit-naive", second, seconds));
            seconds += 1;
        })
    });
    group.finish();
}

fn record_bench(c: &mut Criterion) {
    let mut group = c.benchmark_group("stats_record");
    group.throughput(Throughput::Elements(1));
    let recorder = StatsRecorder::new();
    let counter = recorder.campaign("hot");
    let mut i = 0u64;
    group.bench_function("record", |b| {
        b.iter(|| {
            i += 1;
            counter.record(black_box(BASE + (i >> 20)), Outcome::Sent, 1);
        })
    });
    group.finish();
}

/// The figures for docs/BENCHMARKS.md, measured in the same run: rows per second of
/// each way, their ratio, and statements per flush.
fn summary(s: &Setup) {
    const FLUSHES: u32 = 200;
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), s.pool.clone(), FlusherConfig::default());
    let mut load = Load::new(&recorder, "sum-batched");
    // Warm up both paths (connections, plans, first inserts).
    for _ in 0..20 {
        load.record_second(&recorder);
        s.rt.block_on(flusher.flush_now()).expect("flush");
    }
    let statements_before = flusher.statements();
    let batches_before = flusher.batches_committed();
    let started = Instant::now();
    for _ in 0..FLUSHES {
        load.record_second(&recorder);
        s.rt.block_on(flusher.flush_now()).expect("flush");
    }
    let batched = started.elapsed();
    let statements = flusher.statements() - statements_before;
    let batches = flusher.batches_committed() - batches_before;

    for n in 0..20 {
        s.rt.block_on(naive_flush(&s.pool, "sum-naive", BASE + u64::from(n), n));
    }
    let started = Instant::now();
    for n in 0..FLUSHES {
        let second = BASE + 20 + u64::from(n);
        s.rt.block_on(naive_flush(&s.pool, "sum-naive", second, n + 20));
    }
    let naive = started.elapsed();

    let rows = f64::from(FLUSHES) * ROWS_PER_FLUSH as f64;
    let batched_rate = rows / batched.as_secs_f64();
    let naive_rate = rows / naive.as_secs_f64();
    println!();
    println!("flush summary: {CAMPAIGNS} campaigns, {ROWS_PER_FLUSH} rows per flush, {FLUSHES} flushes each");
    println!(
        "  batched: {:.2} ms/flush, {:.0} rows/s, {:.1} data statements/flush ({batches} transactions)",
        batched.as_secs_f64() * 1000.0 / f64::from(FLUSHES),
        batched_rate,
        statements as f64 / f64::from(FLUSHES),
    );
    println!(
        "  naive:   {:.2} ms/flush, {:.0} rows/s, {ROWS_PER_FLUSH} data statements/flush",
        naive.as_secs_f64() * 1000.0 / f64::from(FLUSHES),
        naive_rate,
    );
    println!(
        "  batched / naive throughput: {:.1}x",
        batched_rate / naive_rate
    );
}

/// `known` campaigns in the table, the first `active` of them active (`k-000001`…).
fn seed_known(s: &Setup, known: usize, active: usize) {
    s.rt.block_on(async {
        sqlx::query("TRUNCATE campaigns CASCADE")
            .execute(&s.pool)
            .await
            .expect("empty campaigns");
        sqlx::query(
            "INSERT INTO campaigns (id, send_rate, algorithm, status) \
             SELECT 'k-' || lpad(g::text, 6, '0'), 100, 'gcra', \
                    CASE WHEN g <= $2 THEN 'active' ELSE 'done' END \
             FROM generate_series(1, $1::int8) g",
        )
        .bind(known as i64)
        .bind(active as i64)
        .execute(&s.pool)
        .await
        .expect("seed campaigns");
        sqlx::query("ANALYZE campaigns")
            .execute(&s.pool)
            .await
            .expect("analyze");
    });
}

/// Milliseconds per flush of `active` campaigns' seconds (median of `flushes`), with
/// `known` campaigns in the table.
fn flush_with_known(s: &Setup, known: usize, active: usize, second: &mut u64) -> f64 {
    const FLUSHES: usize = 40;
    seed_known(s, known, active);
    let recorder = StatsRecorder::new();
    let flusher = Flusher::new(recorder.clone(), s.pool.clone(), FlusherConfig::default());
    let counters: Vec<CampaignCounter> = (1..=active)
        .map(|i| recorder.campaign(&format!("k-{i:06}")))
        .collect();
    let mut times = Vec::with_capacity(FLUSHES);
    for n in 0..FLUSHES + 5 {
        *second += 1;
        for c in &counters {
            c.record(*second, Outcome::Sent, 50);
        }
        let t0 = Instant::now();
        s.rt.block_on(flusher.flush_now()).expect("flush");
        if n >= 5 {
            times.push(t0.elapsed().as_secs_f64() * 1e3);
        }
    }
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}

/// Issue 24: the flush of 1,000 active campaigns with 1,000 known (the baseline) and
/// with 100,000 known, and of 100 active among 100,000, alternating; median of 3 runs,
/// each the median of 40 flushes.
fn known_summary(s: &Setup) {
    let mut second = BASE + 1_000_000;
    let cases = [(1_000, 1_000), (100_000, 1_000), (100_000, 100)];
    let mut runs: Vec<Vec<f64>> = vec![Vec::new(); cases.len()];
    for _ in 0..3 {
        for (k, &(known, active)) in cases.iter().enumerate() {
            runs[k].push(flush_with_known(s, known, active, &mut second));
        }
    }
    for (runs, (known, active)) in runs.iter_mut().zip(cases) {
        runs.sort_by(f64::total_cmp);
        println!(
            "flush known: {active} active of {known} known: {:.2} ms per flush (runs {runs:.2?})",
            runs[1]
        );
    }
}

fn main() {
    let setup = setup();
    if std::env::args().any(|a| a == "known") {
        known_summary(&setup);
        return;
    }
    let mut c = Criterion::default().configure_from_args();
    record_bench(&mut c);
    flush_benches(&mut c, &setup);
    summary(&setup);
    c.final_summary();
}
