//! The registry's store against the real PostgreSQL: put and get, the parse layer's
//! field errors, paging, disable/enable, delete while sending, the events trigger, and
//! a corrupted row halting only its own app's kind.

use super::{parse, ring, webpush_body, Secrets};
use crate::helpers::fresh_database;
use pushpace::apps::store::{self, KindStatus};
use pushpace::apps::{parse_app, AppKind, AppsError, Credentials};
use secrecy::ExposeSecret;
use serde_json::json;

#[tokio::test]
async fn put_then_get_shows_fingerprints_and_never_a_secret() {
    let (pool, _) = fresh_database().await;
    let keys = ring();
    let s = Secrets::new();
    let input = parse(&s.body("push@example-app.iam.gserviceaccount.com"));
    let (app, created) = store::put(&pool, Some(&keys), "shop-1", &input, Some("alice"))
        .await
        .unwrap();
    assert!(created);
    assert_eq!(app.status, KindStatus::Active);
    assert_eq!(
        app.credentials.keys().copied().collect::<Vec<_>>(),
        AppKind::ALL
    );
    let apns = &app.credentials[&AppKind::Apns];
    assert!(
        apns.fingerprint.starts_with("ABC123DEFG:sha256:"),
        "{apns:?}"
    );
    assert_eq!(apns.master_key_id, keys.current_id());
    assert_eq!(apns.settings["topic"], "com.example.app");
    assert_eq!(apns.settings["max_rate"], 500.0);
    assert_eq!(
        app.credentials[&AppKind::Fcm].fingerprint,
        "push@example-app.iam.gserviceaccount.com"
    );
    assert_eq!(
        app.credentials[&AppKind::Fcm].settings["project_id"],
        "example-app"
    );
    let public = &app.credentials[&AppKind::WebPush].fingerprint;
    assert_eq!(public.len(), 87, "base64url of a 65-byte point: {public}");

    let got = store::get(&pool, "shop-1").await.unwrap().unwrap();
    assert_eq!(got, app);
    let shown = serde_json::to_string(&got).unwrap();
    s.assert_absent(&shown);
    s.assert_absent(&format!("{got:?} {input:?}"));
    // Nor is it in the table in clear: only the sealed bytes hold it.
    let clear: Vec<String> = sqlx::query_scalar(
        "SELECT concat_ws(' ', fingerprint, settings::text, encode(ciphertext, 'escape')) \
         FROM app_credentials",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    s.assert_absent(&clear.join("\n"));

    // Opening gives the very secrets back.
    let opened = store::open(&pool, Some(&keys), "shop-1", AppKind::Apns)
        .await
        .unwrap();
    assert_eq!(opened.secret().expose_secret(), s.apns_key.trim());
    assert!(store::get(&pool, "nope").await.unwrap().is_none());

    // A second PUT replaces: one kind less, and it says it was not created.
    let only = parse(&json!({"webpush": s.body("x@y.z")["webpush"].clone()}));
    let (app, created) = store::put(&pool, Some(&keys), "shop-1", &only, None)
        .await
        .unwrap();
    assert!(!created);
    assert_eq!(
        app.credentials.keys().copied().collect::<Vec<_>>(),
        [AppKind::WebPush]
    );
    // Without a master key nothing is put.
    let e = store::put(&pool, None, "shop-2", &only, None)
        .await
        .unwrap_err();
    assert!(matches!(e, AppsError::NoMasterKey), "{e}");
    assert!(store::get(&pool, "shop-2").await.unwrap().is_none());
}

#[test]
fn bad_credentials_are_refused_naming_their_field() {
    let s = Secrets::new();
    let good = s.body("push@example-app.iam.gserviceaccount.com");
    let field = |v: &serde_json::Value| {
        let text = v.to_string();
        let e = parse_app(text.as_bytes()).unwrap_err();
        s.assert_absent(&e.to_string());
        e.field
    };
    let mut bad = good.clone();
    bad["apns"]["key"] = json!("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----");
    assert_eq!(field(&bad), "apns.key");
    // An RSA key is not an APNs (P-256) key, nor a VAPID key.
    let mut bad = good.clone();
    bad["apns"]["key"] = json!(s.sa_key);
    assert_eq!(field(&bad), "apns.key");
    let mut bad = good.clone();
    bad["webpush"]["vapid_key"] = json!(s.sa_key);
    assert_eq!(field(&bad), "webpush.vapid_key");
    for missing in ["private_key", "client_email", "project_id", "token_uri"] {
        let mut bad = good.clone();
        bad["fcm"]["service_account"]
            .as_object_mut()
            .unwrap()
            .remove(missing);
        assert_eq!(field(&bad), format!("fcm.service_account.{missing}"));
    }
    let mut bad = good.clone();
    bad["fcm"]["service_account"]["private_key"] = json!(s.apns_key);
    assert_eq!(field(&bad), "fcm.service_account.private_key");
    let mut bad = good.clone();
    bad["apns"]["key_id"] = json!("short");
    assert_eq!(field(&bad), "apns.key_id");
    assert_eq!(field(&json!({})), "body");
}

#[tokio::test]
async fn pages_are_apps_not_rows() {
    let (pool, _) = fresh_database().await;
    let keys = ring();
    // app-2 has three kinds: a page counts it once.
    for i in 0..5 {
        let body = if i == 2 {
            Secrets::new().body(&format!("a{i}@example.com"))
        } else {
            webpush_body()
        };
        store::put(&pool, Some(&keys), &format!("app-{i}"), &parse(&body), None)
            .await
            .unwrap();
    }
    let ids = |p: &store::Page| p.items.iter().map(|a| a.id.clone()).collect::<Vec<_>>();
    let p1 = store::page(&pool, Some(2), None).await.unwrap();
    assert_eq!(ids(&p1), ["app-0", "app-1"]);
    assert_eq!(p1.next.as_deref(), Some("app-1"));
    let p2 = store::page(&pool, Some(2), p1.next.as_deref())
        .await
        .unwrap();
    assert_eq!(ids(&p2), ["app-2", "app-3"]);
    assert_eq!(p2.items[0].credentials.len(), 3);
    let p3 = store::page(&pool, Some(2), p2.next.as_deref())
        .await
        .unwrap();
    assert_eq!(ids(&p3), ["app-4"]);
    assert_eq!(p3.next, None);
    // An exact fit has no next page either.
    let all = store::page(&pool, Some(5), None).await.unwrap();
    assert_eq!(all.items.len(), 5);
    assert_eq!(all.next, None);
    assert_eq!(store::page(&pool, None, None).await.unwrap().items.len(), 5);
    for (limit, after, field) in [
        (Some(0), None, "limit"),
        (Some(1001), None, "limit"),
        (None, Some("bad id"), "after"),
    ] {
        match store::page(&pool, limit, after).await {
            Err(AppsError::Invalid(e)) => assert_eq!(e.field, field),
            other => panic!("{limit:?} {after:?}: {other:?}"),
        }
    }
}

/// kind, actor, field, old_value, new_value.
type Event = (
    Option<String>,
    String,
    String,
    Option<String>,
    Option<String>,
);

#[tokio::test]
async fn disable_enable_and_delete_write_their_events() {
    let (pool, _) = fresh_database().await;
    let keys = ring();
    let input = parse(&webpush_body());
    store::put(&pool, Some(&keys), "evt", &input, Some("alice"))
        .await
        .unwrap();
    let app = store::set_enabled(&pool, "evt", false, Some("bob"))
        .await
        .unwrap();
    assert_eq!(app.status, KindStatus::Disabled);
    let e = store::open(&pool, Some(&keys), "evt", AppKind::WebPush)
        .await
        .unwrap_err();
    assert!(matches!(e, AppsError::Disabled { .. }), "{e}");
    // A PUT keeps a disabled kind disabled.
    let app = store::put(&pool, Some(&keys), "evt", &input, Some("alice"))
        .await
        .unwrap()
        .0;
    assert_eq!(app.status, KindStatus::Disabled);
    let app = store::set_enabled(&pool, "evt", true, Some("bob"))
        .await
        .unwrap();
    assert_eq!(app.status, KindStatus::Active);
    store::open(&pool, Some(&keys), "evt", AppKind::WebPush)
        .await
        .unwrap();
    assert!(matches!(
        store::set_enabled(&pool, "ghost", true, None).await,
        Err(AppsError::NotFound(_))
    ));
    assert_eq!(
        store::delete(&pool, "evt", false, Some("carol"))
            .await
            .unwrap(),
        0
    );
    assert!(store::get(&pool, "evt").await.unwrap().is_none());
    assert!(matches!(
        store::delete(&pool, "evt", false, None).await,
        Err(AppsError::NotFound(_))
    ));

    let events: Vec<Event> = sqlx::query_as(
        "SELECT kind, actor, field, old_value, new_value FROM app_events \
             WHERE app_id = 'evt' AND field IN ('app', 'status') ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let s = |v: &str| Some(v.to_string());
    let wp = s("webpush");
    assert_eq!(
        events,
        vec![
            (None, "alice".into(), "app".into(), None, s("created")),
            (
                wp.clone(),
                "alice".into(),
                "status".into(),
                None,
                s("active")
            ),
            (
                wp.clone(),
                "bob".into(),
                "status".into(),
                s("active"),
                s("disabled")
            ),
            (
                wp.clone(),
                "bob".into(),
                "status".into(),
                s("disabled"),
                s("active")
            ),
            // The app's own row first, then its credentials by the cascade.
            (
                None,
                "carol".into(),
                "app".into(),
                s("created"),
                s("deleted")
            ),
            (
                wp.clone(),
                "carol".into(),
                "status".into(),
                s("active"),
                None
            ),
        ]
    );
    // The second PUT gave the same key: sealed again, but no fingerprint event.
    let fingerprints = super::count_events(&pool, "evt", Some("fingerprint"), None).await;
    assert_eq!(
        fingerprints, 2,
        "set at the first PUT, cleared by the delete"
    );
}

#[tokio::test]
async fn delete_is_refused_while_campaigns_send_through_the_app_unless_forced() {
    let (pool, _) = fresh_database().await;
    let keys = ring();
    for id in ["busy", "idle"] {
        store::put(&pool, Some(&keys), id, &parse(&webpush_body()), None)
            .await
            .unwrap();
    }
    // No campaign can name an app yet: stand in for the count the migration will give.
    sqlx::query(
        "CREATE OR REPLACE FUNCTION app_sending_campaigns(app text) RETURNS bigint \
         LANGUAGE sql STABLE AS $$ SELECT CASE WHEN app = 'busy' THEN 2 ELSE 0 END::bigint $$",
    )
    .execute(&pool)
    .await
    .unwrap();
    match store::delete(&pool, "busy", false, None).await {
        Err(AppsError::InUse { app, campaigns }) => {
            assert_eq!((app.as_str(), campaigns), ("busy", 2));
        }
        other => panic!("{other:?}"),
    }
    assert!(store::get(&pool, "busy").await.unwrap().is_some());
    assert_eq!(store::delete(&pool, "idle", false, None).await.unwrap(), 0);
    assert_eq!(store::delete(&pool, "busy", true, None).await.unwrap(), 2);
    assert!(store::get(&pool, "busy").await.unwrap().is_none());
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM app_credentials")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
}

#[tokio::test]
async fn a_corrupted_row_halts_only_its_own_apps_kind() {
    let (pool, _) = fresh_database().await;
    let keys = ring();
    let (sa, sb) = (Secrets::new(), Secrets::new());
    store::put(
        &pool,
        Some(&keys),
        "a",
        &parse(&sa.body("a@example.com")),
        None,
    )
    .await
    .unwrap();
    store::put(
        &pool,
        Some(&keys),
        "b",
        &parse(&sb.body("b@example.com")),
        None,
    )
    .await
    .unwrap();
    super::flip_a_sealed_bit(&pool, "a", AppKind::Apns).await;
    let e = store::open(&pool, Some(&keys), "a", AppKind::Apns)
        .await
        .unwrap_err();
    let AppsError::Halted { reason, .. } = &e else {
        panic!("{e:?}");
    };
    assert!(reason.contains("altered"), "{reason}");
    sa.assert_absent(&format!("{e} {e:?}"));
    let a = store::get(&pool, "a").await.unwrap().unwrap();
    assert_eq!(a.status, KindStatus::Halted);
    assert_eq!(a.credentials[&AppKind::Apns].status, KindStatus::Halted);
    assert_eq!(
        a.credentials[&AppKind::Apns].halted_reason.as_deref(),
        Some(reason.as_str())
    );
    // The app's other kinds and the other app still open.
    for (id, kind) in [
        ("a", AppKind::Fcm),
        ("a", AppKind::WebPush),
        ("b", AppKind::Apns),
    ] {
        let c: Credentials = store::open(&pool, Some(&keys), id, kind).await.unwrap();
        assert_eq!(c.kind(), kind);
    }
    assert_eq!(
        store::get(&pool, "b").await.unwrap().unwrap().status,
        KindStatus::Active
    );
    // A halted kind stays halted (not opened again) until a PUT or enable.
    assert!(matches!(
        store::open(&pool, Some(&keys), "a", AppKind::Apns).await,
        Err(AppsError::Halted { .. })
    ));
    let halts: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM app_events WHERE app_id = 'a' AND field = 'status' \
         AND new_value = 'halted' AND actor = 'worker'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(halts, 1);
    // New credentials are the fix.
    store::put(
        &pool,
        Some(&keys),
        "a",
        &parse(&sa.body("a@example.com")),
        None,
    )
    .await
    .unwrap();
    store::open(&pool, Some(&keys), "a", AppKind::Apns)
        .await
        .unwrap();
    // A row moved to another app does not open there either.
    sqlx::query(
        "UPDATE app_credentials SET ciphertext = s.ciphertext, nonce = s.nonce \
         FROM app_credentials s WHERE s.app_id = 'a' AND s.kind = 'webpush' \
         AND app_credentials.app_id = 'b' AND app_credentials.kind = 'webpush'",
    )
    .execute(&pool)
    .await
    .unwrap();
    assert!(matches!(
        store::open(&pool, Some(&keys), "b", AppKind::WebPush).await,
        Err(AppsError::Halted { .. })
    ));
    store::open(&pool, Some(&keys), "a", AppKind::WebPush)
        .await
        .unwrap();
}
