//! Nanoseconds per rate-limiter decision, with the clock read included, for every
//! algorithm, against two baselines measured in the same run: governor's
//! `RateLimiter::direct(..).check()` (its own quanta clock) and a naive
//! `Mutex<token bucket>` in f64. Also: gcra, token-bucket and governor with two threads
//! on one limiter, a gcra decision that refuses, and the clock reads alone.
//!
//! Run: `cargo bench --bench limiters -- --warm-up-time 1 --measurement-time 3`.
//! Rates are 10 M/s with a burst of 10^9 (window algorithms: a window of 10^9 permits), so
//! that nearly every decision allows for the whole run; sliding-log uses no burst (its log
//! would hold every send of the run) and so allows only part of the time. Each benchmark
//! prints the fraction of decisions that allowed.

use std::hint::black_box;
use std::num::NonZeroU32;
use std::sync::{Arc, Barrier, Mutex};
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, Criterion};
use pushpace::limiter::{
    build, Algorithm, Clock, Gcra, HierarchicalLimiter, MonotonicClock, Nanos, Rate, RateLimiter,
};

const RATE: f64 = 10_000_000.0;
const BURST: u32 = 1_000_000_000;

fn rate() -> Rate {
    Rate::per_second(RATE).expect("valid rate")
}

fn governor_direct() -> governor::DefaultDirectRateLimiter {
    let quota = governor::Quota::with_period(Duration::from_nanos(rate().interval_nanos()))
        .expect("non-zero period")
        .allow_burst(NonZeroU32::new(BURST + 1).expect("non-zero burst"));
    governor::RateLimiter::direct(quota)
}

/// The naive baseline: a token bucket in f64 behind a mutex.
struct NaiveTokenBucket {
    state: Mutex<(f64, Nanos)>,
    per_nano: f64,
    capacity: f64,
}

impl NaiveTokenBucket {
    fn new(per_second: f64, burst: u32) -> Self {
        let capacity = f64::from(burst) + 1.0;
        Self {
            state: Mutex::new((capacity, 0)),
            per_nano: per_second / 1e9,
            capacity,
        }
    }

    fn try_acquire(&self, now: Nanos) -> bool {
        let mut s = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let elapsed = now.saturating_sub(s.1) as f64;
        s.0 = (s.0 + elapsed * self.per_nano).min(self.capacity);
        s.1 = s.1.max(now);
        if s.0 >= 1.0 {
            s.0 -= 1.0;
            true
        } else {
            false
        }
    }
}

fn report(name: &str, allowed: u64, total: u64) {
    if total > 0 {
        eprintln!(
            "  {name}: {:.1}% of {total} decisions allowed",
            100.0 * allowed as f64 / total as f64
        );
    }
}

fn clocks(c: &mut Criterion) {
    let mut g = c.benchmark_group("clock");
    g.bench_function("std_instant_now", |b| b.iter(|| black_box(Instant::now())));
    let q = quanta::Clock::new();
    g.bench_function("quanta_now", |b| b.iter(|| black_box(q.now())));
    g.bench_function("quanta_raw", |b| b.iter(|| black_box(q.raw())));
    let m = MonotonicClock::new();
    g.bench_function("monotonic_clock_now", |b| b.iter(|| black_box(m.now())));
    g.finish();
}

