//! Retry timing: exponential backoff with full jitter, never sooner than Retry-After.

use std::time::{Duration, SystemTime};

/// The longest Retry-After honoured. A provider asking for more is still retried after
/// a day, so a bad header cannot park a device for years.
pub const MAX_RETRY_AFTER: Duration = Duration::from_secs(24 * 3600);

/// The upper bound of the jittered delay before retry number `attempt` (1 for the first
/// retry): `base × 2^(attempt−1)`, capped at `max`.
pub fn backoff_ceiling(attempt: u32, base: Duration, max: Duration) -> Duration {
    let doublings = attempt.saturating_sub(1).min(63);
    let factor = 1u64 << doublings;
    let nanos = (base.as_nanos() as u64).saturating_mul(factor);
    Duration::from_nanos(nanos).min(max)
}

/// The delay before retry number `attempt` (1 for the first retry): uniformly random in
/// `[0, backoff_ceiling]` ("full jitter", so that retries of many devices spread out),
/// and never less than the provider's `retry_after`.
pub fn retry_delay(
    attempt: u32,
    retry_after: Option<Duration>,
    base: Duration,
    max: Duration,
) -> Duration {
    let ceiling = backoff_ceiling(attempt, base, max).as_nanos() as u64;
    let jittered = Duration::from_nanos(fastrand::u64(0..=ceiling));
    match retry_after {
        Some(floor) => jittered.max(floor.min(MAX_RETRY_AFTER)),
        None => jittered,
    }
}

/// Parses a Retry-After header value: delay-seconds or an HTTP-date (RFC 9110 §10.2.3),
/// relative to `now`. A date in the past means "now" (zero); garbage means no hint.
pub fn parse_retry_after(value: &str, now: SystemTime) -> Option<Duration> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        // Too many digits for a u64 is still "a very long time".
        let secs = value.parse::<u64>().unwrap_or(u64::MAX);
        return Some(Duration::from_secs(secs).min(MAX_RETRY_AFTER));
    }
    let at = httpdate::parse_http_date(value).ok()?;
    Some(
        at.duration_since(now)
            .unwrap_or(Duration::ZERO)
            .min(MAX_RETRY_AFTER),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ceiling_doubles_and_caps() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        assert_eq!(backoff_ceiling(0, base, max), base);
        assert_eq!(backoff_ceiling(1, base, max), base);
        assert_eq!(backoff_ceiling(2, base, max), base * 2);
        assert_eq!(backoff_ceiling(4, base, max), base * 8);
        assert_eq!(backoff_ceiling(7, base, max), max);
        assert_eq!(backoff_ceiling(u32::MAX, base, max), max);
    }

    #[test]
    fn delay_stays_in_bounds_and_honours_retry_after() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        for attempt in 1..20 {
            for _ in 0..200 {
                let d = retry_delay(attempt, None, base, max);
                assert!(d <= backoff_ceiling(attempt, base, max));
                let floor = Duration::from_secs(7);
                let d = retry_delay(attempt, Some(floor), base, max);
                assert!(d >= floor && d <= floor.max(max));
            }
        }
    }

    #[test]
    fn delay_is_jittered() {
        let base = Duration::from_millis(100);
        let max = Duration::from_secs(5);
        let samples: std::collections::HashSet<_> =
            (0..50).map(|_| retry_delay(5, None, base, max)).collect();
        assert!(samples.len() > 10, "{samples:?}");
    }

    #[test]
    fn parses_both_retry_after_forms() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_700_000_000);
        assert_eq!(parse_retry_after("7", now), Some(Duration::from_secs(7)));
        assert_eq!(parse_retry_after(" 0 ", now), Some(Duration::ZERO));
        assert_eq!(
            parse_retry_after("99999999999999999999999", now),
            Some(MAX_RETRY_AFTER)
        );
        let later = httpdate::fmt_http_date(now + Duration::from_secs(30));
        assert_eq!(
            parse_retry_after(&later, now),
            Some(Duration::from_secs(30))
        );
        let earlier = httpdate::fmt_http_date(now - Duration::from_secs(30));
        assert_eq!(parse_retry_after(&earlier, now), Some(Duration::ZERO));
        assert_eq!(parse_retry_after("soon", now), None);
        assert_eq!(parse_retry_after("-5", now), None);
        assert_eq!(parse_retry_after("", now), None);
    }
}
