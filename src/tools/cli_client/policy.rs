//! The delivery-policy commands: `campaign set-priority`, `set-finish-by`, `set-ramp` and
//! `set-window`, and the policy lines of `campaign show`. Each PUTs to the API like the
//! other setters; the API checks every value and answers 422 naming the field.

use super::lifecycle::instant_value;
use super::render::number;
use super::{finite, put_campaign, CampaignOut, Changed, CliError, Client, LiveOut, PolicyOut};
use chrono::{DateTime, Utc};
use clap::{ArgGroup, Args};
use serde_json::{json, Map, Value};

/// The days of the week as the API names them, Monday first.
pub(super) const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Most `next_window` lines `campaign show` prints (one per device time zone).
const NEXT_WINDOWS_SHOWN: usize = 8;

#[derive(Args, Debug, Clone)]
#[command(group(
    ArgGroup::new("ramp").required(true).multiple(true).args(["seconds", "from", "default"])
))]
pub struct RampArgs {
    pub id: String,
    /// Seconds the rate takes to climb to the full send_rate: 0 (no ramp) to 86400. The
    /// ramp restarts after a pause or halt.
    #[arg(long, value_name = "N", conflicts_with = "default")]
    pub seconds: Option<f64>,
    /// Where the ramp starts, as a fraction of the send_rate: 0.01 to 1.
    #[arg(long, value_name = "F", conflicts_with = "default")]
    pub from: Option<f64>,
    /// Back to the worker's limiter.ramp_up_s and limiter.ramp_from.
    #[arg(long)]
    pub default: bool,
}

#[derive(Args, Debug, Clone)]
#[command(group(
    ArgGroup::new("window")
        .required(true)
        .multiple(true)
        .args(["from", "deliver_at", "late", "clear"])
))]
pub struct WindowArgs {
    pub id: String,
    /// When the window opens each allowed day, HH:MM in each device's local time.
    #[arg(long, value_name = "HH:MM", requires = "to", conflicts_with = "clear")]
    pub from: Option<String>,
    /// When the window closes, HH:MM local time.
    #[arg(
        long,
        value_name = "HH:MM",
        requires = "from",
        conflicts_with = "clear"
    )]
    pub to: Option<String>,
    /// The days it opens: mon,tue,wed,thu,fri,sat,sun, or weekdays, weekend, all
    /// [default: all].
    #[arg(
        long,
        value_name = "DAYS",
        value_delimiter = ',',
        requires = "from",
        conflicts_with = "clear"
    )]
    pub days: Vec<String>,
    /// Deliver at this local time, HH:MM, in each device's time zone (`none` clears it).
    #[arg(long = "deliver-at", value_name = "HH:MM", conflicts_with = "clear")]
    pub deliver_at: Option<String>,
    /// What to do with a job whose local time has already passed in its zone today:
    /// send it now, wait for the next window (the API's default), or skip it.
    #[arg(
        long,
        value_name = "POLICY",
        value_parser = ["send_now", "next_window", "skip"],
        conflicts_with = "clear"
    )]
    pub late: Option<String>,
    /// Removes the window and the deliver-at time: it sends at any hour again.
    #[arg(long)]
    pub clear: bool,
}

/// `set-priority`: the class goes as typed; the API checks it.
pub(super) async fn set_priority(
    client: &Client,
    id: &str,
    class: &str,
    json: bool,
) -> Result<String, CliError> {
    let body = json!({ "priority": class });
    super::set_setting(client, id, body, json, |c| {
        let shown = c.policy.as_ref().map_or(class, |p| p.priority.as_str());
        format!("priority {shown}")
    })
    .await
}

/// `set-finish-by`: RFC 3339, unix seconds, or `none`.
pub(super) async fn set_finish_by(
    client: &Client,
    id: &str,
    raw: &str,
    json: bool,
) -> Result<String, CliError> {
    let body = json!({ "finish_by": instant_value(raw) });
    super::set_setting(client, id, body, json, |c| match &c.policy {
        Some(p) => format!("finish_by {}", finish_text(p)),
        None => format!("finish_by {raw}"),
    })
    .await
}

/// The PUT body of `set-ramp`: nulls for `--default`, else the values given.
pub(super) fn ramp_body(args: &RampArgs) -> Result<Value, CliError> {
    if args.default {
        return Ok(json!({ "ramp_up_s": null, "ramp_from": null }));
    }
    let mut body = Map::new();
    if let Some(s) = args.seconds {
        body.insert("ramp_up_s".into(), finite("--seconds", s)?.into());
    }
    if let Some(f) = args.from {
        body.insert("ramp_from".into(), finite("--from", f)?.into());
    }
    Ok(Value::Object(body))
}

