//! The virtual-clock experiment behind `pushpace simulate`.
//!
//! It reproduces the article's experiment: a consumer works through `items` items at
//! `send_rate`, asking the limiter before each call, and we count the calls in every
//! 100 ms. The consumer is modelled as the article does: a loop that asks the limiter
//! and, when told `WaitUntil(t)`, sleeps until `t`; a call costs no time. A stall
//! (`--stall 4s:1s`) is the backend hanging: the consumer makes no calls from 4 s to 5 s.
//! Time is a [`ManualClock`](crate::limiter::ManualClock)-style virtual clock, so a run is
//! deterministic and instant.
//!
//! Outputs per algorithm: the count in every 100 ms bucket (`buckets_100ms[i]` counts
//! sends in `[i × 0.1 s, (i + 1) × 0.1 s)`), the largest count in any 1 s window taken at
//! the resolution of single sends (windows are half-open, `[t, t + 1 s)`), the largest and
//! smallest bucket, the instant of the last send and the standard deviation of the
//! buckets; as a table, as JSON, and optionally as an SVG chart.

pub mod ceiling;
pub mod pacing;
pub mod policy;
mod policy_render;

use std::fmt::Write as _;
use std::path::PathBuf;
use std::str::FromStr;

use crate::limiter::{
    build, Algorithm, Decision, Nanos, Rate, RateError, RateLimiter, NANOS_PER_SEC,
};

/// The bucket width of the article's figure.
pub const BUCKET: Nanos = NANOS_PER_SEC / 10;
/// The most items a run may simulate (each send's instant is kept in memory).
pub const MAX_ITEMS: u64 = 50_000_000;

/// `pushpace simulate` options.
#[derive(clap::Args, Debug, Clone)]
pub struct SimulateArgs {
    /// An algorithm name (leaky-bucket, token-bucket, fixed-window, sliding-log,
    /// sliding-window, gcra, governor) or `all`.
    #[arg(long, default_value = "all")]
    pub algorithm: AlgorithmChoice,
    /// Sends per second (fractions allowed).
    #[arg(long, default_value_t = 1000.0)]
    pub rate: f64,
    /// Items to process.
    #[arg(long, default_value_t = 10_000)]
    pub items: u64,
    /// A backend stall, `AT:FOR` (e.g. `4s:1s`, `6500ms:250ms`); repeatable. The consumer
    /// makes no calls in `[AT, AT + FOR)`.
    #[arg(long = "stall", value_name = "AT:FOR")]
    pub stalls: Vec<Stall>,
    /// Permits above the smooth spacing (see `limiter::build`).
    #[arg(long, default_value_t = 0)]
    pub burst: u32,
    /// Output format.
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Also draw the sends per 100 ms to this SVG file.
    #[arg(long, value_name = "FILE")]
    pub svg: Option<PathBuf>,
    /// Simulate the adaptive provider ceiling against a hidden quota instead (the
    /// convergence test's scenario, with the ceiling and without); the other options
    /// but --format and --svg do not apply.
    #[arg(long)]
    pub ceiling: bool,
    /// Run the delivery policy's scenarios on the scheduler instead (`policy.rs`: a
    /// ramp-up, and a finish-by campaign with and without a cap halving its rate); the
    /// other options but --format and --svg do not apply.
    #[arg(long)]
    pub policy: bool,
    /// Run the scheduler itself with this many campaigns in issue 24's long-tailed mix
    /// instead (`pacing.rs`); with --total-rate, --seconds, --job-size, --lateness-ms,
    /// --wake-slack-ms, --second-edge-ms.
    #[arg(long)]
    pub campaigns: Option<usize>,
    /// With --campaigns: the summed rate of the mix.
    #[arg(long, default_value_t = 50_000.0)]
    pub total_rate: f64,
    /// With --campaigns: seconds of sends each campaign is given.
    #[arg(long, default_value_t = 30)]
    pub seconds: u64,
    /// With --campaigns: devices per job.
    #[arg(long, default_value_t = 500)]
    pub job_size: usize,
    /// With --campaigns: each wake-up comes up to this late (seeded, uniform).
    #[arg(long, default_value_t = 1.0)]
    pub lateness_ms: f64,
    /// With --campaigns: the scheduler's `worker.wake_slack_ms`.
    #[arg(long, default_value_t = crate::worker::scheduler::DEFAULT_WAKE_SLACK_MS)]
    pub wake_slack_ms: u64,
    /// With --campaigns: the scheduler's `worker.second_edge_ms`.
    #[arg(long, default_value_t = crate::worker::scheduler::DEFAULT_SECOND_EDGE_MS)]
    pub second_edge_ms: u64,
    /// With --campaigns: the seed of the wake-ups' lateness.
    #[arg(long, default_value_t = 24)]
    pub seed: u64,
}

