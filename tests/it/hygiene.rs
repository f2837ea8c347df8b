//! Token hygiene and frequency capping: the cap's decisions against an exact model
//! (virtual clock), and gone tokens against real PostgreSQL, the broker and the sink.

use crate::harness::{job_at, produce_job, TestWorker};
use crate::helpers::{requests_for, unique_name, wait_for};
use proptest::prelude::*;
use pushpace::capping::{CapConfig, CapDecision, FrequencyCap};
use pushpace::hygiene::{token_hash, BloomFilter, Scope};
use pushpace::limiter::{Clock, ManualClock, Nanos};
use pushpace::provider::{Provider, ProviderKind, Providers};
use pushpace::sender::{AnySender, HttpSender, HttpSenderConfig};
use pushpace::tools::sink::{Sink, SinkConfig, SinkHandle};
use pushpace::worker::Worker;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

const WINDOW: Nanos = 60_000_000_000;

#[derive(Debug, Clone)]
enum Op {
    Send(u8),
    Advance(Nanos),
}

fn ops() -> impl Strategy<Value = Vec<Op>> {
    prop::collection::vec(
        prop_oneof![
            8 => (0u8..40).prop_map(Op::Send),
            1 => (0..WINDOW).prop_map(Op::Advance),
        ],
        1..400,
    )
}