fn one_thread(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision_1_thread");
    let clock = MonotonicClock::new();

    let gov = governor_direct();
    let (mut allowed, mut total) = (0u64, 0u64);
    g.bench_function("baseline_governor_direct_check", |b| {
        b.iter(|| {
            total += 1;
            allowed += u64::from(black_box(gov.check()).is_ok());
        })
    });
    report("baseline_governor_direct_check", allowed, total);

    let naive = NaiveTokenBucket::new(RATE, BURST);
    let (mut allowed, mut total) = (0u64, 0u64);
    g.bench_function("baseline_naive_mutex_token_bucket", |b| {
        b.iter(|| {
            total += 1;
            allowed += u64::from(black_box(naive.try_acquire(clock.now())));
        })
    });
    report("baseline_naive_mutex_token_bucket", allowed, total);

    // gcra called directly (static dispatch, as a caller holding a `Gcra` would) and
    // through `dyn RateLimiter` (as the scheduler does).
    let gcra = Gcra::new(rate(), BURST);
    let (mut allowed, mut total) = (0u64, 0u64);
    g.bench_function("gcra_static", |b| {
        b.iter(|| {
            total += 1;
            allowed += u64::from(black_box(gcra.try_acquire(clock.now())).is_allowed());
        })
    });
    report("gcra_static", allowed, total);

    for algorithm in Algorithm::ALL {
        let burst = if algorithm == Algorithm::SlidingLog {
            0
        } else {
            BURST
        };
        let lim = build(algorithm, rate(), burst);
        let (mut allowed, mut total) = (0u64, 0u64);
        g.bench_function(algorithm.as_str(), |b| {
            b.iter(|| {
                total += 1;
                allowed += u64::from(black_box(lim.try_acquire(clock.now())).is_allowed());
            })
        });
        report(algorithm.as_str(), allowed, total);
    }

    let global = HierarchicalLimiter::new(rate(), BURST);
    let campaign = global.campaign(Algorithm::Gcra, rate(), BURST);
    let (mut allowed, mut total) = (0u64, 0u64);
    g.bench_function("hierarchical_gcra", |b| {
        b.iter(|| {
            total += 1;
            allowed += u64::from(black_box(campaign.try_acquire(clock.now())).is_allowed());
        })
    });
    report("hierarchical_gcra", allowed, total);

    // A refusing gcra: 1/s, used up; the decision is one load and a compare.
    let refusing = Gcra::new(Rate::per_second(1.0).expect("valid rate"), 0);
    let _ = refusing.try_acquire(clock.now());
    let (mut allowed, mut total) = (0u64, 0u64);
    g.bench_function("gcra_refusing", |b| {
        b.iter(|| {
            total += 1;
            allowed += u64::from(black_box(refusing.try_acquire(clock.now())).is_allowed());
        })
    });
    report("gcra_refusing", allowed, total);

    // The same refusal from governor, for the ratio.
    let gov_refusing = governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MIN));
    let _ = gov_refusing.check();
    g.bench_function("baseline_governor_refusing", |b| {
        b.iter(|| black_box(gov_refusing.check()).is_ok())
    });
    g.finish();
}

/// Two threads on one limiter: the measured thread's time for `iters` decisions while the
/// other thread makes as many on the same limiter.
fn contended<F>(iters: u64, decide: F) -> Duration
where
    F: Fn() -> bool + Send + Sync + 'static,
{
    let decide = Arc::new(decide);
    let barrier = Arc::new(Barrier::new(2));
    let other = {
        let decide = Arc::clone(&decide);
        let barrier = Arc::clone(&barrier);
        std::thread::spawn(move || {
            barrier.wait();
            for _ in 0..iters {
                black_box(decide());
            }
        })
    };
    barrier.wait();
    let start = Instant::now();
    for _ in 0..iters {
        black_box(decide());
    }
    let elapsed = start.elapsed();
    let _ = other.join();
    elapsed
}

