//! App providers' connections and tokens (issue 55) against the loopback APNs and FCM
//! mocks over real TLS: an idle app connection closes after `idle_close` (never with a
//! send in flight) and the next send reconnects; the worker's connection budget closes
//! the least recently used idle app's connection to open another, never a busy one,
//! and goes over the cap (counted) only when every app is busy; an FCM app idle past
//! its window fetches no token until its next send. The specs come from
//! `named_provider` with [`AppDefaults`], as the worker's app router builds them.

use super::{p256_pem, public_pem};
use pushpace::apps::provider::{named_provider, AppDefaults};
use pushpace::apps::{parse_app, Credentials};
use pushpace::job::Job;
use pushpace::provider::apns::ApnsSender;
use pushpace::provider::fcm::FcmSender;
use pushpace::provider::h2pool::ConnectionBudget;
use pushpace::provider::settings::{ApnsSpec, FcmSpec, ProviderSpec};
use pushpace::sender::{SendOutcome, Sender};
use pushpace::tools::mock::apns::{ApnsMock, MockApnsConfig};
use pushpace::tools::mock::fcm::FcmMock;
use pushpace::tools::mock::h2server::Controls;
use pushpace::tools::mock::tls::TestCa;
use serde_json::{json, Value};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

const TEAM: &str = "TEAM123456";
const KEY_ID: &str = "ABC123DEFG";
const TOPIC: &str = "com.example.app";

/// Short, so the idle test is quick; loopback sends take milliseconds.
const IDLE_CLOSE: Duration = Duration::from_millis(300);
/// For the budget tests: long enough that no connection closes for idleness in them.
const NO_IDLE_CLOSE: Duration = Duration::from_secs(600);
/// How long past its due time an event may take to be seen: a loaded 2-core machine
/// can hold a task back for a second or so; only upper bounds use it.
const SLACK: Duration = Duration::from_secs(3);
/// `now_ms` truncates to whole milliseconds on both ends of an idle interval.
const CLOCK_GRAIN: Duration = Duration::from_millis(2);

fn defaults(ca: &TestCa, idle_close: Duration, budget: &Arc<ConnectionBudget>) -> AppDefaults {
    AppDefaults {
        timeout: Duration::from_secs(5),
        max_in_flight: 100,
        ca_pem: Some(Arc::new(ca.ca_pem().into_bytes())),
        idle_close,
        budget: Arc::clone(budget),
        fcm_refresh_if_used_within: Duration::from_secs(3600),
    }
}

fn creds(body: Value) -> Credentials {
    let input = parse_app(body.to_string().as_bytes()).expect("a good app body");
    let kind = input.kinds().next().cloned();
    kind.expect("one kind")
}

/// An APNs mock with a key of its own, and app `id`'s spec for it.
fn apns_app(ca: &TestCa, id: &str, d: &AppDefaults) -> (ApnsMock, ApnsSpec) {
    let key = p256_pem();
    let config = MockApnsConfig::new(TEAM, KEY_ID, &public_pem(&key), TOPIC);
    let mock = ApnsMock::start(ca, config).expect("APNs mock");
    let c = creds(
        json!({"apns": {"key": key, "key_id": KEY_ID, "team_id": TEAM,
        "topic": TOPIC, "environment": "sandbox", "endpoint": mock.url()}}),
    );
    let ProviderSpec::Apns(mut spec) = named_provider(id, &c, d).expect("spec").spec else {
        panic!("not APNs");
    };
    assert!(
        spec.common.app.is_some(),
        "an app's spec carries its pooling"
    );
    // One slot, so each app pool holds at most one connection and the counts below
    // are exact (two slots would open a second connection on the second send).
    spec.connections = 1;
    (mock, spec)
}

