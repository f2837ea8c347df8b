//! An app's credentials, by kind: the secret part (sealed at rest) and the settings,
//! which are not secret and are stored in clear (`app_credentials.settings`).
//!
//! Fingerprints name credentials without revealing them: for APNs the key id and the
//! first 16 hex digits of the SHA-256 of the key's PKCS#8 DER
//! (`openssl pkey -in AuthKey_X.p8 -outform DER | sha256sum`), for FCM the service
//! account's `client_email`, for Web Push the VAPID public key (base64url of the
//! uncompressed point, the browsers' `applicationServerKey`). No `Debug` here prints a
//! secret.

use super::{AppKind, FieldError};
use crate::provider::settings::ApnsEnvironment;
use base64::Engine;
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// Hex digits of the key's SHA-256 in an APNs fingerprint (64 bits: enough to tell keys
/// apart, too few to matter to anyone holding the key).
pub const APNS_FINGERPRINT_HEX: usize = 16;

/// The limits every kind has, named as in `[providers.<name>]`; absent: the default.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// A cap on all of the app's campaigns of this kind (sends/s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<u32>,
    /// The adaptive ceiling: off with `false`, else its law's constants.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_increase: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_decrease: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adaptive_floor: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_target_ms: Option<u64>,
}

/// APNs settings (no secret).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApnsSettings {
    pub key_id: String,
    pub team_id: String,
    /// The bundle id (`apns-topic`).
    pub topic: String,
    /// `production` or `sandbox`.
    pub environment: String,
    /// Over the environment's endpoint (`https://host[:port]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(flatten)]
    pub limits: Limits,
}

impl ApnsSettings {
    pub fn environment(&self) -> ApnsEnvironment {
        if self.environment == "sandbox" {
            ApnsEnvironment::Sandbox
        } else {
            ApnsEnvironment::Production
        }
    }

    /// The endpoint sends go to: the override, else the environment's.
    pub fn endpoint(&self) -> &str {
        self.endpoint
            .as_deref()
            .unwrap_or_else(|| self.environment().endpoint())
    }
}

/// FCM settings: the service account's public fields.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FcmSettings {
    pub project_id: String,
    pub client_email: String,
    pub token_uri: String,
    /// Over `https://fcm.googleapis.com` (`https://host[:port]`): a private gateway.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint: Option<String>,
    #[serde(flatten)]
    pub limits: Limits,
}

/// Web Push settings: the VAPID subject and public key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebPushSettings {
    /// `mailto:` or `https:`.
    pub subject: String,
    /// Base64url of the uncompressed P-256 point.
    pub public_key: String,
    #[serde(flatten)]
    pub limits: Limits,
}

/// APNs: the `.p8` key (PKCS#8 PEM, P-256) and its settings.
#[derive(Clone)]
pub struct ApnsCredentials {
    pub key: SecretString,
    pub settings: ApnsSettings,
}

/// FCM: the service-account JSON and what it says in clear.
#[derive(Clone)]
pub struct FcmCredentials {
    pub service_account: SecretString,
    pub settings: FcmSettings,
}

/// Web Push: the VAPID private key (P-256 PEM, PKCS#8 or SEC1) and subject.
#[derive(Clone)]
pub struct WebPushCredentials {
    pub vapid_key: SecretString,
    pub settings: WebPushSettings,
}

/// One kind's credentials.
#[derive(Clone)]
pub enum Credentials {
    Apns(ApnsCredentials),
    Fcm(FcmCredentials),
    WebPush(WebPushCredentials),
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut d = f.debug_struct("Credentials");
        d.field("kind", &self.kind())
            .field("fingerprint", &self.fingerprint());
        match self {
            Credentials::Apns(c) => d.field("settings", &c.settings),
            Credentials::Fcm(c) => d.field("settings", &c.settings),
            Credentials::WebPush(c) => d.field("settings", &c.settings),
        };
        d.field("secret", &"[hidden]").finish()
    }
}

/// An app as a PUT gives it: the kinds it has (at least one).
#[derive(Clone, Debug, Default)]
pub struct AppInput {
    pub apns: Option<Credentials>,
    pub fcm: Option<Credentials>,
    pub webpush: Option<Credentials>,
}

impl AppInput {
    /// The kinds given, in [`AppKind::ALL`]'s order.
    pub fn kinds(&self) -> impl Iterator<Item = &Credentials> {
        [&self.apns, &self.fcm, &self.webpush]
            .into_iter()
            .filter_map(Option::as_ref)
    }
}

impl Credentials {
    pub fn kind(&self) -> AppKind {
        match self {
            Credentials::Apns(_) => AppKind::Apns,
            Credentials::Fcm(_) => AppKind::Fcm,
            Credentials::WebPush(_) => AppKind::WebPush,
        }
    }

    /// The secret text that is sealed.
    pub fn secret(&self) -> &SecretString {
        match self {
            Credentials::Apns(c) => &c.key,
            Credentials::Fcm(c) => &c.service_account,
            Credentials::WebPush(c) => &c.vapid_key,
        }
    }

