//! The body of `PUT /api/campaigns/{id}`: each field checked with the store's own
//! rules, so a bad value is a 422 naming its field before any SQL runs.

use crate::api::error::ApiError;
use crate::api::lifecycle;
use crate::job::window::{parse_local_time, LatePolicy, SendWindow, WindowError};
use crate::limiter::Algorithm;
use crate::store::campaigns::{self, CampaignPatch};
use chrono::{DateTime, Utc};
use serde_json::Value;

/// Every field a PUT may name.
const FIELDS: &str = "send_rate, algorithm, burst, limiter_scope, weight, start_at, \
                      expires_at, priority, ramp_up_s, ramp_from, finish_by, send_window, \
                      deliver_at_local or late_policy";

/// Reads a `PUT /api/campaigns/{id}` body, naming the field at fault.
pub fn parse_patch(body: &[u8]) -> Result<CampaignPatch, ApiError> {
    parse_patch_at(body, Utc::now())
}

/// [`parse_patch`] with `now` for the `finish_by` check.
fn parse_patch_at(body: &[u8], now: DateTime<Utc>) -> Result<CampaignPatch, ApiError> {
    let value: Value = if body.iter().all(u8::is_ascii_whitespace) {
        Value::Object(Default::default())
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid("body", format!("not valid JSON: {e}")))?
    };
    let Value::Object(fields) = value else {
        return Err(ApiError::invalid(
            "body",
            "must be a JSON object such as {\"send_rate\": 750}",
        ));
    };
    let mut patch = CampaignPatch::default();
    for (name, v) in fields {
        if !rate_field(&mut patch, &name, &v)? && !policy_field(&mut patch, &name, &v, now)? {
            return Err(ApiError::invalid(
                name,
                format!("unknown field; expected {FIELDS}"),
            ));
        }
    }
    Ok(patch)
}

fn number(field: &'static str, v: &Value) -> Result<f64, ApiError> {
    v.as_f64()
        .ok_or_else(|| ApiError::invalid(field, format!("must be a number, got {v}")))
}

/// The rate, its limiter and the campaign's start and expiry; `false`: not one of them.
fn rate_field(patch: &mut CampaignPatch, name: &str, v: &Value) -> Result<bool, ApiError> {
    match name {
        "send_rate" => {
            let rate = number("send_rate", v)?;
            campaigns::validate_send_rate(rate)?;
            patch.send_rate = Some(rate);
        }
        "algorithm" => {
            let name = v.as_str().ok_or_else(|| {
                ApiError::invalid("algorithm", format!("must be a string, got {v}"))
            })?;
            let algorithm = name
                .parse::<Algorithm>()
                .map_err(|e| ApiError::invalid("algorithm", e.to_string()))?;
            patch.algorithm = Some(algorithm);
        }
        "burst" => {
            let burst = v.as_i64().ok_or_else(|| {
                ApiError::invalid("burst", format!("must be a whole number, got {v}"))
            })?;
            campaigns::validate_burst(burst)?;
            patch.burst = Some(burst);
        }
        "limiter_scope" => {
            // null: back to the configured limiter.scope.
            let scope = match v {
                Value::Null => None,
                Value::String(name) => Some(campaigns::validate_limiter_scope(name)?),
                _ => {
                    return Err(ApiError::invalid(
                        "limiter_scope",
                        format!("must be \"local\", \"redis\" or null, got {v}"),
                    ))
                }
            };
            patch.limiter_scope = Some(scope);
        }
        "weight" => {
            let weight = number("weight", v)?;
            campaigns::validate_weight(weight)?;
            patch.weight = Some(weight);
        }
        "start_at" => patch.start_at = Some(lifecycle::instant_field("start_at", v)?),
        "expires_at" => patch.expires_at = Some(lifecycle::instant_field("expires_at", v)?),
        _ => return Ok(false),
    }
    Ok(true)
}

/// The delivery policy: class, ramp-up and deadline; `false`: not one of them. `null`
/// sets a ramp value back to the configured `[limiter]` default, and clears a deadline.
fn policy_field(
    patch: &mut CampaignPatch,
    name: &str,
    v: &Value,
    now: DateTime<Utc>,
) -> Result<bool, ApiError> {
    match name {
        "priority" => {
            let class = v.as_str().ok_or_else(|| {
                ApiError::invalid(
                    "priority",
                    format!("must be one of \"critical\", \"high\", \"normal\", \"bulk\", got {v}"),
                )
            })?;
            patch.priority = Some(campaigns::validate_priority(class)?);
        }
        "ramp_up_s" => {
            let s = nullable_number("ramp_up_s", v)?;
            patch.ramp_up_s = Some(s.map(campaigns::validate_ramp_up_s).transpose()?);
        }
        "ramp_from" => {
            let f = nullable_number("ramp_from", v)?;
            patch.ramp_from = Some(f.map(campaigns::validate_ramp_from).transpose()?);
        }
        "finish_by" => {
            let t = lifecycle::instant_field("finish_by", v)?;
            let t = t
                .map(|t| campaigns::validate_finish_by(t, now))
                .transpose()?;
            patch.finish_by = Some(t);
        }
        _ => return local_field(patch, name, v),
    }
    Ok(true)
}

