//! Start times, expiry and cancel in the scheduler, on a virtual clock (the wall clock
//! is anchored so that unix ms = virtual ns / 1e6).

use super::*;
use crate::job::Lifecycle;
use crate::limiter::Algorithm;
use crate::sender::{AnySender, NullSender};
use crate::worker::outcomes::Outcomes;

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;

fn scheduler() -> (Scheduler, std::sync::mpsc::Receiver<Event>) {
    let (completions, _) = mpsc::unbounded_channel();
    let (events, erx) = std::sync::mpsc::channel();
    let s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 10,
            max_in_flight: 10_000,
            ..SchedulerConfig::default()
        },
        AnySender::Null(NullSender),
        StatsRecorder::new(),
        completions,
        events,
    );
    (s, erx)
}

fn job(id: &str, campaign: &str, devices: usize, lifecycle: Lifecycle) -> Job {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let devices = (0..devices).map(|d| format!("{id}-{d}")).collect();
    let mut job = Job::new(id, campaign, devices, payload).unwrap();
    job.lifecycle = lifecycle;
    job
}

fn settings(campaign: &str, rate: f64) -> CampaignSettings {
    CampaignSettings::active(campaign, Rate::per_second(rate).unwrap(), Algorithm::Gcra)
}

/// Rounds every `step` until `until`; returns the sends of each round with its time.
fn drive(s: &mut Scheduler, from: Nanos, until: Nanos, step: Nanos) -> Vec<(Nanos, u64)> {
    let mut out = Vec::new();
    let mut now = from;
    while now < until {
        let before = s.stats().sends;
        s.run_round(now, now / SEC);
        out.push((now, s.stats().sends - before));
        now += step;
    }
    out
}

fn live(s: &Scheduler, id: &str) -> CampaignLive {
    s.stats()
        .campaigns
        .iter()
        .find(|c| &*c.id == id)
        .cloned()
        .expect("campaign held")
}

#[test]
fn a_campaign_start_holds_it_then_it_sends_at_its_rate_without_a_burst() {
    let (mut s, _) = scheduler();
    let mut st = settings("later", 100.0);
    st.start_at_ms = Some(2_000);
    // A million devices' worth is due at once: 100 jobs of 10,000.
    for j in 0..100 {
        let job = job(&format!("j{j}"), "later", 10_000, Lifecycle::default());
        s.add_job(IncomingJob::fresh(job, 0, j, st.clone()), 0);
    }
    s.add_job(
        IncomingJob::fresh(
            job("n", "now", 50, Lifecycle::default()),
            0,
            200,
            settings("now", 100.0),
        ),
        0,
    );
    let rounds = drive(&mut s, 0, 4 * SEC, 5 * MS);
    let before: u64 = rounds
        .iter()
        .filter(|(t, _)| *t < 2 * SEC)
        .map(|r| r.1)
        .sum();
    // All of "now" (not held up), and nothing of "later", before the start.
    assert_eq!(before, 50);
    assert!(live(&s, "later").sent > 0);
    // No 100 ms bucket of "later" above rate/10 × 1.1 (+ burst 0).
    for b in 20..40 {
        let n: u64 = rounds
            .iter()
            .filter(|(t, _)| *t >= b * 100 * MS && *t < (b + 1) * 100 * MS)
            .map(|r| r.1)
            .sum();
        assert!(n <= 11, "bucket {b}: {n} sends");
    }
    assert!(
        (195..=201).contains(&live(&s, "later").sent),
        "{}",
        live(&s, "later").sent
    );
}

#[test]
fn a_job_not_before_waits_without_holding_its_campaigns_other_jobs() {
    let (mut s, _) = scheduler();
    let st = settings("c", 1_000.0);
    let late = Lifecycle {
        not_before_ms: Some(1_000),
        ..Default::default()
    };
    s.add_job(
        IncomingJob::fresh(job("late", "c", 10, late), 0, 0, st.clone()),
        0,
    );
    s.add_job(
        IncomingJob::fresh(job("now", "c", 10, Lifecycle::default()), 0, 1, st),
        0,
    );
    drive(&mut s, 0, 900 * MS, 10 * MS);
    assert_eq!(s.stats().sends, 10, "only the job that is due");
    drive(&mut s, 900 * MS, 1_100 * MS, 10 * MS);
    assert_eq!(s.stats().sends, 20);
}

