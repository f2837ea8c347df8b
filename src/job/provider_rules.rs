//! The rules of each provider kind for a job, checked at intake by
//! [`crate::provider::Providers::resolve`] once the job's provider is known
//! (docs/JOB_FORMAT.md, "Provider rules"). The decoder's own rules hold for every
//! provider; these are the ones a provider adds: its payload size and shape, its token
//! form. Each failure is a [`JobError::Field`] naming the field, so the job is
//! dead-lettered `invalid_job` with a reason a person can act on, before any send.

use super::ProviderKind;
use super::{echo, json_type_name, token_echo, Job, JobError, PushType, Subscription};

/// APNs payload limit, in bytes of JSON.
pub const APNS_MAX_PAYLOAD: usize = 4096;
/// APNs payload limit for `push_type` `voip`.
pub const APNS_VOIP_MAX_PAYLOAD: usize = 5120;
/// FCM limit on the `message` object sent (the payload with `"token":…` added).
pub const FCM_MAX_MESSAGE: usize = 4096;
/// Web Push plaintext limit (RFC 8291: one 4096-byte record less its overhead).
pub const WEBPUSH_MAX_PLAINTEXT: usize = 3993;
/// The webhook's (and the null provider's) payload limit, as before providers.
pub const WEBHOOK_MAX_PAYLOAD: usize = 4096;
/// An APNs device token's length range, in hexadecimal characters.
const APNS_TOKEN_HEX: std::ops::RangeInclusive<usize> = 64..=200;
/// Members of an FCM `message` that pushpace sets or that would target others.
const FCM_RESERVED: [&str; 3] = ["token", "topic", "condition"];

/// Checks `job` against the rules of a provider of `kind`.
pub fn check_for_provider(job: &Job, kind: ProviderKind) -> Result<(), JobError> {
    match kind {
        ProviderKind::Apns => apns(job),
        ProviderKind::Fcm => fcm(job),
        ProviderKind::WebPush => webpush(job),
        ProviderKind::Webhook | ProviderKind::Null => webhook(job),
    }
}

fn field(path: impl Into<String>, problem: impl Into<String>) -> JobError {
    JobError::field_problem(path, problem)
}

fn object_payload(job: &Job, provider: &str) -> Result<(), JobError> {
    if job.payload.get().starts_with('{') {
        return Ok(());
    }
    Err(field(
        "payload",
        format!(
            "must be a JSON object for {provider}, got a string (only Web Push takes plaintext)"
        ),
    ))
}

fn webhook(job: &Job) -> Result<(), JobError> {
    object_payload(job, "the webhook")?;
    let n = job.payload.get().len();
    if n > WEBHOOK_MAX_PAYLOAD {
        return Err(field(
            "payload",
            format!("must be at most {WEBHOOK_MAX_PAYLOAD} bytes of JSON, got {n}"),
        ));
    }
    Ok(())
}

fn apns(job: &Job) -> Result<(), JobError> {
    object_payload(job, "APNs")?;
    let voip = job.options.push_type == Some(PushType::Voip);
    let limit = if voip {
        APNS_VOIP_MAX_PAYLOAD
    } else {
        APNS_MAX_PAYLOAD
    };
    let n = job.payload.get().len();
    if n > limit {
        let which = if voip { " (push_type voip)" } else { "" };
        return Err(field(
            "payload",
            format!("APNs allows at most {limit} bytes of JSON{which}, got {n}"),
        ));
    }
    for (i, token) in job.devices.iter().enumerate() {
        let hex = token.bytes().all(|b| b.is_ascii_hexdigit());
        if !hex || !APNS_TOKEN_HEX.contains(&token.len()) {
            return Err(field(
                format!("devices[{i}]"),
                format!(
                    "an APNs device token is 64–200 hexadecimal characters, got {}",
                    token_echo(token)
                ),
            ));
        }
    }
    Ok(())
}

