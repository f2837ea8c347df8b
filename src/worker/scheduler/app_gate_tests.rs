//! App slots on a virtual clock: jobs wait behind a closed gate without holding up a
//! static provider's campaign, start when the router installs the app's provider, go
//! through the new provider after a rotation, halt only the app on a refused key, and
//! end as `unknown_app` when the app is deleted.

use super::*;
use crate::provider::{Provider, ProviderKind};
use crate::sender::{AnySender, HaltScope, NullSender, Sender};
use std::sync::atomic::AtomicU64;

const SEC: Nanos = NANOS_PER_SEC;
const MS: Nanos = 1_000_000;
const RATE: f64 = 100.0;
const DEVICES: usize = 300;

/// Answers every send at once with `outcome` and counts them.
struct Counting {
    sends: AtomicU64,
    halt: bool,
}

impl Sender for Counting {
    fn send(&self, _job: &Arc<Job>, _device_index: usize) -> SendFuture {
        self.sends.fetch_add(1, Ordering::Relaxed);
        SendFuture::ready(if self.halt {
            SendOutcome::Halt {
                scope: HaltScope::Provider,
                reason: "403 InvalidProviderToken".into(),
            }
        } else {
            SendOutcome::Delivered
        })
    }

    fn name(&self) -> &'static str {
        "counting"
    }
}

fn counting(halt: bool) -> Arc<Counting> {
    Arc::new(Counting {
        sends: AtomicU64::new(0),
        halt,
    })
}

fn sends(c: &Counting) -> u64 {
    c.sends.load(Ordering::Relaxed)
}

struct Rig {
    s: Scheduler,
    events: std::sync::mpsc::Receiver<Event>,
    now: Nanos,
    slot: u16,
}

fn rig() -> Rig {
    rig_with(Vec::new())
}

fn rig_with(kind_caps: Vec<(ProviderKind, Rate)>) -> Rig {
    let fixed = Provider {
        name: Arc::from("static"),
        kind: ProviderKind::Null,
        max_rate: None,
        max_in_flight: None,
        adaptive: None,
        sender: AnySender::Null(NullSender),
    };
    let providers = Providers::new(vec![fixed], "static").unwrap();
    let slot = providers.apps().slot("acme", ProviderKind::Apns).unwrap();
    let (completions, _) = mpsc::unbounded_channel();
    let (events_tx, events) = std::sync::mpsc::channel();
    let s = Scheduler::new(
        SchedulerConfig {
            max_active_campaigns: 10,
            max_in_flight: 10_000,
            kind_caps,
            ..SchedulerConfig::default()
        },
        Arc::new(providers),
        StatsRecorder::new(),
        completions,
        events_tx,
    );
    Rig {
        s,
        events,
        now: 0,
        slot,
    }
}

impl Rig {
    fn add(&mut self, id: &str, campaign: &str, slot: u16) {
        let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
        let tokens = (0..DEVICES).map(|d| format!("{id}-{d}")).collect();
        let mut job = Job::new(id, campaign, tokens, payload).unwrap();
        job.provider_slot = slot;
        job.app_id = self
            .s
            .providers
            .apps()
            .key(slot)
            .map(|k| k.app_id.to_string());
        let rate = Rate::per_second(RATE).unwrap();
        let settings = CampaignSettings::active(campaign, rate, Algorithm::Gcra);
        self.s
            .add_job(IncomingJob::fresh(job, 0, 0, settings), self.now);
    }

    /// Rounds as the driver runs them, each 1 ms after the instant asked for.
    fn drive(&mut self, for_: Nanos) {
        let until = self.now + for_;
        while self.now < until {
            let wake = self.s.run_round(self.now, self.now / SEC);
            let round_end = self.now + self.s.quantum().as_nanos() as Nanos;
            self.now = wake.map_or(round_end, |w| w.min(round_end)).max(self.now) + MS;
        }
    }

    fn update(&mut self, state: AppState) {
        self.update_slot(self.slot, state);
    }

    fn update_slot(&mut self, slot: u16, state: AppState) {
        let key = self.s.providers.apps().key(slot).unwrap();
        let update = AppUpdate { slot, key, state };
        self.s.apply_app(update, self.now, self.now / SEC);
    }

    fn ready(&mut self, sender: &Arc<Counting>, fingerprint: &str) {
        self.ready_slot(self.slot, sender, fingerprint);
    }

    fn ready_slot(&mut self, slot: u16, sender: &Arc<Counting>, fingerprint: &str) {
        let provider = Provider {
            name: Arc::from("app/acme/apns"),
            kind: ProviderKind::Apns,
            max_rate: None,
            max_in_flight: None,
            adaptive: None,
            sender: AnySender::Provider(sender.clone()),
        };
        self.update_slot(
            slot,
            AppState::Ready {
                provider,
                fingerprint: Arc::from(fingerprint),
            },
        );
    }

    fn campaign(&self, id: &str) -> CampaignLive {
        let stats = self.s.stats();
        stats
            .campaigns
            .iter()
            .find(|c| &*c.id == id)
            .unwrap()
            .clone()
    }
}