impl Default for SimulateArgs {
    fn default() -> Self {
        Self {
            algorithm: AlgorithmChoice::All,
            rate: 1000.0,
            items: 10_000,
            stalls: Vec::new(),
            burst: 0,
            format: Format::Table,
            svg: None,
            ceiling: false,
            policy: false,
            campaigns: None,
            total_rate: 50_000.0,
            seconds: 30,
            job_size: 500,
            lateness_ms: 1.0,
            wake_slack_ms: crate::worker::scheduler::DEFAULT_WAKE_SLACK_MS,
            second_edge_ms: crate::worker::scheduler::DEFAULT_SECOND_EDGE_MS,
            seed: 24,
        }
    }
}

/// `--format`.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Format {
    #[default]
    Table,
    Json,
}

/// `--algorithm`: one algorithm or all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AlgorithmChoice {
    All,
    One(Algorithm),
}

impl AlgorithmChoice {
    pub fn algorithms(self) -> Vec<Algorithm> {
        match self {
            AlgorithmChoice::All => Algorithm::ALL.to_vec(),
            AlgorithmChoice::One(a) => vec![a],
        }
    }
}

impl FromStr for AlgorithmChoice {
    type Err = SimulateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s == "all" {
            return Ok(AlgorithmChoice::All);
        }
        Algorithm::from_str(s)
            .map(AlgorithmChoice::One)
            .map_err(|_| SimulateError::UnknownAlgorithm(s.to_string()))
    }
}

/// A backend stall: no calls in `[at, at + duration)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stall {
    pub at: Nanos,
    pub duration: Nanos,
}

impl Stall {
    #[inline]
    fn end(self) -> Nanos {
        self.at.saturating_add(self.duration)
    }
}

impl FromStr for Stall {
    type Err = SimulateError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || SimulateError::InvalidStall(s.to_string());
        let (at, duration) = s.split_once(':').ok_or_else(bad)?;
        Ok(Stall {
            at: parse_duration(at).ok_or_else(bad)?,
            duration: parse_duration(duration).ok_or_else(bad)?,
        })
    }
}

impl std::fmt::Display for Stall {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}",
            fmt_duration(self.at),
            fmt_duration(self.duration)
        )
    }
}

/// `1.5s`, `250ms`, `10us`, `100ns`; a bare number is seconds.
fn parse_duration(s: &str) -> Option<Nanos> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, unit) = s.split_at(split);
    let value: f64 = number.parse().ok()?;
    let scale = match unit {
        "" | "s" => 1e9,
        "ms" => 1e6,
        "us" | "µs" => 1e3,
        "ns" => 1.0,
        _ => return None,
    };
    let nanos = value * scale;
    (0.0..1e18).contains(&nanos).then(|| nanos.round() as Nanos)
}

fn fmt_duration(n: Nanos) -> String {
    if n % NANOS_PER_SEC == 0 {
        format!("{}s", n / NANOS_PER_SEC)
    } else if n % 1_000_000 == 0 {
        format!("{}ms", n / 1_000_000)
    } else {
        format!("{}ns", n)
    }
}

/// Why a simulation could not run.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error("unknown algorithm {0:?}; expected all, leaky-bucket, token-bucket, fixed-window, sliding-log, sliding-window, gcra or governor")]
    UnknownAlgorithm(String),
    #[error("invalid --rate: {0}")]
    Rate(#[from] RateError),
    #[error("invalid --stall {0:?}: expected AT:FOR such as 4s:1s or 6500ms:250ms")]
    InvalidStall(String),
    #[error("--items must be at most {MAX_ITEMS}, got {0}")]
    TooManyItems(u64),
    #[error("drawing the SVG: {0}")]
    Svg(String),
    #[error("writing JSON: {0}")]
    Json(#[from] serde_json::Error),
}

/// A whole run: every algorithm under the same load.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct Report {
    /// Sends per second; printed as an integer when it is one.
    #[serde(serialize_with = "whole_if_integral")]
    pub rate: f64,
    pub items: u64,
    pub stalls: Vec<StallReport>,
    pub algorithms: Vec<AlgorithmReport>,
    #[serde(skip)]
    pub burst: u32,
}

