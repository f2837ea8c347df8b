//! The scheduler's side of revocation and dead letters.

use super::*;
use crate::limiter::Algorithm;
use crate::sender::{AnySender, HttpSender, HttpSenderConfig, NullSender};
use crate::worker::outcomes::Outcomes;

fn scheduler(sender: AnySender) -> (Scheduler, mpsc::UnboundedReceiver<Completion>) {
    let (completions, crx) = mpsc::unbounded_channel();
    let (events, _) = std::sync::mpsc::channel();
    let s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 10,
            max_in_flight: 64,
            max_attempts: 5,
            ..SchedulerConfig::default()
        },
        sender,
        StatsRecorder::new(),
        completions,
        events,
    );
    (s, crx)
}

fn incoming(job_id: &str, partition: i32, devices: usize, paused: bool) -> IncomingJob {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let devices = (0..devices).map(|d| format!("{job_id}-{d}")).collect();
    // One campaign per job, named after it.
    let job = Job::new(job_id, job_id, devices, payload).unwrap();
    let mut settings =
        CampaignSettings::active(job_id, Rate::per_second(1_000.0).unwrap(), Algorithm::Gcra);
    settings.paused = paused;
    IncomingJob::fresh(job, partition, 0, settings)
}

#[test]
fn a_dead_lettered_device_is_done_only_once_its_letter_is_written() {
    let (mut s, _crx) = scheduler(AnySender::Null(NullSender));
    let (outcomes, mut queue) = Outcomes::for_test(16);
    s.set_outcomes(outcomes.clone());
    // Paused: nothing is dispatched, so device 0 is only touched by its letter.
    s.add_job(incoming("j", 0, 1, true), 0);
    s.dead_letter(0, 0, "refused".into());
    let (seq, record) = queue.try_recv().expect("the letter is queued");
    assert!(matches!(record, Record::DeadLetter(ref l) if l.device == Some(0)));
    s.run_round(MS, 0);
    let job = s.jobs[0].as_ref().expect("job still open");
    assert!(!job.is_done(0), "done before its letter is written");
    assert_eq!(
        job.progress.done(),
        0,
        "progress passed an unwritten letter"
    );
    outcomes.written_below(seq + 1);
    s.run_round(2 * MS, 0);
    assert!(
        s.jobs[0].is_none(),
        "the job finishes once its letter is written"
    );
}

#[test]
fn records_wait_for_room_in_order_and_hold_dispatching() {
    let (mut s, _crx) = scheduler(AnySender::Null(NullSender));
    let (outcomes, mut queue) = Outcomes::for_test(1);
    s.set_outcomes(outcomes.clone());
    s.add_job(incoming("held", 0, 3, true), 0);
    s.add_job(incoming("sending", 1, 100, false), 0);
    for d in 0..3 {
        s.dead_letter(0, d, format!("refused {d}"));
    }
    // One fits; two wait, and while they wait nothing is sent.
    let sends = s.stats().sends;
    assert!(s.run_round(MS, 0).is_some(), "a wake-up to retry the queue");
    assert_eq!(s.stats().sends, sends, "sent while records waited for room");
    let mut devices = Vec::new();
    for round in 2..10 {
        if let Ok((seq, Record::DeadLetter(l))) = queue.try_recv() {
            devices.push(l.device.unwrap());
            outcomes.written_below(seq + 1);
        }
        s.run_round(round * MS, 0);
    }
    assert_eq!(devices, vec![0, 1, 2], "letters reach the queue in order");
    assert!(
        s.stats().sends > sends,
        "sending resumes once they are queued"
    );
}

/// A provider that accepts connections and never answers: sends stay in flight.
async fn silent_provider() -> (String, tokio::task::JoinHandle<()>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/push", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((c, _)) = listener.accept().await {
            held.push(c);
        }
    });
    (url, task)
}

#[tokio::test]
async fn overlapping_revocations_are_each_answered_and_their_retries_dropped() {
    let (url, provider) = silent_provider().await;
    let sender = HttpSender::new(&HttpSenderConfig::new(url)).unwrap();
    let (mut s, mut crx) = scheduler(AnySender::Http(sender));
    for p in 0..3 {
        s.add_job(incoming(&format!("p{p}"), p, 200, false), 0);
    }
    s.run_round(SEC, 0);
    let in_flight = |s: &Scheduler, p: i32| {
        s.jobs
            .iter()
            .flatten()
            .filter(|j| j.partition == p)
            .map(|j| j.in_flight)
            .sum::<u32>()
    };
    assert!(
        (0..3).all(|p| in_flight(&s, p) > 0),
        "every partition has sends out"
    );
    let (tx0, mut rx0) = oneshot::channel();
    let (tx1, mut rx1) = oneshot::channel();
    s.start_revoke(vec![0], tx0);
    s.start_revoke(vec![1], tx1);
    let before = s.stats().sends;
    s.run_round(2 * SEC, 0);
    let (p2_before, p2_after) = (in_flight(&s, 2), s.stats().sends - before);
    assert!(
        rx0.try_recv().is_err() && rx1.try_recv().is_err(),
        "answered with sends out"
    );
    assert!(
        p2_after <= 64,
        "{p2_after}: only room freed by completions is used"
    );
    // The provider drops every connection: each send comes back as a retry.
    provider.abort();
    let mut now = 3 * SEC;
    while in_flight(&s, 0) + in_flight(&s, 1) > 0 {
        let done = tokio::time::timeout(Duration::from_secs(10), crx.recv())
            .await
            .expect("a completion")
            .expect("completions open");
        s.complete(done, now, 0);
        now += MS;
    }
    assert!(rx0.try_recv().is_ok(), "the first revocation is answered");
    assert!(rx1.try_recv().is_ok(), "the second revocation is answered");
    assert!(
        s.jobs.iter().flatten().all(|j| j.partition == 2),
        "revoked partitions' jobs are dropped"
    );
    let retries: usize = s.campaigns.iter().flatten().map(|c| c.retries.len()).sum();
    assert!(
        retries <= p2_before as usize,
        "retries kept for revoked partitions"
    );
}

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;

#[test]
fn settings_of_campaigns_idle_past_forget_after_are_forgotten() {
    let (mut s, _crx) = scheduler(AnySender::Null(NullSender));
    let rate = Rate::per_second(10.0).unwrap();
    s.apply_settings(CampaignSettings::active("idle", rate, Algorithm::Gcra), 0);
    s.add_job(incoming("busy", 0, 1_000, true), 0);
    assert_eq!(s.known.len(), 2);
    let forget = s.config.forget_after.as_nanos() as Nanos;
    s.run_round(forget - SEC, 0);
    assert_eq!(s.known.len(), 2, "forgotten before forget_after");
    // The next sweep (they run every SWEEP_EVERY).
    s.run_round(forget - SEC + SWEEP_EVERY.as_nanos() as Nanos, 0);
    // "busy" still holds a job (paused), so it stays however long it waits.
    assert!(s.known.contains_key("busy") && !s.known.contains_key("idle"));
}
