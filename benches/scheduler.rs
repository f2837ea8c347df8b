//! The scheduler's hot path: 100 campaigns, null sender, manual clock.
//!
//! Measures paced sends per second on one core (decide with the limiter, send, count),
//! and counts heap allocations per send with a counting global allocator. Baseline in
//! the same run: the same decide-send-count loop through a naive `Mutex<HashMap>` of
//! token buckets (one global lock, as a simple implementation would have).
//!
//! `rounds_by_registered`: the cost of one round with 100, 1,000 and 10,000 campaigns
//! registered, most of them at 1/s (a long-tailed mix): the due queue (only campaigns
//! with work due are visited) against a baseline in the same run that visits every
//! active campaign in every round, as the scheduler did before.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pushpace::job::Job;
use pushpace::limiter::{Algorithm, Nanos, Rate};
use pushpace::sender::{AnySender, NullSender};
use pushpace::stats::StatsRecorder;
use pushpace::worker::scheduler::{CampaignSettings, IncomingJob, Scheduler, SchedulerConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) }
    }
}
#[global_allocator]
static GLOBAL: Counting = Counting;

const CAMPAIGNS: usize = 100;
const DEVICES: usize = 10_000;
const RATE: f64 = 100_000.0;
const ROUND: Nanos = 1_000_000; // 1 ms of virtual time per round

fn scheduler() -> (
    Scheduler,
    std::sync::mpsc::Receiver<pushpace::worker::scheduler::Event>,
) {
    let (ctx, _crx) = tokio::sync::mpsc::unbounded_channel();
    let (etx, erx) = std::sync::mpsc::channel();
    std::mem::forget(_crx);
    let s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: CAMPAIGNS,
            max_in_flight: 1_000_000,
            max_attempts: 5,
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        ctx,
        etx,
    );
    (s, erx)
}

fn load(s: &mut Scheduler, round: usize) {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    for c in 0..CAMPAIGNS {
        let devices = (0..DEVICES).map(|d| format!("dev-{d}")).collect();
        let job = Job::new(
            format!("j{round}-{c}"),
            format!("c{c}"),
            devices,
            payload.clone(),
        )
        .unwrap();
        let settings = CampaignSettings::active(
            &format!("c{c}"),
            Rate::per_second(RATE).unwrap(),
            Algorithm::Gcra,
        );
        s.add_job(
            IncomingJob::fresh(job, (c % 8) as i32, round as i64, settings),
            0,
        );
    }
}

/// Runs rounds until `sends` sends were made; returns (elapsed, allocations during rounds).
fn paced(sends: u64) -> (Duration, u64, u64) {
    let (mut s, events) = scheduler();
    let mut now: Nanos = 0;
    let mut loaded = 0;
    let mut elapsed = Duration::ZERO;
    let mut allocs = 0;
    while s.stats().sends < sends {
        if s.stats().open_jobs == 0 {
            load(&mut s, loaded);
            loaded += 1;
            while events.try_recv().is_ok() {}
        }
        now += ROUND;
        let a0 = ALLOCS.load(Ordering::Relaxed);
        let t0 = Instant::now();
        s.run_round(now, 1_700_000_000 + now / 1_000_000_000);
        elapsed += t0.elapsed();
        allocs += ALLOCS.load(Ordering::Relaxed) - a0;
    }
    (elapsed, allocs, s.stats().sends)
}

/// The naive baseline: one global Mutex<HashMap<campaign, token bucket>>.
fn naive(sends: u64) -> Duration {
    let buckets: Mutex<HashMap<usize, (f64, Nanos)>> =
        Mutex::new((0..CAMPAIGNS).map(|c| (c, (0.0, 0))).collect());
    let counts: Mutex<HashMap<usize, u64>> = Mutex::new(HashMap::new());
    let per_ns = RATE / 1e9;
    let mut now: Nanos = 0;
    let mut done = 0u64;
    let t0 = Instant::now();
    while done < sends {
        now += ROUND;
        for c in 0..CAMPAIGNS {
            loop {
                let ok = {
                    let mut b = buckets.lock().unwrap();
                    let e = b.get_mut(&c).unwrap();
                    e.0 = (e.0 + (now - e.1) as f64 * per_ns).min(1.0 + RATE * 0.01);
                    e.1 = now;
                    if e.0 >= 1.0 {
                        e.0 -= 1.0;
                        true
                    } else {
                        false
                    }
                };
                if !ok {
                    break;
                }
                *counts.lock().unwrap().entry(c).or_default() += 1;
                done += 1;
            }
        }
    }
    t0.elapsed()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("scheduler_100_campaigns");
    g.throughput(Throughput::Elements(1));
    g.bench_function("pushpace_round_per_send", |b| {
        b.iter_custom(|iters| paced(iters.max(1)).0)
    });
    g.bench_function("naive_mutex_hashmap_per_send", |b| {
        b.iter_custom(|iters| naive(iters.max(1)))
    });
    g.finish();
    if !std::env::args().any(|a| a == "--bench") {
        return; // `cargo test --benches`: a smoke run only.
    }
    let (elapsed, allocs, sends) = paced(5_000_000);
    println!(
        "scheduler: {sends} paced sends in {:.3} s = {:.0} sends/s on one core; {} allocations in rounds ({:.6} per send)",
        elapsed.as_secs_f64(),
        sends as f64 / elapsed.as_secs_f64(),
        allocs,
        allocs as f64 / sends as f64
    );
}

