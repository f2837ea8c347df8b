//! The checks a campaign's values pass before any SQL runs, each error naming its
//! field; the schema's CHECK constraints are the backstop.

use crate::job::policy::{MAX_RAMP_UP_S, MIN_RAMP_FROM};
use crate::job::PriorityClass;
use crate::limiter::LimiterScope;
use crate::limiter::Rate;
use crate::store::StoreError;
use chrono::{DateTime, Utc};

/// Longest campaign id, in characters (the job format's rule).
pub const MAX_ID_CHARS: usize = crate::job::MAX_ID_CHARS;
/// The largest burst: permits a limiter may release above its smooth spacing. Beyond
/// this a campaign's burst swamps its rate and the limiter no longer limits.
pub const MAX_BURST: u32 = 10_000;
/// The smallest and largest campaign weight.
pub const MIN_WEIGHT: f64 = 0.01;
pub const MAX_WEIGHT: f64 = 100.0;

/// Checks a weight: [`MIN_WEIGHT`] to [`MAX_WEIGHT`].
pub fn validate_weight(weight: f64) -> Result<f64, StoreError> {
    if (MIN_WEIGHT..=MAX_WEIGHT).contains(&weight) {
        Ok(weight)
    } else {
        Err(StoreError::invalid(
            "weight",
            format!("must be from {MIN_WEIGHT} to {MAX_WEIGHT}, got {weight}"),
        ))
    }
}
/// Checks a campaign id with the job format's rule: 1–128 characters from
/// `[A-Za-z0-9._:-]` (so every id the API takes is one a job can name).
pub fn validate_id(id: &str) -> Result<(), StoreError> {
    crate::job::check_id("id", id).map_err(|e| match e {
        crate::job::JobError::Field { problem, .. } => StoreError::invalid("id", problem),
        other => StoreError::invalid("id", other.to_string()),
    })
}

/// Checks a send rate with the same rules as [`Rate::per_second`].
pub fn validate_send_rate(send_rate: f64) -> Result<Rate, StoreError> {
    Rate::per_second(send_rate).map_err(|e| StoreError::invalid("send_rate", e.to_string()))
}

/// Checks a limiter scope name; `null` (the configured default) is handled by the caller.
pub fn validate_limiter_scope(name: &str) -> Result<LimiterScope, StoreError> {
    name.parse::<LimiterScope>()
        .map_err(|e| StoreError::invalid("limiter_scope", e.to_string()))
}

/// Checks a priority class name: critical, high, normal or bulk.
pub fn validate_priority(name: &str) -> Result<PriorityClass, StoreError> {
    name.parse::<PriorityClass>()
        .map_err(|e| StoreError::invalid("priority", e.to_string()))
}

/// Checks a ramp-up: 0 (none) to [`MAX_RAMP_UP_S`] seconds.
pub fn validate_ramp_up_s(seconds: f64) -> Result<f64, StoreError> {
    if (0.0..=MAX_RAMP_UP_S).contains(&seconds) {
        Ok(seconds)
    } else {
        Err(StoreError::invalid(
            "ramp_up_s",
            format!("must be from 0 to {MAX_RAMP_UP_S} seconds, got {seconds}"),
        ))
    }
}

/// Checks where a ramp starts: [`MIN_RAMP_FROM`] to 1 (the full rate).
pub fn validate_ramp_from(fraction: f64) -> Result<f64, StoreError> {
    if (MIN_RAMP_FROM..=1.0).contains(&fraction) {
        Ok(fraction)
    } else {
        Err(StoreError::invalid(
            "ramp_from",
            format!(
                "must be a fraction of the full rate from {MIN_RAMP_FROM} to 1, got {fraction}"
            ),
        ))
    }
}

/// Checks a deadline given now: one already past cannot be planned for. The store
/// itself keeps any (a deadline that passes while the campaign runs stays stored).
pub fn validate_finish_by(
    finish_by: DateTime<Utc>,
    now: DateTime<Utc>,
) -> Result<DateTime<Utc>, StoreError> {
    if finish_by > now {
        Ok(finish_by)
    } else {
        Err(StoreError::invalid(
            "finish_by",
            format!(
                "finish_by is in the past ({}); it must be later than now",
                finish_by.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
            ),
        ))
    }
}

