//! The `pushpace` binary: configuration layering, clear errors, and `migrate`.

use crate::helpers::{pg_server, pushpace_bin, run_output as run, unique_name};

#[test]
fn config_layers_env_over_files_and_flags_over_env() {
    let (ok, out, err) = run(pushpace_bin().arg("config"));
    assert!(ok, "{err}");
    assert!(out.contains("topic: \"pushpace.jobs\""), "{out}");
    // config/local.toml (the default environment) overrides base.toml.
    assert!(out.contains("ReadUncommitted"), "{out}");

    let (ok, out, err) = run(pushpace_bin()
        .arg("config")
        .env("PUSHPACE_ENV", "production")
        .env("PUSHPACE__KAFKA__BROKERS", "127.0.0.1:19092")
        .env("PUSHPACE__WORKER__STATS_FLUSH_MS", "500"));
    assert!(ok, "{err}");
    assert!(out.contains("ReadCommitted"), "{out}");
    assert!(out.contains("brokers: \"127.0.0.1:19092\""), "{out}");
    assert!(out.contains("stats_flush_ms: 500"), "{out}");

    let (ok, out, err) = run(pushpace_bin()
        .args([
            "config",
            "--set",
            "worker.stats_flush_ms=250",
            "--brokers",
            "embedded",
        ])
        .env("PUSHPACE__WORKER__STATS_FLUSH_MS", "500"));
    assert!(ok, "{err}");
    assert!(out.contains("stats_flush_ms: 250"), "{out}");
    assert!(out.contains("brokers: \"embedded\""), "{out}");
}

#[test]
fn a_bad_value_fails_with_the_key_and_reason() {
    let (ok, _, err) = run(pushpace_bin()
        .arg("config")
        .env("PUSHPACE__KAFKA__TOPIC", ""));
    assert!(!ok);
    assert!(err.contains("kafka.topic: must not be empty"), "{err}");

    let (ok, _, err) = run(pushpace_bin()
        .arg("config")
        .env("PUSHPACE__WORKER__MAX_ACTIVE_CAMPAIGNS", "lots"));
    assert!(!ok);
    assert!(err.contains("max_active_campaigns"), "{err}");

    let (ok, _, err) = run(pushpace_bin().args(["config", "--set", "limiter.send_rate=-1"]));
    assert!(!ok);
    assert!(
        err.contains("limiter.send_rate: send_rate must be greater than 0"),
        "{err}"
    );
}

#[test]
fn secrets_are_not_printed() {
    let (ok, out, err) = run(pushpace_bin()
        .arg("config")
        .env("PUSHPACE__HTTP__ADMIN_TOKEN", "s3cr3t-token-value")
        .env(
            "PUSHPACE__DATABASE__URL",
            "postgres://app:pa55word@127.0.0.1:5432/x",
        ));
    assert!(ok, "{err}");
    assert!(!out.contains("s3cr3t-token-value") && !err.contains("s3cr3t-token-value"));
    assert!(!out.contains("pa55word") && !err.contains("pa55word"));
    assert!(out.contains("app:***@"), "{out}");
}

#[test]
fn url_secrets_are_not_printed() {
    // The provider URL may carry a user and password; PostgreSQL URLs may carry secrets
    // in the query string.
    let (ok, out, err) = run(pushpace_bin()
        .arg("config")
        .env(
            "PUSHPACE__SENDER__URL",
            "https://pushuser:Sender-Pa55@push.example:8443/v1/send?token=tok-in-query",
        )
        .env(
            "PUSHPACE__DATABASE__URL",
            "postgres://app@127.0.0.1:5432/x?sslmode=require&password=QueryPa55\
             &sslpassword=KeyPa55&passfile=%2Fhome%2Fapp%2F.pgpass-secret",
        ));
    assert!(ok, "{err}");
    for secret in [
        "Sender-Pa55",
        "tok-in-query",
        "QueryPa55",
        "KeyPa55",
        ".pgpass-secret",
    ] {
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "{secret} printed: {out}"
        );
    }
    // What is not secret still shows, so the output stays useful; a path may be a
    // webhook's credential, so only its first segment does.
    assert!(
        out.contains("pushuser:***@push.example:8443/v1/***"),
        "{out}"
    );
    assert!(out.contains("sslmode=require"), "{out}");
    assert!(out.contains("password=***"), "{out}");
    // Parameters the PostgreSQL driver would ignore (and log with their values) are
    // dropped, and only their names are said.
    assert!(!out.contains("passfile"), "{out}");
    assert!(err.contains("sslpassword, passfile"), "{err}");

    // The start-up line that names the database (here: `migrate`, which fails to
    // connect to a closed port) hides them too.
    let (ok, out, err) = run(pushpace_bin().args([
        "migrate",
        "--database-url",
        "postgres://app:UserPa55@127.0.0.1:1/x?password=QueryPa55&sslpassword=KeyPa55",
    ]));
    assert!(!ok, "{out}");
    assert!(err.contains("127.0.0.1:1"), "{err}");
    for secret in ["UserPa55", "QueryPa55", "KeyPa55"] {
        assert!(
            !out.contains(secret) && !err.contains(secret),
            "{secret} printed: {err}"
        );
    }
}

