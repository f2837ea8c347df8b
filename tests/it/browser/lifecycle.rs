//! The campaign lifecycle from the dashboard in headless Chromium, against a real worker:
//! the summary strip, a weight set and a campaign cancelled through the in-page dialogs,
//! the campaign's page with its counts, settings history, dead letters and chart over
//! three ranges (the server sums the long ones into steps), and a start set through
//! the schedule dialog.

use super::{browser_lock, Browser, Page};
use crate::api::{spawn_worker_app, TestApp};
use chrono::{DateTime, Utc};
use pushpace::store::{DeadLetter, DeadLetterKind};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Polls the API until `check` holds for the campaign's view, answering page dialogs.
async fn wait_api(
    page: &mut Page,
    api: &TestApp,
    id: &str,
    what: &str,
    check: impl Fn(&Value) -> bool,
) {
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let r = api.get(&format!("/api/campaigns/{id}")).await;
        if check(&r.body) {
            return;
        }
        assert!(
            Instant::now() < end,
            "{what} did not reach the API: {}",
            r.text
        );
        // Keep reading DevTools messages, so that the token prompt gets its answer.
        page.eval("1").await;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A number as the page shows it ("1,234"), or null.
fn shown(selector: &str) -> String {
    format!("Number(document.querySelector({selector:?}).textContent.replace(/,/g, ''))")
}

async fn seed_dead_letters(api: &TestApp, campaign: &str, n: i64) {
    for i in 0..n {
        let letter = DeadLetter {
            kind: DeadLetterKind::Undeliverable,
            topic: "pushpace.jobs",
            partition: 0,
            kafka_offset: 1_000 + i,
            campaign_id: Some(campaign),
            job_id: Some("job-dl"),
            device_token: Some("tok"),
            reason: "permanent failure (HTTP 400)",
            raw: b"{}",
            key: None,
            device: Some(i as u32),
        };
        pushpace::store::dead_letters::insert(&api.pool, &letter)
            .await
            .unwrap()
            .unwrap();
    }
}

/// Counts, in the campaign page's canvas, the pixels of the sends line and of the marks.
const CAMPAIGN_PROBE: &str = r#"(() => {
  const p = window.pushpace.campaignPage;
  const u = p.plot;
  const c = u.ctx.canvas;
  const img = u.ctx.getImageData(0, 0, c.width, c.height).data;
  const near = (i, r, g, b) => Math.abs(img[i] - r) < 30 && Math.abs(img[i + 1] - g) < 30
    && Math.abs(img[i + 2] - b) < 30 && img[i + 3] > 200;
  let sent = 0, mark = 0;
  for (let i = 0; i < img.length; i += 4) {
    if (near(i, 31, 119, 180)) sent++;
    if (near(i, 123, 79, 201)) mark++;
  }
  const d = u.data;
  return { points: d[0].length, nonzero: d[1].filter((v) => v > 0).length,
           max: Math.max(0, ...d[1]), step: p.step, marks: p.marks, sent, mark,
           total: p.points.reduce((a, x) => a + x.sent, 0) };
})()"#;

/// Summary strip: both campaigns sending, their summed send_rate, the dead letters.
async fn check_summary(page: &mut Page, api: &TestApp) {
    page.wait_until(
        "the summary strip to count two active campaigns sending",
        Duration::from_secs(30),
        &format!(
            "(() => {{ const v = {{ active: {}, sends: {}, sum: {}, dead: {}, paused: {} }}; \
             v.ok = v.active === 2 && v.sends >= 60 && v.sum === 80 && v.dead === 2 \
             && v.paused === 0; return v; }})()",
            shown("#summary [data-k=active]"),
            shown("#summary [data-k=sends]"),
            shown("#summary [data-k=send-rate-sum]"),
            shown("#summary [data-k=dead-letters]"),
            shown("#summary [data-k=paused]"),
        ),
    )
    .await;
    let s = api.get("/api/summary").await;
    let providers = s.body["providers"].as_array().unwrap();
    assert!(!providers.is_empty(), "the worker's providers: {}", s.text);
    for p in providers {
        let name = p["name"].as_str().unwrap();
        let text = page
            .eval(&format!(
                "document.querySelector('#summary [data-provider={name:?}]').textContent"
            ))
            .await;
        let state = p["state"].as_str().unwrap();
        assert!(text.as_str().unwrap().contains(state), "{text} {}", s.text);
    }
}

