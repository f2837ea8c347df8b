//! `[apps]`: the master keys of the app registry ([`crate::apps`]).
//!
//! - `master_key_file`: a file holding the current master key (32 random bytes in
//!   base64, e.g. `openssl rand -base64 32 > master.key`); or `master_key`, the same
//!   text, meant for `PUSHPACE__APPS__MASTER_KEY`. Not both.
//! - `old_master_key_files`: keys that sealed rows still to be re-sealed by a rotation
//!   (in a file a list; in the environment or `--set`, comma-separated).
//!
//! - `ca_file`: extra trusted roots (PEM) for the apps' providers, besides the webpki
//!   roots: a private gateway, or the loopback mocks.
//! - `idle_close_ms` (default 300000, 100–86400000): an app's provider connection with
//!   no stream this long is closed; the next send reconnects.
//! - `max_open_connections` (default 2000, 1–1000000): app connections one worker keeps
//!   open; opening one more first closes the least recently used idle app's
//!   (docs/PROVIDERS.md).
//!
//! The keys are read and checked once, at load, into a [`Keyring`]; a bad one fails
//! start-up naming its key and never its content. Without a master key the registry
//! can still be listed, but nothing can be sealed or opened. `Debug` shows key ids only.

use crate::apps::{Keyring, MasterKey};
use crate::limiter::Rate;
use crate::provider::ProviderKind;
use secrecy::{ExposeSecret, SecretString};
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// `idle_close_ms` unless set: 5 minutes.
pub const DEFAULT_IDLE_CLOSE_MS: u64 = 300_000;
/// `max_open_connections` unless set.
pub const DEFAULT_MAX_OPEN_CONNECTIONS: usize = 2000;
const IDLE_CLOSE_RANGE: std::ops::RangeInclusive<u64> = 100..=86_400_000;
const MAX_OPEN_RANGE: std::ops::RangeInclusive<usize> = 1..=1_000_000;

/// The `[apps]` section, its keys read.
#[derive(Clone, Deserialize)]
#[serde(try_from = "RawApps")]
pub struct AppsSettings {
    /// `None`: no master key is configured.
    pub keyring: Option<Arc<Keyring>>,
    /// `ca_file`'s roots, trusted by every app's provider besides the webpki roots.
    pub ca_pem: Option<Arc<Vec<u8>>>,
    /// Close an app connection with no stream this long.
    pub idle_close_ms: u64,
    /// App connections a worker keeps open (a soft cap: see docs/PROVIDERS.md).
    pub max_open_connections: usize,
    /// `max_rate_<kind>`: caps over all apps of a kind, between the global cap and each
    /// app's own.
    pub kind_caps: Vec<(ProviderKind, Rate)>,
}

impl AppsSettings {
    /// The caps over all apps of a kind, for the scheduler.
    pub fn kind_caps(&self) -> Vec<(ProviderKind, Rate)> {
        self.kind_caps.clone()
    }
}

impl Default for AppsSettings {
    fn default() -> Self {
        AppsSettings {
            keyring: None,
            ca_pem: None,
            idle_close_ms: DEFAULT_IDLE_CLOSE_MS,
            max_open_connections: DEFAULT_MAX_OPEN_CONNECTIONS,
            kind_caps: Vec::new(),
        }
    }
}

impl std::fmt::Debug for AppsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let ids = self.keyring.as_ref().map(|k| k.ids());
        f.debug_struct("AppsSettings")
            .field("master_key_ids", &ids)
            .field("ca_pem_bytes", &self.ca_pem.as_ref().map(|c| c.len()))
            .field("idle_close_ms", &self.idle_close_ms)
            .field("max_open_connections", &self.max_open_connections)
            .field("kind_caps", &self.kind_caps)
            .finish()
    }
}

