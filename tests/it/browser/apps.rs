//! The apps page in headless Chromium: an app registered through the API shows its kinds
//! (status, fingerprint, a halt with its reason), the campaign sending through it as a
//! link, and the per-second sends of its lane against the ceiling on a uPlot chart; the
//! token is asked for once. The campaign page names the campaign's app and says why it
//! waits for it, and the next window of its jobs' zone. The worker is a snapshot the
//! test publishes (no broker needed).

use super::{browser_lock, Browser};
use pushpace::limiter::Algorithm;
use pushpace::worker::scheduler::{CampaignLive, ProviderLive};
use serde_json::json;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// 60 seconds of 20 sends/s under a ceiling of 40/s, ending with the one just passed.
fn apns_lane(name: &str) -> ProviderLive {
    crate::apps::views::lane(name, crate::apps::views::now_s(), &[20.0; 60])
}

/// Campaign `id` held here, sending through `app` and waiting for it.
fn campaign(id: &str, app: &str) -> CampaignLive {
    CampaignLive {
        id: Arc::from(id),
        rate: 60.0,
        effective_rate: 40.0,
        weight: 1.0,
        algorithm: Algorithm::Gcra,
        paused: false,
        halted: None,
        active: true,
        sent: 0,
        failed: 0,
        retried: 0,
        invalid: 0,
        in_flight: 0,
        open_jobs: 1,
        expired: 0,
        cancelled: 0,
        held_devices: 10,
        total_devices: None,
        waiting_start: false,
        waiting_for_app: Some(Arc::from(format!("waiting for app {app}: halted"))),
        app_id: Some(Arc::from(app)),
        priority: Default::default(),
        ramp: None,
        starved_ms: None,
        finish_by_ms: None,
        zones: vec![pushpace::job::window::Zone::parse("Asia/Tokyo").unwrap()],
    }
}