fn fcm(job: &Job) -> Result<(), JobError> {
    object_payload(job, "FCM")?;
    let raw = job.payload.get();
    let message: serde_json::Map<String, serde_json::Value> = serde_json::from_str(raw)
        .map_err(|e| field("payload", format!("is not a JSON object: {e}")))?;
    if let Some(key) = FCM_RESERVED.iter().find(|k| message.contains_key(**k)) {
        return Err(field(
            format!("payload.{key}"),
            "pushpace adds the device token; an FCM payload must not hold token, topic or condition",
        ));
    }
    match message.get("data") {
        None => {}
        Some(serde_json::Value::Object(data)) => {
            for (k, v) in data {
                if !v.is_string() {
                    return Err(field(
                        data_path(k),
                        format!("FCM data values must be strings, got {}", json_type_name(v)),
                    ));
                }
            }
        }
        Some(other) => {
            return Err(field(
                "payload.data",
                format!(
                    "FCM data must be an object of strings, got {}",
                    json_type_name(other)
                ),
            ))
        }
    }
    for (i, token) in job.devices.iter().enumerate() {
        if Subscription::parse(token).is_some() {
            return Err(field(
                format!("devices[{i}]"),
                "is a Web Push subscription; an FCM provider takes registration tokens",
            ));
        }
    }
    // The message sent is the payload with `"token":"…",` added.
    let longest = job
        .devices
        .iter()
        .map(|t| escaped_len(t))
        .max()
        .unwrap_or(0);
    let n = raw.len() + r#""token":,"#.len() + longest;
    if n > FCM_MAX_MESSAGE {
        return Err(field(
            "payload",
            format!(
                "the FCM message (this payload with the longest device token added) must be at most {FCM_MAX_MESSAGE} bytes, got {n}"
            ),
        ));
    }
    Ok(())
}

/// The path of an FCM data key: `payload.data.count`, or the key escaped when it is long
/// or has characters other than `[A-Za-z0-9_.-]`.
fn data_path(key: &str) -> String {
    let plain = key.len() <= 48
        && !key.is_empty()
        && key
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'));
    if plain {
        format!("payload.data.{key}")
    } else {
        format!("payload.data[{}]", echo(key))
    }
}

/// Length of `s` as a JSON string literal (quotes included).
fn escaped_len(s: &str) -> usize {
    2 + s.len() + s.bytes().filter(|b| matches!(b, b'"' | b'\\')).count()
}

fn webpush(job: &Job) -> Result<(), JobError> {
    let raw = job.payload.get();
    // A JSON string's contents are the plaintext; any other JSON value is its own text.
    let n = if raw.starts_with('"') {
        serde_json::from_str::<std::borrow::Cow<'_, str>>(raw)
            .map_err(|e| field("payload", format!("is not a JSON string: {e}")))?
            .len()
    } else {
        raw.len()
    };
    if n > WEBPUSH_MAX_PLAINTEXT {
        return Err(field(
            "payload",
            format!("Web Push allows at most {WEBPUSH_MAX_PLAINTEXT} bytes of plaintext, got {n}"),
        ));
    }
    for (i, device) in job.devices.iter().enumerate() {
        check_subscription(device).map_err(|p| field(format!("devices[{i}]"), p))?;
    }
    Ok(())
}

/// Checks a Web Push device: a subscription in its stored form whose `p256dh` is an
/// uncompressed P-256 point (65 bytes, 0x04 first) and whose `auth` is 16 bytes, both
/// base64url (padding allowed).
///
/// The shape first (this module's words), then the adapter's own check: https
/// endpoint, base64url keys, a P-256 point and a 16-byte auth secret.
pub fn check_subscription(device: &str) -> Result<(), String> {
    if Subscription::parse(device).is_none() {
        return Err(format!(
            "a Web Push provider needs a subscription object {{\"endpoint\", \"keys\": {{\"p256dh\", \"auth\"}}}}, got {}",
            token_echo(device)
        ));
    }
    super::webpush_subscription::check(device)
}