fn two_threads(c: &mut Criterion) {
    let mut g = c.benchmark_group("decision_2_threads");
    let clock = MonotonicClock::new();

    let gov = Arc::new(governor_direct());
    g.bench_function("baseline_governor_direct_check", |b| {
        b.iter_custom(|iters| {
            let gov = Arc::clone(&gov);
            contended(iters, move || gov.check().is_ok())
        })
    });

    let gcra: Arc<Gcra> = Arc::new(Gcra::new(rate(), BURST));
    g.bench_function("gcra_static", |b| {
        b.iter_custom(|iters| {
            let (gcra, clock) = (Arc::clone(&gcra), clock.clone());
            contended(iters, move || gcra.try_acquire(clock.now()).is_allowed())
        })
    });

    for algorithm in [Algorithm::Gcra, Algorithm::TokenBucket, Algorithm::Governor] {
        let lim = build(algorithm, rate(), BURST);
        g.bench_function(algorithm.as_str(), |b| {
            b.iter_custom(|iters| {
                let (lim, clock) = (Arc::clone(&lim), clock.clone());
                contended(iters, move || lim.try_acquire(clock.now()).is_allowed())
            })
        });
    }
    g.finish();
}

/// Keeps a result alive for the optimiser.
#[inline(always)]
fn sink<T>(t: T) {
    black_box(t);
}

