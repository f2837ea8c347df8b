//! `stats ID` (a per-second table, a sparkline, or an SVG chart of a campaign's series)
//! and `stats prune`, which runs retention against the database directly.

use super::client::{decode, Client};
use super::render::{number, table};
use super::{CampaignOut, CliError, OutputFormat, PointOut, StatsArgs, StatsCommand};
use crate::config::Settings;
use std::fmt::Write as _;

/// Runs `stats ID` or `stats prune` and returns what to print.
pub async fn run_stats(args: &StatsArgs, settings: &Settings) -> Result<String, CliError> {
    if let Some(StatsCommand::Prune {
        older_than,
        dead_letters_older_than,
        batch,
    }) = &args.command
    {
        let dead_letters = dead_letters_older_than.as_deref().unwrap_or(older_than);
        return prune(settings, older_than, dead_letters, *batch).await;
    }
    let id = args
        .id
        .as_deref()
        .ok_or_else(|| CliError::Invalid("stats needs a campaign ID (or `stats prune`)".into()))?;
    let span = crate::api::parse_duration(&args.last)
        .map_err(|e| CliError::Invalid(format!("--last: {e}")))?;
    let client = Client::new(&args.api, settings)?;
    let url = client.campaign_url(id);
    let bytes = client
        .call(reqwest::Method::GET, url.clone(), None, false)
        .await?;
    let campaign: CampaignOut = decode(&url, &bytes)?;
    // Per second, as the table's heading says, also for spans the API would sum.
    let series_url = format!("{url}/series?last={}s&step=1", span.num_seconds());
    let bytes = client
        .call(reqwest::Method::GET, series_url.clone(), None, false)
        .await?;
    let points: Vec<PointOut> = decode(&series_url, &bytes)?;
    if let Some(path) = &args.svg {
        let svg = stats_svg(&campaign, &points)?;
        std::fs::write(path, svg).map_err(|source| CliError::Write {
            path: path.clone(),
            source,
        })?;
    }
    if args.api.format == OutputFormat::Json {
        let out = serde_json::json!({
            "campaign": campaign.id,
            "send_rate": campaign.send_rate,
            "points": points,
        });
        return Ok(format!("{out:#}\n"));
    }
    Ok(stats_text(&campaign, &points))
}

async fn prune(
    settings: &Settings,
    older_than: &str,
    dead_letters_older_than: &str,
    batch: i64,
) -> Result<String, CliError> {
    let span = crate::api::parse_duration(older_than)
        .map_err(|e| CliError::Invalid(format!("--older-than: {e}")))?;
    let dead_letters_span = crate::api::parse_duration(dead_letters_older_than)
        .map_err(|e| CliError::Invalid(format!("--dead-letters-older-than: {e}")))?;
    let options = settings.database.connect_options()?;
    let pool = crate::store::connect_with(options, 1, settings.database.connect_timeout()).await?;
    // Pruning first: seconds about to be deleted are not rolled up for nothing.
    let rollup_after = settings.database.rollup_after();
    let report = async {
        let pruned =
            crate::store::prune_with_dead_letters(&pool, span, dead_letters_span, batch).await?;
        let rolled = crate::store::rollup::roll_up(&pool, rollup_after, batch).await?;
        Ok::<_, crate::store::StoreError>((pruned, rolled))
    }
    .await;
    pool.close().await;
    let (report, rolled) = report?;
    Ok(format!(
        "pruned older than {older_than}: {} per-second rows, {} finished job progress rows, {} flush markers, \
         {} per-minute rows; dead letters older than {dead_letters_older_than}: {} \
         ({} replay templates left without a letter); expired invalid-token marks: {}\n\
         rolled up older than {} h: {} per-second rows into {} per-minute rows\n",
        report.seconds_deleted,
        report.progress_deleted,
        report.markers_deleted,
        report.minutes_deleted,
        report.dead_letters,
        report.letter_jobs_deleted,
        report.invalid_tokens_expired,
        rollup_after.num_hours(),
        rolled.seconds_rolled,
        rolled.minutes_written
    ))
}

