//! The tables and the SVG chart of `pushpace simulate --policy` ([`super::policy`]'s report).

use super::policy::{
    FinishByRun, PolicyReport, FB_DEADLINE_S, FB_DEVICES, FB_JOBS, HALVE_AT_S, JOB_SIZE,
    MIN_JUDGED_TARGET, PROJECT_AT_S, RAMP_JOBS, RAMP_RUN_S,
};
use super::SimulateError;
use crate::job::policy::RAMP_MAX_STEP;
use crate::limiter::rate::MAX_RATE_PER_SECOND;
use crate::worker::planner::PLAN_EVERY;
use std::fmt::Write as _;

fn opt_s(v: Option<f64>) -> String {
    v.map_or("-".to_string(), |s| format!("{s:.2} s"))
}

/// The summary lines, then every fifth second of each scenario.
pub fn table(r: &PolicyReport) -> String {
    let mut out = String::new();
    let ramp = &r.ramp;
    let _ = writeln!(
        out,
        "ramp-up: 1 campaign at {}/s, ramp_up_s {}, ramp_from {}: curve × {:.4}/s for {:.1} s; {} s of devices, {} s run",
        ramp.rate, ramp.ramp_up_s, ramp.ramp_from, ramp.curve.k, ramp.curve.seconds, RAMP_JOBS * JOB_SIZE / ramp.rate as usize, RAMP_RUN_S
    );
    let _ = writeln!(
        out,
        "  worst |sends − curve| / curve, seconds ≥ {MIN_JUDGED_TARGET}/s: {:.2}% (second {})",
        ramp.worst_error * 100.0,
        ramp.worst_error_at
    );
    let _ = writeln!(
        out,
        "  largest step, second to second: {:.3}× (second {}); the curve's own: {:.4}×",
        ramp.max_step, ramp.max_step_at, ramp.curve.k
    );
    let _ = writeln!(
        out,
        "  largest 100 ms bucket in the ramp: {} (rate / 10 × {RAMP_MAX_STEP} = {:.0}); most over {RAMP_MAX_STEP} × its own share of the curve: {:+.2} sends",
        ramp.max_bucket_in_ramp, ramp.bucket_bound, ramp.max_bucket_excess
    );
    let last = ramp.seconds.last().map_or(0, |s| s.sends);
    let _ = writeln!(
        out,
        "  after the ramp: effective rate {:.1}/s, {last} sends in the last second",
        ramp.effective_rate_after
    );
    let _ = writeln!(
        out,
        "{:>6} {:>7} {:>9} {:>7}",
        "second", "sends", "curve", "step"
    );
    for s in ramp.seconds.iter().step_by(5) {
        let _ = writeln!(
            out,
            "{:>6} {:>7} {:>9.1} {:>7}",
            s.second,
            s.sends,
            s.target,
            s.step.map_or("-".into(), |x| format!("{x:.3}"))
        );
    }
    let [plain, halved] = &r.finish_by;
    let _ = writeln!(
        out,
        "\nfinish-by: {} devices ({FB_JOBS} jobs × {JOB_SIZE}), finish_by = start + {} s, send_rate {}/s (none given); planned every {} s from the devices not sent",
        plain.devices, plain.deadline_s, MAX_RATE_PER_SECOND, PLAN_EVERY.as_secs()
    );
    for run in [plain, halved] {
        let name = match run.halved_to {
            Some(h) => format!("send_rate halved at {HALVE_AT_S} s to {h:.1}/s"),
            None => "no halving".to_string(),
        };
        let _ = writeln!(
            out,
            "  {name}: finished at {} (deadline {} s); behind: {}; projected finish at {PROJECT_AT_S} s: {}",
            opt_s(run.finished_s),
            run.deadline_s,
            run.behind_from_s
                .map_or("never".into(), |s| format!("from {s} s")),
            opt_s(run.projected_at),
        );
    }
    let _ = writeln!(
        out,
        "{:>6} | {:>7} {:>9} {:>10} | {:>7} {:>9} {:>10} {:>10} {:>6}",
        "second", "sends", "plan", "projected", "sends", "plan", "send_rate", "projected", "behind"
    );
    let plan = |p: Option<f64>| p.map_or("-".to_string(), |p| format!("{p:.1}"));
    let proj = |p: Option<f64>| p.map_or("-".to_string(), |p| format!("{p:.2}"));
    let rows = plain.seconds.len().max(halved.seconds.len());
    for k in (0..rows).step_by(5) {
        let a = plain.seconds.get(k);
        let b = halved.seconds.get(k);
        let _ = writeln!(
            out,
            "{:>6} | {:>7} {:>9} {:>10} | {:>7} {:>9} {:>10} {:>10} {:>6}",
            k,
            a.map_or("-".into(), |s| s.sends.to_string()),
            plan(a.and_then(|s| s.plan)),
            proj(a.and_then(|s| s.projected_finish_s)),
            b.map_or("-".into(), |s| s.sends.to_string()),
            plan(b.and_then(|s| s.plan)),
            b.map_or("-".into(), |s| if s.send_rate >= MAX_RATE_PER_SECOND {
                "max".into()
            } else {
                format!("{:.1}", s.send_rate)
            }),
            proj(b.and_then(|s| s.projected_finish_s)),
            b.map_or("-", |s| if s.behind { "yes" } else { "no" }),
        );
    }
    out
}

