//! `/metrics`: a strict exposition parser, and the counts of a real worker's sends.

use super::{recorded_sent, spawn_worker_app, TestApp};
use serde_json::json;
use std::collections::HashMap;
use std::time::{Duration, Instant};

/// One sample of the exposition text.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
}

/// Parses Prometheus text format 0.0.4 strictly enough to catch malformed output: every
/// line is blank, a comment, or `name{label="value",…} number`; every sample's family
/// has one `# TYPE`. Returns the types by family and the samples.
pub fn parse_exposition(text: &str) -> (HashMap<String, String>, Vec<Sample>) {
    fn valid_name(n: &str) -> bool {
        let mut chars = n.chars();
        chars
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    }
    let mut types = HashMap::new();
    let mut samples = Vec::new();
    for line in text.lines() {
        if line.trim().is_empty() {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').expect("TYPE line");
            assert!(valid_name(name), "{line}");
            assert!(
                ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind),
                "{line}"
            );
            assert!(
                types.insert(name.to_string(), kind.to_string()).is_none(),
                "two TYPE lines for {name}"
            );
            continue;
        }
        if line.starts_with('#') {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').expect("sample line");
        let value: f64 = match value {
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v
                .parse()
                .unwrap_or_else(|_| panic!("bad value in {line:?}")),
        };
        let (name, labels) = match series.split_once('{') {
            None => (series, Vec::new()),
            Some((name, rest)) => {
                let body = rest.strip_suffix('}').expect("closing brace");
                let mut labels = Vec::new();
                let mut chars = body.chars().peekable();
                while chars.peek().is_some() {
                    let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
                    assert!(valid_name(&key), "label {key:?} in {line:?}");
                    assert_eq!(chars.next(), Some('"'), "{line}");
                    let mut v = String::new();
                    loop {
                        match chars.next().expect("unterminated label value") {
                            '\\' => match chars.next() {
                                Some('n') => v.push('\n'),
                                Some(c) => v.push(c),
                                None => panic!("{line}"),
                            },
                            '"' => break,
                            c => v.push(c),
                        }
                    }
                    labels.push((key, v));
                    if chars.peek() == Some(&',') {
                        chars.next();
                    }
                }
                (name, labels)
            }
        };
        assert!(valid_name(name), "{line}");
        samples.push(Sample {
            name: name.to_string(),
            labels,
            value,
        });
    }
    for s in &samples {
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| {
                s.name.strip_suffix(suffix).filter(|f| {
                    types
                        .get(*f)
                        .is_some_and(|t| t == "histogram" || t == "summary")
                })
            })
            .unwrap_or(&s.name);
        assert!(types.contains_key(family), "{} has no # TYPE", s.name);
    }
    (types, samples)
}

fn sends(samples: &[Sample], campaign: &str, outcome: &str) -> Option<f64> {
    samples
        .iter()
        .find(|s| {
            s.name == "sends_total"
                && s.labels.contains(&("campaign".into(), campaign.into()))
                && s.labels.contains(&("outcome".into(), outcome.into()))
        })
        .map(|s| s.value)
}

async fn scrape(app: &TestApp) -> (HashMap<String, String>, Vec<Sample>) {
    let r = app.get("/metrics").await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/plain; version=0.0.4"));
    parse_exposition(&r.text)
}

