//! The worker against secured brokers (`scripts/kafka-secure.sh`, started by
//! `scripts/services.sh`): SASL_SSL with SCRAM-SHA-512 and PLAIN on 127.0.0.1:9093, and
//! mutual TLS on 127.0.0.1:9094, both under the name `localhost` with a test CA. Each run
//! goes through the real worker: jobs delivered once, offsets committed, progress and
//! counts in PostgreSQL. The wrong-credential cases go through the start-up check that
//! `pushpace run` makes.

use crate::harness::{PlannedRun, Producer, TestWorker};
use crate::helpers::{test_settings, unique_name, wait_for};
use pushpace::tools::produce::ProducePlan;
use std::path::PathBuf;
use std::time::{Duration, Instant};

const SCRAM_USER: &str = "pushpace";
const SCRAM_PASSWORD: &str = "pushpace-scram-test-password";
/// Session timeout for these tests; the start-up check's bound is this.
const SESSION_TIMEOUT_MS: u64 = 6_000;
/// Over the session timeout: a blocking-thread hand-off and librdkafka's client set-up
/// (a few ms each here), with room for a busy 2-core machine.
const CHECK_SLACK: Duration = Duration::from_secs(3);

/// The certificates scripts/kafka-secure.sh made.
fn tls_dir() -> PathBuf {
    let dir = std::env::var("PUSHPACE_TEST_KAFKA_TLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/pushpace/kafka-tls")
        });
    assert!(
        dir.join("ca.pem").is_file(),
        "no test CA in {}: run scripts/kafka-secure.sh start (scripts/services.sh does)",
        dir.display()
    );
    dir
}

fn file(name: &str) -> String {
    tls_dir().join(name).display().to_string()
}

fn sasl_ssl(mechanism: &str, password: &str) -> Vec<(&'static str, String)> {
    vec![
        ("kafka.brokers", "localhost:9093".into()),
        ("kafka.security_protocol", "sasl_ssl".into()),
        ("kafka.sasl_mechanism", mechanism.into()),
        ("kafka.sasl_username", SCRAM_USER.into()),
        ("kafka.sasl_password", password.into()),
        ("kafka.ssl_ca_file", file("ca.pem")),
        ("kafka.session_timeout_ms", SESSION_TIMEOUT_MS.to_string()),
    ]
}

fn mutual_tls() -> Vec<(&'static str, String)> {
    vec![
        ("kafka.brokers", "localhost:9094".into()),
        ("kafka.security_protocol", "ssl".into()),
        ("kafka.ssl_ca_file", file("ca.pem")),
        ("kafka.ssl_cert_file", file("client.pem")),
        ("kafka.ssl_key_file", file("client.key")),
        ("kafka.session_timeout_ms", SESSION_TIMEOUT_MS.to_string()),
    ]
}

/// Three campaigns' jobs produced over the secured connection, then the worker on it.
async fn run_secured(keys: &[(&str, String)]) -> PlannedRun {
    let run_id = unique_name("sec");
    let plan = ProducePlan::with_rates(
        &run_id,
        &[(500.0, 600), (500.0, 600), (500.0, 600)],
        100,
        None,
    )
    .unwrap();
    let mut tw = TestWorker::options()
        .partitions(2)
        .broker(keys)
        .prepare()
        .await;
    let kafka = &tw.settings.kafka;
    let producer = Producer::with(&pushpace::broker::producer_config(kafka, &kafka.brokers));
    for job in plan.jobs() {
        producer.job(&tw.topic, &job, None).await;
    }
    tw.start().await;
    PlannedRun {
        sink: tw.sink(),
        tw,
        plan,
    }
}

/// The group's committed offsets, summed over the topic's two partitions, read from
/// the secured broker over the same connection keys.
async fn committed_in_broker(tw: &TestWorker) -> i64 {
    use rdkafka::consumer::{BaseConsumer, Consumer};
    use rdkafka::{Offset, TopicPartitionList};
    let kafka = tw.settings.kafka.clone();
    let topic = tw.topic.clone();
    tokio::task::spawn_blocking(move || {
        let consumer: BaseConsumer = pushpace::broker::consumer_config(&kafka, &kafka.brokers)
            .create()
            .expect("consumer");
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition(&topic, 0);
        tpl.add_partition(&topic, 1);
        let got = consumer
            .committed_offsets(tpl, Duration::from_secs(10))
            .expect("committed offsets");
        got.elements()
            .iter()
            .map(|e| match e.offset() {
                Offset::Offset(o) => o,
                _ => 0,
            })
            .sum()
    })
    .await
    .unwrap()
}