pub(super) async fn set_ramp(
    client: &Client,
    args: &RampArgs,
    json: bool,
) -> Result<String, CliError> {
    let body = ramp_body(args)?;
    super::set_setting(client, &args.id, body, json, |c| match &c.policy {
        Some(p) => format!("ramp {}", ramp_text(p, c.live.as_ref())),
        None => "ramp set".into(),
    })
    .await
}

/// `--days` as the API names them: aliases expanded, lower case, each day once, in the
/// order given. Names the API does not know go as typed, for it to refuse.
fn days(list: &[String]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for raw in list {
        let name = raw.trim().to_ascii_lowercase();
        let expanded: Vec<String> = match name.as_str() {
            "" => vec![],
            "all" | "daily" | "every" => DAYS.iter().map(|d| d.to_string()).collect(),
            "weekdays" => DAYS[..5].iter().map(|d| d.to_string()).collect(),
            "weekend" | "weekends" => DAYS[5..].iter().map(|d| d.to_string()).collect(),
            _ => vec![name],
        };
        for d in expanded {
            if !out.contains(&d) {
                out.push(d);
            }
        }
    }
    if out.is_empty() {
        DAYS.iter().map(|d| d.to_string()).collect()
    } else {
        out
    }
}

/// The PUT body of `set-window`: `--clear` nulls the window and the deliver-at time;
/// otherwise only what was given is sent.
pub(super) fn window_body(args: &WindowArgs) -> Value {
    if args.clear {
        return json!({ "send_window": null, "deliver_at_local": null });
    }
    let mut body = Map::new();
    if let (Some(from), Some(to)) = (&args.from, &args.to) {
        body.insert(
            "send_window".into(),
            json!({ "from": from, "to": to, "days": days(&args.days) }),
        );
    }
    if let Some(at) = &args.deliver_at {
        let v = match at.as_str() {
            "none" | "null" => Value::Null,
            s => s.into(),
        };
        body.insert("deliver_at_local".into(), v);
    }
    if let Some(late) = &args.late {
        body.insert("late_policy".into(), late.as_str().into());
    }
    Value::Object(body)
}

pub(super) async fn set_window(
    client: &Client,
    args: &WindowArgs,
    json: bool,
) -> Result<String, CliError> {
    let body = window_body(args);
    let c = match put_campaign(client, &args.id, body.clone(), json).await? {
        Changed::Json(text) => return Ok(text),
        Changed::Campaign(c) => c,
    };
    // Each field sent, as the API now shows it (or as sent, from an API that does not
    // show windows).
    let view = c.policy.as_ref().filter(|p| knows_windows(p));
    let mut parts = Vec::new();
    for (field, label) in [
        ("send_window", "window"),
        ("deliver_at_local", "deliver_at"),
        ("late_policy", "late_policy"),
    ] {
        let Some(sent) = body.get(field) else {
            continue;
        };
        let shown = match view {
            Some(p) => set_value(match field {
                "send_window" => &p.send_window,
                "deliver_at_local" => &p.deliver_at_local,
                _ => &p.late_policy,
            })
            .cloned()
            .unwrap_or(Value::Null),
            None => sent.clone(),
        };
        let text = match field {
            "send_window" => window_text(&shown),
            "deliver_at_local" => deliver_text(&shown),
            _ => plain(&shown),
        };
        parts.push(format!("{label} {text}"));
    }
    Ok(format!(
        "campaign {}: {}; the worker applies it within a second\n",
        c.id,
        parts.join(", ")
    ))
}

/// Whether the API speaks of send windows: it always shows `late_policy` then, and
/// leaves `send_window` and `deliver_at_local` out while they are not set.
fn knows_windows(p: &PolicyOut) -> bool {
    p.late_policy.is_some() || p.send_window.is_some()
}

/// A value that is set: absent and null both mean none.
fn set_value(v: &Option<Value>) -> Option<&Value> {
    v.as_ref().filter(|v| !v.is_null())
}

/// A JSON string without its quotes; anything else as JSON.
fn plain(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_string)
}

fn rfc3339(t: DateTime<Utc>) -> String {
    t.to_rfc3339()
}

fn percent(f: f64) -> String {
    format!("{}%", number(f * 100.0))
}

