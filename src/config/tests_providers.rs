//! Unit tests of `[providers.<name>]`: parsing from files and the environment, the
//! checks with their messages, and that no secret reaches `Debug` (what `pushpace
//! config` prints) or an error. Keys are generated at run time.

use super::*;
use crate::provider::settings::{ApnsEnvironment, ProviderSpec};
use crate::provider::ProviderKind;
use p256::pkcs8::{EncodePrivateKey, LineEnding};
use std::time::Duration;

/// Key files for one test, in a directory of its own.
struct Keys {
    dir: tempfile::TempDir,
    /// PEM text of `ios.p8` (a PKCS#8 P-256 key).
    p8: String,
    /// PEM text of the service account's RSA key.
    rsa: String,
}

impl Keys {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let p8 = ec_key().to_pkcs8_pem(LineEnding::LF).unwrap().to_string();
        let rsa = rsa::RsaPrivateKey::new(&mut rsa::rand_core::OsRng, 1024)
            .unwrap()
            .to_pkcs8_pem(LineEnding::LF)
            .unwrap()
            .to_string();
        let keys = Self { dir, p8, rsa };
        keys.write("ios.p8", &keys.p8);
        keys.write(
            "sa.json",
            &keys.service_account("https://127.0.0.1:9443/token"),
        );
        let vapid = ec_key().to_sec1_pem(LineEnding::LF).unwrap();
        keys.write("vapid.pem", &vapid);
        let ca = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        keys.write("ca.pem", &ca.cert.pem());
        keys
    }

    fn service_account(&self, token_uri: &str) -> String {
        serde_json::json!({
            "type": "service_account",
            "project_id": "demo-project",
            "client_email": "pushpace@demo-project.iam.gserviceaccount.com",
            "private_key": self.rsa,
            "token_uri": token_uri,
        })
        .to_string()
    }

    fn write(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p.display().to_string()
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).display().to_string()
    }
}

fn ec_key() -> p256::SecretKey {
    p256::SecretKey::random(&mut p256::elliptic_curve::rand_core::OsRng)
}

/// The repo's config with `extra` appended to local.toml, and `env` as the environment.
fn load_toml(extra: &str, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let dir = tempfile::tempdir().unwrap();
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config");
    std::fs::copy(repo.join("base.toml"), dir.path().join("base.toml")).unwrap();
    let local = std::fs::read_to_string(repo.join("local.toml")).unwrap();
    std::fs::write(dir.path().join("local.toml"), format!("{local}\n{extra}")).unwrap();
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = env.clone();
    Settings::load_with_env(
        &LoadOptions {
            config_dir: Some(dir.path().to_path_buf()),
            environment: Some("local".into()),
            overrides: vec![],
        },
        move |k| lookup.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
        env.into_iter(),
    )
}

fn apns_section(keys: &Keys) -> String {
    format!(
        r#"
[providers.ios]
kind = "apns"
team_id = "ABCDE12345"
key_id = "KEY1234567"
key_file = '{}'
topic = "com.example.app"
environment = "sandbox"
"#,
        keys.path("ios.p8")
    )
}

