//! Token hygiene and frequency capping, each against its baseline in the same run.
//!
//! Capping: ns per check and heap memory for 1M and 10M devices, for the count-min
//! [`FrequencyCap`] and two exact counters, `Mutex<HashMap>` and `DashMap`, all doing
//! the same thing (count a device's sends in the current window, refuse at the cap).
//! The workload is the common one: every device gets one send per window.
//!
//! Hygiene: the Bloom filter's memory, ns per check (with and without the SHA-256 of
//! the token), its false-positive rate measured against the configured one at full load,
//! and the table lookups per 1,000 sends with and without the filter.
//!
//! Memory is measured with a counting global allocator (bytes live after loading).
//! `cargo bench --bench hygiene`; `HYGIENE_BENCH_SMALL=1` (and criterion's `--test`
//! mode) use 10,000 devices so that a test run stays quick.

use criterion::{black_box, Criterion};
use dashmap::DashMap;
use pushpace::capping::{CapConfig, CapDecision, FrequencyCap};
use pushpace::hygiene::{bloom_key, token_hash, BloomFilter};
use std::alloc::{GlobalAlloc, Layout, System};
use std::collections::HashMap;
use std::sync::atomic::{AtomicIsize, Ordering};
use std::sync::Mutex;
use std::time::Duration;

