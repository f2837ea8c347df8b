//! The scheduler's answer classes: halts within the probe, resumes, provider-wide halts,
//! the mismatch majority, dead tokens. A scripted sender answers by token prefix; its
//! sends complete on spawned tasks, so several are in flight at once as in production.

use super::*;
use crate::limiter::Algorithm;
use crate::provider::{Provider, ProviderKind, Providers};
use crate::sender::{AnySender, HaltScope, Sender};
use crate::worker::outcomes::Outcomes;
use std::sync::atomic::{AtomicBool, AtomicU64};

const MS: Nanos = 1_000_000;

/// Answers by token prefix until `all_ok` is set (the operator fixed the configuration).
#[derive(Default)]
struct Scripted {
    sends: AtomicU64,
    all_ok: AtomicBool,
}

impl Sender for Scripted {
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        self.sends.fetch_add(1, Ordering::Relaxed);
        let token = &job.devices[device_index];
        let outcome = if self.all_ok.load(Ordering::Relaxed) {
            SendOutcome::Delivered
        } else if token.starts_with("halt-") {
            SendOutcome::Halt {
                scope: HaltScope::Campaign,
                reason: "APNs 400 BadTopic".into(),
            }
        } else if token.starts_with("phalt-") {
            SendOutcome::Halt {
                scope: HaltScope::Provider,
                reason: "APNs 403 InvalidProviderToken".into(),
            }
        } else if token.starts_with("mis-") {
            SendOutcome::Mismatch {
                dead_token: true,
                reason: "APNs 400 BadDeviceToken".into(),
            }
        } else if token.starts_with("dead-") {
            SendOutcome::DeadToken {
                reason: "APNs 410 Unregistered".into(),
            }
        } else {
            SendOutcome::Delivered
        };
        SendFuture::boxed(async move { outcome })
    }

    fn name(&self) -> &'static str {
        "scripted"
    }
}

struct Harness {
    s: Scheduler,
    crx: mpsc::UnboundedReceiver<Completion>,
    queue: mpsc::Receiver<(u64, Record)>,
    outcomes: Outcomes,
    sender: Arc<Scripted>,
    now: Nanos,
}

impl Harness {
    fn new() -> Self {
        let sender = Arc::new(Scripted::default());
        let providers = Providers::new(
            vec![Provider {
                name: Arc::from("ios"),
                kind: ProviderKind::Apns,
                max_rate: None,
                max_in_flight: None,
                adaptive: None,
                sender: AnySender::Provider(sender.clone()),
            }],
            "ios",
        )
        .unwrap();
        let (completions, crx) = mpsc::unbounded_channel();
        let (events, _) = std::sync::mpsc::channel();
        let mut s = Scheduler::new(
            SchedulerConfig {
                max_in_flight: 64,
                ..SchedulerConfig::default()
            },
            Arc::new(providers),
            StatsRecorder::new(),
            completions,
            events,
        );
        let (outcomes, queue) = Outcomes::for_test(100_000);
        s.set_outcomes(outcomes.clone());
        Self {
            s,
            crx,
            queue,
            outcomes,
            sender,
            now: 0,
        }
    }

    fn add(&mut self, campaign: &str, tokens: Vec<String>) {
        let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
        let job = Job::new(format!("{campaign}-job"), campaign, tokens, payload).unwrap();
        let settings = CampaignSettings::active(
            campaign,
            Rate::per_second(10_000.0).unwrap(),
            Algorithm::Gcra,
        );
        self.s
            .add_job(IncomingJob::fresh(job, 0, 0, settings), self.now);
    }

    /// Rounds of 10 ms, each followed by every answer of that round, and every record
    /// written at once.
    async fn run(&mut self, rounds: usize) {
        for _ in 0..rounds {
            self.now += 10 * MS;
            self.s.run_round(self.now, 0);
            tokio::task::yield_now().await;
            while self.s.in_flight > 0 {
                let Some(c) = self.crx.recv().await else {
                    break;
                };
                self.s.complete(c, self.now, 0);
            }
            self.outcomes.written_below(u64::MAX);
        }
    }

    fn records(&mut self) -> Vec<Record> {
        let mut out = Vec::new();
        while let Ok((_, r)) = self.queue.try_recv() {
            out.push(r);
        }
        out
    }

