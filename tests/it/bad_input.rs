//! The bad-input suite: every class of bad message a careless producer sends, produced
//! into the real broker between good jobs, through a real worker process.
//!
//! Every good device is delivered exactly once, every bad message gets exactly one dead
//! letter with a reason, and the group's committed offsets reach the end of every
//! partition. The second test runs the same suite with the worker's PostgreSQL stopped
//! for 30 s in the middle: the worker stays in its group and loses nothing.

use crate::harness::{Producer, Record};
use crate::helpers::{brokers, fresh_topic, pushpace_bin, unique_name, wait_for, OwnPostgres};
use pushpace::tools::sink::{Sink, SinkConfig, SinkHandle};
use pushpace::worker::message::raw_headers;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::PgPool;
use std::collections::HashMap;
use std::time::Duration;

/// Partitions of the suite's topic; the slow (parked) campaign sits in partition 0.
const PARTITIONS: i32 = 2;
/// Good campaigns' rate: the whole suite sends in a few seconds.
const RATE: u32 = 400;
/// How long the suite may take to deliver everything, outage excluded: the good
/// devices need about 4 s at RATE; the rest is start-up and group join on tansu.
const DELIVERY_LIMIT: Duration = Duration::from_secs(90);

/// What a produced message should become.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Expect {
    /// Each (campaign, job, token) delivered exactly once.
    Delivered(Vec<(String, String, String)>),
    /// Exactly one dead letter of this kind.
    Letter(&'static str),
}

struct Produced {
    partition: i32,
    offset: i64,
    expect: Expect,
    what: &'static str,
}

fn job(campaign: &str, job_id: &str, tokens: &[String]) -> Vec<u8> {
    serde_json::json!({
        "campaign_id": campaign,
        "job_id": job_id,
        "devices": tokens,
        "payload": {"title": "hello \u{0}"},
        "send_rate": RATE,
    })
    .to_string()
    .into_bytes()
}

fn tokens(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i}")).collect()
}

struct Suite {
    /// Devices in each ordinary good job.
    devices: usize,
    producer: Producer,
    topic: String,
    produced: Vec<Produced>,
    run: String,
}

impl Suite {
    async fn send(
        &mut self,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        expect: Expect,
        what: &'static str,
    ) {
        self.send_with(partition, key, value, None, expect, what)
            .await;
    }

    async fn send_with(
        &mut self,
        partition: i32,
        key: Option<&[u8]>,
        value: Option<&[u8]>,
        headers: Option<rdkafka::message::OwnedHeaders>,
        expect: Expect,
        what: &'static str,
    ) {
        let record = Record {
            partition: Some(partition),
            key,
            payload: value,
            headers,
        };
        let (partition, offset) = self.producer.send(&self.topic, record).await;
        self.produced.push(Produced {
            partition,
            offset,
            expect,
            what,
        });
    }

    fn campaign(&self, name: &str) -> String {
        format!("{}-{name}", self.run)
    }

    /// A good job of `n` devices in campaign `name`, keyed by `key`.
    async fn good(&mut self, partition: i32, name: &str, job_id: &str, n: usize, key: &[u8]) {
        let campaign = self.campaign(name);
        let toks = tokens(&format!("{name}-{job_id}"), n);
        let expect = toks
            .iter()
            .map(|t| (campaign.clone(), job_id.to_string(), t.clone()))
            .collect();
        let value = job(&campaign, job_id, &toks);
        self.send(
            partition,
            Some(key),
            Some(&value),
            Expect::Delivered(expect),
            "good job",
        )
        .await;
    }

