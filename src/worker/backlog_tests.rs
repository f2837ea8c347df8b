//! Unit tests of the lookahead bookkeeping ([`Backlog`]).

use super::*;

fn at(partition: i32, offset: i64) -> JobRef {
    JobRef { partition, offset }
}

/// An instant later than the last one this thread asked for by more than
/// [`RECHECK_MAX`]: the hand-overs of a test happen in turn, each past the wait a
/// campaign that held its lookahead was given.
fn later() -> Instant {
    thread_local!(static AT: std::cell::Cell<Option<Instant>> = const { std::cell::Cell::new(None) });
    AT.with(|at| {
        let t = at.get().unwrap_or_else(Instant::now) + RECHECK_MAX + Duration::from_millis(1);
        at.set(Some(t));
        t
    })
}

/// `next_to_unpark`, reduced to (campaign, place).
fn next(b: &mut Backlog) -> Option<(Arc<str>, JobRef)> {
    b.next_to_unpark(true, later()).map(|(c, p)| (c, p.at))
}

#[test]
fn holds_one_lookahead_per_campaign_and_parks_the_rest_in_order() {
    let mut b = Backlog::new(Duration::from_secs(10));
    let slow: Arc<str> = Arc::from("slow");
    let fast: Arc<str> = Arc::from("fast");
    // slow: 10/s → 100 devices of lookahead; its first 500-device job covers it.
    assert!(b.wants("slow"));
    let cursor = Arc::new(AtomicU32::new(0));
    b.hold(&slow, 10.0, at(0, 0), 500, cursor.clone());
    assert!(!b.wants("slow"));
    b.park(&slow, 10.0, at(0, 1), 10, None);
    b.park(&slow, 10.0, at(0, 3), 10, None);
    // Another campaign on the same partition is not blocked by it.
    assert!(b.wants("fast"));
    b.hold(&fast, 1000.0, at(0, 2), 500, Arc::new(AtomicU32::new(0)));
    assert!(b.wants("fast"), "500 devices < 10 s at 1000/s");
    assert_eq!(b.parked_in(0), 2);
    assert_eq!(next(&mut b), None, "slow still has 500 waiting");
    // The scheduler dispatched 450 of slow's 500: 50 left < 100 of lookahead.
    cursor.store(450, Ordering::Relaxed);
    assert_eq!(next(&mut b), Some((slow.clone(), at(0, 1))));
    assert!(!b.wants("slow"), "a parked job is still ahead of new ones");
    assert_eq!(next(&mut b), Some((slow.clone(), at(0, 3))));
    assert_eq!(next(&mut b), None);
    assert_eq!(b.parked_total(), 0);
}

#[test]
fn the_most_starved_campaign_is_unparked_first() {
    let mut b = Backlog::new(Duration::from_secs(1));
    let a: Arc<str> = Arc::from("a");
    let c: Arc<str> = Arc::from("c");
    b.hold(&a, 100.0, at(0, 0), 90, Arc::new(AtomicU32::new(0)));
    b.park(&a, 100.0, at(0, 1), 10, None);
    b.hold(&c, 100.0, at(1, 0), 90, Arc::new(AtomicU32::new(80)));
    b.park(&c, 100.0, at(1, 1), 10, None);
    assert_eq!(next(&mut b).unwrap().0, c, "10 left beats 90 left");
    assert_eq!(next(&mut b).unwrap().0, a);
}

#[test]
fn finishing_and_revoking_release_their_jobs() {
    let mut b = Backlog::new(Duration::from_secs(10));
    let a: Arc<str> = Arc::from("a");
    b.hold(&a, 1.0, at(0, 0), 50, Arc::new(AtomicU32::new(0)));
    b.park(&a, 1.0, at(0, 1), 10, None);
    b.park(&a, 1.0, at(1, 0), 10, None);
    b.finished(0, 0);
    assert_eq!(next(&mut b), Some((a.clone(), at(0, 1))));
    b.unpark_failed(&a, at(0, 1), 10, Instant::now());
    assert_eq!(b.parked_in(0), 1);
    b.forget_partitions(&[0]);
    assert_eq!(b.parked_in(0), 0);
    assert_eq!(next(&mut b), Some((a.clone(), at(1, 0))));
}

