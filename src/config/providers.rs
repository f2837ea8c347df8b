//! `[providers.<name>]`: one section per named provider, `kind = "apns" | "fcm" |
//! "webpush" | "webhook"`.
//!
//! Each section is read into one flat [`ProviderSection`] (every field optional) and then
//! checked into the typed [`ProviderSpec`] of its kind. Not an internally tagged serde
//! enum: the `config` crate hands numbers from environment variables over as strings,
//! and only plain fields keep its coercions. Secrets come from a file (`key_file`,
//! `service_account_file`, `vapid_private_key_file`) or, as text, from
//! `PUSHPACE__PROVIDERS__<NAME>__KEY` / `__SERVICE_ACCOUNT` / `__VAPID_PRIVATE_KEY`.
//!
//! `[sender]` keeps defining the provider named `webhook` (its `kind = "http"` is a
//! webhook, `kind = "null"` the null provider), so a `[providers.webhook]` is refused.

use super::keys::{self, SecretSource};
use super::{invalid, ConfigError, SenderKind, SenderSettings, IMPLICIT_PROVIDER};
use crate::limiter::Rate;
use crate::provider::ceiling::CeilingParams;
use crate::provider::settings::{CommonSpec, NamedProvider, ProviderSpec, WebhookSpec};
use secrecy::SecretString;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

/// FCM's default quota: 600,000 messages a minute per project.
pub const FCM_DEFAULT_MAX_RATE: f64 = 10_000.0;
/// Apple: re-sign the JWT at most every 20 minutes.
pub const APNS_MIN_REFRESH_S: u64 = 1200;

/// One `[providers.<name>]` section as written; checked by [`build`].
#[derive(Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProviderSection {
    kind: Option<String>,
    // apns
    team_id: Option<String>,
    key_id: Option<String>,
    key_file: Option<PathBuf>,
    key: Option<SecretString>,
    topic: Option<String>,
    environment: Option<String>,
    endpoint: Option<String>,
    connections: Option<usize>,
    token_refresh_s: Option<u64>,
    // fcm
    service_account_file: Option<PathBuf>,
    service_account: Option<SecretString>,
    token_refresh_margin_s: Option<u64>,
    // webpush
    vapid_private_key_file: Option<PathBuf>,
    vapid_private_key: Option<SecretString>,
    vapid_subject: Option<String>,
    vapid_lifetime_s: Option<u64>,
    // webhook
    url: Option<String>,
    http2_prior_knowledge: Option<bool>,
    http2_connections: Option<usize>,
    #[serde(default, deserialize_with = "http1_client")]
    http1_client: Option<crate::sender::Http1Client>,
    // every kind
    ca_file: Option<PathBuf>,
    max_rate: Option<f64>,
    timeout_ms: Option<u64>,
    max_in_flight: Option<usize>,
    adaptive: Option<bool>,
    latency_target_ms: Option<u64>,
    adaptive_increase: Option<f64>,
    adaptive_decrease: Option<f64>,
    adaptive_floor: Option<f64>,
}

fn http1_client<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> Result<Option<crate::sender::Http1Client>, D::Error> {
    super::by_name(d).map(Some)
}