    fn settings(&mut self, campaign: &str, paused: bool, halted: bool) {
        let mut s = CampaignSettings::active(
            campaign,
            Rate::per_second(10_000.0).unwrap(),
            Algorithm::Gcra,
        );
        s.paused = paused;
        s.halted = halted;
        self.s.apply_settings(s, self.now);
    }

    fn live(&self, campaign: &str) -> CampaignLive {
        let stats = self.s.stats();
        let found = stats.campaigns.iter().find(|c| &*c.id == campaign).cloned();
        found.expect("campaign is held")
    }
}

fn tokens(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}{i}")).collect()
}

#[tokio::test]
async fn a_halt_stops_the_campaign_within_the_probe_and_the_resume_sends_every_device() {
    let mut h = Harness::new();
    h.add("c", tokens("halt-", 1000));
    h.run(20).await;
    let sends = h.sender.sends.load(Ordering::Relaxed);
    assert!(
        sends as u32 <= PROBE_IN_FLIGHT,
        "{sends} sends before the halt"
    );
    assert!(h.live("c").halted.is_some());
    let records = h.records();
    assert!(
        matches!(&records[..], [Record::Halt { campaign_id, reason }] if &**campaign_id == "c" && reason.contains("BadTopic")),
        "one halt record and no dead letter: {records:?}"
    );
    // A stale "active" (before the store recorded the halt) does not resume it.
    h.settings("c", false, false);
    h.run(5).await;
    assert_eq!(h.sender.sends.load(Ordering::Relaxed), sends);
    // The store reports it halted, then the operator resumes it.
    h.settings("c", false, true);
    h.sender.all_ok.store(true, Ordering::Relaxed);
    h.settings("c", false, false);
    h.run(50).await;
    assert_eq!(
        h.s.stats().delivered,
        1000,
        "every device sent after the resume"
    );
    assert_eq!(h.sender.sends.load(Ordering::Relaxed), 1000 + sends);
    assert!(h
        .records()
        .iter()
        .all(|r| !matches!(r, Record::DeadLetter(_))));
}

#[tokio::test]
async fn a_provider_halt_stops_other_campaigns_on_it_before_they_send() {
    let mut h = Harness::new();
    h.add("a", tokens("phalt-", 100));
    h.run(5).await;
    let sends = h.sender.sends.load(Ordering::Relaxed);
    assert!(sends as u32 <= PROBE_IN_FLIGHT);
    h.add("b", tokens("ok-", 100));
    h.run(5).await;
    assert_eq!(
        h.sender.sends.load(Ordering::Relaxed),
        sends,
        "b sent nothing"
    );
    let halted = h.live("b").halted.expect("b halted");
    assert!(halted.contains("provider ios"), "{halted}");
    // Resuming b trusts the provider again (the operator fixed it).
    h.settings("b", false, true);
    h.settings("b", false, false);
    h.run(10).await;
    assert_eq!(h.s.stats().delivered, 100, "b sent all; a stays halted");
    assert!(h.live("a").halted.is_some());
}

#[tokio::test]
async fn most_first_answers_being_mismatches_halt_without_recording_dead_tokens() {
    let mut h = Harness::new();
    h.add("c", tokens("mis-", 500));
    h.run(100).await;
    let live = h.live("c");
    assert!(live
        .halted
        .as_deref()
        .is_some_and(|r| r.contains("BadDeviceToken")));
    let sends = h.sender.sends.load(Ordering::Relaxed) as u32;
    assert!(
        (MISMATCH_MIN..MISMATCH_MIN + PROBE_IN_FLIGHT).contains(&sends),
        "{sends}"
    );
    let records = h.records();
    assert!(
        records.iter().all(|r| matches!(r, Record::Halt { .. })),
        "no token recorded invalid: {records:?}"
    );
    assert_eq!(live.invalid, 0);
}

#[tokio::test]
async fn a_few_mismatches_among_good_answers_are_dead_tokens() {
    let mut h = Harness::new();
    let mut list = tokens("ok-", 90);
    list.extend(tokens("mis-", 10));
    list.extend(tokens("dead-", 5));
    h.add("c", list);
    h.run(50).await;
    assert_eq!(h.s.stats().delivered, 90);
    assert!(h.s.jobs.iter().all(Option::is_none), "the job finished");
    let invalid = h
        .records()
        .into_iter()
        .filter(|r| matches!(r, Record::InvalidToken { .. }))
        .count();
    assert_eq!(invalid, 15);
}
