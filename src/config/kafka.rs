//! `[kafka]`'s connection keys: TLS, SASL and `[kafka.properties]`, the librdkafka
//! properties passed through for what the named keys don't cover.
//!
//! Every client pushpace makes takes them from here (`crate::broker::client_config`), so
//! a managed cluster (SASL_SSL with PLAIN or SCRAM, or mutual TLS) is one set of keys.
//! Secrets (`sasl_password`, `ssl_key_password`, a property named like a secret) are
//! never shown: `Debug` and `pushpace config` print `[redacted]`.

use super::{invalid, ConfigError};
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::collections::BTreeMap;

/// librdkafka's `security.protocol`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SecurityProtocol {
    #[default]
    Plaintext,
    Ssl,
    SaslPlaintext,
    SaslSsl,
}

impl SecurityProtocol {
    pub fn as_str(self) -> &'static str {
        match self {
            SecurityProtocol::Plaintext => "plaintext",
            SecurityProtocol::Ssl => "ssl",
            SecurityProtocol::SaslPlaintext => "sasl_plaintext",
            SecurityProtocol::SaslSsl => "sasl_ssl",
        }
    }

    pub fn uses_tls(self) -> bool {
        matches!(self, SecurityProtocol::Ssl | SecurityProtocol::SaslSsl)
    }

    pub fn uses_sasl(self) -> bool {
        matches!(
            self,
            SecurityProtocol::SaslPlaintext | SecurityProtocol::SaslSsl
        )
    }
}

/// librdkafka's `sasl.mechanism`, by its own names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub enum SaslMechanism {
    #[serde(rename = "PLAIN")]
    Plain,
    #[serde(rename = "SCRAM-SHA-256")]
    ScramSha256,
    #[serde(rename = "SCRAM-SHA-512")]
    ScramSha512,
}

impl SaslMechanism {
    pub fn as_str(self) -> &'static str {
        match self {
            SaslMechanism::Plain => "PLAIN",
            SaslMechanism::ScramSha256 => "SCRAM-SHA-256",
            SaslMechanism::ScramSha512 => "SCRAM-SHA-512",
        }
    }
}

/// Properties pushpace sets itself: its at-least-once rules and the named keys. Each is
/// refused in `[kafka.properties]`, with the reason.
const OWNED: &[(&str, &str)] = &[
    ("bootstrap.servers", "set kafka.brokers"),
    ("group.id", "set kafka.group_id"),
    (
        "enable.auto.commit",
        "offsets are committed only once work is durable",
    ),
    (
        "enable.auto.offset.store",
        "offsets are stored only once work is durable",
    ),
    (
        "auto.commit.enable",
        "offsets are committed only once work is durable",
    ),
    (
        "auto.offset.reset",
        "a new group reads from the earliest job",
    ),
    ("isolation.level", "set kafka.isolation_level"),
    (
        "partition.assignment.strategy",
        "set kafka.assignment_strategy",
    ),
    ("session.timeout.ms", "set kafka.session_timeout_ms"),
    ("heartbeat.interval.ms", "set kafka.heartbeat_interval_ms"),
    (
        "max.poll.interval.ms",
        "derived from kafka.session_timeout_ms",
    ),
    ("fetch.wait.max.ms", "set kafka.fetch_wait_max_ms"),
    ("enable.partition.eof", "the intake relies on no EOF events"),
    ("acks", "jobs and letters are produced with acks=all"),
    ("security.protocol", "set kafka.security_protocol"),
    ("sasl.mechanism", "set kafka.sasl_mechanism"),
    ("sasl.mechanisms", "set kafka.sasl_mechanism"),
    ("sasl.username", "set kafka.sasl_username"),
    (
        "sasl.password",
        "set kafka.sasl_password or kafka.sasl_password_file",
    ),
    ("ssl.ca.location", "set kafka.ssl_ca_file"),
    ("ssl.certificate.location", "set kafka.ssl_cert_file"),
    ("ssl.key.location", "set kafka.ssl_key_file"),
    ("ssl.key.password", "set kafka.ssl_key_password"),
    (
        "ssl.endpoint.identification.algorithm",
        "set kafka.ssl_endpoint_identification",
    ),
];

/// Whether a property's value may be a secret, by its name.
pub fn is_secret_name(name: &str) -> bool {
    let n = name.to_ascii_lowercase();
    [
        "password",
        "secret",
        "token",
        "credential",
        "key.pem",
        "jaas",
    ]
    .iter()
    .any(|s| n.contains(s))
}

