//! The frequency cap shared through Redis (`capping.scope = "redis"`), against the real
//! Redis on 127.0.0.1:6379 (a unique key prefix per test, keys removed at the end), and
//! through two workers on the real broker, PostgreSQL and the sink.

use crate::harness::{job_at, produce_job, TestWorker};
use crate::helpers::{requests_for, unique_name, wait_for, Proxy};
use pushpace::capping::shared::{member, SharedCap, SharedCapConfig};
use pushpace::capping::CapConfig;
use std::collections::{HashMap, HashSet};
use std::time::{Duration, Instant};

const REDIS: &str = "127.0.0.1:6379";

/// Long enough that no test run crosses a window edge (the edge is a multiple of it
/// since the epoch: about once in 11.6 days).
const LONG_WINDOW_S: u64 = 1_000_000;

fn cap_config(prefix: &str, max: u32, url: String) -> SharedCapConfig {
    SharedCapConfig {
        cap: CapConfig {
            max_per_device: max,
            window: LONG_WINDOW_S * 1_000_000_000,
            expected_devices: 1,
        },
        target: pushpace::redis_link::RedisTarget::url(url),
        timeout: Duration::from_millis(500),
        key_prefix: prefix.to_string(),
    }
}

async fn connected(config: SharedCapConfig) -> SharedCap {
    let cap = SharedCap::new(config).unwrap();
    let end = Instant::now() + Duration::from_secs(10);
    while !cap.is_connected() {
        assert!(Instant::now() < end, "no connection to redis");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    cap
}

async fn conn() -> redis::aio::ConnectionManager {
    let client = redis::Client::open(format!("redis://{REDIS}")).unwrap();
    redis::aio::ConnectionManager::new(client).await.unwrap()
}

/// Every key under `prefix`.
async fn keys(prefix: &str) -> Vec<String> {
    let mut c = conn().await;
    let mut out = Vec::new();
    let mut cursor: u64 = 0;
    loop {
        let (next, batch): (u64, Vec<String>) = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(format!("{prefix}:*"))
            .arg("COUNT")
            .arg(1000)
            .query_async(&mut c)
            .await
            .unwrap();
        out.extend(batch);
        if next == 0 {
            return out;
        }
        cursor = next;
    }
}

/// Removes the test's keys (they would otherwise live for the long window).
async fn clean(prefix: &str) {
    let ks = keys(prefix).await;
    if !ks.is_empty() {
        let mut c = conn().await;
        let _: () = redis::cmd("DEL")
            .arg(&ks)
            .query_async(&mut c)
            .await
            .unwrap();
    }
}

/// The sizes of every set under `prefix`, by key.
async fn set_sizes(prefix: &str) -> HashMap<String, usize> {
    let mut c = conn().await;
    let mut out = HashMap::new();
    for k in keys(prefix).await {
        let n: usize = redis::cmd("SCARD")
            .arg(&k)
            .query_async(&mut c)
            .await
            .unwrap();
        out.insert(k, n);
    }
    out
}

fn token(d: u32) -> String {
    format!("device-token-{d}")
}

/// A job of `devices` (indexes into the few tokens; repeats allowed).
fn tokens(devices: &[u32]) -> Vec<String> {
    devices.iter().map(|&d| token(d)).collect()
}

/// Random send sequences from one caller against an exact model: per device, the set
/// of (job, index) holding a reservation. Every decision must be the model's, a job
/// read again must change nothing, and a release must free exactly its own send.
#[tokio::test]
async fn redis_cap_decides_exactly_under_random_sequences() {
    let prefix = unique_name("ppcap");
    let url = format!("redis://{REDIS}");
    for seed in 0..12u64 {
        let mut rng = fastrand::Rng::with_seed(seed);
        let max = rng.u32(1..5);
        let cap = connected(cap_config(&prefix, max, url.clone())).await;
        let campaign = format!("c{seed}");
        // device -> members (job, index) holding a reservation
        let mut model: HashMap<u32, HashSet<(String, u32)>> = HashMap::new();
        let mut jobs: Vec<(String, Vec<u32>)> = Vec::new();
        let (mut refused, mut granted) = (0, 0);
        for step in 0..150 {
            match rng.u32(0..10) {
                // A new job over 5 devices, repeats allowed.
                0..=5 => {
                    let job_id = format!("j{seed}-{step}");
                    let devices: Vec<u32> = (0..rng.u32(1..6)).map(|_| rng.u32(0..5)).collect();
                    let got = cap
                        .try_reserve(&campaign, &job_id, &tokens(&devices), 0, &[])
                        .await
                        .unwrap();
                    for (i, &d) in devices.iter().enumerate() {
                        let held = model.entry(d).or_default();
                        let refused_here = got.contains(&(i as u32));
                        if held.len() < max as usize {
                            assert!(
                                !refused_here,
                                "seed {seed}: device {d} under the cap was refused"
                            );
                            held.insert((job_id.clone(), i as u32));
                            granted += 1;
                        } else {
                            assert!(
                                refused_here,
                                "seed {seed}: device {d} at the cap was granted"
                            );
                            refused += 1;
                        }
                    }
                    jobs.push((job_id, devices));
                }
                // A job read again (crash, rebalance): the same answers, nothing counted.
                6..=7 if !jobs.is_empty() => {
                    let (job_id, devices) = jobs[rng.usize(..jobs.len())].clone();
                    let before = set_sizes(&prefix).await;
                    let mut changed = false;
                    let got = cap
                        .try_reserve(&campaign, &job_id, &tokens(&devices), 0, &[])
                        .await
                        .unwrap();
                    for (i, &d) in devices.iter().enumerate() {
                        let held = model.entry(d).or_default();
                        let mine = held.contains(&(job_id.clone(), i as u32));
                        if mine {
                            assert!(
                                !got.contains(&(i as u32)),
                                "seed {seed}: a re-read reservation was refused"
                            );
                        } else if held.len() < max as usize {
                            // Refused the first time, and a release made room since.
                            assert!(!got.contains(&(i as u32)));
                            held.insert((job_id.clone(), i as u32));
                            changed = true;
                        } else {
                            assert!(got.contains(&(i as u32)));
                        }
                    }
                    if !changed {
                        assert_eq!(
                            set_sizes(&prefix).await,
                            before,
                            "seed {seed}: a re-read counted"
                        );
                    }
                }
                // A send of an earlier job failed for good: its reservation goes back.
                _ if !jobs.is_empty() => {
                    let (job_id, devices) = jobs[rng.usize(..jobs.len())].clone();
                    let i = rng.usize(..devices.len());
                    let d = devices[i];
                    cap.release(&campaign, &job_id, i as u32, &token(d));
                    cap.flush_releases().await.unwrap();
                    model.entry(d).or_default().remove(&(job_id, i as u32));
                }
                _ => {}
            }
        }
        assert!(
            granted > 0 && refused > 0,
            "seed {seed}: both answers seen ({granted}, {refused})"
        );
        // Redis holds exactly the model's counts, under hashed keys only.
        let sizes = set_sizes(&prefix).await;
        let mut counts: Vec<usize> = sizes.values().copied().filter(|&n| n > 0).collect();
        let mut expected: Vec<usize> = model.values().map(|s| s.len()).filter(|&n| n > 0).collect();
        counts.sort_unstable();
        expected.sort_unstable();
        assert_eq!(
            counts, expected,
            "seed {seed}: redis counts are the model's"
        );
        for k in sizes.keys() {
            assert!(!k.contains("device-token"), "a raw token in a key: {k}");
            let last = k.rsplit(':').next().unwrap();
            assert!(
                last.len() == 32 && last.bytes().all(|b| b.is_ascii_hexdigit()),
                "{k}"
            );
        }
        clean(&prefix).await;
    }
}

/// Four "workers" (each its own connection) reserve random jobs over 4 devices at once.
/// Per device: granted = min(cap, sends asked), so none under the cap was refused and
/// none over it was sent; then every job read again by another worker changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_workers_hold_the_cap_exactly() {
    let prefix = unique_name("ppcap");
    let url = format!("redis://{REDIS}");
    let max = 3u32;
    let mut workers = Vec::new();
    for _ in 0..4 {
        workers.push(connected(cap_config(&prefix, max, url.clone())).await);
    }
    // (job_id, devices, refused indexes)
    type Outcome = (String, Vec<u32>, Vec<u32>);
    let mut tasks = Vec::new();
    for (w, cap) in workers.iter().cloned().enumerate() {
        tasks.push(tokio::spawn(async move {
            let mut rng = fastrand::Rng::with_seed(w as u64 + 100);
            let mut out: Vec<Outcome> = Vec::new();
            for j in 0..40 {
                let job_id = format!("w{w}-j{j}");
                let devices: Vec<u32> = (0..rng.u32(1..5)).map(|_| rng.u32(0..4)).collect();
                let refused = cap
                    .try_reserve("c", &job_id, &tokens(&devices), 0, &[])
                    .await
                    .unwrap();
                out.push((job_id, devices, refused));
            }
            out
        }));
    }
    let mut all: Vec<Outcome> = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    let mut asked: HashMap<u32, usize> = HashMap::new();
    let mut sent: HashMap<u32, usize> = HashMap::new();
    for (_, devices, refused) in &all {
        for (i, d) in devices.iter().enumerate() {
            *asked.entry(*d).or_default() += 1;
            if !refused.contains(&(i as u32)) {
                *sent.entry(*d).or_default() += 1;
            }
        }
    }
    for d in 0..4u32 {
        let (a, s) = (asked[&d], sent.get(&d).copied().unwrap_or(0));
        assert!(a > max as usize, "device {d} asked only {a} times");
        assert_eq!(s, (max as usize).min(a), "device {d}: asked {a}, sent {s}");
    }
    let before = set_sizes(&prefix).await;
    assert_eq!(before.values().sum::<usize>(), 4 * max as usize);
    // Redelivery: each job read again by the next worker gets the same answers.
    for (n, (job_id, devices, refused)) in all.iter().enumerate() {
        let again = workers[(n + 1) % 4]
            .try_reserve("c", job_id, &tokens(devices), 0, &[])
            .await
            .unwrap();
        assert_eq!(&again, refused, "{job_id} read again");
    }
    assert_eq!(set_sizes(&prefix).await, before, "re-reads counted nothing");
    let rt: u64 = workers.iter().map(|w| w.stats().round_trips).sum();
    assert_eq!(rt, 2 * 160, "one script call per job");
    clean(&prefix).await;
}