fn err_text(r: Result<Settings, ConfigError>) -> String {
    match r {
        Ok(_) => panic!("loaded; expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn shipped_config_has_the_implicit_webhook_as_default() {
    let s = load_toml("", &[]).unwrap();
    assert_eq!(s.sender.default_provider, "webhook");
    assert_eq!(s.providers.len(), 1);
    let p = s.provider("webhook").unwrap();
    assert_eq!(p.spec.kind(), ProviderKind::Webhook);
    let ProviderSpec::Webhook(w) = &p.spec else {
        unreachable!()
    };
    assert_eq!(w.url, s.sender.url);
    assert_eq!(w.common.max_in_flight, s.sender.max_in_flight);
    let s = load_toml("", &[("PUSHPACE__SENDER__KIND", "null")]).unwrap();
    assert_eq!(s.providers[0].spec.kind(), ProviderKind::Null);
}

#[test]
fn apns_from_a_file_with_defaults() {
    let keys = Keys::new();
    let s = load_toml(&apns_section(&keys), &[]).unwrap();
    let ProviderSpec::Apns(a) = &s.provider("ios").unwrap().spec else {
        panic!("not apns")
    };
    assert_eq!(a.name, "ios");
    assert_eq!(a.team_id, "ABCDE12345");
    assert_eq!(a.environment, ApnsEnvironment::Sandbox);
    assert_eq!(a.endpoint, "https://api.sandbox.push.apple.com");
    assert_eq!(a.connections, 2);
    assert_eq!(a.token_refresh, Duration::from_secs(3000));
    assert_eq!(secrecy::ExposeSecret::expose_secret(&a.key_pem), keys.p8);
    assert!(a.common.max_rate.is_none());
    assert_eq!(a.common.timeout, Duration::from_millis(s.sender.timeout_ms));
}

#[test]
fn numbers_and_secrets_from_the_environment() {
    let keys = Keys::new();
    let sa = keys.service_account("https://127.0.0.1:9443/token");
    let s = load_toml(
        "",
        &[
            ("PUSHPACE__PROVIDERS__IOS__KIND", "apns"),
            ("PUSHPACE__PROVIDERS__IOS__TEAM_ID", "ABCDE12345"),
            ("PUSHPACE__PROVIDERS__IOS__KEY_ID", "KEY1234567"),
            ("PUSHPACE__PROVIDERS__IOS__KEY", &keys.p8),
            ("PUSHPACE__PROVIDERS__IOS__TOPIC", "com.example.app"),
            ("PUSHPACE__PROVIDERS__IOS__ENVIRONMENT", "production"),
            ("PUSHPACE__PROVIDERS__IOS__CONNECTIONS", "4"),
            ("PUSHPACE__PROVIDERS__IOS__TOKEN_REFRESH_S", "600"),
            (
                "PUSHPACE__PROVIDERS__IOS__ENDPOINT",
                "https://127.0.0.1:8443",
            ),
            ("PUSHPACE__PROVIDERS__IOS__MAX_RATE", "250.5"),
            ("PUSHPACE__PROVIDERS__ANDROID__KIND", "fcm"),
            ("PUSHPACE__PROVIDERS__ANDROID__SERVICE_ACCOUNT", &sa),
            ("PUSHPACE__PROVIDERS__ANDROID__TIMEOUT_MS", "1500"),
            ("PUSHPACE__SENDER__DEFAULT_PROVIDER", "android"),
        ],
    )
    .unwrap();
    assert_eq!(s.sender.default_provider, "android");
    let ProviderSpec::Apns(a) = &s.provider("ios").unwrap().spec else {
        panic!("not apns")
    };
    assert_eq!(a.connections, 4);
    assert_eq!(a.token_refresh, Duration::from_secs(600));
    assert_eq!(a.endpoint, "https://127.0.0.1:8443");
    assert_eq!(a.common.max_rate.map(|r| r.as_f64()), Some(250.5));
    let ProviderSpec::Fcm(f) = &s.provider("android").unwrap().spec else {
        panic!("not fcm")
    };
    assert_eq!(f.endpoint, "https://fcm.googleapis.com");
    assert_eq!(f.connections, 2);
    assert_eq!(f.token_refresh_margin, Duration::from_secs(300));
    assert_eq!(f.common.max_rate.map(|r| r.as_f64()), Some(10_000.0));
    assert_eq!(f.common.timeout, Duration::from_millis(1500));
    assert_eq!(secrecy::ExposeSecret::expose_secret(&f.service_account), sa);

    // `pushpace config` prints this Debug: no key material in it.
    let dbg = format!("{s:#?}");
    for secret in [&keys.p8, &keys.rsa] {
        let body = secret.lines().nth(1).unwrap();
        assert!(!dbg.contains(body), "{dbg}");
    }
    assert!(!dbg.contains("PRIVATE KEY"), "{dbg}");
    assert!(dbg.contains("[hidden]"), "{dbg}");
}

#[test]
fn webpush_webhook_and_ca_file() {
    let keys = Keys::new();
    let extra = format!(
        r#"
[providers.browser]
kind = "webpush"
vapid_private_key_file = '{}'
vapid_subject = "mailto:ops@example.com"
ca_file = '{}'

[providers.partner]
kind = "webhook"
url = "https://user:Hook-Pa55@hooks.example/push"
http2_connections = 3
"#,
        keys.path("vapid.pem"),
        keys.path("ca.pem")
    );
    let s = load_toml(&extra, &[]).unwrap();
    let ProviderSpec::WebPush(w) = &s.provider("browser").unwrap().spec else {
        panic!("not webpush")
    };
    assert_eq!(w.vapid_lifetime, Duration::from_secs(43_200));
    assert_eq!(w.vapid_subject, "mailto:ops@example.com");
    let ca = w.common.ca_pem.as_deref().unwrap();
    assert!(std::str::from_utf8(ca)
        .unwrap()
        .contains("BEGIN CERTIFICATE"));
    let ProviderSpec::Webhook(h) = &s.provider("partner").unwrap().spec else {
        panic!("not webhook")
    };
    assert_eq!(h.http2_connections, 3);
    let dbg = format!("{s:?}");
    assert!(!dbg.contains("Hook-Pa55"), "{dbg}");
    assert!(dbg.contains("user:***@hooks.example"), "{dbg}");
}

#[test]
fn invalid_sections_name_the_key() {
    let keys = Keys::new();
    let base = apns_section(&keys);
    let cases: Vec<(String, &str)> = vec![
        (
            base.replace("ABCDE12345", "ABC"),
            "providers.ios.team_id: must be 10 characters",
        ),
        (
            base.replace("key_id = \"KEY1234567\"\n", ""),
            "providers.ios.key_id: missing; required for kind apns",
        ),
        (
            base.replace("sandbox", "staging"),
            "providers.ios.environment: unknown environment \"staging\"",
        ),
        (
            base.replace("\"apns\"", "\"gcm\""),
            "providers.ios.kind: unknown kind \"gcm\"",
        ),
        (
            format!("{base}url = \"https://x.example\"\n"),
            "providers.ios.url: is not a setting of kind apns",
        ),
        (
            format!("{base}token_refresh_s = 3600\n"),
            "providers.ios.token_refresh_s: must be 1–3540",
        ),
        (
            format!("{base}endpoint = \"http://api.push.apple.com\"\n"),
            "providers.ios.endpoint: \"http://api.push.apple.com\" must be an https:// URL",
        ),
        (
            base.replace("[providers.ios]", "[providers.\"i os\"]"),
            "providers.i os: the name must be 1–64 characters from [a-z0-9_-], got \"i os\"",
        ),
        (
            base.replace("[providers.ios]", "[providers.webhook]"),
            "providers.webhook: the name webhook is taken by the provider [sender] defines",
        ),
        (
            format!("{base}\n[sender]\ndefault_provider = \"android\"\n"),
            "sender.default_provider: \"android\" names no provider; configured: webhook, ios",
        ),
        (
            "[providers.web]\nkind = \"webpush\"\nvapid_subject = \"ops@example.com\"\n".into(),
            "providers.web.vapid_subject: must be a mailto: address or an https: URL",
        ),
    ];
    for (toml, want) in cases {
        let e = err_text(load_toml(&toml, &[]));
        assert!(e.starts_with(want), "want {want:?}, got {e:?}");
    }
}

#[test]
fn key_errors_say_which_file_and_why_never_the_content() {
    let keys = Keys::new();
    let base = apns_section(&keys);
    // Missing file.
    let missing = keys.path("nowhere.p8");
    let e = err_text(load_toml(
        &base.replace(&keys.path("ios.p8"), &missing),
        &[],
    ));
    assert!(
        e.starts_with(&format!("providers.ios.key_file: cannot read {missing}: ")),
        "{e}"
    );
    // An RSA key where a P-256 one belongs.
    let wrong = keys.write("wrong.p8", &keys.rsa);
    let e = err_text(load_toml(&base.replace(&keys.path("ios.p8"), &wrong), &[]));
    assert!(
        e.starts_with(&format!(
            "providers.ios.key_file: {wrong} is not a PKCS#8 P-256 private key"
        )),
        "{e}"
    );
    assert!(!e.contains(keys.rsa.lines().nth(1).unwrap()), "{e}");
    // Both a file and the text.
    let e = err_text(load_toml(
        &base,
        &[("PUSHPACE__PROVIDERS__IOS__KEY", &keys.p8)],
    ));
    assert!(
        e.contains("set key_file or PUSHPACE__PROVIDERS__IOS__KEY (key), not both"),
        "{e}"
    );
    // A service account without project_id, from the environment.
    let mut sa: serde_json::Value =
        serde_json::from_str(&keys.service_account("https://127.0.0.1:1/t")).unwrap();
    sa.as_object_mut().unwrap().remove("project_id");
    let env = [
        ("PUSHPACE__PROVIDERS__ANDROID__KIND", "fcm"),
        (
            "PUSHPACE__PROVIDERS__ANDROID__SERVICE_ACCOUNT",
            &sa.to_string(),
        ),
    ];
    let e = err_text(load_toml("", &env));
    assert_eq!(
        e,
        "providers.android.service_account: the text of PUSHPACE__PROVIDERS__ANDROID__SERVICE_ACCOUNT \
         is not a service-account JSON: no project_id"
    );
    // A token endpoint that is not https.
    let sa = keys.write(
        "sa-http.json",
        &keys.service_account("http://oauth.example/t"),
    );
    let extra = format!("[providers.android]\nkind = \"fcm\"\nservice_account_file = '{sa}'\n");
    let e = err_text(load_toml(&extra, &[]));
    assert!(
        e.contains("token_uri: \"http://oauth.example/t\" must be an https:// URL"),
        "{e}"
    );
    // A CA file with no certificate.
    let ca = keys.write("ca-bad.pem", "not a certificate");
    let extra = format!("{base}ca_file = '{ca}'\n");
    let e = err_text(load_toml(&extra, &[]));
    assert!(
        e.starts_with(&format!(
            "providers.ios.ca_file: {ca}: holds no PEM certificate"
        )),
        "{e}"
    );
}

#[test]
fn a_short_token_refresh_is_allowed_for_tests() {
    let keys = Keys::new();
    let s = load_toml(
        &format!("{}token_refresh_s = 2\n", apns_section(&keys)),
        &[],
    )
    .unwrap();
    let ProviderSpec::Apns(a) = &s.provider("ios").unwrap().spec else {
        panic!("not apns")
    };
    assert_eq!(a.token_refresh, Duration::from_secs(2));
}

#[test]
fn vapid_lifetime_is_bounded_and_pkcs8_keys_work() {
    let keys = Keys::new();
    let pkcs8 = keys.write(
        "vapid8.pem",
        &ec_key().to_pkcs8_pem(LineEnding::LF).unwrap(),
    );
    let section = |lifetime: u64| {
        format!(
            "[providers.web]\nkind = \"webpush\"\nvapid_private_key_file = '{pkcs8}'\n\
             vapid_subject = \"https://example.com/contact\"\nvapid_lifetime_s = {lifetime}\n"
        )
    };
    let s = load_toml(&section(86_400), &[]).unwrap();
    assert_eq!(s.providers[1].spec.kind(), ProviderKind::WebPush);
    let e = err_text(load_toml(&section(86_401), &[]));
    assert!(
        e.starts_with("providers.web.vapid_lifetime_s: must be 60–86400"),
        "{e}"
    );
}

#[test]
fn drain_timeout_must_outwait_the_longest_provider_timeout() {
    let e = load_toml("", &[("PUSHPACE__WORKER__DRAIN_TIMEOUT_MS", "0")]).unwrap_err();
    assert_eq!(e.to_string(), "worker.drain_timeout_ms: must be > 0");
    // [sender]'s webhook: 5000 ms in base.toml.
    let e = load_toml("", &[("PUSHPACE__WORKER__DRAIN_TIMEOUT_MS", "4999")]).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("worker.drain_timeout_ms: must be at least the longest provider timeout_ms (5000 ms, provider webhook)"),
        "{e}"
    );
    assert!(load_toml("", &[("PUSHPACE__WORKER__DRAIN_TIMEOUT_MS", "5000")]).is_ok());
    // A named provider's own timeout counts too.
    let slow = r#"
[providers.partner]
kind = "webhook"
url = "https://hooks.example/push"
timeout_ms = 15000
"#;
    let e = load_toml(slow, &[]).unwrap_err();
    assert!(
        e.to_string().contains("(15000 ms, provider partner)"),
        "{e}"
    );
    assert!(load_toml(slow, &[("PUSHPACE__WORKER__DRAIN_TIMEOUT_MS", "15000")]).is_ok());
}
