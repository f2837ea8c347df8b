//! A webhook's `ca_file` is honoured: an https webhook signed by a private CA is reached
//! when the CA is trusted, and refused with the certificate named when it is not, both
//! by the sender and by `pushpace providers check`; an http webhook refuses a CA.

use crate::helpers::pushpace_bin;
use bytes::Bytes;
use http::{Request, Response};
use pushpace::job::Job;
use pushpace::sender::{HttpSender, HttpSenderConfig, SendOutcome, Sender, SenderError};
use pushpace::tools::mock::h2server::{BoxResponse, FnHandler, Knobs, MockServer};
use pushpace::tools::mock::tls::TestCa;
use std::path::Path;
use std::sync::Arc;

/// A loopback HTTP/2-over-TLS webhook answering 200 to every push.
fn webhook(ca: &TestCa) -> MockServer {
    let ok = Arc::new(FnHandler(|_: Request<Bytes>| -> BoxResponse {
        Box::pin(async { Response::new(Bytes::new()) })
    }));
    MockServer::start(ca, ok, Knobs::default()).expect("webhook mock")
}

fn job() -> Arc<Job> {
    let payload = serde_json::value::RawValue::from_string(r#"{"t":1}"#.into()).unwrap();
    Arc::new(Job::new("j1", "c1", vec!["device-1".into()], payload).unwrap())
}

fn sender(url: &str, ca: Option<&TestCa>) -> Result<HttpSender, SenderError> {
    let mut config = HttpSenderConfig::new(url);
    config.ca_pem = ca.map(|ca| ca.ca_pem().into_bytes());
    HttpSender::new(&config)
}

#[tokio::test]
async fn an_https_webhook_is_sent_to_through_its_ca_file_and_refused_without_it() {
    let ca = TestCa::new();
    let mock = webhook(&ca);
    let url = format!("{}/push", mock.url());

    let trusted = sender(&url, Some(&ca)).unwrap();
    let outcome = trusted.send(&job(), 0).await;
    assert!(matches!(outcome, SendOutcome::Delivered), "{outcome:?}");
    assert_eq!(mock.controls().streams(), 1);

    // The webpki roots alone do not sign the mock's certificate.
    let untrusted = sender(&url, None).unwrap();
    let outcome = untrusted.send(&job(), 0).await;
    let text = format!("{outcome:?}");
    assert!(!matches!(outcome, SendOutcome::Delivered), "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");
    assert_eq!(
        mock.controls().streams(),
        1,
        "a push went through untrusted TLS"
    );

    let http = mock.url().replace("https://", "http://");
    let e = sender(&http, Some(&ca)).expect_err("ca_file on http is refused");
    assert!(e.to_string().contains("ca_file"), "{e}");
}

/// `pushpace providers <args>` with the webhook "hook" at `url` and `ca_file` = `ca`.
fn providers(dir: &Path, url: &str, ca: Option<&str>, args: &[&str]) -> (bool, String) {
    let mut cmd = pushpace_bin();
    cmd.arg("providers")
        .args(args)
        .env("PUSHPACE__PROVIDERS__HOOK__KIND", "webhook")
        .env("PUSHPACE__PROVIDERS__HOOK__URL", url);
    if let Some(ca) = ca {
        let file = dir.join("ca.pem");
        std::fs::write(&file, ca).unwrap();
        cmd.env("PUSHPACE__PROVIDERS__HOOK__CA_FILE", &file);
    }
    let (ok, out, err) = crate::helpers::run_output(&mut cmd);
    (ok, out + &err)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn providers_check_does_the_webhooks_tls_handshake_with_its_ca_file() {
    let ca = TestCa::new();
    let mock = webhook(&ca);
    let dir = tempfile::tempdir().unwrap();
    // A path and query that are the webhook's credentials: never printed.
    let url = format!("{}/hooks/T0001/s3cr3tP4th?sig=Sig-Value-123", mock.url());

    let check = |ca: Option<&str>| providers(dir.path(), &url, ca, &["check", "hook"]);
    let (ok, text) = check(Some(&ca.ca_pem()));
    assert!(ok, "{text}");
    assert!(text.contains("TLS connection to"), "{text}");
    let (ok, listed) = providers(dir.path(), &url, Some(&ca.ca_pem()), &["list"]);
    assert!(ok, "{listed}");
    assert!(listed.contains("/hooks/***"), "{listed}");

    let (ok, text) = check(Some(&TestCa::new().ca_pem()));
    assert!(!ok, "{text}");
    assert!(text.to_lowercase().contains("certificate"), "{text}");

    let (ok, text) = check(None);
    assert!(!ok, "{text}");
    for secret in ["s3cr3tP4th", "Sig-Value-123"] {
        for out in [&text, &listed] {
            assert!(!out.contains(secret), "{secret} printed: {out}");
        }
    }
    assert_eq!(mock.controls().streams(), 0, "a check sent a push");
}