/// Skipped devices (done earlier, or invalid tokens) take no reservation; a job larger
/// than one chunk is decided in chunks; a release frees only its own send.
#[tokio::test]
async fn skips_chunks_and_releases() {
    let prefix = unique_name("ppcap");
    let cap = connected(cap_config(&prefix, 1, format!("redis://{REDIS}"))).await;
    // 2,500 distinct devices, the first 100 done, two invalid: 3 chunks of ≤ 1,000.
    let devices: Vec<String> = (0..2500).map(|i| format!("bulk-{i}")).collect();
    let refused = cap
        .try_reserve("c", "big", &devices, 100, &[150, 2499])
        .await
        .unwrap();
    assert!(refused.is_empty());
    assert_eq!(cap.stats().round_trips, 3);
    assert_eq!(cap.stats().checked, 2398);
    assert_eq!(keys(&prefix).await.len(), 2398);
    // Those skipped are still free for another job; a reserved one is not.
    let other = tokens_of(&devices, &[5, 150, 2499, 200]);
    let refused = cap.try_reserve("c", "other", &other, 0, &[]).await.unwrap();
    assert_eq!(
        refused,
        vec![3],
        "only bulk-200 was reserved by the first job"
    );
    // bulk-200's send fails for good: its reservation goes, and the next job gets it.
    cap.release("c", "other", 3, "bulk-200"); // not this job's: nothing to free
    cap.release("c", "big", 200, "bulk-200");
    assert_eq!(cap.flush_releases().await.unwrap(), 1);
    assert_eq!(cap.stats().released, 1);
    let refused = cap
        .try_reserve("c", "third", &other[3..], 0, &[])
        .await
        .unwrap();
    assert!(refused.is_empty(), "freed by the release");
    assert_ne!(member("c", "big", 200), member("c", "third", 0));
    clean(&prefix).await;
}

