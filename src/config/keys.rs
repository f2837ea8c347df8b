//! Key material of the providers: read once at load and checked to parse, so that a bad
//! key fails start-up with the file (or variable) and the reason, never its content.
//! Parser errors that could echo a value (serde_json's "invalid type: …") are not passed
//! on; only their position or a fixed text is.

use secrecy::{ExposeSecret, SecretString};
use std::path::{Path, PathBuf};

/// Where a secret came from, for messages: a file or an environment variable.
#[derive(Debug, Clone)]
pub(super) enum SecretSource {
    File(PathBuf),
    Env(String),
}

impl std::fmt::Display for SecretSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SecretSource::File(p) => write!(f, "{}", p.display()),
            SecretSource::Env(v) => write!(f, "the text of {v}"),
        }
    }
}

/// Reads a key file. The error says which file and why (the I/O error's kind), or that
/// it is not UTF-8 text; never any of its bytes.
pub(super) fn read_text(path: &Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    String::from_utf8(bytes).map_err(|e| {
        format!(
            "{} is not UTF-8 text (bad byte at offset {})",
            path.display(),
            e.utf8_error().valid_up_to()
        )
    })
}

/// Checks an APNs `.p8` key: a PKCS#8 P-256 private key in PEM.
pub(super) fn check_apns_key(pem: &SecretString) -> Result<(), String> {
    use p256::pkcs8::DecodePrivateKey;
    p256::SecretKey::from_pkcs8_pem(pem.expose_secret().trim())
        .map(|_| ())
        .map_err(|e| format!("is not a PKCS#8 P-256 private key in PEM (an APNs .p8 key): {e}"))
}

/// Checks a VAPID key: a P-256 private key in PEM, PKCS#8 (`BEGIN PRIVATE KEY`) or
/// SEC1 (`BEGIN EC PRIVATE KEY`, what `openssl ecparam -genkey` writes).
pub(super) fn check_vapid_key(pem: &SecretString) -> Result<(), String> {
    use p256::pkcs8::DecodePrivateKey;
    let text = pem.expose_secret().trim();
    if p256::SecretKey::from_pkcs8_pem(text).is_ok() || p256::SecretKey::from_sec1_pem(text).is_ok()
    {
        return Ok(());
    }
    Err("is not a P-256 private key in PEM (PKCS#8 or SEC1)".into())
}

/// Checks a Google service-account JSON: an object with string `client_email`,
/// `private_key` (PKCS#8 RSA in PEM), `token_uri` (https, or http to loopback) and
/// `project_id` (the adapter reads them again from the JSON it is given).
pub(super) fn check_service_account(json: &SecretString) -> Result<(), String> {
    let v: serde_json::Value = serde_json::from_str(json.expose_secret()).map_err(|e| {
        format!(
            "is not JSON (error at line {} column {})",
            e.line(),
            e.column()
        )
    })?;
    let field = |name: &str| -> Result<&str, String> {
        match v.get(name) {
            Some(serde_json::Value::String(s)) if !s.trim().is_empty() => Ok(s.as_str()),
            Some(_) => Err(format!(
                "is not a service-account JSON: {name} is not a non-empty string"
            )),
            None => Err(format!("is not a service-account JSON: no {name}")),
        }
    };
    if !v.is_object() {
        return Err("is not a service-account JSON: not a JSON object".into());
    }
    field("client_email")?;
    let key = field("private_key")?;
    let token_uri = field("token_uri")?;
    let project_id = field("project_id")?;
    {
        use rsa::pkcs8::DecodePrivateKey;
        rsa::RsaPrivateKey::from_pkcs8_pem(key.trim()).map_err(|e| {
            format!(
                "is not a service-account JSON: private_key is not a PKCS#8 RSA key in PEM: {e}"
            )
        })?;
    }
    check_url(token_uri, true).map_err(|e| format!("token_uri: {e}"))?;
    if !project_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'_'))
    {
        return Err(format!(
            "project_id {project_id:?} has characters other than A-Z a-z 0-9 - . : _"
        ));
    }
    Ok(())
}

/// Reads `ca_file`: PEM with at least one certificate, every one of which parses.
pub(super) fn read_ca(path: &Path) -> Result<Vec<u8>, String> {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let bytes = std::fs::read(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let mut count = 0usize;
    for cert in CertificateDer::pem_slice_iter(&bytes) {
        cert.map_err(|e| format!("{}: not PEM certificates: {e}", path.display()))?;
        count += 1;
    }
    if count == 0 {
        return Err(format!(
            "{}: holds no PEM certificate (-----BEGIN CERTIFICATE-----)",
            path.display()
        ));
    }
    Ok(bytes)
}

/// Checks an endpoint URL: `https://host[:port]` (any path is the caller's); with
/// `loopback_http`, `http://` is allowed to a loopback host (tests).
pub(super) fn check_url(raw: &str, loopback_http: bool) -> Result<url::Url, String> {
    let u = url::Url::parse(raw).map_err(|e| format!("{raw:?} is not a URL: {e}"))?;
    let Some(host) = u.host_str() else {
        return Err(format!("{raw:?} has no host"));
    };
    let loopback = matches!(host, "localhost" | "127.0.0.1" | "[::1]");
    match u.scheme() {
        "https" => Ok(u),
        "http" if loopback_http && loopback => Ok(u),
        _ => Err(format!("{raw:?} must be an https:// URL")),
    }
}