#[tokio::test]
async fn migrate_creates_a_fresh_database_and_is_idempotent() {
    let url = format!("{}/{}", pg_server(), unique_name("pushpace_migrate"));
    for _ in 0..2 {
        let (ok, out, err) = run(pushpace_bin().args(["migrate", "--database-url", &url]));
        assert!(ok, "{err}");
        assert!(out.contains("migrations applied:"), "{out}");
    }
    let pool = pushpace::store::connect(&url, 1, std::time::Duration::from_secs(5))
        .await
        .unwrap();
    let applied: i64 = sqlx::query_scalar("SELECT count(*) FROM _sqlx_migrations")
        .fetch_one(&pool)
        .await
        .unwrap();
    let files = std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/migrations"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| e.path().extension().is_some_and(|x| x == "sql"))
        })
        .count();
    assert_eq!(
        applied as usize, files,
        "every migration applied exactly once"
    );
}

/// `pushpace mock apns` as its own process: the files it writes are enough for the real
/// APNs adapter to deliver through it over TLS, and on SIGTERM it writes its counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_apns_mock_process_serves_the_adapter_with_the_files_it_writes() {
    use pushpace::provider::apns::ApnsSender;
    use pushpace::provider::settings::{ApnsEnvironment, ApnsSpec, CommonSpec};
    use pushpace::sender::Sender;
    let dir = std::env::temp_dir().join(unique_name("pushpace_mock"));
    let mut child = pushpace_bin()
        .args(["mock", "apns", "--bind", "127.0.0.1:0", "--dir"])
        .arg(&dir)
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn the mock");
    // The process writes provider.json once it listens; poll for the file (no event to
    // await across processes), up to 30 s for a slow machine.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let info: serde_json::Value = loop {
        let parsed = std::fs::read(dir.join("provider.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        if let Some(v) = parsed {
            break v;
        }
        assert!(std::time::Instant::now() < deadline, "no provider.json");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let s = |k: &str| info["settings"][k].as_str().expect(k).to_string();
    let read = |k: &str| std::fs::read_to_string(s(k)).expect(k);
    let spec = ApnsSpec {
        name: "apns".into(),
        team_id: s("team_id"),
        key_id: s("key_id"),
        key_pem: secrecy::SecretString::from(read("key_file")),
        topic: s("topic"),
        environment: ApnsEnvironment::Sandbox,
        endpoint: s("endpoint"),
        connections: 1,
        token_refresh: std::time::Duration::from_secs(3000),
        common: CommonSpec {
            ca_pem: Some(read("ca_file").into_bytes()),
            ca_file: None,
            max_rate: None,
            timeout: std::time::Duration::from_secs(10),
            max_in_flight: 10,
            adaptive: None,
            app: None,
        },
    };
    let sender = ApnsSender::new(&spec).expect("sender");
    let job = pushpace::job::Job::new(
        String::from("j1"),
        String::from("c1"),
        vec!["ab".repeat(32)],
        serde_json::value::RawValue::from_string(r#"{"aps":{"alert":"hi"}}"#.into()).unwrap(),
    )
    .expect("job");
    let outcome = sender.send(&std::sync::Arc::new(job), 0).await;
    assert!(outcome.is_delivered(), "{outcome:?}");
    // SAFETY: kill(2) on the child this test spawned and has not reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, libc::SIGTERM) };
    assert!(child.wait().expect("wait").success());
    let counts: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("counts.json")).expect("counts"))
            .expect("json");
    assert_eq!(counts["requests"], 1);
    assert_eq!(counts["delivered"], 1);
    let _ = std::fs::remove_dir_all(&dir);
}