/// Runs `ops` through `cap` and an exact model (sends per device per fixed window);
/// returns (model count before each decision, decision) for every send.
fn run(cap: &mut FrequencyCap, ops: &[Op]) -> Vec<(u32, CapDecision)> {
    let clock = ManualClock::new(0);
    let mut model: HashMap<(u64, u8), u32> = HashMap::new();
    let mut out = Vec::new();
    for op in ops {
        match op {
            Op::Advance(by) => clock.advance(*by),
            Op::Send(d) => {
                let now = clock.now();
                let count = model.entry((now / WINDOW, *d)).or_default();
                let decision = cap.check(&format!("device-token-{d}"), now);
                out.push((*count, decision));
                if decision == CapDecision::Send {
                    *count += 1;
                }
            }
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Sized for its devices: every decision is the exact model's.
    #[test]
    fn cap_decides_exactly_under_a_virtual_clock(ops in ops(), max in 1u32..5) {
        let config = CapConfig { max_per_device: max, window: WINDOW, expected_devices: 1 << 16 };
        let mut cap = FrequencyCap::new(config).unwrap();
        for (count, decision) in run(&mut cap, &ops) {
            if count < max {
                prop_assert_eq!(decision, CapDecision::Send, "a device under the cap was skipped");
            } else {
                prop_assert_eq!(decision, CapDecision::Capped, "a device over the cap was sent");
            }
        }
    }

    /// Sketches of 4 counters per row: everything collides. A device over the cap is
    /// still always skipped; one under it is skipped at most one send early (the case
    /// the module docs describe), never more.
    #[test]
    fn crowded_sketches_never_let_a_device_over_the_cap(ops in ops(), max in 1u32..5) {
        let config = CapConfig { max_per_device: max, window: WINDOW, expected_devices: 4 };
        let mut cap = FrequencyCap::with_width(config, 4);
        for (count, decision) in run(&mut cap, &ops) {
            if count >= max {
                prop_assert_eq!(decision, CapDecision::Capped);
            }
            if count + 1 < max {
                prop_assert_eq!(decision, CapDecision::Send);
            }
        }
    }
}

/// A token that is not `gone` but lands on the same bits of a one-hash, 64-bit filter
/// (what `hygiene.expected_tokens = 1`, `false_positive_rate = 0.5` builds), in the scope
/// of the sink's provider (`webhook`). Also returns one that does not collide.
fn colliding_token(gone: &str) -> (String, String) {
    let filter = BloomFilter::with_rate(1, 0.5).unwrap();
    assert_eq!((filter.bits(), filter.hashes()), (64, 1));
    let scope = Scope::new("webhook");
    filter.insert(scope.key(&token_hash(gone)));
    let maybe = |t: &String| filter.may_contain(scope.key(&token_hash(t)));
    let collides = (0..)
        .map(|i| format!("ok-collides-{i}"))
        .find(maybe)
        .expect("1 in 64 tokens collides");
    let clear = (0..)
        .map(|i| format!("ok-clear-{i}"))
        .find(|t| !maybe(t))
        .expect("63 in 64 do not");
    (collides, clear)
}

async fn produce(topic: &str, campaign: &str, job_id: &str, devices: &[&str]) {
    produce_job(topic, &job_at(job_id, campaign, 1000.0, devices)).await;
}

/// A worker with a 64-bit, one-hash filter (collisions are easy to make), next to
/// `other` (its database and sink) if given; the worker is handed out.
async fn worker(other: Option<&TestWorker>) -> (TestWorker, Worker) {
    let mut options = TestWorker::options().settings(&[
        ("hygiene.expected_tokens", "1".into()),
        ("hygiene.false_positive_rate", "0.5".into()),
        ("hygiene.reload_ms", "200".into()),
    ]);
    if let Some(other) = other {
        options = options.alongside(other);
    }
    let mut tw = options.spawn().await;
    let w = tw.take_worker();
    (tw, w)
}

async fn skipped(pool: &PgPool, campaign: &str) -> i64 {
    sqlx::query_scalar::<_, Option<i64>>(
        "SELECT sum(skipped_invalid)::int8 FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(campaign)
    .fetch_one(pool)
    .await
    .unwrap()
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_gone_once_is_never_sent_again_by_any_worker() {
    // A and B run from the start, so B learns of the token only by its reload.
    let (ta, a) = worker(None).await;
    let (tb, b) = worker(Some(&ta)).await;
    let (pool, sink) = (ta.pool.clone(), ta.sink());
    sink.set_gone_prefix(Some("gone-"));
    let run = unique_name("h").replace('_', "-");
    let gone = format!("gone-{run}");
    let (collides, clear) = colliding_token(&gone);
    let (topic_a, topic_b) = (ta.topic.clone(), tb.topic.clone());

    let c1 = format!("{run}-c1");
    produce(
        &topic_a,
        &c1,
        &format!("{run}-j1"),
        &[&gone, "ok-1", "ok-2"],
    )
    .await;
    wait_for("the 410 to be recorded", Duration::from_secs(60), || {
        requests_for(&sink, "ok-2") == 1 && requests_for(&sink, &gone) == 1
    })
    .await;
    let end = Instant::now() + Duration::from_secs(30);
    while sqlx::query_scalar::<_, i64>("SELECT count(*) FROM invalid_tokens")
        .fetch_one(&pool)
        .await
        .unwrap()
        == 0
    {
        assert!(Instant::now() < end, "the token was never recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let reloaded_after = b.hygiene.as_ref().unwrap().stats().loaded;
    wait_for("worker B's reload", Duration::from_secs(10), || {
        b.hygiene.as_ref().unwrap().stats().loaded > reloaded_after
    })
    .await;

    // The same token again: in A (it recorded it), in B (it reloaded it), and in a
    // worker started afterwards (it loads the table at start). The colliding token is
    // sent: the filter's "maybe" is settled by the table.
    let (c2, c3, c4) = (
        format!("{run}-c2"),
        format!("{run}-c3"),
        format!("{run}-c4"),
    );
    produce(&topic_a, &c2, &format!("{run}-j2"), &["ok-3", &gone]).await;
    produce(
        &topic_b,
        &c3,
        &format!("{run}-j3"),
        &[&gone, &collides, "ok-4"],
    )
    .await;
    let (tc, c) = worker(Some(&ta)).await;
    let topic_c = tc.topic.clone();
    produce(&topic_c, &c4, &format!("{run}-j4"), &[&gone]).await;
    produce(&topic_c, &c4, &format!("{run}-j5"), &[&clear]).await;
    wait_for("every valid token", Duration::from_secs(60), || {
        ["ok-3", "ok-4", clear.as_str(), collides.as_str()]
            .iter()
            .all(|t| requests_for(&sink, t) == 1)
    })
    .await;
    let (ha, hb, hc) = (
        a.hygiene.clone().unwrap(),
        b.hygiene.clone().unwrap(),
        c.hygiene.clone().unwrap(),
    );
    for w in [a, b, c] {
        w.shutdown().await.unwrap();
    }

    assert_eq!(requests_for(&sink, &gone), 1, "sent once, never again");
    assert_eq!(
        requests_for(&sink, &collides),
        1,
        "a filter collision is still sent"
    );
    for campaign in [&c2, &c3, &c4] {
        assert_eq!(
            skipped(&pool, campaign).await,
            1,
            "{campaign}: one skipped_invalid"
        );
    }
    assert_eq!(skipped(&pool, &c1).await, 0);
    let sent_c3: i64 =
        sqlx::query_scalar("SELECT sum(sent)::int8 FROM delivery_seconds WHERE campaign_id = $1")
            .bind(&c3)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(sent_c3, 2, "the colliding token and ok-4");
    assert_eq!(ha.stats().recorded, 1);
    assert_eq!(hb.stats().invalid, 1);
    assert!(
        hb.stats().maybe >= 2,
        "gone and the colliding token: {:?}",
        hb.stats()
    );
    assert_eq!(hc.stats().invalid, 1, "C knew it from its start-up load");
    // A token the filter rules out costs no query: C's job j5 made none.
    assert_eq!(hc.stats().lookups, 1, "{:?}", hc.stats());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_capped_device_is_counted_and_not_sent() {
    let mut tw = TestWorker::options()
        .settings(&[
            ("capping.enabled", "true".into()),
            ("capping.max_per_device", "2".into()),
            ("capping.expected_devices", "1000".into()),
        ])
        .prepare()
        .await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let run = unique_name("cap").replace('_', "-");
    let campaign = format!("{run}-c");
    let busy = format!("{run}-busy");
    for j in 0..4 {
        let other = format!("{run}-other-{j}");
        produce(&topic, &campaign, &format!("{run}-j{j}"), &[&busy, &other]).await;
    }
    tw.start().await;
    let w = tw.take_worker();
    wait_for("every job finished", Duration::from_secs(60), || {
        (0..4).all(|j| requests_for(&sink, &format!("{run}-other-{j}")) == 1)
            && w.scheduler_stats.borrow().capped == 2
    })
    .await;
    w.shutdown().await.unwrap();
    assert_eq!(requests_for(&sink, &busy), 2, "capped at 2 per window");
    let (sent, capped): (i64, i64) = sqlx::query_as(
        "SELECT sum(sent)::int8, sum(capped)::int8 FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(&campaign)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!((sent, capped), (6, 2));
    let done: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM job_progress WHERE campaign_id = $1 AND completed_at IS NOT NULL",
    )
    .bind(&campaign)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(done, 4, "jobs with capped devices complete");
}

/// A sink, and two webhook providers `a` and `b` (`a` the default) sending to it: two
/// apps, say, that share some device tokens.
async fn two_providers() -> (SinkHandle, Providers) {
    let sink = Sink::start(SinkConfig::default()).await.expect("sink");
    let provider = |name: &str| Provider {
        name: Arc::from(name),
        kind: ProviderKind::Webhook,
        max_rate: None,
        max_in_flight: None,
        adaptive: None,
        sender: AnySender::Http(HttpSender::new(&HttpSenderConfig::new(sink.url())).unwrap()),
    };
    let providers = Providers::new(vec![provider("a"), provider("b")], "a").unwrap();
    (sink, providers)
}

async fn produce_through(topic: &str, provider: &str, campaign: &str, job: &str, devices: &[&str]) {
    let mut j = job_at(job, campaign, 1000.0, devices);
    j.provider = Some(provider.to_string());
    produce_job(topic, &j).await;
}

async fn marks(pool: &PgPool) -> Vec<(Option<String>, String)> {
    sqlx::query_as("SELECT provider, reason FROM invalid_tokens ORDER BY provider")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_token_dead_through_one_provider_is_still_sent_through_another() {
    let (sink, providers) = two_providers().await;
    sink.set_gone_prefix(Some("gone-"));
    let mut tw = TestWorker::options()
        .providers(providers)
        .settings(&[("hygiene.reload_ms", "200".into())])
        .spawn()
        .await;
    let (pool, topic) = (tw.pool.clone(), tw.topic.clone());
    let run = unique_name("hs").replace('_', "-");
    let gone = format!("gone-{run}");
    produce_through(
        &topic,
        "a",
        &format!("{run}-c1"),
        &format!("{run}-j1"),
        &[&gone],
    )
    .await;
    let end = Instant::now() + Duration::from_secs(60);
    while marks(&pool).await.is_empty() {
        assert!(Instant::now() < end, "the 410 was never recorded");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Through b: sent (b never said it is dead). Through a again: skipped.
    let (c2, c3) = (format!("{run}-c2"), format!("{run}-c3"));
    let (ok2, ok3) = (format!("ok2-{run}"), format!("ok3-{run}"));
    produce_through(&topic, "b", &c2, &format!("{run}-j2"), &[&gone, &ok2]).await;
    produce_through(&topic, "a", &c3, &format!("{run}-j3"), &[&gone, &ok3]).await;
    wait_for("both later jobs", Duration::from_secs(60), || {
        requests_for(&sink, &ok2) == 1 && requests_for(&sink, &ok3) == 1
    })
    .await;
    wait_for("the answer through b", Duration::from_secs(30), || {
        requests_for(&sink, &gone) >= 2
    })
    .await;
    tw.stop().await;
    assert_eq!(
        requests_for(&sink, &gone),
        2,
        "once through a, once through b, not again through a"
    );
    assert_eq!(skipped(&pool, &c3).await, 1, "skipped in a's scope");
    assert_eq!(skipped(&pool, &c2).await, 0, "not skipped through b");
    let m = marks(&pool).await;
    let scopes: Vec<Option<&str>> = m.iter().map(|(p, _)| p.as_deref()).collect();
    assert_eq!(
        scopes,
        [Some("a"), Some("b")],
        "one mark per provider that said so"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expired_mark_no_longer_skips_and_prune_deletes_it() {
    let mut tw = TestWorker::options().prepare().await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let run = unique_name("hx").replace('_', "-");
    let (expired, live, ok) = (
        format!("expired-{run}"),
        format!("live-{run}"),
        format!("ok-{run}"),
    );
    // The sink's provider is `webhook`: one mark expired a minute ago, one for a day.
    for (token, expires) in [(&expired, "-1 minute"), (&live, "1 day")] {
        sqlx::query(
            "INSERT INTO invalid_tokens (token_hash, provider, reason, expires_at) \
             VALUES ($1, 'webhook', 'HTTP 410', now() + $2::interval)",
        )
        .bind(token_hash(token).as_slice())
        .bind(expires)
        .execute(&pool)
        .await
        .unwrap();
    }
    let campaign = format!("{run}-c");
    produce(
        &topic,
        &campaign,
        &format!("{run}-j"),
        &[&expired, &live, &ok],
    )
    .await;
    tw.start().await;
    wait_for("the job", Duration::from_secs(60), || {
        requests_for(&sink, &ok) == 1 && requests_for(&sink, &expired) == 1
    })
    .await;
    let w = tw.take_worker();
    let loaded = w.hygiene.as_ref().unwrap().stats().loaded;
    w.shutdown().await.unwrap();
    assert_eq!(
        requests_for(&sink, &expired),
        1,
        "an expired mark skips nothing"
    );
    assert_eq!(
        requests_for(&sink, &live),
        0,
        "an unexpired mark still skips"
    );
    assert_eq!(skipped(&pool, &campaign).await, 1);
    assert_eq!(loaded, 1, "the expired row is not loaded into the filter");

    let report = pushpace::store::prune::prune(&pool, chrono::Duration::days(2), 100)
        .await
        .unwrap();
    assert_eq!(report.invalid_tokens_expired, 1);
    let left: Vec<Vec<u8>> = sqlx::query_scalar("SELECT token_hash FROM invalid_tokens")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, [token_hash(&live).to_vec()]);
}

/// Marks written before scopes (no provider) keep skipping for every provider, but only
/// until first_seen + 30 days; new marks beside them are per provider.
#[tokio::test]
async fn the_scope_migration_keeps_old_marks_until_they_expire() {
    use pushpace::hygiene::{TokenHygiene, DEFAULT_INVALID_TTL};
    let url = format!(
        "{}/{}",
        crate::helpers::pg_server(),
        unique_name("pushpace_test")
    );
    pushpace::store::ensure_database(&url).await.unwrap();
    let pool = pushpace::store::connect(&url, 2, Duration::from_secs(10))
        .await
        .unwrap();
    // The migrations before scopes, from a copy of the directory.
    let dir = tempfile::tempdir().unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "20261206000100" {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(dir.path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    for (token, age) in [("old-mark", "40 days"), ("recent-mark", "1 day")] {
        sqlx::query(
            "INSERT INTO invalid_tokens (token_hash, reason, first_seen) \
             VALUES ($1, 'APNs 400 DeviceTokenNotForTopic', now() - $2::interval)",
        )
        .bind(token_hash(token).as_slice())
        .bind(age)
        .execute(&pool)
        .await
        .unwrap();
    }
    pushpace::store::migrate(&pool).await.unwrap();
    let rows: Vec<(Option<String>, bool)> = sqlx::query_as(
        "SELECT provider, expires_at = first_seen + interval '30 days' \
         FROM invalid_tokens ORDER BY first_seen",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows, [(None, true), (None, true)]);

    let filter = BloomFilter::with_rate(100, 0.01).unwrap();
    let names: Vec<Arc<str>> = vec![Arc::from("a"), Arc::from("b")];
    let h = TokenHygiene::with_filter(pool.clone(), filter, DEFAULT_INVALID_TTL, &names)
        .await
        .unwrap();
    assert_eq!(h.stats().loaded, 1, "the expired legacy mark is not loaded");
    let tokens = ["old-mark".to_string(), "recent-mark".to_string()];
    for provider in ["a", "b"] {
        assert_eq!(
            h.invalid_among(&tokens, provider).await.unwrap(),
            [1],
            "{provider}: the unexpired legacy mark still skips"
        );
    }
    // A new answer marks the old token again, for its provider only.
    h.record_invalid("old-mark", "a", "APNs 410 Unregistered")
        .await
        .unwrap();
    assert_eq!(h.invalid_among(&tokens, "a").await.unwrap(), [0, 1]);
    assert_eq!(h.invalid_among(&tokens, "b").await.unwrap(), [1]);
}
