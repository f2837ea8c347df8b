//! `/api/apps` through a real server on a fresh database: create, replace, read, page,
//! disable, enable and delete; 422s naming the field; 409 while sending; 503 without a
//! master key; 401/403 without the admin token; and no answer holding a secret.

use super::{webpush_body, Secrets};
use crate::api::{spawn_app, spawn_app_on, Reply, TestApp, TOKEN};
use crate::helpers::fresh_database;
use pushpace::apps::MasterKey;
use reqwest::Method;
use serde_json::json;

async fn spawn_with_key() -> TestApp {
    let (pool, url) = fresh_database().await;
    let key = MasterKey::generate().to_base64().to_string();
    spawn_app_on(pool, url, TOKEN, None, None, &[("apps.master_key", key)]).await
}

async fn delete(app: &TestApp, path: &str) -> Reply {
    let auth = format!("Bearer {TOKEN}");
    app.request(Method::DELETE, path, None, Some(&auth)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn apps_round_trip_through_the_api_without_showing_a_secret() {
    let app = spawn_with_key().await;
    let s = Secrets::new();
    let body = s
        .body("push@example-app.iam.gserviceaccount.com")
        .to_string();
    let mut answers = Vec::new();

    let r = app.put("/api/apps/shop-1", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    assert_eq!(r.body["id"], "shop-1");
    assert_eq!(r.body["status"], "active");
    let apns_fp = r.body["credentials"]["apns"]["fingerprint"]
        .as_str()
        .unwrap();
    assert!(apns_fp.starts_with("ABC123DEFG:sha256:"), "{}", r.text);
    assert_eq!(
        r.body["credentials"]["fcm"]["fingerprint"],
        "push@example-app.iam.gserviceaccount.com"
    );
    assert!(r.body["credentials"]["webpush"]["fingerprint"].is_string());
    answers.push(r.text);
    let r = app.put("/api/apps/shop-1", &body).await;
    assert_eq!(r.status, 200, "a replace: {}", r.text);
    answers.push(r.text);
    for i in 0..3 {
        let r = app
            .put(&format!("/api/apps/other-{i}"), &webpush_body().to_string())
            .await;
        assert_eq!(r.status, 201, "{}", r.text);
    }

    let r = app.read("/api/apps/shop-1").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(
        r.body["credentials"]["apns"]["settings"]["team_id"],
        "TEAM123456"
    );
    answers.push(r.text);
    assert_eq!(app.read("/api/apps/ghost").await.status, 404);

    // Paged as the campaigns are: x-next-after until the last page.
    let mut seen = Vec::new();
    let mut path = "/api/apps?limit=3".to_string();
    loop {
        let r = app.read(&path).await;
        assert_eq!(r.status, 200, "{}", r.text);
        seen.extend(r.body.as_array().unwrap().iter().map(|a| a["id"].clone()));
        answers.push(r.text);
        match r.headers.get("x-next-after") {
            Some(next) => path = format!("/api/apps?limit=3&after={}", next.to_str().unwrap()),
            None => break,
        }
    }
    assert_eq!(seen, ["other-0", "other-1", "other-2", "shop-1"]);
    let r = app.read("/api/apps").await;
    assert_eq!(r.body.as_array().unwrap().len(), 4);
    assert!(r.headers.get("x-next-after").is_none());

    let r = app.post("/api/apps/shop-1/disable").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["status"], "disabled");
    assert_eq!(r.body["credentials"]["fcm"]["status"], "disabled");
    answers.push(r.text);
    let r = app.post("/api/apps/shop-1/enable").await;
    assert_eq!(r.body["status"], "active", "{}", r.text);
    answers.push(r.text);
    assert_eq!(app.post("/api/apps/ghost/enable").await.status, 404);

    let r = delete(&app, "/api/apps/shop-1").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body, json!({"deleted": "shop-1", "sending_campaigns": 0}));
    answers.push(r.text);
    assert_eq!(app.read("/api/apps/shop-1").await.status, 404);
    assert_eq!(delete(&app, "/api/apps/shop-1").await.status, 404);

    for text in &answers {
        s.assert_absent(text);
    }
    // The events name the API's actor.
    let actors: Vec<String> =
        sqlx::query_scalar("SELECT DISTINCT actor FROM app_events WHERE app_id = 'shop-1'")
            .fetch_all(&app.pool)
            .await
            .unwrap();
    assert_eq!(actors, ["api"]);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_credentials_are_a_422_naming_the_field() {
    let app = spawn_with_key().await;
    let s = Secrets::new();
    let good = s.body("push@example-app.iam.gserviceaccount.com");
    let mut cases = Vec::new();
    let mut bad = good.clone();
    bad["apns"]["key"] = json!("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----");
    cases.push((bad.to_string(), "apns.key"));
    let mut bad = good.clone();
    bad["fcm"]["service_account"]
        .as_object_mut()
        .unwrap()
        .remove("private_key");
    cases.push((bad.to_string(), "fcm.service_account.private_key"));
    let mut bad = good.clone();
    bad["webpush"]["vapid_key"] = json!(s.sa_key);
    cases.push((bad.to_string(), "webpush.vapid_key"));
    cases.push(("{not json".to_string(), "body"));
    cases.push((
        json!({"apns": good["apns"], "extra": 1}).to_string(),
        "extra",
    ));
    for (body, field) in cases {
        let r = app.put("/api/apps/bad-1", &body).await;
        assert_eq!(r.status, 422, "{field}: {}", r.text);
        assert_eq!(r.body["field"], field, "{}", r.text);
        s.assert_absent(&r.text);
    }
    assert_eq!(
        app.read("/api/apps/bad-1").await.status,
        404,
        "nothing stored"
    );
    // A bad id is a 400 naming it; unknown or bad parameters are 422s.
    let r = app.put("/api/apps/bad%20id", &good.to_string()).await;
    assert_eq!(
        (r.status, r.body["field"].as_str()),
        (400, Some("id")),
        "{}",
        r.text
    );
    for (path, field) in [
        ("/api/apps?limit=0", "limit"),
        ("/api/apps?limit=x", "limit"),
        ("/api/apps?after=bad%20id", "after"),
        ("/api/apps?order=id", "order"),
    ] {
        let r = app.read(path).await;
        assert_eq!(
            (r.status, r.body["field"].as_str()),
            (422, Some(field)),
            "{path}: {}",
            r.text
        );
    }
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_is_a_409_while_campaigns_send_through_the_app_unless_forced() {
    let app = spawn_with_key().await;
    let r = app.put("/api/apps/busy", &webpush_body().to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    // No campaign can name an app yet: stand in for the count the migration will give.
    sqlx::query(
        "CREATE OR REPLACE FUNCTION app_sending_campaigns(app text) RETURNS bigint \
         LANGUAGE sql STABLE AS $$ SELECT 3::bigint $$",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    let r = delete(&app, "/api/apps/busy").await;
    assert_eq!(r.status, 409, "{}", r.text);
    let error = r.body["error"].as_str().unwrap();
    assert!(
        error.contains("3 campaign") && error.contains("force"),
        "{error}"
    );
    assert_eq!(delete(&app, "/api/apps/busy?force=maybe").await.status, 422);
    assert_eq!(delete(&app, "/api/apps/busy?force=false").await.status, 409);
    assert_eq!(app.read("/api/apps/busy").await.status, 200);
    let r = delete(&app, "/api/apps/busy?force=true").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["sending_campaigns"], 3);
    assert_eq!(app.read("/api/apps/busy").await.status, 404);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_apps_endpoint_needs_the_admin_token() {
    let app = spawn_with_key().await;
    let body = webpush_body().to_string();
    let calls = [
        (Method::PUT, "/api/apps/guarded", Some(body.as_str())),
        (Method::POST, "/api/apps/guarded/disable", None),
        (Method::POST, "/api/apps/guarded/enable", None),
        (Method::DELETE, "/api/apps/guarded?force=true", None),
        (Method::GET, "/api/apps/guarded", None),
        (Method::GET, "/api/apps", None),
    ];
    let r = app.put("/api/apps/guarded", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    for (method, path, b) in &calls {
        let r = app.request(method.clone(), path, *b, None).await;
        assert_eq!(r.status, 401, "{method} {path}: {}", r.text);
        assert_eq!(r.headers["www-authenticate"], "Bearer");
        let r = app
            .request(method.clone(), path, *b, Some("Bearer not-the-token"))
            .await;
        assert_eq!(r.status, 403, "{method} {path}: {}", r.text);
    }
    // Nothing was changed by the refused requests.
    let r = app.read("/api/apps/guarded").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "active");
    let events: i64 =
        sqlx::query_scalar("SELECT count(*) FROM app_events WHERE app_id = 'guarded'")
            .fetch_one(&app.pool)
            .await
            .unwrap();
    let after_put: i64 = 5; // app created; fingerprint, master_key_id, settings, status
    assert_eq!(events, after_put);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_master_key_a_put_is_a_503_that_says_why() {
    let app = spawn_app().await;
    let r = app
        .put("/api/apps/nokey", &webpush_body().to_string())
        .await;
    assert_eq!(r.status, 503, "{}", r.text);
    let error = r.body["error"].as_str().unwrap();
    assert!(
        error.contains("PUSHPACE__APPS__MASTER_KEY") && error.contains("apps.master_key_file"),
        "{error}"
    );
    // Reading needs no key: the registry is listed (empty here).
    let r = app.read("/api/apps").await;
    assert_eq!((r.status, r.body.clone()), (200, json!([])), "{}", r.text);
    assert_eq!(app.read("/api/apps/nokey").await.status, 404);
    app.app.stop().await.unwrap();
}
