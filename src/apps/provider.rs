//! An app's opened credentials as a provider spec, the same typed spec a
//! `[providers.<name>]` section checks into, so that every adapter (and
//! `providers check`) serves apps unchanged.

use super::model::{Credentials, Limits};
use super::AppKind;
use crate::limiter::Rate;
use crate::provider::ceiling::CeilingParams;
use crate::provider::h2pool::ConnectionBudget;
use crate::provider::settings::{
    ApnsSpec, AppPooling, CommonSpec, FcmSpec, NamedProvider, ProviderSpec, WebPushSpec,
};
use crate::provider::ProviderError;
use std::sync::Arc;
use std::time::Duration;

/// FCM's endpoint unless an app names a private gateway.
pub const FCM_ENDPOINT: &str = "https://fcm.googleapis.com";
/// HTTP/2 connections per app pool. One: an app's rate is a share of the worker's, and
/// one connection carries hundreds of concurrent streams (APNs and FCM allow 1,000 or
/// so); two per app would make 1,000 sending apps with two kinds want 4,000
/// connections against the default `apps.max_open_connections` of 2,000.
pub const CONNECTIONS: usize = 1;
/// APNs JWT re-signing: 50 min, inside Apple's 20–60 min window (as the providers').
pub const APNS_TOKEN_REFRESH: Duration = Duration::from_secs(3000);
/// FCM access tokens are refreshed this long before they expire (as the providers').
pub const FCM_REFRESH_MARGIN: Duration = Duration::from_secs(300);
/// VAPID JWT lifetime: 12 h, half the 24 h limit (as the providers').
pub const VAPID_LIFETIME: Duration = Duration::from_secs(43_200);
/// An app's FCM token is refreshed in the background only while it sent this recently:
/// an hour, about one token's life, so an app that sends hourly never waits for one.
pub const FCM_REFRESH_IF_USED_WITHIN: Duration = Duration::from_secs(3600);

/// What an app's provider takes from the worker rather than from the app.
#[derive(Clone, Debug)]
pub struct AppDefaults {
    /// `[sender] timeout_ms`.
    pub timeout: Duration,
    /// `[sender] max_in_flight`, unless the app's kind sets its own.
    pub max_in_flight: usize,
    /// `apps.ca_file`'s roots.
    pub ca_pem: Option<Arc<Vec<u8>>>,
    /// `apps.idle_close_ms`.
    pub idle_close: Duration,
    /// The worker's budget of `apps.max_open_connections`, shared by every app's pool.
    pub budget: Arc<ConnectionBudget>,
    /// [`FCM_REFRESH_IF_USED_WITHIN`] (shorter in tests).
    pub fcm_refresh_if_used_within: Duration,
}

impl AppDefaults {
    /// From `[sender]` and `[apps]`. Makes the connection budget: call once per worker,
    /// and clone.
    pub fn from_settings(settings: &crate::config::Settings) -> AppDefaults {
        AppDefaults {
            timeout: Duration::from_millis(settings.sender.timeout_ms),
            max_in_flight: settings.sender.max_in_flight,
            ca_pem: settings.apps.ca_pem.clone(),
            idle_close: Duration::from_millis(settings.apps.idle_close_ms),
            budget: ConnectionBudget::new(settings.apps.max_open_connections),
            fcm_refresh_if_used_within: FCM_REFRESH_IF_USED_WITHIN,
        }
    }
}

/// The provider name an app's kind sends as (`app/<id>/<kind>`), in logs and metrics.
pub fn provider_name(app_id: &str, kind: AppKind) -> String {
    format!("app/{app_id}/{kind}")
}

