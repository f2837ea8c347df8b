//! A job's place in its campaign's life: when it may start, when it stops being worth
//! sending, and the producer's statement of the campaign's size (docs/JOB_FORMAT.md,
//! "Lifecycle").

use super::options::Scalar;
use std::io::Write;

/// The latest instant taken: the end of the year 9999, in unix seconds. Anything later
/// is a unit mistake (milliseconds given as seconds), refused rather than never sent.
pub const MAX_UNIX_S: i64 = 253_402_300_799;
/// The largest `campaign_total_devices`: a billion devices.
pub const MAX_CAMPAIGN_TOTAL: u64 = 1_000_000_000;

/// The lifecycle fields of a job. All `None` by default: send now, never expire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// Unix milliseconds before which none of the job is sent.
    pub not_before_ms: Option<i64>,
    /// Unix milliseconds from which its unsent devices are counted `expired`.
    pub expires_at_ms: Option<i64>,
    /// How many devices the whole campaign has, as the producer states it.
    pub campaign_total_devices: Option<u64>,
}

impl Lifecycle {
    /// Whether the job has a window that ends before it starts.
    pub(super) fn check(&self) -> Result<(), (&'static str, String)> {
        match (self.not_before_ms, self.expires_at_ms) {
            (Some(start), Some(end)) if end <= start => Err((
                "expires_at",
                "must be after not_before (nothing could be sent)".into(),
            )),
            _ => Ok(()),
        }
    }

    pub(super) fn write_json(&self, out: &mut Vec<u8>) {
        if let Some(t) = self.not_before_ms {
            let _ = write!(out, ",\"not_before\":{}", fmt_seconds(t));
        }
        if let Some(t) = self.expires_at_ms {
            let _ = write!(out, ",\"expires_at\":{}", fmt_seconds(t));
        }
        if let Some(n) = self.campaign_total_devices {
            let _ = write!(out, ",\"campaign_total_devices\":{n}");
        }
    }
}

/// Bounds the provider's own expiry (`apns-expiration`, FCM `ttl`, Web Push `TTL`) of
/// `job` by its campaign's `expires_at` (unix ms): the earlier of the job's `expiration`
/// and the campaign's, so that a provider does not deliver after the campaign stopped
/// being worth sending. A job that gives `ttl_s` keeps its own choice. The job is copied
/// only when it changes while shared.
pub fn bound_by_campaign_expiry(job: &mut std::sync::Arc<super::Job>, expires_at_ms: Option<i64>) {
    let Some(at) = expires_at_ms.map(|ms| ms.div_euclid(1000)) else {
        return;
    };
    let o = &job.options;
    if o.ttl_s.is_none() && o.expiration.is_none_or(|e| e > at) {
        std::sync::Arc::make_mut(job).options.expiration = Some(at);
    }
}

/// Unix milliseconds as JSON seconds: whole when they are, else with 3 decimals.
fn fmt_seconds(ms: i64) -> String {
    if ms % 1000 == 0 {
        (ms / 1000).to_string()
    } else {
        format!("{}.{:03}", ms.div_euclid(1000), ms.rem_euclid(1000))
    }
}

/// An instant: unix seconds (a number, fractions to the millisecond) or an RFC 3339
/// string such as `2026-11-25T10:00:00Z`. Returns unix milliseconds.
pub(super) fn instant(v: Scalar) -> Result<i64, String> {
    let ms = match v {
        Scalar::Int(n) => i64::try_from(n)
            .ok()
            .filter(|s| (0..=MAX_UNIX_S).contains(s))
            .map(|s| s * 1000)
            .ok_or_else(|| out_of_range(&n.to_string()))?,
        Scalar::Float(f) => {
            if !(0.0..=MAX_UNIX_S as f64).contains(&f) {
                return Err(out_of_range(&f.to_string()));
            }
            (f * 1000.0).round() as i64
        }
        Scalar::Str(s) => chrono::DateTime::parse_from_rfc3339(&s)
            .map_err(|e| {
                format!(
                    "{} is not an RFC 3339 time such as 2026-11-25T10:00:00Z: {e}",
                    super::echo(&s)
                )
            })?
            .timestamp_millis(),
        Scalar::Other(t) => {
            return Err(format!("must be unix seconds or an RFC 3339 time, got {t}"))
        }
    };
    if !(0..=MAX_UNIX_S * 1000).contains(&ms) {
        return Err(out_of_range(&format!("{ms} ms")));
    }
    Ok(ms)
}

