//! The dashboard in real headless Chromium (Debian's `chromium`), driven over the Chrome
//! DevTools protocol, while a real worker sends a campaign: the chart draws points and
//! the send_rate line, a rate typed into the page reaches the API and the worker, the
//! token is asked for once, and a screenshot is saved under target/browser/. The
//! campaign lifecycle's controls and the campaign page: [`lifecycle`]; the apps page:
//! [`apps`].

mod apps;
mod lifecycle;

use crate::api::{spawn_worker_app, TOKEN};
use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio_tungstenite::tungstenite::Message;

const CHROMIUM: &str = "/usr/bin/chromium";

/// A headless Chromium of the test's own, killed on drop.
struct Browser {
    child: std::process::Child,
    _profile: tempfile::TempDir,
    port: u16,
}

impl Browser {
    fn launch() -> Browser {
        let profile = tempfile::tempdir().unwrap();
        let child = std::process::Command::new(CHROMIUM)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--no-first-run",
                "--no-default-browser-check",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=1400,1000",
                "--hide-scrollbars",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("start {CHROMIUM} (scripts/services.sh installs it): {e}"));
        // Chromium writes the port it chose into the profile.
        let port_file = profile.path().join("DevToolsActivePort");
        let end = Instant::now() + Duration::from_secs(30);
        let port = loop {
            if let Some(p) = std::fs::read_to_string(&port_file)
                .ok()
                .and_then(|s| s.lines().next().and_then(|l| l.trim().parse().ok()))
            {
                break p;
            }
            assert!(
                Instant::now() < end,
                "chromium did not open its DevTools port"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        Browser {
            child,
            _profile: profile,
            port,
        }
    }

    /// Connects to the page target.
    async fn page(&self) -> Page {
        let list: Value = serde_json::from_str(
            &reqwest::get(format!("http://127.0.0.1:{}/json/list", self.port))
                .await
                .unwrap()
                .text()
                .await
                .unwrap(),
        )
        .unwrap();
        let ws = list
            .as_array()
            .unwrap()
            .iter()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let (socket, _) = tokio_tungstenite::connect_async(ws).await.unwrap();
        let mut page = Page {
            socket,
            next_id: 0,
            prompt_answer: TOKEN.to_string(),
            dialogs: Vec::new(),
            errors: Vec::new(),
        };
        page.call("Page.enable", json!({})).await;
        page.call("Runtime.enable", json!({})).await;
        page
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One page over the DevTools protocol. Dialogs (the token prompt) are answered as they
/// open, since the page's script is blocked until they are.
struct Page {
    socket: tokio_tungstenite::WebSocketStream<
        tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>,
    >,
    next_id: u64,
    prompt_answer: String,
    /// The messages of the dialogs that opened.
    dialogs: Vec<String>,
    /// Uncaught exceptions and console errors of the page.
    errors: Vec<String>,
}

impl Page {
    async fn send(&mut self, method: &str, params: Value) -> u64 {
        self.next_id += 1;
        let msg = json!({"id": self.next_id, "method": method, "params": params});
        self.socket
            .send(Message::text(msg.to_string()))
            .await
            .unwrap();
        self.next_id
    }

    async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.send(method, params).await;
        loop {
            let msg = tokio::time::timeout(Duration::from_secs(30), self.socket.next())
                .await
                .unwrap_or_else(|_| panic!("no answer to {method}"))
                .expect("DevTools connection open")
                .unwrap();
            let Message::Text(text) = msg else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == id {
                if let Some(e) = v.get("error") {
                    panic!("{method}: {e}");
                }
                return v["result"].clone();
            }
            match v["method"].as_str() {
                Some("Page.javascriptDialogOpening") => {
                    self.dialogs
                        .push(v["params"]["message"].as_str().unwrap_or("").to_string());
                    let answer = json!({"accept": true, "promptText": self.prompt_answer});
                    self.send("Page.handleJavaScriptDialog", answer).await;
                }
                Some("Runtime.exceptionThrown") => self
                    .errors
                    .push(v["params"]["exceptionDetails"].to_string()),
                Some("Runtime.consoleAPICalled") if v["params"]["type"] == "error" => {
                    self.errors.push(v["params"]["args"].to_string())
                }
                _ => {}
            }
        }
    }

    async fn eval(&mut self, expression: &str) -> Value {
        let r = self
            .call(
                "Runtime.evaluate",
                json!({"expression": expression, "returnByValue": true, "awaitPromise": true}),
            )
            .await;
        if let Some(e) = r.get("exceptionDetails") {
            panic!("{expression}: {e}");
        }
        r["result"]["value"].clone()
    }

    async fn wait_until(&mut self, what: &str, limit: Duration, expression: &str) -> Value {
        let end = Instant::now() + limit;
        loop {
            let v = self.eval(expression).await;
            if v.as_bool() == Some(true) || (v.is_object() && v["ok"] == true) {
                return v;
            }
            assert!(
                Instant::now() < end,
                "timed out waiting for {what}: last {v}"
            );
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// A real mouse click at the centre of the element `selector` finds, scrolled into
    /// view first (the campaign table scrolls sideways).
    async fn click(&mut self, selector: &str) {
        let rect = self
            .eval(&format!(
                "(() => {{ const el = document.querySelector({selector:?}); \
                 el.scrollIntoView({{block: 'center', inline: 'center'}}); \
                 const r = el.getBoundingClientRect(); \
                 return {{x: r.x + r.width / 2, y: r.y + r.height / 2}}; }})()"
            ))
            .await;
        for kind in ["mousePressed", "mouseReleased"] {
            self.call(
                "Input.dispatchMouseEvent",
                json!({"type": kind, "x": rect["x"], "y": rect["y"], "button": "left", "clickCount": 1}),
            )
            .await;
        }
    }

    async fn type_text(&mut self, text: &str) {
        self.call("Input.insertText", json!({ "text": text })).await;
    }

    async fn screenshot(&mut self, path: &std::path::Path) {
        let r = self
            .call(
                "Page.captureScreenshot",
                json!({"format": "png", "captureBeyondViewport": true}),
            )
            .await;
        let png = base64::engine::general_purpose::STANDARD
            .decode(r["data"].as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, png).unwrap();
    }
}

/// Counts, in the chart's canvas, the pixels of the sends line and of the send_rate
/// line, the latter only within 2 px of where `rate` sits on the y axis.
fn paint_probe(id: &str) -> String {
    format!(
        r#"(() => {{
  const ch = window.pushpace.charts.get({id:?});
  const u = ch.plot;
  const c = u.ctx.canvas;
  const img = u.ctx.getImageData(0, 0, c.width, c.height).data;
  const near = (i, r, g, b) => Math.abs(img[i] - r) < 30 && Math.abs(img[i + 1] - g) < 30
    && Math.abs(img[i + 2] - b) < 30 && img[i + 3] > 200;
  let sent = 0, rateLine = 0;
  const y = Math.round(u.valToPos(ch.sendRate, "y", true));
  for (let row = 0; row < c.height; row++) {{
    for (let col = 0; col < c.width; col++) {{
      const i = (row * c.width + col) * 4;
      if (near(i, 31, 119, 180)) sent++;
      if (Math.abs(row - y) <= 2 && near(i, 255, 127, 14)) rateLine++;
    }}
  }}
  const d = u.data;
  return {{ points: d[0].length, nonzero: d[1].filter((v) => v > 0).length,
            rate: d[3][d[3].length - 1], sent, rateLine }};
}})()"#
    )
}

/// One Chromium at a time: two of them and their workers on two cores would skew the
/// per-second counts the tests read.
async fn browser_lock() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_draws_live_points_and_changes_the_rate_in_chromium() {
    let _one = browser_lock().await;
    // 3000 devices at 40/s: it runs for the whole test.
    let run = spawn_worker_app(&[(40.0, 3000)]).await;
    let id = run.plan.campaigns[0].id.clone();
    let browser = Browser::launch();
    let mut page = browser.page().await;
    page.call("Page.navigate", json!({ "url": run.api.app.url() + "/" }))
        .await;
    page.wait_until(
        "the page to load",
        Duration::from_secs(20),
        "document.readyState === 'complete' && typeof uPlot === 'function'",
    )
    .await;

    // The table lists the campaign; its chart fills with per-second points.
    page.wait_until(
        "the campaign's row",
        Duration::from_secs(20),
        &format!("!!document.querySelector('tr[data-id={id:?}]')"),
    )
    .await;
    let probe = paint_probe(&id);
    let drawn = page
        .wait_until(
            "ten seconds of sends on the chart",
            Duration::from_secs(60),
            &format!(
                "(() => {{ const ch = window.pushpace.charts.get({id:?}); if (!ch) return false; \
                 const p = {probe}; p.ok = p.nonzero >= 10; return p; }})()"
            ),
        )
        .await;
    assert!(
        drawn["sent"].as_u64().unwrap() > 100,
        "the sends line is painted: {drawn}"
    );
    assert!(
        drawn["rateLine"].as_u64().unwrap() > 40,
        "the send_rate line sits at 40/s: {drawn}"
    );
    assert_eq!(drawn["rate"], 40.0);
    assert_eq!(drawn["points"], 300, "a 5-minute window: {drawn}");
    // The per-second points hover around the rate.
    let per_second = page
        .eval(&format!(
            "(() => {{ const d = window.pushpace.charts.get({id:?}).plot.data[1]; \
             return d.slice(-8, -3); }})()"
        ))
        .await;
    for v in per_second.as_array().unwrap() {
        let v = v.as_f64().unwrap();
        assert!(
            (30.0..=50.0).contains(&v),
            "a second with {v} sends at 40/s: {per_second}"
        );
    }

    // Change the rate from the page: type it, click "Set rate", answer the prompt.
    let row = format!("tr[data-id={id:?}]");
    page.click(&format!("{row} input.rate")).await;
    page.type_text("65").await;
    page.click(&format!("{row} button.set-rate")).await;
    let api = &run.api;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = api.get(&format!("/api/campaigns/{id}")).await;
        if r.body["send_rate"] == 65.0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the rate did not reach the API: {}",
            r.text
        );
        // Keep reading DevTools messages, so that the prompt gets its answer.
        page.eval("1").await;
    }
    assert_eq!(
        page.dialogs.len(),
        1,
        "the token was asked for: {:?}",
        page.dialogs
    );
    assert!(
        page.dialogs[0].contains("Admin token"),
        "{:?}",
        page.dialogs
    );
    // The worker applies it within a second; the chart's line follows.
    let end = Instant::now() + Duration::from_secs(5);
    loop {
        let r = api.get(&format!("/api/campaigns/{id}")).await;
        if r.body["live"]["rate"] == 65.0 {
            break;
        }
        assert!(
            Instant::now() < end,
            "the worker did not take the rate: {}",
            r.text
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    page.wait_until(
        "the send_rate line to move to 65",
        Duration::from_secs(10),
        &format!(
            "(() => {{ const p = {probe}; p.ok = p.rate === 65 && p.rateLine > 40; return p; }})()"
        ),
    )
    .await;
    // Let the higher rate show on the chart, then keep a picture of it.
    tokio::time::sleep(Duration::from_secs(6)).await;
    page.eval("window.pushpace.refresh()").await;
    let shot = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/browser/dashboard.png");
    page.screenshot(&shot).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 10_000);

    // Pause from the page: the token is not asked for again.
    page.click(&format!("{row} button.toggle")).await;
    let end = Instant::now() + Duration::from_secs(10);
    loop {
        let r = api.get(&format!("/api/campaigns/{id}")).await;
        if r.body["status"] == "paused" {
            break;
        }
        assert!(
            Instant::now() < end,
            "pause did not reach the API: {}",
            r.text
        );
        page.eval("1").await;
    }
    assert_eq!(page.dialogs.len(), 1, "the token was kept for the tab");
    page.wait_until(
        "the row to show paused",
        Duration::from_secs(5),
        &format!("document.querySelector('{row} td:nth-child(2)').textContent === 'paused'"),
    )
    .await;
    assert!(page.errors.is_empty(), "page errors: {:?}", page.errors);
    drop(page);
    drop(browser);
    run.stop().await;
}
