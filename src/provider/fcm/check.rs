//! `pushpace providers check` for FCM: gets an OAuth access token and opens one TLS +
//! HTTP/2 connection to the `messages:send` endpoint. It sends no message.

use super::account::ServiceAccount;
use super::oauth::Fetcher;
use super::{endpoint_uri, token_config};
use crate::provider::settings::FcmSpec;
use crate::provider::ProviderError;
use rustls::pki_types::ServerName;
use std::sync::Arc;

/// A one-line report of what worked, or the first thing that did not.
pub async fn check(spec: &FcmSpec) -> Result<String, ProviderError> {
    let account = Arc::new(ServiceAccount::parse(&spec.service_account, &spec.name)?);
    let cfg = token_config(spec);
    let fetcher = Fetcher::new(&spec.name, Arc::clone(&account), &cfg)?;
    let (_, lifetime) = fetcher.fetch().await.map_err(|e| ProviderError::Config {
        provider: spec.name.clone(),
        problem: format!("no OAuth access token from {}: {e}", account.token_uri),
    })?;
    let endpoint = endpoint_uri(spec)?;
    tokio::time::timeout(spec.common.timeout, handshake(spec, &endpoint))
        .await
        .map_err(|_| ProviderError::Tls {
            provider: spec.name.clone(),
            problem: format!(
                "{endpoint}: no TLS + HTTP/2 connection within {:?}",
                spec.common.timeout
            ),
        })??;
    Ok(format!(
        "OAuth access token granted by {} for {} (lives {}s); {endpoint} speaks HTTP/2 over TLS; project {}",
        account.token_uri,
        account.client_email,
        lifetime.as_secs(),
        account.project_id
    ))
}

/// TCP, TLS with ALPN h2, the HTTP/2 preface and SETTINGS; then the connection is
/// dropped.
async fn handshake(spec: &FcmSpec, endpoint: &http::Uri) -> Result<(), ProviderError> {
    let tls_error = |problem: String| ProviderError::Tls {
        provider: spec.name.clone(),
        problem: format!("{endpoint}: {problem}"),
    };
    let host = endpoint.host().unwrap_or_default();
    let port = endpoint.port_u16().unwrap_or(443);
    let config =
        crate::provider::tls::client_config(spec.common.ca_pem.as_deref()).map_err(tls_error)?;
    let name = ServerName::try_from(host.trim_matches(['[', ']']).to_string())
        .map_err(|e| tls_error(format!("bad host name: {e}")))?;
    let tcp = tokio::net::TcpStream::connect((host.trim_matches(['[', ']']), port))
        .await
        .map_err(|e| tls_error(format!("connect: {e}")))?;
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .map_err(|e| tls_error(format!("TLS handshake: {e}")))?;
    if tls.get_ref().1.alpn_protocol() != Some(b"h2") {
        return Err(tls_error(
            "the server did not agree to HTTP/2 (ALPN h2)".into(),
        ));
    }
    let (client, mut connection) = h2::client::handshake(tls)
        .await
        .map_err(|e| tls_error(format!("HTTP/2 handshake: {e}")))?;
    // A PING answered proves the server speaks HTTP/2 (the connection must be driven
    // meanwhile).
    let mut ping_pong = connection
        .ping_pong()
        .ok_or_else(|| tls_error("HTTP/2: no PING handle".into()))?;
    let pong = ping_pong.ping(h2::Ping::opaque());
    tokio::select! {
        r = &mut connection => {
            r.map_err(|e| tls_error(format!("HTTP/2: {e}")))?;
            return Err(tls_error("HTTP/2: the server closed the connection".into()));
        }
        r = pong => {
            r.map_err(|e| tls_error(format!("HTTP/2 PING: {e}")))?;
        }
    }
    drop(client);
    Ok(())
}