    /// Every class of bad message, each between good jobs, in both partitions.
    async fn produce_all(&mut self) {
        let a = self.campaign("a");
        let n = self.devices;
        for p in 0..PARTITIONS {
            let pj = |n: &str| format!("p{p}-{n}");
            self.good(p, "a", &pj("j1"), n, b"plain-key").await;
            // Keys are the producer's partitioning choice: any bytes, or none.
            self.good(p, "b", &pj("nul-key"), n, b"k\0ey").await;
            self.good(p, "a", &pj("binary-key"), n, &[0xff, 0xfe, 0x00, 0x80])
                .await;
            self.good(p, "b", &pj("other-key"), n, b"not-the-campaign")
                .await;
            let nul_token = job(&a, &pj("nul-token"), &["ab\0cd".to_string()]);
            self.send(
                p,
                None,
                Some(&nul_token),
                Expect::Letter("invalid_job"),
                "NUL in a token",
            )
            .await;
            let nul_job_id = job(&a, "job\0id", &tokens("x", 2));
            self.send(
                p,
                None,
                Some(&nul_job_id),
                Expect::Letter("invalid_job"),
                "NUL in job_id",
            )
            .await;
            let mut raw_nul = job(&a, &pj("raw-nul"), &tokens("y", 2));
            let at = raw_nul.len() - 3;
            raw_nul.insert(at, 0);
            self.send(
                p,
                None,
                Some(&raw_nul),
                Expect::Letter("malformed_job"),
                "raw NUL byte in the JSON",
            )
            .await;
            self.good(p, "a", &pj("j2"), n, b"k").await;
            self.send(
                p,
                Some(b"k"),
                Some(&[0xc3, 0x28, 0xff, 0x7b]),
                Expect::Letter("malformed_job"),
                "non-UTF-8 value",
            )
            .await;
            self.send(
                p,
                Some(b"k"),
                None,
                Expect::Letter("malformed_job"),
                "no value",
            )
            .await;
            // rdkafka's own header reader panics on a name that is not UTF-8.
            let bad_name = raw_headers(&[(&[0xff, 0xfe, 0x00], Some(b"v"))]);
            let value = job(&a, &pj("bad-header-name"), &tokens("h", 2));
            self.send_with(
                p,
                None,
                Some(&value),
                Some(bad_name),
                Expect::Letter("malformed_job"),
                "non-UTF-8 header name",
            )
            .await;
            let bad_value = raw_headers(&[(b"trace", Some(&[0xc3, 0x28]))]);
            let value = job(&a, &pj("bad-header-value"), &tokens("h", 2));
            self.send_with(
                p,
                None,
                Some(&value),
                Some(bad_value),
                Expect::Letter("malformed_job"),
                "non-UTF-8 header value",
            )
            .await;
            // Past serde_json's depth limit inside the payload (which is decoded).
            let nested = format!("{}{}", "[".repeat(200), "]".repeat(200));
            let deep = format!(
                r#"{{"campaign_id":"{a}","job_id":"deep","devices":["d"],"payload":{{"x":{nested}}}}}"#
            );
            self.send(
                p,
                None,
                Some(deep.as_bytes()),
                Expect::Letter("invalid_job"),
                "deeply nested JSON",
            )
            .await;
            // A job for a registered app names the app's kind: never a static provider,
            // which holds another app's credentials.
            let app_job = format!(
                r#"{{"campaign_id":"{a}","job_id":"{}","app_id":"shop-1","devices":["app-dev"],"payload":{{"x":1}}}}"#,
                pj("app")
            );
            self.send(
                p,
                None,
                Some(app_job.as_bytes()),
                Expect::Letter("invalid_job"),
                "provider missing beside app_id",
            )
            .await;
            let bad_app = format!(
                r#"{{"campaign_id":"{a}","job_id":"{}","app_id":"no spaces","devices":["d"],"payload":{{"x":1}}}}"#,
                pj("bad-app")
            );
            self.send(
                p,
                None,
                Some(bad_app.as_bytes()),
                Expect::Letter("invalid_job"),
                "app_id breaking the id rule",
            )
            .await;
            let big = vec![b' '; pushpace::job::MAX_MESSAGE_BYTES + 1];
            self.send(
                p,
                None,
                Some(&big),
                Expect::Letter("malformed_job"),
                "oversized message",
            )
            .await;
            // The same job_id in two campaigns: two jobs, two progress rows.
            let shared = tokens("shared", 30);
            for name in ["a", "b"] {
                let campaign = self.campaign(name);
                let expect = shared
                    .iter()
                    .map(|t| (campaign.clone(), pj("shared"), t.clone()))
                    .collect();
                let value = job(&campaign, &pj("shared"), &shared);
                self.send(
                    p,
                    None,
                    Some(&value),
                    Expect::Delivered(expect),
                    "job_id reused",
                )
                .await;
            }
            self.good(p, "b", &pj("j3"), n, b"k").await;
        }
    }
}

