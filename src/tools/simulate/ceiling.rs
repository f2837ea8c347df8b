//! `pushpace simulate --ceiling`: the adaptive ceiling's law against a hidden quota, on
//! a virtual clock: the convergence test's scenario (5 campaigns asking 5,000/s, a
//! 2,000/s token bucket with a burst of 100 that answers 429 past it, lifted to 10,000/s
//! at 40 s) with the real [`Ceiling`] and the scheduler's max-min share, once with the
//! ceiling and once without. Every refused send is retried and takes a permit, as in
//! the worker. Deterministic and instant.

use super::SimulateError;
use crate::limiter::{Nanos, NANOS_PER_SEC};
use crate::provider::ceiling::{Ceiling, CeilingParams, Signal};
use std::fmt::Write as _;

/// The convergence test's campaigns (sends/s).
pub const RATES: [f64; 5] = [200.0, 700.0, 1_000.0, 1_300.0, 1_800.0];
/// The hidden quota, then the lifted one, and when it lifts.
pub const QUOTA: f64 = 2_000.0;
pub const LIFTED: f64 = 10_000.0;
pub const LIFT_AT_S: u64 = 40;
pub const RUN_S: u64 = 70;
/// The quota bucket's burst, as in the test's sink.
const BURST: f64 = 100.0;
/// The simulation's step.
const STEP: Nanos = NANOS_PER_SEC / 1000;

/// One simulated second.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct Second {
    pub ceiling: Option<f64>,
    pub sent: f64,
    pub accepted: f64,
    pub refused: f64,
    pub quota: f64,
}

/// The figures of one run.
#[derive(Debug, Clone, serde::Serialize)]
pub struct CeilingRun {
    pub adaptive: bool,
    pub seconds: Vec<Second>,
    /// First second from which accepted stays within 90–100% of the quota until the lift.
    pub converged_s: Option<u64>,
    /// Refused / sent in seconds 10 to 40.
    pub steady_refused: f64,
    /// Accepted per second in seconds 10 to 40, over the quota.
    pub goodput: f64,
    /// Seconds after the lift until the ceiling stopped binding.
    pub recovered_s: Option<u64>,
    /// 429s per delivered notification before the lift.
    pub refused_per_delivered: f64,
}

/// Runs the scenario with the law `params`, or with no ceiling.
pub fn run(params: Option<CeilingParams>) -> CeilingRun {
    let mut ceiling = params.map(Ceiling::new);
    let demand: f64 = RATES.iter().sum();
    let mut tokens = BURST;
    let mut owed = [0.0f64; RATES.len()];
    let mut seconds = Vec::new();
    let mut cur = Second::default();
    let mut shares = RATES;
    for step in 0..(RUN_S * NANOS_PER_SEC / STEP) {
        let now = step * STEP;
        let quota = if now < LIFT_AT_S * NANOS_PER_SEC {
            QUOTA
        } else {
            LIFTED
        };
        if now % NANOS_PER_SEC == 0 && now > 0 {
            if let Some(c) = ceiling.as_mut() {
                c.tick(now, demand, cur.sent);
                shares = share(c.limit());
            }
            cur.ceiling = ceiling.as_ref().and_then(Ceiling::limit);
            seconds.push(cur);
            cur = Second::default();
        }
        cur.quota = quota;
        tokens = (tokens + quota * STEP as f64 / NANOS_PER_SEC as f64).min(BURST);
        for (owed, rate) in owed.iter_mut().zip(&shares) {
            *owed += rate * STEP as f64 / NANOS_PER_SEC as f64;
            while *owed >= 1.0 {
                *owed -= 1.0;
                cur.sent += 1.0;
                let ok = tokens >= 1.0;
                if ok {
                    tokens -= 1.0;
                    cur.accepted += 1.0;
                } else {
                    cur.refused += 1.0;
                }
                if let Some(c) = ceiling.as_mut() {
                    c.answer((!ok).then_some(Signal::Throttled), 2_000_000, now);
                }
            }
        }
    }
    summarise(params.is_some(), seconds)
}

/// Max-min shares of [`RATES`] under `cap`.
fn share(cap: Option<f64>) -> [f64; RATES.len()] {
    let Some(cap) = cap else { return RATES };
    let mut order: Vec<usize> = (0..RATES.len()).collect();
    order.sort_by(|&a, &b| RATES[a].total_cmp(&RATES[b]));
    let mut out = [0.0; RATES.len()];
    let mut left = cap;
    for (k, &i) in order.iter().enumerate() {
        let fair = left / (RATES.len() - k) as f64;
        out[i] = RATES[i].min(fair);
        left -= out[i];
    }
    out
}