fn tokens_of(devices: &[String], idx: &[usize]) -> Vec<String> {
    idx.iter().map(|&i| devices[i].clone()).collect()
}

/// Redis unreachable: the job is held (no answer, nothing sent uncapped) and decided
/// exactly once Redis is back; a direct call reports the error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_down_holds_the_job_until_redis_answers() {
    let prefix = unique_name("ppcap");
    let proxy = Proxy::start(REDIS).await;
    let cap = connected(cap_config(
        &prefix,
        1,
        format!("redis://127.0.0.1:{}", proxy.port),
    ))
    .await;
    let first = cap
        .try_reserve("c", "before", &tokens(&[1]), 0, &[])
        .await
        .unwrap();
    assert!(first.is_empty());
    proxy.take_down().await;
    assert!(cap
        .try_reserve("c", "probe", &tokens(&[2]), 0, &[])
        .await
        .is_err());
    let held = {
        let cap = cap.clone();
        tokio::spawn(async move { cap.reserve("c", "during", &tokens(&[1, 2]), 0, &[]).await })
    };
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!held.is_finished(), "no answer while redis is down");
    let failures = cap.stats().failures;
    assert!(failures >= 2, "it keeps trying: {failures}");
    proxy.set_up(true);
    let refused = tokio::time::timeout(Duration::from_secs(15), held)
        .await
        .expect("decided once redis is back")
        .unwrap();
    assert_eq!(
        refused,
        vec![0],
        "device 1 was at its cap of 1; device 2 was free"
    );
    clean(&prefix).await;
}