/// The ramp as set (its own values or the worker's defaults) and, while it ramps, the
/// fraction of the send_rate it may use now.
pub(super) fn ramp_text(p: &PolicyOut, live: Option<&LiveOut>) -> String {
    let from = p
        .ramp_from
        .map_or_else(|| "limiter.ramp_from".into(), percent);
    let mut s = match p.ramp_up_s {
        None if p.ramp_from.is_none() => {
            "default (limiter.ramp_up_s, limiter.ramp_from)".to_string()
        }
        None => format!("limiter.ramp_up_s from {from}"),
        Some(secs) if secs <= 0.0 => "none (0 s)".to_string(),
        Some(secs) => format!("{} s from {from} of send_rate", number(secs)),
    };
    if let Some(now) = live.and_then(|l| l.ramp) {
        s.push_str(&format!("; ramping: {} of send_rate now", percent(now)));
    }
    s
}

/// The deadline against the projected finish, with `BEHIND` when it will be missed.
pub(super) fn finish_text(p: &PolicyOut) -> String {
    let projected = p.projected_finish.map(rfc3339);
    match (p.finish_by, projected) {
        (None, None) => "none".into(),
        (None, Some(pf)) => format!("none (projected finish {pf})"),
        (Some(fb), pf) if p.behind => format!(
            "{}  BEHIND: projected finish {}",
            rfc3339(fb),
            pf.unwrap_or_else(|| "unknown (deadline passed)".into())
        ),
        (Some(fb), Some(pf)) => format!("{}  on track: projected finish {pf}", rfc3339(fb)),
        (Some(fb), None) => format!("{}  (no projected finish)", rfc3339(fb)),
    }
}

/// A send window as the API shows it: `09:00–21:00 mon,tue,wed`, or `none`.
pub(super) fn window_text(w: &Value) -> String {
    let Some(obj) = w.as_object() else {
        return if w.is_null() {
            "none (any hour)".into()
        } else {
            w.to_string()
        };
    };
    let time = |k: &str| {
        obj.get(k)
            .and_then(Value::as_str)
            .unwrap_or("?")
            .to_string()
    };
    let days: Vec<&str> = obj
        .get("days")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let days = if days.is_empty() || DAYS.iter().all(|d| days.contains(d)) {
        "every day".to_string()
    } else {
        days.join(",")
    };
    format!("{}–{} local, {days}", time("from"), time("to"))
}

fn deliver_text(v: &Value) -> String {
    match v {
        Value::Null => "none".into(),
        Value::String(s) => format!("{s} local"),
        other => other.to_string(),
    }
}

/// One `next_windows` entry: `Europe/Paris  opens … closes …`.
pub(super) fn next_window_text(v: &Value) -> String {
    let s = |k: &str| match v.get(k) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => "–".into(),
        Some(other) => other.to_string(),
    };
    format!(
        "{}: opens {}, closes {}",
        s("zone"),
        s("opens"),
        s("closes")
    )
}

/// The policy lines of `campaign show`, as (key, value); none from an API without it.
/// The window lines appear only from an API that shows windows; `late_policy` only
/// with a window or a deliver time, which it is about.
pub(super) fn policy_rows(c: &CampaignOut) -> Vec<(&'static str, String)> {
    let Some(p) = &c.policy else {
        return vec![];
    };
    let live = c.live.as_ref();
    let mut rows = vec![
        ("priority", p.priority.clone()),
        ("ramp", ramp_text(p, live)),
        ("finish_by", finish_text(p)),
    ];
    if let Some(ms) = live.and_then(|l| l.starved_ms) {
        rows.push((
            "starved",
            format!(
                "{:.1} s with work but no share under the cap (higher classes take it)",
                ms as f64 / 1000.0
            ),
        ));
    }
    if knows_windows(p) {
        let window = set_value(&p.send_window);
        let at = set_value(&p.deliver_at_local);
        rows.push((
            "window",
            window.map_or_else(|| "none (any hour)".into(), window_text),
        ));
        if let Some(at) = at {
            rows.push(("deliver_at", deliver_text(at)));
        }
        // What is done with a late send only matters with a window or a deliver time.
        if let (true, Some(late)) = (window.is_some() || at.is_some(), set_value(&p.late_policy)) {
            rows.push(("late_policy", plain(late)));
        }
    }
    let next = p.next_windows.as_deref().unwrap_or_default();
    for (i, w) in next.iter().take(NEXT_WINDOWS_SHOWN).enumerate() {
        rows.push((if i == 0 { "next_window" } else { "" }, next_window_text(w)));
    }
    if next.len() > NEXT_WINDOWS_SHOWN {
        rows.push((
            "",
            format!(
                "… and {} more time zones (--format json shows all)",
                next.len() - NEXT_WINDOWS_SHOWN
            ),
        ));
    }
    rows
}
