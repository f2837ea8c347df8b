//! The recipients' time zone ([`Zone`]): parsing, and local wall times to instants (DST).

use crate::job::echo;
use chrono::{DateTime, FixedOffset, LocalResult, NaiveDate, NaiveDateTime, Offset};
use chrono::{TimeDelta, TimeZone, Utc};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;

/// Longest zone text taken (IANA names are at most about 30 characters).
pub const MAX_ZONE_CHARS: usize = 64;
/// Largest UTC offset taken, in minutes: ±14:00, the range of real zones.
pub const MAX_OFFSET_MIN: i32 = 14 * 60;

/// Half the span searched for the end of a spring-forward gap, in seconds: offsets are
/// within ±15 h and the longest gap (Samoa, 2011) was a whole day.
const GAP_SEARCH_S: i64 = 26 * 3600;

/// The recipients' time zone: an IANA zone, whose offset follows its DST rules, or a
/// fixed UTC offset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Zone {
    Fixed(FixedOffset),
    Iana(Tz),
}

impl Zone {
    /// UTC, the zone of a job that names none.
    pub const UTC: Zone = Zone::Iana(Tz::UTC);

    /// Parses an IANA name (`Europe/Madrid`, `UTC`) or a UTC offset (`+02:00`, `-05:30`,
    /// `+0200`, `+02`, `Z`). The error says what is wrong and echoes the input, escaped
    /// and cut.
    pub fn parse(s: &str) -> Result<Zone, String> {
        let n = s.chars().count();
        if n > MAX_ZONE_CHARS {
            return Err(format!(
                "must be at most {MAX_ZONE_CHARS} characters, got {n}: {}",
                echo(s)
            ));
        }
        if s == "Z" || s == "z" {
            return Ok(Zone::Fixed(Utc.fix()));
        }
        if s.starts_with(['+', '-']) {
            return parse_offset(s).map(Zone::Fixed).ok_or_else(|| {
                format!(
                    "{} is not a UTC offset such as \"+02:00\", \"-05:30\" or \"+0200\" \
                     within ±14:00",
                    echo(s)
                )
            });
        }
        s.parse::<Tz>().map(Zone::Iana).map_err(|_| {
            format!(
                "unknown time zone {}; expected an IANA name such as \"Europe/Madrid\" \
                 (case matters) or a UTC offset such as \"+02:00\"",
                echo(s)
            )
        })
    }

    /// The zone's offset from UTC at `utc`, in seconds.
    fn offset_s(&self, utc: &NaiveDateTime) -> i32 {
        match self {
            Zone::Fixed(o) => o.local_minus_utc(),
            Zone::Iana(tz) => tz.offset_from_utc_datetime(utc).fix().local_minus_utc(),
        }
    }

    /// The local wall time at unix seconds `s`.
    fn local_at_s(&self, s: i64) -> Option<NaiveDateTime> {
        let utc = DateTime::from_timestamp(s, 0)?.naive_utc();
        utc.checked_add_signed(TimeDelta::seconds(self.offset_s(&utc).into()))
    }

    /// The local wall time at unix milliseconds `ms`.
    pub fn local_at(&self, ms: i64) -> Option<NaiveDateTime> {
        let utc = DateTime::from_timestamp_millis(ms)?.naive_utc();
        utc.checked_add_signed(TimeDelta::seconds(self.offset_s(&utc).into()))
    }

    /// The instant (unix ms) of a local wall time: in a gap, the first instant after it;
    /// when repeated, the earlier one.
    pub fn instant(&self, local: NaiveDateTime) -> Option<i64> {
        match self {
            Zone::Fixed(o) => Some(o.from_local_datetime(&local).single()?.timestamp_millis()),
            Zone::Iana(tz) => match tz.from_local_datetime(&local) {
                LocalResult::Single(t) => Some(t.timestamp_millis()),
                LocalResult::Ambiguous(a, b) => Some(a.min(b).timestamp_millis()),
                LocalResult::None => self.gap_end(local),
            },
        }
    }

    /// The first instant whose local time is at or after `local`, which lies in a
    /// spring-forward gap: the instant the clock jumps. A bisection over seconds, so it
    /// ends after about 18 steps whatever the database says.
    fn gap_end(&self, local: NaiveDateTime) -> Option<i64> {
        let guess = local.and_utc().timestamp();
        // Local time at `lo` is before `local` and at `hi` not: offsets are under 26 h.
        let (mut lo, mut hi) = (guess - GAP_SEARCH_S, guess + GAP_SEARCH_S);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if self.local_at_s(mid)? >= local {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi.checked_mul(1000)
    }

    /// The instant of minute `min` (0–1440) of local `date`.
    pub(super) fn instant_on(&self, date: NaiveDate, min: u16) -> Option<i64> {
        let midnight = date.and_hms_opt(0, 0, 0)?;
        self.instant(midnight.checked_add_signed(TimeDelta::minutes(min.into()))?)
    }
}

/// `±HH:MM`, `±HHMM` or `±HH`, within ±14:00.
fn parse_offset(s: &str) -> Option<FixedOffset> {
    if !s.is_ascii() {
        return None;
    }
    let (sign, rest) = match s.as_bytes().first()? {
        b'+' => (1, &s[1..]),
        b'-' => (-1, &s[1..]),
        _ => return None,
    };
    let (h, m) = match rest.len() {
        2 => (rest, "00"),
        4 => rest.split_at(2),
        5 if rest.as_bytes()[2] == b':' => (&rest[..2], &rest[3..]),
        _ => return None,
    };
    let (h, m) = (two_digits(h)?, two_digits(m)?);
    let total = i32::from(h) * 60 + i32::from(m);
    if m >= 60 || total > MAX_OFFSET_MIN {
        return None;
    }
    FixedOffset::east_opt(sign * total * 60)
}

pub(super) fn two_digits(s: &str) -> Option<u16> {
    match s.as_bytes() {
        [a @ b'0'..=b'9', b @ b'0'..=b'9'] => Some(u16::from(a - b'0') * 10 + u16::from(b - b'0')),
        _ => None,
    }
}

impl fmt::Display for Zone {
    /// The canonical form: the IANA name, or `±HH:MM` (`Z` is `+00:00`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Zone::Iana(tz) => f.write_str(tz.name()),
            Zone::Fixed(o) => {
                let s = o.local_minus_utc();
                let sign = if s < 0 { '-' } else { '+' };
                let m = s.unsigned_abs() / 60;
                write!(f, "{sign}{:02}:{:02}", m / 60, m % 60)
            }
        }
    }
}

impl FromStr for Zone {
    type Err = String;
    fn from_str(s: &str) -> Result<Zone, String> {
        Zone::parse(s)
    }
}

impl Serialize for Zone {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Zone {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Zone, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        Zone::parse(&s).map_err(serde::de::Error::custom)
    }
}
