//! Redis over TLS with an ACL user: the second redis-server that `scripts/redis-tls.sh`
//! starts (`scripts/services.sh` does) on 127.0.0.1:6380, TLS only, under the name
//! `localhost` with a test CA, user `pushpace`, the default user off. The leases and
//! the shared cap run over it; each wrong credential or certificate names its cause.

use super::leases::three_workers_share_2000_per_s;
use super::*;
use crate::helpers::test_settings;
use pushpace::capping::shared::{SharedCap, SharedCapConfig};
use pushpace::capping::CapConfig;
use std::path::PathBuf;

const USER: &str = "pushpace";
const PASSWORD: &str = "pushpace-redis-test-password";
/// What a refused connection must say within: the connect timeout (500 ms in
/// `config`) and one retry pause, on a busy 2-core machine.
const REFUSAL_WITHIN: Duration = Duration::from_secs(5);

/// The certificates scripts/redis-tls.sh made.
fn tls_dir() -> PathBuf {
    let dir = std::env::var("PUSHPACE_TEST_REDIS_TLS_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(std::env::var("HOME").expect("HOME")).join(".cache/pushpace/redis-tls")
        });
    assert!(
        dir.join("ca.pem").is_file(),
        "no test CA in {}: run scripts/redis-tls.sh start (scripts/services.sh does)",
        dir.display()
    );
    dir
}

/// `rediss://user:password@host:6380` with the CA file `ca`.
fn target(host: &str, password: &str, ca: &str) -> RedisTarget {
    let mut t = RedisTarget::url(format!("rediss://{USER}:{password}@{host}:6380"));
    t.ca_file = Some(tls_dir().join(ca));
    t
}

fn good() -> RedisTarget {
    target("localhost", PASSWORD, "ca.pem")
}

