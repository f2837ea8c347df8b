//! Web Push lanes per push-service origin, end to end: two loopback push services on
//! different ports are two origins. One answers every request 503; the other takes
//! them. Through the real worker, broker and PostgreSQL, the healthy origin keeps the
//! campaign's rate while the failing origin's ceiling drops to its floor. With one
//! ceiling for the whole provider, the failing origin's 503s cut the campaign's share
//! each second, and the healthy origin's deliveries with it.

use crate::harness::{Producer, Record};
use crate::providers_e2e::{campaign, wait_until, Env, GROUP_JOIN};
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use pushpace::provider::settings::{CommonSpec, WebPushSpec};
use pushpace::provider::webpush::vapid;
use pushpace::provider::webpush::WebPushSender;
use pushpace::provider::ProviderKind;
use pushpace::tools::mock::tls::TestCa;
use pushpace::tools::mock::webpush::WebPushMock;
use secrecy::SecretString;
use std::time::{Duration, Instant};

/// The campaign's send_rate; half of its devices go to each origin.
const RATE: f64 = 400.0;
/// Jobs, and devices each: 6,000 per origin, 15 s of the campaign's whole rate, more
/// than the healthy one takes by the measured window's end even when the test first
/// sees a delivery a few seconds late (checked: it must not run out inside the window).
const JOBS: usize = 12;
const PER_JOB: usize = 1_000;
/// From the healthy origin's first delivery, the wait before measuring: the failing
/// origin's first judged second (its ceiling's cut) and the second after it are over.
const SETTLE: Duration = Duration::from_secs(3);
/// The measured window.
const WINDOW: Duration = Duration::from_secs(4);
/// The healthy origin's rate must stay at least this share of its half of the
/// campaign's rate. The failing origin holds at its floor (10/s), so the healthy one
/// gets nearly all of the campaign's 400/s; one shared ceiling had cut it below
/// 100/s by then (0.9 × its accepted rate per congested second).
const HEALTHY_MIN_SHARE: f64 = 0.8;

fn vapid_key() -> SecretString {
    let key = p256::SecretKey::random(&mut aes_gcm::aead::OsRng);
    SecretString::from(key.to_pkcs8_pem(LineEnding::LF).expect("pem").to_string())
}

fn job_text(id: &str, campaign: &str, subs: &[String]) -> String {
    format!(
        r#"{{"job_id":"{id}","campaign_id":"{campaign}","provider":"webpush","send_rate":{RATE},"devices":[{}],"payload":"hi"}}"#,
        subs.join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_push_service_does_not_cut_another_origins_deliveries() {
    let ca = TestCa::new();
    let failing = WebPushMock::start(&ca).expect("mock");
    let healthy = WebPushMock::start(&ca).expect("mock");
    assert_ne!(failing.origin(), healthy.origin(), "two ports, two origins");
    failing.force(503, None, usize::MAX);
    let spec = WebPushSpec {
        name: "webpush".into(),
        vapid_key_pem: vapid_key(),
        vapid_subject: "mailto:ops@example.com".into(),
        vapid_lifetime: vapid::DEFAULT_LIFETIME,
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let sender = WebPushSender::new(&spec).expect("sender");
    let env = Env::start("webpush", ProviderKind::WebPush, sender).await;
    let id = campaign("wp-origins");
    let texts: Vec<String> = (0..JOBS)
        .map(|j| {
            let subs: Vec<String> = (0..PER_JOB)
                .map(|i| match i % 2 {
                    0 => healthy.subscribe().0,
                    _ => failing.subscribe().0,
                })
                .collect();
            job_text(&format!("{id}-{j}"), &id, &subs)
        })
        .collect();
    // All at once through one producer: one by one, each of these 200-KB jobs waited
    // about a second for the broker's acknowledgement, and the healthy origin had sent
    // most of its devices before the test first looked.
    let producer = Producer::new();
    let sends = texts
        .iter()
        .map(|t| producer.send(&env.topic, Record::of(t.as_bytes())));
    futures::future::join_all(sends).await;
    wait_until(
        "the healthy origin's first delivery",
        GROUP_JOIN,
        || async { healthy.delivered() > 0 },
    )
    .await;
    tokio::time::sleep(SETTLE).await;
    let (before, start) = (healthy.delivered(), Instant::now());
    tokio::time::sleep(WINDOW).await;
    let after = healthy.delivered();
    let rate = (after - before) as f64 / start.elapsed().as_secs_f64();
    assert!(
        after < (JOBS * PER_JOB / 2) as u64,
        "the healthy origin ran out of devices inside the window ({after}): no rate measured"
    );
    let lane = env.lane();
    eprintln!(
        "healthy origin: {rate:.0}/s over {WINDOW:?}; lanes: {:?}",
        lane.origins
    );
    assert!(
        rate >= HEALTHY_MIN_SHARE * RATE / 2.0,
        "the healthy origin took {rate:.0}/s; lanes: {:?}",
        lane.origins
    );
    let origin = |o: &str| {
        lane.origins
            .iter()
            .find(|l| &*l.origin == o)
            .unwrap_or_else(|| panic!("no lane for {o}: {:?}", lane.origins))
            .clone()
    };
    let (bad, good) = (origin(&failing.origin()), origin(&healthy.origin()));
    assert_eq!(bad.state, "backing off", "{bad:?}");
    assert!(bad.congestion["unavailable"] >= 1, "{bad:?}");
    assert_eq!((good.state, good.ceiling), ("clear", None), "{good:?}");
    env.stop().await;
}
