//! What `GET /api/apps` and `GET /api/apps/{id}` show besides the registry: each kind's
//! lane in this worker's snapshot (`live`: state, ceiling, max_rate, sends over the last
//! 10 whole seconds, and on the one-app read its per-second history), and the campaigns
//! sending through the app, read from `worker_campaigns` over every worker (fresh rows
//! only). The worker here is a snapshot the test publishes itself, so the figures are
//! exact; the rows are inserted as workers publish them. The dashboard's apps page is
//! served with its script (drawn in Chromium by `tests/it/browser/apps.rs`).

use super::{webpush_body, Secrets};
use crate::api::{spawn_app_on, TestApp, TOKEN};
use crate::helpers::fresh_database;
use pushpace::api::WorkerView;
use pushpace::apps::MasterKey;
use pushpace::worker::consumer::ConsumerStats;
use pushpace::worker::scheduler::{LanePoint, ProviderLive, SchedulerStats};
use serde_json::{json, Value};
use std::sync::Arc;
use tokio::sync::watch;

pub(crate) fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A lane called `name` whose seconds up to `end` (excluded) dispatched `sends`, under a
/// ceiling of 40/s.
pub(crate) fn lane(name: &str, end: u64, sends: &[f64]) -> ProviderLive {
    let first = end - sends.len() as u64;
    ProviderLive {
        name: Arc::from(name),
        kind: "apns",
        max_rate: Some(500.0),
        adaptive: true,
        state: "backing off",
        paused_until_unix_ms: None,
        ceiling: Some(40.0),
        p95_ms: Some(12.0),
        latency_target_ms: None,
        congestion: Default::default(),
        history: sends
            .iter()
            .enumerate()
            .map(|(i, &achieved)| LanePoint {
                unix_s: first + i as u64,
                ceiling: Some(40.0),
                demand: 60.0,
                achieved,
                accepted: achieved,
            })
            .collect(),
        origins: Vec::new(),
    }
}

/// The API with a master key and, as its worker, snapshots the test sends.
pub(crate) async fn spawn_with_lanes() -> (TestApp, watch::Sender<SchedulerStats>) {
    let (pool, url) = fresh_database().await;
    let key = MasterKey::generate().to_base64().to_string();
    let (tx, scheduler) = watch::channel(SchedulerStats::default());
    let (_, consumer) = watch::channel(ConsumerStats::default());
    let (_, consumer_running) = watch::channel(true);
    let worker = WorkerView {
        scheduler,
        consumer,
        consumer_running,
    };
    let extra = [("apps.master_key", key)];
    (
        spawn_app_on(pool, url, TOKEN, Some(worker), None, &extra).await,
        tx,
    )
}

fn publish(tx: &watch::Sender<SchedulerStats>, lanes: Vec<ProviderLive>) {
    tx.send_modify(|s| s.providers = Arc::new(lanes));
}

/// A `worker_campaigns` row as a worker publishes it, `age_s` seconds ago.
async fn row(app: &TestApp, campaign: &str, worker: &str, app_id: Option<&str>, age_s: f64) {
    sqlx::query(
        "INSERT INTO worker_campaigns \
             (campaign_id, worker_id, held, parked, effective_rate, app_id, updated_at) \
         VALUES ($1, $2, 10, 0, 5.0, $3, now() - make_interval(secs => $4))",
    )
    .bind(campaign)
    .bind(worker)
    .bind(app_id)
    .bind(age_s)
    .execute(&app.pool)
    .await
    .unwrap();
}

