//! `pushpace mock apns|fcm|webpush`: one loopback provider mock (`crate::tools::mock`) as its
//! own process over TLS, for `pushpace bench` and for trying a worker by hand.
//!
//! It writes to `--dir` what a worker needs to reach it: `ca.pem`, the credentials
//! (APNs: a fresh `.p8` key; FCM: a service account whose `token_uri` is the mock; Web
//! Push: the worker's own VAPID key and the `seed` of the mock's deterministic
//! subscriptions, see [`crate::tools::mock::seeded`]), and `provider.json` with the
//! `[providers.<name>]` settings. It keeps counts only (no per-token records), and on
//! SIGTERM or ctrl-c writes `counts.json` and exits.

use super::BenchError;
use crate::tools::mock::apns::{ApnsMock, MockApnsConfig};
use crate::tools::mock::fcm::{FcmMock, FcmMockConfig};
use crate::tools::mock::tls::TestCa;
use crate::tools::mock::webpush::WebPushMock;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

/// Which provider the mock plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MockKind {
    Apns,
    Fcm,
    Webpush,
}

impl MockKind {
    pub fn name(self) -> &'static str {
        match self {
            MockKind::Apns => "apns",
            MockKind::Fcm => "fcm",
            MockKind::Webpush => "webpush",
        }
    }
}

#[derive(clap::Args, Debug, Clone)]
pub struct MockArgs {
    /// The provider to play.
    #[arg(value_enum)]
    pub kind: MockKind,
    /// Where to listen (loopback only).
    #[arg(long, default_value = "127.0.0.1:0")]
    pub bind: SocketAddr,
    /// Where to write the CA, the credentials and `provider.json`.
    #[arg(long)]
    pub dir: PathBuf,
}

/// `provider.json`: how to reach the mock.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MockInfo {
    /// `https://127.0.0.1:PORT`.
    pub url: String,
    /// `[providers.<name>]` keys and values (file paths, never key material).
    pub settings: BTreeMap<String, String>,
    /// Web Push: the subscriptions' seed, hex.
    pub seed: Option<String>,
}

/// `counts.json`, written on exit.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct MockCounts {
    /// Requests the provider endpoint received.
    pub requests: u64,
    /// Requests answered as delivered.
    pub delivered: u64,
}

const TEAM: &str = "BENCHTEAM1";
const KEY_ID: &str = "BENCHKEY01";
const TOPIC: &str = "com.example.pushpace";

/// A running mock of any kind.
enum Running {
    Apns(ApnsMock),
    Fcm(FcmMock),
    WebPush(WebPushMock),
}

impl Running {
    fn counts(&self) -> MockCounts {
        match self {
            Running::Apns(m) => MockCounts {
                requests: m.controls().requests(),
                delivered: m.controls().answers("ok"),
            },
            Running::Fcm(m) => MockCounts {
                requests: m.sends(),
                delivered: m.sends() - m.unauthenticated(),
            },
            Running::WebPush(m) => MockCounts {
                requests: m.server().controls().streams(),
                delivered: m.delivered(),
            },
        }
    }
}

/// Runs the mock until SIGTERM or ctrl-c.
pub async fn run(args: &MockArgs) -> Result<(), BenchError> {
    if !args.bind.ip().is_loopback() {
        return Err(super::phase_err(
            "mock",
            "--bind must be a loopback address",
        ));
    }
    std::fs::create_dir_all(&args.dir)?;
    let dir = std::path::absolute(&args.dir)?;
    let ca = TestCa::new();
    let ca_file = dir.join("ca.pem");
    std::fs::write(&ca_file, ca.ca_pem())?;
    let (running, info) = start(args.kind, args.bind, &ca, &dir)?;
    let mut info = info;
    info.settings
        .insert("ca_file".into(), ca_file.display().to_string());
    std::fs::write(
        dir.join("provider.json"),
        serde_json::to_vec_pretty(&info).map_err(std::io::Error::other)?,
    )?;
    println!("{} mock listening on {}", args.kind.name(), info.url);
    println!("[providers.{}]", args.kind.name());
    for (k, v) in &info.settings {
        println!("{k} = {v:?}");
    }
    wait_for_signal().await;
    let counts = running.counts();
    std::fs::write(
        dir.join("counts.json"),
        serde_json::to_vec(&counts).map_err(std::io::Error::other)?,
    )?;
    println!(
        "{} requests, {} delivered",
        counts.requests, counts.delivered
    );
    Ok(())
}