/// The recipients' local-time rules: `null` clears a window or a deliver time. How
/// they fit together (a deliver time inside the window) is checked with the stored ones.
fn local_field(patch: &mut CampaignPatch, name: &str, v: &Value) -> Result<bool, ApiError> {
    let bad = |e: WindowError| ApiError::invalid(e.field, e.problem);
    match name {
        "send_window" => {
            let w = match v {
                Value::Null => None,
                _ => Some(SendWindow::parse_json(v).map_err(bad)?),
            };
            patch.send_window = Some(w);
        }
        "deliver_at_local" => {
            let at = match v {
                Value::Null => None,
                Value::String(s) => Some(
                    parse_local_time(s).map_err(|p| ApiError::invalid("deliver_at_local", p))?,
                ),
                _ => {
                    return Err(ApiError::invalid(
                        "deliver_at_local",
                        format!("must be a local time \"HH:MM\" or null, got {v}"),
                    ))
                }
            };
            patch.deliver_at_local = Some(at);
        }
        "late_policy" => {
            let p = v
                .as_str()
                .ok_or_else(|| {
                    ApiError::invalid(
                        "late_policy",
                        format!("must be \"send_now\", \"next_window\" or \"skip\", got {v}"),
                    )
                })?
                .parse::<LatePolicy>()
                .map_err(|p| ApiError::invalid("late_policy", p))?;
            patch.late_policy = Some(p);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

fn nullable_number(field: &'static str, v: &Value) -> Result<Option<f64>, ApiError> {
    match v {
        Value::Null => Ok(None),
        _ => v
            .as_f64()
            .map(Some)
            .ok_or_else(|| ApiError::invalid(field, format!("must be a number or null, got {v}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::PriorityClass;

    fn field_of(body: &str, now: DateTime<Utc>) -> Option<String> {
        match parse_patch_at(body.as_bytes(), now) {
            Err(ApiError::Invalid { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn policy_fields_parse_and_null_clears() {
        let now = Utc::now();
        let later = now + chrono::Duration::hours(1);
        let body = serde_json::json!({
            "priority": "critical",
            "ramp_up_s": 300,
            "ramp_from": 0.05,
            "finish_by": later.timestamp(),
        })
        .to_string();
        let p = parse_patch_at(body.as_bytes(), now).unwrap();
        assert_eq!(p.priority, Some(PriorityClass::Critical));
        assert_eq!(
            (p.ramp_up_s, p.ramp_from),
            (Some(Some(300.0)), Some(Some(0.05)))
        );
        assert_eq!(
            p.finish_by.flatten().map(|t| t.timestamp()),
            Some(later.timestamp())
        );
        let p = parse_patch_at(
            br#"{"ramp_up_s": null, "ramp_from": null, "finish_by": null}"#,
            now,
        )
        .unwrap();
        assert_eq!(
            (p.ramp_up_s, p.ramp_from, p.finish_by),
            (Some(None), Some(None), Some(None))
        );
        assert_eq!(p.priority, None);
    }

    #[test]
    fn bad_policy_values_name_their_field() {
        let now = Utc::now();
        let past = (now - chrono::Duration::seconds(5)).timestamp();
        for (body, field) in [
            (r#"{"priority": "urgent"}"#.to_string(), "priority"),
            (r#"{"priority": null}"#.into(), "priority"),
            (r#"{"priority": 1}"#.into(), "priority"),
            (r#"{"ramp_up_s": -1}"#.into(), "ramp_up_s"),
            (r#"{"ramp_up_s": 86401}"#.into(), "ramp_up_s"),
            (r#"{"ramp_up_s": "slow"}"#.into(), "ramp_up_s"),
            (r#"{"ramp_from": 0}"#.into(), "ramp_from"),
            (r#"{"ramp_from": 1.5}"#.into(), "ramp_from"),
            (format!(r#"{{"finish_by": {past}}}"#), "finish_by"),
            (r#"{"finish_by": "tonight"}"#.into(), "finish_by"),
            (r#"{"finishby": 1}"#.into(), "finishby"),
            (
                r#"{"send_window": {"from": "21:00", "to": "09:00"}}"#.into(),
                "send_window.to",
            ),
            (r#"{"send_window": "9-5"}"#.into(), "send_window"),
            (
                r#"{"deliver_at_local": "25:00"}"#.into(),
                "deliver_at_local",
            ),
            (r#"{"deliver_at_local": 10}"#.into(), "deliver_at_local"),
            (r#"{"late_policy": "later"}"#.into(), "late_policy"),
        ] {
            assert_eq!(field_of(&body, now).as_deref(), Some(field), "{body}");
        }
    }
}