fn by_id<'a>(list: &'a Value, id: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|a| a["id"] == id)
        .unwrap_or_else(|| panic!("{id} in {list}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_kind_shows_its_lane_in_this_worker_and_the_app_its_campaigns() {
    let (app, lanes) = spawn_with_lanes().await;
    let s = Secrets::new();
    let body = s.body("push@shop.iam.gserviceaccount.com").to_string();
    assert_eq!(app.put("/api/apps/shop-1", &body).await.status, 201);
    let r = app
        .put("/api/apps/shop-2", &webpush_body().to_string())
        .await;
    assert_eq!(r.status, 201, "{}", r.text);

    // Two workers hold c-1, one c-2; a stale row (a worker that died) and another
    // app's row are not shop-1's.
    row(&app, "c-1", "w-a", Some("shop-1"), 0.0).await;
    row(&app, "c-1", "w-b", Some("shop-1"), 0.0).await;
    row(&app, "c-2", "w-a", Some("shop-1"), 1.0).await;
    row(&app, "c-old", "w-dead", Some("shop-1"), 60.0).await;
    row(&app, "c-3", "w-a", Some("shop-2"), 0.0).await;
    row(&app, "c-static", "w-a", None, 0.0).await;

    // 12 seconds of sends: only the last 10 count (3 * 10); the static provider named
    // like the app's kind is not shop-1's, nor is shop-2's webpush lane. Read again if a
    // second ended in between: the window would have moved.
    let mut sends = vec![100.0, 100.0];
    sends.extend([3.0; 10]);
    let (r, end) = loop {
        let end = now_s();
        publish(
            &lanes,
            vec![
                lane("apns", end, &[77.0; 12]),
                lane("app/shop-1/apns", end, &sends),
                lane("app/shop-2/webpush", end, &[5.0; 12]),
            ],
        );
        let r = app.read("/api/apps/shop-1").await;
        if now_s() == end {
            break (r, end);
        }
    };
    assert_eq!(r.status, 200, "{}", r.text);
    let apns = &r.body["credentials"]["apns"];
    assert!(apns["fingerprint"]
        .as_str()
        .unwrap()
        .starts_with("ABC123DEFG:sha256:"));
    assert_eq!(apns["status"], "active");
    let live = &apns["live"];
    assert_eq!(live["state"], "backing off", "{}", r.text);
    assert_eq!(live["ceiling"], 40.0);
    assert_eq!(live["max_rate"], 500.0);
    assert_eq!(live["sends_last_10s"], 30, "{}", r.text);
    let history = live["history"].as_array().unwrap();
    assert_eq!(history.len(), 12);
    assert_eq!(
        history.last().unwrap(),
        &json!({"unix_s": end - 1, "achieved": 3.0, "ceiling": 40.0})
    );
    assert_eq!(
        history[0],
        json!({"unix_s": end - 12, "achieved": 100.0, "ceiling": 40.0})
    );
    // No lane here for its other kinds.
    assert!(r.body["credentials"]["fcm"]["live"].is_null(), "{}", r.text);
    assert!(r.body["credentials"]["webpush"]["live"].is_null());
    assert_eq!(r.body["campaigns"], json!(["c-1", "c-2"]), "{}", r.text);
    s.assert_absent(&r.text);

    // The list: the same figures without the history, campaigns per app.
    let r = app.read("/api/apps").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let one = by_id(&r.body, "shop-1");
    let sends = one["credentials"]["apns"]["live"]["sends_last_10s"].as_u64();
    // 30, or 27 once a second has passed since the snapshot.
    assert!(matches!(sends, Some(27 | 30)), "{}", r.text);
    assert!(one["credentials"]["apns"]["live"].get("history").is_none());
    assert_eq!(one["campaigns"], json!(["c-1", "c-2"]));
    let two = by_id(&r.body, "shop-2");
    assert_eq!(two["campaigns"], json!(["c-3"]));
    let sends = two["credentials"]["webpush"]["live"]["sends_last_10s"].as_u64();
    assert!(
        matches!(sends, Some(45 | 50)),
        "shop-2's own lane: {}",
        r.text
    );
    s.assert_absent(&r.text);
    // Paged: each page's apps get their own campaigns.
    let r = app.read("/api/apps?limit=1&after=shop-1").await;
    assert_eq!(r.body.as_array().unwrap().len(), 1, "{}", r.text);
    assert_eq!(r.body[0]["campaigns"], json!(["c-3"]));

    // A halt shows with its reason next to the lane; the snapshot moves on.
    sqlx::query(
        "UPDATE app_credentials SET status = 'halted', halted_reason = 'APNs refused the key' \
         WHERE app_id = 'shop-1' AND kind = 'apns'",
    )
    .execute(&app.pool)
    .await
    .unwrap();
    publish(&lanes, vec![lane("app/shop-1/apns", now_s(), &[0.0; 5])]);
    let r = app.read("/api/apps/shop-1").await;
    assert_eq!(r.body["status"], "halted");
    let apns = &r.body["credentials"]["apns"];
    assert_eq!(apns["halted_reason"], "APNs refused the key");
    assert_eq!(apns["live"]["sends_last_10s"], 0);
    assert_eq!(apns["live"]["history"].as_array().unwrap().len(), 5);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_a_worker_or_campaigns_the_views_say_so() {
    let (pool, url) = fresh_database().await;
    let key = MasterKey::generate().to_base64().to_string();
    let app = spawn_app_on(pool, url, TOKEN, None, None, &[("apps.master_key", key)]).await;
    let r = app.put("/api/apps/idle", &webpush_body().to_string()).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let r = app.read("/api/apps/idle").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(r.body["credentials"]["webpush"]["live"].is_null());
    assert_eq!(r.body["campaigns"], json!([]));
    let r = app.read("/api/apps").await;
    assert_eq!(r.body[0]["campaigns"], json!([]), "{}", r.text);
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_serves_the_apps_page_and_its_script() {
    let app = crate::api::spawn_app().await;
    let index = app.get("/").await;
    assert_eq!(index.status, 200);
    for part in [
        r##"href="#/apps""##,
        r#"id="apps-page""#,
        r#"src="/assets/apps.js""#,
        r#"id="cp-waiting""#,
    ] {
        assert!(index.text.contains(part), "{part} in the page");
    }
    let script = app.get("/assets/apps.js").await;
    assert_eq!(script.status, 200);
    assert_eq!(
        script.headers["content-type"],
        "text/javascript; charset=utf-8"
    );
    assert!(script.headers["content-security-policy"]
        .to_str()
        .unwrap()
        .starts_with("default-src 'self'"));
    // It reads the apps with the token, never without.
    assert!(script.text.contains("async function refreshAppsPage"));
    assert!(script.text.contains(r#"Authorization: "Bearer " + token"#));
    app.app.stop().await.unwrap();
}