impl ProviderSection {
    /// The fields that are set, by name, to refuse those of another kind.
    fn set_fields(&self) -> Vec<&'static str> {
        let all: [(&'static str, bool); 29] = [
            ("team_id", self.team_id.is_some()),
            ("key_id", self.key_id.is_some()),
            ("key_file", self.key_file.is_some()),
            ("key", self.key.is_some()),
            ("topic", self.topic.is_some()),
            ("environment", self.environment.is_some()),
            ("endpoint", self.endpoint.is_some()),
            ("connections", self.connections.is_some()),
            ("token_refresh_s", self.token_refresh_s.is_some()),
            ("service_account_file", self.service_account_file.is_some()),
            ("service_account", self.service_account.is_some()),
            (
                "token_refresh_margin_s",
                self.token_refresh_margin_s.is_some(),
            ),
            (
                "vapid_private_key_file",
                self.vapid_private_key_file.is_some(),
            ),
            ("vapid_private_key", self.vapid_private_key.is_some()),
            ("vapid_subject", self.vapid_subject.is_some()),
            ("vapid_lifetime_s", self.vapid_lifetime_s.is_some()),
            ("url", self.url.is_some()),
            (
                "http2_prior_knowledge",
                self.http2_prior_knowledge.is_some(),
            ),
            ("http2_connections", self.http2_connections.is_some()),
            ("http1_client", self.http1_client.is_some()),
            ("ca_file", self.ca_file.is_some()),
            ("max_rate", self.max_rate.is_some()),
            ("timeout_ms", self.timeout_ms.is_some()),
            ("max_in_flight", self.max_in_flight.is_some()),
            ("adaptive", self.adaptive.is_some()),
            ("latency_target_ms", self.latency_target_ms.is_some()),
            ("adaptive_increase", self.adaptive_increase.is_some()),
            ("adaptive_decrease", self.adaptive_decrease.is_some()),
            ("adaptive_floor", self.adaptive_floor.is_some()),
        ];
        all.into_iter()
            .filter(|(_, s)| *s)
            .map(|(n, _)| n)
            .collect()
    }
}

const COMMON_FIELDS: &[&str] = &[
    "ca_file",
    "max_rate",
    "timeout_ms",
    "max_in_flight",
    "adaptive",
    "latency_target_ms",
    "adaptive_increase",
    "adaptive_decrease",
    "adaptive_floor",
];

/// `latency_target_ms` when not set ([`crate::provider::ceiling::DEFAULT_LATENCY_TARGET`]).
pub const DEFAULT_LATENCY_TARGET_MS: u64 = 2000;

/// The adaptive ceiling's law when nothing is set.
pub fn default_adaptive() -> CeilingParams {
    CeilingParams::default()
}
const APNS_FIELDS: &[&str] = &[
    "team_id",
    "key_id",
    "key_file",
    "key",
    "topic",
    "environment",
    "endpoint",
    "connections",
    "token_refresh_s",
];
const FCM_FIELDS: &[&str] = &[
    "service_account_file",
    "service_account",
    "endpoint",
    "connections",
    "token_refresh_margin_s",
];
const WEBPUSH_FIELDS: &[&str] = &[
    "vapid_private_key_file",
    "vapid_private_key",
    "vapid_subject",
    "vapid_lifetime_s",
];
const WEBHOOK_FIELDS: &[&str] = &[
    "url",
    "http2_prior_knowledge",
    "http2_connections",
    "http1_client",
];

/// Reads the `[providers.*]` sections from the merged configuration (none: empty).
pub(super) fn sections(
    built: &config::Config,
) -> Result<BTreeMap<String, ProviderSection>, ConfigError> {
    match built.get::<BTreeMap<String, ProviderSection>>("providers") {
        Ok(map) => Ok(map),
        Err(config::ConfigError::NotFound(_)) => Ok(BTreeMap::new()),
        Err(e) => Err(e.into()),
    }
}

/// Every provider: the implicit `webhook` of `[sender]`, then the sections by name.
/// `sender.default_provider` must name one of them.
pub(super) fn build(
    sender: &SenderSettings,
    sections: BTreeMap<String, ProviderSection>,
) -> Result<Vec<NamedProvider>, ConfigError> {
    let mut out = vec![implicit(sender)];
    for (name, section) in &sections {
        if name == IMPLICIT_PROVIDER {
            return Err(invalid(
                "providers.webhook",
                "the name webhook is taken by the provider [sender] defines (sender.url); \
                 configure that one in [sender] or give this section another name",
            ));
        }
        crate::job::check_provider_name(name)
            .map_err(|e| invalid(format!("providers.{name}"), format!("the name {e}")))?;
        let ctx = Ctx {
            name,
            section,
            sender,
        };
        out.push(NamedProvider {
            name: name.clone(),
            spec: ctx.spec()?,
        });
    }
    let default = &sender.default_provider;
    if !out.iter().any(|p| &p.name == default) {
        let names: Vec<&str> = out.iter().map(|p| p.name.as_str()).collect();
        return Err(invalid(
            "sender.default_provider",
            format!(
                "{default:?} names no provider; configured: {}",
                names.join(", ")
            ),
        ));
    }
    Ok(out)
}

