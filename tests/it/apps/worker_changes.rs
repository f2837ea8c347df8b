//! Apps changing while they send, through the real worker (broker, PostgreSQL, the APNs
//! and FCM mocks over TLS):
//!
//! - rotating an app's APNs key (to another key and team's APNs) and its FCM service
//!   account (to another project) mid-campaign: no send fails, none is repeated;
//! - one app's FCM quota (429 QUOTA_EXCEEDED) slows that app alone;
//! - a master-key rotation while sending: nothing is rebuilt (one JWT signed), nothing
//!   fails;
//! - a corrupted secret row halts only that app, and a new PUT resumes it.

use super::flip_a_sealed_bit;
use super::worker::{app_job, app_job_of, rig_with, tokens, Rig, Team};
use crate::helpers::wait_for;
use pushpace::apps::{AppKind, Keyring, MasterKey};
use pushpace::tools::mock::fcm::{FcmError, FcmMock};
use serde_json::{json, Value};
use std::time::{Duration, Instant};

async fn rig() -> Rig {
    let key = MasterKey::generate().to_base64().to_string();
    rig_with(&[("apps.master_key", key)]).await
}

fn fcm_body(mock: &FcmMock) -> Value {
    let account: Value = serde_json::from_str(&mock.service_account_json()).unwrap();
    json!({"service_account": account, "endpoint": mock.url()})
}