#[test]
fn an_app_campaign_waits_for_its_app_and_a_static_one_does_not() {
    let mut r = rig();
    let slot = r.slot;
    r.add("app-job", "shop", slot);
    r.add("static-job", "news", 0);
    r.drive(SEC);
    let shop = r.campaign("shop");
    assert_eq!(shop.sent, 0);
    let why = shop
        .waiting_for_app
        .expect("the campaign shows what it waits for");
    assert!(why.starts_with("waiting for app acme"), "{why}");
    assert_eq!(shop.app_id.as_deref(), Some("acme"));
    // The other campaign kept its rate meanwhile: 100/s for 1 s (+ the permit at 0).
    let news = r.campaign("news");
    assert!((100..=101).contains(&news.sent), "{}", news.sent);

    let a = counting(false);
    r.ready(&a, "K1");
    r.drive(SEC);
    let shop = r.campaign("shop");
    assert!(shop.waiting_for_app.is_none());
    assert!((99..=102).contains(&sends(&a)), "{}", sends(&a));
    assert_eq!(shop.sent, sends(&a));
}

#[test]
fn a_rotation_sends_through_the_new_provider_and_a_stale_halt_is_ignored() {
    let mut r = rig();
    let slot = r.slot;
    r.add("app-job", "shop", slot);
    let (a, b) = (counting(false), counting(false));
    r.ready(&a, "K1");
    r.drive(SEC);
    let old_epoch = r.s.slot_epoch(slot);
    let before = sends(&a);
    r.ready(&b, "K2");
    r.drive(SEC);
    assert_eq!(
        sends(&a),
        before,
        "nothing through the old provider after the swap"
    );
    assert!(sends(&b) >= 99, "{}", sends(&b));
    // An answer the old key earned after the swap does not halt the new one.
    assert!(!r.s.halt_app(slot, old_epoch, "403 InvalidProviderToken"));
    assert_eq!(r.s.app_gate(slot), Some(&app_gates::Gate::Open));
    assert_eq!(r.campaign("shop").sent, sends(&a) + sends(&b));
}

#[test]
fn a_refused_key_halts_the_app_not_the_campaign_and_no_device_is_lost() {
    let mut r = rig();
    let slot = r.slot;
    r.add("app-job", "shop", slot);
    let bad = counting(true);
    r.ready(&bad, "K1");
    r.drive(SEC);
    // The first refusal closed the gate: one send, the device kept.
    assert_eq!(sends(&bad), 1);
    let shop = r.campaign("shop");
    assert!(shop.halted.is_none(), "{:?}", shop.halted);
    let why = shop.waiting_for_app.expect("waits for its app");
    assert!(why.contains("halted: 403 InvalidProviderToken"), "{why}");
    assert_eq!(shop.failed, 0);
    // Fixed: every device is delivered once, the refused one included.
    let good = counting(false);
    r.ready(&good, "K2");
    r.drive(4 * SEC);
    assert_eq!(sends(&good), DEVICES as u64);
    let finished = r.events.try_iter().count();
    assert_eq!(finished, 1, "the job finished");
}

#[test]
fn a_deleted_app_ends_its_jobs_with_one_letter_each() {
    let mut r = rig();
    let slot = r.slot;
    r.add("app-job", "shop", slot);
    r.drive(SEC);
    r.update(AppState::Deleted);
    // Its letter is durable at once here (no outcomes stage): the job finished.
    match r.events.try_recv() {
        Ok(Event::JobFinished { devices, .. }) => assert_eq!(devices, DEVICES as u32),
        other => panic!("{other:?}"),
    }
    assert_eq!(r.s.stats().open_jobs, 0);
    // A later job of the deleted app ends at its first turn, unsent.
    r.add("app-job-2", "shop", slot);
    r.drive(100 * MS);
    assert!(matches!(r.events.try_recv(), Ok(Event::JobFinished { .. })));
    assert_eq!(r.s.stats().sends, 0);
}

/// A kind cap of 100/s over two apps of that kind, each with a campaign at 100/s: the
/// two share it, 50/s each. The bound: the cap's tolerance (one `quantum_min` of its
/// sends, 1 at 100/s) and the permit at each end, per second.
#[test]
fn a_kind_cap_is_shared_by_the_apps_of_that_kind() {
    let cap = Rate::per_second(RATE).unwrap();
    let mut r = rig_with(vec![(ProviderKind::Apns, cap)]);
    let (acme, beta) = (
        r.slot,
        r.s.providers
            .apps()
            .slot("beta", ProviderKind::Apns)
            .unwrap(),
    );
    r.add("j-acme", "shop-a", acme);
    r.add("j-beta", "shop-b", beta);
    let (a, b) = (counting(false), counting(false));
    r.ready_slot(acme, &a, "K1");
    r.ready_slot(beta, &b, "K2");
    r.drive(2 * SEC);
    let (na, nb) = (sends(&a), sends(&b));
    assert!(
        (2 * 100 - 2..=2 * 100 + 4).contains(&(na + nb)),
        "{na} + {nb}"
    );
    assert!(na.abs_diff(nb) <= 4, "{na} vs {nb}");
    let shop = r.campaign("shop-a");
    assert!(
        (shop.effective_rate - 50.0).abs() < 0.01,
        "{}",
        shop.effective_rate
    );
}
