//! Answers judged by majority ([`HaltScope::Majority`]: Web Push 401/403/413, FCM
//! `THIRD_PARTY_AUTH_ERROR`), and the resume cap of a device that halts its campaign.
//! The scripted sender answers through the real classifiers, on the manual clock.

use super::refusals::{FORGET_ANSWERS, HOLD_ANSWERS, MAX_ORIGINS};
use super::*;
use crate::limiter::Algorithm;
use crate::provider::{fcm, webpush, Provider, ProviderKind, Providers};
use crate::sender::{AnySender, HaltScope, Sender};
use crate::worker::outcomes::Outcomes;
use http::{HeaderMap, StatusCode};
use std::sync::atomic::{AtomicBool, AtomicU64};

const MS: Nanos = 1_000_000;
/// Rounds of 10 ms: enough for every test's few hundred sends at 10,000/s.
const ROUNDS: usize = 60;
/// The push service most subscriptions are on.
const GOOD: &str = "https://fcm.googleapis.com";

/// Web Push: an endpoint path starting `/refuse` answers 403 (a subscription made under
/// another VAPID key), `/halt` a campaign halt; FCM: a `thirdparty-` token answers
/// THIRD_PARTY_AUTH_ERROR. Everything else, or everything once `all_ok`, is delivered.
#[derive(Default)]
struct Scripted {
    sends: AtomicU64,
    halt_sends: AtomicU64,
    all_ok: AtomicBool,
}

fn webpush_403() -> SendOutcome {
    let body = br#"{"code":403,"message":"VAPID key differs from the subscription's"}"#;
    webpush::answer::classify(StatusCode::FORBIDDEN, &HeaderMap::new(), body).0
}

fn fcm_third_party() -> SendOutcome {
    let body = serde_json::json!({"error": {"code": 401, "status": "UNAUTHENTICATED",
        "message": "Auth error from APNS or Web Push Service",
        "details": [{"@type": fcm::answer::FCM_ERROR_TYPE, "errorCode": "THIRD_PARTY_AUTH_ERROR"}]}});
    let body = body.to_string();
    match fcm::answer::classify(StatusCode::UNAUTHORIZED, &HeaderMap::new(), body.as_bytes()) {
        fcm::answer::Verdict::Done(o, _) => o,
        other => panic!("{other:?}"),
    }
}

impl Sender for Scripted {
    fn send(&self, job: &Arc<Job>, device_index: usize) -> SendFuture {
        self.sends.fetch_add(1, Ordering::Relaxed);
        let token = &job.devices[device_index];
        let outcome = if self.all_ok.load(Ordering::Relaxed) {
            SendOutcome::Delivered
        } else if token.contains("/refuse") {
            webpush_403()
        } else if token.contains("/halt") {
            self.halt_sends.fetch_add(1, Ordering::Relaxed);
            SendOutcome::Halt {
                scope: HaltScope::Campaign,
                reason: "HTTP 400: the push service rejected the Topic".into(),
            }
        } else if token.starts_with("thirdparty-") {
            fcm_third_party()
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
    records: Vec<Record>,
    now: Nanos,
}

impl Harness {
    fn new(kind: ProviderKind) -> Self {
        let sender = Arc::new(Scripted::default());
        let provider = Provider {
            name: Arc::from("p"),
            kind,
            max_rate: None,
            max_in_flight: None,
            adaptive: None,
            sender: AnySender::Provider(sender.clone()),
        };
        let providers = Providers::new(vec![provider], "p").unwrap();
        let (completions, crx) = mpsc::unbounded_channel();
        let (events, _) = std::sync::mpsc::channel();
        let config = SchedulerConfig {
            max_in_flight: 64,
            ..SchedulerConfig::default()
        };
        let mut s = Scheduler::new(
            config,
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
            records: Vec::new(),
            now: 0,
        }
    }

    fn add(&mut self, campaign: &str, tokens: Vec<String>) {
        let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
        let job = Job::new(format!("{campaign}-job"), campaign, tokens, payload).unwrap();
        let rate = Rate::per_second(10_000.0).unwrap();
        let settings = CampaignSettings::active(campaign, rate, Algorithm::Gcra);
        self.s
            .add_job(IncomingJob::fresh(job, 0, 0, settings), self.now);
    }

    /// Rounds of 10 ms, each followed by every answer of that round, and every record
    /// written at once (kept in `records`).
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
            while let Ok((_, r)) = self.queue.try_recv() {
                self.records.push(r);
            }
        }
    }