#[derive(Deserialize, Default)]
#[serde(deny_unknown_fields)]
struct RawApps {
    #[serde(default)]
    master_key: Option<SecretString>,
    #[serde(default)]
    master_key_file: Option<PathBuf>,
    #[serde(default, deserialize_with = "path_list")]
    old_master_key_files: Vec<PathBuf>,
    #[serde(default)]
    ca_file: Option<PathBuf>,
    #[serde(default = "default_idle_close_ms")]
    idle_close_ms: u64,
    #[serde(default = "default_max_open_connections")]
    max_open_connections: usize,
    #[serde(default)]
    max_rate_apns: Option<f64>,
    #[serde(default)]
    max_rate_fcm: Option<f64>,
    #[serde(default)]
    max_rate_webpush: Option<f64>,
}

impl RawApps {
    /// The kind caps set (0 or absent: none), each a valid rate.
    fn kind_caps(&self) -> Result<Vec<(ProviderKind, Rate)>, String> {
        let set = [
            (ProviderKind::Apns, "max_rate_apns", self.max_rate_apns),
            (ProviderKind::Fcm, "max_rate_fcm", self.max_rate_fcm),
            (
                ProviderKind::WebPush,
                "max_rate_webpush",
                self.max_rate_webpush,
            ),
        ];
        set.into_iter()
            .filter_map(|(kind, key, rate)| rate.filter(|&r| r != 0.0).map(|r| (kind, key, r)))
            .map(|(kind, key, r)| {
                Rate::per_second(r)
                    .map(|rate| (kind, rate))
                    .map_err(|e| format!("apps.{key}: {e} (0 for no cap)"))
            })
            .collect()
    }
}

fn default_idle_close_ms() -> u64 {
    DEFAULT_IDLE_CLOSE_MS
}

fn default_max_open_connections() -> usize {
    DEFAULT_MAX_OPEN_CONNECTIONS
}

/// A list of paths, from a TOML array or a comma-separated string (environment, flags).
fn path_list<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<PathBuf>, D::Error> {
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Paths {
        List(Vec<String>),
        Text(String),
    }
    let list = match Paths::deserialize(d)? {
        Paths::List(l) => l,
        Paths::Text(t) => t.split(',').map(str::to_string).collect(),
    };
    Ok(list
        .into_iter()
        .map(|p| p.trim().to_string())
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .collect())
}

fn read_key(key: &str, path: &Path) -> Result<MasterKey, String> {
    let text = std::fs::read(path)
        .map_err(|e| format!("{key}: cannot read {}: {e}", path.display()))
        .map(secrecy::zeroize::Zeroizing::new)?;
    let text = std::str::from_utf8(&text)
        .map_err(|_| format!("{key}: {} is not base64 text", path.display()))?;
    MasterKey::from_base64(text).map_err(|e| format!("{key}: {} {e}", path.display()))
}

impl TryFrom<RawApps> for AppsSettings {
    type Error = String;

