//! The FCM adapter against the loopback FCM mock (real TLS, HTTP/2, RS256 assertions
//! and OAuth tokens): delivery and the body FCM receives, each error class, token
//! refresh before expiry, the token endpoint going down and coming back, a revoked
//! token, and `providers check`.

use pushpace::job::{Job, Priority};
use pushpace::provider::fcm::{check, FcmSender};
use pushpace::provider::settings::{CommonSpec, FcmSpec};
use pushpace::sender::{HaltScope, SendOutcome, Sender};
use pushpace::tools::mock::fcm::{FcmMock, FcmMockConfig};
use pushpace::tools::mock::tls::TestCa;
use secrecy::SecretString;
use serde_json::{json, value::RawValue};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

fn spec(ca: &TestCa, mock: &FcmMock, margin: Duration, timeout: Duration) -> FcmSpec {
    FcmSpec {
        name: "fcm-test".into(),
        service_account: SecretString::from(mock.service_account_json()),
        endpoint: mock.url(),
        connections: 2,
        token_refresh_margin: margin,
        common: CommonSpec {
            timeout,
            ..CommonSpec::trusting(ca.ca_pem())
        },
    }
}

fn job(devices: &[&str], payload: &str) -> Arc<Job> {
    let payload = RawValue::from_string(payload.to_string()).expect("payload JSON");
    let devices = devices.iter().map(|d| d.to_string()).collect();
    Arc::new(Job::new("j1", "c1", devices, payload).expect("job"))
}

const PAYLOAD: &str = r#"{"notification":{"title":"Hi"},"data":{"k":"v"}}"#;