/// `pushpace demo --provider apns`: the demo over TLS to the in-process APNs mock
/// delivers every device but the dead one, and records that one as invalid.
#[test]
fn the_demo_with_the_apns_mock_delivers_and_records_the_dead_token() {
    let db = format!("{}/{}", pg_server(), unique_name("pushpace_demo_apns"));
    let (ok, out, err) = run(pushpace_bin()
        .args([
            "demo",
            "--provider",
            "apns",
            "--duration",
            "2",
            "--campaigns",
            "2",
        ])
        .env("PUSHPACE__KAFKA__BROKERS", "embedded")
        .env("PUSHPACE__DATABASE__URL", &db)
        .env("PUSHPACE__HTTP__BIND", "127.0.0.1:0"));
    assert!(ok, "{out}\n{err}");
    assert!(out.contains("200  apns-id "), "{out}");
    assert!(out.contains("410  {\"reason\":\"Unregistered\"}"), "{out}");
    assert!(out.contains("recorded it in invalid_tokens"), "{out}");
    // 20/s and 100/s for 2 s: 40 devices (one dead) and 200, each delivered once.
    assert!(out.contains("39/40"), "{out}");
    assert!(out.contains("200/200"), "{out}");
}

/// `pushpace demo` at the mission's scale on the embedded broker: 100 campaigns whose
/// jobs would overflow the mock cluster's 5 MB per partition if produced up front. Fed
/// progressively, every produced device is delivered once, and the broker drops nothing.
#[test]
fn the_embedded_demo_at_100_campaigns_loses_nothing() {
    let db = format!("{}/{}", pg_server(), unique_name("pushpace_demo_100"));
    let (ok, out, err) = run(pushpace_bin()
        .args(["demo", "--duration", "10", "--campaigns", "100"])
        .env("PUSHPACE__KAFKA__BROKERS", "embedded")
        .env("PUSHPACE__DATABASE__URL", &db)
        .env("PUSHPACE__HTTP__BIND", "127.0.0.1:0"));
    assert!(ok, "{out}\n{err}");
    // 25 campaigns each at 20, 100, 500 and 2000/s for 10 s.
    assert!(
        out.contains("655000 devices produced: 0 lost, 0 duplicates"),
        "{out}"
    );
    assert!(!out.contains("still unsent"), "{out}");
    assert!(!out.contains("WARNING"), "{out}");
    assert!(out.contains("admin token for this run"), "{out}");
    // The scheduled campaign waited for its start.
    let after_ms: i64 = number_after(&out, "first push ", " ms after its start_at");
    assert!(
        (0..=DEMO_START_LATE_MS).contains(&after_ms),
        "scheduled campaign's first push {after_ms} ms after its start"
    );
}

/// The demo's showcase at a size the machine sends in full: 7 campaigns (3,240/s), the
/// second and sixth (100/s each) on a provider capped at 100/s with weights 1 and 3, the
/// last one scheduled 30 s in. The 100-campaign demo asks 65,500/s, more than a debug
/// build on 2 shared cores sends, so there the cap need not bind. A paced test (run
/// alone): the pair's rate is counted at the sink per second of arrival, and among
/// four parallel tests it came out at 96.4/s once (98.9-99.2/s alone, as before this
/// change).
#[test]
fn paced_the_demo_shows_a_weighted_pair_under_its_cap_and_a_scheduled_start() {
    let db = format!("{}/{}", pg_server(), unique_name("pushpace_demo_7"));
    let (ok, out, err) = run(pushpace_bin()
        .args(["demo", "--duration", "20", "--campaigns", "7"])
        .env("PUSHPACE__KAFKA__BROKERS", "embedded")
        .env("PUSHPACE__DATABASE__URL", &db)
        .env("PUSHPACE__HTTP__BIND", "127.0.0.1:0"));
    assert!(ok, "{out}\n{err}");
    assert!(out.contains(": 0 lost, 0 duplicates"), "{out}");
    for l in out
        .lines()
        .filter(|l| l.contains("first push") || l.contains("weighted pair"))
    {
        eprintln!("{l}");
    }
    let after_ms: i64 = number_after(&out, "first push ", " ms after its start_at");
    assert!(
        (0..=DEMO_START_LATE_MS).contains(&after_ms),
        "scheduled campaign's first push {after_ms} ms after its start"
    );
    // The cap bound (its 100/s, less 2% for sends shifted across a second's edge), and
    // the pair shared it 1:3 (the issue's ±5%).
    let together: f64 = number_after(&out, ", together ", "/s under a cap of 100/s");
    assert!(
        together >= 98.0,
        "the cap did not bind: {together}/s\n{out}"
    );
    let ratio: f64 = number_after(&out, ", ratio ", " (weights 1:3)");
    assert!(
        (2.85..=3.15).contains(&ratio),
        "weighted ratio {ratio}: {out}"
    );
}