    /// The store records the halt, then the operator resumes the campaign.
    fn resume(&mut self, campaign: &str) {
        for halted in [true, false] {
            let rate = Rate::per_second(10_000.0).unwrap();
            let mut s = CampaignSettings::active(campaign, rate, Algorithm::Gcra);
            s.halted = halted;
            self.s.apply_settings(s, self.now);
        }
    }

    fn live(&self, campaign: &str) -> CampaignLive {
        let stats = self.s.stats();
        let found = stats.campaigns.iter().find(|c| &*c.id == campaign).cloned();
        found.expect("campaign is held")
    }

    fn halts(&self, campaign: &str) -> Vec<&str> {
        let mut out = Vec::new();
        for r in &self.records {
            if let Record::Halt {
                campaign_id,
                reason,
            } = r
            {
                if &**campaign_id == campaign {
                    out.push(reason.as_str());
                }
            }
        }
        out
    }

    fn letters(&self, campaign: &str) -> Vec<(u32, &str)> {
        let mut out = Vec::new();
        for r in &self.records {
            if let Record::DeadLetter(l) = r {
                if l.campaign_id.as_deref() == Some(campaign) {
                    out.push((l.device.expect("a device's letter"), l.reason.as_str()));
                }
            }
        }
        out
    }

    fn jobs_open(&self) -> usize {
        self.s.jobs.iter().flatten().count()
    }
}

/// A subscription's device string on `origin`, path `/<path>`.
fn sub(origin: &str, path: &str) -> String {
    format!(r#"{{"endpoint":"{origin}/{path}","keys":{{"p256dh":"x","auth":"y"}}}}"#)
}

fn subs(origin: &str, path: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|i| sub(origin, &format!("{path}-{i}")))
        .collect()
}

/// One of 200 subscriptions answers 403, on the campaign's push service or on a host of
/// its own: the other 199 are delivered, that one is dead-lettered with the reason, no
/// halt, and the job finishes.
async fn one_refused_of_200(refusing_origin: &str) {
    let mut h = Harness::new(ProviderKind::WebPush);
    let mut list = subs(GOOD, "ok", 199);
    list.insert(37, sub(refusing_origin, "refuse-1"));
    h.add("c", list);
    h.run(ROUNDS).await;
    assert_eq!(h.halts("c"), Vec::<&str>::new(), "no halt");
    assert_eq!(h.s.stats().delivered, 199);
    let letters = h.letters("c");
    assert_eq!(letters.len(), 1, "{letters:?}");
    assert_eq!(letters[0].0, 37);
    assert!(letters[0].1.contains("HTTP 403"), "{}", letters[0].1);
    assert_eq!(h.jobs_open(), 0, "the job finished");
    assert_eq!(h.sender.sends.load(Ordering::Relaxed), 200, "one send each");
}

#[tokio::test]
async fn one_refused_subscription_on_a_shared_push_service_is_dead_lettered_alone() {
    one_refused_of_200(GOOD).await;
}

#[tokio::test]
async fn one_refused_subscription_on_a_host_of_its_own_is_dead_lettered_alone() {
    one_refused_of_200("https://push.user-registered.example:8443").await;
}