/// Sets the weight through the row's dialog: the token is asked for here, once.
async fn set_weight(page: &mut Page, api: &TestApp, id: &str, row: &str) {
    page.click(&format!("{row} button.set-weight")).await;
    page.wait_until(
        "the weight dialog",
        Duration::from_secs(5),
        "$('#ask').open",
    )
    .await;
    page.eval("(i => { i.value = ''; i.focus(); })($('#ask input[name=weight]'))")
        .await;
    page.type_text("3").await;
    page.click("#ask-ok").await;
    wait_api(page, api, id, "the weight", |c| c["weight"] == 3.0).await;
    assert_eq!(
        page.dialogs.len(),
        1,
        "the token was asked for once: {:?}",
        page.dialogs
    );
    page.wait_until(
        "the row to show weight 3",
        Duration::from_secs(5),
        &format!("$('{row} td.weight').textContent === '3' && !$('#ask').open"),
    )
    .await;
}

/// Cancel asks first: "Keep it" changes nothing, "Cancel campaign" cancels.
async fn cancel(page: &mut Page, api: &TestApp, id: &str, row: &str) {
    page.click(&format!("{row} button.cancel")).await;
    page.wait_until(
        "the confirm dialog",
        Duration::from_secs(5),
        "$('#ask').open",
    )
    .await;
    let title = page.eval("$('#ask-title').textContent").await;
    assert!(title.as_str().unwrap().contains(id), "{title}");
    page.click("#ask-dismiss").await;
    page.wait_until(
        "the dialog to close",
        Duration::from_secs(5),
        "!$('#ask').open",
    )
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let r = api.get(&format!("/api/campaigns/{id}")).await;
    assert_eq!(
        r.body["status"], "active",
        "dismissed, nothing changed: {}",
        r.text
    );

    page.click(&format!("{row} button.cancel")).await;
    page.wait_until(
        "the confirm dialog",
        Duration::from_secs(5),
        "$('#ask').open",
    )
    .await;
    page.click("#ask-ok").await;
    wait_api(page, api, id, "the cancel", |c| c["status"] == "cancelled").await;
    page.wait_until(
        "the row to show cancelled, its controls off",
        Duration::from_secs(5),
        &format!(
            "$('{row} td:nth-child(2)').textContent === 'cancelled' \
             && $('{row} button.cancel').disabled && $('{row} button.set-weight').disabled"
        ),
    )
    .await;
    page.wait_until(
        "the summary strip to count the cancel",
        Duration::from_secs(10),
        &format!(
            "{} === 1 && {} === 1 && {} === 40",
            shown("#summary [data-k=active]"),
            shown("#summary [data-k=cancelled]"),
            shown("#summary [data-k=send-rate-sum]"),
        ),
    )
    .await;
}

/// The campaign page's head, counts, history and dead letters.
async fn check_page_contents(page: &mut Page, api: &TestApp, id: &str) {
    page.wait_until(
        "the page's status and weight",
        Duration::from_secs(10),
        "$('#cp-status').textContent === 'cancelled' \
         && $('#campaign-page [data-k=weight]').textContent === '3'",
    )
    .await;
    // Its counts are the API's (sent no longer moves once cancelled and flushed).
    let end = Instant::now() + Duration::from_secs(15);
    loop {
        let c = api.get(&format!("/api/campaigns/{id}")).await.body;
        let dom = page
            .eval(&format!(
                "[{}, {}, {}]",
                shown("#campaign-page [data-k=sent]"),
                shown("#campaign-page [data-k=cancelled]"),
                shown("#campaign-page [data-k=expired]"),
            ))
            .await;
        let api_counts = json!([c["sent"], c["cancelled"], c["expired"]]);
        if dom == api_counts && c["sent"].as_i64().unwrap() > 0 {
            break;
        }
        assert!(Instant::now() < end, "page {dom} against API {api_counts}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let events = page
        .wait_until(
            "the weight change and the cancel in the history",
            Duration::from_secs(15),
            "(() => { const t = [...document.querySelectorAll('#cp-events li')] \
             .map((li) => li.dataset.field + '|' + li.textContent); \
             const has = (f, s) => t.some((x) => x.startsWith(f + '|') && x.includes(s)); \
             return { t, ok: has('weight', 'api: weight 1 → 3') \
             && has('status', 'api: status active → cancelled') }; })()",
        )
        .await;
    let t = events["t"].as_array().unwrap();
    let weight = t
        .iter()
        .position(|x| x.as_str().unwrap().contains("weight 1 → 3"));
    let cancel = t
        .iter()
        .position(|x| x.as_str().unwrap().contains("active → cancelled"));
    assert!(weight < cancel, "newest last: {events}");
    page.wait_until(
        "the campaign's two dead letters, the token being known",
        Duration::from_secs(15),
        "$('#cp-dead tbody').children.length === 2 && $('#cp-dead-ask').hidden",
    )
    .await;
}

/// Each request's added latency while the chart's ranges are switched: a reload then
/// stays in flight long enough for the click to land inside it.
const SLOW_ANSWER_MS: u64 = 800;

/// Counts the page's series reads in flight, by range, in `window.seriesReads`.
const COUNT_SERIES_READS: &str = r#"(() => {
  window.seriesReads = {};
  const f = window.fetch;
  window.fetch = function (url, ...rest) {
    const m = String(url).match(/series\?last=(\w+)/);
    if (!m) return f.call(this, url, ...rest);
    window.seriesReads[m[1]] = (window.seriesReads[m[1]] || 0) + 1;
    return f.call(this, url, ...rest).finally(() => { window.seriesReads[m[1]] -= 1; });
  };
  return true;
})()"#;

