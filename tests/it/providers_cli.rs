//! `pushpace providers list` and `check NAME`, as a real process configured through the
//! environment, against the loopback APNs mock over TLS: the check signs a JWT and opens
//! TLS + HTTP/2 without sending a notification, says clearly what is wrong, and no
//! command prints a key.

use crate::helpers::pushpace_bin;
use pushpace::tools::mock::apns::{ApnsMock, MockApnsConfig};
use pushpace::tools::mock::tls::TestCa;
use std::path::Path;

const TEAM: &str = "TEAM123456";
const KEY_ID: &str = "KEY1234567";
const TOPIC: &str = "com.example.app";

/// A provider key (.p8 text) and its public half.
fn key() -> (String, String) {
    let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("key");
    (pair.serialize_pem(), pair.public_key_pem())
}

/// `pushpace providers <args>` with an APNs provider "ios" at `endpoint`, trusting `ca`.
fn providers(dir: &Path, endpoint: &str, ca: &str, args: &[&str]) -> (bool, String) {
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca).unwrap();
    let (ok, out, err) = crate::helpers::run_output(
        pushpace_bin()
            .arg("providers")
            .args(args)
            .env("PUSHPACE__PROVIDERS__IOS__KIND", "apns")
            .env("PUSHPACE__PROVIDERS__IOS__TEAM_ID", TEAM)
            .env("PUSHPACE__PROVIDERS__IOS__KEY_ID", KEY_ID)
            .env("PUSHPACE__PROVIDERS__IOS__KEY_FILE", dir.join("key.p8"))
            .env("PUSHPACE__PROVIDERS__IOS__TOPIC", TOPIC)
            .env("PUSHPACE__PROVIDERS__IOS__ENVIRONMENT", "sandbox")
            .env("PUSHPACE__PROVIDERS__IOS__ENDPOINT", endpoint)
            .env("PUSHPACE__PROVIDERS__IOS__CA_FILE", &ca_file)
            .env("PUSHPACE__PROVIDERS__IOS__MAX_RATE", "500"),
    );
    (ok, out + &err)
}

// Multi-threaded: the process is awaited on one thread while the mock answers on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_list_and_check_against_the_apns_mock() {
    let ca = TestCa::new();
    let (private, public) = key();
    let mock = ApnsMock::start(&ca, MockApnsConfig::new(TEAM, KEY_ID, &public, TOPIC)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("key.p8"), &private).unwrap();
    let body = private
        .lines()
        .find(|l| !l.starts_with("-----"))
        .unwrap()
        .to_string();

    let (ok, text) = providers(dir.path(), &mock.url(), &ca.ca_pem(), &["list"]);
    assert!(ok, "{text}");
    let ios = text.lines().find(|l| l.starts_with("ios ")).expect(&text);
    for part in ["apns", &mock.url(), "500/s", TEAM, TOPIC] {
        assert!(ios.contains(part), "{part} in {ios}");
    }
    assert!(text
        .lines()
        .any(|l| l.starts_with("webhook ") && l.contains("yes")));
    assert!(!text.contains(&body), "the key was printed");

    let (ok, text) = providers(dir.path(), &mock.url(), &ca.ca_pem(), &["check", "ios"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("signed an ES256 JWT") && text.contains("h2"),
        "{text}"
    );
    assert_eq!(mock.controls().requests(), 0, "check sent a notification");
    assert!(!text.contains(&body));

    // A CA that does not sign the mock's certificate: a clear TLS failure.
    let other = TestCa::new();
    let (ok, text) = providers(dir.path(), &mock.url(), &other.ca_pem(), &["check", "ios"]);
    assert!(!ok, "{text}");
    assert!(
        text.to_lowercase().contains("tls") || text.contains("certificate"),
        "{text}"
    );

    let (ok, text) = providers(dir.path(), &mock.url(), &ca.ca_pem(), &["check", "nope"]);
    assert!(!ok);
    assert!(
        text.contains("no such provider; configured: webhook, ios"),
        "{text}"
    );
}
