//! Job decoding and per-send costs.
//!
//! `decode` is compared, in the same run, with two baselines over the same bytes:
//! serde_json's generic `Value` parse (what a naive decoder would do) and `IgnoredAny`
//! (a validation-only scan, the floor for any JSON decoder). Before measuring, the null
//! sender's send path is checked to allocate nothing, with a counting allocator.

use criterion::{black_box, criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use pushpace::job::{decode, Job};
use pushpace::sender::{push_body, AnySender, NullSender, Sender};
use serde_json::value::RawValue;
use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

/// Counts allocations made by the current thread.
struct Counting;

thread_local! {
    static ALLOCATIONS: Cell<u64> = const { Cell::new(0) };
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        System.alloc(layout)
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        System.dealloc(ptr, layout)
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.with(|c| c.set(c.get() + 1));
        System.realloc(ptr, layout, new_size)
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn allocations() -> u64 {
    ALLOCATIONS.with(Cell::get)
}

fn job_with(devices: usize) -> Arc<Job> {
    let payload = RawValue::from_string(
        r#"{"title":"Spring sale","body":"Everything is 20% off until Sunday.","url":"https://example.invalid/s"}"#
            .to_string(),
    )
    .unwrap();
    let tokens = (0..devices)
        .map(|i| format!("dXNlci10b2tlbi0{i:010}-aGVsbG8td29ybGQtZGV2aWNlLXRva2Vu"))
        .collect();
    Arc::new(Job::new("j-000123", "spring-sale", tokens, payload).unwrap())
}

fn assert_null_send_allocates_nothing() {
    let job = job_with(8);
    let sender = AnySender::from(NullSender);
    let before = allocations();
    for i in 0..100_000 {
        let outcome = sender.send(&job, i % 8).into_ready();
        assert!(matches!(
            outcome,
            Ok(pushpace::sender::SendOutcome::Delivered)
        ));
    }
    let made = allocations() - before;
    assert_eq!(
        made, 0,
        "the null sender allocated {made} times in 100000 sends"
    );
    println!("null sender: 0 allocations in 100000 sends");
}

fn bench_decode(c: &mut Criterion) {
    let mut group = c.benchmark_group("decode");
    for devices in [2usize, 1_000, 10_000] {
        let bytes = job_with(devices).to_json();
        group.throughput(Throughput::Bytes(bytes.len() as u64));
        group.bench_with_input(BenchmarkId::new("pushpace", devices), &bytes, |b, bytes| {
            b.iter(|| decode(black_box(bytes)).unwrap())
        });
        group.bench_with_input(
            BenchmarkId::new("baseline_value", devices),
            &bytes,
            |b, bytes| {
                b.iter(|| serde_json::from_slice::<serde_json::Value>(black_box(bytes)).unwrap())
            },
        );
        group.bench_with_input(
            BenchmarkId::new("baseline_ignored", devices),
            &bytes,
            |b, bytes| {
                b.iter(|| {
                    serde_json::from_slice::<serde::de::IgnoredAny>(black_box(bytes)).unwrap()
                })
            },
        );
    }
    group.finish();
}

fn bench_send(c: &mut Criterion) {
    let job = job_with(1_000);
    let mut group = c.benchmark_group("send");
    group.throughput(Throughput::Elements(1));
    let sender = AnySender::from(NullSender);
    let mut i = 0usize;
    group.bench_function("null", |b| {
        b.iter(|| {
            i = (i + 1) % 1_000;
            sender.send(black_box(&job), i).into_ready()
        })
    });
    let mut body = Vec::with_capacity(512);
    group.bench_function("http_body", |b| {
        b.iter(|| {
            body.clear();
            push_body(black_box(&job), &job.devices[7], &mut body);
            body.len()
        })
    });
    group.finish();
}

fn benches(c: &mut Criterion) {
    assert_null_send_allocates_nothing();
    bench_decode(c);
    bench_send(c);
}

criterion_group!(job_benches, benches);
criterion_main!(job_benches);
