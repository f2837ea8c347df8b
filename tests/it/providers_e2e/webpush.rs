//! Web Push through the worker: the mock decrypts every message with the subscription's
//! own keys, as the browser would, and the plaintext is the job's payload.

use super::{campaign, wait_until, Env, DB_WRITE, GROUP_JOIN};
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use pushpace::provider::settings::{CommonSpec, WebPushSpec};
use pushpace::provider::webpush::{vapid, WebPushSender};
use pushpace::provider::ProviderKind;
use pushpace::tools::mock::tls::TestCa;
use pushpace::tools::mock::webpush::WebPushMock;
use secrecy::SecretString;

/// Two payloads as producers write them: a JSON string (its contents are the message)
/// and an object (its exact text is the message, spacing included).
const STRING_PAYLOAD: (&str, &str) = (r#""Hi \"there\" \u00e9""#, "Hi \"there\" é");
const OBJECT_PAYLOAD: &str = r#"{"title": "Sale",  "n": [1, 2.50]}"#;
const PER_JOB: usize = 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn webpush_plaintext_decrypts_to_the_jobs_payload() {
    let ca = TestCa::new();
    let mock = WebPushMock::start(&ca).expect("mock");
    let key = p256::SecretKey::random(&mut aes_gcm::aead::OsRng);
    let pem = key.to_pkcs8_pem(LineEnding::LF).expect("pem").to_string();
    let spec = WebPushSpec {
        name: "webpush".into(),
        vapid_key_pem: SecretString::from(pem),
        vapid_subject: "mailto:ops@example.com".into(),
        vapid_lifetime: vapid::DEFAULT_LIFETIME,
        common: CommonSpec::trusting(ca.ca_pem()),
    };
    let sender = WebPushSender::new(&spec).expect("sender");
    let env = Env::start("webpush", ProviderKind::WebPush, sender).await;
    let c1 = campaign("wp");
    let (subs_a, ids_a): (Vec<String>, Vec<String>) =
        (0..PER_JOB).map(|_| mock.subscribe()).unzip();
    let (subs_b, ids_b): (Vec<String>, Vec<String>) =
        (0..PER_JOB).map(|_| mock.subscribe()).unzip();
    for (n, (subs, payload)) in [(subs_a, STRING_PAYLOAD.0), (subs_b, OBJECT_PAYLOAD)]
        .into_iter()
        .enumerate()
    {
        // Raw text, so that the payload reaches the worker byte for byte.
        let text = format!(
            r#"{{"job_id":"{c1}-{n}","campaign_id":"{c1}","provider":"webpush","send_rate":50,"devices":[{}],"payload":{payload}}}"#,
            subs.join(",")
        );
        env.produce_raw(&text).await;
    }
    let ids: Vec<&String> = ids_a.iter().chain(&ids_b).collect();
    wait_until("every subscription received", GROUP_JOIN, || async {
        ids.iter().all(|id| !mock.received(id).is_empty())
    })
    .await;
    for id in &ids_a {
        assert_eq!(
            mock.received(id),
            vec![STRING_PAYLOAD.1.as_bytes().to_vec()]
        );
    }
    for id in &ids_b {
        assert_eq!(mock.received(id), vec![OBJECT_PAYLOAD.as_bytes().to_vec()]);
    }
    wait_until("the counts flushed", DB_WRITE, || async {
        env.counts(&c1).await.sent == 2 * PER_JOB as i64
    })
    .await;
    let c = env.counts(&c1).await;
    assert_eq!((c.failed, c.retried, c.invalid), (0, 0, 0), "{c:?}");
    assert_eq!(mock.requests().len(), 2 * PER_JOB, "one request each");
    env.stop().await;
}
