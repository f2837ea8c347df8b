//! The body of `PUT /api/campaigns/{id}`: each field checked with the store's own
//! rules, so a bad value is a 422 naming its field before any SQL runs.

use crate::api::error::ApiError;
use crate::api::lifecycle;
use crate::limiter::Algorithm;
use crate::store::campaigns::{self, CampaignPatch};

/// Reads a `PUT /api/campaigns/{id}` body, naming the field at fault.
pub fn parse_patch(body: &[u8]) -> Result<CampaignPatch, ApiError> {
    let value: serde_json::Value = if body.iter().all(u8::is_ascii_whitespace) {
        serde_json::Value::Object(Default::default())
    } else {
        serde_json::from_slice(body)
            .map_err(|e| ApiError::invalid("body", format!("not valid JSON: {e}")))?
    };
    let serde_json::Value::Object(fields) = value else {
        return Err(ApiError::invalid(
            "body",
            "must be a JSON object such as {\"send_rate\": 750}",
        ));
    };
    let mut patch = CampaignPatch::default();
    for (name, v) in fields {
        match name.as_str() {
            "send_rate" => {
                let rate = v.as_f64().ok_or_else(|| {
                    ApiError::invalid("send_rate", format!("must be a number, got {v}"))
                })?;
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
                let scope = match &v {
                    serde_json::Value::Null => None,
                    serde_json::Value::String(name) => {
                        Some(campaigns::validate_limiter_scope(name)?)
                    }
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
                let weight = v.as_f64().ok_or_else(|| {
                    ApiError::invalid("weight", format!("must be a number, got {v}"))
                })?;
                campaigns::validate_weight(weight)?;
                patch.weight = Some(weight);
            }
            "start_at" => patch.start_at = Some(lifecycle::instant_field("start_at", &v)?),
            "expires_at" => patch.expires_at = Some(lifecycle::instant_field("expires_at", &v)?),
            other => {
                return Err(ApiError::invalid(
                    other,
                    "unknown field; expected send_rate, algorithm, burst, limiter_scope, \
                     weight, start_at or expires_at",
                ))
            }
        }
    }
    Ok(patch)
}
