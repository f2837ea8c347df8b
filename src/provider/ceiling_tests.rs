use super::*;

const S: Nanos = NANOS_PER_SEC;

/// One simulated second against a hidden quota: sends `min(demand, ceiling)`, the
/// provider takes up to `quota` and refuses the rest with 429. Returns (sent, refused).
fn second(c: &mut Ceiling, t: u64, demand: f64, quota: f64) -> (f64, f64) {
    let sent = c.limit().unwrap_or(demand).min(demand).floor();
    let taken = sent.min(quota);
    // Answers spread over the second, refusals last (the bucket empties as it goes).
    let at = |i: u64| t * S + i * S / sent.max(1.0) as u64;
    for i in 0..taken as u64 {
        c.answer(None, 2_000_000, at(i));
    }
    for i in taken as u64..sent as u64 {
        c.answer(Some(Signal::Throttled), 2_000_000, at(i));
    }
    c.tick((t + 1) * S, demand, sent);
    (sent, sent - taken)
}

#[test]
fn stays_inactive_without_signals() {
    let mut c = Ceiling::new(CeilingParams::default());
    for t in 0..10 {
        second(&mut c, t, 5_000.0, 10_000.0);
    }
    assert_eq!(c.limit(), None);
    assert_eq!(c.state(10 * S), CeilingState::Clear);
}

#[test]
fn one_throttled_second_cuts_to_beta_times_what_was_accepted() {
    let mut c = Ceiling::new(CeilingParams::default());
    second(&mut c, 0, 5_000.0, 2_000.0);
    assert_eq!(c.limit(), Some(1_800.0));
    assert_eq!(c.state(S), CeilingState::BackingOff(1_800.0));
}

/// The convergence the worker test asks for, on the law alone: 5,000/s of demand
/// against a hidden 2,000/s settles inside 1,800–2,000/s within 10 s, with at most 2%
/// refused in the steady state; then the quota lifts and the demand is back within 30 s.
#[test]
fn converges_below_a_hidden_quota_and_recovers_when_it_lifts() {
    let mut c = Ceiling::new(CeilingParams::default());
    let (mut sent, mut refused) = (0.0, 0.0);
    for t in 0..120 {
        let (s, r) = second(&mut c, t, 5_000.0, 2_000.0);
        if t >= 10 {
            let limit = c.limit().expect("active under the quota");
            assert!(
                (1_800.0..=2_000.0 * 1.05).contains(&limit),
                "t={t}: {limit}"
            );
            sent += s;
            refused += r;
        }
    }
    let fraction = refused / sent;
    assert!(fraction <= 0.02, "steady-state refusals {fraction:.4}");
    assert!(sent / 110.0 >= 1_800.0, "goodput {}", sent / 110.0);

    let back = (120..150).find(|&t| {
        second(&mut c, t, 5_000.0, 10_000.0);
        c.limit().is_none()
    });
    assert!(back.is_some_and(|t| t - 120 <= 30), "{back:?}");
}

/// A lane short of jobs sends in bursts: 8 of 200 sends at 5,000/s, one every 125 ms
/// (1,600 in the second), against a 2,000/s quota with a 100-send bucket that refills
/// to its cap between them. The second's mean accepted rate is far below the quota; the
/// rate while refused is not, so W lands on the quota and the probes after the cut do
/// not climb far past it (with W at the mean they would overshoot by hundreds a second).
#[test]
fn a_lane_sending_in_bursts_reads_the_quota_while_refused() {
    let mut c = Ceiling::new(CeilingParams::default());
    // The test sink's quota, on a clock of its own that starts at 0 here.
    let quota = 2_000.0;
    let mut bucket = crate::tools::sink::Bucket::new(2_000, 100);
    let zero = std::time::Instant::now();
    let mut accepted = 0u32;
    for burst in 0..8u64 {
        for i in 0..200u64 {
            let t = burst * S / 8 + i * S / 5_000;
            let signal = if bucket.take(zero + std::time::Duration::from_nanos(t)) {
                accepted += 1;
                None
            } else {
                Some(Signal::Throttled)
            };
            c.answer(signal, 1_000_000, t + 1_000_000);
        }
    }
    c.tick(S, 5_000.0, 1_600.0);
    assert!(
        accepted < 1_500,
        "the mean is far below the quota: {accepted}"
    );
    let w = c.last_congestion;
    assert!((w - quota).abs() <= quota * 0.03, "W {w}");
    let cut = c.limit().expect("cut");
    assert!(cut < quota * 0.9, "{cut}");
    // Then the lane has jobs again and sends at the ceiling.
    let mut highest: f64 = 0.0;
    for t in 1..30 {
        second(&mut c, t, 5_000.0, quota);
        highest = highest.max(c.limit().unwrap_or(5_000.0));
    }
    assert!(highest <= quota * 1.03, "the ceiling climbed to {highest}");
}

/// A worker that starts 0.7 s into a second sends and is refused for 0.3 s only: the
/// cut uses rates over that part, not the second's counts.
#[test]
fn a_partial_first_second_is_judged_by_its_rates() {
    let mut c = Ceiling::new(CeilingParams::default());
    let start = 7 * S / 10;
    // 0.3 s at 5,000/s against a 2,000/s quota: 1,500 sent, 600 taken.
    for i in 0..1_500u64 {
        let signal = (i % 5 >= 2).then_some(Signal::Throttled);
        c.answer(signal, 1_000_000, start + i * 200_000);
    }
    c.tick(S, 5_000.0, 1_500.0);
    let limit = c.limit().unwrap();
    assert!((limit - 1_800.0).abs() < 1.0, "{limit}");
}

