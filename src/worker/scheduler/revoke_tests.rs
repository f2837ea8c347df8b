//! Revocation when the rebalance gives the partition back before the revoked sends are
//! back (intake's drain timed out): the jobs read again are held, then sent, never
//! dropped. On the virtual clock: sends are held until the test answers them.

use super::*;
use crate::limiter::Algorithm;
use crate::sender::{AnySender, SendFuture, Sender};

const MS: Nanos = 1_000_000;

/// Sends that never answer by themselves; each (job, device) sent is recorded.
#[derive(Default)]
struct HeldSender {
    sent: parking_lot::Mutex<Vec<(String, u32)>>,
}

impl Sender for HeldSender {
    fn send(&self, job: &Arc<Job>, device: usize) -> SendFuture {
        self.sent
            .lock()
            .push((job.job_id.to_string(), device as u32));
        SendFuture::boxed(std::future::pending())
    }

    fn name(&self) -> &'static str {
        "held"
    }
}

struct Harness {
    s: Scheduler,
    sender: Arc<HeldSender>,
    events: std::sync::mpsc::Receiver<Event>,
    now: Nanos,
}

impl Harness {
    fn new() -> Self {
        let (completions, _) = mpsc::unbounded_channel();
        let (events_tx, events) = std::sync::mpsc::channel();
        let sender = Arc::new(HeldSender::default());
        let s = Scheduler::new(
            SchedulerConfig {
                max_active_campaigns: 10,
                max_in_flight: 64,
                ..SchedulerConfig::default()
            },
            AnySender::Provider(sender.clone()),
            StatsRecorder::new(),
            completions,
            events_tx,
        );
        Self {
            s,
            sender,
            events,
            now: 0,
        }
    }

    fn round(&mut self) {
        self.now += MS;
        self.s.run_round(self.now, 0);
    }

    fn rounds(&mut self, n: usize) {
        for _ in 0..n {
            self.round();
        }
    }

    /// Answers every send out so far as delivered, oldest first.
    fn answer_all(&mut self) {
        let sent = std::mem::take(&mut *self.sender.sent.lock());
        for (job_id, device) in sent {
            let slot = self
                .s
                .jobs
                .iter()
                .position(|j| j.as_ref().is_some_and(|j| *j.job.job_id == *job_id))
                .expect("the job of a send is held") as u32;
            self.now += MS;
            let done = Completion {
                slot,
                device,
                attempt: 0,
                first_failed: 0,
                outcome: SendOutcome::Delivered,
                latency_ns: 0,
                epoch: 0,
            };
            self.s.complete(done, self.now, 0);
        }
    }

    /// The offsets of the jobs reported finished so far.
    fn finished(&self) -> Vec<(i32, i64)> {
        self.events
            .try_iter()
            .map(
                |Event::JobFinished {
                     partition, offset, ..
                 }| (partition, offset),
            )
            .collect()
    }

    fn sends_of(&self, job_id: &str) -> usize {
        self.sender
            .sent
            .lock()
            .iter()
            .filter(|(j, _)| j == job_id)
            .count()
    }
}

/// Job `id` of its own campaign at (partition 0, `offset`) with `devices` devices.
fn incoming(id: &str, offset: i64, devices: usize) -> IncomingJob {
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let tokens = (0..devices).map(|d| format!("{id}-{d}")).collect();
    let job = Job::new(id, id, tokens, payload).unwrap();
    let settings =
        CampaignSettings::active(id, Rate::per_second(100_000.0).unwrap(), Algorithm::Gcra);
    IncomingJob::fresh(job, 0, offset, settings)
}

#[tokio::test]
async fn jobs_read_again_while_their_partition_is_still_revoked_are_held_then_sent() {
    let mut h = Harness::new();
    // "a" (offset 0): its 4 devices all go out (a new campaign's probe is 4 sends).
    h.s.add_job(incoming("a", 0, 4), h.now);
    h.rounds(5);
    assert_eq!(h.s.in_flight(), 4, "a's sends are out");
    let (done, answer) = oneshot::channel();
    h.s.start_revoke(vec![0], done);
    // Intake's drain timed out: it forgot partition 0, and the rebalance gave it back.
    drop(answer);
    h.s.add_job(incoming("a", 0, 4), h.now);
    h.s.add_job(incoming("b", 1, 3), h.now);
    h.rounds(5);
    assert_eq!(h.sends_of("b"), 0, "sent before the revocation completed");
    // The revoked sends come back: the revocation completes, the held jobs are added.
    h.answer_all();
    h.rounds(5);
    assert_eq!(
        h.sends_of("a"),
        0,
        "a's devices were finished by its first copy"
    );
    assert_eq!(h.sends_of("b"), 3, "b, read again, is sent");
    h.answer_all();
    h.round();
    // The first copy of "a" finished after intake gave up: reported once, by the copy
    // intake counts now; and b is reported, so the watermark passes both.
    assert_eq!(h.finished(), vec![(0, 0), (0, 1)]);
    assert!(h.s.jobs.iter().all(|j| j.is_none()), "nothing left behind");
}

#[tokio::test]
async fn a_second_revocation_drops_the_jobs_held_for_the_first() {
    let mut h = Harness::new();
    h.s.add_job(incoming("a", 0, 4), h.now);
    h.rounds(5);
    let (first, first_rx) = oneshot::channel();
    h.s.start_revoke(vec![0], first);
    drop(first_rx);
    h.s.add_job(incoming("b", 1, 3), h.now);
    // Revoked again before the first completed: intake forgets b's offset again, so
    // the scheduler must not send it (its next owner reads it).
    let (second, mut second_rx) = oneshot::channel();
    h.s.start_revoke(vec![0], second);
    h.answer_all();
    h.rounds(5);
    assert!(
        second_rx.try_recv().is_ok(),
        "the second revocation is answered"
    );
    assert_eq!(h.sends_of("b"), 0, "a job intake forgot was sent");
    assert!(h.s.jobs.iter().all(|j| j.is_none()));
    assert!(h.s.revoking.held.is_empty());
}

#[tokio::test]
async fn a_job_finished_while_intake_still_waits_is_reported() {
    let mut h = Harness::new();
    h.s.add_job(incoming("a", 0, 4), h.now);
    h.rounds(5);
    let (done, mut answer) = oneshot::channel();
    h.s.start_revoke(vec![0], done);
    h.answer_all();
    // Intake waits for the answer and commits what finished in the meantime.
    assert_eq!(h.finished(), vec![(0, 0)]);
    assert!(answer.try_recv().is_ok());
}
