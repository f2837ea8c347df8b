//! Recipients' local-time delivery windows: when a job for devices in one time zone may
//! go out (docs/JOB_FORMAT.md, "Local-time windows").
//!
//! A job may carry its recipients' zone (`tz`); its campaign may carry a window of local
//! hours and days (`send_window`), a local hour to deliver at (`deliver_at_local`) and
//! what to do when that hour has already passed in the zone today (`late_policy`).
//! [`release`] turns these and the current instant into a decision (send now, wait until
//! an instant, or skip). It is pure logic: the scheduler parks and wakes the job.
//!
//! Local dates and times become instants through the IANA database (chrono-tz), never
//! by hand-written DST rules. A local time that a spring-forward skips maps to the
//! first instant after the gap (the clock's next valid time); a local time that a
//! fall-back repeats maps to its earlier instant.

mod zone;

pub use zone::{Zone, MAX_OFFSET_MIN, MAX_ZONE_CHARS};

use super::echo;
use chrono::{Datelike, NaiveDate, TimeDelta};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::fmt;
use std::str::FromStr;
use zone::two_digits;

/// A job handed over this long after its `deliver_at_local` counts as on time, not late:
/// intake, parking and the scheduler's wake-up take a moment, and a job due at 10:00
/// that the worker looks at at 10:00:02 must not be skipped or put off a day.
pub const ON_TIME_GRACE_MS: i64 = 60_000;
/// Most entries [`next_windows`] returns.
pub const MAX_NEXT_WINDOWS: usize = 64;
/// Minutes in a day: a window's `to` may be this ("24:00", the end of the day).
pub const END_OF_DAY_MIN: u16 = 24 * 60;
/// Every day of the week, as a [`SendWindow::days`] mask.
pub const ALL_DAYS: u8 = 0x7f;
/// Day names in mask order: bit 0 is Monday.
pub const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

/// Days searched ahead for an allowed day: a week and one, so that even a mask of one
/// day is met again, and a bad mask cannot make the search run on.
const MAX_DAYS_AHEAD: i64 = 8;

/// A bad window, deliver time or late policy: the field (such as `send_window.to`) and
/// what is wrong with it, for a 422 or a dead letter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {problem}")]
pub struct WindowError {
    pub field: &'static str,
    pub problem: String,
}

fn err(field: &'static str, problem: impl Into<String>) -> WindowError {
    WindowError {
        field,
        problem: problem.into(),
    }
}

/// Parses a local time `HH:MM` (00:00–23:59) into minutes after midnight.
pub fn parse_local_time(s: &str) -> Result<u16, String> {
    parse_hhmm(s, false)
}

/// Formats minutes after midnight (0–1440) as `HH:MM`.
pub fn format_local_time(min: u16) -> String {
    format!("{:02}:{:02}", min / 60, min % 60)
}

/// `HH:MM`, two digits each; `24:00` too when `end_of_day`.
fn parse_hhmm(s: &str, end_of_day: bool) -> Result<u16, String> {
    let parsed = match s.as_bytes() {
        [_, _, b':', _, _] if s.is_ascii() => two_digits(&s[..2]).zip(two_digits(&s[3..])),
        _ => None,
    };
    match parsed {
        Some((h, m)) if h < 24 && m < 60 => Ok(h * 60 + m),
        Some((24, 0)) if end_of_day => Ok(END_OF_DAY_MIN),
        _ => Err(format!(
            "must be a local time \"HH:MM\" from 00:00 to {}, got {}",
            if end_of_day { "24:00" } else { "23:59" },
            echo(s)
        )),
    }
}

fn local_time_value(v: &Value, field: &'static str, end_of_day: bool) -> Result<u16, WindowError> {
    match v {
        Value::String(s) => parse_hhmm(s, end_of_day).map_err(|p| err(field, p)),
        other => Err(err(
            field,
            format!(
                "must be a local time \"HH:MM\" (a string), got {}",
                super::json_type_name(other)
            ),
        )),
    }
}

