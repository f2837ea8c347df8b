//! The demo's closing lines on its two showcase campaigns: the scheduled one (did it
//! wait for its `start_at`?) and the weighted pair under a capped provider (did they
//! share the cap in proportion to their weights?), from what the sink saw.

use crate::tools::sink::SinkHandle;
use chrono::{DateTime, Utc};

/// When the scheduled campaign's first push arrived, against its `start_at`.
pub fn scheduled_line(sink: &SinkHandle, id: &str, start_at: DateTime<Utc>) -> String {
    let Some(c) = sink.campaign(id) else {
        return format!("scheduled campaign {id}: nothing sent (it starts at {start_at})");
    };
    // The sink counts from its own start: place that on the wall clock now.
    let sink_zero = Utc::now() - chrono::Duration::from_std(sink.elapsed()).unwrap_or_default();
    let first = sink_zero + chrono::Duration::microseconds((c.first_ms * 1000.0) as i64);
    let after_ms = (first - start_at).num_milliseconds();
    format!("scheduled campaign {id}: first push {after_ms} ms after its start_at")
}

/// The weighted pair's rates over the whole seconds in which both sent (their first and
/// last seconds left out, being partial), their sum against the cap they share (the
/// weights decide only while it binds), and the ratio of the second to the first.
pub fn weighted_line(
    sink: &SinkHandle,
    (a, b): (&str, &str),
    weights: (f64, f64),
    cap: f64,
) -> String {
    let (sa, sb) = (sink.per_second(a), sink.per_second(b));
    let inner = |s: &[crate::tools::sink::SecondCount]| match (s.first(), s.last()) {
        (Some(f), Some(l)) if l.unix_second > f.unix_second + 1 => {
            Some((f.unix_second + 1, l.unix_second - 1))
        }
        _ => None,
    };
    let (Some((fa, la)), Some((fb, lb))) = (inner(&sa), inner(&sb)) else {
        return format!("weighted pair {a} / {b}: too few seconds sent to compare");
    };
    let (from, to) = (fa.max(fb), la.min(lb));
    if to < from {
        return format!("weighted pair {a} / {b}: never sent in the same whole second");
    }
    let sum = |s: &[crate::tools::sink::SecondCount]| -> u64 {
        s.iter()
            .filter(|c| (from..=to).contains(&c.unix_second))
            .map(|c| c.requests)
            .sum()
    };
    let seconds = (to - from + 1) as f64;
    let (ra, rb) = (sum(&sa) as f64 / seconds, sum(&sb) as f64 / seconds);
    format!(
        "weighted pair over the {seconds} whole seconds both sent: {a} {ra:.1}/s, {b} \
         {rb:.1}/s, together {:.1}/s under a cap of {cap}/s, ratio {:.2} (weights {}:{})",
        ra + rb,
        rb / ra.max(f64::MIN_POSITIVE),
        weights.0,
        weights.1
    )
}