/// Checks a burst: 0 to [`MAX_BURST`].
pub fn validate_burst(burst: i64) -> Result<i32, StoreError> {
    if !(0..=i64::from(MAX_BURST)).contains(&burst) {
        return Err(StoreError::invalid(
            "burst",
            format!("must be a whole number from 0 to {MAX_BURST}, got {burst}"),
        ));
    }
    // MAX_BURST fits an i32 (the column is an `integer`).
    Ok(burst as i32)
}
/// The longest actor name recorded in `campaign_events`.
pub const MAX_ACTOR_CHARS: usize = 64;

/// Checks an actor name: 1–64 characters from `[A-Za-z0-9._:@-]`.
pub fn validate_actor(actor: &str) -> Result<(), StoreError> {
    let ok = !actor.is_empty()
        && actor.chars().count() <= MAX_ACTOR_CHARS
        && actor
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._:@-".contains(c));
    if ok {
        Ok(())
    } else {
        Err(StoreError::invalid(
            "actor",
            format!("must be 1–{MAX_ACTOR_CHARS} characters from [A-Za-z0-9._:@-]"),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn validation_names_the_field() {
        assert_eq!(validate_id("").unwrap_err().field(), Some("id"));
        assert_eq!(
            validate_id(&"x".repeat(200)).unwrap_err().field(),
            Some("id")
        );
        assert!(validate_id(&"x".repeat(128)).is_ok());
        assert!(validate_id("Spring.sale_2026:v-1").is_ok());
        for bad in ["é", "a b", "a/b", "nul\0", "a%20b"] {
            let e = validate_id(bad).unwrap_err();
            assert_eq!(e.field(), Some("id"), "{bad}");
            assert!(
                e.to_string().contains("[A-Za-z0-9._:-]") || e.to_string().contains("only A-Z"),
                "{e}"
            );
        }
        for bad in [0.0, -1.0, 1e-300, 0.000_5, 1e12, f64::NAN, f64::INFINITY] {
            assert_eq!(
                validate_send_rate(bad).unwrap_err().field(),
                Some("send_rate")
            );
        }
        assert_eq!(validate_burst(-1).unwrap_err().field(), Some("burst"));
        assert_eq!(validate_burst(1 << 40).unwrap_err().field(), Some("burst"));
        assert_eq!(validate_burst(5).ok(), Some(5));
        assert_eq!(validate_burst(10_000).ok(), Some(10_000));
        assert_eq!(validate_burst(10_001).unwrap_err().field(), Some("burst"));
        assert_eq!(
            validate_burst(i64::from(i32::MAX)).unwrap_err().field(),
            Some("burst")
        );
        assert_eq!(
            validate_limiter_scope("global").unwrap_err().field(),
            Some("limiter_scope")
        );
        assert_eq!(
            validate_limiter_scope("redis").ok(),
            Some(LimiterScope::Redis)
        );
    }

    #[test]
    fn policy_values_are_bounded_and_name_their_field() {
        for bad in ["urgent", "", "Critical", "normal "] {
            let e = validate_priority(bad).unwrap_err();
            assert_eq!(e.field(), Some("priority"), "{bad}");
            assert!(
                e.to_string().contains("critical, high, normal, bulk"),
                "{e}"
            );
        }
        for c in PriorityClass::ALL {
            assert_eq!(validate_priority(c.as_str()).ok(), Some(c));
        }
        for bad in [-0.5, 86_400.5, f64::NAN, f64::INFINITY] {
            let e = validate_ramp_up_s(bad).unwrap_err();
            assert_eq!(e.field(), Some("ramp_up_s"), "{bad}");
        }
        assert_eq!(validate_ramp_up_s(0.0).ok(), Some(0.0));
        assert_eq!(validate_ramp_up_s(86_400.0).ok(), Some(86_400.0));
        for bad in [0.0, 0.009, 1.01, -1.0, f64::NAN] {
            let e = validate_ramp_from(bad).unwrap_err();
            assert_eq!(e.field(), Some("ramp_from"), "{bad}");
        }
        assert_eq!(validate_ramp_from(0.01).ok(), Some(0.01));
        assert_eq!(validate_ramp_from(1.0).ok(), Some(1.0));
        let now = Utc::now();
        let e = validate_finish_by(now - chrono::Duration::seconds(1), now).unwrap_err();
        assert_eq!(e.field(), Some("finish_by"));
        assert!(e.to_string().contains("finish_by is in the past"), "{e}");
        assert!(validate_finish_by(now, now).is_err(), "now is not ahead");
        let later = now + chrono::Duration::hours(2);
        assert_eq!(validate_finish_by(later, now).ok(), Some(later));
    }
}
