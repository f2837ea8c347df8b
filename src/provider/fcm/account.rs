//! The service account JSON of an FCM provider: who signs the OAuth assertion
//! (`client_email`, `private_key`), where it is sent (`token_uri`) and which project the
//! messages go to (`project_id`).
//!
//! Parsed once at start. The private key becomes a signing key at once, so a bad key is
//! a start-up error, and its text is never kept, printed or echoed in an error.

use crate::provider::ProviderError;
use jsonwebtoken::EncodingKey;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;

/// A parsed service account. `Debug` shows the public fields only.
#[derive(Clone)]
pub struct ServiceAccount {
    /// The JWT's `iss`.
    pub client_email: String,
    /// The JWT's `aud` and where it is posted.
    pub token_uri: String,
    /// `/v1/projects/<project_id>/messages:send`.
    pub project_id: String,
    /// The RS256 signing key from `private_key`.
    pub(crate) key: EncodingKey,
}

impl std::fmt::Debug for ServiceAccount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServiceAccount")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .field("project_id", &self.project_id)
            .field("key", &"<redacted>")
            .finish()
    }
}

/// The fields we read; the others (`type`, `private_key_id`, `client_id`…) are ignored.
#[derive(Deserialize)]
struct Raw {
    client_email: Option<String>,
    private_key: Option<SecretString>,
    token_uri: Option<String>,
    project_id: Option<String>,
}

const WHAT: &str = "the service account JSON";

impl ServiceAccount {
    /// Parses the JSON text. `provider` names the provider in errors.
    pub fn parse(json: &SecretString, provider: &str) -> Result<Self, ProviderError> {
        let key_error = |problem: String| ProviderError::Key {
            provider: provider.to_string(),
            what: WHAT,
            problem,
        };
        // serde_json's messages can quote the input (the key, say), so only the place
        // and the kind of error are reported.
        let raw: Raw = serde_json::from_str(json.expose_secret()).map_err(|e| {
            key_error(format!(
                "not a JSON object of strings ({:?} error at line {} column {})",
                e.classify(),
                e.line(),
                e.column()
            ))
        })?;
        let missing = |field: &str| key_error(format!("it has no `{field}` (or it is empty)"));
        let nonempty = |v: Option<String>, field: &str| match v {
            Some(s) if !s.trim().is_empty() => Ok(s),
            _ => Err(missing(field)),
        };
        let client_email = nonempty(raw.client_email, "client_email")?;
        let token_uri = nonempty(raw.token_uri, "token_uri")?;
        let project_id = nonempty(raw.project_id, "project_id")?;
        let pem = match raw.private_key {
            Some(k) if !k.expose_secret().trim().is_empty() => k,
            _ => return Err(missing("private_key")),
        };
        check_token_uri(&token_uri).map_err(key_error)?;
        if !project_id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
        {
            return Err(key_error(format!(
                "`project_id` {project_id:?} has characters a project id cannot have"
            )));
        }
        let key = EncodingKey::from_rsa_pem(pem.expose_secret().as_bytes()).map_err(|_| {
            key_error("`private_key` is not a PEM RSA private key (PKCS#8 or PKCS#1)".into())
        })?;
        Ok(Self {
            client_email,
            token_uri,
            project_id,
            key,
        })
    }
}

/// The token endpoint must be an absolute `https` URL: the assertion is a credential.
fn check_token_uri(uri: &str) -> Result<(), String> {
    let parsed = url::Url::parse(uri)
        .map_err(|e| format!("`token_uri` {uri:?} is not an absolute URL: {e}"))?;
    if parsed.scheme() != "https" || parsed.host_str().is_none() {
        return Err(format!("`token_uri` {uri:?} is not an https URL"));
    }
    Ok(())
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use rsa::pkcs8::{EncodePrivateKey, LineEnding};

    /// A fresh RSA key's PKCS#8 PEM (1024 bits: unit tests only, for speed).
    pub(crate) fn test_key_pem() -> String {
        let mut rng = rsa::rand_core::OsRng;
        let key = rsa::RsaPrivateKey::new(&mut rng, 1024).expect("rsa key");
        key.to_pkcs8_pem(LineEnding::LF).expect("pem").to_string()
    }

    fn json(fields: &[(&str, &str)]) -> SecretString {
        let map: serde_json::Map<String, serde_json::Value> = fields
            .iter()
            .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
            .collect();
        SecretString::from(serde_json::Value::Object(map).to_string())
    }

    #[test]
    fn parses_and_redacts() {
        let pem = test_key_pem();
        let sa = json(&[
            ("type", "service_account"),
            ("client_email", "a@p.iam.gserviceaccount.com"),
            ("private_key", &pem),
            ("token_uri", "https://oauth2.googleapis.com/token"),
            ("project_id", "my-proj"),
        ]);
        let acct = ServiceAccount::parse(&sa, "fcm").expect("parses");
        assert_eq!(acct.project_id, "my-proj");
        assert_eq!(acct.client_email, "a@p.iam.gserviceaccount.com");
        let shown = format!("{acct:?}");
        assert!(!shown.contains("PRIVATE KEY"), "{shown}");
    }

    #[test]
    fn names_the_missing_field_and_never_echoes_the_key() {
        let pem = test_key_pem();
        let full = [
            ("client_email", "a@b"),
            ("private_key", pem.as_str()),
            ("token_uri", "https://t.example/token"),
            ("project_id", "p"),
        ];
        for skip in 0..full.len() {
            let fields: Vec<_> = full
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != skip)
                .map(|(_, f)| *f)
                .collect();
            let err = ServiceAccount::parse(&json(&fields), "fcm")
                .expect_err("missing field")
                .to_string();
            assert!(err.contains(full[skip].0), "{err}");
            assert!(!err.contains("PRIVATE KEY"), "{err}");
        }
        // A key that is not a key: the error does not quote it.
        let bad = json(&[
            ("client_email", "a@b"),
            (
                "private_key",
                "-----BEGIN PRIVATE KEY-----\nc2VjcmV0\n-----END",
            ),
            ("token_uri", "https://t.example/token"),
            ("project_id", "p"),
        ]);
        let err = ServiceAccount::parse(&bad, "fcm")
            .expect_err("bad key")
            .to_string();
        assert!(
            err.contains("private_key") && !err.contains("c2VjcmV0"),
            "{err}"
        );
        // A type error in the JSON: serde's message would quote the value.
        let typed = SecretString::from(r#"{"private_key": 5, "x": "c2VjcmV0"}"#.to_string());
        let err = ServiceAccount::parse(&typed, "fcm")
            .expect_err("type")
            .to_string();
        assert!(!err.contains("c2VjcmV0"), "{err}");
    }

    #[test]
    fn token_uri_must_be_https() {
        let pem = test_key_pem();
        let sa = json(&[
            ("client_email", "a@b"),
            ("private_key", &pem),
            ("token_uri", "http://t.example/token"),
            ("project_id", "p"),
        ]);
        let err = ServiceAccount::parse(&sa, "fcm")
            .expect_err("http")
            .to_string();
        assert!(err.contains("https"), "{err}");
    }
}