#[test]
fn parked_bytes_follow_the_messages_kept_in_memory() {
    use rdkafka::message::Timestamp;
    let mut b = Backlog::new(Duration::from_secs(1));
    let a: Arc<str> = Arc::from("a");
    let msg = |payload: &[u8]| {
        OwnedMessage::new(
            Some(payload.to_vec()),
            Some(b"a".to_vec()),
            "t".into(),
            Timestamp::NotAvailable,
            0,
            1,
            None,
        )
    };
    b.hold(&a, 1.0, at(0, 0), 1, Arc::new(AtomicU32::new(1)));
    b.park(&a, 1.0, at(0, 1), 10, Some(msg(&[0; 99])));
    b.park(&a, 1.0, at(0, 2), 10, None);
    b.park(&a, 1.0, at(1, 0), 10, Some(msg(&[0; 9])));
    assert_eq!(b.parked_bytes(), 100 + 10, "payload and key bytes");
    let (_, p) = b.next_to_unpark(true, later()).unwrap();
    assert_eq!(p.at, at(0, 1));
    assert!(p.message.is_some());
    assert_eq!(b.parked_bytes(), 10);
    b.forget_partitions(&[1]);
    assert_eq!(b.parked_bytes(), 0);
    // One campaign holding the whole budget: its newest messages become offsets.
    for o in 10..20 {
        b.park(&a, 1.0, at(0, o), 10, Some(msg(&[0; 99])));
    }
    assert_eq!(b.parked_bytes(), 1000);
    assert_eq!(b.evict_hog(2000), 0, "under the budget");
    assert_eq!(b.evict_hog(1000), 3, "down to 750 bytes");
    assert_eq!(b.parked_bytes(), 700);
    let (_, p) = b.next_to_unpark(true, later()).unwrap();
    assert!(p.message.is_none(), "an offset-only job is re-read");
}

#[test]
fn past_the_memory_bound_a_campaign_still_gets_its_second_job() {
    let mut b = Backlog::new(Duration::from_secs(10));
    let a: Arc<str> = Arc::from("a");
    assert!(b.guaranteed("a"), "a first job always");
    let first = Arc::new(AtomicU32::new(0));
    b.hold(&a, 200.0, at(0, 0), 2000, first.clone());
    b.park(&a, 200.0, at(0, 1), 10, None);
    b.park(&a, 200.0, at(0, 2), 10, None);
    // Below its lookahead (2,000 devices) after one send: it wants its next job,
    // and gets it with no room left, being down to one job with work.
    first.store(1, Ordering::Relaxed);
    assert!(b.guaranteed("a"));
    assert_eq!(next_tight(&mut b), Some(at(0, 1)));
    // Two jobs with work left: past the bound, nothing more...
    let second = Arc::new(AtomicU32::new(0));
    b.hold(&a, 200.0, at(0, 1), 2000, second.clone());
    assert!(!b.guaranteed("a"));
    assert_eq!(next_tight(&mut b), None);
    // ...until the first is fully dispatched (it still counts until it finishes) and
    // the second is below the lookahead.
    first.store(2000, Ordering::Relaxed);
    second.store(1, Ordering::Relaxed);
    assert_eq!(next_tight(&mut b), Some(at(0, 2)));
}

fn next_tight(b: &mut Backlog) -> Option<JobRef> {
    b.next_to_unpark(false, later()).map(|(_, p)| p.at)
}

/// A backlog with a 1-s lookahead where campaign "a", at 100/s, holds one job of 150
/// devices at `place`; also the campaign and the job's cursor.
fn a_holding_150(place: JobRef) -> (Backlog, Arc<str>, Arc<AtomicU32>) {
    let mut b = Backlog::new(Duration::from_secs(1));
    let a: Arc<str> = Arc::from("a");
    let cursor = Arc::new(AtomicU32::new(0));
    b.hold(&a, 100.0, place, 150, cursor.clone());
    (b, a, cursor)
}

#[test]
fn a_campaign_low_with_nothing_parked_is_starving_in_its_partition() {
    let (mut b, a, cursor) = a_holding_150(at(3, 0));
    assert!(!b.starving_in(3), "150 devices ≥ 1 s at 100/s");
    cursor.store(60, Ordering::Relaxed);
    assert!(
        b.starving_in(3),
        "90 left < 100 of lookahead, nothing parked"
    );
    assert!(!b.starving_in(2), "its jobs come from partition 3");
    b.park(&a, 100.0, at(3, 1), 10, None);
    assert!(!b.starving_in(3), "its next job is parked already");
}

