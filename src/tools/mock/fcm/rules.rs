//! The FCM mock's rules for a `messages:send` body: `{"message": {...}}` with exactly
//! one target (a `token`), known fields only, `data` values all strings, `android.ttl`
//! and `android.priority` in FCM's forms, at most 4096 bytes.

use super::MAX_MESSAGE_BYTES;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The fields `message` may have.
const MESSAGE_FIELDS: [&str; 10] = [
    "name",
    "token",
    "topic",
    "condition",
    "data",
    "notification",
    "android",
    "webpush",
    "apns",
    "fcm_options",
];

/// Checks a `messages:send` body; the message and its token, or the 400 answer.
pub(super) fn check_body(body: &[u8]) -> Result<(Map<String, Value>, String), Refusal> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Envelope<'a> {
        #[serde(borrow)]
        message: &'a serde_json::value::RawValue,
        #[serde(default)]
        #[allow(dead_code)]
        validate_only: bool,
    }
    let envelope: Envelope = serde_json::from_slice(body)
        .map_err(|e| refusal(&format!("Invalid JSON payload received. {e}"), ""))?;
    if envelope.message.get().len() > MAX_MESSAGE_BYTES {
        return Err(refusal("Message is too big", "message"));
    }
    let message: Map<String, Value> = serde_json::from_str(envelope.message.get())
        .map_err(|_| refusal("message must be an object", "message"))?;
    if let Some(unknown) = message
        .keys()
        .find(|k| !MESSAGE_FIELDS.contains(&k.as_str()))
    {
        let text = format!("Invalid JSON payload received. Unknown name {unknown:?} at 'message'");
        return Err(refusal(&text, "message"));
    }
    let targets = ["token", "topic", "condition"]
        .iter()
        .filter(|t| message.contains_key(**t))
        .count();
    let token = match message.get("token") {
        Some(Value::String(t)) if targets == 1 && !t.is_empty() => t.clone(),
        _ => {
            return Err(refusal(
                "The message must have exactly one target: a non-empty token",
                "message.token",
            ))
        }
    };
    check_data(message.get("data"))?;
    check_android(message.get("android"))?;
    Ok((message, token))
}

/// `data` is a map of strings.
fn check_data(data: Option<&Value>) -> Result<(), Refusal> {
    let Some(data) = data else { return Ok(()) };
    let Some(map) = data.as_object() else {
        return Err(refusal("data must be an object", "message.data"));
    };
    match map.iter().position(|(_, v)| !v.is_string()) {
        None => Ok(()),
        Some(i) => {
            let field = format!("message.data[{i}].value");
            let text = format!("Invalid value at '{field}' (TYPE_STRING)");
            Err(refusal(&text, &field))
        }
    }
}

/// `android.priority` and `android.ttl` in FCM's forms.
fn check_android(android: Option<&Value>) -> Result<(), Refusal> {
    let Some(android) = android else {
        return Ok(());
    };
    let Some(a) = android.as_object() else {
        return Err(refusal("android must be an object", "message.android"));
    };
    if let Some(p) = a.get("priority") {
        if p != "HIGH" && p != "NORMAL" {
            return Err(refusal("Invalid priority", "message.android.priority"));
        }
    }
    if let Some(ttl) = a.get("ttl") {
        let ok = ttl
            .as_str()
            .and_then(|t| t.strip_suffix('s'))
            .is_some_and(|n| !n.is_empty() && n.parse::<f64>().is_ok_and(|x| x >= 0.0));
        if !ok {
            return Err(refusal("Invalid duration", "message.android.ttl"));
        }
    }
    if a.get("collapse_key").is_some_and(|c| !c.is_string()) {
        return Err(refusal(
            "Invalid collapse_key",
            "message.android.collapse_key",
        ));
    }
    Ok(())
}

/// Why a body is refused: 400 INVALID_ARGUMENT with a field violation on `field`.
pub(super) struct Refusal {
    pub(super) message: String,
    pub(super) field: String,
}

fn refusal(message: &str, field: &str) -> Refusal {
    Refusal {
        message: message.to_string(),
        field: field.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(r: Result<(Map<String, Value>, String), Refusal>) -> u16 {
        match r {
            Ok(_) => 200,
            Err(r) => {
                assert!(!r.message.is_empty());
                400
            }
        }
    }

    #[test]
    fn body_rules() {
        let ok = br#"{"message":{"token":"t","data":{"a":"1"},"android":{"ttl":"60s","priority":"HIGH"}}}"#;
        assert_eq!(status(check_body(ok)), 200);
        let bad = [
            &br#"{"message":{"token":"t","data":{"a":1}}}"#[..],
            br#"{"message":{"topic":"x"}}"#,
            br#"{"message":{"token":"t","topic":"x"}}"#,
            br#"{"message":{"token":"t","bogus":1}}"#,
            br#"{"message":{"token":"t"},"extra":1}"#,
            br#"{"message":{"token":"t","android":{"ttl":"60"}}}"#,
            br#"{"message":{"token":"t","android":{"priority":"high"}}}"#,
        ];
        for b in bad {
            assert_eq!(status(check_body(b)), 400, "{}", String::from_utf8_lossy(b));
        }
        let big = format!(
            r#"{{"message":{{"token":"t","data":{{"a":"{}"}}}}}}"#,
            "x".repeat(4100)
        );
        assert_eq!(status(check_body(big.as_bytes())), 400);
    }
}
