//! Unit tests of loading: layers, names, bounds, secrets.

use super::*;
use crate::limiter::Algorithm;
use secrecy::ExposeSecret;

pub(super) fn load(env: &[(&str, &str)], overrides: &[&str]) -> Result<Settings, ConfigError> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = env.clone();
    Settings::load_with_env(
        &LoadOptions {
            config_dir: Some(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config")),
            environment: None,
            overrides: overrides.iter().map(|s| s.to_string()).collect(),
        },
        move |k| lookup.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
        env.into_iter(),
    )
}

#[test]
fn limiter_scope_names_round_trip() {
    for s in LimiterScope::ALL {
        assert_eq!(s.as_str().parse::<LimiterScope>(), Ok(s));
    }
    assert!("global".parse::<LimiterScope>().is_err());
}

#[test]
fn layers_apply_in_order() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(s.kafka.topic, "pushpace.jobs");
    // local.toml overrides base.toml.
    assert_eq!(s.kafka.isolation_level, IsolationLevel::ReadUncommitted);
    let s = load(&[("PUSHPACE_ENV", "production")], &[]).unwrap();
    assert_eq!(s.kafka.isolation_level, IsolationLevel::ReadCommitted);
    assert_eq!(s.sender.max_in_flight, 2048);
    // Environment beats files; flags beat environment.
    let s = load(
        &[
            ("PUSHPACE__KAFKA__BROKERS", "127.0.0.1:19092"),
            ("PUSHPACE__WORKER__STATS_FLUSH_MS", "500"),
        ],
        &["worker.stats_flush_ms=250"],
    )
    .unwrap();
    assert_eq!(s.kafka.brokers, "127.0.0.1:19092");
    assert_eq!(s.worker.stats_flush_ms, 250);
}

#[test]
fn enum_keys_take_the_documented_names() {
    for name in ["range", "roundrobin", "cooperative-sticky"] {
        let s = load(&[], &[&format!("kafka.assignment_strategy={name}")]).unwrap();
        assert_eq!(s.kafka.assignment_strategy.as_str(), name);
    }
    for name in ["read_committed", "read_uncommitted"] {
        let s = load(&[], &[&format!("kafka.isolation_level={name}")]).unwrap();
        assert_eq!(s.kafka.isolation_level.as_str(), name);
    }
    for scope in LimiterScope::ALL {
        let s = load(&[], &[&format!("limiter.scope={}", scope.as_str())]).unwrap();
        assert_eq!(s.limiter.scope, scope);
    }
    for a in Algorithm::ALL {
        let s = load(&[], &[&format!("limiter.algorithm={}", a.as_str())]).unwrap();
        assert_eq!(s.limiter.algorithm, a);
    }
}