struct Counting;
static LIVE: AtomicIsize = AtomicIsize::new(0);

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        LIVE.fetch_add(l.size() as isize, Ordering::Relaxed);
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        LIVE.fetch_sub(l.size() as isize, Ordering::Relaxed);
        unsafe { System.dealloc(p, l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        LIVE.fetch_add(new as isize - l.size() as isize, Ordering::Relaxed);
        unsafe { System.realloc(p, l, new) }
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> isize {
    LIVE.load(Ordering::Relaxed)
}

const WINDOW: u64 = 3_600_000_000_000;
const CAP: u32 = 3;

fn token(i: usize) -> String {
    // About the length of an APNs token in hex (64) would make the baselines' keys
    // bigger still; 32 bytes keeps the comparison conservative.
    format!("device-{i:016x}-token-abcdefgh")
}

/// What every contender does: one check (and count) of a device's send.
trait Counter {
    fn check(&mut self, token: &str, now: u64) -> bool;
}

impl Counter for FrequencyCap {
    fn check(&mut self, token: &str, now: u64) -> bool {
        FrequencyCap::check(self, token, now) == CapDecision::Send
    }
}

/// The exact baseline: sends per device, tagged with their window.
struct MutexMap(Mutex<HashMap<Box<str>, (u64, u32)>>);

impl Counter for MutexMap {
    fn check(&mut self, token: &str, now: u64) -> bool {
        let w = now / WINDOW;
        let mut m = self.0.lock().unwrap();
        match m.get_mut(token) {
            Some(e) => {
                if e.0 != w {
                    *e = (w, 0);
                }
                if e.1 >= CAP {
                    return false;
                }
                e.1 += 1;
                true
            }
            None => {
                m.insert(Box::from(token), (w, 1));
                true
            }
        }
    }
}

struct Dash(DashMap<Box<str>, (u64, u32)>);

impl Counter for Dash {
    fn check(&mut self, token: &str, now: u64) -> bool {
        let w = now / WINDOW;
        if let Some(mut e) = self.0.get_mut(token) {
            if e.0 != w {
                *e = (w, 0);
            }
            if e.1 >= CAP {
                return false;
            }
            e.1 += 1;
            return true;
        }
        self.0.insert(Box::from(token), (w, 1));
        true
    }
}

/// Builds a contender and loads every device once; returns it with its live bytes.
fn loaded<C: Counter>(build: impl FnOnce() -> C, tokens: &[String]) -> (C, isize) {
    let before = live();
    let mut c = build();
    for t in tokens {
        c.check(t, 0);
    }
    (c, live() - before)
}

fn capping(c: &mut Criterion, n: usize, summary: &mut Vec<String>) {
    let tokens: Vec<String> = (0..n).map(token).collect();
    let mut group = c.benchmark_group(format!("capping/{n}_devices"));
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    let config = CapConfig {
        max_per_device: CAP,
        window: WINDOW,
        expected_devices: n as u64,
    };
    // Each device once per window: pass k over the tokens runs in window k + 1.
    fn run<C: Counter>(
        group: &mut criterion::BenchmarkGroup<'_, criterion::measurement::WallTime>,
        name: &str,
        c: &mut C,
        tokens: &[String],
    ) {
        let mut i = 0usize;
        let mut window = 1u64;
        group.bench_function(name, |b| {
            b.iter(|| {
                let t = &tokens[i];
                i += 1;
                if i == tokens.len() {
                    i = 0;
                    window += 1;
                }
                black_box(c.check(black_box(t), window * WINDOW))
            })
        });
    }
    {
        let (mut cap, bytes) = loaded(|| FrequencyCap::new(config).unwrap(), &tokens);
        summary.push(format!(
            "capping {n} devices: count-min sketches {} B, exact map {} entries, live heap {bytes} B",
            cap.sketch_bytes(),
            cap.stats().exact_entries
        ));
        run(&mut group, "count_min", &mut cap, &tokens);
    }
    {
        let (mut m, bytes) = loaded(|| MutexMap(Mutex::new(HashMap::new())), &tokens);
        summary.push(format!(
            "capping {n} devices: Mutex<HashMap> live heap {bytes} B"
        ));
        run(&mut group, "mutex_hashmap", &mut m, &tokens);
    }
    {
        let (mut d, bytes) = loaded(|| Dash(DashMap::new()), &tokens);
        summary.push(format!("capping {n} devices: DashMap live heap {bytes} B"));
        run(&mut group, "dashmap", &mut d, &tokens);
    }
    group.finish();
}

/// How often a device under the cap is refused (capped one send early, the case the
/// capping docs describe), with the sketches sized for exactly the devices sent.
fn early_caps(n: usize, summary: &mut Vec<String>) {
    let config = CapConfig {
        max_per_device: CAP,
        window: WINDOW,
        expected_devices: n as u64,
    };
    let mut cap = FrequencyCap::new(config).unwrap();
    let tokens: Vec<String> = (0..n).map(token).collect();
    let mut early = 0u64;
    // Every device three times in one window: each must be sent every time.
    for _ in 0..CAP {
        for t in &tokens {
            if cap.check(t, 0) == CapDecision::Capped {
                early += 1;
            }
        }
    }
    let s = cap.stats();
    summary.push(format!(
        "capping {n} devices × {CAP} sends in one window: {early} refused under the cap \
         (rate {:.2e}), {} exact entries, exact map {} B",
        early as f64 / (n as f64 * f64::from(CAP)),
        s.exact_entries,
        cap.exact_bytes()
    ));
}

fn bloom(c: &mut Criterion, n: u64, summary: &mut Vec<String>) {
    let rate = 0.01;
    let filter = BloomFilter::with_rate(n, rate).unwrap();
    let invalid: Vec<u128> = (0..n as usize)
        .map(|i| bloom_key(&token_hash(&format!("gone-{i}"))))
        .collect();
    for k in &invalid {
        filter.insert(*k);
    }
    let trials = 1_000_000usize.min(n as usize * 10);
    let valid: Vec<String> = (0..trials).map(token).collect();
    let keys: Vec<u128> = valid.iter().map(|t| bloom_key(&token_hash(t))).collect();
    let fp = keys.iter().filter(|k| filter.may_contain(**k)).count();
    let measured = fp as f64 / trials as f64;
    // Lookups per 1,000 sends of valid tokens: without a filter every token goes to the
    // table; with it only the false positives do. Jobs of 250 devices batch them.
    let per_1000 = measured * 1000.0;
    let jobs_with_lookup = valid
        .chunks(250)
        .filter(|job| {
            job.iter()
                .any(|t| filter.may_contain(bloom_key(&token_hash(t))))
        })
        .count() as f64
        / (trials as f64 / 250.0);
    summary.push(format!(
        "bloom {n} tokens at {rate}: {} bits, k = {}, {} B; false positives {fp} / {trials} = {measured:.5} \
         (configured {rate}, expected {:.5} at this size)",
        filter.bits(),
        filter.hashes(),
        filter.memory_bytes(),
        filter.expected_false_positive_rate(n)
    ));
    summary.push(format!(
        "bloom {n} tokens: tokens looked up in the table per 1,000 sends: 1000 without the filter \
         (4 queries of 250), {per_1000:.1} with it ({:.2} queries per 1,000 sends: {:.1} % of 250-device jobs need one)",
        jobs_with_lookup * 4.0,
        jobs_with_lookup * 100.0
    ));
    let mut group = c.benchmark_group(format!("bloom/{n}_tokens"));
    group.measurement_time(Duration::from_secs(3));
    group.warm_up_time(Duration::from_secs(1));
    let mut i = 0usize;
    group.bench_function("check_key", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(filter.may_contain(black_box(keys[i])))
        })
    });
    let mut i = 0usize;
    group.bench_function("sha256_and_check", |b| {
        b.iter(|| {
            i = (i + 1) % valid.len();
            black_box(filter.may_contain(bloom_key(&token_hash(black_box(&valid[i])))))
        })
    });
    // The baseline the filter saves: an exact in-memory set of every invalid hash.
    let before = live();
    let set: std::collections::HashSet<u128> = invalid.iter().copied().collect();
    let set_bytes = live() - before;
    summary.push(format!(
        "bloom {n} tokens: exact HashSet<u128> of the same tokens {set_bytes} B"
    ));
    let mut i = 0usize;
    group.bench_function("hashset_u128_baseline", |b| {
        b.iter(|| {
            i = (i + 1) % keys.len();
            black_box(set.contains(black_box(&keys[i])))
        })
    });
    group.finish();
}

fn main() {
    let small = std::env::args().any(|a| a == "--test")
        || std::env::var_os("HYGIENE_BENCH_SMALL").is_some();
    let mut c = Criterion::default().configure_from_args();
    let mut summary = Vec::new();
    let sizes: &[usize] = if small {
        &[10_000]
    } else {
        &[1_000_000, 10_000_000]
    };
    for &n in sizes {
        capping(&mut c, n, &mut summary);
    }
    early_caps(if small { 10_000 } else { 1_000_000 }, &mut summary);
    bloom(
        &mut c,
        if small { 10_000 } else { 10_000_000 },
        &mut summary,
    );
    c.final_summary();
    println!("\n== hygiene summary ==");
    for line in summary {
        println!("{line}");
    }
}
