//! A webhook that refuses its credentials or its path halts instead of dead-lettering
//! every device, and a device's dead letter holds what replays it. Through the real
//! worker: the broker, PostgreSQL and a loopback webhook answering as told.

use crate::harness::{Producer, Record, TestWorker};
use crate::helpers::unique_name;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use parking_lot::Mutex;
use pushpace::provider::{ProviderKind, Providers};
use pushpace::sender::{AnySender, HttpSender, HttpSenderConfig};
use pushpace::store::dead_letters;
use pushpace::worker::scheduler::PROBE_IN_FLIGHT;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A worker's first sends: tansu's group join takes seconds, on 2 cores shared with
/// other tests.
const GROUP_JOIN: Duration = Duration::from_secs(60);
/// Writes after an event (stats flushed every 200 ms, records at once), on a loaded machine.
const DB_WRITE: Duration = Duration::from_secs(30);
/// How long a halted campaign is watched for sends it should not make: many times the
/// loopback round trip, so sends dispatched before the halt have all arrived.
const AFTER_HALT: Duration = Duration::from_secs(2);

/// What the loopback webhook saw: (device token, payload text) per request.
type Seen = Arc<Mutex<Vec<(String, String)>>>;
/// The webhook's state: what it saw, "accept all", and its answer per token.
type HookState = (Seen, Arc<AtomicBool>, fn(&str) -> u16);

struct Hook {
    url: String,
    seen: Seen,
    /// Answer 200 to everything from now on.
    accept_all: Arc<AtomicBool>,
}

impl Hook {
    fn requests(&self) -> usize {
        self.seen.lock().len()
    }

    fn sent_to(&self, token: &str) -> Vec<String> {
        let seen = self.seen.lock();
        seen.iter()
            .filter(|(t, _)| t == token)
            .map(|(_, p)| p.clone())
            .collect()
    }
}

/// A loopback webhook answering `status(token)` (until told to accept all).
async fn hook(status: fn(&str) -> u16) -> Hook {
    let seen: Seen = Arc::default();
    let accept_all = Arc::new(AtomicBool::new(false));
    let state = (seen.clone(), accept_all.clone(), status);
    let app = axum::Router::new()
        .fallback(
            |State((seen, all, status)): State<HookState>, body: Bytes| async move {
                let v: serde_json::Value = serde_json::from_slice(&body).unwrap_or_default();
                let token = v["device_token"].as_str().unwrap_or("").to_string();
                let payload = v["payload"].to_string();
                let code = if all.load(Ordering::Relaxed) {
                    200
                } else {
                    status(&token)
                };
                seen.lock().push((token, payload));
                StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
            },
        )
        .with_state(state);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/push", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, app).await });
    Hook {
        url,
        seen,
        accept_all,
    }
}

/// A worker whose one provider, `hook`, is the loopback webhook.
async fn worker(hook: &Hook) -> TestWorker {
    let sender = HttpSender::new(&HttpSenderConfig::new(hook.url.clone())).unwrap();
    let providers = Providers::single("hook", ProviderKind::Webhook, AnySender::Http(sender));
    TestWorker::options().providers(providers).spawn().await
}

fn job_text(job_id: &str, campaign: &str, devices: &[String], payload: &str) -> String {
    format!(
        r#"{{"job_id":"{job_id}","campaign_id":"{campaign}","send_rate":1000,"provider":"hook","ttl_s":600,"devices":{},"payload":{payload}}}"#,
        serde_json::to_string(devices).unwrap()
    )
}

async fn produce(topic: &str, text: &[u8]) {
    Producer::new().send(topic, Record::of(text)).await;
}

