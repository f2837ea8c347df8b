//! The `apps` lines of the bench's table: each figure beside its target, and each
//! kind's CPU per send beside the static phase of that kind in the same round.

use super::KINDS;

/// The `apps` lines of the table, each figure beside its target or baseline.
pub(in crate::tools::bench) fn render(report: &super::super::BenchReport) -> String {
    let mut out = String::new();
    for (i, a) in report.apps.iter().enumerate() {
        let round = i as u32 + 1;
        let mut put = a.put_to_first_send_ms.clone();
        put.sort_by(f64::total_cmp);
        let at = |q: f64| put.get(((put.len().max(1) - 1) as f64 * q).round() as usize);
        out.push_str(&format!(
            "apps: {} registered ({:.1} s to put), {} sending; RSS {:.1} MB with none, {:.1} MB with them idle: {:.0} B per idle app (target ≤ 2048)\n",
            a.registered, a.register_seconds, a.sending, a.rss_no_apps_mb, a.rss_registered_idle_mb, a.bytes_per_idle_app
        ));
        out.push_str(&format!(
            "apps: {} pools open ({} app connections), RSS {:.1} MB ({:.1} MB with half): {:.0} B per pool of the second half with its slot and campaign (target ≤ 65536); {:.0} B per pool over all, from idle\n",
            a.pools, a.app_connections_open, a.rss_pools_open_mb, a.rss_half_pools_mb,
            a.bytes_per_pool_marginal, a.bytes_per_pool
        ));
        if let (Some(p50), Some(max)) = (at(0.5), put.last()) {
            out.push_str(&format!(
                "apps: PUT to first send, {} late apps: p50 {p50:.0} ms, max {max:.0} ms (target ≤ 1000)\n",
                put.len()
            ));
        }
        out.push_str(&format!(
            "apps: {} paced campaigns (≥ 100/s), worst second {:.2}% off its rate over {} campaign-seconds, {} off by more than 1%; {} capped apps, worst second {:.2}% off the cap over {} app-seconds (target ≤ 1%)\n",
            a.paced_campaigns, a.campaign_worst * 100.0, a.campaign_seconds, a.campaign_over_1pct,
            a.capped_apps, a.cap_worst * 100.0, a.cap_seconds
        ));
        out.push_str(&cpu_lines(report, round));
    }
    out
}

/// Each `apps-<kind>` row's CPU per send over the static `<kind>` phase of its round.
fn cpu_lines(report: &super::super::BenchReport, round: u32) -> String {
    let cpu = |name: &str| {
        report
            .phases
            .iter()
            .find(|r| r.phase == name && r.round == round)
            .and_then(|r| r.cpu_s_per_million)
    };
    let mut out = String::new();
    for kind in KINDS {
        let Some(apps) = cpu(&format!("apps-{kind}")) else {
            continue;
        };
        let line = match cpu(kind) {
            Some(b) => format!(
                "apps-{kind}: worker CPU {apps:.2} µs per send vs {b:.2} through the static {kind} provider: {:.2}× (target ≤ 1.2×)\n",
                apps / b
            ),
            None => format!(
                "apps-{kind}: worker CPU {apps:.2} µs per send (no static {kind} phase in this round to compare with)\n"
            ),
        };
        out.push_str(&line);
    }
    out
}