/// A named, coloured, solid or dashed line of a chart.
type Line = (String, plotters::style::RGBColor, bool, Vec<(f64, f64)>);

/// Two panels: the ramp's sends/s and its curve; both finish-by runs' sends/s and plans,
/// with the deadline.
pub fn render_svg(r: &PolicyReport) -> Result<String, SimulateError> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| SimulateError::Svg(e.to_string());
    let blue = RGBColor(31, 119, 180);
    let orange = RGBColor(255, 127, 14);
    let red = RGBColor(214, 39, 40);
    let green = RGBColor(44, 160, 44);
    let purple = RGBColor(148, 103, 189);
    let steps = |v: &mut dyn Iterator<Item = (u64, f64)>, cap: f64| -> Vec<(f64, f64)> {
        v.flat_map(|(k, y)| [(k as f64, y.min(cap)), (k as f64 + 1.0, y.min(cap))])
            .collect()
    };
    let ramp = &r.ramp;
    let ramp_y = ramp.rate * 1.15;
    let ramp_lines: Vec<Line> = vec![
        (
            "sends/s".into(),
            blue,
            false,
            steps(
                &mut ramp.seconds.iter().map(|s| (s.second, s.sends as f64)),
                ramp_y,
            ),
        ),
        (
            "curve: rate × from × k^t".into(),
            red,
            true,
            (0..=RAMP_RUN_S * 10)
                .map(|i| {
                    let t = i as f64 / 10.0;
                    (t, ramp.rate * ramp.curve.fraction(t))
                })
                .collect(),
        ),
    ];
    let [plain, halved] = &r.finish_by;
    let first_plan = plain.seconds.first().and_then(|s| s.plan).unwrap_or(1.0);
    let fb_y = first_plan * 2.5;
    let fb_x = plain
        .seconds
        .len()
        .max(halved.seconds.len())
        .max(FB_DEADLINE_S as usize) as f64
        + 5.0;
    let plan_line = |run: &FinishByRun| -> Vec<(f64, f64)> {
        let mut v = run
            .seconds
            .iter()
            .filter_map(|s| s.plan.map(|p| (s.second, p)));
        steps(&mut v, fb_y)
    };
    let sends_line = |run: &FinishByRun| -> Vec<(f64, f64)> {
        steps(
            &mut run.seconds.iter().map(|s| (s.second, s.sends as f64)),
            fb_y,
        )
    };
    let fb_lines: Vec<Line> = vec![
        (
            format!("sends/s, send_rate halved at {HALVE_AT_S} s"),
            orange,
            false,
            sends_line(halved),
        ),
        ("sends/s, no halving".into(), blue, false, sends_line(plain)),
        (
            "plan, halved (dashed)".into(),
            purple,
            true,
            plan_line(halved),
        ),
        (
            "plan, no halving (dashed)".into(),
            green,
            true,
            plan_line(plain),
        ),
        (
            format!("deadline ({FB_DEADLINE_S} s)"),
            BLACK,
            true,
            vec![(FB_DEADLINE_S as f64, 0.0), (FB_DEADLINE_S as f64, fb_y)],
        ),
    ];
    // (caption, x range, y range, lines, where the legend goes)
    let panels = [
        (
            format!(
                "ramp-up: {}/s, ramp_up_s {}, ramp_from {} (worst second {:.2}% off, largest step {:.3}×)",
                ramp.rate,
                ramp.ramp_up_s,
                ramp.ramp_from,
                ramp.worst_error * 100.0,
                ramp.max_step
            ),
            RAMP_RUN_S as f64,
            ramp_y,
            ramp_lines,
            SeriesLabelPosition::LowerRight,
        ),
        (
            format!(
                "finish-by: {} devices due at {} s (plan clipped at {:.0}/s)",
                FB_DEVICES, FB_DEADLINE_S, fb_y
            ),
            fb_x,
            fb_y,
            fb_lines,
            SeriesLabelPosition::UpperRight,
        ),
    ];
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 660)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let root = root
            .titled(
                "delivery policy on the scheduler (per second)",
                ("sans-serif", 16),
            )
            .map_err(|e| err(&e))?;
        for (area, (caption, x_max, y_max, lines, legend)) in
            root.split_evenly((2, 1)).iter().zip(panels)
        {
            let mut chart = ChartBuilder::on(area)
                .caption(caption, ("sans-serif", 14))
                .margin(8)
                .margin_right(24)
                .x_label_area_size(24)
                .y_label_area_size(50)
                .build_cartesian_2d(0f64..x_max, 0f64..y_max)
                .map_err(|e| err(&e))?;
            chart
                .configure_mesh()
                .x_label_formatter(&|v| format!("{v:.0} s"))
                .y_label_formatter(&|v| format!("{v:.0}"))
                .max_light_lines(0)
                .draw()
                .map_err(|e| err(&e))?;
            for (name, colour, dashed, points) in lines {
                let style = colour.stroke_width(2);
                let anno = if dashed {
                    chart.draw_series(DashedLineSeries::new(points, 6, 4, style))
                } else {
                    chart.draw_series(LineSeries::new(points, style))
                };
                anno.map_err(|e| err(&e))?
                    .label(name)
                    .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], colour));
            }
            chart
                .configure_series_labels()
                .position(legend)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()
                .map_err(|e| err(&e))?;
        }
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}
