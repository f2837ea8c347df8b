//! APNs through the worker: dead tokens recorded and skipped, a device-level 429, a halt
//! and its resume, and GOAWAYs mid-campaign.

use super::{campaign, job, wait_until, Env, DB_WRITE, GROUP_JOIN};
use pushpace::provider::apns::ApnsSender;
use pushpace::provider::h2pool::H2Pool;
use pushpace::provider::settings::{ApnsEnvironment, ApnsSpec, CommonSpec};
use pushpace::provider::ProviderKind;
use pushpace::store::campaigns::{set_status, CampaignStatus};
use pushpace::tools::mock::apns::{ApnsMock, MockApnsConfig};
use pushpace::tools::mock::tls::TestCa;
use secrecy::SecretString;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;

const TEAM: &str = "TEAM123456";
const KEY_ID: &str = "KEY1234567";
const TOPIC: &str = "com.example.app";

/// The worker sending through a fresh APNs mock (its config tuned by `tune`).
async fn start(tune: impl FnOnce(&mut MockApnsConfig)) -> (ApnsMock, Env) {
    let (mock, env, _) = start_with_pool(tune).await;
    (mock, env)
}

/// [`start`], and the sender's connection pool (its transport counts).
async fn start_with_pool(tune: impl FnOnce(&mut MockApnsConfig)) -> (ApnsMock, Env, Arc<H2Pool>) {
    let ca = TestCa::new();
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    let mut config = MockApnsConfig::new(TEAM, KEY_ID, &pair.public_key_pem(), TOPIC);
    tune(&mut config);
    let mock = ApnsMock::start(&ca, config).expect("mock");
    let spec = ApnsSpec {
        name: "apns".into(),
        team_id: TEAM.into(),
        key_id: KEY_ID.into(),
        key_pem: SecretString::from(pair.serialize_pem()),
        topic: TOPIC.into(),
        environment: ApnsEnvironment::Sandbox,
        endpoint: mock.url(),
        connections: 2,
        token_refresh: Duration::from_secs(50 * 60),
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let sender = ApnsSender::new(&spec).expect("sender");
    let pool = Arc::clone(sender.pool());
    let env = Env::start("apns", ProviderKind::Apns, sender).await;
    (mock, env, pool)
}

/// `n` 64-hex-digit tokens starting with `prefix` (the mock's error markers; `f…` is no
/// marker).
fn tokens(prefix: &str, n: usize) -> Vec<String> {
    (0..n)
        .map(|_| {
            let mut t = prefix.to_string();
            while t.len() < 64 {
                t.push(char::from_digit(fastrand::u32(0..16), 16).unwrap_or('0'));
            }
            t
        })
        .collect()
}

fn apns_job(campaign: &str, rate: f64, devices: &[String]) -> Value {
    let devices: Vec<Value> = devices.iter().map(|d| json!(d)).collect();
    job(
        campaign,
        "apns",
        rate,
        &devices,
        json!({"aps": {"alert": "hi"}}),
    )
}

/// Every token in `tokens` was delivered exactly `n` times.
fn all_delivered(mock: &ApnsMock, tokens: &[String], n: u32) -> bool {
    let seen = mock.controls().delivered_tokens();
    tokens.iter().all(|t| seen.get(t) == Some(&n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_tokens_are_recorded_and_a_second_campaign_skips_them() {
    let (mock, env) = start(|_| {}).await;
    let good = tokens("f0", 10);
    let mut dead = tokens("410a", 4);
    dead.extend(tokens("410e", 2));
    let all: Vec<String> = dead.iter().chain(&good).cloned().collect();
    let c1 = campaign("dead1");
    env.produce(apns_job(&c1, 100.0, &all)).await;
    wait_until("campaign 1 delivered", GROUP_JOIN, || async {
        all_delivered(&mock, &good, 1)
    })
    .await;
    wait_until("6 tokens recorded, all counted", DB_WRITE, || async {
        let c = env.counts(&c1).await;
        env.invalid_tokens().await == 6 && c.invalid == 6 && c.sent == 10
    })
    .await;
    let c = env.counts(&c1).await;
    assert_eq!((c.failed, c.retried, c.rejected), (0, 0, 0), "{c:?}");
    assert_eq!(env.dead_letters(&c1).await, 0);
    // The worker's filter has them (reloaded every 200 ms) before campaign 2 starts.
    let hygiene = env.worker().hygiene.clone();
    let hygiene = hygiene.expect("hygiene enabled");
    wait_until("the filter to hold the dead tokens", DB_WRITE, || async {
        dead.iter().all(|t| {
            let scope = pushpace::hygiene::Scope::new("apns");
            let key = scope.key(&pushpace::hygiene::token_hash(t));
            hygiene.filter().may_contain(key)
        })
    })
    .await;

    let c2 = campaign("dead2");
    env.produce(apns_job(&c2, 100.0, &all)).await;
    wait_until("campaign 2 delivered and counted", DB_WRITE, || async {
        let c = env.counts(&c2).await;
        all_delivered(&mock, &good, 2) && c.sent == 10 && c.skipped_invalid == 6
    })
    .await;
    let c = env.counts(&c2).await;
    assert_eq!((c.invalid, c.failed), (0, 0), "{c:?}");
    let controls = mock.controls();
    // One request per dead token, all from campaign 1.
    assert_eq!(
        controls.answers("Unregistered") + controls.answers("ExpiredToken"),
        6
    );
    assert_eq!(controls.requests(), 6 + 10 + 10);
    env.stop().await;
}

/// DeviceTokenNotForTopic (another app's token) and a minority BadDeviceToken (the other
/// environment's) are rejected for this campaign, each a letter, and the tokens are not
/// marked dead: a second campaign sends them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_topic_and_environment_tokens_are_rejected_not_dead() {
    let (mock, env) = start(|_| {}).await;
    let good = tokens("f0", 20);
    let other_app = tokens("400d", 1);
    let other_env = tokens("400b", 1);
    let all: Vec<String> = other_app
        .iter()
        .chain(&other_env)
        .chain(&good)
        .cloned()
        .collect();
    let c1 = campaign("topic1");
    env.produce(apns_job(&c1, 100.0, &all)).await;
    wait_until("campaign 1 answered and counted", GROUP_JOIN, || async {
        let c = env.counts(&c1).await;
        all_delivered(&mock, &good, 1) && c.sent == 20 && c.rejected == 2
    })
    .await;
    wait_until("two letters", DB_WRITE, || async {
        env.dead_letters(&c1).await == 2
    })
    .await;
    let reasons: Vec<(String, String)> = sqlx::query_as(
        "SELECT device_token, reason FROM dead_letters WHERE campaign_id = $1 ORDER BY device",
    )
    .bind(&c1)
    .fetch_all(&env.pool)
    .await
    .unwrap();
    assert_eq!(reasons[0].0, other_app[0]);
    assert!(
        reasons[0].1.contains("DeviceTokenNotForTopic"),
        "{reasons:?}"
    );
    assert_eq!(reasons[1].0, other_env[0]);
    assert!(reasons[1].1.contains("BadDeviceToken"), "{reasons:?}");
    assert_eq!(env.invalid_tokens().await, 0, "neither token is dead");
    assert_eq!(env.counts(&c1).await.invalid, 0);

    let c2 = campaign("topic2");
    env.produce(apns_job(&c2, 100.0, &all)).await;
    wait_until("campaign 2 answered", DB_WRITE, || async {
        let c = env.counts(&c2).await;
        all_delivered(&mock, &good, 2) && c.rejected == 2
    })
    .await;
    let c = env.counts(&c2).await;
    assert_eq!(c.skipped_invalid, 0, "{c:?}");
    let controls = mock.controls();
    assert_eq!(controls.answers("DeviceTokenNotForTopic"), 2, "sent again");
    assert_eq!(controls.answers("BadDeviceToken"), 2, "sent again");
    env.stop().await;
}

/// Sends of the 429 token answered 429 (`retry-after: 1` each) before it is accepted.
const TOO_MANY: u32 = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_429_delays_only_that_device() {
    let (mock, env) = start(|c| c.too_many_attempts = TOO_MANY).await;
    let slow = tokens("429c", 1).remove(0);
    let others = tokens("f1", 30);
    // The 429 device first: the others take 1.5 s at 20/s, it at least TOO_MANY s.
    let all: Vec<String> = std::iter::once(slow.clone())
        .chain(others.clone())
        .collect();
    let c1 = campaign("tmr");
    env.produce(apns_job(&c1, 20.0, &all)).await;
    wait_until("every device delivered", GROUP_JOIN, || async {
        all_delivered(&mock, &all, 1)
    })
    .await;
    let order: Vec<String> = mock
        .controls()
        .delivered()
        .into_iter()
        .map(|p| p.token)
        .collect();
    assert_eq!(order.len(), all.len(), "each device delivered once");
    assert_eq!(order.last(), Some(&slow), "the 429 device came last");
    assert_eq!(
        mock.controls().answers("TooManyRequests"),
        u64::from(TOO_MANY)
    );
    // A device's 429 is not the provider's: the adaptive ceiling never moved.
    let lane = env.lane();
    assert!(lane.adaptive, "{lane:?}");
    assert_eq!((lane.state, lane.ceiling), ("clear", None), "{lane:?}");
    assert!(lane.congestion.values().all(|n| *n == 0), "{lane:?}");
    wait_until("the counts flushed", DB_WRITE, || async {
        env.counts(&c1).await.sent == all.len() as i64
    })
    .await;
    let c = env.counts(&c1).await;
    assert_eq!(c.retried, i64::from(TOO_MANY), "{c:?}");
    assert_eq!((c.failed, c.invalid, c.rejected), (0, 0, 0), "{c:?}");
    env.stop().await;
}

/// The campaign must not have sent more than this before it halts (the bound;
/// the scheduler probes with at most 4 in flight).
const HALT_WITHIN: u64 = 10;

/// How long the test watches a halted campaign stay quiet: 2 s is twice the watcher's
/// period and 40 sends at the campaign's rate.
const QUIET: Duration = Duration::from_secs(2);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_halt_stops_the_campaign_and_resume_delivers_each_device_once() {
    let (mock, env) = start(|_| {}).await;
    let controls = mock.controls().clone();
    controls.set_forced_reason(Some((403, "InvalidProviderToken")));
    let devices = tokens("f2", 30);
    let c1 = campaign("halt");
    env.produce(apns_job(&c1, 20.0, &devices)).await;
    let status = || async {
        sqlx::query_as::<_, (String, Option<String>)>(
            "SELECT status, halt_reason FROM campaigns WHERE id = $1",
        )
        .bind(&c1)
        .fetch_optional(&env.pool)
        .await
        .expect("campaign row")
    };
    wait_until("the campaign halted", GROUP_JOIN, || async {
        status().await.is_some_and(|(s, _)| s == "halted")
    })
    .await;
    let (_, reason) = status().await.expect("row");
    assert!(reason.is_some_and(|r| r.contains("InvalidProviderToken")));
    let failed = controls.requests();
    assert!(failed <= HALT_WITHIN, "{failed} sends before the halt");
    // Not a synchronisation: the campaign must stay quiet while halted.
    tokio::time::sleep(QUIET).await;
    assert_eq!(controls.requests(), failed, "sends while halted");
    assert_eq!(env.dead_letters(&c1).await, 0);
    assert!(env.committed().await < 1, "a halted job's offset is held");

    controls.set_forced_reason(None);
    set_status(&env.pool, &c1, CampaignStatus::Active)
        .await
        .expect("resume");
    wait_until("every device delivered after resume", DB_WRITE, || async {
        all_delivered(&mock, &devices, 1)
    })
    .await;
    wait_until(
        "the counts flushed and offset committed",
        DB_WRITE,
        || async { env.counts(&c1).await.sent == 30 && env.committed().await >= 1 },
    )
    .await;
    assert_eq!(controls.delivered().len(), 30, "no device twice");
    assert_eq!(controls.requests(), failed + 30);
    let c = env.counts(&c1).await;
    assert_eq!((c.failed, c.rejected, c.invalid), (0, 0, 0), "{c:?}");
    assert_eq!(env.dead_letters(&c1).await, 0);
    env.stop().await;
}

/// GOAWAY after this many streams on each connection: 600 devices at 20,000/s (all in
/// flight together) make at least 5 GOAWAYs, with streams in flight above each one's
/// last stream id (refused, never processed: 85 to 301 per run when this was written).
const GOAWAY_AFTER: u64 = 100;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn goaway_mid_campaign_loses_nothing_and_sends_nothing_twice() {
    let (mock, env, pool) = start_with_pool(|_| {}).await;
    let server = mock.server().controls();
    server.set_goaway_after_streams(Some(GOAWAY_AFTER));
    let devices = tokens("f3", 600);
    let c1 = campaign("goaway");
    env.produce(apns_job(&c1, 20000.0, &devices)).await;
    wait_until("every device delivered", GROUP_JOIN, || async {
        mock.controls().delivered().len() >= devices.len()
    })
    .await;
    wait_until("the counts flushed", DB_WRITE, || async {
        env.counts(&c1).await.sent >= devices.len() as i64
    })
    .await;
    let seen = mock.controls().delivered_tokens();
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
    // What the transport and the scheduler did, for a failure to be read from.
    let transport = pool.transport_counts();
    let what = format!(
        "{} GOAWAYs, {} streams refused, {} connections, {} requests handled; {:?}; {transport:?}; first lost: {:?}; server's first connection error: {:?}",
        server.goaways(),
        server.refused_streams(),
        server.connections(),
        mock.controls().requests(),
        env.counts(&c1).await,
        pool.first_lost_reason(),
        server.first_connection_error()
    );
    assert!(twice.is_empty(), "sent more than once: {twice:?}; {what}");
    // Every stream the server did not answer was one it said it never processed: no
    // send had to be sent again on a guess.
    assert_eq!((transport.lost, transport.timed_out), (0, 0), "{what}");
    assert!(transport.resent > 0, "nothing was resent: {what}");
    assert!(all_delivered(&mock, &devices, 1), "a device lost");
    // The handler saw each request once: refused streams never reach it.
    assert_eq!(mock.controls().requests(), devices.len() as u64);
    let (goaways, refused) = (server.goaways(), server.refused_streams());
    assert!(goaways >= 5, "only {goaways} GOAWAYs");
    assert!(
        refused > 0,
        "no stream was refused: the resend path was not used"
    );
    let c = env.counts(&c1).await;
    eprintln!("{goaways} GOAWAYs, {refused} streams refused; {c:?}; {transport:?}");
    assert_eq!(c.sent, devices.len() as i64, "{c:?}");
    // `retried` may count sends the transport gave up resending after 4 refusals (the
    // scheduler sent them again); none failed, none was processed twice.
    assert_eq!((c.failed, c.rejected, c.invalid), (0, 0, 0), "{c:?}");
    env.stop().await;
}

/// A campaign's `expires_at` becomes `apns-expiration` of a job that sets none, and
/// bounds a job's later `expiration`; a job's earlier one stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_campaign_expiry_sets_apns_expiration() {
    use pushpace::store::campaigns::{put, CampaignDefaults, CampaignPatch};
    let (mock, env) = start(|_| {}).await;
    let c = campaign("exp");
    let expires = chrono::Utc::now() + chrono::Duration::hours(1);
    let patch = CampaignPatch {
        send_rate: Some(100.0),
        expires_at: Some(Some(expires)),
        ..Default::default()
    };
    put(&env.pool, &c, &patch, &CampaignDefaults::default())
        .await
        .expect("campaign stored");
    let (none, later, earlier) = (tokens("f1", 3), tokens("f2", 3), tokens("f3", 3));
    let mut with_later = apns_job(&c, 100.0, &later);
    with_later["expiration"] = json!(expires.timestamp() + 600);
    let mut with_earlier = apns_job(&c, 100.0, &earlier);
    with_earlier["expiration"] = json!(expires.timestamp() - 600);
    for j in [apns_job(&c, 100.0, &none), with_later, with_earlier] {
        env.produce(j).await;
    }
    let all: Vec<String> = none.iter().chain(&later).chain(&earlier).cloned().collect();
    wait_until("every device delivered", GROUP_JOIN, || async {
        all_delivered(&mock, &all, 1)
    })
    .await;
    for push in mock.controls().delivered() {
        let want = if earlier.contains(&push.token) {
            expires.timestamp() - 600
        } else {
            expires.timestamp()
        };
        assert_eq!(push.expiration, Some(want), "{}", push.token);
    }
    env.stop().await;
}
