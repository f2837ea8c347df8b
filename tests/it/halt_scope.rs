//! Who a refusal halts, end to end: Web Push subscriptions made under another VAPID key
//! (the strict loopback push service answers 403 for each of them alone) through the
//! real worker, broker and PostgreSQL. A few such subscriptions are dead-lettered and
//! everything else is delivered; a campaign whose subscriptions are all refused halts
//! alone.

use crate::providers_e2e::{campaign, wait_until, Env, DB_WRITE, GROUP_JOIN};
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use pushpace::provider::settings::{CommonSpec, WebPushSpec};
use pushpace::provider::webpush::vapid::{self, VapidSigner};
use pushpace::provider::webpush::WebPushSender;
use pushpace::provider::ProviderKind;
use pushpace::tools::mock::tls::TestCa;
use pushpace::tools::mock::webpush::WebPushMock;
use secrecy::SecretString;
use std::time::Duration;

/// Jobs of the mostly good campaign, and their subscriptions each.
const JOBS: usize = 4;
const PER_JOB: usize = 500;
/// One subscription in 200 (0.5%) was made under an older key.
const STALE_EVERY: usize = 200;
/// Subscriptions of the campaign whose every subscription is stale.
const ALL_STALE: usize = 60;
/// Sends a second: the 2,000 devices take about 2 s.
const RATE: f64 = 1000.0;
/// After everything is written, the worker is watched this long for a late halt.
const QUIET: Duration = Duration::from_millis(500);

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

async fn halt_reason(env: &Env, campaign: &str) -> Option<String> {
    sqlx::query_scalar::<_, Option<String>>("SELECT halt_reason FROM campaigns WHERE id = $1")
        .bind(campaign)
        .fetch_optional(&env.pool)
        .await
        .expect("campaigns")
        .flatten()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_subscriptions_are_dead_lettered_and_only_an_all_stale_campaign_halts() {
    let ca = TestCa::new();
    let mock = WebPushMock::start(&ca).expect("mock");
    let spec = WebPushSpec {
        name: "webpush".into(),
        vapid_key_pem: vapid_key(),
        vapid_subject: "mailto:ops@example.com".into(),
        vapid_lifetime: vapid::DEFAULT_LIFETIME,
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let sender = WebPushSender::new(&spec).expect("sender");
    let older = VapidSigner::new(&vapid_key(), "mailto:a@b.c", Duration::from_secs(60))
        .expect("older signer");
    let env = Env::start("webpush", ProviderKind::WebPush, sender).await;
    let (good, all_stale) = (campaign("wp-mostly"), campaign("wp-stale"));

    let mut stale_ids = Vec::new();
    for j in 0..JOBS {
        let subs: Vec<String> = (0..PER_JOB)
            .map(|i| {
                if (j * PER_JOB + i) % STALE_EVERY == STALE_EVERY / 2 {
                    let (sub, id) = mock.subscribe_under(older.public_key_b64());
                    stale_ids.push(id);
                    sub
                } else {
                    mock.subscribe().0
                }
            })
            .collect();
        env.produce_raw(&job_text(&format!("{good}-{j}"), &good, &subs))
            .await;
    }
    // Produced after the good campaign's jobs: its halted job holds offsets from 4 on.
    let subs: Vec<String> = (0..ALL_STALE)
        .map(|_| mock.subscribe_under(older.public_key_b64()).0)
        .collect();
    env.produce_raw(&job_text(&format!("{all_stale}-0"), &all_stale, &subs))
        .await;

    let stale = stale_ids.len() as i64;
    let wanted = (JOBS * PER_JOB) as i64 - stale;
    assert_eq!(stale, (JOBS * PER_JOB / STALE_EVERY) as i64);
    wait_until(
        "the good campaign delivered and its offsets committed",
        GROUP_JOIN,
        || async {
            env.counts(&good).await.sent == wanted
                && env.dead_letters(&good).await == stale
                && env.committed().await >= JOBS as i64
        },
    )
    .await;
    wait_until("the stale campaign halted", DB_WRITE, || async {
        halt_reason(&env, &all_stale).await.is_some()
    })
    .await;
    tokio::time::sleep(QUIET).await;

    assert_eq!(
        halt_reason(&env, &good).await,
        None,
        "the good campaign never halted"
    );
    for id in &stale_ids {
        assert!(mock.received(id).is_empty());
    }
    let reasons: Vec<String> = sqlx::query_scalar(
        "SELECT reason FROM dead_letters WHERE campaign_id = $1 ORDER BY device",
    )
    .bind(&good)
    .fetch_all(&env.pool)
    .await
    .expect("dead letters");
    assert_eq!(reasons.len() as i64, stale);
    assert!(
        reasons.iter().all(|r| r.contains("HTTP 403")),
        "{reasons:?}"
    );
    let c = env.counts(&good).await;
    assert_eq!((c.sent, c.rejected, c.retried), (wanted, stale, 0), "{c:?}");

    let reason = halt_reason(&env, &all_stale).await.expect("halted");
    assert!(
        reason.contains(&mock.origin()) && reason.contains("403"),
        "{reason}"
    );
    assert_eq!(env.dead_letters(&all_stale).await, 0, "held for the resume");
    assert_eq!(
        env.committed().await,
        JOBS as i64,
        "the halted job's offset is held"
    );
    assert_eq!(mock.delivered() as i64, wanted);
    env.stop().await;
}

/// FCM devices of one campaign, and which one's app had its APNs certificate refused.
const FCM_DEVICES: usize = 200;
const THIRD_PARTY_AT: usize = 77;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcm_one_third_party_auth_error_is_dead_lettered_and_the_provider_keeps_sending() {
    use pushpace::provider::fcm::FcmSender;
    use pushpace::provider::settings::FcmSpec;
    use pushpace::tools::mock::fcm::FcmMock;
    let ca = TestCa::new();
    let mock = FcmMock::start(&ca).expect("mock");
    let spec = FcmSpec {
        name: "fcm".into(),
        service_account: SecretString::from(mock.service_account_json()),
        endpoint: mock.url(),
        connections: 1,
        token_refresh_margin: Duration::from_secs(60),
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let sender = FcmSender::new(&spec).expect("sender");
    let env = Env::start("fcm", ProviderKind::Fcm, sender).await;
    let c1 = campaign("fcm-3p");
    let devices: Vec<serde_json::Value> = (0..FCM_DEVICES)
        .map(|i| match i {
            THIRD_PARTY_AT => serde_json::json!("thirdparty-1"),
            _ => serde_json::json!(format!("fcm-ok-{i}")),
        })
        .collect();
    let payload = serde_json::json!({"notification": {"title": "Hi"}});
    let job = crate::providers_e2e::job(&c1, "fcm", RATE, &devices, payload);
    env.produce(job).await;
    let wanted = FCM_DEVICES as i64 - 1;
    wait_until(
        "delivered, dead-lettered, committed",
        GROUP_JOIN,
        || async {
            env.counts(&c1).await.sent == wanted
                && env.dead_letters(&c1).await == 1
                && env.committed().await >= 1
        },
    )
    .await;
    assert_eq!(halt_reason(&env, &c1).await, None);
    let reason: String =
        sqlx::query_scalar("SELECT reason FROM dead_letters WHERE campaign_id = $1")
            .bind(&c1)
            .fetch_one(&env.pool)
            .await
            .expect("letter");
    assert!(reason.contains("THIRD_PARTY_AUTH_ERROR"), "{reason}");
    env.stop().await;
}