    pub fn limits(&self) -> &Limits {
        match self {
            Credentials::Apns(c) => &c.settings.limits,
            Credentials::Fcm(c) => &c.settings.limits,
            Credentials::WebPush(c) => &c.settings.limits,
        }
    }

    /// The settings as stored (a JSON object).
    pub fn settings_json(&self) -> serde_json::Value {
        let v = match self {
            Credentials::Apns(c) => serde_json::to_value(&c.settings),
            Credentials::Fcm(c) => serde_json::to_value(&c.settings),
            Credentials::WebPush(c) => serde_json::to_value(&c.settings),
        };
        v.expect("settings are plain JSON")
    }

    /// See the module docs. Computed from the checked secret, so it cannot fail.
    pub fn fingerprint(&self) -> String {
        match self {
            Credentials::Apns(c) => {
                apns_fingerprint(&c.settings.key_id, &c.key).unwrap_or_else(|_| "?".into())
            }
            Credentials::Fcm(c) => c.settings.client_email.clone(),
            Credentials::WebPush(c) => c.settings.public_key.clone(),
        }
    }

    /// Rebuilds a kind's credentials from what is stored: its settings and the opened
    /// secret, each checked again (a row written by an older version, or by hand, is
    /// refused here rather than when it is used).
    pub fn from_stored(
        kind: AppKind,
        settings: &serde_json::Value,
        secret: SecretString,
    ) -> Result<Credentials, FieldError> {
        let bad = |e: serde_json::Error| {
            FieldError::new(
                "settings",
                format!("stored {kind} settings do not read back ({e})"),
            )
        };
        let creds = match kind {
            AppKind::Apns => {
                let settings: ApnsSettings =
                    serde_json::from_value(settings.clone()).map_err(bad)?;
                check_apns_key("apns.key", &secret)?;
                Credentials::Apns(ApnsCredentials {
                    key: secret,
                    settings,
                })
            }
            AppKind::Fcm => {
                let stored: FcmSettings = serde_json::from_value(settings.clone()).map_err(bad)?;
                let account = super::parse::service_account_text("fcm.service_account", &secret)?;
                if account.client_email != stored.client_email
                    || account.project_id != stored.project_id
                {
                    return Err(FieldError::new(
                        "fcm.service_account",
                        "the sealed service account does not match the stored client_email and project_id",
                    ));
                }
                Credentials::Fcm(FcmCredentials {
                    service_account: secret,
                    settings: stored,
                })
            }
            AppKind::WebPush => {
                let stored: WebPushSettings =
                    serde_json::from_value(settings.clone()).map_err(bad)?;
                let public_key = vapid_public_key("webpush.vapid_key", &secret)?;
                if public_key != stored.public_key {
                    return Err(FieldError::new(
                        "webpush.vapid_key",
                        "the sealed VAPID key does not match the stored public key",
                    ));
                }
                Credentials::WebPush(WebPushCredentials {
                    vapid_key: secret,
                    settings: stored,
                })
            }
        };
        Ok(creds)
    }
}

/// Parses an APNs key: a PKCS#8 P-256 private key in PEM.
pub(crate) fn check_apns_key(
    field: &str,
    pem: &SecretString,
) -> Result<p256::SecretKey, FieldError> {
    use p256::pkcs8::DecodePrivateKey;
    p256::SecretKey::from_pkcs8_pem(pem.expose_secret().trim()).map_err(|e| {
        FieldError::new(
            field,
            format!("is not a PKCS#8 P-256 private key in PEM (an APNs .p8 key): {e}"),
        )
    })
}

/// `KEYID:sha256:<16 hex>` of the key's PKCS#8 DER.
pub fn apns_fingerprint(key_id: &str, pem: &SecretString) -> Result<String, FieldError> {
    use p256::pkcs8::EncodePrivateKey;
    let key = check_apns_key("apns.key", pem)?;
    let der = key
        .to_pkcs8_der()
        .map_err(|e| FieldError::new("apns.key", format!("does not encode as PKCS#8: {e}")))?;
    let digest = Sha256::digest(der.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    Ok(format!("{key_id}:sha256:{}", &hex[..APNS_FINGERPRINT_HEX]))
}

/// The VAPID public key of a P-256 private key in PEM (PKCS#8 or SEC1): base64url of
/// the uncompressed point.
pub fn vapid_public_key(field: &str, pem: &SecretString) -> Result<String, FieldError> {
    use p256::elliptic_curve::sec1::ToEncodedPoint;
    use p256::pkcs8::DecodePrivateKey;
    let text = pem.expose_secret().trim();
    let key = p256::SecretKey::from_pkcs8_pem(text)
        .or_else(|_| p256::SecretKey::from_sec1_pem(text))
        .map_err(|_| {
            FieldError::new(
                field,
                "is not a P-256 private key in PEM (PKCS#8 BEGIN PRIVATE KEY or SEC1 BEGIN EC PRIVATE KEY)",
            )
        })?;
    let point = key.public_key().to_encoded_point(false);
    Ok(base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(point.as_bytes()))
}