fn stats_text(c: &CampaignOut, points: &[PointOut]) -> String {
    let rows: Vec<Vec<String>> = points
        .iter()
        .map(|p| {
            vec![
                p.t.format("%Y-%m-%d %H:%M:%S").to_string(),
                p.sent.to_string(),
                p.failed.to_string(),
                p.retried.to_string(),
            ]
        })
        .collect();
    let mut out = table(
        &["SECOND (UTC)", "SENT", "FAILED", "RETRIED"],
        &[false, true, true, true],
        &rows,
    );
    let sent: Vec<i64> = points.iter().map(|p| p.sent).collect();
    let total: i64 = sent.iter().sum();
    let max = sent.iter().copied().max().unwrap_or(0);
    let mean = if sent.is_empty() {
        0.0
    } else {
        total as f64 / sent.len() as f64
    };
    let _ = writeln!(
        out,
        "\n{}  sent/s over {} s: max {max}, mean {mean:.1}, total {total}; send_rate {}/s",
        c.id,
        points.len(),
        number(c.send_rate)
    );
    let _ = writeln!(out, "{}", sparkline(&sent, 120));
    out
}

/// A Unicode sparkline at most `width` characters wide (seconds averaged per character
/// when there are more); a blank is a stretch with no sends.
pub fn sparkline(values: &[i64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    if values.is_empty() || width == 0 {
        return String::new();
    }
    let per = values.len().div_ceil(width);
    let buckets: Vec<f64> = values
        .chunks(per)
        .map(|c| c.iter().sum::<i64>() as f64 / c.len() as f64)
        .collect();
    let max = buckets.iter().copied().fold(0.0, f64::max);
    buckets
        .iter()
        .map(|&v| {
            if v <= 0.0 {
                ' '
            } else {
                let level = ((v / max) * (BARS.len() - 1) as f64).round() as usize;
                BARS[level.min(BARS.len() - 1)]
            }
        })
        .collect()
}

/// The series as an SVG line chart, with send_rate as a dashed line.
pub fn stats_svg(c: &CampaignOut, points: &[PointOut]) -> Result<String, CliError> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| CliError::Chart(e.to_string());
    let n = points.len().max(1) as f64;
    let max = points.iter().map(|p| p.sent).max().unwrap_or(0) as f64;
    let y_max = max.max(c.send_rate * 1.15).max(1.0);
    let start = points
        .first()
        .map(|p| p.t.format("%H:%M:%S UTC").to_string());
    let mut svg = String::new();
    {
        let root = SVGBackend::with_string(&mut svg, (900, 360)).into_drawing_area();
        root.fill(&WHITE).map_err(|e| err(&e))?;
        let mut chart = ChartBuilder::on(&root)
            .caption(
                format!(
                    "{}: sends per second, send_rate {}/s",
                    c.id,
                    number(c.send_rate)
                ),
                ("sans-serif", 18),
            )
            .margin(10)
            .x_label_area_size(32)
            .y_label_area_size(56)
            .build_cartesian_2d(0f64..n, 0f64..y_max)
            .map_err(|e| err(&e))?;
        chart
            .configure_mesh()
            .x_desc(match &start {
                Some(s) => format!("seconds from {s}"),
                None => "seconds".into(),
            })
            .y_desc("per second")
            .max_light_lines(0)
            .draw()
            .map_err(|e| err(&e))?;
        let sent = points
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64 + 0.5, p.sent as f64));
        chart
            .draw_series(LineSeries::new(
                sent,
                RGBColor(31, 119, 180).stroke_width(2),
            ))
            .map_err(|e| err(&e))?
            .label("sent/s");
        let failed = points
            .iter()
            .enumerate()
            .map(|(i, p)| (i as f64 + 0.5, p.failed as f64));
        chart
            .draw_series(LineSeries::new(
                failed,
                RGBColor(214, 39, 40).stroke_width(1),
            ))
            .map_err(|e| err(&e))?
            .label("failed/s");
        chart
            .draw_series(DashedLineSeries::new(
                [(0.0, c.send_rate), (n, c.send_rate)],
                6,
                4,
                RGBColor(255, 127, 14).stroke_width(2),
            ))
            .map_err(|e| err(&e))?;
        root.present().map_err(|e| err(&e))?;
    }
    Ok(svg)
}

#[cfg(test)]
mod tests {
    use super::sparkline;

    #[test]
    fn sparkline_scales_and_buckets() {
        assert_eq!(sparkline(&[0, 1, 2, 4, 8], 10), " ▂▃▅█");
        assert_eq!(sparkline(&[], 10), "");
        let long: Vec<i64> = (0..300).map(|i| i % 10).collect();
        assert!(sparkline(&long, 120).chars().count() <= 120);
    }
}