/// The error a factory on `t` reports once its first attempt has failed.
async fn refusal(t: RedisTarget) -> String {
    let f = RedisLimiterFactory::new(
        config(t, RedisAlgorithm::RedisGcra, 100, 1),
        Arc::new(MonotonicClock::new()),
    )
    .unwrap();
    let end = Instant::now() + REFUSAL_WITHIN;
    loop {
        assert!(!f.is_connected(), "connected, but should have been refused");
        if let Some(e) = f.connect_error() {
            eprintln!("refused: {e}");
            return e;
        }
        assert!(Instant::now() < end, "no error within {REFUSAL_WITHIN:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paced_redis_gcra_leases_share_one_rate_between_three_workers_over_tls_with_an_acl_user() {
    let _g = pacing_lock().await;
    three_workers_share_2000_per_s(&good()).await;
}

#[tokio::test]
async fn mutual_tls_with_a_client_certificate_connects() {
    let mut t = good();
    t.cert_file = Some(tls_dir().join("client.pem"));
    t.key_file = Some(tls_dir().join("client.key"));
    let f = gcra_factory_on(t).await;
    assert!(f.is_connected(), "{:?}", f.connect_error());
}

async fn gcra_factory_on(t: RedisTarget) -> RedisLimiterFactory {
    let f = RedisLimiterFactory::new(
        config(t, RedisAlgorithm::RedisGcra, 100, 1),
        Arc::new(MonotonicClock::new()),
    )
    .unwrap();
    let end = Instant::now() + Duration::from_secs(5);
    while !f.is_connected() && Instant::now() < end {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    f
}

#[tokio::test]
async fn an_untrusted_ca_is_refused_naming_the_certificate() {
    let e = refusal(target("localhost", PASSWORD, "other-ca.pem")).await;
    assert!(e.contains("invalid peer certificate: UnknownIssuer"), "{e}");
}

#[tokio::test]
async fn a_certificate_for_another_name_is_refused() {
    // The certificate names only `localhost`; 127.0.0.1 is the same listener.
    let e = refusal(target("127.0.0.1", PASSWORD, "ca.pem")).await;
    let name = r#"invalid peer certificate: certificate not valid for name "127.0.0.1""#;
    assert!(e.contains(name), "{e}");
}

#[tokio::test]
async fn a_wrong_password_is_refused_with_wrongpass() {
    let e = refusal(target("localhost", "not-the-password", "ca.pem")).await;
    assert!(e.contains("WRONGPASS"), "{e}");
    assert!(!e.contains("not-the-password"), "the password leaked: {e}");
}

#[tokio::test]
async fn no_credentials_are_refused_with_noauth() {
    let mut t = RedisTarget::url("rediss://localhost:6380");
    t.ca_file = Some(tls_dir().join("ca.pem"));
    let e = refusal(t).await;
    assert!(e.contains("NOAUTH"), "{e}");
}

/// From the settings as `pushpace run` loads them: the password file overrides the
/// URL's (wrong) password, nothing secret is shown, and the factory connects.
#[tokio::test]
async fn settings_with_a_password_file_connect_and_show_no_secret() {
    let url = format!("rediss://{USER}:url-password-to-override@localhost:6380");
    let settings = test_settings(&[
        ("redis.url", url),
        ("redis.username", USER.into()),
        (
            "redis.password_file",
            tls_dir().join("redis.password").display().to_string(),
        ),
        (
            "redis.ssl_ca_file",
            tls_dir().join("ca.pem").display().to_string(),
        ),
    ]);
    let shown = format!("{settings:?}");
    for secret in [PASSWORD, "url-password-to-override"] {
        assert!(!shown.contains(secret), "shown: {secret}");
    }
    let mut config = RedisConfig::from_settings(&settings);
    config.key_prefix = unique_name("pp");
    assert!(!format!("{config:?}").contains(PASSWORD));
    let f = gcra_factory_on(config.target).await;
    assert!(f.is_connected(), "{:?}", f.connect_error());
}

/// Checked at load: TLS files on a plain URL, and a user without a password.
#[test]
fn tls_files_need_rediss_and_a_user_needs_a_password() {
    let load = |keys: &[(&str, String)]| {
        pushpace::config::Settings::load(&pushpace::config::LoadOptions {
            config_dir: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/config").into()),
            environment: Some("local".into()),
            overrides: keys.iter().map(|(k, v)| format!("{k}={v}")).collect(),
        })
        .unwrap_err()
        .to_string()
    };
    let ca = tls_dir().join("ca.pem").display().to_string();
    let e = load(&[
        ("redis.url", "redis://localhost:6379".into()),
        ("redis.ssl_ca_file", ca),
    ]);
    assert!(
        e.contains("redis.ssl_ca_file") && e.contains("rediss://"),
        "{e}"
    );
    let e = load(&[
        ("redis.url", "rediss://localhost:6380".into()),
        ("redis.username", USER.into()),
    ]);
    assert!(
        e.contains("redis.username") && e.contains("password"),
        "{e}"
    );
}

/// The frequency cap shared through Redis over TLS: the second send to a device at a cap
/// of 1 is refused, across two caps (two workers).
#[tokio::test]
async fn the_shared_cap_decides_over_tls() {
    let prefix = unique_name("ppcap");
    let cap_config = || SharedCapConfig {
        cap: CapConfig {
            max_per_device: 1,
            window: 1_000_000 * 1_000_000_000,
            expected_devices: 1,
        },
        target: good(),
        timeout: Duration::from_millis(500),
        key_prefix: prefix.clone(),
    };
    let (a, b) = (
        SharedCap::new(cap_config()).unwrap(),
        SharedCap::new(cap_config()).unwrap(),
    );
    let end = Instant::now() + Duration::from_secs(5);
    while !(a.is_connected() && b.is_connected()) {
        assert!(
            Instant::now() < end,
            "{:?} {:?}",
            a.connect_error(),
            b.connect_error()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let devices = vec![unique_name("tok"), unique_name("tok")];
    let capped = a.try_reserve("c", "j1", &devices, 0, &[]).await.unwrap();
    assert!(capped.is_empty(), "{capped:?}");
    // Another job to the same devices through the other cap: both at their cap.
    let capped = b.try_reserve("c", "j2", &devices, 0, &[]).await.unwrap();
    assert_eq!(capped, vec![0, 1]);
}