#[test]
fn a_campaign_with_too_little_parked_is_running_low_in_its_partition() {
    let mut b = Backlog::new(Duration::from_secs(10));
    let fast: Arc<str> = Arc::from("fast");
    // 5,000/s: LOW_WATER is 10,000 devices.
    let cursor = Arc::new(AtomicU32::new(0));
    b.hold(&fast, 5_000.0, at(3, 0), 500, cursor.clone());
    for o in 1..=10 {
        b.park(&fast, 5_000.0, at(3, o), 500, None);
    }
    assert!(
        b.starving_in(3),
        "5,500 devices held and parked, 1.1 s: its partition is read on before it runs dry"
    );
    for o in 11..=20 {
        b.park(&fast, 5_000.0, at(3, o), 500, None);
    }
    assert!(!b.starving_in(3), "10,500 devices, 2.1 s");
    cursor.store(500, Ordering::Relaxed);
    assert!(!b.starving_in(3), "10,000 left: 2 s");
    // A job in another partition keeps the campaign known through the revocation.
    b.park(&fast, 5_000.0, at(4, 0), 500, None);
    b.forget_partitions(&[3]);
    assert!(
        b.starving_in(4),
        "the parked count follows a revocation: 500 devices left"
    );
}

#[test]
fn only_campaigns_with_parked_jobs_are_walked_and_the_index_follows_them() {
    let mut b = Backlog::new(Duration::from_secs(1));
    let ids: Vec<Arc<str>> = (0..5).map(|i| Arc::from(format!("c{i}"))).collect();
    for (i, id) in ids.iter().enumerate() {
        b.hold(id, 10.0, at(0, i as i64), 1, Arc::new(AtomicU32::new(1)));
    }
    assert!(b.with_parked.is_empty());
    b.park(&ids[1], 10.0, at(1, 0), 5, None);
    b.park(&ids[1], 10.0, at(1, 1), 5, None);
    b.park(&ids[3], 10.0, at(2, 0), 5, None);
    assert_eq!(b.with_parked.len(), 2);
    let mut got: Vec<JobRef> = std::iter::from_fn(|| next(&mut b).map(|(_, p)| p)).collect();
    got.sort_by_key(|p| (p.partition, p.offset));
    assert_eq!(got, [at(1, 0), at(1, 1), at(2, 0)]);
    assert!(b.with_parked.is_empty(), "emptied queues leave the index");
    b.unpark_failed(&ids[3], at(2, 0), 5, Instant::now());
    assert_eq!(next(&mut b).map(|(c, _)| c), Some(ids[3].clone()));
    b.park(&ids[4], 10.0, at(3, 0), 5, None);
    b.forget_partitions(&[3]);
    assert!(b.with_parked.is_empty() && next(&mut b).is_none());
    assert_eq!(b.parked_devices().len(), 0);
}

#[test]
fn a_rate_change_moves_the_lookahead() {
    let mut b = Backlog::new(Duration::from_secs(10));
    let a: Arc<str> = Arc::from("a");
    b.hold(&a, 10.0, at(0, 0), 500, Arc::new(AtomicU32::new(0)));
    assert!(!b.wants("a"));
    b.set_rate("a", 100.0);
    assert!(b.wants("a"), "500 < 10 s at 100/s");
}

#[test]
fn only_assigned_partitions_count_and_a_revoked_one_hands_its_campaigns_on() {
    let mut b = Backlog::new(Duration::from_secs(1));
    let a: Arc<str> = Arc::from("a");
    let c: Arc<str> = Arc::from("c");
    // a: a job held in partition 1, its latest (nearly done) in partition 2.
    b.hold(&a, 100.0, at(1, 0), 10, Arc::new(AtomicU32::new(0)));
    b.hold(&a, 100.0, at(2, 0), 10, Arc::new(AtomicU32::new(0)));
    // c: starving in partition 5.
    b.hold(&c, 100.0, at(5, 0), 10, Arc::new(AtomicU32::new(0)));
    let assigned = BTreeSet::from([1, 2, 5]);
    let mut all = b.starving_partitions(&assigned);
    all.sort_unstable();
    assert_eq!(all, vec![2, 5]);
    assert_eq!(
        b.starving_partitions(&BTreeSet::from([5])),
        vec![5],
        "a partition not asked about never counts"
    );
    b.forget_partitions(&[2]);
    let mut left = b.starving_partitions(&BTreeSet::from([1, 5]));
    left.sort_unstable();
    assert_eq!(
        left,
        vec![1, 5],
        "a's place moves to the partition it still has a job in, never the revoked one"
    );
}