/// The spec of `app_id`'s opened `creds`.
pub fn named_provider(
    app_id: &str,
    creds: &Credentials,
    defaults: &AppDefaults,
) -> Result<NamedProvider, ProviderError> {
    let name = provider_name(app_id, creds.kind());
    let common = common(&name, creds.kind(), creds.limits(), defaults)?;
    let spec = match creds {
        Credentials::Apns(c) => ProviderSpec::Apns(ApnsSpec {
            name: name.clone(),
            team_id: c.settings.team_id.clone(),
            key_id: c.settings.key_id.clone(),
            key_pem: c.key.clone(),
            topic: c.settings.topic.clone(),
            environment: c.settings.environment(),
            endpoint: c.settings.endpoint().to_string(),
            connections: CONNECTIONS,
            token_refresh: APNS_TOKEN_REFRESH,
            common,
        }),
        Credentials::Fcm(c) => ProviderSpec::Fcm(FcmSpec {
            name: name.clone(),
            service_account: c.service_account.clone(),
            endpoint: c
                .settings
                .endpoint
                .clone()
                .unwrap_or_else(|| FCM_ENDPOINT.to_string()),
            connections: CONNECTIONS,
            token_refresh_margin: FCM_REFRESH_MARGIN,
            common,
        }),
        Credentials::WebPush(c) => ProviderSpec::WebPush(WebPushSpec {
            name: name.clone(),
            vapid_key_pem: c.vapid_key.clone(),
            vapid_subject: c.settings.subject.clone(),
            vapid_lifetime: VAPID_LIFETIME,
            common,
        }),
    };
    Ok(NamedProvider { name, spec })
}

fn common(
    name: &str,
    kind: AppKind,
    l: &Limits,
    d: &AppDefaults,
) -> Result<CommonSpec, ProviderError> {
    let fail = |problem: String| ProviderError::Config {
        provider: name.to_string(),
        problem,
    };
    // FCM's quota is per Firebase project, so per app: its cap unless the app sets one.
    let unset = (kind == AppKind::Fcm).then_some(crate::config::providers::FCM_DEFAULT_MAX_RATE);
    let max_rate = match l.max_rate.or(unset) {
        None | Some(0.0) => None,
        Some(r) => Some(Rate::per_second(r).map_err(|e| fail(format!("max_rate: {e}")))?),
    };
    let adaptive = if l.adaptive == Some(false) {
        None
    } else {
        let base = CeilingParams::default();
        Some(CeilingParams {
            beta: l.adaptive_decrease.unwrap_or(base.beta),
            alpha: l.adaptive_increase.unwrap_or(base.alpha),
            floor: l.adaptive_floor.unwrap_or(base.floor),
            latency_target: match l.latency_target_ms {
                None => base.latency_target,
                Some(0) => None,
                Some(ms) => Some(Duration::from_millis(ms)),
            },
        })
    };
    Ok(CommonSpec {
        ca_pem: d.ca_pem.as_ref().map(|c| c.to_vec()),
        ca_file: None,
        max_rate,
        timeout: d.timeout,
        max_in_flight: l.max_in_flight.map_or(d.max_in_flight, |n| {
            usize::try_from(n).unwrap_or(usize::MAX)
        }),
        adaptive,
        app: Some(AppPooling {
            idle_close: d.idle_close,
            budget: Arc::clone(&d.budget),
            refresh_if_used_within: d.fcm_refresh_if_used_within,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_fcm_app_is_capped_at_its_projects_quota_unless_it_says_otherwise() {
        let defaults = AppDefaults {
            timeout: Duration::from_secs(5),
            max_in_flight: 64,
            ca_pem: None,
            idle_close: Duration::from_secs(300),
            budget: ConnectionBudget::new(10),
            fcm_refresh_if_used_within: FCM_REFRESH_IF_USED_WITHIN,
        };
        let account = |rate: Option<f64>| {
            let mut fcm = serde_json::json!({"service_account": {
                "type": "service_account", "project_id": "p",
                "client_email": "push@p.iam.gserviceaccount.com",
                "private_key": crate::tools::mock::fcm::generate_key_pem(),
                "token_uri": "https://oauth2.googleapis.com/token"}});
            if let Some(r) = rate {
                fcm["max_rate"] = r.into();
            }
            let body = serde_json::json!({ "fcm": fcm }).to_string();
            crate::apps::parse_app(body.as_bytes()).expect("a good app")
        };
        let cap = |rate: Option<f64>| {
            let input = account(rate);
            let creds = input.kinds().next().expect("fcm");
            let spec = named_provider("a", creds, &defaults).expect("spec").spec;
            spec.common().and_then(|c| c.max_rate).map(|r| r.as_f64())
        };
        assert_eq!(
            cap(None),
            Some(crate::config::providers::FCM_DEFAULT_MAX_RATE)
        );
        assert_eq!(cap(Some(250.0)), Some(250.0));
        // A project with a raised quota says so (the PUT checks 0 < max_rate ≤ 10M).
        assert_eq!(cap(Some(50_000.0)), Some(50_000.0));
    }
}