/// A stall as reported in JSON, in seconds.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct StallReport {
    pub at_s: f64,
    pub duration_s: f64,
}

/// One algorithm's run.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AlgorithmReport {
    pub name: String,
    /// Sends in `[i × 0.1 s, (i + 1) × 0.1 s)`, up to the bucket of the last send.
    pub buckets_100ms: Vec<u64>,
    /// The most sends in any `[t, t + 1 s)`, t at any send.
    pub max_1s_window: u64,
    pub max_100ms: u64,
    pub min_100ms: u64,
    /// The instant of the last send, in seconds.
    pub finish_s: f64,
    /// Population standard deviation of `buckets_100ms`.
    pub stddev_100ms: f64,
}

fn whole_if_integral<S: serde::Serializer>(v: &f64, s: S) -> Result<S::Ok, S::Error> {
    if v.fract() == 0.0 && v.abs() < 9e15 {
        s.serialize_i64(*v as i64)
    } else {
        s.serialize_f64(*v)
    }
}

/// The consumer loop: `items` sends through `limiter`, sleeping exactly as told, with
/// no calls during `stalls`. Returns the instant of every send, in order.
pub fn send_times(limiter: &dyn RateLimiter, items: u64, stalls: &[Stall]) -> Vec<Nanos> {
    let mut sends = Vec::with_capacity(usize::try_from(items).unwrap_or(0));
    let mut now: Nanos = 0;
    while (sends.len() as u64) < items {
        if let Some(stall) = stalls.iter().find(|s| s.at <= now && now < s.end()) {
            now = stall.end();
            continue;
        }
        match limiter.try_acquire(now) {
            Decision::Allow => sends.push(now),
            // A limiter never says "now or earlier" when refusing; +1 guards the loop.
            Decision::WaitUntil(t) => now = t.max(now + 1),
        }
    }
    sends
}

/// The report figures for one algorithm's send instants (sorted).
pub fn analyse(name: &str, sends: &[Nanos]) -> AlgorithmReport {
    let Some(&last) = sends.last() else {
        return AlgorithmReport {
            name: name.to_string(),
            buckets_100ms: Vec::new(),
            max_1s_window: 0,
            max_100ms: 0,
            min_100ms: 0,
            finish_s: 0.0,
            stddev_100ms: 0.0,
        };
    };
    let mut buckets = vec![0u64; (last / BUCKET) as usize + 1];
    for &t in sends {
        buckets[(t / BUCKET) as usize] += 1;
    }
    // Two pointers: for each send i, the sends in [t_i, t_i + 1 s).
    let mut max_1s = 0;
    let mut j = 0;
    for (i, &t) in sends.iter().enumerate() {
        let end = t.saturating_add(NANOS_PER_SEC);
        while j < sends.len() && sends[j] < end {
            j += 1;
        }
        max_1s = max_1s.max((j - i) as u64);
    }
    let n = buckets.len() as f64;
    let mean = sends.len() as f64 / n;
    let var = buckets
        .iter()
        .map(|&c| (c as f64 - mean).powi(2))
        .sum::<f64>()
        / n;
    AlgorithmReport {
        name: name.to_string(),
        max_100ms: buckets.iter().copied().max().unwrap_or(0),
        min_100ms: buckets.iter().copied().min().unwrap_or(0),
        buckets_100ms: buckets,
        max_1s_window: max_1s,
        finish_s: last as f64 / NANOS_PER_SEC as f64,
        stddev_100ms: var.sqrt(),
    }
}

/// Runs the experiment for each of `algorithms`, each on a fresh limiter and clock.
pub fn simulate(
    algorithms: &[Algorithm],
    rate: Rate,
    items: u64,
    burst: u32,
    stalls: &[Stall],
) -> Report {
    let reports = algorithms
        .iter()
        .map(|&a| {
            let limiter = build(a, rate, burst);
            analyse(a.as_str(), &send_times(limiter.as_ref(), items, stalls))
        })
        .collect();
    Report {
        rate: rate.as_f64(),
        items,
        stalls: stalls
            .iter()
            .map(|s| StallReport {
                at_s: s.at as f64 / 1e9,
                duration_s: s.duration as f64 / 1e9,
            })
            .collect(),
        algorithms: reports,
        burst,
    }
}