/// Local hours (`from` inclusive, `to` exclusive, within one day) on some days of the
/// week. Build it with [`SendWindow::new`] or [`SendWindow::parse_json`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct SendWindow {
    /// Minutes after local midnight: 0–1439.
    pub from_min: u16,
    /// Minutes after local midnight, after `from_min`: up to 1440 (24:00, the day's end).
    pub to_min: u16,
    /// Allowed days: bit 0 Monday … bit 6 Sunday; never 0.
    pub days: u8,
}

impl SendWindow {
    /// A window, checked as [`SendWindow::parse_json`] checks one.
    pub fn new(from_min: u16, to_min: u16, days: u8) -> Result<SendWindow, WindowError> {
        let w = SendWindow {
            from_min,
            to_min,
            days,
        };
        w.validate().map(|()| w)
    }

    fn validate(&self) -> Result<(), WindowError> {
        if self.from_min >= END_OF_DAY_MIN {
            return Err(err("send_window.from", "must be from 00:00 to 23:59"));
        }
        if self.to_min > END_OF_DAY_MIN {
            return Err(err("send_window.to", "must be from 00:01 to 24:00"));
        }
        if self.to_min <= self.from_min {
            return Err(err(
                "send_window.to",
                format!(
                    "to must be after from, got from {} and to {}; a window ends on the day \
                     it starts (24:00 is the end of the day)",
                    format_local_time(self.from_min),
                    format_local_time(self.to_min)
                ),
            ));
        }
        if self.days == 0 || self.days & !ALL_DAYS != 0 {
            return Err(err("send_window.days", "must name at least one day"));
        }
        Ok(())
    }

    /// Reads `{"from": "09:00", "to": "21:00", "days": ["mon", …]}` (`days` absent or
    /// null: every day). Other members are refused, so that a misspelt one is not lost.
    pub fn parse_json(v: &Value) -> Result<SendWindow, WindowError> {
        let Value::Object(map) = v else {
            return Err(err(
                "send_window",
                format!(
                    "must be an object such as {{\"from\": \"09:00\", \"to\": \"21:00\"}}, got {}",
                    super::json_type_name(v)
                ),
            ));
        };
        if let Some(k) = map
            .keys()
            .find(|k| !["from", "to", "days"].contains(&k.as_str()))
        {
            return Err(err(
                "send_window",
                format!("unknown member {}; expected from, to and days", echo(k)),
            ));
        }
        let required = |name, field| {
            map.get(name)
                .ok_or_else(|| err(field, "missing; required: a local time \"HH:MM\""))
        };
        let from_min = local_time_value(
            required("from", "send_window.from")?,
            "send_window.from",
            false,
        )?;
        let to_min = local_time_value(required("to", "send_window.to")?, "send_window.to", true)?;
        let days = match map.get("days") {
            None | Some(Value::Null) => ALL_DAYS,
            Some(d) => parse_days(d)?,
        };
        SendWindow::new(from_min, to_min, days)
    }

    /// Whether the window is open on `day` (a local weekday).
    pub fn allows(&self, day: chrono::Weekday) -> bool {
        allows(self.days, day)
    }

    /// The allowed days' names, Monday first.
    pub fn day_names(&self) -> Vec<&'static str> {
        (0..7)
            .filter(|i| self.days & (1 << i) != 0)
            .map(|i| DAY_NAMES[i])
            .collect()
    }

    /// The window's instants on local `date`. A window wholly inside a spring-forward
    /// gap would shrink to nothing; it then opens at the gap's end for its usual length,
    /// so that its jobs still go out that day.
    fn span_on(&self, zone: &Zone, date: NaiveDate) -> Option<(i64, i64)> {
        let open = zone.instant_on(date, self.from_min)?;
        let close = zone.instant_on(date, self.to_min)?;
        let nominal = i64::from(self.to_min - self.from_min) * 60_000;
        Some((open, if close > open { close } else { open + nominal }))
    }
}

fn allows(days: u8, day: chrono::Weekday) -> bool {
    days & (1 << day.num_days_from_monday()) != 0
}

