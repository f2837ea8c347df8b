//! The HTTP side of the CLI: the API's base URL and admin token, one call with its error
//! mapping, and decoding or pretty-printing what the API answered.

use super::{ApiArgs, CampaignOut, CliError, TOKEN_ENV};
use crate::config::Settings;
use std::fmt::Write as _;
use std::time::Duration;

pub(super) struct Client {
    pub(super) base: String,
    http: reqwest::Client,
    token: Option<String>,
}

impl Client {
    pub(super) fn new(api: &ApiArgs, settings: &Settings) -> Result<Self, CliError> {
        let base = match &api.api {
            Some(u) => u.trim_end_matches('/').to_string(),
            None => {
                let mut bind = settings.http.bind;
                if bind.ip().is_unspecified() {
                    bind.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
                }
                format!("http://{bind}")
            }
        };
        url::Url::parse(&base).map_err(|e| CliError::Invalid(format!("--api {base:?}: {e}")))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()
            .map_err(|source| CliError::Unreachable {
                url: base.clone(),
                source,
            })?;
        let token = std::env::var(TOKEN_ENV)
            .ok()
            .filter(|t| !t.trim().is_empty())
            .or_else(|| settings.http.admin_token().map(str::to_string));
        Ok(Self { base, http, token })
    }

    pub(super) fn campaign_url(&self, id: &str) -> String {
        let mut u = format!("{}/api/campaigns/", self.base);
        u.push_str(&encode_segment(id));
        u
    }

    pub(super) fn app_url(&self, id: &str) -> String {
        format!("{}/api/apps/{}", self.base, encode_segment(id))
    }

    pub(super) async fn call(
        &self,
        method: reqwest::Method,
        url: String,
        body: Option<serde_json::Value>,
        auth: bool,
    ) -> Result<Vec<u8>, CliError> {
        let mut req = self.http.request(method, &url);
        if auth {
            let token = self.token.as_deref().ok_or(CliError::NoToken)?;
            // Named in the campaign's settings history.
            req = req
                .bearer_auth(token)
                .header(crate::api::lifecycle::ACTOR_HEADER, "cli");
        }
        if let Some(body) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(body.to_string());
        }
        let unreachable = |source| CliError::Unreachable {
            url: url.clone(),
            source,
        };
        let res = req.send().await.map_err(unreachable)?;
        let status = res.status();
        let bytes = res.bytes().await.map_err(unreachable)?;
        if !status.is_success() {
            return Err(CliError::Api {
                url,
                status: status.as_u16(),
                message: error_message(&bytes),
            });
        }
        Ok(bytes.to_vec())
    }
}

/// A refusal's text: the API's `error`, naming its `field` when the text does not, or
/// the body as is when it is not the API's JSON.
fn error_message(bytes: &[u8]) -> String {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(bytes) else {
        return String::from_utf8_lossy(bytes).into_owned();
    };
    let Some(error) = v.get("error").and_then(|e| e.as_str()) else {
        return String::from_utf8_lossy(bytes).into_owned();
    };
    match v.get("field").and_then(|f| f.as_str()) {
        Some(field) if !error.contains(field) => format!("{field}: {error}"),
        _ => error.to_string(),
    }
}

/// What a campaign change answered: the API's JSON as is (`--json`), or the campaign.
pub(super) enum Changed {
    Json(String),
    Campaign(Box<CampaignOut>),
}

/// PUTs `body` to campaign `id` (authenticated).
pub(super) async fn put_campaign(
    client: &Client,
    id: &str,
    body: serde_json::Value,
    json: bool,
) -> Result<Changed, CliError> {
    let url = client.campaign_url(id);
    let bytes = client
        .call(reqwest::Method::PUT, url.clone(), Some(body), true)
        .await?;
    if json {
        return pretty(&url, &bytes).map(Changed::Json);
    }
    decode(&url, &bytes).map(|c| Changed::Campaign(Box::new(c)))
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(
    url: &str,
    bytes: &[u8],
) -> Result<T, CliError> {
    serde_json::from_slice(bytes).map_err(|e| CliError::Decode {
        url: url.to_string(),
        reason: e.to_string(),
    })
}

pub(super) fn pretty(url: &str, bytes: &[u8]) -> Result<String, CliError> {
    let v: serde_json::Value = decode(url, bytes)?;
    let mut s = serde_json::to_string_pretty(&v).map_err(|e| CliError::Decode {
        url: url.to_string(),
        reason: e.to_string(),
    })?;
    s.push('\n');
    Ok(s)
}

/// Percent-encodes a path segment (ids may hold `/`, `?`, `#`, spaces…).
fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b':') {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::{encode_segment, error_message};

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode_segment("spring-sale.v2:x"), "spring-sale.v2:x");
        assert_eq!(encode_segment("a/b c?"), "a%2Fb%20c%3F");
    }

    #[test]
    fn refusals_name_their_field() {
        let named = br#"{"error": "invalid priority: unknown", "field": "priority"}"#;
        assert_eq!(error_message(named), "invalid priority: unknown");
        let bare = br#"{"error": "must be later than now", "field": "finish_by"}"#;
        assert_eq!(error_message(bare), "finish_by: must be later than now");
        assert_eq!(error_message(b"bad gateway"), "bad gateway");
    }
}
