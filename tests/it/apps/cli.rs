//! `pushpace apps …` run as the real binary: the API commands against a running server,
//! `rotate-master-key` against the database; no output holds a secret.

use super::Secrets;
use crate::api::{args, cli, spawn_app_on, TOKEN};
use crate::helpers::fresh_database;
use pushpace::apps::store;
use pushpace::apps::{AppKind, Keyring, MasterKey};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_commands_work_through_a_running_server() {
    let (pool, db_url) = fresh_database().await;
    let old = MasterKey::generate();
    let app = spawn_app_on(
        pool.clone(),
        db_url.clone(),
        TOKEN,
        None,
        None,
        &[("apps.master_key", old.to_base64().to_string())],
    )
    .await;
    let api = app.app.url();
    let dir = tempfile::tempdir().unwrap();
    let s = Secrets::new();
    let file = |name: &str, text: &str| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    };
    let apns = file("AuthKey.p8", &s.apns_key);
    let account = json!({"type": "service_account", "project_id": "example-app",
        "client_email": "push@example-app.iam.gserviceaccount.com",
        "private_key": s.sa_key, "token_uri": "https://oauth2.googleapis.com/token"});
    let sa = file("sa.json", &account.to_string());
    let vapid = file("vapid.pem", &s.vapid_key);
    let token = || vec![("PUSHPACE_ADMIN_TOKEN", TOKEN.to_string())];
    let mut outputs = Vec::new();

    let put = args(&[
        "apps",
        "put",
        "shop-1",
        "--apns-key",
        &apns,
        "--apns-key-id",
        "ABC123DEFG",
        "--apns-team-id",
        "TEAM123456",
        "--apns-topic",
        "com.example.app",
        "--apns-environment",
        "sandbox",
        "--fcm-service-account",
        &sa,
        "--vapid-key",
        &vapid,
        "--vapid-subject",
        "mailto:ops@example.com",
        "--api",
        &api,
    ]);
    let (ok, _, err) = cli(put.clone(), vec![]).await;
    assert!(!ok && err.contains("PUSHPACE_ADMIN_TOKEN"), "{err}");
    let (ok, out, err) = cli(put, token()).await;
    assert!(ok, "{err}");
    assert!(out.starts_with("app shop-1: active"), "{out}");
    assert!(out.contains("ABC123DEFG:sha256:"), "{out}");
    outputs.push(out + &err);
    // A bad key: the API's 422 names the field.
    let bad = file(
        "bad.p8",
        "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
    );
    let (ok, _, err) = cli(
        args(&[
            "apps",
            "put",
            "shop-2",
            "--vapid-key",
            &bad,
            "--vapid-subject",
            "mailto:a@b.c",
            "--api",
            &api,
        ]),
        token(),
    )
    .await;
    assert!(
        !ok && err.contains("422") && err.contains("webpush.vapid_key"),
        "{err}"
    );

    for cmd in [
        vec!["apps", "list"],
        vec!["apps", "show", "shop-1"],
        vec!["apps", "show", "shop-1", "--format", "json"],
        vec!["apps", "disable", "shop-1"],
        vec!["apps", "enable", "shop-1"],
    ] {
        let mut a = args(&cmd);
        a.extend(args(&["--api", &api]));
        let (ok, out, err) = cli(a, token()).await;
        assert!(ok, "{cmd:?}: {err}");
        outputs.push(out + &err);
    }
    assert!(
        outputs[1].contains("shop-1") && outputs[1].contains("STATUS"),
        "{}",
        outputs[1]
    );
    assert!(
        outputs[4].contains("app shop-1: disabled"),
        "{}",
        outputs[4]
    );
    assert!(outputs[5].contains("app shop-1: active"), "{}", outputs[5]);

    // Rotation, straight to the database: the old key as an old key file.
    let new = MasterKey::generate();
    let old_file = file("old.key", &old.to_base64());
    let db_env = |key: &MasterKey| {
        vec![
            ("PUSHPACE__DATABASE__URL", db_url.clone()),
            ("PUSHPACE__APPS__MASTER_KEY", key.to_base64().to_string()),
            ("PUSHPACE__APPS__OLD_MASTER_KEY_FILES", old_file.clone()),
        ]
    };
    let (ok, out, err) = cli(args(&["apps", "rotate-master-key"]), db_env(&new)).await;
    assert!(ok, "{err}");
    assert!(
        out.contains(&format!("re-sealed 3 row(s) under master key {}", new.id())),
        "{out}"
    );
    outputs.push(out + &err);
    let (ok, out, err) = cli(args(&["apps", "rotate-master-key"]), db_env(&new)).await;
    assert!(ok && out.contains("re-sealed 0 row(s)"), "{out} {err}");
    let only_new = Keyring::new(new, vec![]).unwrap();
    for kind in AppKind::ALL {
        store::open(&pool, Some(&only_new), "shop-1", kind)
            .await
            .unwrap();
    }

    let (ok, out, err) = cli(args(&["apps", "delete", "shop-1", "--api", &api]), token()).await;
    assert!(ok && out.contains("app shop-1 deleted"), "{out} {err}");
    for o in &outputs {
        s.assert_absent(o);
    }
    app.app.stop().await.unwrap();
}