fn start(
    kind: MockKind,
    bind: SocketAddr,
    ca: &TestCa,
    dir: &Path,
) -> Result<(Running, MockInfo), BenchError> {
    let path = |name: &str| dir.join(name).display().to_string();
    let mut settings = BTreeMap::new();
    settings.insert("kind".to_string(), kind.name().to_string());
    let mut seed = None;
    let running = match kind {
        MockKind::Apns => {
            let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)
                .map_err(|e| super::phase_err("mock", e.to_string()))?;
            write_secret(&dir.join("key.p8"), &pair.serialize_pem())?;
            let mut config = MockApnsConfig::new(TEAM, KEY_ID, &pair.public_key_pem(), TOPIC);
            config.count_only = true;
            config.bind = Some(bind);
            let mock = ApnsMock::start(ca, config)?;
            for (k, v) in [
                ("team_id", TEAM.to_string()),
                ("key_id", KEY_ID.into()),
                ("key_file", path("key.p8")),
                ("topic", TOPIC.into()),
                ("environment", "sandbox".into()),
                ("endpoint", mock.url()),
            ] {
                settings.insert(k.into(), v);
            }
            Running::Apns(mock)
        }
        MockKind::Fcm => {
            let config = FcmMockConfig {
                count_only: true,
                bind: Some(bind),
                ..Default::default()
            };
            let mock = FcmMock::start_with(ca, config)?;
            write_secret(
                &dir.join("service_account.json"),
                &mock.service_account_json(),
            )?;
            settings.insert("service_account_file".into(), path("service_account.json"));
            settings.insert("endpoint".into(), mock.url());
            Running::Fcm(mock)
        }
        MockKind::Webpush => {
            let mock = WebPushMock::start_on(bind, ca)?;
            mock.set_count_only(true);
            let s = crate::tools::mock::seeded::SeededSubscriptions::random_seed();
            mock.accept_seeded(s);
            seed = Some(s.iter().map(|b| format!("{b:02x}")).collect());
            // The VAPID key is the sender's own; the mock checks whatever key signs.
            use p256::pkcs8::EncodePrivateKey;
            let key = p256::SecretKey::random(&mut aes_gcm::aead::OsRng);
            let pem = key
                .to_pkcs8_pem(p256::pkcs8::LineEnding::LF)
                .map_err(|e| super::phase_err("mock", e.to_string()))?;
            write_secret(&dir.join("vapid.pem"), &pem)?;
            settings.insert("vapid_private_key_file".into(), path("vapid.pem"));
            settings.insert("vapid_subject".into(), "mailto:bench@example.com".into());
            Running::WebPush(mock)
        }
    };
    let url = match &running {
        Running::Apns(m) => m.url(),
        Running::Fcm(m) => m.url(),
        Running::WebPush(m) => m.origin(),
    };
    Ok((
        running,
        MockInfo {
            url,
            settings,
            seed,
        },
    ))
}

/// Writes a key file readable by its owner only.
fn write_secret(path: &Path, text: &str) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(text.as_bytes())
}

/// Parses `provider.json`'s seed.
pub fn parse_seed(hex: &str) -> Option<[u8; 32]> {
    let mut seed = [0u8; 32];
    if hex.len() != 64 {
        return None;
    }
    for (i, b) in seed.iter_mut().enumerate() {
        *b = u8::from_str_radix(hex.get(2 * i..2 * i + 2)?, 16).ok()?;
    }
    Some(seed)
}

async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
