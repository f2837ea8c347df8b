//! The provider phases (`apns`, `fcm`, `webpush`): the worker sends over TLS and HTTP/2
//! to a provider mock running as its own process (`pushpace mock`, counts only), with
//! the `[providers.<name>]` settings the mock wrote and `sender.default_provider`
//! naming it. As in the `h2c` phase, the worker's CPU and peak RSS are its own, and the
//! mock's CPU is reported beside them, so a mock that caps the rate shows.

use super::mockcmd::{self, MockCounts, MockInfo};
use super::process::{cpu_seconds, free_port, stop_child};
use super::{phase_err, BenchArgs, BenchError, Ctx, Phase, PhaseResult};
use crate::limiter::Rate;
use crate::tools::mock::seeded::SeededSubscriptions;
use crate::tools::produce::{ProducePlan, TokenStyle};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

impl Ctx {
    /// One provider phase: mock process, jobs in that provider's shape, the worker.
    pub(super) async fn provider_phase(
        &self,
        phase: Phase,
        args: &BenchArgs,
        db: &str,
    ) -> Result<PhaseResult, BenchError> {
        let name = phase.name();
        let dir = self.out_dir.join(format!("{}-{name}-mock", self.run_id));
        let (mut mock, info) = self.start_mock(name, &dir).await?;
        let style = match phase {
            Phase::Apns => TokenStyle::ApnsHex { dead: None },
            Phase::Fcm => TokenStyle::Fcm,
            _ => {
                let seed = info.seed.as_deref().and_then(mockcmd::parse_seed);
                let seed = seed.ok_or_else(|| phase_err(name, "the mock wrote no seed"))?;
                TokenStyle::WebPush(SeededSubscriptions::new(&info.url, seed))
            }
        };
        let devices = match phase {
            Phase::Webpush => args.webpush_devices,
            _ => args.devices,
        };
        let campaigns = args.campaigns.max(1);
        let plan = ProducePlan::uniform(
            &format!("{}{name}", self.run_id),
            campaigns,
            devices.div_ceil(campaigns),
            Rate::per_second(1_000_000.0).expect("a valid rate"),
            args.job_size,
        );
        let topic = self.topic(name);
        self.produce_styled(&topic, &plan, &style).await?;

        let extra = self.provider_env(phase, args, &info);
        let extra: Vec<(&str, String)> =
            extra.iter().map(|(k, v)| (k.as_str(), v.clone())).collect();
        let total = plan.total_devices() as u64;
        let started = self.start_worker(name, &topic, db, &extra).await;
        let mut w = match started {
            Ok(w) => w,
            Err(e) => {
                stop_child(&mut mock).await;
                return Err(e);
            }
        };
        let mock_cpu_before = cpu_seconds(mock.id()).unwrap_or(0.0);
        let timed = w.time_until(name, total, Duration::from_secs(600)).await;
        let mock_cpu = cpu_seconds(mock.id()).map(|c| c - mock_cpu_before);
        let peak = w.stop().await;
        stop_child(&mut mock).await;
        let counts: Option<MockCounts> = std::fs::read(dir.join("counts.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok());
        let t = timed?;
        let sent = t.sent;
        let per_million = |s: f64| s / (sent as f64 / 1e6);
        let mut note = format!("{name} over TLS + HTTP/2 to a loopback mock process");
        if let Some(c) = counts {
            note.push_str(&format!(
                ", mock saw {} requests, {} delivered",
                c.requests, c.delivered
            ));
        }
        if let Some(c) = mock_cpu {
            note.push_str(&format!(", mock CPU {:.2} s per 1M", per_million(c)));
        }
        Ok(PhaseResult {
            peak_rss_mb: peak,
            peer_cpu_s_per_million: mock_cpu.map(per_million),
            note,
            ..PhaseResult::timed(name, total, t)
        })
    }

    /// The worker's environment for a provider phase: the mock's provider settings, no
    /// provider cap, and room in flight.
    fn provider_env(
        &self,
        phase: Phase,
        args: &BenchArgs,
        info: &MockInfo,
    ) -> Vec<(String, String)> {
        let name = phase.name();
        let upper = name.to_ascii_uppercase();
        let mut extra: Vec<(String, String)> = vec![
            (
                "PUSHPACE__SENDER__MAX_IN_FLIGHT".into(),
                self.max_in_flight.to_string(),
            ),
            ("PUSHPACE__SENDER__DEFAULT_PROVIDER".into(), name.into()),
            // No provider cap (FCM's default is its quota, 10,000/s).
            (
                format!("PUSHPACE__PROVIDERS__{upper}__MAX_RATE"),
                "0".into(),
            ),
            (
                format!("PUSHPACE__PROVIDERS__{upper}__MAX_IN_FLIGHT"),
                self.max_in_flight.to_string(),
            ),
        ];
        if let Some(n) = args.provider_connections {
            if phase != Phase::Webpush {
                let key = format!("PUSHPACE__PROVIDERS__{upper}__CONNECTIONS");
                extra.push((key, n.to_string()));
            }
        }
        for (k, v) in &info.settings {
            let key = format!("PUSHPACE__PROVIDERS__{upper}__{}", k.to_ascii_uppercase());
            extra.push((key, v.clone()));
        }
        extra
    }

    /// `pushpace mock <name>` on a free port; waits for its `provider.json`.
    async fn start_mock(
        &self,
        name: &'static str,
        dir: &Path,
    ) -> Result<(Child, MockInfo), BenchError> {
        let _ = std::fs::remove_dir_all(dir);
        let port = free_port()?;
        let log = std::fs::File::create(
            self.out_dir
                .join(format!("{}-{name}-mock.log", self.run_id)),
        )?;
        let mut child = Command::new(&self.exe)
            .args(["mock", name, "--bind"])
            .arg(format!("127.0.0.1:{port}"))
            .arg("--dir")
            .arg(dir)
            .env("RUST_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        let deadline = Instant::now() + Duration::from_secs(30);
        let path = dir.join("provider.json");
        loop {
            if let Ok(bytes) = std::fs::read(&path) {
                if let Ok(info) = serde_json::from_slice::<MockInfo>(&bytes) {
                    return Ok((child, info));
                }
            }
            if child.try_wait()?.is_some() || Instant::now() > deadline {
                stop_child(&mut child).await;
                return Err(phase_err(
                    name,
                    "the mock process did not start (see its log)",
                ));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}