/// `[kafka.properties]`: librdkafka properties by name. `Debug` hides the value of any
/// property named like a secret.
#[derive(Clone, Default, Deserialize)]
#[serde(transparent)]
pub struct KafkaProperties(BTreeMap<String, String>);

impl KafkaProperties {
    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        self.0.iter().map(|(k, v)| (k.as_str(), v.as_str()))
    }

    /// Refuses the properties pushpace owns, naming the key and the reason.
    pub(super) fn validate(&self) -> Result<(), ConfigError> {
        for key in self.0.keys() {
            let k = key.trim().to_ascii_lowercase();
            if let Some((_, why)) = OWNED.iter().find(|(name, _)| *name == k) {
                return Err(invalid(
                    format!("kafka.properties.{key}"),
                    format!("pushpace sets this itself: {why}"),
                ));
            }
        }
        Ok(())
    }
}

impl std::fmt::Debug for KafkaProperties {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut m = f.debug_map();
        for (k, v) in &self.0 {
            if is_secret_name(k) {
                m.entry(k, &"[redacted]");
            } else {
                m.entry(k, v);
            }
        }
        m.finish()
    }
}

impl super::KafkaSettings {
    /// Reads `sasl_password_file` into `sasl_password` (one of the two, not both).
    pub(super) fn resolve_secrets(&mut self) -> Result<(), ConfigError> {
        if let Some(path) = &self.sasl_password_file {
            if self.sasl_password.is_some() {
                return Err(invalid(
                    "kafka.sasl_password_file",
                    "set either it or kafka.sasl_password (PUSHPACE__KAFKA__SASL_PASSWORD), not both",
                ));
            }
            self.sasl_password = Some(read_secret_file("kafka.sasl_password_file", path)?);
        }
        Ok(())
    }

    /// Checks the connection keys against each other and the files they name.
    pub(super) fn validate_security(&self) -> Result<(), ConfigError> {
        let p = self.security_protocol;
        if p.uses_sasl() {
            if self.sasl_mechanism.is_none() {
                return Err(invalid(
                    "kafka.sasl_mechanism",
                    "required with a sasl_* security_protocol: PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512",
                ));
            }
            if self.sasl_username.as_deref().is_none_or(str::is_empty) {
                return Err(invalid("kafka.sasl_username", "required with SASL"));
            }
            if self
                .sasl_password
                .as_ref()
                .is_none_or(|s| s.expose_secret().is_empty())
            {
                return Err(invalid(
                    "kafka.sasl_password",
                    "required with SASL: set kafka.sasl_password_file or PUSHPACE__KAFKA__SASL_PASSWORD",
                ));
            }
        } else if self.sasl_mechanism.is_some() || self.sasl_username.is_some() {
            return Err(invalid(
                "kafka.security_protocol",
                format!(
                    "is {}, so the SASL keys would be ignored: use sasl_plaintext or sasl_ssl",
                    p.as_str()
                ),
            ));
        }
        let files = [
            ("kafka.ssl_ca_file", &self.ssl_ca_file),
            ("kafka.ssl_cert_file", &self.ssl_cert_file),
            ("kafka.ssl_key_file", &self.ssl_key_file),
        ];
        for (key, file) in files {
            let Some(path) = file else { continue };
            if !p.uses_tls() {
                return Err(invalid(
                    key,
                    format!(
                        "needs security_protocol ssl or sasl_ssl (it is {})",
                        p.as_str()
                    ),
                ));
            }
            if !path.is_file() {
                return Err(invalid(
                    key,
                    format!("{} is not a readable file", path.display()),
                ));
            }
        }
        if self.ssl_cert_file.is_some() != self.ssl_key_file.is_some() {
            return Err(invalid(
                "kafka.ssl_key_file",
                "mutual TLS needs both kafka.ssl_cert_file and kafka.ssl_key_file",
            ));
        }
        self.properties.validate()
    }
}

/// Reads a secret from a file (trailing newline dropped), for `*_password_file` keys.
pub(super) fn read_secret_file(
    key: &str,
    path: &std::path::Path,
) -> Result<SecretString, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| invalid(key, format!("cannot read {}: {e}", path.display())))?;
    let secret = text.trim_end_matches(['\r', '\n']);
    if secret.is_empty() {
        return Err(invalid(key, format!("{} is empty", path.display())));
    }
    Ok(SecretString::from(secret.to_string()))
}