/// A mock and a sender for it (timeouts of 2 s: loopback answers in milliseconds).
async fn setup(config: FcmMockConfig, margin: Duration) -> (TestCa, FcmMock, FcmSender) {
    let ca = TestCa::new();
    let mock = FcmMock::start_with(&ca, config).expect("mock starts");
    let sender =
        FcmSender::new(&spec(&ca, &mock, margin, Duration::from_secs(2))).expect("sender builds");
    (ca, mock, sender)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_with_the_body_fcm_expects() {
    let (_ca, mock, sender) = setup(FcmMockConfig::default(), Duration::from_secs(300)).await;
    assert_eq!(sender.name(), "fcm");
    let mut j = job(&["dev-1"], PAYLOAD);
    {
        let j = Arc::get_mut(&mut j).expect("unique");
        j.options.priority = Some(Priority::High);
        j.options.ttl_s = Some(60);
        j.options.collapse_id = Some("news".into());
    }
    assert_eq!(sender.send(&j, 0).await, SendOutcome::Delivered);
    assert_eq!(mock.delivered("dev-1"), 1);
    assert_eq!(mock.grants(), 1);
    let expected = json!({"message": {"token": "dev-1", "notification": {"title": "Hi"},
        "data": {"k": "v"},
        "android": {"priority": "HIGH", "ttl": "60s", "collapse_key": "news"}}});
    assert_eq!(mock.bodies(), vec![expected]);

    // The producer's own android block is sent as it is, options notwithstanding.
    let mut own = job(&["dev-2"], r#"{"android":{"priority":"NORMAL"}}"#);
    Arc::get_mut(&mut own).expect("unique").options.priority = Some(Priority::High);
    assert_eq!(sender.send(&own, 0).await, SendOutcome::Delivered);
    let last = mock.bodies().pop().expect("second body");
    assert_eq!(
        last,
        json!({"message": {"token": "dev-2", "android": {"priority": "NORMAL"}}})
    );
    // The token was reused: one grant for both sends.
    assert_eq!(mock.grants(), 1);
    // The access token (the mock's start with "ya29.") is never in Debug output.
    let shown = format!("{sender:?}");
    assert!(!shown.contains("ya29"), "{shown}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_error_maps_to_its_class() {
    let (_ca, mock, sender) = setup(FcmMockConfig::default(), Duration::from_secs(300)).await;
    let devices = [
        "unreg-1",
        "quota-1",
        "unavail-1",
        "internal-1",
        "mismatch-1",
        "badtoken-1",
        "thirdparty-1",
    ];
    let j = job(&devices, PAYLOAD);
    let mut got = Vec::new();
    for i in 0..devices.len() {
        got.push(sender.send(&j, i).await);
    }
    assert!(
        matches!(&got[0], SendOutcome::DeadToken { reason } if reason.starts_with("FCM 404 UNREGISTERED: ")),
        "{:?}",
        got[0]
    );
    // retry-after 120 from the mock; never sooner than Google's minute.
    assert!(
        matches!(&got[1], SendOutcome::RetryProvider { after: Some(a), .. } if *a == Duration::from_secs(120)),
        "{:?}",
        got[1]
    );
    assert!(
        matches!(&got[2], SendOutcome::RetryProvider { after: Some(a), .. } if *a == Duration::from_secs(7)),
        "{:?}",
        got[2]
    );
    assert!(
        matches!(&got[3], SendOutcome::RetryProvider { after: None, .. }),
        "{:?}",
        got[3]
    );
    assert!(
        matches!(
            &got[4],
            SendOutcome::Mismatch {
                dead_token: false,
                ..
            }
        ),
        "{:?}",
        got[4]
    );
    assert!(
        matches!(&got[5], SendOutcome::DeadToken { .. }),
        "{:?}",
        got[5]
    );
    assert!(
        matches!(
            &got[6],
            SendOutcome::Halt {
                scope: HaltScope::Majority,
                ..
            }
        ),
        "{:?}",
        got[6]
    );
    assert_eq!(mock.sends(), devices.len() as u64);
    // A forced error applies to every token.
    mock.force_error(Some(pushpace::tools::mock::fcm::FcmError::Unregistered));
    let ok = job(&["fine-1"], PAYLOAD);
    assert!(matches!(
        sender.send(&ok, 0).await,
        SendOutcome::DeadToken { .. }
    ));
    mock.force_error(None);
    assert_eq!(sender.send(&ok, 0).await, SendOutcome::Delivered);
}

/// FCM refuses a `data` value that is not a string (why job validation checks it):
/// the message itself is wrong, so the campaign halts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_value_that_is_not_a_string_is_refused() {
    let (_ca, mock, sender) = setup(FcmMockConfig::default(), Duration::from_secs(300)).await;
    let j = job(&["dev-1"], r#"{"data":{"count":3}}"#);
    match sender.send(&j, 0).await {
        SendOutcome::Halt {
            scope: HaltScope::Campaign,
            reason,
        } => assert!(reason.starts_with("FCM 400 INVALID_ARGUMENT: "), "{reason}"),
        other => panic!("expected a campaign halt, got {other:?}"),
    }
    assert_eq!(mock.sends(), 1);
    assert_eq!(mock.delivered("dev-1"), 0);
}

/// Tokens living 3 s, refreshed 1 s before expiry: sending without pause across about
/// three lifetimes (8 s) never fails and never sees a 401, and the refresher was
/// granted a token at least twice more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_is_refreshed_before_expiry_without_failed_sends() {
    let config = FcmMockConfig {
        expires_in: Duration::from_secs(3),
        ..Default::default()
    };
    let (_ca, mock, sender) = setup(config, Duration::from_secs(1)).await;
    let j = job(&["dev-1"], PAYLOAD);
    let until = Instant::now() + Duration::from_secs(8);
    let (mut sent, mut failed) = (0u64, Vec::new());
    while Instant::now() < until {
        let outcome = sender.send(&j, 0).await;
        sent += 1;
        if !outcome.is_delivered() {
            failed.push(outcome);
        }
    }
    assert!(failed.is_empty(), "failed sends: {failed:?}");
    assert!(mock.grants() >= 3, "grants {}", mock.grants());
    assert_eq!(mock.unauthenticated(), 0);
    assert_eq!(mock.delivered("dev-1"), sent);
}

/// The token endpoint goes down: sends go on with the current token, then (once it has
/// expired) become RetryProvider, never a halt or a rejection; when the endpoint is
/// back, sends are delivered again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn token_endpoint_down_means_retry_then_recovery() {
    let config = FcmMockConfig {
        expires_in: Duration::from_secs(2),
        ..Default::default()
    };
    let ca = TestCa::new();
    let mock = FcmMock::start_with(&ca, config).expect("mock");
    // Sends wait at most 500 ms for a token, so the outage shows quickly.
    let sender = FcmSender::new(&spec(
        &ca,
        &mock,
        Duration::from_secs(1),
        Duration::from_millis(500),
    ))
    .expect("sender");
    let j = job(&["dev-1"], PAYLOAD);
    assert_eq!(sender.send(&j, 0).await, SendOutcome::Delivered);
    mock.set_token_endpoint_down(true);
    // The granted token lives 2 s: within 6 s the sends must have turned to retries.
    let first_retry = drive_until(&sender, &j, Duration::from_secs(6), |o| {
        matches!(o, SendOutcome::RetryProvider { .. })
    })
    .await;
    match first_retry {
        SendOutcome::RetryProvider { reason, .. } => {
            assert!(
                reason.starts_with("FCM token endpoint unavailable: "),
                "{reason}"
            )
        }
        other => panic!("{other:?}"),
    }
    assert!(mock.token_refusals() >= 1);
    mock.set_token_endpoint_down(false);
    // The refresher backs off at most a few seconds after so short an outage.
    let back = drive_until(&sender, &j, Duration::from_secs(15), |o| o.is_delivered()).await;
    assert_eq!(back, SendOutcome::Delivered);
}

/// Sends until `done` holds (panics after `limit`); every outcome on the way must be
/// Delivered or RetryProvider.
async fn drive_until(
    sender: &FcmSender,
    j: &Arc<Job>,
    limit: Duration,
    done: impl Fn(&SendOutcome) -> bool,
) -> SendOutcome {
    let until = Instant::now() + limit;
    while Instant::now() < until {
        let outcome = sender.send(j, 0).await;
        if done(&outcome) {
            return outcome;
        }
        assert!(
            matches!(
                outcome,
                SendOutcome::Delivered | SendOutcome::RetryProvider { .. }
            ),
            "unexpected {outcome:?}"
        );
        // Pace the loop: a retry answers at once once the token is known to be missing.
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("no such outcome within {limit:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_revoked_token_is_refreshed_once_and_the_send_succeeds() {
    let (_ca, mock, sender) = setup(FcmMockConfig::default(), Duration::from_secs(300)).await;
    let j = job(&["dev-1"], PAYLOAD);
    assert_eq!(sender.send(&j, 0).await, SendOutcome::Delivered);
    mock.revoke_tokens();
    assert_eq!(sender.send(&j, 0).await, SendOutcome::Delivered);
    assert_eq!(mock.grants(), 2);
    assert_eq!(mock.unauthenticated(), 1);
    assert_eq!(mock.delivered("dev-1"), 2);
    // 401 even with a fresh token: the provider halts, after exactly one refresh.
    mock.set_deny_all_tokens(true);
    match sender.send(&j, 0).await {
        SendOutcome::Halt {
            scope: HaltScope::Provider,
            reason,
        } => assert!(reason.contains("401 UNAUTHENTICATED"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(mock.grants(), 3);
    assert_eq!(mock.unauthenticated(), 3);
}

/// A service account whose key the token endpoint does not know: refused, so the
/// provider halts (a configuration error, not an outage).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_key_the_token_endpoint_refuses_halts_the_provider() {
    let ca = TestCa::new();
    let mock = FcmMock::start(&ca).expect("mock");
    let other = FcmMock::start(&ca).expect("a second mock, with another key");
    let mut s = spec(&ca, &mock, Duration::from_secs(300), Duration::from_secs(2));
    // The other mock's key, this mock's token_uri and client.
    let mut account: serde_json::Value =
        serde_json::from_str(&other.service_account_json()).expect("json");
    account["token_uri"] = json!(mock.token_uri());
    account["client_email"] = json!("sender@pushpace-mock.iam.gserviceaccount.com");
    s.service_account = SecretString::from(account.to_string());
    let sender = FcmSender::new(&s).expect("sender");
    match sender.send(&job(&["dev-1"], PAYLOAD), 0).await {
        SendOutcome::Halt {
            scope: HaltScope::Provider,
            reason,
        } => assert!(reason.contains("invalid_grant"), "{reason}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(mock.grants(), 0);
    assert_eq!(mock.sends(), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_check_gets_a_token_and_opens_http2_without_sending() {
    let ca = TestCa::new();
    let mock = FcmMock::start(&ca).expect("mock");
    let report = check(&spec(
        &ca,
        &mock,
        Duration::from_secs(300),
        Duration::from_secs(2),
    ))
    .await
    .expect("check passes");
    assert!(report.contains("HTTP/2"), "{report}");
    assert!(!report.contains("ya29"), "the token is not shown: {report}");
    assert_eq!(mock.grants(), 1);
    assert_eq!(mock.sends(), 0);
    // With the token endpoint down, check says so.
    mock.set_token_endpoint_down(true);
    let err = check(&spec(
        &ca,
        &mock,
        Duration::from_secs(300),
        Duration::from_secs(2),
    ))
    .await
    .expect_err("token endpoint down")
    .to_string();
    assert!(err.contains("503"), "{err}");
}
