//! `pushpace providers list` and `pushpace providers check NAME`.
//!
//! `check` makes each provider's authentication round trip without sending a
//! notification: APNs signs its JWT and opens TLS + HTTP/2 to the endpoint; FCM fetches an
//! OAuth token and opens TLS + HTTP/2; Web Push signs and verifies a VAPID token; the
//! webhook opens a TCP connection to its URL's host. What is wrong is said in one line.

use super::settings::{NamedProvider, ProviderSpec};
use super::ProviderError;
use std::fmt::Write;
use std::time::Duration;

/// How long a webhook's TCP connect may take in `check`.
const WEBHOOK_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// One line per provider: name, kind, where it sends, its cap; no secret.
pub fn list(specs: &[NamedProvider], default_provider: &str) -> String {
    let mut out = format!(
        "{:<16} {:<8} {:<8} {:<40} {:>10}  details\n",
        "NAME", "KIND", "DEFAULT", "ENDPOINT", "MAX RATE"
    );
    for p in specs {
        let default = if p.name == default_provider {
            "yes"
        } else {
            ""
        };
        let max_rate = p
            .spec
            .common()
            .and_then(|c| c.max_rate)
            .map_or("-".to_string(), |r| format!("{}/s", r.as_f64()));
        let (endpoint, details) = describe(p);
        let _ = writeln!(
            out,
            "{:<16} {:<8} {:<8} {:<40} {:>10}  {}",
            p.name,
            p.spec.kind().as_str(),
            default,
            endpoint,
            max_rate,
            details
        );
    }
    out
}

/// Where a provider sends, and what identifies its app (never a key).
fn describe(p: &NamedProvider) -> (String, String) {
    match &p.spec {
        ProviderSpec::Apns(s) => (
            s.endpoint.clone(),
            format!(
                "team {} key {} topic {} ({:?})",
                s.team_id, s.key_id, s.topic, s.environment
            ),
        ),
        ProviderSpec::Fcm(s) => (s.endpoint.clone(), "service account (hidden)".into()),
        ProviderSpec::WebPush(s) => (
            "(each subscription's endpoint)".into(),
            format!("VAPID subject {}", s.vapid_subject),
        ),
        ProviderSpec::Webhook(s) => (crate::redact::url(&s.url), String::new()),
        ProviderSpec::Null => ("-".into(), "sends nothing".into()),
    }
}

/// The named provider's authentication round trip: a one-line summary, or what is wrong.
pub async fn check(specs: &[NamedProvider], name: &str) -> Result<String, ProviderError> {
    let Some(p) = specs.iter().find(|p| p.name == name) else {
        let known: Vec<&str> = specs.iter().map(|p| p.name.as_str()).collect();
        return Err(ProviderError::Config {
            provider: name.to_string(),
            problem: format!("no such provider; configured: {}", known.join(", ")),
        });
    };
    check_one(p).await
}

/// One provider's authentication round trip (a configured one, or an app's).
pub async fn check_one(p: &NamedProvider) -> Result<String, ProviderError> {
    match &p.spec {
        ProviderSpec::Apns(s) => super::apns::check(s).await,
        ProviderSpec::Fcm(s) => super::fcm::check(s).await,
        ProviderSpec::WebPush(s) => super::webpush::check(s).await,
        ProviderSpec::Webhook(s) => webhook(&p.name, &s.url, s.common.ca_pem.as_deref()).await,
        ProviderSpec::Null => Ok("the null provider sends nothing; nothing to check".into()),
    }
}

/// TCP to the webhook's host, and for https a TLS handshake that trusts what the sender
/// trusts (the webpki roots and `ca_file`): no request is sent to the customer's URL.
async fn webhook(name: &str, url: &str, ca_pem: Option<&[u8]>) -> Result<String, ProviderError> {
    let fail = |problem: String| ProviderError::Config {
        provider: name.to_string(),
        problem,
    };
    let u = url::Url::parse(url).map_err(|e| fail(format!("url: {e}")))?;
    let host = u
        .host_str()
        .ok_or_else(|| fail("the url has no host".into()))?;
    let port = u
        .port_or_known_default()
        .ok_or_else(|| fail("the url has no port".into()))?;
    let address = format!("{host}:{port}");
    let shown = crate::redact::url(url);
    let within = |what: &str| {
        fail(format!(
            "no {what} with {address} within {} s",
            WEBHOOK_CONNECT_TIMEOUT.as_secs()
        ))
    };
    let tcp = tokio::time::timeout(
        WEBHOOK_CONNECT_TIMEOUT,
        tokio::net::TcpStream::connect(&address),
    )
    .await
    .map_err(|_| within("TCP connection"))?
    .map_err(|e| fail(format!("cannot connect to {address}: {e}")))?;
    if u.scheme() != "https" {
        return Ok(format!("TCP connection to {address} ok ({shown})"));
    }
    let mut config = (*super::tls::client_config(ca_pem).map_err(fail)?).clone();
    config.alpn_protocols = vec![super::tls::ALPN_H2.to_vec(), b"http/1.1".to_vec()];
    let server = rustls::pki_types::ServerName::try_from(host.to_string())
        .map_err(|e| fail(format!("{host:?} is no server name: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config));
    tokio::time::timeout(WEBHOOK_CONNECT_TIMEOUT, tls.connect(server, tcp))
        .await
        .map_err(|_| within("TLS handshake"))?
        .map_err(|e| fail(format!("TLS with {address}: {e}")))?;
    Ok(format!("TLS connection to {address} ok ({shown})"))
}
