//! The hierarchical limiter: the global cap over campaigns, bursts from unused capacity,
//! refused permits returned, and waits that are lower bounds.

use super::{max_in_window, r, Sends, SEC};
use pushpace::limiter::{Algorithm, Decision, HierarchicalLimiter, Nanos, RateLimiter};

// ---------------------------------------------------------------------------------------
// Hierarchical

/// Steps `campaigns` through `secs` seconds in 10 µs steps, each asking once per step;
/// with `rotate` the first to ask changes every step, as a scheduler visiting campaigns
/// in turn would; without it the first campaign always asks first. Returns each one's
/// send instants.
fn run_campaigns(campaigns: &[&dyn RateLimiter], secs: u64, rotate: bool) -> Vec<Vec<Nanos>> {
    let mut sent = vec![Vec::new(); campaigns.len()];
    let k = campaigns.len();
    for step in 0..secs * 100_000 {
        let now = step * 10_000;
        let first = if rotate { step as usize % k } else { 0 };
        for j in 0..k {
            let i = (first + j) % k;
            if campaigns[i].try_acquire(now).is_allowed() {
                sent[i].push(now);
            }
        }
    }
    sent
}

fn merged(sent: &[Vec<Nanos>]) -> Sends {
    let mut all: Vec<Nanos> = sent.iter().flatten().copied().collect();
    all.sort_unstable();
    all.into_iter().map(|t| (t, 1)).collect()
}

#[test]
fn hierarchical_global_caps_the_sum_and_own_rates_pass() {
    // Three campaigns of 500/s (burst 50) want 1500/s under a 1000/s cap.
    let global = HierarchicalLimiter::new(r(1000.0), 0);
    let cs: Vec<_> = (0..3)
        .map(|_| global.campaign(Algorithm::Gcra, r(500.0), 50))
        .collect();
    let refs: Vec<&dyn RateLimiter> = cs.iter().map(|c| c as &dyn RateLimiter).collect();
    let sent = run_campaigns(&refs, 10, true);
    // Visited in the same order every time, the campaigns share the cap first come,
    // first served, and the last one gets nothing (measured 5050/4950/0): fairness is
    // the scheduler's rotation, not the limiter's.
    {
        let global = HierarchicalLimiter::new(r(1000.0), 0);
        let cs: Vec<_> = (0..3)
            .map(|_| global.campaign(Algorithm::Gcra, r(500.0), 50))
            .collect();
        let refs: Vec<&dyn RateLimiter> = cs.iter().map(|c| c as &dyn RateLimiter).collect();
        let fixed: Vec<usize> = run_campaigns(&refs, 10, false)
            .iter()
            .map(Vec::len)
            .collect();
        assert_eq!(fixed, [5050, 4950, 0]);
    }
    let all = merged(&sent);
    assert!(max_in_window(&all, SEC) <= 1000, "global cap exceeded");
    assert!(all.len() >= 9990, "global cap not used: {}", all.len());
    for s in &sent {
        assert!(
            s.len() >= 3000,
            "a campaign was starved: {:?}",
            sent.iter().map(Vec::len).collect::<Vec<_>>()
        );
    }

    // A campaign alone within its own rate always passes.
    let global = HierarchicalLimiter::new(r(1000.0), 0);
    let c = global.campaign(Algorithm::Gcra, r(100.0), 0);
    for i in 0..100 {
        assert_eq!(c.try_acquire(i * 10_000_000), Decision::Allow);
    }
}