/// Sends of the undeliverable and the failed kind for `campaign`: both must stay 0.
async fn failures(r: &Rig, campaign: &str) -> (i64, usize) {
    let failed: i64 = sqlx::query_scalar(
        "SELECT coalesce(sum(failed), 0)::int8 FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(campaign)
    .fetch_one(&r.worker.pool)
    .await
    .unwrap();
    (failed, r.letters("undeliverable").await.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_an_apns_key_and_an_fcm_account_while_sending_loses_and_repeats_nothing() {
    let r = rig().await;
    let (old_apns, new_apns) = (
        Team::start(&r.ca, "TEAMAAAAAA", "KEYAAAAAAA"),
        Team::start(&r.ca, "TEAMAAAAAA", "KEYNEWNEWN"),
    );
    let (old_fcm, new_fcm) = (
        FcmMock::start(&r.ca).unwrap(),
        FcmMock::start(&r.ca).unwrap(),
    );
    let body = |apns: &Team, fcm: &FcmMock| {
        let mut b: Value = serde_json::from_str(&apns.body()).unwrap();
        b["fcm"] = fcm_body(fcm);
        b.to_string()
    };
    r.put("rot", &body(&old_apns, &old_fcm)).await;
    let apns_tokens = tokens("aaaa", 300);
    let fcm_tokens: Vec<String> = (0..300).map(|i| format!("fcm-dev-{i}")).collect();
    r.produce(&app_job(
        "ja",
        "rot-apns",
        "rot",
        100.0,
        apns_tokens.clone(),
    ))
    .await;
    r.produce(&app_job_of(
        "fcm",
        "jf",
        "rot-fcm",
        "rot",
        100.0,
        fcm_tokens.clone(),
    ))
    .await;
    wait_for(
        "a third sent through the old credentials",
        Duration::from_secs(30),
        || old_apns.delivered().0 >= 100 && old_fcm.sends() >= 100,
    )
    .await;
    r.put("rot", &body(&new_apns, &new_fcm)).await;
    wait_for("every device", Duration::from_secs(30), || {
        old_apns.delivered().0 + new_apns.delivered().0 >= 300
            && fcm_tokens
                .iter()
                .all(|t| old_fcm.delivered(t) + new_fcm.delivered(t) >= 1)
    })
    .await;
    // Let anything late arrive before counting.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (old_seen, new_seen) = (
        old_apns.mock.controls().delivered_tokens(),
        new_apns.mock.controls().delivered_tokens(),
    );
    for t in &apns_tokens {
        let n = old_seen.get(t).copied().unwrap_or(0) + new_seen.get(t).copied().unwrap_or(0);
        assert_eq!(n, 1, "APNs token {t} delivered {n} times");
    }
    for t in &fcm_tokens {
        let n = old_fcm.delivered(t) + new_fcm.delivered(t);
        assert_eq!(n, 1, "FCM token {t} delivered {n} times");
    }
    assert!(
        new_apns.delivered().0 > 0 && new_fcm.sends() > 0,
        "the new credentials sent"
    );
    assert_eq!(old_apns.mock.controls().answers("InvalidProviderToken"), 0);
    assert_eq!(old_fcm.unauthenticated() + new_fcm.unauthenticated(), 0);
    assert_eq!(failures(&r, "rot-apns").await, (0, 0));
    assert_eq!(failures(&r, "rot-fcm").await, (0, 0));
}

/// The slower app's share of its 2 s window, at most: its 429s pause it (retry-after
/// 120 s, a lane pause of at most 60 s), so only what was in flight or probing answers.
const QUOTA_SENDS_MAX: u64 = 8;
/// The other app's sends in the same 2 s at 50/s are 100; it must not be slowed: at
/// least 70 (the window starts on the test's clock, not the worker's, and the first
/// and last sends of a window fall either side of it).
const OTHER_SENDS_MIN: u64 = 70;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_apps_fcm_quota_slows_that_app_alone() {
    let r = rig().await;
    let (quota, free) = (
        FcmMock::start(&r.ca).unwrap(),
        FcmMock::start(&r.ca).unwrap(),
    );
    r.put("q1", &json!({"fcm": fcm_body(&quota)}).to_string())
        .await;
    r.put("q2", &json!({"fcm": fcm_body(&free)}).to_string())
        .await;
    let devices = |tag: &str| (0..600).map(|i| format!("{tag}-{i}")).collect::<Vec<_>>();
    r.produce(&app_job_of("fcm", "j1", "c-q1", "q1", 50.0, devices("q1")))
        .await;
    r.produce(&app_job_of("fcm", "j2", "c-q2", "q2", 50.0, devices("q2")))
        .await;
    wait_for("both apps sending", Duration::from_secs(30), || {
        quota.sends() >= 20 && free.sends() >= 20
    })
    .await;
    quota.force_error(Some(FcmError::QuotaExceeded));
    // The first 429 answered, give the lane its pause.
    let seen = quota.sends();
    wait_for("a 429", Duration::from_secs(5), || quota.sends() > seen).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let (q0, f0) = (quota.sends(), free.sends());
    let t0 = Instant::now();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (q1, f1) = (quota.sends(), free.sends());
    eprintln!(
        "over {:?}: quota app {} sends, other app {} sends",
        t0.elapsed(),
        q1 - q0,
        f1 - f0
    );
    assert!(
        q1 - q0 <= QUOTA_SENDS_MAX,
        "the app over its quota sent {}",
        q1 - q0
    );
    assert!(
        f1 - f0 >= OTHER_SENDS_MIN,
        "the other app sent only {}",
        f1 - f0
    );
    // Nothing of the slowed app is lost: retried, not dead-lettered.
    assert_eq!(failures(&r, "c-q1").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_key_rotation_while_sending_rebuilds_nothing() {
    let (old, new) = (MasterKey::generate(), MasterKey::generate());
    let dir = tempfile::tempdir().unwrap();
    let old_file = dir.path().join("old.key");
    std::fs::write(&old_file, old.to_base64().as_bytes()).unwrap();
    // The worker holds the new key and the old one, as the rotation's runbook asks.
    let r = rig_with(&[
        ("apps.master_key", new.to_base64().to_string()),
        ("apps.old_master_key_files", old_file.display().to_string()),
    ])
    .await;
    let team = Team::start(&r.ca, "TEAMAAAAAA", "KEYAAAAAAA");
    // Sealed under the old key, as before the rotation began.
    let old_ring = Keyring::new(old.clone(), vec![]).unwrap();
    let input = pushpace::apps::parse_app(team.body().as_bytes()).unwrap();
    pushpace::apps::store::put(&r.worker.pool, Some(&old_ring), "mk", &input, None)
        .await
        .unwrap();
    let devices = tokens("aaaa", 300);
    r.produce(&app_job("ja", "c-mk", "mk", 100.0, devices))
        .await;
    wait_for("sending under the old key", Duration::from_secs(30), || {
        team.delivered().0 >= 50
    })
    .await;
    let both = Keyring::new(new.clone(), vec![old]).unwrap();
    let report = pushpace::apps::store::rotate_master_key(&r.worker.pool, &both, None)
        .await
        .unwrap();
    assert_eq!(report.current_key_id, new.id());
    wait_for("every device", Duration::from_secs(30), || {
        team.delivered().0 >= 300
    })
    .await;
    assert_eq!(team.delivered(), (300, 1));
    let key_ids: Vec<String> =
        sqlx::query_scalar("SELECT master_key_id FROM app_credentials WHERE app_id = 'mk'")
            .fetch_all(&r.worker.pool)
            .await
            .unwrap();
    assert_eq!(key_ids, vec![new.id().to_string()]);
    // The same credentials re-sealed: the sender was kept, so no new JWT was signed.
    assert_eq!(team.mock.controls().jwts().len(), 1);
    assert_eq!(failures(&r, "c-mk").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_secret_row_halts_only_its_app() {
    let r = rig().await;
    let (alpha, beta) = (
        Team::start(&r.ca, "TEAMAAAAAA", "KEYAAAAAAA"),
        Team::start(&r.ca, "TEAMBBBBBB", "KEYBBBBBBB"),
    );
    r.put("alpha", &alpha.body()).await;
    r.put("beta", &beta.body()).await;
    r.produce(&app_job("ja", "c-a", "alpha", 50.0, tokens("aaaa", 400)))
        .await;
    r.produce(&app_job("jb", "c-b", "beta", 50.0, tokens("bbbb", 300)))
        .await;
    wait_for("both sending", Duration::from_secs(30), || {
        alpha.delivered().0 >= 20 && beta.delivered().0 >= 20
    })
    .await;
    flip_a_sealed_bit(&r.worker.pool, "beta", AppKind::Apns).await;
    r.wait_waiting("c-b", "halted").await;
    let app = r.get("/api/apps/beta").await;
    assert_eq!(
        app.body["credentials"]["apns"]["status"], "halted",
        "{}",
        app.text
    );
    let b0 = beta.mock.controls().requests();
    let a0 = alpha.delivered().0;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        beta.mock.controls().requests(),
        b0,
        "beta sent while halted"
    );
    assert!(alpha.delivered().0 >= a0 + 30, "alpha kept its rate");
    // New credentials (the same key put again) are the fix.
    r.put("beta", &beta.body()).await;
    wait_for("beta's devices", Duration::from_secs(30), || {
        beta.delivered().0 >= 300
    })
    .await;
    assert_eq!(beta.delivered(), (300, 1));
    assert_eq!(failures(&r, "c-b").await, (0, 0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_put_that_rebuilds_an_apns_sender_keeps_its_keys_token() {
    let r = rig().await;
    let team = Team::start(&r.ca, "TEAMAAAAAA", "KEYAAAAAAA");
    r.put("env", &team.body()).await;
    r.produce(&app_job("je", "c-env", "env", 100.0, tokens("aaaa", 300)))
        .await;
    wait_for("sending", Duration::from_secs(30), || {
        team.delivered().0 >= 50
    })
    .await;
    let connections = team.mock.server().controls().connections();
    // Another setting than a limit: the sender (and its pool) is built again.
    let mut body: Value = serde_json::from_str(&team.body()).unwrap();
    body["apns"]["environment"] = "production".into();
    r.put("env", &body.to_string()).await;
    wait_for("every device", Duration::from_secs(30), || {
        team.delivered().0 >= 300
    })
    .await;
    assert!(
        team.mock.server().controls().connections() > connections,
        "the new sender opened its own connection"
    );
    // Its key's token is the one signed before: Apple allows a re-sign per 20 minutes.
    assert_eq!(team.mock.controls().jwts().len(), 1);
    assert_eq!(team.delivered(), (300, 1));
    assert_eq!(failures(&r, "c-env").await, (0, 0));
}