async fn produce(topic: &str, campaign: &str, job_id: &str, devices: &[String]) {
    produce_job(topic, &job_at(job_id, campaign, 2000.0, devices)).await;
}

/// A worker's settings for the cap shared through Redis at `url`, under `prefix`.
fn redis_cap(max: u32, url: String, prefix: &str) -> [(&'static str, String); 6] {
    [
        ("capping.enabled", "true".into()),
        ("capping.scope", "redis".into()),
        ("capping.max_per_device", max.to_string()),
        ("redis.url", url),
        ("redis.key_prefix", prefix.to_string()),
        ("redis.connect_timeout_ms", "500".into()),
    ]
}

/// Two workers, cap 2: one device in three campaigns, two on worker A and one on
/// worker B, reaches the sink exactly twice and is counted `capped` once; every other
/// device is delivered. A 410 gives its reservation back, and the token, once recorded
/// invalid, takes none. Prints the Redis round trips per 1,000 sends (with 8 further
/// jobs of 250 devices on A).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_workers_share_one_cap() {
    let prefix = unique_name("ppcap");
    let capping = redis_cap(2, format!("redis://{REDIS}"), &prefix);
    let mut wa = TestWorker::options().settings(&capping).prepare().await;
    let sink = wa.sink();
    sink.set_gone_prefix(Some("gone-"));
    wa.start().await;
    let mut wb = TestWorker::options()
        .alongside(&wa)
        .settings(&capping)
        .spawn()
        .await;
    let run = unique_name("cap").replace('_', "-");
    let pool = wa.pool.clone();
    let (topic_a, topic_b) = (wa.topic.clone(), wb.topic.clone());
    let (a, b) = (wa.take_worker(), wb.take_worker());
    let shared = format!("{run}-shared");
    let gone = format!("gone-{run}");
    let campaigns: Vec<String> = (1..=3).map(|c| format!("{run}-c{c}")).collect();
    let mut others = Vec::new();
    for (n, c) in campaigns.iter().enumerate() {
        let other = format!("{run}-other-{n}");
        let mut devices = vec![shared.clone(), other.clone()];
        if n == 0 {
            devices.push(gone.clone());
        }
        let topic = if n < 2 { &topic_a } else { &topic_b };
        produce(topic, c, &format!("{run}-j{n}"), &devices).await;
        others.push(other);
    }
    let bulk = format!("{run}-bulk");
    let bulk_devices: Vec<Vec<String>> = (0..8)
        .map(|j| (0..250).map(|i| format!("{run}-b{j}-{i}")).collect())
        .collect();
    for (j, devices) in bulk_devices.iter().enumerate() {
        produce(&topic_a, &bulk, &format!("{run}-bulk-{j}"), devices).await;
    }
    let capped_total = || a.scheduler_stats.borrow().capped + b.scheduler_stats.borrow().capped;
    wait_for("every job's devices", Duration::from_secs(90), || {
        others.iter().all(|t| requests_for(&sink, t) == 1)
            && requests_for(&sink, &gone) == 1
            && capped_total() == 1
            && a.scheduler_stats.borrow().delivered + b.scheduler_stats.borrow().delivered
                >= 2 + 3 + 2000
    })
    .await;
    let cap_a = a.shared_cap.clone().expect("redis scope");
    let cap_b = b.shared_cap.clone().expect("redis scope");
    wait_for("the 410's release", Duration::from_secs(10), || {
        cap_a.stats().released == 1
    })
    .await;
    // The gone token again, once recorded: skipped as invalid, and it takes no
    // reservation.
    let hygiene_a = a.hygiene.clone().unwrap();
    wait_for("the 410 recorded", Duration::from_secs(10), || {
        hygiene_a.stats().recorded == 1
    })
    .await;
    let late = format!("{run}-late");
    produce(
        &topic_a,
        &campaigns[0],
        &format!("{run}-j3"),
        &[gone.clone(), late.clone()],
    )
    .await;
    wait_for("the late job", Duration::from_secs(30), || {
        requests_for(&sink, &late) == 1 && a.scheduler_stats.borrow().skipped_invalid == 1
    })
    .await;
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();

    assert_eq!(
        requests_for(&sink, &shared),
        2,
        "capped at 2 across both workers"
    );
    let (sent, capped): (i64, i64) = sqlx::query_as(
        "SELECT sum(sent)::int8, sum(capped)::int8 FROM delivery_seconds WHERE campaign_id = ANY($1)",
    )
    .bind(&campaigns)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        (sent, capped),
        (2 + 3 + 1, 1),
        "the shared device twice, the others once"
    );
    assert_eq!(requests_for(&sink, &gone), 1, "sent once, then skipped");
    let done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM job_progress WHERE campaign_id = ANY($1) AND completed_at IS NOT NULL",
    )
    .bind(&campaigns)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(done, 4, "jobs with a capped or an invalid device complete");
    for devices in &bulk_devices {
        for t in devices {
            assert_eq!(requests_for(&sink, t), 1, "{t}");
        }
    }
    // The gone token's reservation was given back and it took no other: its set is
    // empty.
    let sizes = set_sizes(&prefix).await;
    assert_eq!(
        sizes.values().sum::<usize>(),
        2 + 3 + 2000 + 1,
        "{} keys",
        sizes.len()
    );
    let (sa, sb) = (cap_a.stats(), cap_b.stats());
    let sends = sink.arrivals().len();
    assert_eq!(sends, 2 + 3 + 1 + 2000 + 1);
    let trips = sa.round_trips + sb.round_trips;
    println!(
        "redis scope: {trips} round trips ({} reserve checks, {} release) for {sends} sends: {:.1} per 1,000 sends",
        sa.checked + sb.checked,
        sa.released + sb.released,
        trips as f64 * 1000.0 / sends as f64
    );
    assert_eq!(
        sa.checked + sb.checked,
        sends as u64 + 1,
        "every device checked once"
    );
    clean(&prefix).await;
}

