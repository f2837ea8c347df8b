//! What callers are told: `WaitUntil` exact to the nanosecond, `set_rate` holding at
//! once, and every caller that waits as told being served.

use std::collections::BinaryHeap;

use super::{
    any_rate, cases, count_in, max_in_window, play, r, saturate, step, subject, Sends, Subject, SEC,
};
use proptest::prelude::*;
use pushpace::limiter::{window_for, Decision, Nanos};

// ---------------------------------------------------------------------------------------
// WaitUntil exactness

proptest! {
    #![proptest_config(cases(160))]

    /// `WaitUntil(t)` is exact to the nanosecond for every algorithm: the same request
    /// fails at t − 1 ns (with the same answer) and succeeds at t. This includes batches
    /// larger than the burst. The hierarchical campaign's answer is a documented lower
    /// bound (see `limiter::hierarchical`): refused before t, served at t or at the one
    /// further instant it is then told.
    #[test]
    fn wait_until_is_exact(
        subject in subject(),
        rate in any_rate(),
        burst in 0u32..20,
        steps in prop::collection::vec(step(), 0..60),
        asks in prop::collection::vec(1u32..=2500, 1..40),
    ) {
        let rate = r(rate);
        let lim = subject.make(rate, burst);
        let cap = subject.batch_cap(rate, burst);
        let mut sends = Sends::new();
        let mut now = play(lim.as_ref(), &steps, cap, 0, &mut sends);
        for permille in asks {
            // Up to 2.5 × the batch cap: oversized batches must be exact too.
            let n = (u64::from(cap) * u64::from(permille) / 1000).clamp(1, u64::from(u32::MAX)) as u32;
            match lim.try_acquire_n(n, now) {
                Decision::Allow => {}
                Decision::WaitUntil(t) => {
                    prop_assert!(t > now);
                    if subject == Subject::Hierarchical {
                        // Documented lower bound: refused before t; at t served, or told
                        // once more and served then.
                        if t - 1 > now {
                            prop_assert!(!lim.try_acquire_n(n, t - 1).is_allowed());
                        }
                        now = t;
                        if let Decision::WaitUntil(t2) = lim.try_acquire_n(n, t) {
                            prop_assert!(t2 > t);
                            prop_assert_eq!(lim.try_acquire_n(n, t2), Decision::Allow);
                            now = t2;
                        }
                        continue;
                    }
                    if t - 1 > now {
                        prop_assert_eq!(lim.try_acquire_n(n, t - 1), Decision::WaitUntil(t),
                            "{:?} n={} not refused the same way at t-1", subject, n);
                    }
                    prop_assert_eq!(lim.try_acquire_n(n, t), Decision::Allow,
                        "{:?} n={} refused at its WaitUntil", subject, n);
                    now = t;
                }
            }
        }
    }
}

// ---------------------------------------------------------------------------------------
// set_rate

proptest! {
    #![proptest_config(cases(96))]

    /// After `set_rate(r2)` at t0, with a caller saturating throughout: every window that
    /// starts at or after t0 obeys r2's bound (so the new rate holds at once, well within
    /// one second); windows across t0 obey the bound of the larger rate (no burst above the
    /// configured one); the caller waits at most one new interval (one new window for the
    /// window algorithms); and the rate over the following seconds is r2.
    #[test]
    fn set_rate_holds_at_once(
        subject in subject(),
        r1 in prop_oneof![Just(0.5), Just(3.0), 0.2f64..5000.0],
        r2 in prop_oneof![Just(0.5), Just(3.0), 0.2f64..5000.0],
        burst in 0u32..10,
        t0_ms in 0u64..5000,
    ) {
        let (r1, r2) = (r(r1), r(r2));
        let lim = subject.make(r1, burst);
        let t0 = t0_ms * 1_000_000;
        let mut sends = Sends::new();
        saturate(lim.as_ref(), 0, t0, None, &mut sends);
        lim.set_rate(r2, t0);
        prop_assert_eq!(lim.rate(), r2);
        let before = sends.len();

        let stall = subject.max_stall_after_set_rate(r2, burst);
        let win = if subject.windowed() { window_for(r2, burst).length } else { SEC };
        let span = SEC + 6 * win.max((400.0 * f64::from(burst + 1) / r2.as_f64() * 1e9) as Nanos);
        saturate(lim.as_ref(), t0, t0 + span, None, &mut sends);

        let after: Sends = sends[before..].to_vec();
        let first = after.first().map(|s| s.0).unwrap_or(u64::MAX);
        prop_assert!(first <= t0 + stall, "{:?}: first send {} ns after set_rate, allowed {}", subject, first - t0, stall);

        // The larger of the two configurations' bounds (for the window algorithms the
        // slower rate can have the larger one: its window may be a little shorter).
        let faster = if r1 > r2 { r1 } else { r2 };
        for w in [SEC, 3 * SEC / 2] {
            let got = max_in_window(&after, w);
            let bound = subject.window_bound(r2, burst, w);
            prop_assert!(got <= bound, "{:?} after {}→{}: {} > {} in {} ns", subject, r1, r2, got, bound, w);
            let got = max_in_window(&sends, w);
            let bound = subject.window_bound(faster, burst, w).max(subject.window_bound(r1, burst, w).max(subject.window_bound(r2, burst, w)));
            prop_assert!(got <= bound, "{:?} across {}→{}: {} > {} in {} ns", subject, r1, r2, got, bound, w);
        }

        // From t0 + 1 s on, the rate is r2: within the burst (smooth algorithms) or one
        // window (window algorithms) plus 0.5%.
        let (from, to) = (t0 + SEC, t0 + span);
        let n = count_in(&sends, from, to) as f64;
        let expected = r2.permits_in(to - from);
        let slack = if subject.windowed() {
            window_for(r2, burst).limit as f64
        } else {
            f64::from(burst) + 1.0
        } + 0.005 * expected;
        prop_assert!((n - expected).abs() <= slack, "{:?} {}→{}: {} permits, expected {:.1} ± {:.1}", subject, r1, r2, n, expected, slack);
    }
}