#[test]
fn invalid_values_name_the_key() {
    let e = load(&[("PUSHPACE__KAFKA__TOPIC", " ")], &[]).unwrap_err();
    assert_eq!(e.to_string(), "kafka.topic: must not be empty");
    let e = load(&[], &["limiter.send_rate=0"]).unwrap_err();
    assert!(e.to_string().starts_with("limiter.send_rate: "), "{e}");
    let e = load(&[], &["worker.quantum_max_ms=5"]).unwrap_err();
    assert!(e.to_string().starts_with("worker.quantum_max_ms"), "{e}");
    // A slack past half of quantum_min could outlast what a late turn makes up.
    let e = load(&[], &["worker.wake_slack_ms=6"]).unwrap_err();
    assert!(e.to_string().starts_with("worker.wake_slack_ms"), "{e}");
    assert!(load(&[], &["worker.wake_slack_ms=5"]).is_ok());
    assert!(load(&[], &["worker.wake_slack_ms=0"]).is_ok());
    let e = load(&[], &["worker.second_edge_ms=6"]).unwrap_err();
    assert!(e.to_string().starts_with("worker.second_edge_ms"), "{e}");
    assert!(load(&[], &["worker.second_edge_ms=0"]).is_ok());
    for bad in ["0", "5001"] {
        let e = load(&[("PUSHPACE__KAFKA__FETCH_WAIT_MAX_MS", bad)], &[]).unwrap_err();
        assert_eq!(e.to_string(), "kafka.fetch_wait_max_ms: must be 1–5000");
    }
    for bad in ["99", "2001"] {
        let e = load(&[], &[&format!("kafka.heartbeat_interval_ms={bad}")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            "kafka.heartbeat_interval_ms: must be 100–2000 (a third of kafka.session_timeout_ms)"
        );
    }
    for bad in ["3600000", "31536000001"] {
        let e = load(&[], &[&format!("database.rollup_after_ms={bad}")]).unwrap_err();
        assert!(
            e.to_string().starts_with("database.rollup_after_ms: "),
            "{e}"
        );
    }
    let s = load(&[], &[]).unwrap();
    assert_eq!(s.database.rollup_after(), chrono::Duration::hours(48));
    let e = load(&[], &["limiter.algorithm=magic"]).unwrap_err();
    assert!(e.to_string().contains("magic"), "{e}");
    let e = load(&[("PUSHPACE__SENDER__HTTP1_CLIENT", "curl")], &[]).unwrap_err();
    let chain = format!("{:#}", anyhow::Error::from(e));
    assert!(chain.contains("sender.http1_client"), "{chain}");
    assert_eq!(chain.matches("curl").count(), 1, "said once: {chain}");
    assert!(
        chain.contains("`hyper` or `reqwest`"),
        "lists the names: {chain}"
    );
    let e = load(&[], &["kafka.assignment_strategy=sticky"]).unwrap_err();
    let text = e.to_string();
    for name in [
        "kafka.assignment_strategy",
        "sticky",
        "`cooperative-sticky`",
    ] {
        assert!(text.contains(name), "{name}: {text}");
    }
    let e = load(&[("PUSHPACE_ENV", "nowhere")], &[]).unwrap_err();
    assert!(e.to_string().contains("nowhere"), "{e}");
}

#[test]
fn url_secrets_are_redacted() {
    assert_eq!(
        redact_url("https://u:p4ss@push.example:8443/v1?token=t0k&x=1#frag"),
        "https://u:***@push.example:8443/v1?token=***&x=***#***"
    );
    assert_eq!(
        redact_url("postgres://app@db/x?sslmode=require&PASSWORD=a&sslpassword=b&passfile=%2Fp"),
        "postgres://app@db/x?sslmode=require&PASSWORD=***&sslpassword=***&passfile=***"
    );
    assert_eq!(redact_url("http://h/p"), "http://h/p");
    assert_eq!(redact_url("not a url"), "<unparsable url>");

    let s = load(
        &[
            (
                "PUSHPACE__SENDER__URL",
                "https://user:Sender-Pa55@push.example/send",
            ),
            (
                "PUSHPACE__DATABASE__URL",
                "postgres://app@127.0.0.1/x?password=Q-Pa55&sslpassword=K-Pa55&passfile=%2Fpf-X9",
            ),
        ],
        &[],
    )
    .unwrap();
    let dbg = format!("{s:?}");
    for secret in ["Sender-Pa55", "Q-Pa55", "K-Pa55", "pf-X9"] {
        assert!(!dbg.contains(secret), "{secret}: {dbg}");
    }
    assert!(dbg.contains("user:***@push.example"), "{dbg}");
    // The driver's own parameters stay (password still reaches it); the ones it
    // would log and ignore are dropped.
    assert_eq!(
        s.database.url.expose_secret(),
        "postgres://app@127.0.0.1/x?password=Q-Pa55"
    );
    assert_eq!(s.sender.url, "https://user:Sender-Pa55@push.example/send");
}

#[test]
fn rates_bursts_and_hosts_are_bounded() {
    for bad in ["0.0009", "1e-300"] {
        let e = load(&[], &[&format!("limiter.send_rate={bad}")]).unwrap_err();
        assert!(e.to_string().contains("at least 0.001"), "{e}");
        let e = load(&[], &[&format!("limiter.global_rate={bad}")]).unwrap_err();
        assert!(e.to_string().starts_with("limiter.global_rate: "), "{e}");
    }
    assert!(load(&[], &["limiter.send_rate=0.001"]).is_ok());
    assert!(load(&[], &["limiter.burst=10000"]).is_ok());
    for bad in ["10001", "2147483647"] {
        let e = load(&[], &[&format!("limiter.burst={bad}")]).unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("limiter.burst: must be 0 to 10000, got {bad}")
        );
    }
    let s = load(
        &[("PUSHPACE__HTTP__ALLOWED_HOSTS", "a.example, b.example:9000")],
        &[],
    )
    .unwrap();
    assert_eq!(s.http.allowed_hosts, ["a.example", "b.example:9000"]);
    assert!(load(&[], &[]).unwrap().http.allowed_hosts.is_empty());
    for bad in ["http://a.example", "a.example/x", "a.example:port"] {
        let e = load(&[], &[&format!("http.allowed_hosts={bad}")]).unwrap_err();
        assert!(e.to_string().starts_with("http.allowed_hosts: "), "{e}");
    }
}

