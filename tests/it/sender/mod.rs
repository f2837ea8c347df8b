//! Senders against the real loopback sink: outcome classification (2xx, 429 with both
//! Retry-After forms, 5xx, 410, timeouts, dropped and refused connections), the exact
//! request shape, keep-alive, h2c, and the sink's own accounting and control endpoints.

mod http1;

use pushpace::job::Job;
use pushpace::provider::ceiling::Signal;
use pushpace::sender::{
    AnySender, Http1Client, HttpSender, HttpSenderConfig, NullSender, SendOutcome, Sender,
};
use pushpace::tools::sink::{
    Behaviour, BehaviourChange, RetryAfter, Sink, SinkConfig, SinkHandle, SinkSummary,
};
use serde_json::value::RawValue;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

const DEFAULT_H2C_CONNECTIONS: usize = 2;

fn job(job_id: &str, campaign_id: &str, devices: &[&str], payload: &str) -> Arc<Job> {
    let payload = RawValue::from_string(payload.to_string()).unwrap();
    let devices = devices.iter().map(|d| d.to_string()).collect();
    Arc::new(Job::new(job_id, campaign_id, devices, payload).unwrap())
}

async fn sink() -> SinkHandle {
    Sink::start(SinkConfig {
        keep_bodies: true,
        ..SinkConfig::default()
    })
    .await
    .unwrap()
}

/// One transport of the HTTP sender to a plain-text URL.
#[derive(Debug, Clone, Copy)]
struct Transport {
    name: &'static str,
    h2: bool,
    client: Http1Client,
}

impl Transport {
    fn apply(self, config: &mut HttpSenderConfig) {
        config.http2_prior_knowledge = self.h2;
        config.http1_client = self.client;
    }
}

/// The HTTP sender's transports: HTTP/1.1 through hyper's connection API (the default)
/// or reqwest, and the h2c client (`http2_prior_knowledge`); each behaviour test runs
/// over all three.
const TRANSPORTS: [Transport; 3] = [
    Transport {
        name: "HTTP/1.1 (hyper)",
        h2: false,
        client: Http1Client::Hyper,
    },
    Transport {
        name: "HTTP/1.1 (reqwest)",
        h2: false,
        client: Http1Client::Reqwest,
    },
    Transport {
        name: "h2c",
        h2: true,
        client: Http1Client::Hyper,
    },
];

/// A fresh sink and a sender to it over one of [`TRANSPORTS`].
async fn sink_and_sender(transport: Transport) -> (SinkHandle, HttpSender) {
    eprintln!("over {}", transport.name);
    let sink = sink().await;
    let sender = sender_with(&sink, |c| transport.apply(c));
    (sink, sender)
}

fn sender_with(sink: &SinkHandle, tweak: impl FnOnce(&mut HttpSenderConfig)) -> HttpSender {
    let mut config = HttpSenderConfig::new(sink.url());
    config.timeout = Duration::from_secs(5);
    tweak(&mut config);
    HttpSender::new(&config).unwrap()
}