fn apns_job() -> Arc<Job> {
    let token: String = (0..64)
        .map(|_| char::from_digit(fastrand::u32(0..16), 16).unwrap())
        .collect();
    let payload = serde_json::value::RawValue::from_string(r#"{"aps":{"alert":"hi"}}"#.into())
        .expect("payload");
    Arc::new(Job::new("j1", "c1", vec![token], payload).expect("job"))
}

/// A send left in flight: the mock holds its stream until `set_hold(false)`.
async fn held_send(sender: &ApnsSender, mock: &Controls) -> tokio::task::JoinHandle<SendOutcome> {
    let before = mock.held_streams();
    mock.set_hold(true);
    let send = tokio::spawn(sender.send(&apns_job(), 0));
    wait_until("the held stream reaches the mock", || {
        mock.held_streams() > before
    })
    .await;
    send
}

async fn wait_until(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + SLACK + IDLE_CLOSE;
    while !done() {
        assert!(Instant::now() < deadline, "not within {SLACK:?}: {what}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_app_connection_closes_and_the_next_send_reconnects() {
    let ca = TestCa::new();
    let budget = ConnectionBudget::new(10);
    let (mock, spec) = apns_app(&ca, "idle", &defaults(&ca, IDLE_CLOSE, &budget));
    let server = mock.server().controls();
    let sender = ApnsSender::new(&spec).expect("sender");
    assert_eq!(sender.send(&apns_job(), 0).await, SendOutcome::Delivered);
    assert_eq!((server.open_connections(), budget.open()), (1, 1));

    // A send in flight three idle periods long: its connection is never closed.
    let send = held_send(&sender, &server).await;
    tokio::time::sleep(3 * IDLE_CLOSE).await;
    assert_eq!(server.open_connections(), 1, "closed under a stream");
    let released = Instant::now();
    server.set_hold(false);
    assert_eq!(send.await.unwrap(), SendOutcome::Delivered);

    // Idle past idle_close from the last stream's end: the client closes it.
    wait_until("the idle connection closes", || {
        server.open_connections() == 0
    })
    .await;
    assert!(
        released.elapsed() + CLOCK_GRAIN >= IDLE_CLOSE,
        "closed {:?} after its last stream",
        released.elapsed()
    );
    assert_eq!(sender.pool().open_connections(), 0);
    assert_eq!(budget.open(), 0, "its budget place given back");
    // Closed cleanly (a GOAWAY), not torn down under the server.
    assert_eq!(server.first_connection_error(), None);
    assert_eq!(sender.pool().transport_counts().lost, 0);

    // The next send connects again and is delivered.
    assert_eq!(sender.send(&apns_job(), 0).await, SendOutcome::Delivered);
    assert_eq!((server.connections(), server.open_connections()), (2, 1));
    assert_eq!(mock.controls().answers("ok"), 3);
    assert_eq!(budget.open(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_static_providers_connection_stays_open_when_idle() {
    let ca = TestCa::new();
    let budget = ConnectionBudget::new(10);
    let (mock, mut spec) = apns_app(&ca, "static", &defaults(&ca, IDLE_CLOSE, &budget));
    // What `[providers.*]` gives: no app pooling.
    spec.common.app = None;
    let sender = ApnsSender::new(&spec).expect("sender");
    assert_eq!(sender.send(&apns_job(), 0).await, SendOutcome::Delivered);
    tokio::time::sleep(4 * IDLE_CLOSE).await;
    let server = mock.server().controls();
    assert_eq!((server.connections(), server.open_connections()), (1, 1));
    assert_eq!(budget.open(), 0, "a static pool is outside the budget");
}

struct App {
    mock: ApnsMock,
    sender: ApnsSender,
}

impl App {
    fn server(&self) -> Arc<Controls> {
        self.mock.server().controls()
    }
    fn open(&self) -> usize {
        self.sender.pool().open_connections()
    }
    async fn delivers(&self) {
        assert_eq!(
            self.sender.send(&apns_job(), 0).await,
            SendOutcome::Delivered
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_budget_closes_the_least_recently_used_idle_app_never_a_busy_one() {
    let ca = TestCa::new();
    let budget = ConnectionBudget::new(2);
    let d = defaults(&ca, NO_IDLE_CLOSE, &budget);
    let [a, b, c] = ["a", "b", "c"].map(|id| {
        let (mock, spec) = apns_app(&ca, id, &d);
        let sender = ApnsSender::new(&spec).expect("sender");
        App { mock, sender }
    });

    // `a` is used first and stays busy (a send in flight); `b` is used after it.
    let a_send = held_send(&a.sender, &a.server()).await;
    b.delivers().await;
    assert_eq!(budget.open(), 2);
    // `c` needs a third: `a` is the least recently used but busy, so `b` closes.
    c.delivers().await;
    assert_eq!((a.open(), b.open(), c.open()), (1, 0, 1));
    assert_eq!((budget.open(), budget.over_cap()), (2, 0));
    wait_until("b's connection closes", || {
        b.server().open_connections() == 0
    })
    .await;
    assert!(!a_send.is_finished(), "a's send is still in flight");
    a.server().set_hold(false);
    assert_eq!(a_send.await.unwrap(), SendOutcome::Delivered);

    // Now `c` (used before `a`'s send ended) is the least recently used idle app.
    b.delivers().await;
    assert_eq!(
        (a.open(), b.open(), c.open()),
        (1, 1, 0),
        "{budget:?}; a: {} accepted, {} open, {:?}, {:?}, c: {} open",
        a.server().connections(),
        a.server().open_connections(),
        a.server().first_connection_error(),
        a.sender.pool().transport_counts(),
        c.server().open_connections(),
    );
    wait_until("c's connection closes", || {
        c.server().open_connections() == 0
    })
    .await;
    assert_eq!(
        a.server().connections(),
        1,
        "a kept its one connection throughout"
    );
    assert_eq!(budget.over_cap(), 0);

    // Every app holding a connection is busy: the open goes over the cap, counted.
    let a_send = held_send(&a.sender, &a.server()).await;
    let b_send = held_send(&b.sender, &b.server()).await;
    c.delivers().await;
    assert_eq!((a.open(), b.open(), c.open()), (1, 1, 1));
    assert_eq!((budget.open(), budget.over_cap()), (3, 1));
    a.server().set_hold(false);
    b.server().set_hold(false);
    assert_eq!(a_send.await.unwrap(), SendOutcome::Delivered);
    assert_eq!(b_send.await.unwrap(), SendOutcome::Delivered);
    assert_eq!(a.server().connections(), 1);
    assert_eq!(
        [&a, &b, &c].map(|x| x.mock.controls().answers("ok")),
        [2, 3, 2]
    );
}

/// FCM access tokens of the mock live this long (whole seconds); one is refreshed at
/// half its life, so every `TOKEN_TTL / 2` while refreshing.
const TOKEN_TTL: Duration = Duration::from_secs(1);
/// The app refreshes while it sent within this: the refresh at half a life after a
/// send falls well inside it, the one a whole life after falls outside.
const WINDOW: Duration = Duration::from_millis(1250);
/// Past this after its last send the app's refresher is certainly dormant.
const DORMANT_BY: Duration = Duration::from_secs(3);
/// Watched for grants while dormant: four refresh periods.
const QUIET: Duration = Duration::from_secs(2);

fn fcm_spec(mock: &FcmMock, d: &AppDefaults) -> FcmSpec {
    let account: Value = serde_json::from_str(&mock.service_account_json()).unwrap();
    let c = creds(json!({"fcm": {"service_account": account, "endpoint": mock.url()}}));
    let ProviderSpec::Fcm(spec) = named_provider("fcm-app", &c, d).expect("spec").spec else {
        panic!("not FCM");
    };
    spec
}

fn fcm_job() -> Arc<Job> {
    let payload = serde_json::value::RawValue::from_string(r#"{"data":{"k":"v"}}"#.into()).unwrap();
    Arc::new(Job::new("j1", "c1", vec!["dev-1".into()], payload).expect("job"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_fcm_app_idle_past_its_window_asks_for_no_token_until_its_next_send() {
    let ca = TestCa::new();
    let (app_mock, static_mock) = (FcmMock::start(&ca).unwrap(), FcmMock::start(&ca).unwrap());
    app_mock.set_expires_in(TOKEN_TTL);
    static_mock.set_expires_in(TOKEN_TTL);
    let mut d = defaults(&ca, NO_IDLE_CLOSE, &ConnectionBudget::new(10));
    d.fcm_refresh_if_used_within = WINDOW;
    let app = FcmSender::new(&fcm_spec(&app_mock, &d)).expect("app sender");
    let mut fixed_spec = fcm_spec(&static_mock, &d);
    fixed_spec.common.app = None;
    let fixed = FcmSender::new(&fixed_spec).expect("static sender");

    assert_eq!(app.send(&fcm_job(), 0).await, SendOutcome::Delivered);
    tokio::time::sleep(DORMANT_BY).await;
    let (app_grants, fixed_grants) = (app_mock.grants(), static_mock.grants());
    assert!((1..=3).contains(&app_grants), "{app_grants} grants");
    tokio::time::sleep(QUIET).await;
    assert_eq!(
        app_mock.grants(),
        app_grants,
        "the idle app asked for a token"
    );
    assert!(
        static_mock.grants() >= fixed_grants + 2,
        "the static provider refreshes on: {} then {}",
        fixed_grants,
        static_mock.grants()
    );

    // Its token expired long ago: the send fetches one, waits for it, and delivers.
    assert_eq!(app.send(&fcm_job(), 0).await, SendOutcome::Delivered);
    assert_eq!(app_mock.grants(), app_grants + 1);
    assert_eq!(app_mock.delivered("dev-1"), 2);
    // And refreshing resumed: the next one half a life later.
    wait_until("the refresh after the send", || {
        app_mock.grants() >= app_grants + 2
    })
    .await;
    drop(fixed);
}