async fn wait_for<F, Fut>(what: &str, limit: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while !f().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_parse_and_count_the_sends_of_a_real_worker() {
    // A: 1500 devices at 150/s (10 s of work); B: 30 devices, done at once.
    let started = Instant::now();
    let run = spawn_worker_app(&[(150.0, 1500), (1000.0, 30)]).await;
    let app = &run.api;
    let a = run.plan.campaigns[0].id.clone();
    let b = run.plan.campaigns[1].id.clone();

    wait_for("A to send 150", Duration::from_secs(60), || async {
        sends(&scrape(app).await.1, &a, "sent").unwrap_or(0.0) >= 150.0
    })
    .await;
    // Pausing is a delay: sends stop within a quantum, the jobs stay.
    let r = app.post(&format!("/api/campaigns/{a}/pause")).await;
    assert_eq!(r.status, 200, "{}", r.text);
    let end = Instant::now() + Duration::from_secs(15);
    let mut last = -1.0;
    let counted = loop {
        tokio::time::sleep(Duration::from_millis(800)).await;
        let now = sends(&scrape(app).await.1, &a, "sent").unwrap_or(0.0);
        if now == last {
            break now;
        }
        assert!(Instant::now() < end, "A's sends did not stop: {now}");
        last = now;
    };
    assert!(counted < 1500.0, "A stopped before the end: {counted}");
    // The flusher has the same count in the table, and the API says the same.
    wait_for(
        "the flush of A's sends",
        Duration::from_secs(10),
        || async { recorded_sent(&app.pool, &a).await as f64 == counted },
    )
    .await;
    let r = app.get(&format!("/api/campaigns/{a}")).await;
    assert_eq!(r.body["sent"].as_f64(), Some(counted), "{}", r.text);
    assert_eq!(r.body["live"]["sent"].as_f64(), Some(counted));
    assert_eq!(r.body["live"]["paused"], true, "held, paused: {}", r.text);
    assert_eq!(r.body["status"], "paused");

    // B is done: its 30 sends are in the table and its series are gone.
    wait_for("B's 30 sends recorded", Duration::from_secs(30), || async {
        recorded_sent(&app.pool, &b).await == 30
    })
    .await;
    let (types, samples) = scrape(app).await;
    assert_eq!(
        sends(&samples, &b, "sent"),
        None,
        "an ended campaign keeps no series"
    );
    assert_eq!(sends(&samples, &a, "sent"), Some(counted));
    assert_eq!(sends(&samples, &a, "failed"), Some(0.0));
    for (family, kind) in [
        ("sends_total", "counter"),
        ("retries_total", "counter"),
        ("dead_letters_total", "counter"),
        ("limiter_wait_seconds", "histogram"),
        ("scheduler_wake_lateness_seconds", "histogram"),
        ("scheduler_round_seconds_total", "counter"),
        ("stats_flush_seconds", "histogram"),
        ("active_campaigns", "gauge"),
        ("buffered_jobs", "gauge"),
        ("buffered_devices", "gauge"),
        ("paused_partitions", "gauge"),
    ] {
        assert_eq!(
            types.get(family).map(String::as_str),
            Some(kind),
            "{family}"
        );
    }
    let value = |name: &str| {
        samples
            .iter()
            .find(|s| s.name == name && s.labels.is_empty())
            .map(|s| s.value)
            .unwrap_or_else(|| panic!("no {name}"))
    };
    let listed = app.get("/api/campaigns").await.body;
    let active = listed
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["active"] == true)
        .count();
    assert_eq!(value("active_campaigns"), active as f64);
    assert!(
        value("buffered_devices") >= 1500.0 - counted,
        "A's unsent devices are held"
    );
    assert!(value("buffered_jobs") >= 1.0);
    assert_eq!(value("paused_partitions"), 0.0);
    // The lean scrape (the bench's, every 20 ms) leaves out only the per-campaign family.
    let lean = app.get("/metrics?per_campaign=false").await;
    assert_eq!(lean.status, 200);
    let (lean_types, lean_samples) = parse_exposition(&lean.text);
    assert!(sends(&samples, &a, "sent").is_some(), "A is held");
    assert!(lean_samples.iter().all(|s| s.name != "sends_total"));
    assert!(!lean_types.contains_key("sends_total"));
    assert!(lean_samples
        .iter()
        .any(|s| s.name == "delivered_total" && s.labels.is_empty()));
    assert_eq!(app.get("/metrics?per_campaign=maybe").await.status, 400);
    // The null sender never fails. Read per campaign: `retries_total` is the process's,
    // and tests running beside this one in the same process (the providers' GOAWAYs)
    // add to it.
    let held_a = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["id"] == a.as_str());
    assert_eq!(
        held_a.map(|c| &c["live"]["retried"]),
        Some(&json!(0)),
        "{listed}"
    );
    assert!(value("limiter_wait_seconds_count") > 0.0);
    // A paced campaign's rounds wait for their instants: timed wake-ups were counted.
    assert!(value("scheduler_wake_lateness_seconds_count") > 0.0);
    // Rounds that sent took time by the scheduler's clock, and less than the worker
    // has been running.
    let in_rounds = value("scheduler_round_seconds_total");
    let ran = started.elapsed().as_secs_f64();
    assert!(
        in_rounds > 0.0 && in_rounds < ran,
        "{in_rounds} s in rounds of {ran} s"
    );
    assert!(value("stats_flush_seconds_count") > 0.0);
    let buckets: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.name == "limiter_wait_seconds_bucket")
        .collect();
    assert!(buckets
        .iter()
        .any(|s| s.labels.contains(&("le".into(), "+Inf".into()))));
    for kind in ["malformed_job", "invalid_job", "undeliverable"] {
        assert!(
            samples.iter().any(|s| s.name == "dead_letters_total"
                && s.labels == [("kind".to_string(), kind.to_string())]),
            "dead_letters_total{{kind={kind}}}"
        );
    }
    // librdkafka reports the lag every 5 s.
    wait_for("consumer_lag", Duration::from_secs(15), || async {
        let (types, samples) = scrape(app).await;
        types.get("consumer_lag").is_some_and(|t| t == "gauge")
            && samples
                .iter()
                .any(|s| s.name == "consumer_lag" && s.labels[0].0 == "partition")
    })
    .await;

    // Resume at a higher rate through the API: the change reaches the limiter and A
    // finishes; every device is counted once and its series disappear.
    let r = app
        .put(&format!("/api/campaigns/{a}"), r#"{"send_rate": 3000}"#)
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(
        app.post(&format!("/api/campaigns/{a}/resume")).await.status,
        200
    );
    wait_for(
        "A's 1500 sends recorded",
        Duration::from_secs(30),
        || async { recorded_sent(&app.pool, &a).await == 1500 },
    )
    .await;
    wait_for("A's series to go", Duration::from_secs(10), || async {
        sends(&scrape(app).await.1, &a, "sent").is_none()
    })
    .await;
    let (_, samples) = scrape(app).await;
    assert!(
        samples.iter().all(|s| s.name != "sends_total"),
        "no campaign is held"
    );
    run.stop().await;
}
