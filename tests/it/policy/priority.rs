//! Priority classes under a saturated shared cap: a provider's `max_rate`, and the
//! global cap.

use super::*;
use crate::harness::TestWorkerOptions;
use pushpace::job::PriorityClass;
use pushpace::limiter::Rate;
use pushpace::provider::{Provider, ProviderKind, Providers};
use pushpace::sender::AnySender;
use pushpace::sender::{HttpSender, HttpSenderConfig};
use pushpace::tools::sink::{Sink, SinkConfig, SinkHandle};
use std::sync::Arc;

/// The cap, the bulk campaigns' number and the critical campaign's rate.
const CAP: f64 = 1_000.0;
const BULK: usize = 10;
const CRITICAL_RATE: f64 = 300.0;
/// Pacing held within this fraction, as the global-cap test holds its shares.
const SHARE_TOLERANCE: f64 = 0.05;
/// A 1-s window may pass the cap by the GCRA tolerance of one quantum's sends and the
/// second-edge rounding: 2% plus one send, as the global-cap test bounds it.
const CAP_TOLERANCE: f64 = 0.02;

/// Where the 1,000/s cap is.
enum Cap {
    /// The one provider's `max_rate`: the gate every turn through it passes.
    Provider,
    /// `limiter.global_rate`: over the campaigns' own limiters.
    Global,
}

/// The worker's options for `cap`, and the sink it sends to.
async fn options(cap: Cap) -> (TestWorkerOptions, Option<Arc<SinkHandle>>) {
    match cap {
        Cap::Global => (
            TestWorker::options().settings(&[("limiter.global_rate", CAP.to_string())]),
            None,
        ),
        Cap::Provider => {
            let sink = Arc::new(Sink::start(SinkConfig::default()).await.expect("a sink"));
            let sender = HttpSender::new(&HttpSenderConfig::new(sink.url())).expect("sender");
            let provider = Provider {
                name: Arc::from("capped"),
                kind: ProviderKind::Webhook,
                max_rate: Some(Rate::per_second(CAP).unwrap()),
                max_in_flight: None,
                adaptive: None,
                sender: AnySender::Http(sender),
            };
            let providers = Providers::new(vec![provider], "capped").expect("providers");
            (TestWorker::options().providers(providers), Some(sink))
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_critical_campaign_behind_ten_bulk_ones_under_a_provider_cap() {
    critical_behind_bulk(Cap::Provider).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_a_critical_campaign_behind_ten_bulk_ones_under_the_global_cap() {
    critical_behind_bulk(Cap::Global).await;
}

/// Ten bulk campaigns fill the cap; a critical one arrives and gets its full rate
/// within a second; the bulk ones share what is left; no second passes the cap.
async fn critical_behind_bulk(cap: Cap) {
    let _serial = pacing_lock().await;
    let (options, own_sink) = options(cap).await;
    let mut tw = options.partitions(4).prepare().await;
    let sink = own_sink.unwrap_or_else(|| tw.sink());
    let (pool, topic) = (tw.pool.clone(), tw.topic.clone());
    let bulk: Vec<String> = (0..BULK).map(|i| name(&format!("bulk{i}"))).collect();
    let critical = name("critical");
    // The stored settings win over the jobs': the rate is stored with the class.
    let class = |c: PriorityClass, rate: f64| CampaignPatch {
        priority: Some(c),
        send_rate: Some(rate),
        ..Default::default()
    };
    for b in &bulk {
        store(&pool, b, class(PriorityClass::Bulk, CAP)).await;
        produce_jobs(&topic, &jobs(b, CAP, 2, 2_000), None).await;
    }
    store(
        &pool,
        &critical,
        class(PriorityClass::Critical, CRITICAL_RATE),
    )
    .await;
    tw.start().await;
    // The bulk campaigns fill the cap for a while before the critical one arrives.
    wait_for("the bulk campaigns sending", GROUP_JOIN_LIMIT, || {
        bulk.iter()
            .all(|b| sink.campaign(b).is_some_and(|s| s.delivered >= 200))
    })
    .await;
    produce_jobs(&topic, &jobs(&critical, CRITICAL_RATE, 1, 2_000), None).await;
    wait_for(
        "the critical campaign sending",
        Duration::from_secs(30),
        || {
            sink.campaign(&critical)
                .is_some_and(|s| s.delivered >= 1_500)
        },
    )
    .await;
    tw.stop().await;
    let arrivals = sink.arrivals();
    let crit = released(&arrivals, &critical);
    let first = crit[0];
    // From a second after its first send, for 3 s.
    let (from, to) = (
        first + Duration::from_secs(1),
        first + Duration::from_secs(4),
    );
    let rate = |times: &[Duration]| count_in(times, from, to) as f64 / 3.0;
    let crit_rate = rate(&crit);
    let bulk_rates: Vec<f64> = bulk.iter().map(|b| rate(&released(&arrivals, b))).collect();
    eprintln!("critical {crit_rate}/s, bulk {bulk_rates:?}/s");
    assert!(
        (crit_rate - CRITICAL_RATE).abs() <= CRITICAL_RATE * SHARE_TOLERANCE,
        "critical sent {crit_rate}/s, its send_rate is {CRITICAL_RATE}/s"
    );
    let expected = (CAP - CRITICAL_RATE) / BULK as f64;
    assert!(
        bulk_rates
            .iter()
            .all(|r| (r - expected).abs() <= expected * SHARE_TOLERANCE),
        "bulk rates {bulk_rates:?}/s, each expected {expected}/s ± 5%"
    );
    // No second over the cap, from two seconds before the critical one came to the end.
    let all: Vec<Duration> = {
        let mut v: Vec<Duration> = arrivals.iter().filter_map(|a| a.released).collect();
        v.sort();
        v
    };
    let mut at = first.saturating_sub(Duration::from_secs(2));
    while at + Duration::from_secs(1) <= to {
        let n = count_in(&all, at, at + Duration::from_secs(1)) as f64;
        assert!(
            n <= CAP * (1.0 + CAP_TOLERANCE) + 1.0,
            "{n} sends in the second from {at:?} (first critical at {first:?}), cap {CAP}"
        );
        at += Duration::from_millis(100);
    }
}