fn producer() -> Producer {
    Producer::with(
        pushpace::broker::producer_config(&crate::helpers::kafka(), &brokers())
            // Room for the oversized message (the worker's own limit is 1 MiB).
            .set("message.max.bytes", "4194304"),
    )
}

/// A worker process with its log in a file, for the rebalance check.
struct WorkerProcess {
    child: std::process::Child,
    log: std::path::PathBuf,
}

impl WorkerProcess {
    fn start(topic: &str, group: &str, db_url: &str, sink: &str) -> WorkerProcess {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR"));
        let log = dir.join(format!("{}.log", unique_name("bad-input")));
        let file = std::fs::File::create(&log).expect("worker log");
        let child = pushpace_bin()
            .arg("run")
            .env("PUSHPACE__KAFKA__BROKERS", brokers())
            .env("PUSHPACE__KAFKA__TOPIC", topic)
            .env("PUSHPACE__KAFKA__GROUP_ID", group)
            .env("PUSHPACE__DATABASE__URL", db_url)
            .env("PUSHPACE__SENDER__URL", sink)
            .env("PUSHPACE__WORKER__STATS_FLUSH_MS", "200")
            // Parked jobs keep only their offset: they are re-read from the broker.
            .env("PUSHPACE__WORKER__MAX_PARKED_BYTES", "0")
            .env("PUSHPACE__WORKER__LOOKAHEAD_MS", "100")
            .env("PUSHPACE__HTTP__BIND", "127.0.0.1:0")
            .env("RUST_LOG", "info,sqlx=warn,rdkafka=warn")
            .env("NO_COLOR", "1")
            .stdout(std::process::Stdio::null())
            .stderr(file)
            .spawn()
            .expect("start pushpace run");
        WorkerProcess { child, log }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) -> String {
        let status = crate::helpers::sigterm_and_wait(&mut self.child);
        assert!(
            status.success(),
            "worker exited with {status}: {}",
            self.log()
        );
        self.log()
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The slow campaign: created paused, so that its first job is held and the rest are
/// parked (offsets only) while the worker reads past them.
async fn pause_slow_campaign(pool: &PgPool, campaign: &str) {
    sqlx::query(
        "INSERT INTO campaigns (id, send_rate, algorithm, status) VALUES ($1, $2, 'gcra', 'paused')",
    )
    .bind(campaign)
    .bind(f64::from(RATE))
    .execute(pool)
    .await
    .expect("create the paused campaign");
}

/// Deletes records below `before` from tansu's storage, as retention would (tansu
/// 0.6.0 has no DeleteRecords; its PostgreSQL engine keeps records in `record` and
/// the low watermark in `watermark`).
async fn delete_records(topic: &str, partition: i32, before: i64) {
    let url = format!("{}/tansu", crate::helpers::pg_server());
    let tansu = PgPool::connect(&url).await.expect("tansu's database");
    let topition: i32 = sqlx::query_scalar(
        "SELECT tp.id FROM topition tp JOIN topic t ON t.id = tp.topic \
         WHERE t.name = $1 AND tp.partition = $2",
    )
    .bind(topic)
    .bind(partition)
    .fetch_one(&tansu)
    .await
    .expect("tansu topition");
    let deleted = sqlx::query("DELETE FROM record WHERE topition = $1 AND offset_id < $2")
        .bind(topition)
        .bind(before)
        .execute(&tansu)
        .await
        .expect("delete records")
        .rows_affected();
    assert!(deleted > 0, "no record below {before} to delete");
    sqlx::query("UPDATE watermark SET low = $2 WHERE topition = $1")
        .bind(topition)
        .bind(before)
        .execute(&tansu)
        .await
        .expect("move the low watermark");
}

/// The group's committed offset of each partition.
fn committed(topic: &str, group: &str) -> HashMap<i32, i64> {
    let consumer: BaseConsumer = ClientConfig::new()
        .set("bootstrap.servers", brokers())
        .set("group.id", group)
        .set("isolation.level", "read_uncommitted")
        .create()
        .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    for p in 0..PARTITIONS {
        tpl.add_partition(topic, p);
    }
    let got = consumer
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .filter_map(|e| match e.offset() {
            Offset::Offset(o) => Some((e.partition(), o)),
            _ => None,
        })
        .collect()
}

/// Runs the whole suite; `outage` stops the worker's PostgreSQL for that long once
/// sending has begun.
async fn run_suite(outage: Option<Duration>) {
    let pg = OwnPostgres::create().await;
    let (pool, db_url) = pg.fresh_database().await;
    let topic = fresh_topic(PARTITIONS).await;
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let run = unique_name("bi").replace('_', "-");
    let mut suite = Suite {
        // With an outage, enough work that most of it is sent after the database is back.
        devices: if outage.is_some() { 400 } else { 50 },
        producer: producer(),
        topic: topic.clone(),
        produced: Vec::new(),
        run,
    };
    // The slow campaign's jobs first in partition 0: the first is held, the rest parked.
    let slow = suite.campaign("slow");
    pause_slow_campaign(&pool, &slow).await;
    let mut slow_jobs = Vec::new();
    for j in 0..3 {
        // More than its lookahead (RATE × 100 ms): the first job is held, the rest parked.
        let toks = tokens(&format!("slow-{j}"), 100);
        let value = job(&slow, &format!("slow-{j}"), &toks);
        let expect = if j == 1 {
            Expect::Letter("expired_offset")
        } else {
            Expect::Delivered(
                toks.iter()
                    .map(|t| (slow.clone(), format!("slow-{j}"), t.clone()))
                    .collect(),
            )
        };
        let what = if j == 1 {
            "parked offset deleted by retention"
        } else {
            "slow job"
        };
        suite.send(0, None, Some(&value), expect, what).await;
        slow_jobs.push(suite.produced.last().unwrap().offset);
    }
    suite.produce_all().await;

    let group = unique_name("g");
    let worker = WorkerProcess::start(&topic, &group, &db_url, &sink.url());
    // Every good device outside the slow campaign delivered: the worker has read past
    // the slow campaign's parked jobs.
    let others: usize = suite
        .produced
        .iter()
        .filter_map(|p| match &p.expect {
            Expect::Delivered(d) if !d[0].0.ends_with("-slow") => Some(d.len()),
            _ => None,
        })
        .sum();
    if let Some(outage) = outage {
        wait_for("the first deliveries", DELIVERY_LIMIT, || {
            sink.summary().distinct_delivered >= 100
        })
        .await;
        pg.stop();
        tokio::time::sleep(outage).await;
        pg.start().await;
    }
    wait_for("the good devices", DELIVERY_LIMIT, || {
        sink.summary().distinct_delivered >= others as u64
    })
    .await;
    // Retention deletes the first two of the slow campaign's records (one held, one
    // parked), then the campaign is resumed: the parked one cannot be re-read.
    delete_records(&topic, 0, slow_jobs[1] + 1).await;
    sqlx::query("UPDATE campaigns SET status = 'active' WHERE id = $1")
        .bind(&slow)
        .execute(&pool)
        .await
        .unwrap();
    let all: usize = suite
        .produced
        .iter()
        .map(|p| match &p.expect {
            Expect::Delivered(d) => d.len(),
            Expect::Letter(_) => 0,
        })
        .sum();
    wait_for("every good device", DELIVERY_LIMIT, || {
        sink.summary().distinct_delivered >= all as u64
    })
    .await;
    let letters = suite
        .produced
        .iter()
        .filter(|p| matches!(p.expect, Expect::Letter(_)))
        .count();
    let deadline = std::time::Instant::now() + DELIVERY_LIMIT;
    while letter_count(&pool).await < letters as i64 {
        assert!(std::time::Instant::now() < deadline, "dead letters missing");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The committed offsets reach the end of every partition.
    let mut end: HashMap<i32, i64> = HashMap::new();
    for p in &suite.produced {
        let e = end.entry(p.partition).or_default();
        *e = (*e).max(p.offset + 1);
    }
    wait_for("offsets committed to the end", DELIVERY_LIMIT, || {
        tokio::task::block_in_place(|| committed(&topic, &group)) == end
    })
    .await;
    // Leaving the group at shutdown revokes too: count what happened before it.
    let log = worker.log();
    worker.stop();
    check_deliveries(&sink, &suite.produced);
    check_letters(&pool, &topic, &suite.produced).await;
    let revoked = log.matches("partitions revoked").count();
    let assigned = log.matches("partitions assigned").count();
    assert_eq!(
        (revoked, assigned),
        (0, 1),
        "the worker left or rejoined its group (revoked {revoked}, assigned {assigned} times)"
    );
}

async fn letter_count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(pool)
        .await
        .unwrap_or(0)
}

fn check_deliveries(sink: &SinkHandle, produced: &[Produced]) {
    let mut seen: HashMap<(String, String, String), usize> = HashMap::new();
    for a in sink.arrivals() {
        if a.status.is_some_and(|s| (200..300).contains(&s)) {
            let key = (
                a.campaign_id.to_string(),
                a.job_id.to_string(),
                a.device_token,
            );
            *seen.entry(key).or_default() += 1;
        }
    }
    let mut expected = 0;
    for p in produced {
        if let Expect::Delivered(devices) = &p.expect {
            for d in devices {
                expected += 1;
                assert_eq!(
                    seen.get(d),
                    Some(&1),
                    "{d:?} of the {} at {}:{}",
                    p.what,
                    p.partition,
                    p.offset
                );
            }
        }
    }
    assert_eq!(
        seen.len(),
        expected,
        "deliveries of devices no good job holds"
    );
}

async fn check_letters(pool: &PgPool, topic: &str, produced: &[Produced]) {
    let rows: Vec<(i32, i64, String, String)> = sqlx::query_as(
        "SELECT partition, kafka_offset, kind, reason FROM dead_letters WHERE topic = $1",
    )
    .bind(topic)
    .fetch_all(pool)
    .await
    .unwrap();
    let mut by_offset: HashMap<(i32, i64), Vec<(String, String)>> = HashMap::new();
    for (p, o, kind, reason) in rows.iter().cloned() {
        by_offset.entry((p, o)).or_default().push((kind, reason));
    }
    let mut expected = 0;
    for p in produced {
        let Expect::Letter(kind) = p.expect else {
            continue;
        };
        expected += 1;
        let got = by_offset
            .get(&(p.partition, p.offset))
            .cloned()
            .unwrap_or_default();
        assert_eq!(
            got.len(),
            1,
            "{} at {}:{}: letters {got:?}",
            p.what,
            p.partition,
            p.offset
        );
        assert_eq!(got[0].0, kind, "{}: {got:?}", p.what);
        assert!(got[0].1.len() > 10, "{}: reason {:?}", p.what, got[0].1);
        for field in ["app_id", "provider"] {
            if p.what.starts_with(field) {
                assert!(
                    got[0].1.starts_with(&format!("{field}: ")),
                    "{}: {:?}",
                    p.what,
                    got[0].1
                );
            }
        }
    }
    assert_eq!(rows.len(), expected, "letters for good messages: {rows:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_bad_message_is_dead_lettered_once_and_every_good_device_delivered_once() {
    run_suite(None).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bad_input_suite_passes_with_postgresql_stopped_for_30_s() {
    run_suite(Some(Duration::from_secs(30))).await;
}