#[tokio::test]
async fn delivers_with_the_exact_body_and_idempotency_key() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        // Odd spacing, escapes and non-ASCII in the payload; a token that needs escaping.
        let payload = "{ \"title\" : \"Hi \\u00e9 \\\"q\\\"\",\n  \"n\":1.50e2 , \"z\":[ ] }";
        let token = "tok \"b\"\\/é\u{2028}";
        let job = job("j-1", "spring-sale", &["tok-a", token], payload);

        let unix = || {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs()
        };
        let before = unix();
        assert_eq!(sender.send(&job, 1).await, SendOutcome::Delivered);
        let after = unix();

        // The sink counts the push at the second the sender stamped on it.
        let released = sink.released_per_second("spring-sale");
        assert_eq!(released.values().sum::<u64>(), 1, "{released:?}");
        assert!(released.keys().all(|s| (before..=after).contains(s)));
        let window = Duration::from_secs(1);
        assert_eq!(sink.max_released_in_window("spring-sale", window), 1);
        let arrivals = sink.arrivals();
        assert_eq!(arrivals.len(), 1);
        let a = &arrivals[0];
        assert_eq!(&*a.campaign_id, "spring-sale");
        assert_eq!(&*a.job_id, "j-1");
        assert_eq!(a.device_token, token);
        assert_eq!(a.idempotency_key.as_deref(), Some("j-1:1"));
        assert_eq!(a.status, Some(200));
        let expected = format!(
        "{{\"campaign_id\":\"spring-sale\",\"job_id\":\"j-1\",\"device_token\":{},\"payload\":{payload}}}",
        serde_json::to_string(token).unwrap()
    );
        assert_eq!(a.body.as_deref(), Some(expected.as_bytes()));
        // The payload bytes inside the body are the producer's, byte for byte.
        let body = std::str::from_utf8(a.body.as_deref().unwrap()).unwrap();
        assert!(body.ends_with(&format!("\"payload\":{payload}}}")));
    }
}

#[tokio::test]
async fn every_device_arrives_once_over_one_keep_alive_connection() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        let tokens: Vec<String> = (0..50).map(|i| format!("tok-{i}")).collect();
        let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let job = job("j-keep", "c-keep", &refs, "{}");
        for i in 0..tokens.len() {
            assert_eq!(sender.send(&job, i).await, SendOutcome::Delivered);
        }
        // HTTP/1.1 reuses one kept-alive connection; h2c goes round-robin over its
        // connections and makes no more.
        let connections = if transport.h2 {
            DEFAULT_H2C_CONNECTIONS
        } else {
            1
        };
        assert_eq!(
            sink.connections(),
            connections as u64,
            "sequential sends should reuse the connections"
        );
        let expected: HashSet<(String, String)> = tokens
            .iter()
            .map(|t| ("j-keep".to_string(), t.clone()))
            .collect();
        assert_eq!(sink.delivered_devices(), expected);
        let c = sink.campaign("c-keep").unwrap();
        assert_eq!(
            (c.requests, c.delivered, c.distinct_delivered, c.duplicates),
            (50, 50, 50, 0)
        );
        let per_second: u64 = sink.per_second("c-keep").iter().map(|s| s.delivered).sum();
        assert_eq!(per_second, 50);

        // Sending a device again is a duplicate for the provider.
        assert_eq!(sender.send(&job, 7).await, SendOutcome::Delivered);
        let c = sink.campaign("c-keep").unwrap();
        assert_eq!(
            (c.delivered, c.distinct_delivered, c.duplicates),
            (51, 50, 1)
        );
    }
}

#[tokio::test]
async fn concurrent_sends_all_arrive() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        let tokens: Vec<String> = (0..200).map(|i| format!("t{i}")).collect();
        let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
        let job = job("j-conc", "c-conc", &refs, r#"{"a":1}"#);
        let outcomes = futures::future::join_all((0..200).map(|i| sender.send(&job, i))).await;
        assert!(
            outcomes.iter().all(SendOutcome::is_delivered),
            "{outcomes:?}"
        );
        let summary = sink.summary();
        assert_eq!(
            (
                summary.requests,
                summary.distinct_delivered,
                summary.duplicates
            ),
            (200, 200, 0)
        );
        // All 200 arrived well within one second.
        assert_eq!(sink.max_in_window("c-conc", Duration::from_secs(1)), 200);
        assert_eq!(sink.campaign("c-conc").unwrap().max_in_any_second, 200);
    }
}