// ---------------------------------------------------------------------------------------
// No starvation

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Wake {
    at: std::cmp::Reverse<Nanos>,
    seq: std::cmp::Reverse<u64>,
    caller: usize,
}

proptest! {
    #![proptest_config(cases(96))]

    /// Several callers, each with a list of batches (some larger than the burst or the
    /// window), each sleeping exactly as told: every caller is served, every answer is in
    /// the future, and the whole demand is done within the time the rate needs for it plus
    /// slack for the bursts and window edges.
    #[test]
    fn callers_that_wait_as_told_are_served(
        subject in subject(),
        rate in prop_oneof![Just(0.5), Just(3.0), 0.2f64..100_000.0],
        burst in 0u32..10,
        demand in prop::collection::vec(prop::collection::vec(1u32..=3000, 1..8), 1..6),
    ) {
        let rate = r(rate);
        let lim = subject.make(rate, burst);
        let cap = subject.batch_cap(rate, burst);
        let batches: Vec<Vec<u32>> = demand
            .iter()
            .map(|c| c.iter().map(|p| (u64::from(cap) * u64::from(*p) / 1000).max(1) as u32).collect())
            .collect();
        let total: u64 = batches.iter().flatten().map(|&n| u64::from(n)).sum();
        let mut next = vec![0usize; batches.len()];
        let mut queue = BinaryHeap::new();
        let mut seq = 0;
        for caller in 0..batches.len() {
            queue.push(Wake { at: std::cmp::Reverse(0), seq: std::cmp::Reverse(seq), caller });
            seq += 1;
        }
        let mut calls = 0u64;
        let mut now = 0;
        while let Some(Wake { at, caller, .. }) = queue.pop() {
            now = at.0;
            calls += 1;
            prop_assert!(calls < 1_000_000, "{:?}: no progress", subject);
            let n = batches[caller][next[caller]];
            let wake = match lim.try_acquire_n(n, now) {
                Decision::Allow => {
                    next[caller] += 1;
                    if next[caller] == batches[caller].len() {
                        continue;
                    }
                    now
                }
                Decision::WaitUntil(t) => {
                    prop_assert!(t > now);
                    t
                }
            };
            queue.push(Wake { at: std::cmp::Reverse(wake), seq: std::cmp::Reverse(seq), caller });
            seq += 1;
        }
        // Each batch, at worst, waits for an empty window (window algorithms) or a full
        // bucket, then pays for itself at the rate.
        let refill = if subject.windowed() {
            window_for(rate, burst).length
        } else {
            (f64::from(burst + 1) / rate.as_f64() * 1e9) as Nanos
        };
        let batches_n = batches.iter().map(Vec::len).sum::<usize>() as u64;
        let worst = (total as f64 / rate.as_f64() * 1e9) as Nanos + (batches_n + 1) * (refill + rate.interval_nanos());
        prop_assert!(now <= worst, "{:?}: {} permits in {} batches took {} ns, worst case {}", subject, total, batches_n, now, worst);
    }
}