/// Every device delivered once, the counts in PostgreSQL, the offsets committed.
async fn assert_delivered_and_committed(run: &mut PlannedRun) {
    let total = run.plan.total_devices() as u64;
    let sink = run.sink.clone();
    wait_for("every device delivered", Duration::from_secs(90), || {
        sink.summary().distinct_delivered >= total
    })
    .await;
    let s = run.sink.summary();
    assert_eq!(s.distinct_delivered, total, "{s:?}");
    assert_eq!(s.delivered, total, "no device twice: {s:?}");
    let jobs = run.plan.jobs().count() as i64;
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let sent: Option<i64> =
            sqlx::query_scalar("SELECT sum(sent)::bigint FROM delivery_seconds")
                .fetch_one(&run.tw.pool)
                .await
                .unwrap();
        let committed = committed_in_broker(&run.tw).await;
        if committed == jobs && sent == Some(total as i64) {
            break;
        }
        assert!(
            Instant::now() < end,
            "committed offsets {committed} (want {jobs}), sent {sent:?} (want {total})"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    run.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_over_sasl_ssl_with_scram_sha_512() {
    let mut run = run_secured(&sasl_ssl("SCRAM-SHA-512", SCRAM_PASSWORD)).await;
    assert_delivered_and_committed(&mut run).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_over_sasl_ssl_with_scram_sha_256() {
    let mut run = run_secured(&sasl_ssl("SCRAM-SHA-256", SCRAM_PASSWORD)).await;
    assert_delivered_and_committed(&mut run).await;
}

/// tansu 0.6.0 builds rsasl without its `plain` feature (tansu-auth's Cargo.toml), so it
/// offers no PLAIN: the worker's PLAIN settings are sent and refused, and the refusal is
/// one clear error. PLAIN delivery cannot be shown against this broker.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_mechanism_the_broker_lacks_is_one_clear_error() {
    refused(&sasl_ssl("PLAIN", SCRAM_PASSWORD), &["SASL", "mechanism"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_over_mutual_tls() {
    let mut run = run_secured(&mutual_tls()).await;
    assert_delivered_and_committed(&mut run).await;
}

/// The start-up check fails within the session timeout, naming the brokers and `cause`.
async fn refused(keys: &[(&str, String)], cause: &[&str]) {
    let settings = test_settings(keys);
    let started = Instant::now();
    let err = pushpace::broker::check_connection(&settings.kafka, &settings.kafka.brokers)
        .await
        .expect_err("the check must fail");
    let took = started.elapsed();
    let text = err.to_string();
    assert!(
        took <= Duration::from_millis(SESSION_TIMEOUT_MS) + CHECK_SLACK,
        "took {took:?}: {text}"
    );
    assert!(text.contains(&settings.kafka.brokers), "{text}");
    assert!(
        cause.iter().any(|c| text.contains(c)),
        "expected one of {cause:?} in: {text}"
    );
    assert!(!text.contains(SCRAM_PASSWORD), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wrong_scram_password_is_one_clear_error() {
    refused(
        &sasl_ssl("SCRAM-SHA-512", "not-the-password"),
        &["SASL authentication error"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_untrusted_ca_is_one_clear_error() {
    let mut keys = sasl_ssl("SCRAM-SHA-512", SCRAM_PASSWORD);
    keys.push(("kafka.ssl_ca_file", file("other-ca.pem")));
    refused(&keys, &["certificate verify failed"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_one_clear_error() {
    // The certificate names only `localhost`; 127.0.0.1 is the same listener.
    let mut keys = sasl_ssl("SCRAM-SHA-512", SCRAM_PASSWORD);
    keys.push(("kafka.brokers", "127.0.0.1:9093".into()));
    refused(&keys, &["certificate verify failed", "Hostname mismatch"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mutual_tls_without_a_client_certificate_is_refused() {
    let keys: Vec<_> = mutual_tls()
        .into_iter()
        .filter(|(k, _)| !k.starts_with("kafka.ssl_cert") && !k.starts_with("kafka.ssl_key"))
        .collect();
    refused(&keys, &["certificate required", "alert"]).await;
}

/// At run time the same refusals make `/readyz` fail, with librdkafka's cause (its broker
/// check has its own client on the worker's `[kafka]` keys); the right keys pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_names_the_cause_when_the_broker_refuses() {
    use crate::api::{spawn_app_on, TOKEN};
    let mut untrusted = sasl_ssl("SCRAM-SHA-512", SCRAM_PASSWORD);
    untrusted.push(("kafka.ssl_ca_file", file("other-ca.pem")));
    let cases = [
        (sasl_ssl("SCRAM-SHA-512", SCRAM_PASSWORD), None),
        (
            sasl_ssl("SCRAM-SHA-512", "not-the-password"),
            Some("SASL authentication error"),
        ),
        (untrusted, Some("certificate verify failed")),
        (mutual_tls(), None),
    ];
    for (keys, cause) in cases {
        let (pool, url) = crate::helpers::fresh_database().await;
        let bootstrap = keys
            .iter()
            .find(|(k, _)| *k == "kafka.brokers")
            .unwrap()
            .1
            .clone();
        let app = spawn_app_on(pool, url, TOKEN, None, Some(bootstrap), &keys).await;
        let r = app.get("/readyz").await;
        let broker = &r.body["checks"]["broker"];
        let detail = broker["detail"].as_str().unwrap_or_default();
        assert!(!r.text.contains(SCRAM_PASSWORD), "{}", r.text);
        match cause {
            None => assert_eq!(broker["ok"], true, "{}", r.text),
            Some(cause) => {
                assert_eq!(r.status, 503, "{}", r.text);
                assert_eq!(broker["ok"], false, "{}", r.text);
                assert!(detail.contains(cause), "expected {cause:?} in {detail}");
            }
        }
    }
}