/// Redis cut while a worker runs: a job read during the outage is held (nothing of it
/// reaches the sink), then decided exactly once Redis is back; nothing is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_holds_jobs_while_redis_is_down() {
    let proxy = Proxy::start(REDIS).await;
    let prefix = unique_name("ppcap");
    let run = unique_name("capdown").replace('_', "-");
    let capping = redis_cap(1, format!("redis://127.0.0.1:{}", proxy.port), &prefix);
    let mut tw = TestWorker::options().settings(&capping).spawn().await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let w = tw.take_worker();
    let (x, y) = (format!("{run}-x"), format!("{run}-y"));
    let campaign = format!("{run}-c");
    produce(
        &topic,
        &campaign,
        &format!("{run}-j1"),
        std::slice::from_ref(&x),
    )
    .await;
    wait_for("the first job", Duration::from_secs(60), || {
        requests_for(&sink, &x) == 1
    })
    .await;
    proxy.take_down().await;
    produce(
        &topic,
        &campaign,
        &format!("{run}-j2"),
        &[x.clone(), y.clone()],
    )
    .await;
    let cap = w.shared_cap.clone().unwrap();
    let failures = cap.stats().failures;
    wait_for(
        "the cap to meet the outage",
        Duration::from_secs(30),
        || cap.stats().failures > failures,
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(requests_for(&sink, &y), 0, "held while redis is down");
    proxy.set_up(true);
    wait_for("the held job", Duration::from_secs(30), || {
        requests_for(&sink, &y) == 1 && w.scheduler_stats.borrow().capped == 1
    })
    .await;
    w.shutdown().await.unwrap();
    assert_eq!(requests_for(&sink, &x), 1, "x was at its cap of 1");
    let (sent, capped): (i64, i64) = sqlx::query_as(
        "SELECT sum(sent)::int8, sum(capped)::int8 FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(&campaign)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((sent, capped), (2, 1));
    clean(&prefix).await;
}