/// Counts the sends line's pixels in the chart of `lane`, and its points.
fn chart_probe(lane: &str) -> String {
    format!(
        r#"(() => {{
  const ch = window.pushpace.appsPage.charts.get({lane:?});
  if (!ch) return false;
  const c = ch.plot.ctx.canvas;
  const img = ch.plot.ctx.getImageData(0, 0, c.width, c.height).data;
  let sent = 0, ceiling = 0;
  for (let i = 0; i < img.length; i += 4) {{
    const near = (r, g, b) => Math.abs(img[i] - r) < 30 && Math.abs(img[i + 1] - g) < 30
      && Math.abs(img[i + 2] - b) < 30 && img[i + 3] > 200;
    if (near(31, 119, 180)) sent++;
    if (near(123, 79, 201)) ceiling++;
  }}
  return {{ ok: ch.points === 60 && sent > 100 && ceiling > 100, points: ch.points, sent, ceiling }};
}})()"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apps_page_shows_a_registered_app_its_campaigns_and_its_lane_in_chromium() {
    let _one = browser_lock().await;
    let (api, stats) = crate::apps::views::spawn_with_lanes().await;
    let s = crate::apps::Secrets::new();
    let body = s.body("push@shop.iam.gserviceaccount.com").to_string();
    let r = api.put("/api/apps/shop-1", &body).await;
    assert_eq!(r.status, 201, "{}", r.text);
    let fcm_fingerprint = r.body["credentials"]["fcm"]["fingerprint"].clone();
    sqlx::query(
        "UPDATE app_credentials SET status = 'halted', halted_reason = 'FCM refused the key' \
         WHERE app_id = 'shop-1' AND kind = 'fcm'",
    )
    .execute(&api.pool)
    .await
    .unwrap();
    let r = api
        .put(
            "/api/campaigns/c-1",
            r#"{"send_rate": 60, "send_window": {"from": "09:00", "to": "17:00"}}"#,
        )
        .await;
    assert_eq!(r.status, 201, "{}", r.text);
    // The snapshot and the rows published every second, as a worker does.
    let keep_fresh = {
        let pool = api.pool.clone();
        tokio::spawn(async move {
            loop {
                stats.send_modify(|st| {
                    st.providers = Arc::new(vec![apns_lane("app/shop-1/apns")]);
                    st.campaigns = Arc::new(vec![campaign("c-1", "shop-1")]);
                });
                sqlx::query(
                    "INSERT INTO worker_campaigns AS w (campaign_id, worker_id, held, parked, \
                         effective_rate, app_id, updated_at) \
                     VALUES ('c-1', 'w-a', 10, 0, 40.0, 'shop-1', now()) \
                     ON CONFLICT (campaign_id, worker_id) DO UPDATE SET updated_at = now()",
                )
                .execute(&pool)
                .await
                .unwrap();
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        })
    };

    let browser = Browser::launch();
    let mut page = browser.page().await;
    page.call("Page.navigate", json!({ "url": api.app.url() + "/#/apps" }))
        .await;
    page.wait_until(
        "the apps page to load",
        Duration::from_secs(20),
        "document.readyState === 'complete' && !document.querySelector('#apps-page').hidden",
    )
    .await;
    // Nothing is read before the token is given.
    let cards = page
        .eval("document.querySelectorAll('#apps-list section.app').length")
        .await;
    assert_eq!(cards, 0);
    page.click("#apps-ask").await;
    let card = r#"#apps-list section.app[data-app="shop-1"]"#;
    page.wait_until(
        "the app's card",
        Duration::from_secs(10),
        &format!("!!document.querySelector('{card} tr[data-kind=apns]')"),
    )
    .await;
    let text = |sel: &str| format!("document.querySelector('{card} {sel}').textContent");
    let fcm_status = page.eval(&text("tr[data-kind=fcm] td.status")).await;
    assert_eq!(fcm_status, "halted: FCM refused the key");
    let fcm_shown = page.eval(&text("tr[data-kind=fcm] td.fingerprint")).await;
    assert_eq!(fcm_shown, fcm_fingerprint);
    assert_eq!(page.eval(&text(".app-status")).await, "halted");
    let apns = page.eval(&text("tr[data-kind=apns]")).await;
    let apns = apns.as_str().unwrap();
    assert!(
        apns.contains("backing off") && apns.contains("40/s") && apns.contains("500/s"),
        "{apns}"
    );
    let sends = page.eval(&text("tr[data-kind=apns] td.sends")).await;
    // 20/s over 10 s (18 of them when a second ended since the snapshot).
    assert!(sends == "200" || sends == "180", "{sends}");
    page.wait_until(
        "the campaign's link",
        Duration::from_secs(10),
        &format!("!!document.querySelector('{card} a[data-campaign=\"c-1\"]')"),
    )
    .await;
    let drawn = page
        .wait_until(
            "the lane's chart",
            Duration::from_secs(10),
            &chart_probe("app/shop-1/apns"),
        )
        .await;
    assert!(drawn["sent"].as_u64().unwrap() > 100, "{drawn}");
    let charts = page
        .eval(&format!(
            "document.querySelectorAll('{card} .chart').length"
        ))
        .await;
    assert_eq!(charts, 1, "a chart only for the kind with a lane here");
    let page_text = page.eval("document.body.innerText").await;
    s.assert_absent(page_text.as_str().unwrap());
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser/apps.png");
    page.screenshot(&shot).await;

    // The campaign's link opens its page, which names its app and why it waits.
    page.click(&format!("{card} a[data-campaign=\"c-1\"]"))
        .await;
    page.wait_until(
        "the campaign page to name its app",
        Duration::from_secs(10),
        "document.querySelector('#cp-app').textContent === 'shop-1'",
    )
    .await;
    let waiting = page
        .eval("(() => { const w = document.querySelector('#cp-waiting'); return w.hidden ? null : w.textContent; })()")
        .await;
    assert_eq!(waiting, "waiting for app shop-1: halted");
    // Its jobs held here are for Tokyo: that zone's current or next window.
    let tokyo = page
        .wait_until(
            "Tokyo's next window on the campaign page",
            Duration::from_secs(10),
            "(() => { const box = document.querySelector('#cp-next-windows'); \
             const li = box.querySelector('li[data-zone=\"Asia/Tokyo\"]'); \
             return !box.hidden && li ? { ok: true, text: li.textContent } : { ok: false }; })()",
        )
        .await;
    let tokyo = tokyo["text"].as_str().unwrap();
    assert!(
        tokyo.starts_with("Asia/Tokyo opens ")
            && tokyo.contains(" · closes ")
            && !tokyo.contains('–'),
        "{tokyo}"
    );
    assert_eq!(
        page.dialogs.len(),
        1,
        "the token asked once: {:?}",
        page.dialogs
    );
    assert!(page.errors.is_empty(), "page errors: {:?}", page.errors);
    keep_fresh.abort();
    drop(page);
    drop(browser);
    api.app.stop().await.unwrap();
}
