//! The per-kind checks of a `[providers.<name>]` section, each into its typed spec.

use super::{keys, Ctx, APNS_MIN_REFRESH_S, FCM_DEFAULT_MAX_RATE};
use crate::config::ConfigError;
use crate::provider::settings::{ApnsEnvironment, ApnsSpec, FcmSpec, WebPushSpec, WebhookSpec};
use std::time::Duration;

/// Longest VAPID JWT lifetime (RFC 8292: at most 24 hours).
const MAX_VAPID_LIFETIME_S: u64 = 86_400;
/// Longest JWT reuse: Apple refuses a token older than an hour; keep a minute spare.
const MAX_APNS_REFRESH_S: u64 = 3_540;

impl Ctx<'_> {
    pub(super) fn apns(&self) -> Result<ApnsSpec, ConfigError> {
        let s = self.section;
        let team_id = self.required("team_id", &s.team_id)?;
        self.ten_chars("team_id", team_id)?;
        let key_id = self.required("key_id", &s.key_id)?;
        self.ten_chars("key_id", key_id)?;
        let topic = self.required("topic", &s.topic)?;
        if topic.trim().is_empty() || topic.bytes().any(|b| !b.is_ascii_graphic()) {
            return Err(self.err(
                "topic",
                "must be the app's bundle id (printable ASCII, no spaces)",
            ));
        }
        let environment = match self.required("environment", &s.environment)?.as_str() {
            "production" => ApnsEnvironment::Production,
            "sandbox" => ApnsEnvironment::Sandbox,
            other => {
                return Err(self.err(
                    "environment",
                    format!("unknown environment {other:?}; expected production or sandbox"),
                ))
            }
        };
        let refresh = s.token_refresh_s.unwrap_or(3000);
        if !(1..=MAX_APNS_REFRESH_S).contains(&refresh) {
            return Err(self.err(
                "token_refresh_s",
                format!("must be 1–{MAX_APNS_REFRESH_S} (Apple refuses a JWT older than 1 hour)"),
            ));
        }
        if refresh < APNS_MIN_REFRESH_S {
            tracing::warn!(
                provider = %self.name,
                token_refresh_s = refresh,
                "providers.{}.token_refresh_s is under {APNS_MIN_REFRESH_S}: Apple answers \
                 TooManyProviderTokenUpdates to a JWT re-signed more often than every 20 \
                 minutes; use this only against a test server",
                self.name
            );
        }
        let key_pem = self.secret("key_file", &s.key_file, "key", &s.key, keys::check_apns_key)?;
        Ok(ApnsSpec {
            name: self.name.to_string(),
            team_id: team_id.clone(),
            key_id: key_id.clone(),
            key_pem,
            topic: topic.clone(),
            environment,
            endpoint: self.endpoint(environment.endpoint())?,
            connections: self.connections()?,
            token_refresh: Duration::from_secs(refresh),
            common: self.common(0.0)?,
        })
    }

    fn ten_chars(&self, field: &str, v: &str) -> Result<(), ConfigError> {
        if v.len() != 10 || !v.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(self.err(
                field,
                format!(
                    "must be 10 characters (A-Z, 0-9) as Apple shows it, got {} characters",
                    v.chars().count()
                ),
            ));
        }
        Ok(())
    }

    pub(super) fn fcm(&self) -> Result<FcmSpec, ConfigError> {
        let s = self.section;
        let margin = s.token_refresh_margin_s.unwrap_or(300);
        // Google's access tokens live one hour; a margin of half of it or more would
        // refresh on every check.
        if !(1..=1800).contains(&margin) {
            return Err(self.err(
                "token_refresh_margin_s",
                "must be 1–1800 (access tokens live 3600 s)",
            ));
        }
        let service_account = self.secret(
            "service_account_file",
            &s.service_account_file,
            "service_account",
            &s.service_account,
            keys::check_service_account,
        )?;
        Ok(FcmSpec {
            name: self.name.to_string(),
            service_account,
            endpoint: self.endpoint("https://fcm.googleapis.com")?,
            connections: self.connections()?,
            token_refresh_margin: Duration::from_secs(margin),
            common: self.common(FCM_DEFAULT_MAX_RATE)?,
        })
    }

    pub(super) fn webpush(&self) -> Result<WebPushSpec, ConfigError> {
        let s = self.section;
        let subject = self.required("vapid_subject", &s.vapid_subject)?;
        let subject_ok = match subject.split_once(':') {
            Some(("mailto", rest)) => rest.contains('@') && !rest.contains(char::is_whitespace),
            Some(("https", _)) => keys::check_url(subject, false).is_ok(),
            _ => false,
        };
        if !subject_ok {
            return Err(self.err(
                "vapid_subject",
                format!("must be a mailto: address or an https: URL (RFC 8292), got {subject:?}"),
            ));
        }
        let lifetime = s.vapid_lifetime_s.unwrap_or(43_200);
        if !(60..=MAX_VAPID_LIFETIME_S).contains(&lifetime) {
            return Err(self.err(
                "vapid_lifetime_s",
                format!("must be 60–{MAX_VAPID_LIFETIME_S} (RFC 8292: at most 24 hours)"),
            ));
        }
        let vapid_key_pem = self.secret(
            "vapid_private_key_file",
            &s.vapid_private_key_file,
            "vapid_private_key",
            &s.vapid_private_key,
            keys::check_vapid_key,
        )?;
        Ok(WebPushSpec {
            name: self.name.to_string(),
            vapid_key_pem,
            vapid_subject: subject.clone(),
            vapid_lifetime: Duration::from_secs(lifetime),
            common: self.common(0.0)?,
        })
    }

    pub(super) fn webhook(&self) -> Result<WebhookSpec, ConfigError> {
        let s = self.section;
        let url = self.required("url", &s.url)?;
        match url::Url::parse(url) {
            Ok(u) if matches!(u.scheme(), "http" | "https") => {}
            _ => return Err(self.err("url", "must be an http:// or https:// URL")),
        }
        let connections = s.http2_connections.unwrap_or(2);
        if !(1..=64).contains(&connections) {
            return Err(self.err("http2_connections", "must be 1 to 64"));
        }
        Ok(WebhookSpec {
            name: self.name.to_string(),
            url: url.clone(),
            http2_prior_knowledge: s.http2_prior_knowledge.unwrap_or(false),
            http2_connections: connections,
            http1_client: s.http1_client.unwrap_or(self.sender.http1_client),
            common: self.common(0.0)?,
        })
    }
}