/// `pushpace simulate`: runs, writes the SVG if asked, and returns the text to print.
pub fn run(args: &SimulateArgs) -> Result<String, SimulateError> {
    if args.ceiling {
        return run_ceiling(args);
    }
    if args.policy {
        return run_policy(args);
    }
    if let Some(campaigns) = args.campaigns {
        let sim = pacing::PacingSim {
            campaigns,
            total_rate: args.total_rate,
            seconds: args.seconds,
            job_size: args.job_size.max(1),
            max_lateness: (args.lateness_ms.max(0.0) * 1e6) as Nanos,
            wake_slack: std::time::Duration::from_millis(args.wake_slack_ms),
            second_edge: std::time::Duration::from_millis(args.second_edge_ms),
            seed: args.seed,
            ..pacing::PacingSim::default()
        };
        return Ok(pacing::table(&sim, &pacing::run(&sim)));
    }
    let rate = Rate::per_second(args.rate)?;
    if args.items > MAX_ITEMS {
        return Err(SimulateError::TooManyItems(args.items));
    }
    let report = simulate(
        &args.algorithm.algorithms(),
        rate,
        args.items,
        args.burst,
        &args.stalls,
    );
    if let Some(path) = &args.svg {
        let title = title(&report, &args.stalls);
        std::fs::write(path, render_svg(&report, &title)?)
            .map_err(|e| SimulateError::Svg(format!("{}: {e}", path.display())))?;
    }
    match args.format {
        Format::Json => {
            let mut out = serde_json::to_string(&report)?;
            out.push('\n');
            Ok(out)
        }
        Format::Table => Ok(table(&report, &args.stalls)),
    }
}

fn run_ceiling(args: &SimulateArgs) -> Result<String, SimulateError> {
    let runs = [
        ceiling::run(Some(crate::config::providers::default_adaptive())),
        ceiling::run(None),
    ];
    if let Some(path) = &args.svg {
        std::fs::write(path, ceiling::render_svg(&runs)?)
            .map_err(|e| SimulateError::Svg(format!("{}: {e}", path.display())))?;
    }
    match args.format {
        Format::Json => {
            let mut out = serde_json::to_string(&runs)?;
            out.push('\n');
            Ok(out)
        }
        Format::Table => Ok(ceiling::table(&runs)),
    }
}

fn run_policy(args: &SimulateArgs) -> Result<String, SimulateError> {
    let report = policy::run();
    if let Some(path) = &args.svg {
        std::fs::write(path, policy::render_svg(&report)?)
            .map_err(|e| SimulateError::Svg(format!("{}: {e}", path.display())))?;
    }
    match args.format {
        Format::Json => {
            let mut out = serde_json::to_string(&report)?;
            out.push('\n');
            Ok(out)
        }
        Format::Table => Ok(policy::table(&report)),
    }
}

fn title(report: &Report, stalls: &[Stall]) -> String {
    let mut t = format!(
        "{} items at send_rate {}/s, burst {}",
        report.items, report.rate, report.burst
    );
    if stalls.is_empty() {
        t.push_str(", no stall");
    } else {
        let list: Vec<String> = stalls.iter().map(Stall::to_string).collect();
        let _ = write!(t, ", stalls {}", list.join(" "));
    }
    t
}

/// The summary table, then each algorithm's buckets, one row per second.
pub fn table(report: &Report, stalls: &[Stall]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "{}", title(report, stalls));
    let _ = writeln!(
        out,
        "{:<15} {:>13} {:>10} {:>10} {:>9} {:>13}",
        "algorithm", "max_1s_window", "max_100ms", "min_100ms", "finish_s", "stddev_100ms"
    );
    for a in &report.algorithms {
        let _ = writeln!(
            out,
            "{:<15} {:>13} {:>10} {:>10} {:>9.3} {:>13.2}",
            a.name, a.max_1s_window, a.max_100ms, a.min_100ms, a.finish_s, a.stddev_100ms
        );
    }
    for a in &report.algorithms {
        let _ = writeln!(out, "\n{}: sends per 100 ms (one row per second)", a.name);
        for (second, row) in a.buckets_100ms.chunks(10).enumerate() {
            let cells: Vec<String> = row.iter().map(|c| format!("{c:>5}")).collect();
            let _ = writeln!(out, "{:>4}s {}", second, cells.join(""));
        }
    }
    out
}