#[test]
fn a_finished_campaigns_slot_goes_to_the_next_and_their_jobs_stay_apart() {
    let mut b = Backlog::new(Duration::from_secs(1));
    let a: Arc<str> = Arc::from("a");
    let c: Arc<str> = Arc::from("c");
    b.hold(&a, 10.0, at(0, 0), 5, Arc::new(AtomicU32::new(5)));
    b.finished(0, 0);
    assert!(
        b.index.is_empty(),
        "nothing held or parked: its slot is freed"
    );
    // c takes a's slot; a comes back in another.
    b.hold(&c, 10.0, at(0, 1), 100, Arc::new(AtomicU32::new(0)));
    b.park(&c, 10.0, at(0, 2), 5, None);
    assert_eq!(b.slots.len(), 1, "the freed slot was reused");
    b.hold(&a, 10.0, at(1, 0), 1, Arc::new(AtomicU32::new(1)));
    b.park(&a, 10.0, at(1, 1), 5, None);
    assert!(!b.wants("c") && b.guaranteed("c"));
    assert_eq!(next(&mut b), Some((a.clone(), at(1, 1))), "only a runs low");
    // A stale finish of a's old job touches nobody.
    b.finished(0, 0);
    assert_eq!(b.parked_devices().as_slice(), &[(c.clone(), 5)]);
    b.finished(0, 1);
    assert_eq!(next(&mut b), Some((c.clone(), at(0, 2))));
    assert!(
        !b.index.contains_key("c"),
        "its last parked job handed over, nothing held: its slot is freed"
    );
}

#[test]
fn a_campaign_with_its_lookahead_is_read_again_only_after_its_wait() {
    // 100/s: 100 devices of lookahead, 150 held: 0.5 s to spare, so the full wait.
    let (mut b, a, cursor) = a_holding_150(at(0, 0));
    b.park(&a, 100.0, at(0, 1), 10, None);
    let t = later();
    assert!(b.next_to_unpark(true, t).is_none());
    // The cursor jumps (devices skipped at intake take no permit).
    cursor.store(150, Ordering::Relaxed);
    assert!(
        b.next_to_unpark(true, t + RECHECK_MAX / 2).is_none(),
        "not read again within its wait"
    );
    let (id, p) = b.next_to_unpark(true, t + RECHECK_MAX).unwrap();
    assert_eq!((id, p.at), (a.clone(), at(0, 1)));
    // With little to spare the wait is shorter: 101 held, 100 wanted, 10 ms at 100/s.
    b.park(&a, 100.0, at(0, 2), 10, None);
    let second = Arc::new(AtomicU32::new(0));
    b.hold(&a, 100.0, at(0, 3), 101, second.clone());
    let t = later();
    assert!(b.next_to_unpark(true, t).is_none());
    second.store(2, Ordering::Relaxed);
    assert!(b
        .next_to_unpark(true, t + Duration::from_millis(9))
        .is_none());
    let (_, p) = b
        .next_to_unpark(true, t + Duration::from_millis(11))
        .unwrap();
    assert_eq!(p.at, at(0, 2));
    // A new rate ends the wait at once: 1,099 held, 10,000 wanted at 10,000/s.
    b.park(&a, 100.0, at(0, 4), 10, None);
    b.hold(&a, 100.0, at(0, 5), 1000, Arc::new(AtomicU32::new(0)));
    let t = later();
    assert!(b.next_to_unpark(true, t).is_none());
    b.set_rate("a", 10_000.0);
    let (_, p) = b
        .next_to_unpark(true, t + Duration::from_millis(1))
        .unwrap();
    assert_eq!(p.at, at(0, 4));
}