fn parse_days(v: &Value) -> Result<u8, WindowError> {
    const FIELD: &str = "send_window.days";
    let Value::Array(list) = v else {
        return Err(err(
            FIELD,
            format!(
                "must be an array of day names (mon … sun), got {}",
                super::json_type_name(v)
            ),
        ));
    };
    if list.is_empty() {
        return Err(err(FIELD, "must name at least one day (absent: every day)"));
    }
    let mut days = 0u8;
    for (i, d) in list.iter().enumerate() {
        let name = d.as_str().unwrap_or("");
        let Some(bit) = DAY_NAMES.iter().position(|n| *n == name) else {
            let got = d
                .as_str()
                .map_or_else(|| super::json_type_name(d).to_string(), echo);
            return Err(err(
                FIELD,
                format!(
                    "element {i}: unknown day {got}; expected mon, tue, wed, thu, fri, sat or sun"
                ),
            ));
        };
        if days & (1 << bit) != 0 {
            return Err(err(
                FIELD,
                format!("element {i}: {name} appears more than once"),
            ));
        }
        days |= 1 << bit;
    }
    Ok(days)
}

impl Serialize for SendWindow {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let mut st = s.serialize_struct("SendWindow", 3)?;
        st.serialize_field("from", &format_local_time(self.from_min))?;
        st.serialize_field("to", &format_local_time(self.to_min))?;
        st.serialize_field("days", &self.day_names())?;
        st.end()
    }
}

impl<'de> Deserialize<'de> for SendWindow {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<SendWindow, D::Error> {
        SendWindow::parse_json(&Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// What to do with a job whose local time has already passed in its zone today.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LatePolicy {
    /// Send it at once.
    SendNow,
    /// Wait for the zone's next window (or the deliver time on the next allowed day).
    #[default]
    NextWindow,
    /// Send none of it: its devices are counted `expired`, with a dead letter.
    Skip,
}

impl LatePolicy {
    pub const ALL: [LatePolicy; 3] = [
        LatePolicy::SendNow,
        LatePolicy::NextWindow,
        LatePolicy::Skip,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            LatePolicy::SendNow => "send_now",
            LatePolicy::NextWindow => "next_window",
            LatePolicy::Skip => "skip",
        }
    }
}

impl FromStr for LatePolicy {
    type Err = String;
    fn from_str(s: &str) -> Result<LatePolicy, String> {
        LatePolicy::ALL
            .into_iter()
            .find(|p| p.as_str() == s)
            .ok_or_else(|| {
                format!(
                    "unknown late policy {}; expected send_now, next_window or skip",
                    echo(s)
                )
            })
    }
}

impl fmt::Display for LatePolicy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A campaign's local-time rules. Empty (the default): jobs go out whenever due.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct LocalPolicy {
    pub window: Option<SendWindow>,
    /// Minutes after local midnight (0–1439) to deliver at.
    pub deliver_at_local: Option<u16>,
    pub late: LatePolicy,
}

impl LocalPolicy {
    /// No window and no deliver time: nothing to wait for.
    pub fn is_empty(&self) -> bool {
        self.window.is_none() && self.deliver_at_local.is_none()
    }