/// How late the demo's scheduled campaign may start: the due queue wakes it at its
/// instant; the rest is its first push's trip to the sink on a machine that runs the
/// rest of the suite at once.
const DEMO_START_LATE_MS: i64 = 2_000;

/// The number between `before` and `after` on the line of `out` that has both.
fn number_after<T: std::str::FromStr>(out: &str, before: &str, after: &str) -> T {
    out.lines()
        .find_map(|l| {
            let rest = &l[l.find(before)? + before.len()..];
            rest[..rest.find(after)?].trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("no line with {before:?}…{after:?} in:\n{out}"))
}

/// Without `--duration` the demo keeps feeding and sending until Ctrl-C: still running
/// past the point a sized run would have produced everything, its counts still rising;
/// then SIGINT stops the feeding, what was produced is sent, and nothing is lost.
#[test]
fn the_open_ended_demo_runs_until_ctrl_c_and_loses_nothing() {
    use std::io::BufRead;
    let db = format!("{}/{}", pg_server(), unique_name("pushpace_demo_open"));
    let mut child = pushpace_bin()
        .args(["demo", "--campaigns", "1"])
        .env("PUSHPACE__KAFKA__BROKERS", "embedded")
        .env("PUSHPACE__DATABASE__URL", &db)
        .env("PUSHPACE__HTTP__BIND", "127.0.0.1:0")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start the demo");
    let stdout = child.stdout.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let mut out = String::new();
    let mut ticks = 0;
    let end = std::time::Instant::now() + OPEN_DEMO_LIMIT;
    // Ticks of a second each: past the 20 s of devices it sizes an open run's first
    // jobs by, so feeding on is what keeps it sending.
    while ticks < OPEN_DEMO_TICKS {
        let left = end.saturating_duration_since(std::time::Instant::now());
        let line = rx.recv_timeout(left).unwrap_or_else(|_| {
            let _ = child.kill();
            panic!("the demo stopped or stalled after {ticks} ticks:\n{out}")
        });
        ticks += usize::from(line.starts_with("t="));
        out.push_str(&line);
        out.push('\n');
    }
    assert!(out.contains("the campaigns run until Ctrl-C"), "{out}");
    assert!(child.try_wait().unwrap().is_none(), "{out}");
    let status = std::process::Command::new("kill")
        .args(["-INT", &child.id().to_string()])
        .status()
        .expect("kill -INT");
    assert!(status.success());
    let status = child.wait().expect("the demo ends");
    for line in rx.iter() {
        out.push_str(&line);
        out.push('\n');
    }
    assert!(status.success(), "{status}\n{out}");
    assert!(out.contains("Ctrl-C: no more jobs"), "{out}");
    assert!(out.contains(": 0 lost, 0 duplicates"), "{out}");
    assert!(!out.contains("still unsent"), "{out}");
}

/// One-second ticks the open-ended demo must print before the test stops it: more than
/// the 20 s its first jobs are sized by.
const OPEN_DEMO_TICKS: usize = 25;
/// The embedded broker and the database start in seconds; the rest is the ticks.
const OPEN_DEMO_LIMIT: std::time::Duration = std::time::Duration::from_secs(90);