fn summarise(adaptive: bool, seconds: Vec<Second>) -> CeilingRun {
    let lift = LIFT_AT_S as usize;
    let in_band = |s: &Second| s.accepted >= 0.9 * QUOTA && s.accepted <= QUOTA + BURST;
    let converged_s = (0..lift)
        .find(|&t| seconds[t..lift].iter().all(in_band))
        .map(|t| t as u64);
    let steady = &seconds[10..lift];
    let sum = |f: fn(&Second) -> f64, s: &[Second]| s.iter().map(f).sum::<f64>();
    let steady_refused = sum(|s| s.refused, steady) / sum(|s| s.sent, steady).max(1.0);
    let goodput = sum(|s| s.accepted, steady) / steady.len() as f64 / QUOTA;
    let recovered_s = seconds[lift..]
        .iter()
        .position(|s| s.ceiling.is_none())
        .map(|t| t as u64);
    let before = &seconds[..lift];
    let refused_per_delivered = sum(|s| s.refused, before) / sum(|s| s.accepted, before).max(1.0);
    CeilingRun {
        adaptive,
        seconds,
        converged_s,
        steady_refused,
        goodput,
        recovered_s,
        refused_per_delivered,
    }
}

/// The two runs as a table.
pub fn table(runs: &[CeilingRun]) -> String {
    let mut out = format!(
        "5 campaigns asking {}/s against a hidden {QUOTA}/s quota (burst {BURST}), lifted to {LIFTED}/s at {LIFT_AT_S} s\n",
        RATES.iter().sum::<f64>()
    );
    let _ = writeln!(
        out,
        "{:<10} {:>14} {:>16} {:>12} {:>14} {:>16}",
        "ceiling", "converged at", "refused, steady", "goodput/Q", "recovered in", "429s/delivered"
    );
    let opt = |v: Option<u64>| v.map_or("never".to_string(), |s| format!("{s} s"));
    for r in runs {
        let _ = writeln!(
            out,
            "{:<10} {:>14} {:>15.2}% {:>12.3} {:>14} {:>16.3}",
            if r.adaptive { "adaptive" } else { "off" },
            opt(r.converged_s),
            r.steady_refused * 100.0,
            r.goodput,
            if r.adaptive {
                opt(r.recovered_s)
            } else {
                "-".into()
            },
            r.refused_per_delivered
        );
    }
    out
}

/// A named, coloured line of a chart.
type Line = (&'static str, plotters::style::RGBColor, Vec<(f64, f64)>);

/// One panel per run: the ceiling, sent/s, accepted/s and the quota over time.
pub fn render_svg(runs: &[CeilingRun]) -> Result<String, SimulateError> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| SimulateError::Svg(e.to_string());
    let (width, height) = (900u32, 60 + 260 * runs.len() as u32);
    let y_max = RATES.iter().sum::<f64>() * 1.1;
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (width, height)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(
                "adaptive ceiling against a hidden quota (per second)",
                ("sans-serif", 16),
            )
            .map_err(|e| err(&e))?;
        for (area, r) in root.split_evenly((runs.len(), 1)).iter().zip(runs) {
            let caption = format!(
                "ceiling {}: {:.3} 429s per delivered before the lift",
                if r.adaptive { "on" } else { "off" },
                r.refused_per_delivered
            );
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 14))
                .margin(8)
                .x_label_area_size(24)
                .y_label_area_size(50)
                .build_cartesian_2d(0f64..RUN_S as f64, 0f64..y_max)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_label_formatter(&|v| format!("{v:.0} s"))
                .max_light_lines(0)
                .draw()
                .map_err(|e| err(&e))?;
            let demand = RATES.iter().sum::<f64>();
            let line = |f: &dyn Fn(&Second) -> f64| -> Vec<(f64, f64)> {
                r.seconds
                    .iter()
                    .enumerate()
                    .map(|(t, s)| (t as f64 + 1.0, f(s)))
                    .collect()
            };
            let series: [Line; 4] = [
                (
                    "ceiling",
                    RGBColor(148, 103, 189),
                    line(&|s| s.ceiling.unwrap_or(demand)),
                ),
                ("sent/s", RGBColor(31, 119, 180), line(&|s| s.sent)),
                ("accepted/s", RGBColor(44, 160, 44), line(&|s| s.accepted)),
                (
                    "quota",
                    RGBColor(214, 39, 40),
                    line(&|s| s.quota.min(y_max)),
                ),
            ];
            for (name, colour, points) in series {
                chart
                    .draw_series(LineSeries::new(points, colour.stroke_width(2)))
                    .map_err(|e| err(&e))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
            }
            chart
                .configure_series_labels()
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ceiling_converges_recovers_and_saves_most_429s() {
        let on = run(Some(CeilingParams::default()));
        let off = run(None);
        assert!(
            on.converged_s.is_some_and(|s| s <= 10),
            "{:?}",
            on.converged_s
        );
        assert!(on.steady_refused <= 0.02, "{}", on.steady_refused);
        assert!(on.goodput >= 0.9, "{}", on.goodput);
        assert!(
            on.recovered_s.is_some_and(|s| s <= 30),
            "{:?}",
            on.recovered_s
        );
        assert!(
            off.refused_per_delivered > 1.0,
            "{}",
            off.refused_per_delivered
        );
        assert!(on.refused_per_delivered < off.refused_per_delivered / 20.0);
        assert!(render_svg(&[on, off]).unwrap().contains("<svg"));
    }
}
