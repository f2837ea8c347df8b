//! Plain-text output of the `campaign` commands: aligned tables, a campaign's details,
//! and numbers without needless decimals.

use super::CampaignOut;
use chrono::{DateTime, Utc};
use std::fmt::Write as _;

/// A campaign's limiter scope as printed: its own, or the configured default.
pub(super) fn scope_text(scope: Option<&str>) -> String {
    scope.map_or_else(|| "default (limiter.scope)".into(), str::to_string)
}

/// A number without needless decimals: 250, 0.5, 1234.567.
pub(super) fn number(v: f64) -> String {
    let s = format!("{v:.3}");
    s.trim_end_matches('0').trim_end_matches('.').to_string()
}

/// Left-aligned text columns, right-aligned numeric ones, two spaces apart.
pub(super) fn table(header: &[&str], numeric: &[bool], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for row in rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    let mut line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, cell) in cells.iter().enumerate() {
            let pad = widths[i].saturating_sub(cell.chars().count());
            if i > 0 {
                l.push_str("  ");
            }
            if numeric[i] {
                l.extend(std::iter::repeat_n(' ', pad));
                l.push_str(cell);
            } else {
                l.push_str(cell);
                l.extend(std::iter::repeat_n(' ', pad));
            }
        }
        out.push_str(l.trim_end());
        out.push('\n');
    };
    line(header.to_vec());
    for row in rows {
        line(row.iter().map(String::as_str).collect());
    }
    out
}

pub(super) fn campaign_table(list: &[CampaignOut]) -> String {
    if list.is_empty() {
        return "no campaigns\n".into();
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|c| {
            vec![
                c.id.clone(),
                c.status.clone(),
                c.algorithm.clone(),
                number(c.send_rate),
                format!("{:.1}", c.rate_10s),
                c.sent.to_string(),
                c.failed.to_string(),
                if c.active { "yes" } else { "no" }.into(),
            ]
        })
        .collect();
    table(
        &[
            "ID",
            "STATUS",
            "ALGORITHM",
            "SEND_RATE",
            "RATE_10S",
            "SENT",
            "FAILED",
            "ACTIVE",
        ],
        &[false, false, false, true, true, true, true, false],
        &rows,
    )
}

pub(super) fn campaign_details(c: &CampaignOut) -> String {
    let mut out = String::new();
    let mut kv = |k: &str, v: String| {
        let _ = writeln!(out, "{k:<12}{v}");
    };
    kv("id", c.id.clone());
    kv("status", c.status.clone());
    if let Some(reason) = &c.halt_reason {
        kv(
            "halted",
            format!("{reason} (fix the configuration, then `campaign resume`)"),
        );
    }
    kv("send_rate", format!("{}/s", number(c.send_rate)));
    kv("algorithm", c.algorithm.clone());
    kv("burst", c.burst.to_string());
    kv("scope", scope_text(c.limiter_scope.as_deref()));
    kv("weight", number(c.weight));
    kv("rate_10s", format!("{:.1}/s", c.rate_10s));
    kv("sent", c.sent.to_string());
    kv("failed", c.failed.to_string());
    kv("retried", c.retried.to_string());
    kv("invalid", c.invalid.to_string());
    kv("rejected", c.rejected.to_string());
    kv("expired", c.expired.to_string());
    kv("cancelled", c.cancelled.to_string());
    let when = |t: Option<DateTime<Utc>>| t.map_or_else(|| "none".into(), |t| t.to_rfc3339());
    kv("start_at", when(c.start_at));
    kv("expires_at", when(c.expires_at));
    for (k, v) in super::policy::policy_rows(c) {
        kv(k, v);
    }
    if let (Some(p), Some(e)) = (&c.progress, &c.eta) {
        let total = p.total.map_or_else(|| "unknown".into(), |t| t.to_string());
        kv(
            "progress",
            format!(
                "{} finished of {total}; {} known to remain",
                p.finished, p.known_remaining
            ),
        );
        let eta = e.seconds.map_or_else(
            || "none".into(),
            |s| format!("{s:.0} s at {}/s ({} devices)", number(e.rate), e.basis),
        );
        kv("eta", eta);
    }
    kv(
        "worker",
        match &c.live {
            Some(l) => format!(
                "{}{}, {} in flight, {} open jobs, {} sent since taken up",
                if l.active {
                    "active"
                } else {
                    "waiting for a slot"
                },
                if l.paused { " (paused)" } else { "" },
                l.in_flight,
                l.open_jobs,
                l.sent
            ),
            None => "not held".into(),
        },
    );
    kv("created_at", c.created_at.to_rfc3339());
    kv("updated_at", c.updated_at.to_rfc3339());
    out
}

#[cfg(test)]
mod tests {
    use super::table;

    #[test]
    fn tables_align() {
        let t = table(
            &["ID", "N"],
            &[false, true],
            &[
                vec!["a".into(), "5".into()],
                vec!["bbb".into(), "1234".into()],
            ],
        );
        assert_eq!(t, "ID      N\na       5\nbbb  1234\n");
    }
}