/// A scheduler holding `n` campaigns: 1% at 200/s, the rest at 1/s, each with one job
/// larger than a [`CHUNK`] of rounds sends. `visit_all`: the every-round baseline.
fn registered(n: usize, visit_all: bool) -> Scheduler {
    let (ctx, crx) = tokio::sync::mpsc::unbounded_channel();
    let (etx, erx) = std::sync::mpsc::channel();
    std::mem::forget(crx);
    std::mem::forget(erx);
    let mut s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: n,
            max_in_flight: 1_000_000,
            visit_all_every: visit_all.then_some(Duration::ZERO),
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        ctx,
        etx,
    );
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    for c in 0..n {
        let (rate, n_devices) = if c % 100 == 0 {
            (200.0, 10_000)
        } else {
            (1.0, 100)
        };
        let devices = (0..n_devices).map(|d| format!("d{d}")).collect();
        let job = Job::new(format!("j{c}"), format!("c{c}"), devices, payload.clone()).unwrap();
        let settings = CampaignSettings::active(
            &format!("c{c}"),
            Rate::per_second(rate).unwrap(),
            Algorithm::Gcra,
        );
        s.add_job(IncomingJob::fresh(job, 0, c as i64, settings), 0);
    }
    s
}

/// Rounds on one scheduler: 20 s of virtual time, within which no campaign runs out of
/// devices (so every round has all `n` campaigns registered).
const CHUNK: u64 = 2_000;

/// Nanoseconds per 10 ms round over `rounds` (≤ [`CHUNK`]) rounds, after the
/// scheduler's first virtual second; set-up not counted.
fn per_round(n: usize, visit_all: bool, rounds: u64) -> f64 {
    const STEP: Nanos = 10_000_000;
    let mut s = registered(n, visit_all);
    let mut now: Nanos = 0;
    for _ in 0..100 {
        now += STEP;
        s.run_round(now, now / 1_000_000_000);
    }
    let rounds = rounds.clamp(1, CHUNK);
    let t0 = Instant::now();
    for _ in 0..rounds {
        now += STEP;
        s.run_round(now, now / 1_000_000_000);
    }
    t0.elapsed().as_nanos() as f64 / rounds as f64
}

/// Measured directly rather than by criterion: each sample needs a scheduler of up to
/// 10,000 campaigns set up first, and criterion would repeat that thousands of times.
/// The two variants alternate, and the figure is the median of 5 runs of each.
fn rounds_by_registered(_: &mut Criterion) {
    if !std::env::args().any(|a| a == "--bench") {
        // `cargo test --benches`: a smoke run only.
        assert!(per_round(100, false, 10) >= 0.0);
        return;
    }
    for n in [100usize, 1_000, 10_000] {
        let (mut due, mut all) = (Vec::new(), Vec::new());
        for _ in 0..5 {
            due.push(per_round(n, false, CHUNK));
            all.push(per_round(n, true, CHUNK));
        }
        due.sort_by(f64::total_cmp);
        all.sort_by(f64::total_cmp);
        let (due, all) = (due[2], all[2]);
        println!(
            "rounds: {n} campaigns registered: {:.1} µs per round with the due queue, {:.1} µs visiting all (ratio {:.3})",
            due / 1e3,
            all / 1e3,
            due / all
        );
    }
}

criterion_group!(benches, bench, rounds_by_registered);
criterion_main!(benches);