#[tokio::test]
async fn most_refusals_from_one_origin_halt_that_campaign_only() {
    let mut h = Harness::new(ProviderKind::WebPush);
    // Subscriptions made under another key: their service refuses every one.
    let stale = "https://updates.push.services.mozilla.com";
    h.add("a", subs(stale, "refuse", 300));
    h.add("b", subs(GOOD, "ok", 300));
    h.run(ROUNDS).await;
    let halts = h.halts("a");
    assert_eq!(halts.len(), 1, "{halts:?}");
    assert!(
        halts[0].contains(stale) && halts[0].contains("HTTP 403"),
        "{halts:?}"
    );
    assert!(h.live("a").halted.is_some());
    assert!(
        h.letters("a").is_empty(),
        "nothing dead-lettered by the halt"
    );
    let refused = h.sender.sends.load(Ordering::Relaxed) - 300;
    assert!(
        refused < 2 * u64::from(REFUSAL_MIN + PROBE_IN_FLIGHT),
        "{refused} refused sends"
    );
    // Another campaign on another origin, and one that starts later, are not halted.
    assert!(h.halts("b").is_empty());
    h.add("later", subs(GOOD, "ok2", 50));
    h.run(ROUNDS).await;
    assert_eq!(h.s.stats().delivered, 350, "b and later delivered in full");
    assert!(h.halts("b").is_empty() && h.halts("later").is_empty());
}

#[tokio::test]
async fn refusals_after_many_good_answers_still_halt_on_a_recent_majority() {
    let mut h = Harness::new(ProviderKind::WebPush);
    let mut list = subs(GOOD, "ok", 300);
    list.extend(subs(GOOD, "refuse", 200));
    h.add("c", list);
    h.run(ROUNDS).await;
    let halts = h.halts("c");
    assert_eq!(halts.len(), 1, "a majority of the last answers: {halts:?}");
    assert_eq!(h.s.stats().delivered, 300);
    // The refusals were held until the majority: none is dead-lettered.
    assert!(h.letters("c").is_empty(), "{:?}", h.letters("c"));
}

#[tokio::test]
async fn a_device_that_halts_its_campaign_is_dead_lettered_after_the_resume_cap() {
    let mut h = Harness::new(ProviderKind::WebPush);
    let mut list = vec![sub(GOOD, "halt-0")];
    list.extend(subs(GOOD, "ok", 20));
    h.add("c", list);
    h.run(5).await;
    assert_eq!(h.halts("c").len(), 1);
    for resume in 1..=MAX_HALT_RESUMES {
        h.resume("c");
        h.run(5).await;
        assert_eq!(
            h.sender.halt_sends.load(Ordering::Relaxed),
            u64::from(resume) + 1,
            "the device went first again after resume {resume}"
        );
        assert_eq!(h.halts("c").len() as u32, resume + 1, "halted again");
    }
    let letters = h.letters("c");
    assert_eq!(letters.len(), 1, "dead-lettered after the cap: {letters:?}");
    assert_eq!(letters[0].0, 0);
    assert!(
        letters[0].1.contains("rejected the Topic"),
        "{}",
        letters[0].1
    );
    // The next resume sends the rest; the device is not sent again.
    h.resume("c");
    h.run(10).await;
    assert_eq!(
        h.sender.halt_sends.load(Ordering::Relaxed),
        u64::from(MAX_HALT_RESUMES) + 1
    );
    assert_eq!(h.s.stats().delivered, 20);
    assert_eq!(h.jobs_open(), 0, "the job finished");
}

#[tokio::test]
async fn fcm_third_party_auth_error_is_judged_by_majority() {
    let mut h = Harness::new(ProviderKind::Fcm);
    let mut one: Vec<String> = (0..199).map(|i| format!("ok-{i}")).collect();
    one.insert(5, "thirdparty-1".into());
    h.add("one", one);
    h.run(ROUNDS).await;
    assert!(h.halts("one").is_empty(), "{:?}", h.halts("one"));
    let letters = h.letters("one");
    assert!(
        matches!(&letters[..], [(5, r)] if r.contains("THIRD_PARTY_AUTH_ERROR")),
        "{letters:?}"
    );
    assert_eq!(h.jobs_open(), 0);
    // Every token of an app whose APNs certificate was refused: that campaign halts,
    // the provider does not.
    h.add("app", (0..100).map(|i| format!("thirdparty-{i}")).collect());
    h.run(ROUNDS).await;
    assert_eq!(h.halts("app").len(), 1);
    assert!(h.letters("app").is_empty());
    h.add("other", (0..50).map(|i| format!("ok2-{i}")).collect());
    h.run(ROUNDS).await;
    assert!(h.halts("other").is_empty());
    assert_eq!(h.s.stats().delivered, 199 + 50);
}