#[tokio::test]
async fn too_many_requests_is_retried_after_the_given_seconds() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        let job = job("j", "c", &["t"], "{}");
        sink.set_behaviour(Behaviour::TooManyRequests {
            retry_after: Some(RetryAfter::Seconds(7)),
        });
        match sender.send(&job, 0).await {
            SendOutcome::RetryProvider {
                after,
                reason,
                signal,
            } => {
                // The provider asked for a pause: the adaptive ceiling pauses the lane.
                assert_eq!(signal, Some(Signal::RetryAfter));
                assert_eq!(after, Some(Duration::from_secs(7)));
                assert!(reason.starts_with("HTTP 429"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        sink.set_behaviour(Behaviour::TooManyRequests { retry_after: None });
        assert!(matches!(
            sender.send(&job, 0).await,
            SendOutcome::RetryProvider { after: None, .. }
        ));
        // The sink counts them as arrivals, not deliveries.
        let c = sink.campaign("c").unwrap();
        assert_eq!((c.requests, c.delivered), (2, 0));
    }
}

#[tokio::test]
async fn too_many_requests_with_an_http_date_is_honoured() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        let job = job("j", "c", &["t"], "{}");
        sink.set_behaviour(Behaviour::TooManyRequests {
            retry_after: Some(RetryAfter::DateIn(30)),
        });
        match sender.send(&job, 0).await {
            SendOutcome::RetryProvider {
                after: Some(after), ..
            } => {
                // HTTP-dates have whole seconds.
                assert!(
                    after >= Duration::from_secs(28) && after <= Duration::from_secs(30),
                    "{after:?}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn server_errors_are_retried() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        let job = job("j", "c", &["t"], "{}");
        sink.set_behaviour(Behaviour::ServerError);
        match sender.send(&job, 0).await {
            SendOutcome::RetryProvider {
                after: None,
                reason,
                signal: Some(Signal::Unavailable),
            } => {
                assert!(reason.starts_with("HTTP 500: "), "{reason}");
                assert!(reason.contains("provider failure"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn gone_tokens_are_dead_tokens_with_the_reason() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        sink.set_gone_prefix(Some("dead-"));
        let job = job("j", "c", &["live-1", "dead-1"], "{}");
        assert_eq!(sender.send(&job, 0).await, SendOutcome::Delivered);
        match sender.send(&job, 1).await {
            SendOutcome::DeadToken { reason } => {
                assert!(reason.starts_with("HTTP 410: "), "{reason}");
                assert!(reason.contains("not registered"), "{reason}");
            }
            other => panic!("{other:?}"),
        }
        sink.set_gone_prefix(None);
        assert_eq!(sender.send(&job, 1).await, SendOutcome::Delivered);
    }
}

#[tokio::test]
async fn a_slow_provider_times_out_and_is_retried() {
    for transport in TRANSPORTS {
        eprintln!("over {}", transport.name);
        let sink = sink().await;
        let sender = sender_with(&sink, |c| {
            c.timeout = Duration::from_millis(300);
            transport.apply(c);
        });
        let job = job("j", "c", &["t"], "{}");
        sink.set_behaviour(Behaviour::Slow { delay_ms: 3_000 });
        let started = Instant::now();
        match sender.send(&job, 0).await {
            SendOutcome::RetryProvider {
                after: None,
                reason,
                signal: Some(Signal::Timeout),
            } => {
                assert_eq!(reason, "timeout after 300 ms");
            }
            other => panic!("{other:?}"),
        }
        let took = started.elapsed();
        assert!(
            took >= Duration::from_millis(300) && took < Duration::from_secs(2),
            "{took:?}"
        );
        // The request did arrive; it has no answer yet.
        assert_eq!(sink.arrivals()[0].status, None);
    }
}

#[tokio::test]
async fn a_dropped_connection_is_retried() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        let job = job("j", "c", &["t"], "{}");
        sink.set_behaviour(Behaviour::Reset);
        match sender.send(&job, 0).await {
            SendOutcome::RetryProvider {
                after: None,
                reason,
                signal: Some(Signal::Connection),
            } => {
                assert!(reason.starts_with("connection error: "), "{reason}");
                assert!(
                    !reason.contains("127.0.0.1"),
                    "the url is left out: {reason}"
                );
            }
            other => panic!("{other:?}"),
        }
        sink.set_behaviour(Behaviour::Normal);
        assert_eq!(sender.send(&job, 0).await, SendOutcome::Delivered);
    }
}

#[tokio::test]
async fn a_refused_connection_is_retried() {
    // A port that was free a moment ago, with nothing listening now.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    for transport in TRANSPORTS {
        let mut config = HttpSenderConfig::new(format!("http://127.0.0.1:{port}/push"));
        transport.apply(&mut config);
        let sender = HttpSender::new(&config).unwrap();
        let job = job("j", "c", &["t"], "{}");
        match sender.send(&job, 0).await {
            SendOutcome::RetryProvider {
                after: None,
                reason,
                signal: Some(Signal::Connection),
            } => assert!(
                reason.starts_with("connection error"),
                "{}: {reason}",
                transport.name
            ),
            other => panic!("{}: {other:?}", transport.name),
        }
    }
}

#[tokio::test]
async fn behaviour_for_a_number_of_requests_then_back_to_normal() {
    for transport in TRANSPORTS {
        let (sink, sender) = sink_and_sender(transport).await;
        let job = job("j", "c", &["a", "b", "c"], "{}");
        sink.set_behaviour_for(Behaviour::ServerError, 2);
        assert!(matches!(
            sender.send(&job, 0).await,
            SendOutcome::RetryProvider { .. }
        ));
        assert!(matches!(
            sender.send(&job, 1).await,
            SendOutcome::RetryProvider { .. }
        ));
        assert_eq!(sender.send(&job, 2).await, SendOutcome::Delivered);
        assert_eq!(sink.behaviour(), Behaviour::Normal);
    }
}

#[tokio::test]
async fn h2c_with_prior_knowledge() {
    let sink = sink().await;
    let sender = sender_with(&sink, |c| c.http2_prior_knowledge = true);
    let tokens: Vec<String> = (0..20).map(|i| format!("t{i}")).collect();
    let refs: Vec<&str> = tokens.iter().map(String::as_str).collect();
    let job = job("j-h2", "c-h2", &refs, r#"{"x":"y"}"#);
    let outcomes = futures::future::join_all((0..20).map(|i| sender.send(&job, i))).await;
    assert!(
        outcomes.iter().all(SendOutcome::is_delivered),
        "{outcomes:?}"
    );
    // HTTP/2 multiplexes the 20 concurrent requests over its few connections.
    assert_eq!(sink.connections(), DEFAULT_H2C_CONNECTIONS as u64);
    assert_eq!(sender.h2c_connections(), Some(DEFAULT_H2C_CONNECTIONS));
    assert_eq!(sink.campaign("c-h2").unwrap().distinct_delivered, 20);
}

#[tokio::test]
async fn out_of_range_device_fails_without_a_request() {
    let sink = sink().await;
    let job = job("j", "c", &["t"], "{}");
    for sender in [
        AnySender::from(sender_with(&sink, |_| {})),
        AnySender::from(NullSender),
    ] {
        match sender.send(&job, 5).await {
            SendOutcome::Rejected {
                status: None,
                reason,
            } => assert!(reason.contains("out of range"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(sink.request_count(), 0);
}

#[test]
fn the_null_sender_is_ready_at_once() {
    let job = job("j", "c", &["t"], "{}");
    let sender = AnySender::from(NullSender);
    assert_eq!(sender.name(), "null");
    // No runtime and no polling needed.
    assert_eq!(
        sender.send(&job, 0).into_ready().unwrap(),
        SendOutcome::Delivered
    );
}

#[tokio::test]
async fn the_http_sender_future_is_not_ready_until_awaited() {
    let sink = sink().await;
    let job = job("j", "c", &["t"], "{}");
    let sender = AnySender::from(sender_with(&sink, |_| {}));
    assert_eq!(sender.name(), "http");
    let future = sender.send(&job, 0).into_ready().unwrap_err();
    // Send + 'static: it can be spawned.
    let outcome = tokio::spawn(future).await.unwrap();
    assert_eq!(outcome, SendOutcome::Delivered);
}

#[test]
fn bad_urls_are_refused_and_credentials_are_not_shown() {
    for url in ["ftp://127.0.0.1/x", "not a url", "http://"] {
        let err = HttpSender::new(&HttpSenderConfig::new(url)).unwrap_err();
        assert!(err.to_string().contains("invalid sender url"), "{err}");
    }
    let err = HttpSender::new(&HttpSenderConfig::new("ftp://user:s3cret@127.0.0.1/x")).unwrap_err();
    assert!(!err.to_string().contains("s3cret"), "{err}");
    let sender = HttpSender::new(&HttpSenderConfig::new(
        "http://user:s3cret@127.0.0.1:9/push?token=s3cret",
    ))
    .unwrap();
    assert!(!format!("{sender:?}").contains("s3cret"));
}

#[tokio::test]
async fn the_sink_is_steered_and_read_over_http() {
    let sink = sink().await;
    let client = reqwest::Client::new();
    let base = format!("http://{}", sink.addr());
    let change = BehaviourChange {
        behaviour: Some(Behaviour::TooManyRequests {
            retry_after: Some(RetryAfter::Seconds(2)),
        }),
        for_requests: Some(1),
        gone_prefix: Some("gone-".into()),
    };
    let r = client
        .put(format!("{base}/_sink/behaviour"))
        .body(serde_json::to_vec(&change).unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sender = sender_with(&sink, |_| {});
    let job = job("j", "c", &["ok", "gone-1"], "{}");
    assert!(
        matches!(sender.send(&job, 0).await, SendOutcome::RetryProvider { after: Some(d), .. } if d == Duration::from_secs(2))
    );
    assert_eq!(sender.send(&job, 0).await, SendOutcome::Delivered);
    assert!(matches!(
        sender.send(&job, 1).await,
        SendOutcome::DeadToken { .. }
    ));

    let bad = client
        .put(format!("{base}/_sink/behaviour"))
        .body("{\"behaviour\":{\"mode\":\"nope\"}}")
        .send()
        .await
        .unwrap();
    assert_eq!(bad.status(), 400);
    let not_a_push = client.post(sink.url()).body("hello").send().await.unwrap();
    assert_eq!(not_a_push.status(), 400);

    let stats = client
        .get(format!("{base}/_sink/stats"))
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    let stats: SinkSummary = serde_json::from_slice(&stats).unwrap();
    assert_eq!(stats, sink.summary());
    assert_eq!(
        (stats.requests, stats.delivered, stats.malformed),
        (3, 1, 1)
    );
    assert_eq!(stats.campaigns.len(), 1);
    assert_eq!(stats.campaigns[0].campaign_id, "c");
}

#[tokio::test]
async fn serve_until_runs_until_told_to_stop() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let config = SinkConfig {
        bind: ([127, 0, 0, 1], port).into(),
        ..SinkConfig::default()
    };
    let server = tokio::spawn(pushpace::tools::sink::serve_until(config, async {
        let _ = stop_rx.await;
    }));
    let sender = HttpSender::new(&HttpSenderConfig::new(format!(
        "http://127.0.0.1:{port}/push"
    )))
    .unwrap();
    let job = job("j", "c", &["t"], "{}");
    let mut outcome = sender.send(&job, 0).await;
    for _ in 0..50 {
        if outcome.is_delivered() {
            break;
        }
        // The server task may not have bound yet.
        tokio::time::sleep(Duration::from_millis(20)).await;
        outcome = sender.send(&job, 0).await;
    }
    assert_eq!(outcome, SendOutcome::Delivered);
    stop_tx.send(()).unwrap();
    let summary = server.await.unwrap().unwrap();
    assert_eq!(summary.delivered, 1);
    // After shutdown nothing listens.
    assert!(matches!(
        sender.send(&job, 0).await,
        SendOutcome::RetryProvider { .. }
    ));
}
