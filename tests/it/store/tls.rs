//! PostgreSQL over TLS (`scripts/pg-tls.sh`, started by `scripts/services.sh`): the
//! local server shows a certificate for `localhost` signed by a test CA. `require` and
//! `verify-full` connect; `verify-full` to 127.0.0.1 (a name the certificate lacks) and
//! `verify-full` under another CA are refused at once, with the cause. The worker, the
//! migrations and the CLI each go through `[database]`'s keys.

use crate::harness::TestWorker;
use crate::helpers::{fresh_database, pushpace_bin, run_output, test_settings, wait_for};
use pushpace::tools::produce::ProducePlan;
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// A refusal is one TLS handshake on loopback (a few ms); this leaves room for a busy
/// 2-core machine and is far below the 10 s connect timeout a retry loop would reach.
const REFUSAL_BOUND: Duration = Duration::from_secs(3);
const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// The certificates scripts/pg-tls.sh made.
fn tls_dir() -> PathBuf {
    let dir = std::env::var("PUSHPACE_TOOLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/pushpace")
        })
        .join("pg-tls");
    assert!(
        dir.join("ca.pem").is_file(),
        "no test CA in {}: run scripts/pg-tls.sh start (scripts/services.sh does)",
        dir.display()
    );
    dir
}

fn file(name: &str) -> String {
    tls_dir().join(name).display().to_string()
}

/// `url` (on 127.0.0.1) with another host.
fn on_host(url: &str, host: &str) -> String {
    let mut u = url::Url::parse(url).unwrap();
    u.set_host(Some(host)).unwrap();
    u.to_string()
}

fn keys(url: &str, mode: &str, ca: Option<&str>) -> Vec<(&'static str, String)> {
    let mut keys = vec![
        ("database.url", url.to_string()),
        ("database.sslmode", mode.to_string()),
        (
            "database.connect_timeout_ms",
            CONNECT_TIMEOUT_MS.to_string(),
        ),
    ];
    if let Some(ca) = ca {
        keys.push(("database.sslrootcert", file(ca)));
    }
    keys
}

/// Whether this session runs over TLS, as the server sees it.
async fn server_says_tls(pool: &sqlx::PgPool) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn require_and_verify_full_connect_over_tls() {
    let (_, url) = fresh_database().await;
    for (url, mode, ca) in [
        (url.clone(), "require", None),
        (on_host(&url, "localhost"), "verify-full", Some("ca.pem")),
    ] {
        let settings = test_settings(&keys(&url, mode, ca));
        let pool = settings
            .database
            .connect()
            .await
            .unwrap_or_else(|e| panic!("{mode}: {e}"));
        assert!(
            server_says_tls(&pool).await,
            "{mode}: the session is not TLS"
        );
        pool.close().await;
    }
}

/// `verify-full` refused within [`REFUSAL_BOUND`], with `cause` in the error.
async fn refused(url: &str, ca: &str, cause: &str) {
    let settings = test_settings(&keys(url, "verify-full", Some(ca)));
    let started = Instant::now();
    let e = settings
        .database
        .connect()
        .await
        .expect_err("should be refused");
    let took = started.elapsed();
    let text = e.to_string();
    assert!(text.contains(cause), "{text}");
    assert!(took < REFUSAL_BOUND, "refused after {took:?}: {text}");
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_for_another_name() {
    let (_, url) = fresh_database().await;
    refused(&url, "ca.pem", "not valid for name").await;
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_from_another_ca() {
    let (_, url) = fresh_database().await;
    refused(&on_host(&url, "localhost"), "other-ca.pem", "UnknownIssuer").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_worker_runs_on_a_verify_full_connection() {
    let (_, url) = fresh_database().await;
    let url = on_host(&url, "localhost");
    let keys = keys(&url, "verify-full", Some("ca.pem"));
    let pool = test_settings(&keys).database.connect().await.unwrap();
    assert!(server_says_tls(&pool).await);
    let plan = ProducePlan::with_rates("pgtls", &[(500.0, 400), (500.0, 400)], 100, None).unwrap();
    let total = plan.total_devices() as i64;
    let mut run = TestWorker::options()
        .database(pool.clone(), url)
        .settings(&keys)
        .run_plan(plan)
        .await;
    let sink = run.sink.clone();
    wait_for("every device delivered", Duration::from_secs(60), || {
        sink.summary().distinct_delivered >= total as u64
    })
    .await;
    let end = Instant::now() + Duration::from_secs(30);
    loop {
        let sent: Option<i64> =
            sqlx::query_scalar("SELECT sum(sent)::bigint FROM delivery_seconds")
                .fetch_one(&pool)
                .await
                .unwrap();
        if sent == Some(total) {
            break;
        }
        assert!(
            Instant::now() < end,
            "sent {sent:?} in PostgreSQL, want {total}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    run.stop().await;
}

/// `pushpace migrate` and `pushpace stats prune` with the keys in the environment.
fn cli(args: &[&str], url: &str) -> (bool, String, String) {
    let mut cmd = pushpace_bin();
    cmd.args(args)
        .env("PUSHPACE__DATABASE__URL", url)
        .env("PUSHPACE__DATABASE__SSLMODE", "verify-full")
        .env("PUSHPACE__DATABASE__SSLROOTCERT", file("ca.pem"));
    run_output(&mut cmd)
}

#[tokio::test]
async fn migrate_and_prune_use_the_database_keys() {
    let (_, url) = fresh_database().await;
    let good = on_host(&url, "localhost");
    let (ok, out, err) = cli(&["migrate"], &good);
    assert!(ok, "{err}");
    assert!(out.contains("migrations applied"), "{out}");
    let (ok, out, err) = cli(&["stats", "prune", "--older-than", "30d"], &good);
    assert!(ok, "{out}{err}");
    // The same commands on 127.0.0.1: the keys are applied, so the name does not match.
    for args in [&["migrate"][..], &["stats", "prune", "--older-than", "30d"]] {
        let (ok, _, err) = cli(args, &url);
        assert!(!ok, "{args:?} connected to a certificate for another name");
        assert!(err.contains("not valid for name"), "{args:?}: {err}");
    }
}