async fn wait_until<F, Fut>(what: &str, limit: Duration, mut done: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < end, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn status(pool: &sqlx::PgPool, campaign: &str) -> Option<String> {
    sqlx::query_scalar("SELECT status FROM campaigns WHERE id = $1")
        .bind(campaign)
        .fetch_optional(pool)
        .await
        .unwrap()
}

async fn letters(pool: &sqlx::PgPool, campaign: &str) -> Vec<(i64, String, String)> {
    sqlx::query_as(
        "SELECT id, device_token, reason FROM dead_letters WHERE campaign_id = $1 ORDER BY id",
    )
    .bind(campaign)
    .fetch_all(pool)
    .await
    .unwrap()
}

/// 401 (credentials) and 404 (path): every send would get it. The campaign halts after
/// at most the probe's sends, and no device is dead-lettered for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_webhook_refusing_its_credentials_or_path_halts_within_the_probe() {
    const DEVICES: usize = 40;
    fn unauthorized(_: &str) -> u16 {
        401
    }
    fn not_found(_: &str) -> u16 {
        404
    }
    for (code, answer) in [(401, unauthorized as fn(&str) -> u16), (404, not_found)] {
        let hook = hook(answer).await;
        let mut tw = worker(&hook).await;
        let run = unique_name("wh").replace('_', "-");
        let campaign = format!("{run}-c");
        let devices: Vec<String> = (0..DEVICES).map(|i| format!("{run}-d{i}")).collect();
        let text = job_text(&format!("{run}-j"), &campaign, &devices, r#"{"m":1}"#);
        produce(&tw.topic, text.as_bytes()).await;
        let pool = tw.pool.clone();
        wait_until(
            &format!("HTTP {code}: the campaign halted"),
            GROUP_JOIN,
            || {
                let pool = pool.clone();
                let campaign = campaign.clone();
                async move { status(&pool, &campaign).await.as_deref() == Some("halted") }
            },
        )
        .await;
        tokio::time::sleep(AFTER_HALT).await;
        tw.stop().await;
        let sent = hook.requests();
        assert!(
            (1..=PROBE_IN_FLIGHT as usize).contains(&sent),
            "HTTP {code}: {sent} sends, at most {PROBE_IN_FLIGHT} allowed"
        );
        let l = letters(&pool, &campaign).await;
        assert!(l.is_empty(), "HTTP {code}: no device dead-lettered: {l:?}");
    }
}

/// A device the webhook rejects (400) is a letter; the letter replays as its job with
/// that one device, payload byte for byte, and the worker delivers the replay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_device_letter_replays_with_its_payload() {
    fn reject_bad(token: &str) -> u16 {
        if token.contains("-bad-") {
            400
        } else {
            200
        }
    }
    let hook = hook(reject_bad).await;
    let mut tw = worker(&hook).await;
    let (pool, topic) = (tw.pool.clone(), tw.topic.clone());
    let run = unique_name("rp").replace('_', "-");
    let campaign = format!("{run}-c");
    let bad = format!("{run}-bad-1");
    let good = format!("{run}-ok-1");
    // Spacing and escapes a re-encoding would change.
    let payload = r#"{ "title" : "Hello \u00e9 \"you\"", "n":1.50 }"#;
    let text = job_text(
        &format!("{run}-j"),
        &campaign,
        &[good.clone(), bad.clone()],
        payload,
    );
    produce(&topic, text.as_bytes()).await;
    wait_until("the rejected device's letter", GROUP_JOIN, || {
        let (pool, campaign) = (pool.clone(), campaign.clone());
        async move { letters(&pool, &campaign).await.len() == 1 }
    })
    .await;
    let (id, token, reason) = letters(&pool, &campaign).await.remove(0);
    assert_eq!(token, bad);
    assert!(reason.contains("HTTP 400"), "{reason}");

    let message = dead_letters::replay_message(&pool, id, &format!("{run}-replay"))
        .await
        .unwrap()
        .expect("a device letter can be replayed");
    let job = pushpace::job::decode(&message).expect("the replay is a valid job");
    assert_eq!(job.devices, std::slice::from_ref(&bad));
    assert_eq!(job.payload.get(), payload, "the payload byte for byte");
    assert_eq!(job.provider.as_deref(), Some("hook"));
    assert_eq!(job.options.ttl_s, Some(600));
    assert_eq!(job.campaign_id, campaign);

    hook.accept_all.store(true, Ordering::Relaxed);
    produce(&topic, &message).await;
    wait_until("the replay delivered", DB_WRITE, || async {
        hook.sent_to(&bad).len() == 2
    })
    .await;
    tw.stop().await;
    let sent = hook.sent_to(&bad);
    assert_eq!(sent[0], sent[1], "the replay carries the same payload");
    assert_eq!(hook.sent_to(&good).len(), 1);
    assert_eq!(letters(&pool, &campaign).await.len(), 1, "no new letter");
}