    fn try_from(raw: RawApps) -> Result<Self, String> {
        if !IDLE_CLOSE_RANGE.contains(&raw.idle_close_ms) {
            return Err(format!(
                "apps.idle_close_ms: must be 100–86400000 (ms), not {}",
                raw.idle_close_ms
            ));
        }
        if !MAX_OPEN_RANGE.contains(&raw.max_open_connections) {
            return Err(format!(
                "apps.max_open_connections: must be 1–1000000, not {}",
                raw.max_open_connections
            ));
        }
        let (idle_close_ms, max_open_connections) = (raw.idle_close_ms, raw.max_open_connections);
        let kind_caps = raw.kind_caps()?;
        let ca_pem = raw
            .ca_file
            .as_deref()
            .map(|p| super::keys::read_ca(p).map_err(|e| format!("apps.ca_file: {e}")))
            .transpose()?
            .map(Arc::new);
        let current = match (&raw.master_key, &raw.master_key_file) {
            (Some(_), Some(_)) => {
                return Err("apps.master_key_file: set apps.master_key_file or \
                     PUSHPACE__APPS__MASTER_KEY (apps.master_key), not both"
                    .into())
            }
            (Some(text), None) => {
                Some(MasterKey::from_base64(text.expose_secret()).map_err(|e| {
                    format!("apps.master_key: the text of PUSHPACE__APPS__MASTER_KEY {e}")
                })?)
            }
            (None, Some(path)) => Some(read_key("apps.master_key_file", path)?),
            (None, None) => None,
        };
        let old = raw
            .old_master_key_files
            .iter()
            .enumerate()
            .map(|(i, p)| read_key(&format!("apps.old_master_key_files[{i}]"), p))
            .collect::<Result<Vec<_>, _>>()?;
        let Some(current) = current else {
            if !old.is_empty() {
                return Err(
                    "apps.old_master_key_files: old master keys need a current one \
                     (apps.master_key_file or PUSHPACE__APPS__MASTER_KEY)"
                        .into(),
                );
            }
            return Ok(AppsSettings {
                keyring: None,
                ca_pem,
                idle_close_ms,
                max_open_connections,
                kind_caps,
            });
        };
        let keyring =
            Keyring::new(current, old).map_err(|e| format!("apps.old_master_key_files: {e}"))?;
        Ok(AppsSettings {
            keyring: Some(Arc::new(keyring)),
            ca_pem,
            idle_close_ms,
            max_open_connections,
            kind_caps,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::super::{LoadOptions, Settings};
    use crate::apps::MasterKey;

    fn load(
        overrides: &[String],
        env: &[(&str, String)],
    ) -> Result<Settings, super::super::ConfigError> {
        let env: Vec<(String, String)> = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect();
        let lookup = env.clone();
        Settings::load_with_env(
            &LoadOptions {
                config_dir: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/config").into()),
                environment: Some("local".into()),
                overrides: overrides.to_vec(),
            },
            move |k| lookup.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
            env.into_iter(),
        )
    }

    #[test]
    fn keys_come_from_a_file_or_the_environment_and_show_as_ids() {
        let dir = tempfile::tempdir().unwrap();
        let (current, old) = (MasterKey::generate(), MasterKey::generate());
        let (cur_path, old_path) = (dir.path().join("current.key"), dir.path().join("old.key"));
        std::fs::write(&cur_path, format!("{}\n", &*current.to_base64())).unwrap();
        std::fs::write(&old_path, &*old.to_base64()).unwrap();

        let none = load(&[], &[]).unwrap();
        assert!(none.apps.keyring.is_none());

        let from_files = load(
            &[
                format!("apps.master_key_file={}", cur_path.display()),
                format!("apps.old_master_key_files={}", old_path.display()),
            ],
            &[],
        )
        .unwrap();
        let ring = from_files.apps.keyring.as_ref().unwrap();
        assert_eq!(ring.ids(), vec![current.id(), old.id()]);
        let shown = format!("{from_files:?}");
        assert!(
            shown.contains(current.id()) && shown.contains(old.id()),
            "{shown}"
        );
        for k in [&current, &old] {
            assert!(
                !shown.contains(k.to_base64().trim_end_matches('=')),
                "{shown}"
            );
        }

        let from_env = load(
            &[],
            &[(
                "PUSHPACE__APPS__MASTER_KEY",
                current.to_base64().to_string(),
            )],
        )
        .unwrap();
        assert_eq!(from_env.apps.keyring.unwrap().current_id(), current.id());
    }

    #[test]
    fn ca_file_is_read_at_load_and_shown_only_as_a_size() {
        let dir = tempfile::tempdir().unwrap();
        let ca = crate::tools::mock::tls::TestCa::new();
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, ca.ca_pem()).unwrap();
        let s = load(&[format!("apps.ca_file={}", path.display())], &[]).unwrap();
        let pem = s.apps.ca_pem.as_ref().expect("read");
        assert_eq!(pem.as_slice(), ca.ca_pem().as_bytes());
        let shown = format!("{:?}", s.apps);
        assert!(
            shown.contains(&format!("ca_pem_bytes: Some({})", pem.len())),
            "{shown}"
        );
        let not_pem = dir.path().join("not.pem");
        std::fs::write(&not_pem, "hello").unwrap();
        for bad in [not_pem.display().to_string(), "/nonexistent/ca.pem".into()] {
            let e = load(&[format!("apps.ca_file={bad}")], &[]).unwrap_err();
            assert!(e.to_string().contains("apps.ca_file"), "{e}");
        }
    }

    #[test]
    fn kind_caps_are_off_by_default_and_checked() {
        use crate::provider::ProviderKind;
        assert!(load(&[], &[]).unwrap().apps.kind_caps.is_empty());
        let s = load(
            &["apps.max_rate_fcm=9000".into()],
            &[("PUSHPACE__APPS__MAX_RATE_APNS", "120.5".into())],
        )
        .unwrap();
        let caps: Vec<(ProviderKind, f64)> = s
            .apps
            .kind_caps()
            .iter()
            .map(|(k, r)| (*k, r.as_f64()))
            .collect();
        assert_eq!(
            caps,
            vec![(ProviderKind::Apns, 120.5), (ProviderKind::Fcm, 9000.0)]
        );
        let e = load(&["apps.max_rate_webpush=-3".into()], &[]).unwrap_err();
        assert!(e.to_string().contains("apps.max_rate_webpush"), "{e}");
    }

    #[test]
    fn connection_keys_default_take_overrides_and_are_bounded() {
        let s = load(&[], &[]).unwrap();
        assert_eq!(s.apps.idle_close_ms, 300_000);
        assert_eq!(s.apps.max_open_connections, 2000);
        let s = load(
            &["apps.idle_close_ms=300".into()],
            &[("PUSHPACE__APPS__MAX_OPEN_CONNECTIONS", "2".into())],
        )
        .unwrap();
        assert_eq!(
            (s.apps.idle_close_ms, s.apps.max_open_connections),
            (300, 2)
        );
        let shown = format!("{:?}", s.apps);
        assert!(
            shown.contains("idle_close_ms: 300") && shown.contains("max_open_connections: 2"),
            "{shown}"
        );
        for (bad, key) in [
            ("apps.idle_close_ms=99", "apps.idle_close_ms"),
            ("apps.idle_close_ms=86400001", "apps.idle_close_ms"),
            ("apps.max_open_connections=0", "apps.max_open_connections"),
            (
                "apps.max_open_connections=1000001",
                "apps.max_open_connections",
            ),
        ] {
            let e = load(&[bad.into()], &[]).unwrap_err().to_string();
            assert!(e.contains(key), "{bad}: {e}");
        }
    }

    /// Overrides, environment, and what the error must say.
    type Case = (Vec<String>, Vec<(&'static str, String)>, &'static str);

    #[test]
    fn a_bad_key_fails_the_load_naming_its_key_not_its_content() {
        let dir = tempfile::tempdir().unwrap();
        let short = dir.path().join("short.key");
        std::fs::write(&short, "c2hvcnQtYnV0LXNlY3JldA==").unwrap();
        let good = dir.path().join("good.key");
        std::fs::write(&good, &*MasterKey::generate().to_base64()).unwrap();
        let cases: Vec<Case> = vec![
            (
                vec![format!("apps.master_key_file={}", short.display())],
                vec![],
                "apps.master_key_file",
            ),
            (
                vec!["apps.master_key_file=/nonexistent/master.key".into()],
                vec![],
                "apps.master_key_file",
            ),
            (
                vec![],
                vec![(
                    "PUSHPACE__APPS__MASTER_KEY",
                    "c2hvcnQtYnV0LXNlY3JldA==".into(),
                )],
                "apps.master_key",
            ),
            (
                vec![format!("apps.master_key_file={}", good.display())],
                vec![(
                    "PUSHPACE__APPS__MASTER_KEY",
                    MasterKey::generate().to_base64().to_string(),
                )],
                "not both",
            ),
            (
                vec![format!("apps.old_master_key_files={}", good.display())],
                vec![],
                "need a current one",
            ),
            (
                vec![
                    format!("apps.master_key_file={}", good.display()),
                    format!(
                        "apps.old_master_key_files={},{}",
                        good.display(),
                        short.display()
                    ),
                ],
                vec![],
                "apps.old_master_key_files[1]",
            ),
        ];
        for (overrides, env, expected) in cases {
            let e = load(&overrides, &env).unwrap_err().to_string();
            assert!(e.contains(expected), "{overrides:?} {env:?}: {e}");
            assert!(!e.contains("c2hvcnQtYnV0LXNlY3JldA"), "{e}");
        }
    }
}
