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
//!
//! `memory`: bytes per active campaign and per held or parked job, by a counting
//! allocator (live bytes before and after), each beside what the job's own devices take.

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use pushpace::job::Job;
use pushpace::limiter::{Algorithm, Nanos, Rate};
use pushpace::sender::{AnySender, NullSender};
use pushpace::stats::StatsRecorder;
use pushpace::worker::scheduler::{CampaignSettings, IncomingJob, Scheduler, SchedulerConfig};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

struct Counting;
static ALLOCS: AtomicU64 = AtomicU64::new(0);
/// Bytes allocated and not yet freed (the `memory:` lines).
static LIVE: AtomicI64 = AtomicI64::new(0);
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        LIVE.fetch_add(l.size() as i64, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as i64, Ordering::Relaxed);
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
    let mut s = empty(n, visit_all);
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    for c in 0..n {
        // Enough devices for the rounds timed (at 100,000 a shorter stretch of them).
        let short = n > 10_000;
        let (rate, n_devices) = match (c % 100 == 0, short) {
            (true, false) => (200.0, 10_000),
            (true, true) => (200.0, 1_500),
            (false, false) => (1.0, 100),
            (false, true) => (1.0, 10),
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

/// A scheduler with room for `n` active campaigns and none yet.
fn empty(n: usize, visit_all: bool) -> Scheduler {
    let (ctx, crx) = tokio::sync::mpsc::unbounded_channel();
    let (etx, erx) = std::sync::mpsc::channel();
    std::mem::forget(crx);
    std::mem::forget(erx);
    Scheduler::new(
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
    )
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
    if std::env::args().any(|a| a == "memory") {
        return; // `cargo bench --bench scheduler -- memory`: the memory lines alone.
    }
    for n in [100usize, 1_000, 10_000, 100_000] {
        let (mut due, mut all) = (Vec::new(), Vec::new());
        // 100,000: 3 runs of 500 rounds (5 s of virtual time), to keep the set-up small.
        let (runs, rounds) = if n > 10_000 { (3, 500) } else { (5, CHUNK) };
        for _ in 0..runs {
            due.push(per_round(n, false, rounds));
            all.push(per_round(n, true, rounds));
        }
        due.sort_by(f64::total_cmp);
        all.sort_by(f64::total_cmp);
        let (due, all) = (due[runs / 2], all[runs / 2]);
        println!(
            "rounds: {n} campaigns registered: {:.1} µs per round with the due queue, {:.1} µs visiting all (ratio {:.3}); {:.2} µs per registered campaign-second with the due queue",
            due / 1e3,
            all / 1e3,
            due / all,
            due / 1e3 * 100.0 / n as f64
        );
        // The driver also publishes a snapshot of every campaign 10 times a second.
        let s = registered(n, false);
        let mut snaps: Vec<f64> = (0..5)
            .map(|_| {
                let t0 = Instant::now();
                std::hint::black_box(s.stats());
                t0.elapsed().as_nanos() as f64
            })
            .collect();
        snaps.sort_by(f64::total_cmp);
        println!(
            "rounds: {n} campaigns registered: a snapshot takes {:.1} µs ({:.3} µs per campaign)",
            snaps[2] / 1e3,
            snaps[2] / 1e3 / n as f64
        );
    }
}

/// Live heap bytes now.
fn live() -> i64 {
    LIVE.load(Ordering::Relaxed)
}

/// A job's JSON as it sits in Kafka: `n` 64-hex-digit tokens (the size of an APNs token).
fn job_json(campaign: usize, job: usize, n: usize) -> Vec<u8> {
    let devices: Vec<String> = (0..n)
        .map(|d| {
            format!(
                "\"{:064x}\"",
                (campaign * 1_000_000 + job * 1_000 + d) as u128 * 0x9e37_79b9_7f4a_7c15
            )
        })
        .collect();
    format!(
        r#"{{"job_id":"j{campaign}-{job}","campaign_id":"c{campaign}","devices":[{}],"payload":{{"aps":{{"alert":"hello"}}}}}}"#,
        devices.join(",")
    )
    .into_bytes()
}

/// Scheduler bytes per active campaign holding one job of `devices` devices, the jobs'
/// own decoded bytes (built first) not counted; after one round, so every campaign is
/// active with its limiter, counter and turn state.
fn per_campaign(n: usize, devices: usize) -> (f64, f64) {
    let jobs: Vec<Job> = (0..n)
        .map(|c| pushpace::job::decode(&job_json(c, 0, devices)).unwrap())
        .collect();
    let before_jobs = live();
    drop(jobs);
    let job_bytes = (before_jobs - live()) as f64 / n as f64;
    let jobs: Vec<Job> = (0..n)
        .map(|c| pushpace::job::decode(&job_json(c, 0, devices)).unwrap())
        .collect();
    let base = live();
    let mut s = empty(n, false);
    for (c, job) in jobs.into_iter().enumerate() {
        let settings = CampaignSettings::active(
            &format!("c{c}"),
            Rate::per_second(1.0).unwrap(),
            Algorithm::Gcra,
        );
        s.add_job(IncomingJob::fresh(job, 0, c as i64, settings), 0);
    }
    s.run_round(10_000_000, 0);
    let grown = (live() - base) as f64 / n as f64;
    drop(s);
    (grown, job_bytes)
}

/// Bytes per parked job in the consumer's backlog: `with_message` keeps its raw
/// message in memory (within `max_parked_bytes`), otherwise only its place in Kafka.
fn per_parked(n: usize, with_message: bool, devices: usize) -> f64 {
    use pushpace::worker::backlog::{Backlog, JobRef};
    use rdkafka::message::{OwnedMessage, Timestamp};
    let campaigns: Vec<std::sync::Arc<str>> = (0..1_000)
        .map(|c| std::sync::Arc::from(format!("c{c}")))
        .collect();
    let messages: Vec<Option<OwnedMessage>> = (0..n)
        .map(|j| {
            with_message.then(|| {
                let payload = job_json(j % 1_000, j, devices);
                OwnedMessage::new(
                    Some(payload),
                    None,
                    "jobs".into(),
                    Timestamp::NotAvailable,
                    0,
                    j as i64,
                    None,
                )
            })
        })
        .collect();
    let mut b = Backlog::new(Duration::from_secs(10));
    for c in &campaigns {
        b.park(
            c,
            1.0,
            JobRef {
                partition: 0,
                offset: -1,
            },
            1,
            None,
        );
    }
    let base = live();
    for (j, m) in messages.into_iter().enumerate() {
        let at = JobRef {
            partition: (j % 8) as i32,
            offset: j as i64,
        };
        b.park(&campaigns[j % 1_000], 1.0, at, devices as u32, m);
    }
    let grown = (live() - base) as f64 / n as f64;
    drop(b);
    grown
}

/// The `memory:` lines (`cargo bench --bench scheduler`; `-- memory` for them alone).
fn memory(_: &mut Criterion) {
    if !std::env::args().any(|a| a == "--bench") {
        assert!(per_campaign(10, 1).0 > 0.0);
        return;
    }
    for n in [1_000usize, 10_000] {
        let (campaign, job) = per_campaign(n, 1);
        println!(
            "memory: {n} active campaigns with a 1-device job: {campaign:.0} bytes each in the scheduler (the decoded job itself, baseline: {job:.0} bytes)"
        );
    }
    let (held, job) = per_campaign(1_000, 500);
    println!(
        "memory: 1,000 campaigns holding a 500-device job: {held:.0} bytes each in the scheduler besides the decoded job ({job:.0} bytes, {:.0} per device)",
        job / 500.0
    );
    let offset_only = per_parked(100_000, false, 500);
    let with_message = per_parked(10_000, true, 500);
    // The messages exist before the count starts (the consumer received them): what a
    // kept one adds is its own size besides the backlog's entry.
    let raw = job_json(0, 0, 500).len();
    println!(
        "memory: a parked job: {offset_only:.0} bytes with only its offset kept; with its raw 500-device message kept, {with_message:.0} bytes of entry plus the message itself ({raw} bytes) (baseline: the same job decoded, {job:.0} bytes)"
    );
}

criterion_group!(benches, bench, rounds_by_registered, memory);
criterion_main!(benches);