/// Nanoseconds per call of `f`, over `ops` calls.
fn ns_per_call(ops: u64, mut f: impl FnMut()) -> f64 {
    let start = Instant::now();
    for _ in 0..ops {
        f();
    }
    start.elapsed().as_nanos() as f64 / ops as f64
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// The ratios, measured paired: each round times the subject and its baseline back to
/// back (alternating which goes first), and the ratio is the median of the rounds'
/// ratios. On a shared machine the load changes from second to second; the criterion
/// medians above move with it, a ratio of two neighbouring measurements much less.
fn summary(_: &mut Criterion) {
    const ROUNDS: usize = 60;
    const OPS: u64 = 200_000;
    let clock = MonotonicClock::new();
    let q = quanta::Clock::new();
    let gov = governor_direct();
    let gcra = Gcra::new(rate(), BURST);
    let gcra_dyn = build(Algorithm::Gcra, rate(), BURST);
    let refusing = Gcra::new(Rate::per_second(1.0).expect("valid rate"), 0);
    let _ = refusing.try_acquire(clock.now());
    let gov_refusing = governor::RateLimiter::direct(governor::Quota::per_second(NonZeroU32::MIN));
    let _ = gov_refusing.check();

    let pair = |name: &str, a: &mut dyn FnMut() -> f64, b: &mut dyn FnMut() -> f64| {
        let (mut ta, mut tb, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
        for round in 0..ROUNDS {
            let (x, y) = if round % 2 == 0 {
                let x = a();
                (x, b())
            } else {
                let y = b();
                (a(), y)
            };
            ta.push(x);
            tb.push(y);
            ratios.push(x / y);
        }
        let ratio = median(ratios);
        eprintln!(
            "  {name:<44} {:7.2} ns vs {:7.2} ns  ratio {:.2}",
            median(ta),
            median(tb),
            ratio
        );
        ratio
    };
    // Each target as a ratio to a baseline measured beside it (issue 24: on this kind
    // of machine the clock read is most of governor's check, so the targets are stated
    // against the floor of one raw TSC read plus one fetch_add).
    let mut targets: Vec<(String, f64, f64)> = Vec::new();
    eprintln!("summary: median of {ROUNDS} paired rounds of {OPS} calls (subject vs baseline):");
    pair(
        "clock: monotonic_clock_now vs quanta_now",
        &mut || ns_per_call(OPS, || sink(clock.now())),
        &mut || ns_per_call(OPS, || sink(q.now())),
    );
    pair(
        "gcra_static vs governor_direct_check",
        &mut || ns_per_call(OPS, || sink(gcra.try_acquire(clock.now()))),
        &mut || ns_per_call(OPS, || sink(gov.check().is_ok())),
    );
    pair(
        "gcra (dyn) vs governor_direct_check",
        &mut || ns_per_call(OPS, || sink(gcra_dyn.try_acquire(clock.now()))),
        &mut || ns_per_call(OPS, || sink(gov.check().is_ok())),
    );
    pair(
        "gcra_refusing vs governor_refusing",
        &mut || ns_per_call(OPS, || sink(refusing.try_acquire(clock.now()))),
        &mut || ns_per_call(OPS, || sink(gov_refusing.check().is_ok())),
    );
    // The floor of the design the issue prescribes (one clock read, one atomic
    // read-modify-write when passing), with nothing else: the cheapest clock (quanta's raw
    // TSC) and one uncontended `fetch_add`. No GCRA can cost less than this, so its ratio
    // to governor bounds what any such limiter can reach on this machine.
    let word = std::sync::atomic::AtomicU64::new(0);
    pair(
        "floor: raw TSC + fetch_add vs governor_direct_check",
        &mut || {
            ns_per_call(OPS, || {
                sink(word.fetch_add(q.raw() & 1, std::sync::atomic::Ordering::Relaxed))
            })
        },
        &mut || ns_per_call(OPS, || sink(gov.check().is_ok())),
    );
    let floor = |word: &std::sync::atomic::AtomicU64| {
        ns_per_call(OPS, || {
            sink(word.fetch_add(q.raw() & 1, std::sync::atomic::Ordering::Relaxed))
        })
    };
    let r = pair(
        "gcra_static vs floor (raw TSC + fetch_add)",
        &mut || ns_per_call(OPS, || sink(gcra.try_acquire(clock.now()))),
        &mut || floor(&word),
    );
    targets.push(("single-threaded gcra ≤ 1.05× the floor".into(), r, 1.05));
    for algorithm in [Algorithm::Gcra, Algorithm::LeakyBucket, Algorithm::Governor] {
        let l = build(algorithm, rate(), BURST);
        let r = pair(
            &format!("{} (dyn) vs floor", algorithm.as_str()),
            &mut || ns_per_call(OPS, || sink(l.try_acquire(clock.now()))),
            &mut || floor(&word),
        );
        targets.push((
            format!("smooth {} ≤ 2× the floor", algorithm.as_str()),
            r,
            2.0,
        ));
    }
    pair(
        "floor: raw TSC alone vs governor_direct_check",
        &mut || ns_per_call(OPS, || sink(q.raw())),
        &mut || ns_per_call(OPS, || sink(gov.check().is_ok())),
    );
    let gov2 = Arc::new(governor_direct());
    let gcra2 = Arc::new(Gcra::new(rate(), BURST));
    let r = pair(
        "2 threads: gcra_static vs governor_direct_check",
        &mut || {
            let (g, c) = (Arc::clone(&gcra2), clock.clone());
            contended(OPS, move || g.try_acquire(c.now()).is_allowed()).as_nanos() as f64
                / OPS as f64
        },
        &mut || {
            let g = Arc::clone(&gov2);
            contended(OPS, move || g.check().is_ok()).as_nanos() as f64 / OPS as f64
        },
    );
    targets.push(("2 threads: gcra ≤ 0.6× governor".into(), r, 0.6));
    // The 2-thread floor: two threads each reading the raw TSC and adding to one shared
    // word (the cache line moves between the cores on every call, as it must for any
    // shared limiter).
    let word2 = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let q2 = q.clone();
    pair(
        "2 threads floor: raw TSC + fetch_add vs governor",
        &mut || {
            let (w, q) = (Arc::clone(&word2), q2.clone());
            contended(OPS, move || {
                w.fetch_add(q.raw() & 1, std::sync::atomic::Ordering::Relaxed) != u64::MAX
            })
            .as_nanos() as f64
                / OPS as f64
        },
        &mut || {
            let g = Arc::clone(&gov2);
            contended(OPS, move || g.check().is_ok()).as_nanos() as f64 / OPS as f64
        },
    );
    eprintln!("targets (median paired ratio against its target):");
    for (name, ratio, target) in targets {
        let verdict = if ratio <= target { "met" } else { "MISSED" };
        eprintln!("  {name:<44} {ratio:5.2} (target {target:.2}): {verdict}");
    }
}

criterion_group!(benches, clocks, one_thread, two_threads, summary);
criterion_main!(benches);
