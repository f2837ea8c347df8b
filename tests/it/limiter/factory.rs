//! The factory and the trait surface: every algorithm by name, and a manual clock
//! driving a limiter.

use super::{r, SEC};
use pushpace::limiter::{
    build, Algorithm, Clock, Decision, HierarchicalLimiter, ManualClock, RateLimiter,
};

// ---------------------------------------------------------------------------------------
// Factory and trait surface

#[test]
fn factory_builds_every_algorithm_by_name() {
    for a in Algorithm::ALL {
        let lim = build(a, r(250.0), 3);
        assert_eq!(lim.name(), a.as_str());
        assert_eq!(lim.name().parse::<Algorithm>().unwrap(), a);
        assert_eq!(lim.rate(), r(250.0));
        // acquire_up_to is callable on dyn RateLimiter, and a fresh limiter grants at
        // least its burst + 1.
        let dynamic: &dyn RateLimiter = lim.as_ref();
        let g = dynamic.acquire_up_to(4, 0);
        assert_eq!(g.granted, 4, "{a}");
        assert_eq!(g.next_at, None);
    }
    let global = HierarchicalLimiter::new(r(1000.0), 0);
    assert_eq!(
        global.campaign(Algorithm::SlidingLog, r(10.0), 0).name(),
        "hierarchical"
    );
}

#[test]
fn manual_clock_drives_a_limiter_like_the_scheduler_would() {
    let clock = ManualClock::new(0);
    let lim = build(Algorithm::Gcra, r(4.0), 0);
    let mut sent = 0;
    while clock.now() < 10 * SEC {
        match lim.try_acquire(clock.now()) {
            Decision::Allow => sent += 1,
            Decision::WaitUntil(t) => clock.set(t),
        }
    }
    assert_eq!(sent, 40);
}
