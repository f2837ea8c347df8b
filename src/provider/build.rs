//! Builds a worker's [`Providers`] from the checked specs (`[providers.*]`, read by
//! `config`): one sender per named provider, each with its own transport,
//! authentication and caps. The provider layer takes the specs it owns, never the
//! settings, so that it does not import `config`.

use super::settings::{NamedProvider, ProviderSpec, WebhookSpec};
use super::{Provider, ProviderError, Providers};
use crate::sender::{AnySender, HttpSender, HttpSenderConfig, NullSender};
use std::sync::Arc;

/// Every provider of `specs`, with the one named `default` as the default
/// (`settings.providers`, `settings.sender.default_provider`). Must run inside a tokio
/// runtime (adapters start their token refreshers).
pub fn build(specs: &[NamedProvider], default: &str) -> Result<Providers, ProviderError> {
    let list = specs.iter().map(build_one).collect::<Result<Vec<_>, _>>()?;
    Providers::new(list, default)
}

/// One named provider's sender.
pub fn build_one(p: &NamedProvider) -> Result<Provider, ProviderError> {
    let sender = match &p.spec {
        ProviderSpec::Null => AnySender::Null(NullSender),
        ProviderSpec::Webhook(w) => AnySender::Http(webhook(w)?),
        ProviderSpec::Apns(s) => AnySender::Provider(Arc::new(super::apns::ApnsSender::new(s)?)),
        ProviderSpec::Fcm(s) => AnySender::Provider(Arc::new(super::fcm::FcmSender::new(s)?)),
        ProviderSpec::WebPush(s) => {
            AnySender::Provider(Arc::new(super::webpush::WebPushSender::new(s)?))
        }
    };
    Ok(with_sender(p, sender))
}

/// `p`'s provider around a sender already built (an app whose limits changed keeps its
/// connections and its signed tokens).
pub fn with_sender(p: &NamedProvider, sender: AnySender) -> Provider {
    Provider {
        name: Arc::from(p.name.as_str()),
        kind: p.spec.kind(),
        max_rate: p.spec.common().and_then(|c| c.max_rate),
        max_in_flight: p
            .spec
            .common()
            .map(|c| u32::try_from(c.max_in_flight).unwrap_or(u32::MAX)),
        adaptive: p.spec.common().and_then(|c| c.adaptive),
        sender,
    }
}

fn webhook(w: &WebhookSpec) -> Result<HttpSender, ProviderError> {
    let mut c = HttpSenderConfig::new(w.url.clone());
    c.timeout = w.common.timeout;
    c.http2_prior_knowledge = w.http2_prior_knowledge;
    c.http2_connections = w.http2_connections;
    c.http1_client = w.http1_client;
    c.ca_pem = w.common.ca_pem.clone();
    Ok(HttpSender::new(&c)?)
}