/// The provider `[sender]` defines.
fn implicit(sender: &SenderSettings) -> NamedProvider {
    let spec = match sender.kind {
        SenderKind::Null => ProviderSpec::Null,
        SenderKind::Http => ProviderSpec::Webhook(WebhookSpec {
            name: IMPLICIT_PROVIDER.to_string(),
            url: sender.url.clone(),
            http2_prior_knowledge: sender.http2_prior_knowledge,
            http2_connections: sender.http2_connections,
            http1_client: sender.http1_client,
            common: CommonSpec {
                ca_pem: None,
                ca_file: None,
                max_rate: None,
                timeout: Duration::from_millis(sender.timeout_ms),
                max_in_flight: sender.max_in_flight,
                adaptive: Some(default_adaptive()),
                app: None,
            },
        }),
    };
    NamedProvider {
        name: IMPLICIT_PROVIDER.to_string(),
        spec,
    }
}

/// One section being checked.
struct Ctx<'a> {
    name: &'a str,
    section: &'a ProviderSection,
    sender: &'a SenderSettings,
}

impl Ctx<'_> {
    fn err(&self, field: &str, reason: impl Into<String>) -> ConfigError {
        invalid(format!("providers.{}.{field}", self.name), reason)
    }

    fn required<'v, T>(&self, field: &str, v: &'v Option<T>) -> Result<&'v T, ConfigError> {
        v.as_ref().ok_or_else(|| {
            self.err(
                field,
                format!("missing; required for kind {}", self.kind_name()),
            )
        })
    }

    fn kind_name(&self) -> &str {
        self.section.kind.as_deref().unwrap_or("?")
    }

    fn spec(&self) -> Result<ProviderSpec, ConfigError> {
        let kind = self.required("kind", &self.section.kind)?.as_str();
        let own: &[&str] = match kind {
            "apns" => APNS_FIELDS,
            "fcm" => FCM_FIELDS,
            "webpush" => WEBPUSH_FIELDS,
            "webhook" => WEBHOOK_FIELDS,
            other => {
                return Err(self.err(
                    "kind",
                    format!("unknown kind {other:?}; expected apns, fcm, webpush or webhook"),
                ))
            }
        };
        if let Some(f) = self
            .section
            .set_fields()
            .into_iter()
            .find(|f| !own.contains(f) && !COMMON_FIELDS.contains(f))
        {
            return Err(self.err(f, format!("is not a setting of kind {kind}")));
        }
        Ok(match kind {
            "apns" => ProviderSpec::Apns(self.apns()?),
            "fcm" => ProviderSpec::Fcm(self.fcm()?),
            "webpush" => ProviderSpec::WebPush(self.webpush()?),
            _ => ProviderSpec::Webhook(self.webhook()?),
        })
    }

    fn common(&self, default_rate: f64) -> Result<CommonSpec, ConfigError> {
        let s = self.section;
        let (ca_pem, ca_file) = match &s.ca_file {
            Some(path) => (
                Some(keys::read_ca(path).map_err(|e| self.err("ca_file", e))?),
                Some(path.clone()),
            ),
            None => (None, None),
        };
        let rate = s.max_rate.unwrap_or(default_rate);
        let max_rate = if rate == 0.0 {
            None
        } else {
            Some(
                Rate::per_second(rate)
                    .map_err(|e| self.err("max_rate", format!("{e} (or 0 for none)")))?,
            )
        };
        let timeout_ms = s.timeout_ms.unwrap_or(self.sender.timeout_ms);
        if !(1..=600_000).contains(&timeout_ms) {
            return Err(self.err("timeout_ms", "must be 1–600000"));
        }
        let max_in_flight = s.max_in_flight.unwrap_or(self.sender.max_in_flight);
        if !(1..=1_000_000).contains(&max_in_flight) {
            return Err(self.err("max_in_flight", "must be 1–1000000"));
        }
        Ok(CommonSpec {
            ca_pem,
            ca_file,
            max_rate,
            timeout: Duration::from_millis(timeout_ms),
            max_in_flight,
            adaptive: self.adaptive()?,
            app: None,
        })
    }

    /// The adaptive ceiling's law, each constant checked (`None`: `adaptive = false`).
    fn adaptive(&self) -> Result<Option<CeilingParams>, ConfigError> {
        let s = self.section;
        if s.adaptive == Some(false) {
            return Ok(None);
        }
        let d = default_adaptive();
        let beta = s.adaptive_decrease.unwrap_or(d.beta);
        if !(beta > 0.0 && beta < 1.0) {
            return Err(self.err("adaptive_decrease", "must be above 0 and below 1"));
        }
        let alpha = s.adaptive_increase.unwrap_or(d.alpha);
        if !(alpha > 0.0 && alpha <= 1.0) {
            return Err(self.err("adaptive_increase", "must be above 0 and at most 1"));
        }
        let floor = s.adaptive_floor.unwrap_or(d.floor);
        if !(1.0..=crate::limiter::rate::MAX_RATE_PER_SECOND).contains(&floor) {
            return Err(self.err("adaptive_floor", "must be at least 1 (sends/s)"));
        }
        let latency_target = match s.latency_target_ms.unwrap_or(DEFAULT_LATENCY_TARGET_MS) {
            0 => None,
            ms if ms <= 600_000 => Some(Duration::from_millis(ms)),
            _ => return Err(self.err("latency_target_ms", "must be 0 (off) to 600000")),
        };
        Ok(Some(CeilingParams {
            beta,
            alpha,
            floor,
            latency_target,
        }))
    }

    /// The secret of `file_field` or of its text field (from the environment): exactly
    /// one of them, checked by `check`.
    fn secret(
        &self,
        file_field: &str,
        file: &Option<PathBuf>,
        text_field: &str,
        text: &Option<SecretString>,
        check: impl Fn(&SecretString) -> Result<(), String>,
    ) -> Result<SecretString, ConfigError> {
        let env = format!(
            "PUSHPACE__PROVIDERS__{}__{}",
            self.name.to_ascii_uppercase(),
            text_field.to_ascii_uppercase()
        );
        let (secret, source, field) = match (file, text) {
            (Some(_), Some(_)) => {
                return Err(self.err(
                    file_field,
                    format!("set {file_field} or {env} ({text_field}), not both"),
                ))
            }
            (None, None) => {
                return Err(self.err(
                    file_field,
                    format!(
                        "missing; required for kind {}: a file, or the text in {env}",
                        self.kind_name()
                    ),
                ))
            }
            (Some(path), None) => {
                let text = keys::read_text(path).map_err(|e| self.err(file_field, e))?;
                (
                    SecretString::from(text),
                    SecretSource::File(path.clone()),
                    file_field,
                )
            }
            (None, Some(t)) => (t.clone(), SecretSource::Env(env), text_field),
        };
        check(&secret).map_err(|e| self.err(field, format!("{source} {e}")))?;
        Ok(secret)
    }

    fn connections(&self) -> Result<usize, ConfigError> {
        let n = self.section.connections.unwrap_or(2);
        if !(1..=64).contains(&n) {
            return Err(self.err("connections", "must be 1–64"));
        }
        Ok(n)
    }

    fn endpoint(&self, default: &str) -> Result<String, ConfigError> {
        let Some(raw) = &self.section.endpoint else {
            return Ok(default.to_string());
        };
        let u = keys::check_url(raw, false).map_err(|e| self.err("endpoint", e))?;
        if u.path() != "/" || u.query().is_some() {
            return Err(self.err("endpoint", "must be https://host[:port], with no path"));
        }
        Ok(raw.trim_end_matches('/').to_string())
    }
}

mod kinds;