fn out_of_range(got: &str) -> String {
    format!("must be unix seconds from 0 to {MAX_UNIX_S} (the year 9999), got {got}")
}

pub(super) fn total_devices(v: Scalar) -> Result<u64, String> {
    match v {
        Scalar::Int(n) => u64::try_from(n)
            .ok()
            .filter(|n| (1..=MAX_CAMPAIGN_TOTAL).contains(n))
            .ok_or_else(|| {
                format!("must be a whole number from 1 to {MAX_CAMPAIGN_TOTAL}, got {n}")
            }),
        Scalar::Float(f) => Err(format!("must be a whole number of devices, got {f}")),
        other => Err(format!(
            "must be a whole number of devices, got {}",
            other.type_name()
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_campaign_expiry_bounds_the_providers_own() {
        let payload = serde_json::value::RawValue::from_string("{}".into()).unwrap();
        let mut job = std::sync::Arc::new(
            super::super::Job::new("j", "c", vec!["d".to_string()], payload).unwrap(),
        );
        bound_by_campaign_expiry(&mut job, None);
        assert_eq!(job.options.expiration, None);
        bound_by_campaign_expiry(&mut job, Some(2_000_500));
        assert_eq!(job.options.expiration, Some(2_000));
        // A later campaign expiry leaves the earlier one; an earlier one wins.
        bound_by_campaign_expiry(&mut job, Some(3_000_000));
        assert_eq!(job.options.expiration, Some(2_000));
        let shared = job.clone();
        bound_by_campaign_expiry(&mut job, Some(1_000_000));
        assert_eq!(job.options.expiration, Some(1_000));
        assert_eq!(
            shared.options.expiration,
            Some(2_000),
            "copied, not changed"
        );
        // The job's own ttl_s is its choice.
        let mut ttl = (*shared).clone();
        ttl.options.expiration = None;
        ttl.options.ttl_s = Some(60);
        let mut ttl = std::sync::Arc::new(ttl);
        bound_by_campaign_expiry(&mut ttl, Some(1_000_000));
        assert_eq!(ttl.options.expiration, None);
    }

    #[test]
    fn instants_take_seconds_and_rfc3339() {
        assert_eq!(instant(Scalar::Int(1_800_000_000)), Ok(1_800_000_000_000));
        assert_eq!(instant(Scalar::Float(1.5)), Ok(1_500));
        assert_eq!(
            instant(Scalar::Str("2026-11-25T10:00:00.250Z".into())),
            Ok(1_795_600_800_250)
        );
        assert_eq!(
            instant(Scalar::Str("2026-11-25T11:00:00+01:00".into())),
            Ok(1_795_600_800_000)
        );
        for bad in [
            Scalar::Int(-1),
            Scalar::Int(1_800_000_000_000),
            Scalar::Float(f64::NAN),
            Scalar::Str("tomorrow".into()),
            Scalar::Str("1969-12-31T23:59:59Z".into()),
            Scalar::Other("a boolean"),
        ] {
            assert!(instant(bad).is_err());
        }
    }

    #[test]
    fn totals_are_whole_and_positive() {
        assert_eq!(total_devices(Scalar::Int(5)), Ok(5));
        assert!(total_devices(Scalar::Int(0)).is_err());
        assert!(total_devices(Scalar::Int(i128::from(u64::MAX))).is_err());
        assert!(total_devices(Scalar::Float(2.5)).is_err());
        assert!(total_devices(Scalar::Str("5".into())).is_err());
    }

    #[test]
    fn a_window_must_not_be_empty() {
        let l = Lifecycle {
            not_before_ms: Some(2_000),
            expires_at_ms: Some(2_000),
            campaign_total_devices: None,
        };
        assert_eq!(l.check().unwrap_err().0, "expires_at");
        let mut out = Vec::new();
        Lifecycle {
            not_before_ms: Some(1_500),
            expires_at_ms: Some(3_000),
            campaign_total_devices: Some(7),
        }
        .write_json(&mut out);
        assert_eq!(
            String::from_utf8(out).unwrap(),
            ",\"not_before\":1.500,\"expires_at\":3,\"campaign_total_devices\":7"
        );
    }
}