#[test]
fn secrets_stay_out_of_debug() {
    let s = load(
        &[
            ("PUSHPACE__HTTP__ADMIN_TOKEN", "tok-very-secret"),
            (
                "PUSHPACE__DATABASE__URL",
                "postgres://app:hunter2@127.0.0.1:5432/pushpace",
            ),
        ],
        &[],
    )
    .unwrap();
    let dbg = format!("{s:?}");
    assert!(!dbg.contains("tok-very-secret"), "{dbg}");
    assert!(!dbg.contains("hunter2"), "{dbg}");
    assert_eq!(s.http.admin_token(), Some("tok-very-secret"));
    assert_eq!(
        s.database.url_for_display(),
        "postgres://app:***@127.0.0.1:5432/pushpace"
    );
}

#[test]
fn hygiene_invalid_ttl_defaults_to_30_days_and_is_bounded() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(
        s.hygiene.ttl(),
        std::time::Duration::from_secs(30 * 24 * 3600)
    );
    assert_eq!(s.hygiene.ttl(), crate::hygiene::DEFAULT_INVALID_TTL);
    let s = load(&[("PUSHPACE__HYGIENE__INVALID_TTL", "3600")], &[]).unwrap();
    assert_eq!(s.hygiene.invalid_ttl, 3600);
    for bad in ["0", "315360001"] {
        let e = load(&[], &[&format!("hygiene.invalid_ttl={bad}")]).unwrap_err();
        assert!(e.to_string().starts_with("hygiene.invalid_ttl: "), "{e}");
    }
}

#[test]
fn the_flusher_bounds_default_to_10_s_and_are_checked() {
    let s = load(&[], &[]).unwrap();
    assert_eq!(s.worker.stats_max_unwritten_ms, 10_000);
    assert_eq!(s.worker.write_timeout_ms, 10_000);
    for bad in ["999", "600001"] {
        let e = load(&[], &[&format!("worker.stats_max_unwritten_ms={bad}")]).unwrap_err();
        assert!(
            e.to_string().starts_with("worker.stats_max_unwritten_ms: "),
            "{e}"
        );
    }
    // Never under one flush interval: it would hold sending between healthy flushes.
    let e = load(
        &[],
        &[
            "worker.stats_flush_ms=2000",
            "worker.stats_max_unwritten_ms=2000",
        ],
    )
    .unwrap_err();
    assert!(
        e.to_string().starts_with("worker.stats_max_unwritten_ms: "),
        "{e}"
    );
    for bad in ["99", "600001"] {
        let e = load(&[], &[&format!("worker.write_timeout_ms={bad}")]).unwrap_err();
        assert_eq!(e.to_string(), "worker.write_timeout_ms: must be 100–600000");
    }
    assert!(load(&[], &["worker.write_timeout_ms=100"]).is_ok());
}

#[test]
fn the_delivery_policy_keys_default_and_are_bounded() {
    let s = load(&[], &[]).unwrap();
    let l = &s.limiter;
    assert_eq!(
        (
            l.ramp_up_s,
            l.ramp_from,
            l.start_jitter_ms,
            l.critical_overdraft
        ),
        (0.0, crate::job::policy::DEFAULT_RAMP_FROM, 0, 0.0)
    );
    let s = load(
        &[("PUSHPACE__LIMITER__RAMP_UP_S", "120")],
        &[
            "limiter.ramp_from=0.25",
            "limiter.start_jitter_ms=3600000",
            "limiter.critical_overdraft=1",
        ],
    )
    .unwrap();
    let l = &s.limiter;
    assert_eq!(
        (
            l.ramp_up_s,
            l.ramp_from,
            l.start_jitter_ms,
            l.critical_overdraft
        ),
        (120.0, 0.25, 3_600_000, 1.0)
    );
    assert!(load(&[], &["limiter.ramp_up_s=86400", "limiter.ramp_from=0.01"]).is_ok());
    for (key, bad) in [
        ("ramp_up_s", "-1"),
        ("ramp_up_s", "86401"),
        ("ramp_up_s", "nan"),
        ("ramp_from", "0"),
        ("ramp_from", "0.009"),
        ("ramp_from", "1.5"),
        ("start_jitter_ms", "3600001"),
        ("critical_overdraft", "-0.1"),
        ("critical_overdraft", "1.01"),
    ] {
        let e = load(&[], &[&format!("limiter.{key}={bad}")]).unwrap_err();
        assert!(
            e.to_string().starts_with(&format!("limiter.{key}: ")),
            "{key}={bad}: {e}"
        );
    }
}
