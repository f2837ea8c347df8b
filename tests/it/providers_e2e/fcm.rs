//! FCM through the worker: access tokens that expire every few seconds are refreshed in
//! the background, so a campaign outliving several of them never has a send refused.

use super::{campaign, job, wait_until, Env, DB_WRITE, GROUP_JOIN};
use pushpace::provider::fcm::FcmSender;
use pushpace::provider::settings::{CommonSpec, FcmSpec};
use pushpace::provider::ProviderKind;
use pushpace::tools::mock::fcm::{FcmMock, FcmMockConfig};
use pushpace::tools::mock::tls::TestCa;
use secrecy::SecretString;
use serde_json::{json, Value};
use std::time::Duration;

/// The mock's access token lifetime, and how long before expiry the sender refreshes.
const TOKEN_LIFE: Duration = Duration::from_secs(4);
const MARGIN: Duration = Duration::from_secs(1);
/// 100 devices at 10/s: about 10 s of sending, 2.5 token lifetimes.
const DEVICES: usize = 100;
const RATE: f64 = 10.0;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fcm_tokens_are_refreshed_without_a_failed_send() {
    let ca = TestCa::new();
    let config = FcmMockConfig {
        expires_in: TOKEN_LIFE,
        ..FcmMockConfig::default()
    };
    let mock = FcmMock::start_with(&ca, config).expect("mock");
    let spec = FcmSpec {
        name: "fcm".into(),
        service_account: SecretString::from(mock.service_account_json()),
        endpoint: mock.url(),
        connections: 2,
        token_refresh_margin: MARGIN,
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let env = Env::start(
        "fcm",
        ProviderKind::Fcm,
        FcmSender::new(&spec).expect("sender"),
    )
    .await;
    let devices: Vec<String> = (0..DEVICES).map(|i| format!("fcm-device-{i}")).collect();
    let values: Vec<Value> = devices.iter().map(|d| json!(d)).collect();
    let c1 = campaign("fcm");
    let payload = json!({"notification": {"title": "Hi"}, "data": {"k": "v"}});
    env.produce(job(&c1, "fcm", RATE, &values, payload)).await;
    // The sends alone take DEVICES / RATE = 10 s.
    wait_until("every device delivered", GROUP_JOIN, || async {
        devices.iter().all(|d| mock.delivered(d) >= 1)
    })
    .await;
    wait_until("the counts flushed", DB_WRITE, || async {
        env.counts(&c1).await.sent == DEVICES as i64
    })
    .await;
    assert!(
        devices.iter().all(|d| mock.delivered(d) == 1),
        "a device twice"
    );
    assert_eq!(
        mock.sends(),
        DEVICES as u64,
        "every send accepted first time"
    );
    assert_eq!(mock.unauthenticated(), 0, "a send with an expired token");
    let c = env.counts(&c1).await;
    assert_eq!((c.retried, c.failed, c.rejected), (0, 0, 0), "{c:?}");
    // The sends spanned more than two token lifetimes, and tokens were renewed meanwhile.
    let span: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM max(second) - min(second))::float8 \
         FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(&c1)
    .fetch_one(&env.pool)
    .await
    .expect("span");
    assert!(
        span > 2.0 * TOKEN_LIFE.as_secs_f64(),
        "sent over {span} s only"
    );
    let grants = mock.grants();
    assert!(grants >= 3, "{grants} token grants in {span} s");
    env.stop().await;
}
