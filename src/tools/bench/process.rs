//! The processes a phase runs and measures: the worker (`pushpace run`, read through
//! its `/metrics` and `/proc`), the sink and the provider mocks; and the helpers that
//! read CPU time and peak RSS.

use super::{phase_err, BenchError};
use std::process::Child;
use std::time::{Duration, Instant};

/// Where the worker process is, and how to read it.
pub(super) struct WorkerProcess {
    pub(super) child: Child,
    pub(super) metrics_url: String,
    pub(super) http: reqwest::Client,
    /// Where `time_until` writes the send curve (CSV).
    pub(super) curve_path: std::path::PathBuf,
    /// Started under `PUSHPACE_BENCH_WORKER_WRAPPER`: `child` is the wrapper (a profiler
    /// that may fork the worker), and the worker is its child.
    pub(super) wrapped: bool,
}

/// One poll of a worker process.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Sample {
    pub(super) at: Option<Instant>,
    pub(super) sends: u64,
    pub(super) cpu_s: f64,
    pub(super) flushes: f64,
    pub(super) statements: f64,
    pub(super) parked: f64,
    pub(super) buffered_devices: f64,
    pub(super) paused_partitions: f64,
    pub(super) rounds: f64,
    pub(super) turns: f64,
    pub(super) round_s: f64,
    /// The machine's CPU ticks taken by the host (steal) and in all, from `/proc/stat`.
    pub(super) host: HostTicks,
}

/// What a phase's timing window measured.
#[derive(Debug, Clone, Copy)]
pub(super) struct Timed {
    pub(super) secs: f64,
    pub(super) sent: u64,
    /// The worker's CPU seconds.
    pub(super) cpu: f64,
    /// Share of the machine's CPU time the host took (steal), if the kernel reports it.
    pub(super) steal: Option<f64>,
}

/// How often `time_until` scrapes the worker before the last 5% of its sends.
const SAMPLE_EVERY: Duration = Duration::from_millis(200);
/// How often near the end: the phase's end is known to within this.
const SAMPLE_NEAR_END: Duration = Duration::from_millis(20);

