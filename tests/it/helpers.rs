//! Shared test helpers: a fresh, migrated database per test, the broker address, and
//! running the `pushpace` binary.

use sqlx::PgPool;
use std::sync::atomic::{AtomicU32, Ordering};

/// The PostgreSQL server tests use (no database part).
pub fn pg_server() -> String {
    std::env::var("PUSHPACE_TEST_PG")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432".into())
}

/// The real Kafka-protocol broker (tansu) that `scripts/services.sh` starts.
pub fn brokers() -> String {
    std::env::var("PUSHPACE_TEST_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into())
}

/// A name no other test (or earlier run) uses: prefix, pid, counter, time.
pub fn unique_name(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!(
        "{prefix}_{}_{}_{nanos}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// Creates a uniquely named database, applies the migrations, and returns a pool and its URL.
pub async fn fresh_database() -> (PgPool, String) {
    fresh_database_on(&pg_server()).await
}

/// A migrated database of its own on `server` (a URL without the database part).
pub async fn fresh_database_on(server: &str) -> (PgPool, String) {
    static SWEPT: tokio::sync::OnceCell<()> = tokio::sync::OnceCell::const_new();
    SWEPT.get_or_init(drop_finished_runs_databases).await;
    let url = format!("{server}/{}", unique_name("pushpace_test"));
    pushpace::store::ensure_database(&url)
        .await
        .expect("create test database");
    let pool = pushpace::store::connect(&url, 5, std::time::Duration::from_secs(10))
        .await
        .expect("connect to test database");
    pushpace::store::migrate(&pool)
        .await
        .expect("migrate test database");
    (pool, url)
}

/// Drops the test databases of test processes that are gone (the pid in the name of
/// [`unique_name`]), once per process: a test cannot drop its own at its end (a failed
/// one unwinds), so each run clears the last one's and the server holds at most one
/// run's worth. A process that is still running keeps its databases.
async fn drop_finished_runs_databases() {
    let url = format!("{}/postgres", pg_server());
    let Ok(admin) = pushpace::store::connect(&url, 1, std::time::Duration::from_secs(10)).await
    else {
        return;
    };
    let names: Vec<String> = sqlx::query_scalar(
        "SELECT datname FROM pg_database WHERE datname LIKE 'pushpace\\_test\\_%'",
    )
    .fetch_all(&admin)
    .await
    .unwrap_or_default();
    let mut dropped = 0;
    for name in names {
        let pid = name.split('_').nth(2).and_then(|p| p.parse::<u32>().ok());
        let alive = pid.is_none_or(|p| std::path::Path::new(&format!("/proc/{p}")).exists());
        if !alive && drop_database_named(&admin, &name).await.is_ok() {
            dropped += 1;
        }
    }
    if dropped > 0 {
        eprintln!("dropped {dropped} databases of finished test runs");
    }
    admin.close().await;
}

/// `DROP DATABASE IF EXISTS … WITH (FORCE)` through `admin` (a pool on another database).
pub async fn drop_database_named(admin: &PgPool, name: &str) -> Result<(), sqlx::Error> {
    // DROP DATABASE takes no bind parameter; quote the identifier instead.
    let quoted = format!("\"{}\"", name.replace('"', "\"\""));
    sqlx::query(&format!("DROP DATABASE IF EXISTS {quoted} WITH (FORCE)"))
        .execute(admin)
        .await
        .map(|_| ())
}

/// The `pushpace` binary that cargo built for these tests.
/// Runs a command to its end: (success, stdout, stderr).
pub fn run_output(cmd: &mut std::process::Command) -> (bool, String, String) {
    let out = cmd.output().expect("run the command");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn pushpace_bin() -> std::process::Command {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_pushpace"));
    cmd.current_dir(env!("CARGO_MANIFEST_DIR"));
    // Tests set what they need explicitly; inherited settings would make them flaky.
    for (k, _) in std::env::vars() {
        if k.starts_with("PUSHPACE__") || k == "PUSHPACE_ENV" {
            cmd.env_remove(k);
        }
    }
    cmd
}

/// A tansu broker of a test's own, on a free loopback port, storing in its own
/// PostgreSQL database, so that a test can restart it without disturbing other tests.
pub struct TansuBroker {
    pub port: u16,
    storage_url: String,
    child: Option<std::process::Child>,
    log: std::path::PathBuf,
}

impl TansuBroker {
    /// Creates the storage database with tansu's schema and starts the broker.
    pub async fn start() -> TansuBroker {
        let storage_url = format!("{}/{}", pg_server(), unique_name("tansu_test"));
        pushpace::store::ensure_database(&storage_url)
            .await
            .expect("create tansu db");
        let schema = std::env::var("TANSU_PG_SCHEMA").unwrap_or_else(|_| {
            concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../shared/tansu/postgres-schema-v0.6.0.sql"
            )
            .into()
        });
        let sql = std::fs::read_to_string(&schema).expect("read tansu schema (TANSU_PG_SCHEMA)");
        let pool = pushpace::store::connect(&storage_url, 1, std::time::Duration::from_secs(10))
            .await
            .unwrap();
        sqlx::raw_sql(&sql)
            .execute(&pool)
            .await
            .expect("load tansu schema");
        pool.close().await;
        let port = free_port();
        let log =
            std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("tansu-{port}.log"));
        let mut b = TansuBroker {
            port,
            storage_url,
            child: None,
            log,
        };
        b.spawn().await;
        b
    }

    pub fn bootstrap(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let bin = std::env::var("PUSHPACE_TANSU_BIN")
            .expect("PUSHPACE_TANSU_BIN must point at tansu 0.6.0 (scripts/test.sh sets it)");
        let url = format!("tcp://127.0.0.1:{}", self.port);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = std::process::Command::new(bin)
            .args([
                "broker",
                "--listener-url",
                &url,
                "--advertised-listener-url",
                &url,
            ])
            // The local server's certificate names localhost, not 127.0.0.1: plain TCP on loopback.
            .args([
                "--storage-engine",
                &format!("{}?sslmode=disable", self.storage_url),
            ])
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("start tansu");
        self.child = Some(child);
        for _ in 0..100 {
            if std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
        panic!(
            "tansu did not listen on {}; see {}",
            self.port,
            self.log.display()
        );
    }

    /// Stops the broker (SIGKILL: the storage must survive a crash) and starts it again.
    pub async fn restart(&mut self) {
        self.stop();
        self.spawn().await;
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for TansuBroker {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loopback port that was free a moment ago.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("bind a free port")
}

/// Timing-sensitive tests (pacing, rates) take this lock so that they do not share the
/// two cores with each other; functional tests run alongside.
pub async fn pacing_lock() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Settings for a worker under test: the repo's config with the given overrides.
/// The test broker's connection keys (plaintext on loopback), for the broker helpers.
pub fn kafka() -> pushpace::config::KafkaSettings {
    test_settings(&[("kafka.brokers", brokers())]).kafka
}

pub fn test_settings(overrides: &[(&str, String)]) -> pushpace::config::Settings {
    pushpace::config::Settings::load(&pushpace::config::LoadOptions {
        config_dir: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/config").into()),
        environment: Some("local".into()),
        overrides: overrides.iter().map(|(k, v)| format!("{k}={v}")).collect(),
    })
    .expect("test settings")
}

/// A topic of the test's own on the shared broker.
pub async fn fresh_topic(partitions: i32) -> String {
    fresh_topic_on(&kafka(), partitions).await
}

/// A topic of the test's own on the broker `kafka` connects to.
pub async fn fresh_topic_on(kafka: &pushpace::config::KafkaSettings, partitions: i32) -> String {
    let topic = unique_name("jobs");
    pushpace::broker::ensure_topic(kafka, &kafka.brokers, &topic, partitions)
        .await
        .expect("create topic");
    topic
}

/// `pushpace run` as a real process, configured through the environment.
pub fn spawn_worker_process(
    bootstrap: &str,
    topic: &str,
    group: &str,
    db_url: &str,
    sink_url: &str,
    extra_env: &[(&str, &str)],
) -> std::process::Child {
    pushpace_bin()
        .arg("run")
        .env("PUSHPACE__KAFKA__BROKERS", bootstrap)
        .env("PUSHPACE__KAFKA__TOPIC", topic)
        .env("PUSHPACE__KAFKA__GROUP_ID", group)
        .env("PUSHPACE__DATABASE__URL", db_url)
        .env("PUSHPACE__SENDER__URL", sink_url)
        .env("PUSHPACE__SENDER__MAX_IN_FLIGHT", "8")
        .env("PUSHPACE__WORKER__STATS_FLUSH_MS", "200")
        .env("PUSHPACE__HTTP__BIND", "127.0.0.1:0")
        .envs(extra_env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start pushpace run")
}

pub fn sigterm_and_wait(child: &mut std::process::Child) -> std::process::ExitStatus {
    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill -TERM");
    assert!(status.success());
    let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return s;
        }
        assert!(
            std::time::Instant::now() < end,
            "worker did not stop within 30 s of SIGTERM"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// A loopback TCP proxy (in front of PostgreSQL, say) that can be taken down (existing
/// connections cut, new ones closed at once) and brought back, or frozen: every byte
/// held in both directions, sockets left open and new connections accepted but not
/// answered, which is what a half-open connection (or a SIGSTOPped proxy) looks like;
/// or only the connections open now frozen, new ones passing.
pub struct Proxy {
    pub port: u16,
    up: tokio::sync::watch::Sender<bool>,
    frozen: tokio::sync::watch::Sender<Hold>,
    /// Connections accepted so far (each one's number).
    accepted: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// Connections through the proxy not yet cut.
    live: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

/// Which connections a [`Proxy`] holds: all, or those numbered below `before`.
#[derive(Clone, Copy, Default)]
struct Hold {
    all: bool,
    before: u64,
}

/// Copies `from` to `to` until either side closes, holding every byte while connection
/// `id` is frozen.
async fn pump(
    id: u64,
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut frozen: tokio::sync::watch::Receiver<Hold>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let free = |h: &Hold| !h.all && id >= h.before;
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        if frozen.wait_for(free).await.is_err() {
            return;
        }
        let n = match from.read(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        // Bytes read just as the freeze began are held too.
        if frozen.wait_for(free).await.is_err() || to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    pub async fn start(target: &'static str) -> Proxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let (up, up_rx) = tokio::sync::watch::channel(true);
        let (frozen, frozen_rx) = tokio::sync::watch::channel(Hold::default());
        let accepted = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let numbering = accepted.clone();
        let live = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let counted = live.clone();
        let task = tokio::spawn(async move {
            use std::sync::atomic::Ordering::SeqCst;
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    return;
                };
                // Counted before `up` is read: a `take_down` either finds it counted or
                // made it see the proxy down.
                counted.fetch_add(1, SeqCst);
                let mut up = up_rx.clone();
                if !*up.borrow_and_update() {
                    counted.fetch_sub(1, SeqCst);
                    continue; // dropped: the client sees the connection closed
                }
                let counted = counted.clone();
                let frozen = frozen_rx.clone();
                let id = numbering.fetch_add(1, SeqCst);
                tokio::spawn(async move {
                    if let Ok(server) = tokio::net::TcpStream::connect(target).await {
                        let (client_read, client_write) = client.into_split();
                        let (server_read, server_write) = server.into_split();
                        tokio::select! {
                            _ = pump(id, client_read, server_write, frozen.clone()) => {}
                            _ = pump(id, server_read, client_write, frozen) => {}
                            _ = up.wait_for(|up| !*up) => {}
                        }
                    }
                    counted.fetch_sub(1, SeqCst);
                });
            }
        });
        Proxy {
            port,
            up,
            frozen,
            accepted,
            live,
            task,
        }
    }

    /// Holds (`true`) or releases every byte through the proxy, connections kept open.
    pub fn freeze(&self, frozen: bool) {
        self.frozen.send_modify(|h| {
            *h = Hold {
                all: frozen,
                before: 0,
            }
        });
    }

    /// Holds every byte of the connections open now (half-open connections); new ones
    /// pass. `freeze(false)` releases them.
    pub fn freeze_existing(&self) {
        let before = self.accepted.load(std::sync::atomic::Ordering::SeqCst);
        self.frozen.send_modify(|h| h.before = before);
    }

    pub fn set_up(&self, up: bool) {
        self.up.send_replace(up);
    }

    /// Takes the proxy down and returns once every connection through it is cut: a
    /// request sent after it cannot still pass on a connection whose cut was pending
    /// (`set_up(false)` alone cuts them on the proxy's own tasks, later).
    pub async fn take_down(&self) {
        self.set_up(false);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        while self.live.load(std::sync::atomic::Ordering::SeqCst) > 0 {
            assert!(
                std::time::Instant::now() < deadline,
                "proxy connections still open 5 s after it was taken down"
            );
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many requests for `token` reached the sink.
pub fn requests_for(sink: &pushpace::tools::sink::SinkHandle, token: &str) -> usize {
    sink.arrivals()
        .iter()
        .filter(|a| a.device_token == token)
        .count()
}

/// Polls `done` every 100 ms; fails the test after `limit`.
pub async fn wait_for(what: &str, limit: std::time::Duration, mut done: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + limit;
    while !done() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// A PostgreSQL server of a test's own (a new cluster on a free loopback port), so that
/// the test can stop it without stopping the broker, which stores in the shared one.
/// Needs Debian's postgresql-common (`pg_createcluster`) and root, as on CI.
pub struct OwnPostgres {
    version: String,
    name: String,
    pub port: u16,
}

impl OwnPostgres {
    pub async fn create() -> OwnPostgres {
        let version = std::fs::read_dir("/etc/postgresql")
            .expect("Debian's PostgreSQL (/etc/postgresql)")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .max_by_key(|v| v.parse::<u32>().unwrap_or(0))
            .expect("a PostgreSQL version");
        let name = unique_name("pp");
        let port = free_port();
        let status = std::process::Command::new("pg_createcluster")
            .args([
                &version,
                &name,
                "-p",
                &port.to_string(),
                "--",
                "-A",
                "trust",
            ])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pg_createcluster");
        assert!(status.success(), "pg_createcluster failed");
        let pg = OwnPostgres {
            version,
            name,
            port,
        };
        pg.start().await;
        pg
    }

    fn ctl(&self, args: &[&str]) {
        let status = std::process::Command::new("pg_ctlcluster")
            .args([self.version.as_str(), self.name.as_str()])
            .args(args)
            .stdout(std::process::Stdio::null())
            .status()
            .expect("pg_ctlcluster");
        assert!(status.success(), "pg_ctlcluster {args:?} failed");
    }

    /// Starts the server and waits until it answers.
    pub async fn start(&self) {
        self.ctl(&["start"]);
        let url = format!("postgres://postgres@127.0.0.1:{}/postgres", self.port);
        wait_for("own PostgreSQL", std::time::Duration::from_secs(30), || {
            std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok()
        })
        .await;
        let end = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while sqlx::PgPool::connect(&url).await.is_err() {
            assert!(
                std::time::Instant::now() < end,
                "own PostgreSQL never answered"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Stops the server (fast: open sessions are ended).
    pub fn stop(&self) {
        self.ctl(&["stop", "-m", "fast"]);
    }

    /// A migrated database on this server, and its URL.
    pub async fn fresh_database(&self) -> (PgPool, String) {
        fresh_database_on(&format!("postgres://postgres@127.0.0.1:{}", self.port)).await
    }
}

impl Drop for OwnPostgres {
    fn drop(&mut self) {
        let _ = std::process::Command::new("pg_dropcluster")
            .args([self.version.as_str(), self.name.as_str(), "--stop"])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status();
    }
}

/// The partitions each worker owns, read from its log: with cooperative rebalancing an
/// "assigned" line adds partitions and a "revoked" line removes them.
pub fn owned_partitions(logs: &[std::path::PathBuf]) -> Vec<std::collections::BTreeSet<i32>> {
    logs.iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            let mut owned = std::collections::BTreeSet::new();
            for line in text.lines() {
                let assigned = line.contains("partitions assigned");
                if !assigned && !line.contains("partitions revoked") {
                    continue;
                }
                let Some(list) = line.rsplit('[').next().and_then(|l| l.split(']').next()) else {
                    continue;
                };
                for p in list.split(',').filter_map(|p| p.trim().parse::<i32>().ok()) {
                    if assigned {
                        owned.insert(p);
                    } else {
                        owned.remove(&p);
                    }
                }
            }
            owned
        })
        .collect()
}

/// How many assignments and revocations the workers have logged: a change means the
/// group moved.
pub fn group_moves(logs: &[std::path::PathBuf]) -> usize {
    logs.iter()
        .map(|path| {
            let text = std::fs::read_to_string(path).unwrap_or_default();
            text.lines()
                .filter(|l| l.contains("partitions assigned") || l.contains("partitions revoked"))
                .count()
        })
        .sum()
}

/// Where [`spawn_logged`] writes the worker `name`'s log.
pub fn worker_log(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.log"))
}

/// `pushpace run` on the shared broker, logging at info to [`worker_log`]`(name)`, where it
/// reports the partitions it is assigned and revoked (see [`owned_partitions`]).
pub fn spawn_logged(
    topic: &str,
    group: &str,
    db_url: &str,
    sink_url: &str,
    env: &[(&str, &str)],
    name: &str,
) -> std::process::Child {
    let log = std::fs::File::create(worker_log(name)).unwrap();
    pushpace_bin()
        .arg("run")
        .env("PUSHPACE__KAFKA__BROKERS", brokers())
        .env("PUSHPACE__KAFKA__TOPIC", topic)
        .env("PUSHPACE__KAFKA__GROUP_ID", group)
        .env("PUSHPACE__DATABASE__URL", db_url)
        .env("PUSHPACE__SENDER__URL", sink_url)
        .env("PUSHPACE__WORKER__STATS_FLUSH_MS", "200")
        .env("PUSHPACE__HTTP__BIND", "127.0.0.1:0")
        .env("RUST_LOG", "info,pushpace=debug")
        .envs(env.iter().copied())
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("start pushpace run")
}

/// More devices for each campaign of `plan` that has fewer than `ahead` of its seconds
/// left unsent (`sent`: what the sink has seen of it), enough for `up_to` seconds, under
/// a new run id so that tokens and job ids stay unique. Adds them to `plan`; `None` when
/// none is short. Tests size their jobs by what they watch this way: how long the broker
/// takes to settle varies from seconds to over a minute, and a watch must never see a
/// campaign run dry.
pub fn top_up_plan(
    plan: &mut pushpace::tools::produce::ProducePlan,
    (ahead, up_to): (std::time::Duration, std::time::Duration),
    sent: impl Fn(&str) -> u64,
) -> Option<pushpace::tools::produce::ProducePlan> {
    let mut more = plan.clone();
    more.run_id = format!("{}-more{}", plan.run_id, plan.total_devices());
    for (c, planned) in more.campaigns.iter_mut().zip(&mut plan.campaigns) {
        let left = (planned.devices as u64).saturating_sub(sent(&c.id));
        let rate = c.send_rate.as_f64();
        let (want, full) = (rate * ahead.as_secs_f64(), rate * up_to.as_secs_f64());
        c.devices = if (left as f64) < want {
            (full.ceil() as u64).saturating_sub(left) as usize
        } else {
            0
        };
        planned.devices += c.devices;
    }
    more.campaigns.retain(|c| c.devices > 0);
    (!more.campaigns.is_empty()).then_some(more)
}

/// Requests held up in transit and arriving with later ones, as a share of a second of
/// the rate. On the 2-core machine, with worker, sink and broker sharing it, 1 s windows
/// by arrival read up to 106 at 100/s, 512 at 500/s and 2,046 at 2,000/s (2026-11-23),
/// and 108 at 100/s in a whole-suite run of 2026-11-27: up to 70 ms of the rate above
/// what the worker released.
pub const ARRIVAL_SLACK_S: f64 = 0.1;

/// A campaign paced at `rate` with no burst, as the worker released it and as the sink
/// saw it; returns the most released and the most arrived in any 1 s window.
///
/// - Counted on release (the `x-pushpace-sent-at` stamp), no window holds more than the
///   rate + 2% + 1: the limiter's promise (one send late, the next on time) within the
///   project's ±2%, which also holds the catch-up after a late wake-up (at most
///   `quantum_min` plus the wake slack, 1.4% of a second).
/// - Counted on arrival, transit bunches requests: [`ARRIVAL_SLACK_S`] more, a looser
///   bound that still catches a worker that stamps on time but sends in bursts.
pub fn assert_paced(
    sink: &pushpace::tools::sink::SinkHandle,
    campaign: &str,
    rate: f64,
) -> (u64, u64) {
    let second = std::time::Duration::from_secs(1);
    let released = sink.max_released_in_window(campaign, second);
    let arrived = sink.max_in_window(campaign, second);
    let release_bound = (rate * 1.02).floor() as u64 + 1;
    let arrival_bound = release_bound + (rate * ARRIVAL_SLACK_S).ceil() as u64;
    eprintln!(
        "{campaign}: rate {rate}/s, largest 1 s window released {released} (bound \
         {release_bound}), at the sink {arrived} (bound {arrival_bound})"
    );
    assert!(
        released <= release_bound,
        "{campaign}: {released} released in a 1 s window > {release_bound}"
    );
    assert!(
        arrived <= arrival_bound,
        "{campaign}: {arrived} arrived in a 1 s window > {arrival_bound}"
    );
    (released, arrived)
}