/// A Retry-After cuts the second short: the cut is from the rate before it.
#[test]
fn a_pause_cuts_from_the_demand_not_the_truncated_second() {
    let mut c = Ceiling::new(CeilingParams::default());
    for i in 0..50u64 {
        c.answer(None, 1_000_000, i * 1_000_000);
    }
    c.answer(Some(Signal::Throttled), 1_000_000, 50 * 1_000_000);
    c.pause(50 * 1_000_000, 2 * S);
    c.tick(S, 1_000.0, 51.0);
    assert_eq!(c.limit(), Some(900.0));
}

/// A stray refusal in the second after a cut (the quota's bucket still empty) does not
/// cut twice; congestion a second later does.
#[test]
fn one_cut_per_round() {
    let mut c = Ceiling::new(CeilingParams::default());
    second(&mut c, 0, 5_000.0, 2_000.0);
    assert_eq!(c.limit(), Some(1_800.0));
    second(&mut c, 1, 5_000.0, 1_700.0);
    assert_eq!(c.limit(), Some(1_800.0), "held");
    second(&mut c, 2, 5_000.0, 1_700.0);
    assert_eq!(c.limit(), Some(1_530.0), "cut again a round later");
}

#[test]
fn never_goes_below_the_floor() {
    let mut c = Ceiling::new(CeilingParams::default());
    for t in 0..50 {
        second(&mut c, t, 5_000.0, 0.0);
    }
    assert_eq!(c.limit(), Some(10.0));
}

#[test]
fn a_pause_holds_the_ceiling_until_it_ends() {
    let mut c = Ceiling::new(CeilingParams::default());
    second(&mut c, 0, 5_000.0, 2_000.0);
    c.pause(S + S / 2, 5 * S);
    assert!(matches!(c.state(S), CeilingState::Paused { until, .. } if until == 5 * S));
    // The pause's second is congested, but it is the one right after a cut: it holds.
    c.tick(2 * S, 5_000.0, 0.0);
    let held = c.limit();
    assert_eq!(held, Some(1_800.0));
    for t in 3..5 {
        c.tick(t * S, 5_000.0, 0.0);
        assert_eq!(c.limit(), held, "t={t}");
    }
    // Paused, nothing was sent; once it ends and sending resumes, it rises.
    c.tick(5 * S, 5_000.0, 0.0);
    assert_eq!(c.limit(), held, "nothing sent: nothing learnt");
    c.tick(6 * S, 5_000.0, 1_800.0);
    assert!(c.limit() > held);
    assert_eq!(c.state(6 * S), CeilingState::BackingOff(c.limit().unwrap()));
}

#[test]
fn a_slow_second_is_congested_and_a_fast_one_is_not() {
    let params = CeilingParams {
        latency_target: Some(Duration::from_millis(100)),
        ..CeilingParams::default()
    };
    let mut c = Ceiling::new(params);
    for _ in 0..100 {
        c.answer(None, 20_000_000, 0);
    }
    let j = c.tick(S, 1_000.0, 100.0).unwrap();
    assert!(!j.signals[Signal::Latency as usize]);
    assert_eq!(c.limit(), None);
    for i in 0..100 {
        let ms = if i < 90 { 20 } else { 300 };
        c.answer(None, ms * 1_000_000, S);
    }
    let j = c.tick(2 * S, 1_000.0, 100.0).unwrap();
    assert!(j.signals[Signal::Latency as usize], "{j:?}");
    let p95 = j.p95.unwrap();
    assert!(p95 >= Duration::from_millis(300) && p95 <= Duration::from_millis(338));
    assert_eq!(c.limit(), Some(90.0));
}

#[test]
fn buckets_read_latency_to_within_an_eighth() {
    for us in (0..2_000_000u64)
        .step_by(997)
        .chain([0, 7, 8, 15, 16, 17, 1 << 30])
    {
        let upper = upper_us(bucket(us));
        assert!(upper >= us, "{us} -> {upper}");
        assert!(upper as f64 <= us as f64 * 1.125 + 1.0, "{us} -> {upper}");
    }
}

/// An answer to a send dispatched before the last cut says nothing new: the timeouts of
/// the old rate, arriving seconds later, do not cut again and again.
#[test]
fn answers_to_sends_from_before_a_cut_are_left_out() {
    let mut c = Ceiling::new(CeilingParams::default());
    second(&mut c, 0, 5_000.0, 2_000.0);
    assert_eq!(c.limit(), Some(1_800.0));
    // Seconds 2 and 3: timeouts of sends dispatched at 0.5 s, and the new rate's answers.
    for t in 2..4u64 {
        for i in 0..1_800u64 {
            c.answer(None, 1_000_000, t * S + i * S / 1_800);
        }
        for _ in 0..100 {
            c.answer(Some(Signal::Timeout), t * S + S / 2 - S / 2, t * S + S / 2);
        }
        c.tick((t + 1) * S, 5_000.0, 1_800.0);
    }
    assert!(c.limit() > Some(1_800.0), "{:?}", c.limit());
    assert_eq!(c.totals()[Signal::Timeout as usize], 0);
}

/// A provider that is always slow is not congested: only a p95 above the target and
/// above twice the usual p50 is.
#[test]
fn a_provider_that_is_always_slow_is_not_congested() {
    let mut c = Ceiling::new(CeilingParams::default());
    for t in 0..20u64 {
        for i in 0..100u64 {
            c.answer(None, 2_500_000_000, t * S + i * S / 100);
        }
        let j = c.tick((t + 1) * S, 1_000.0, 100.0).unwrap();
        assert!(!j.signals[Signal::Latency as usize], "t={t}: {j:?}");
    }
    assert_eq!(c.limit(), None);
}