#[test]
fn expiry_counts_the_unsent_and_letters_the_job_once() {
    let (mut s, events) = scheduler();
    let (outcomes, mut queue) = Outcomes::for_test(16);
    s.set_outcomes(outcomes.clone());
    let mut st = settings("c", 100.0);
    st.expires_at_ms = Some(1_000);
    s.add_job(
        IncomingJob::fresh(job("j", "c", 500, Lifecycle::default()), 0, 7, st),
        0,
    );
    drive(&mut s, 0, 1_200 * MS, 10 * MS);
    let c = live(&s, "c");
    assert!((99..=101).contains(&c.sent), "{}", c.sent);
    assert_eq!(c.sent + c.expired, 500);
    let (seq, record) = queue.try_recv().expect("one letter");
    let Record::DeadLetter(l) = record else {
        panic!("a dead letter")
    };
    assert_eq!(
        (l.kind, l.offset, l.device),
        (DeadLetterKind::Expired, 7, None)
    );
    assert!(
        l.reason
            .starts_with(&format!("{} of 500 devices", c.expired)),
        "{}",
        l.reason
    );
    assert!(queue.try_recv().is_err(), "one letter per job");
    assert!(
        events.try_recv().is_err(),
        "finished before its letter is durable"
    );
    outcomes.written_below(seq + 1);
    drive(&mut s, 1_200 * MS, 1_300 * MS, 10 * MS);
    assert!(matches!(
        events.try_recv(),
        Ok(Event::JobFinished {
            offset: 7,
            devices: 500,
            ..
        })
    ));
}

#[test]
fn a_job_expiry_ends_only_that_job() {
    let (mut s, _) = scheduler();
    let st = settings("c", 10.0);
    let short = Lifecycle {
        expires_at_ms: Some(500),
        ..Default::default()
    };
    s.add_job(
        IncomingJob::fresh(job("a", "c", 20, short), 0, 0, st.clone()),
        0,
    );
    s.add_job(
        IncomingJob::fresh(job("b", "c", 20, Lifecycle::default()), 0, 1, st.clone()),
        0,
    );
    // Keeps the campaign held (so its counts can be read) after "a" and "b" finish.
    let keep = Lifecycle {
        not_before_ms: Some(1_000_000),
        ..Default::default()
    };
    s.add_job(IncomingJob::fresh(job("keep", "c", 1, keep), 0, 2, st), 0);
    drive(&mut s, 0, 3 * SEC, 10 * MS);
    let c = live(&s, "c");
    // "a" sends at 0, 100, …, 400 ms, then expires with 15 unsent; "b" sends all 20.
    assert_eq!(c.sent + c.expired, 40);
    assert!((14..=15).contains(&c.expired), "{}", c.expired);
}

#[test]
fn cancel_ends_held_jobs_and_later_ones() {
    let (mut s, events) = scheduler();
    let st = settings("c", 100.0);
    s.add_job(
        IncomingJob::fresh(job("a", "c", 300, Lifecycle::default()), 0, 0, st.clone()),
        0,
    );
    drive(&mut s, 0, 500 * MS, 10 * MS);
    let sent = live(&s, "c").sent;
    assert!(sent >= 45, "{sent}");
    let mut cancelled = st.clone();
    cancelled.cancelled = true;
    s.apply_settings(cancelled.clone(), 500 * MS);
    assert!(matches!(
        events.try_recv(),
        Ok(Event::JobFinished { offset: 0, .. })
    ));
    assert!(
        s.stats().campaigns.is_empty(),
        "released once its jobs ended"
    );
    // A later job: finished at once, nothing sent.
    s.add_job(
        IncomingJob::fresh(job("b", "c", 40, Lifecycle::default()), 0, 1, cancelled),
        600 * MS,
    );
    assert!(matches!(
        events.try_recv(),
        Ok(Event::JobFinished { offset: 1, .. })
    ));
    let before = s.stats().sends;
    drive(&mut s, 600 * MS, SEC, 10 * MS);
    assert_eq!(s.stats().sends, before);
}