/// Distinct, dark enough to read on white.
const COLOURS: [plotters::style::RGBColor; 7] = [
    plotters::style::RGBColor(31, 119, 180),
    plotters::style::RGBColor(214, 39, 40),
    plotters::style::RGBColor(44, 160, 44),
    plotters::style::RGBColor(148, 103, 189),
    plotters::style::RGBColor(255, 127, 14),
    plotters::style::RGBColor(140, 86, 75),
    plotters::style::RGBColor(23, 190, 207),
];

/// One panel per algorithm: its sends per 100 ms over time as a step line, with the
/// send_rate per 100 ms as a dashed horizontal line.
pub fn render_svg(report: &Report, title: &str) -> Result<String, SimulateError> {
    use plotters::prelude::*;

    let svg_err = |e: &dyn std::fmt::Display| SimulateError::Svg(e.to_string());
    let panels = report.algorithms.len().max(1);
    let panel_h = 150u32;
    let (width, height) = (900u32, 50 + panel_h * panels as u32);
    let per_bucket = report.rate / 10.0;
    let x_max = report
        .algorithms
        .iter()
        .map(|a| a.buckets_100ms.len())
        .max()
        .unwrap_or(1)
        .max(1) as f64
        / 10.0;
    let y_max = report
        .algorithms
        .iter()
        .map(|a| a.max_100ms as f64)
        .fold(per_bucket, f64::max)
        * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| svg_err(&e))?;
        let caption = format!("{title}: sends per 100 ms over time (dashed: send_rate)");
        let root = root
            .titled(&caption, ("sans-serif", 16))
            .map_err(|e| svg_err(&e))?;
        let areas = root.split_evenly((panels, 1));
        for (i, (area, a)) in areas.iter().zip(&report.algorithms).enumerate() {
            let colour = COLOURS[i % COLOURS.len()];
            let mut chart = ChartBuilder::on(area)
                .caption(&a.name, ("sans-serif", 14))
                .margin(6)
                .margin_right(24)
                .x_label_area_size(20)
                .y_label_area_size(44)
                .build_cartesian_2d(0f64..x_max, 0f64..y_max)
                .map_err(|e| svg_err(&e))?;
            chart
                .configure_mesh()
                .x_labels((x_max.ceil() as usize + 1).min(30))
                .x_label_formatter(&|v| format!("{v:.0} s"))
                .y_labels(4)
                .y_label_formatter(&|v| format!("{v:.0}"))
                .max_light_lines(0)
                .draw()
                .map_err(|e| svg_err(&e))?;
            let steps = a.buckets_100ms.iter().enumerate().flat_map(|(b, &c)| {
                let x = b as f64 / 10.0;
                [(x, c as f64), (x + 0.1, c as f64)]
            });
            chart
                .draw_series(LineSeries::new(steps, colour.stroke_width(2)))
                .map_err(|e| svg_err(&e))?;
            chart
                .draw_series(DashedLineSeries::new(
                    [(0.0, per_bucket), (x_max, per_bucket)],
                    6,
                    4,
                    BLACK.stroke_width(1),
                ))
                .map_err(|e| svg_err(&e))?;
        }
        root.present().map_err(|e| svg_err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_stalls_and_choices() {
        assert_eq!(
            "4s:1s".parse::<Stall>().unwrap(),
            Stall {
                at: 4 * NANOS_PER_SEC,
                duration: NANOS_PER_SEC
            }
        );
        assert_eq!(
            "6500ms:250ms".parse::<Stall>().unwrap(),
            Stall {
                at: 6_500_000_000,
                duration: 250_000_000
            }
        );
        assert!("4s".parse::<Stall>().is_err());
        assert!("4x:1s".parse::<Stall>().is_err());
        assert_eq!(
            "all".parse::<AlgorithmChoice>().unwrap(),
            AlgorithmChoice::All
        );
        assert_eq!(
            "gcra".parse::<AlgorithmChoice>().unwrap(),
            AlgorithmChoice::One(Algorithm::Gcra)
        );
        assert!("magic".parse::<AlgorithmChoice>().is_err());
    }
}