impl WorkerProcess {
    /// The worker's pid: the child's, or under a forking wrapper (`perf stat`, `perf
    /// record`) the wrapper's first child, so that CPU and RSS are the worker's own.
    pub(super) fn pid(&self) -> u32 {
        let own = self.child.id();
        if !self.wrapped {
            return own;
        }
        std::fs::read_to_string(format!("/proc/{own}/task/{own}/children"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(own)
    }

    pub(super) async fn metrics(&self) -> Result<String, BenchError> {
        Ok(self
            .http
            .get(&self.metrics_url)
            .send()
            .await?
            .text()
            .await?)
    }

    pub(super) async fn sample(&self) -> Result<Sample, BenchError> {
        let text = self.metrics().await?;
        let at = Instant::now();
        let mut s = Sample {
            at: Some(at),
            cpu_s: cpu_seconds(self.pid()).unwrap_or(0.0),
            host: host_ticks().unwrap_or_default(),
            ..Default::default()
        };
        for line in text.lines() {
            if line.starts_with("delivered_total ") {
                s.sends = metric_value(line) as u64;
            } else if line.starts_with("stats_flushes_total ") {
                s.flushes = metric_value(line);
            } else if line.starts_with("stats_flush_statements_total ") {
                s.statements = metric_value(line);
            } else if line.starts_with("parked_jobs ") {
                s.parked = metric_value(line);
            } else if line.starts_with("buffered_devices ") {
                s.buffered_devices = metric_value(line);
            } else if line.starts_with("paused_partitions ") {
                s.paused_partitions = metric_value(line);
            } else if line.starts_with("scheduler_rounds_total ") {
                s.rounds = metric_value(line);
            } else if line.starts_with("scheduler_turns_total ") {
                s.turns = metric_value(line);
            } else if line.starts_with("scheduler_round_seconds_total ") {
                s.round_s = metric_value(line);
            }
        }
        Ok(s)
    }

    /// Polls until `total` sends: seconds from first send to last, sends timed, the
    /// worker's CPU and the host's steal over them.
    pub(super) async fn time_until(
        &mut self,
        phase: &'static str,
        total: u64,
        limit: Duration,
    ) -> Result<Timed, BenchError> {
        let deadline = Instant::now() + limit;
        let mut first: Option<Sample> = None;
        let mut last = Sample::default();
        // The send curve, for telling a slow start or tail from a slow middle.
        let started = Instant::now();
        let mut curve = String::from(
            "seconds,sends,cpu_seconds,buffered_devices,parked_jobs,paused_partitions,rounds,turns,round_seconds,host_steal_ticks\n",
        );
        let bar = progress_bar(total, phase);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait()? {
                bar.abandon();
                return Err(phase_err(
                    phase,
                    format!("the worker exited early: {status}"),
                ));
            }
            if let Ok(s) = self.sample().await {
                bar.set_position(s.sends);
                if let Some(at) = s.at {
                    let t = (at - started).as_secs_f64();
                    curve.push_str(&format!(
                        "{t:.3},{},{:.3},{},{},{},{},{},{:.4},{}\n",
                        s.sends,
                        s.cpu_s,
                        s.buffered_devices,
                        s.parked,
                        s.paused_partitions,
                        s.rounds,
                        s.turns,
                        s.round_s,
                        s.host.steal
                    ));
                }
                if s.sends > 0 && first.is_none() {
                    first = Some(s);
                }
                last = s;
                if s.sends >= total {
                    break;
                }
            }
            // A scrape costs the worker CPU (it renders every histogram): sparse while far
            // from the end, dense near it, where the last sample's time ends the phase.
            let near_end = last.sends >= total / 100 * 95;
            tokio::time::sleep(if near_end {
                SAMPLE_NEAR_END
            } else {
                SAMPLE_EVERY
            })
            .await;
        }
        bar.finish_and_clear();
        if let Err(e) = std::fs::write(&self.curve_path, &curve) {
            tracing::warn!(error = %e, "cannot write the send curve");
        }
        let Some(first) = first.filter(|_| last.sends >= total) else {
            return Err(phase_err(
                phase,
                format!("sent {} of {total} within {limit:?}", last.sends),
            ));
        };
        let secs = match (first.at, last.at) {
            (Some(a), Some(b)) => (b - a).as_secs_f64(),
            _ => 0.0,
        };
        let total_ticks = last.host.total.saturating_sub(first.host.total);
        Ok(Timed {
            secs: secs.max(1e-3),
            sent: last.sends - first.sends,
            cpu: last.cpu_s - first.cpu_s,
            steal: (total_ticks > 0).then(|| {
                last.host.steal.saturating_sub(first.host.steal) as f64 / total_ticks as f64
            }),
        })
    }

    /// SIGTERM to the worker's process group (the worker, and its wrapper if any), wait
    /// for all of it; returns the peak RSS in MB read just before.
    pub(super) async fn stop(&mut self) -> Option<f64> {
        let peak = peak_rss_mb(self.pid());
        stop_child(&mut self.child).await;
        peak
    }
}

impl Drop for WorkerProcess {
    fn drop(&mut self) {
        signal_group(self.child.id() as libc::pid_t, libc::SIGKILL);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Sends `signal` to the process group a child leads (spawned with `process_group(0)`).
fn signal_group(pgid: libc::pid_t, signal: libc::c_int) -> bool {
    // SAFETY: kill(2) on the group this process created for its child.
    unsafe { libc::kill(-pgid, signal) == 0 }
}

/// SIGTERM, then SIGKILL after 20 s, to the child or, when it leads a process group of
/// its own (the worker, spawned with `process_group(0)`), to the whole group, and waits
/// until no member is left. A wrapper that exits on SIGTERM without waiting for the
/// worker it forked (`perf stat`) left the worker running beside the next phases.
pub(super) async fn stop_child(child: &mut Child) {
    let pid = child.id() as libc::pid_t;
    // SAFETY: getpgid(2) on a pid this process spawned and has not reaped yet.
    let group = unsafe { libc::getpgid(pid) } == pid;
    let signal = |sig| {
        if group {
            signal_group(pid, sig)
        } else {
            // SAFETY: kill(2) with a pid this process spawned.
            unsafe { libc::kill(pid, sig) == 0 }
        }
    };
    signal(libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut reaped = false;
    while Instant::now() < deadline {
        reaped = reaped || matches!(child.try_wait(), Ok(Some(_)));
        // Signal 0 probes whether any member of the group is left.
        if reaped && !(group && signal(0)) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    signal(libc::SIGKILL);
    let _ = child.kill();
    let _ = child.wait();
}

pub(super) fn metric_value(line: &str) -> f64 {
    line.rsplit(' ')
        .next()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

/// The fields of `/proc/<pid>/stat` after the parenthesised command name (the first is
/// the state letter); `None` once the process is reaped.
fn proc_stat_fields(pid: u32) -> Option<Vec<String>> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    Some(rest.split(' ').map(str::to_owned).collect())
}

/// User + system CPU seconds of a process, all threads.
pub(super) fn cpu_seconds(pid: u32) -> Option<f64> {
    let fields = proc_stat_fields(pid)?;
    // utime and stime are the 12th and 13th fields after the command name.
    let utime: f64 = fields.get(11)?.parse().ok()?;
    let stime: f64 = fields.get(12)?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    Some((utime + stime) / ticks.max(1.0))
}

/// The machine's CPU ticks, all CPUs: stolen by the host, and in all.
#[derive(Debug, Clone, Copy, Default)]
pub(super) struct HostTicks {
    pub(super) steal: u64,
    pub(super) total: u64,
}

/// `/proc/stat`'s first line: user nice system idle iowait irq softirq steal ...
pub(super) fn host_ticks() -> Option<HostTicks> {
    parse_host_ticks(&std::fs::read_to_string("/proc/stat").ok()?)
}

fn parse_host_ticks(stat: &str) -> Option<HostTicks> {
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .take(8)
        .map(|v| v.parse().ok())
        .collect::<Option<_>>()?;
    Some(HostTicks {
        steal: *ticks.get(7)?,
        total: ticks.iter().sum(),
    })
}

/// The peak resident set (VmHWM) of a process, in MB.
pub(super) fn peak_rss_mb(pid: u32) -> Option<f64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

pub(super) fn free_port() -> std::io::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

pub(super) async fn wait_for_port(port: u16, limit: Duration) -> Result<(), BenchError> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(phase_err("sink", format!("nothing listens on port {port}")))
}

pub(super) async fn sink_requests(port: u16) -> Option<u64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/_sink/stats"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let body: crate::tools::sink::CountingSummary = serde_json::from_str(&text).ok()?;
    Some(body.requests)
}

/// Server-side statements per flush from pg_stat_statements, when it is loaded.
pub(super) async fn server_statements_per_flush(pool: &sqlx::PgPool, flushes: f64) -> Option<f64> {
    if flushes <= 0.0 {
        return None;
    }
    let calls: Option<i64> = sqlx::query_scalar(
        "SELECT sum(s.calls)::int8 FROM pg_stat_statements s JOIN pg_database d ON d.oid = s.dbid \
         WHERE d.datname = current_database() \
           AND (s.query ILIKE '%delivery_seconds%' OR s.query ILIKE '%job_progress%') \
           AND s.query ILIKE 'WITH marker%'",
    )
    .fetch_one(pool)
    .await
    .ok()
    .flatten();
    pool.close().await;
    calls.map(|c| c as f64 / flushes)
}

pub(super) fn progress_bar(len: u64, what: &str) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new(len);
    bar.set_style(
        indicatif::ProgressStyle::with_template(&format!(
            "{{spinner}} {what} [{{elapsed_precise}}] {{wide_bar}} {{pos}}/{{len}} ({{per_sec}})"
        ))
        .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    bar
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn host_ticks_are_read_from_the_machines_first_cpu_line() {
        let stat = "cpu  348770 0 45457 238935 1846 0 9689 25242 0 0\ncpu0 1 2 3 4 5 6 7 8 0 0\n";
        let t = parse_host_ticks(stat).expect("parsed");
        assert_eq!(t.steal, 25242);
        assert_eq!(t.total, 348770 + 45457 + 238935 + 1846 + 9689 + 25242);
        assert!(parse_host_ticks("cpu0 1 2 3\n").is_none());
        let here = host_ticks().expect("this machine's /proc/stat");
        assert!(here.total > 0 && here.steal <= here.total);
    }

    /// A process's state letter; `None` once it is reaped.
    fn state(pid: u32) -> Option<char> {
        proc_stat_fields(pid)?.first()?.chars().next()
    }

    /// A wrapper that forks the worker and dies on SIGTERM without passing it on: the
    /// shell below stands in for `perf stat`, whose workers outlived the bench on 2026-11-28.
    #[tokio::test]
    async fn stopping_a_wrapped_worker_stops_the_worker_it_forked() {
        let mut cmd = std::process::Command::new("sh");
        cmd.args(["-c", "sleep 300 & wait"]);
        std::os::unix::process::CommandExt::process_group(&mut cmd, 0);
        let mut w = WorkerProcess {
            child: cmd.spawn().expect("sh"),
            metrics_url: String::new(),
            http: reqwest::Client::new(),
            curve_path: std::path::PathBuf::new(),
            wrapped: true,
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        let worker = loop {
            let pid = w.pid();
            if pid != w.child.id() {
                break pid;
            }
            assert!(Instant::now() < deadline, "the wrapper forked nothing");
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        // Alive (running while it still execs `sleep`, then sleeping).
        assert!(
            matches!(state(worker), Some(c) if c != 'Z'),
            "the forked process is not alive: {:?}",
            state(worker)
        );
        w.stop().await;
        // Killed: gone, or a zombie until whoever adopted it reaps it.
        assert!(
            matches!(state(worker), None | Some('Z')),
            "the forked worker outlived the stop: {:?}",
            state(worker)
        );
    }
}