#[tokio::test]
async fn a_refusal_on_a_host_with_no_other_device_is_settled_while_the_campaign_sends() {
    let mut h = Harness::new(ProviderKind::WebPush);
    let mut list = subs(GOOD, "ok", 999);
    list.insert(10, sub("https://lonely.example", "refuse-1"));
    h.add("c", list);
    // Five rounds send about 5 × 64 (the in-flight pool): more than HOLD_ANSWERS after
    // the refusal, far from the campaign's end.
    h.run(5).await;
    let sends = h.sender.sends.load(Ordering::Relaxed);
    assert!(sends > 10 + HOLD_ANSWERS && sends < 900, "{sends} sends");
    assert_eq!(h.letters("c").len(), 1, "settled before the campaign ended");
    h.run(ROUNDS).await;
    assert_eq!(h.s.stats().delivered, 999);
    assert!(h.halts("c").is_empty());
}

#[tokio::test]
async fn many_lone_refusing_hosts_neither_halt_nor_hide_a_majority_elsewhere() {
    let mut h = Harness::new(ProviderKind::WebPush);
    let mut list = Vec::new();
    // Twice as many single-device hosts as the windows a campaign keeps.
    for i in 0..2 * MAX_ORIGINS {
        list.extend(subs(GOOD, &format!("ok{i}"), 5));
        list.push(sub(&format!("https://host{i}.example"), "refuse"));
    }
    h.add("c", list);
    h.run(ROUNDS).await;
    assert!(h.halts("c").is_empty(), "{:?}", h.halts("c"));
    assert_eq!(h.letters("c").len(), 2 * MAX_ORIGINS);
    assert_eq!(h.jobs_open(), 0);
    // The same campaign's next job: every subscription on one service refused.
    let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
    let stale = subs("https://stale.example", "refuse", 50);
    let job = Job::new("c-job-2", "c", stale, payload).unwrap();
    let rate = Rate::per_second(10_000.0).unwrap();
    let settings = CampaignSettings::active("c", rate, Algorithm::Gcra);
    h.s.add_job(IncomingJob::fresh(job, 0, 1, settings), h.now);
    h.run(ROUNDS).await;
    let halts = h.halts("c");
    assert!(
        matches!(&halts[..], [r] if r.contains("https://stale.example")),
        "{halts:?}"
    );
    assert_eq!(
        h.letters("c").len(),
        2 * MAX_ORIGINS,
        "the stale ones are held"
    );
}

#[tokio::test]
async fn a_window_refused_once_long_ago_is_dropped() {
    let mut h = Harness::new(ProviderKind::WebPush);
    let mut list = vec![sub("https://once.example", "refuse-1")];
    list.extend(subs(GOOD, "ok", 2999));
    h.add("c", list);
    let watching = |h: &Harness| {
        let slot = h.s.by_id["c"];
        h.s.campaigns[slot as usize]
            .as_ref()
            .is_some_and(|c| c.refusals.watching())
    };
    h.run(2).await;
    assert!(watching(&h), "the refusal opened a window");
    // Past FORGET_ANSWERS answers since the refusal, short of the campaign's end.
    let sends = |h: &Harness| h.sender.sends.load(Ordering::Relaxed);
    for _ in 0..1000 {
        if sends(&h) > FORGET_ANSWERS + 64 {
            break;
        }
        h.run(1).await;
    }
    let sends = sends(&h);
    assert!(sends > FORGET_ANSWERS + 64 && sends < 2900, "{sends} sends");
    assert!(!watching(&h), "the window is still read on every answer");
}