#[test]
fn hierarchical_burst_uses_only_unused_global_capacity() {
    // Unused capacity: busy wants 500/s of a 1000/s cap, so quiet's burst of 200 goes
    // through in its first second on top of its own 100/s, and busy keeps its rate.
    let global = HierarchicalLimiter::new(r(1000.0), 10);
    let busy = global.campaign(Algorithm::Gcra, r(500.0), 0);
    let quiet = global.campaign(Algorithm::Gcra, r(100.0), 200);
    let sent = run_campaigns(&[&quiet, &busy], 3, false);
    let first_second = |s: &Vec<Nanos>| s.iter().filter(|&&t| t < SEC).count();
    assert!(
        first_second(&sent[0]) >= 300,
        "quiet did not burst: {}",
        first_second(&sent[0])
    );
    assert!(
        first_second(&sent[1]) >= 499,
        "busy lost its rate: {}",
        first_second(&sent[1])
    );
    assert!(
        max_in_window(&merged(&sent), SEC) <= 1000 + 10,
        "global cap exceeded"
    );

    // No unused capacity: own rates add up to the cap. quiet asks first at every step,
    // and still its burst cannot take busy's share: busy sends as much as it does with
    // quiet sending only its own rate (busy burst 0, so quiet's is the only burst).
    let alone = {
        let global = HierarchicalLimiter::new(r(1000.0), 10);
        let busy = global.campaign(Algorithm::Gcra, r(900.0), 0);
        let quiet = global.campaign(Algorithm::Gcra, r(100.0), 0);
        run_campaigns(&[&quiet, &busy], 10, false)
    };
    let global = HierarchicalLimiter::new(r(1000.0), 10);
    let busy = global.campaign(Algorithm::Gcra, r(900.0), 0);
    let quiet = global.campaign(Algorithm::Gcra, r(100.0), 200);
    let sent = run_campaigns(&[&quiet, &busy], 10, false);
    // In 10 µs steps busy's own 900/s comes out at 893/s (each send is up to a step
    // late); quiet's burst takes exactly the capacity that leaves unused.
    let unused = 10_000 - alone[0].len() - alone[1].len();
    assert!(
        sent[0].len() <= alone[0].len() + unused + 1,
        "quiet took more than the unused capacity"
    );
    assert!(
        sent[1].len() >= alone[1].len(),
        "busy lost its rate to quiet's burst: {} < {}",
        sent[1].len(),
        alone[1].len()
    );
    assert!(
        max_in_window(&merged(&sent), SEC) <= 1000 + 10,
        "global cap exceeded"
    );
}

#[test]
fn hierarchical_a_permit_the_cap_refuses_is_not_spent_from_the_own_limiter() {
    let global = HierarchicalLimiter::new(r(10.0), 0);
    let a = global.campaign(Algorithm::Gcra, r(1.0), 0);
    let b = global.campaign(Algorithm::Gcra, r(10.0), 0);
    // The global slot until 100 ms is b's.
    assert_eq!(b.try_acquire(0), Decision::Allow);
    // a's own limiter would pass at 0, but the cap refuses: the cap is asked first, and
    // a's own permit is left for when the cap has room.
    assert_eq!(a.try_acquire(0), Decision::WaitUntil(100_000_000));
    assert_eq!(a.try_acquire(100_000_000), Decision::Allow);
    // Now the bucket is empty: the next permit is one interval after that send.
    assert_eq!(
        a.try_acquire(100_000_000),
        Decision::WaitUntil(1_100_000_000)
    );
    // a's own limiter gave its permit at 100 ms, not at 0: its next one is at 1.1 s.
    assert_eq!(
        a.own().try_acquire(1_050_000_000),
        Decision::WaitUntil(1_100_000_000)
    );
}

#[test]
fn hierarchical_wait_is_a_lower_bound_when_global_binds() {
    let global = HierarchicalLimiter::new(r(10.0), 0);
    let a = global.campaign(Algorithm::Gcra, r(10.0), 0);
    let b = global.campaign(Algorithm::Gcra, r(10.0), 0);
    assert_eq!(a.try_acquire(0), Decision::Allow);
    let Decision::WaitUntil(t) = b.try_acquire(0) else {
        panic!("global cap should bind")
    };
    assert_eq!(t, 100_000_000);
    // a takes that slot first; b is told to wait again, and is served at the next one.
    assert_eq!(a.try_acquire(t), Decision::Allow);
    let Decision::WaitUntil(t2) = b.try_acquire(t) else {
        panic!("slot was taken")
    };
    assert_eq!(t2, 200_000_000);
    assert_eq!(b.try_acquire(t2), Decision::Allow);
}

#[test]
fn hierarchical_a_late_permit_is_decided_as_of_the_latest_instant() {
    // Two campaigns of 5/s fill a 10/s cap (tolerance: one permit).
    let ms = 1_000_000;
    let global = HierarchicalLimiter::new(r(10.0), 1);
    let a = global.campaign(Algorithm::Gcra, r(5.0), 0);
    let b = global.campaign(Algorithm::Gcra, r(5.0), 0);
    assert_eq!(a.try_acquire(0), Decision::Allow);
    assert_eq!(b.try_acquire(0), Decision::Allow);
    // A round at 300 ms: a is asked as of now, b as of 200 ms, when its permit fell due
    // (the scheduler makes up a late turn so). The cap's schedule is at 400 ms after a,
    // within its tolerance of now: b passes. Decided as of 200 ms it was refused.
    assert_eq!(a.try_acquire(300 * ms), Decision::Allow);
    assert_eq!(b.try_acquire(200 * ms), Decision::Allow);
    // The cap still holds: its schedule is at 500 ms, so nothing passes before 400 ms.
    let wait = b.try_acquire(350 * ms);
    assert!(
        matches!(wait, Decision::WaitUntil(t) if t >= 400 * ms),
        "{wait:?}"
    );
}