    /// Checks the window, the deliver time, and that the deliver time falls inside the
    /// window when both are given (else the job could never go out on time).
    pub fn validate(&self) -> Result<(), WindowError> {
        if let Some(w) = &self.window {
            w.validate()?;
        }
        let Some(at) = self.deliver_at_local else {
            return Ok(());
        };
        if at >= END_OF_DAY_MIN {
            return Err(err("deliver_at_local", "must be from 00:00 to 23:59"));
        }
        match self.window {
            Some(w) if !(w.from_min..w.to_min).contains(&at) => Err(err(
                "deliver_at_local",
                format!(
                    "deliver_at_local must fall inside send_window ({}–{}), got {}",
                    format_local_time(w.from_min),
                    format_local_time(w.to_min),
                    format_local_time(at)
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Reads the campaign fields `send_window`, `deliver_at_local` and `late_policy`
    /// (each absent or null: none, none, `next_window`) and validates them together.
    pub fn parse_fields(
        send_window: Option<&Value>,
        deliver_at_local: Option<&Value>,
        late_policy: Option<&Value>,
    ) -> Result<LocalPolicy, WindowError> {
        fn present(v: Option<&Value>) -> Option<&Value> {
            v.filter(|v| !v.is_null())
        }
        let window = present(send_window)
            .map(SendWindow::parse_json)
            .transpose()?;
        let deliver_at_local = present(deliver_at_local)
            .map(|v| local_time_value(v, "deliver_at_local", false))
            .transpose()?;
        let late = match present(late_policy) {
            None => LatePolicy::default(),
            Some(Value::String(s)) => s.parse().map_err(|p| err("late_policy", p))?,
            Some(v) => {
                return Err(err(
                    "late_policy",
                    format!(
                        "must be send_now, next_window or skip (a string), got {}",
                        super::json_type_name(v)
                    ),
                ))
            }
        };
        let policy = LocalPolicy {
            window,
            deliver_at_local,
            late,
        };
        policy.validate().map(|()| policy)
    }

    /// Reads the three fields from a JSON object (a campaign's settings).
    pub fn from_object(obj: &serde_json::Map<String, Value>) -> Result<LocalPolicy, WindowError> {
        Self::parse_fields(
            obj.get("send_window"),
            obj.get("deliver_at_local"),
            obj.get("late_policy"),
        )
    }

    fn days(&self) -> u8 {
        self.window.map_or(ALL_DAYS, |w| w.days)
    }

    /// When the job may start on local `date` (an allowed day): the deliver time, else
    /// the window's opening.
    fn start_on(&self, zone: &Zone, date: NaiveDate) -> Option<i64> {
        match (self.deliver_at_local, &self.window) {
            (Some(at), _) => zone.instant_on(date, at),
            (None, Some(w)) => w.span_on(zone, date).map(|(open, _)| open),
            (None, None) => None,
        }
    }

    /// The start on the first allowed day after `today`, within [`MAX_DAYS_AHEAD`].
    fn next_start(&self, zone: &Zone, today: NaiveDate) -> Option<i64> {
        (1..=MAX_DAYS_AHEAD)
            .filter_map(|k| today.checked_add_signed(TimeDelta::days(k)))
            .find(|d| allows(self.days(), d.weekday()))
            .and_then(|d| self.start_on(zone, d))
    }
}

impl Serialize for LocalPolicy {
    /// The campaign fields: `send_window` and `deliver_at_local` when set, `late_policy`.
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(None)?;
        if let Some(w) = &self.window {
            m.serialize_entry("send_window", w)?;
        }
        if let Some(at) = self.deliver_at_local {
            m.serialize_entry("deliver_at_local", &format_local_time(at))?;
        }
        m.serialize_entry("late_policy", self.late.as_str())?;
        m.end()
    }
}

impl<'de> Deserialize<'de> for LocalPolicy {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<LocalPolicy, D::Error> {
        let map = serde_json::Map::<String, Value>::deserialize(d)?;
        LocalPolicy::from_object(&map).map_err(serde::de::Error::custom)
    }
}

/// What [`release`] decided for a job now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    /// Send now; `closes_ms`: the window's end (unix ms), after which sending pauses
    /// until the next window (`None`: no end).
    Now { closes_ms: Option<i64> },
    /// Park the job until this instant (unix ms), then ask again.
    At(i64),
    /// The local time has passed and the campaign says skip: count the devices
    /// `expired`, with one dead letter for the job.
    Skip,
}

/// Decides whether a job for recipients in `zone` may go out at `now_ms`, under its
/// campaign's `policy`. A job "late" is one whose window (or deliver time) has already
/// passed today on an allowed day; a day the window does not allow is not late, the job
/// waits for the next allowed day. Never panics; searches at most [`MAX_DAYS_AHEAD`].
pub fn release(policy: &LocalPolicy, zone: &Zone, now_ms: i64) -> Release {
    const NOW: Release = Release::Now { closes_ms: None };
    if policy.is_empty() {
        return NOW;
    }
    // An instant chrono cannot place (far outside years ±262,000) has no local day.
    let Some(today) = zone.local_at(now_ms).map(|t| t.date()) else {
        return NOW;
    };
    // From here a None is a date at chrono's limits or a mask with no day: never opens.
    let never = Release::Skip;
    if !allows(policy.days(), today.weekday()) {
        return policy.next_start(zone, today).map_or(never, Release::At);
    }
    let span = policy.window.and_then(|w| w.span_on(zone, today));
    let start = match (policy.deliver_at_local, span) {
        (Some(at), _) => zone.instant_on(today, at),
        (None, Some((open, _))) => Some(open),
        (None, None) => None,
    };
    let Some(start) = start else { return never };
    let open_until = span.map(|(_, close)| close).filter(|&close| now_ms < close);
    if now_ms < start {
        return Release::At(start);
    }
    let on_time = match policy.deliver_at_local {
        Some(_) => now_ms - start <= ON_TIME_GRACE_MS,
        None => open_until.is_some(),
    };
    if on_time {
        return Release::Now {
            closes_ms: open_until,
        };
    }
    match policy.late {
        // Inside the window still, it pauses at the window's end as any job there.
        LatePolicy::SendNow => Release::Now {
            closes_ms: open_until,
        },
        LatePolicy::NextWindow => policy.next_start(zone, today).map_or(never, Release::At),
        LatePolicy::Skip => Release::Skip,
    }
}

/// Decides for a job that started on time and was paused when its window closed: it is
/// not late (the late policy plays no part), so it goes on when the window next opens.
/// [`release`] would see the closed window as late and send at once (`send_now`) or
/// drop the rest (`skip`). Without a window nothing pauses a job: `Now`.
pub fn resume(policy: &LocalPolicy, zone: &Zone, now_ms: i64) -> Release {
    if policy.window.is_none() {
        return Release::Now { closes_ms: None };
    }
    let window_only = LocalPolicy {
        deliver_at_local: None,
        ..*policy
    };
    match next_windows(&window_only, zone, now_ms, 1).first() {
        Some(&(open, close)) if open <= now_ms => Release::Now {
            closes_ms: Some(close),
        },
        Some(&(open, _)) => Release::At(open),
        // A mask with no day, or a date at chrono's limits: it never opens again.
        None => Release::Skip,
    }
}

/// The next `n` (at most [`MAX_NEXT_WINDOWS`]) windows of `policy` in `zone` that have
/// not ended at `now_ms`, as (opens, closes) unix ms, the one open now first. With
/// `deliver_at_local` a window opens at the deliver time and closes at the send
/// window's end, or, without a send window, when the job stops being on time
/// ([`ON_TIME_GRACE_MS`]). Empty for an empty policy (no window: always open).
pub fn next_windows(policy: &LocalPolicy, zone: &Zone, now_ms: i64, n: usize) -> Vec<(i64, i64)> {
    let n = n.min(MAX_NEXT_WINDOWS);
    let mut out = Vec::with_capacity(n);
    let Some(today) = zone.local_at(now_ms).map(|t| t.date()) else {
        return out;
    };
    if policy.is_empty() || policy.days() & ALL_DAYS == 0 {
        return out;
    }
    // Each allowed day has one window, and every week has an allowed day.
    let horizon = n as i64 * 7 + MAX_DAYS_AHEAD;
    for k in 0..horizon {
        if out.len() >= n {
            break;
        }
        let Some(date) = today.checked_add_signed(TimeDelta::days(k)) else {
            break;
        };
        if !allows(policy.days(), date.weekday()) {
            continue;
        }
        let span = policy.window.and_then(|w| w.span_on(zone, date));
        let Some(start) = policy.start_on(zone, date) else {
            continue;
        };
        let close = span.map_or(start + ON_TIME_GRACE_MS, |(_, close)| close);
        if close > now_ms {
            out.push((start, close));
        }
    }
    out
}

#[cfg(test)]
mod tests_parse;
#[cfg(test)]
mod tests_release;