async fn network_latency(page: &mut Page, ms: u64) {
    page.call("Network.enable", json!({})).await;
    page.call(
        "Network.emulateNetworkConditions",
        json!({"offline": false, "latency": ms, "downloadThroughput": -1, "uploadThroughput": -1}),
    )
    .await;
}

/// The chart: sends and marks painted at 5 min; the server's steps at 1 h and 24 h,
/// drawn as a mean per second, adding up to the campaign's sends.
async fn check_chart(page: &mut Page, api: &TestApp, id: &str) -> Value {
    let at5m = page
        .wait_until(
            "sends and settings marks on the campaign's chart",
            Duration::from_secs(20),
            &format!("(() => {{ const p = {CAMPAIGN_PROBE}; p.ok = p.nonzero >= 10 && p.marks >= 2; return p; }})()"),
        )
        .await;
    assert!(
        at5m["sent"].as_u64().unwrap() > 100,
        "the sends line is painted: {at5m}"
    );
    assert!(
        at5m["mark"].as_u64().unwrap() > 100,
        "the marks are painted: {at5m}"
    );
    assert_eq!(at5m["step"], 1, "{at5m}");
    let sent = api.get(&format!("/api/campaigns/{id}")).await.body["sent"].clone();
    // The first click lands while a reload of the 5-minute range is in flight (slow
    // answers): the page must not let that answer stand for the 24-hour range, which
    // reloads only once a minute.
    page.eval(COUNT_SERIES_READS).await;
    network_latency(page, SLOW_ANSWER_MS).await;
    page.wait_until(
        "a 5-minute reload in flight",
        Duration::from_secs(10),
        "(window.seriesReads['5m'] || 0) > 0",
    )
    .await;
    for (button, step, points) in [(3, 300, 288..=289), (2, 10, 360..=361)] {
        page.click(&format!("#cp-ranges button:nth-child({button})"))
            .await;
        let v = page
            .wait_until(
                &format!("the {step} s steps"),
                Duration::from_secs(15),
                &format!("(() => {{ const p = {CAMPAIGN_PROBE}; p.ok = p.step === {step}; return p; }})()"),
            )
            .await;
        let n = v["points"].as_u64().unwrap();
        assert!(points.contains(&n), "{n} points at {step} s: {v}");
        assert_eq!(v["total"], sent, "the buckets add up to its sends: {v}");
        let max = v["max"].as_f64().unwrap();
        assert!(
            max > 0.0 && max <= 45.0,
            "a mean per second at 40/s, not a sum: {v}"
        );
    }
    network_latency(page, 0).await;
    page.click("#cp-ranges button:nth-child(1)").await;
    page.wait_until(
        "the 5-minute range again",
        Duration::from_secs(10),
        &format!("(() => {{ const p = {CAMPAIGN_PROBE}; p.ok = p.step === 1 && p.nonzero >= 10; return p; }})()"),
    )
    .await;
    at5m
}

/// Sets a start in the future through the schedule dialog (its datetime-local input
/// filled by script: typing into one depends on the locale); the expiry stays unset.
async fn set_start(page: &mut Page, api: &TestApp, id: &str) {
    let row = format!("tr[data-id={id:?}]");
    page.click(&format!("{row} button.set-start")).await;
    page.wait_until(
        "the schedule dialog",
        Duration::from_secs(5),
        "$('#ask').open",
    )
    .await;
    let want = page
        .eval(
            "$('#ask input[name=start_at]').value = '2030-01-02T03:04'; \
             new Date('2030-01-02T03:04').toISOString()",
        )
        .await;
    let want: DateTime<Utc> = want.as_str().unwrap().parse().unwrap();
    page.click("#ask-ok").await;
    wait_api(page, api, id, "the start", |c| {
        c["start_at"]
            .as_str()
            .and_then(|t| t.parse::<DateTime<Utc>>().ok())
            == Some(want)
    })
    .await;
    let r = api.get(&format!("/api/campaigns/{id}")).await;
    assert!(
        r.body["expires_at"].is_null(),
        "only the start was sent: {}",
        r.text
    );
    page.wait_until(
        "the row and the summary strip to show it scheduled",
        Duration::from_secs(10),
        &format!(
            "$('{row} td.schedule').textContent.startsWith('starts ') && {} === 1",
            shown("#summary [data-k=scheduled]")
        ),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_sets_weight_cancels_and_opens_a_campaign_page_in_chromium() {
    let _one = browser_lock().await;
    // Two campaigns of 3000 devices at 40/s: they run for the whole test.
    let run = spawn_worker_app(&[(40.0, 3000), (40.0, 3000)]).await;
    let api = &run.api;
    let id = run.plan.campaigns[1].id.clone();
    seed_dead_letters(api, &id, 2).await;
    let browser = Browser::launch();
    let mut page = browser.page().await;
    page.call("Page.navigate", json!({ "url": api.app.url() + "/" }))
        .await;
    page.wait_until(
        "the page to load",
        Duration::from_secs(20),
        "document.readyState === 'complete' && typeof uPlot === 'function'",
    )
    .await;
    let row = format!("tr[data-id={id:?}]");
    page.wait_until(
        "both rows",
        Duration::from_secs(20),
        &format!("document.querySelectorAll('#campaigns tbody tr').length === 2 && !!$('{row}')"),
    )
    .await;
    // A class other than normal (once the worker has made the row): a badge by its id
    // in the overview and on its page.
    let r = api
        .put(&format!("/api/campaigns/{id}"), r#"{"priority": "high"}"#)
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    page.wait_until(
        "the class badge in the row, none for a normal campaign",
        Duration::from_secs(10),
        &format!(
            "$('{row} td.id .badge.class-high')?.textContent === 'high' \
             && [...document.querySelectorAll('#campaigns td.id .badge')] \
             .filter((b) => !b.hidden).length === 1"
        ),
    )
    .await;
    check_summary(&mut page, api).await;
    set_weight(&mut page, api, &id, &row).await;
    cancel(&mut page, api, &id, &row).await;

    // A click on the row, outside its controls, opens the campaign's page.
    page.click(&format!("{row} td:nth-child(3)")).await;
    page.wait_until(
        "the campaign page",
        Duration::from_secs(5),
        &format!(
            "$('#overview').hidden && !$('#campaign-page').hidden \
             && window.pushpace.campaignPage.id === {id:?} && location.hash.startsWith('#/campaign/')"
        ),
    )
    .await;
    check_page_contents(&mut page, api, &id).await;
    page.wait_until(
        "the class badge and the policy facts on the page",
        Duration::from_secs(10),
        "!$('#cp-class').hidden && $('#cp-class').textContent === 'high' \
         && $('#cp-class').classList.contains('class-high') \
         && $('#cp-policy [data-k=ramp]').textContent !== '–' \
         && $('#cp-policy [data-k=finish_by]').textContent.startsWith('none') && $('#cp-behind').hidden",
    )
    .await;
    let drawn = check_chart(&mut page, api, &id).await;
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser/campaign.png");
    page.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000, "{drawn}");

    // Back to the overview.
    page.click("#campaign-page a[href='#/']").await;
    page.wait_until(
        "the overview",
        Duration::from_secs(5),
        "!$('#overview').hidden && $('#campaign-page').hidden",
    )
    .await;
    set_start(&mut page, api, &run.plan.campaigns[0].id).await;
    assert_eq!(page.dialogs.len(), 1, "the token was kept for the tab");
    assert!(page.errors.is_empty(), "page errors: {:?}", page.errors);
    drop(page);
    drop(browser);
    run.stop().await;
}
