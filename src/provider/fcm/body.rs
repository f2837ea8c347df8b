//! The `messages:send` body for one device, written in one buffer:
//! `{"message":{"token":"<device>",<the payload object's members>[,"android":{...}]}}`.
//!
//! The job's payload is the raw text of a JSON object (the fields of `message` other
//! than `token`); its members are spliced in verbatim, not re-serialised. The job's
//! delivery options become `android.priority` (HIGH/NORMAL: the job's priority, else its
//! campaign class's), `android.ttl` ("Ns", from `ttl_s` or else `expiration`) and
//! `android.collapse_key`, but only when the payload has no `android` object of its own:
//! a producer's `android` block is left exactly as it is (the options do not override or
//! merge into it).

use crate::job::{Priority, PushOptions};
use bytes::Bytes;
use serde::de::IgnoredAny;
use serde::Deserialize;
use serde_json::value::RawValue;

/// Why a body cannot be built (the payload is not an object: job validation rejects
/// that for FCM jobs, so it means a producer bypassed it).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the FCM payload must be a JSON object (the fields of `message`)")]
pub struct NotAnObject;

/// Only whether the payload has a top-level `android` member.
#[derive(Deserialize)]
struct AndroidProbe {
    #[serde(default)]
    android: Option<IgnoredAny>,
}

/// Builds the body for `device`. `priority` is the job's push priority
/// ([`crate::job::Job::push_priority`]: its own, else its class's); `now_unix` turns an
/// `expiration` into a TTL.
pub fn build(
    device: &str,
    payload: &RawValue,
    options: &PushOptions,
    priority: Option<Priority>,
    now_unix: i64,
) -> Result<Bytes, NotAnObject> {
    let text = payload.get();
    let (open, close) = match (text.find('{'), text.rfind('}')) {
        (Some(o), Some(c)) if o < c && text[..o].trim().is_empty() => (o, c),
        _ => return Err(NotAnObject),
    };
    let inner = text[open + 1..close].trim();
    let android = android_fields(text, options, priority, now_unix);
    let extra = if android.is_some() { 96 } else { 0 };
    let mut out = Vec::with_capacity(32 + device.len() + inner.len() + extra);
    out.extend_from_slice(b"{\"message\":{\"token\":");
    crate::job::write_json_str(&mut out, device);
    if !inner.is_empty() {
        out.push(b',');
        out.extend_from_slice(inner.as_bytes());
    }
    if let Some(fields) = android {
        fields.write(&mut out);
    }
    out.extend_from_slice(b"}}");
    Ok(Bytes::from(out))
}

/// The `android` fields the options give.
struct AndroidFields<'a> {
    priority: Option<Priority>,
    ttl_s: Option<i64>,
    collapse_key: Option<&'a str>,
}

impl AndroidFields<'_> {
    /// Appends `,"android":{...}`.
    fn write(&self, out: &mut Vec<u8>) {
        use std::io::Write;
        out.extend_from_slice(b",\"android\":{");
        let mut sep = "";
        if let Some(p) = self.priority {
            out.extend_from_slice(match p {
                Priority::High => b"\"priority\":\"HIGH\"",
                Priority::Normal | Priority::Low => b"\"priority\":\"NORMAL\"",
            });
            sep = ",";
        }
        if let Some(t) = self.ttl_s {
            // Writing into a Vec cannot fail.
            let _ = write!(out, "{sep}\"ttl\":\"{t}s\"");
            sep = ",";
        }
        if let Some(c) = self.collapse_key {
            out.extend_from_slice(sep.as_bytes());
            out.extend_from_slice(b"\"collapse_key\":");
            crate::job::write_json_str(out, c);
        }
        out.push(b'}');
    }
}

/// The options' `android` fields, when there are any and the payload has no `android`
/// of its own.
fn android_fields<'a>(
    payload: &str,
    options: &'a PushOptions,
    priority: Option<Priority>,
    now_unix: i64,
) -> Option<AndroidFields<'a>> {
    let ttl_s = options
        .ttl_s
        .map(i64::from)
        .or_else(|| options.expiration.map(|at| (at - now_unix).max(0)));
    if priority.is_none() && ttl_s.is_none() && options.collapse_id.is_none() {
        return None;
    }
    // Only parsed when there are options: most jobs never pay for it.
    let has_own = serde_json::from_str::<AndroidProbe>(payload)
        .map(|p| p.android.is_some())
        .unwrap_or(false);
    (!has_own).then_some(AndroidFields {
        priority,
        ttl_s,
        collapse_key: options.collapse_id.as_deref(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn raw(s: &str) -> Box<RawValue> {
        RawValue::from_string(s.to_string()).expect("raw")
    }

    fn parsed(b: &Bytes) -> Value {
        serde_json::from_slice(b).expect("valid JSON body")
    }

    #[test]
    fn splices_the_payload_after_the_token() {
        let p = raw(r#" { "notification": {"title": "hi"}, "data": {"k": "v"} } "#);
        let b = build("tok\"1", &p, &PushOptions::default(), None, 0).expect("body");
        let v = parsed(&b);
        assert_eq!(v["message"]["token"], "tok\"1");
        assert_eq!(v["message"]["notification"]["title"], "hi");
        assert_eq!(v["message"]["data"]["k"], "v");
        assert!(v["message"].get("android").is_none());
    }

    #[test]
    fn empty_object_and_non_objects() {
        let b = build("t", &raw("{ }"), &PushOptions::default(), None, 0).expect("body");
        assert_eq!(&b[..], br#"{"message":{"token":"t"}}"#);
        assert_eq!(
            build("t", &raw("[1]"), &PushOptions::default(), None, 0),
            Err(NotAnObject)
        );
        assert_eq!(
            build("t", &raw("\"{}\""), &PushOptions::default(), None, 0),
            Err(NotAnObject)
        );
    }

    #[test]
    fn options_become_android_fields() {
        let opts = PushOptions {
            priority: Some(Priority::High),
            collapse_id: Some("news\"x".into()),
            expiration: Some(1_000_100),
            ..Default::default()
        };
        let b = build(
            "t",
            &raw(r#"{"data":{"a":"1"}}"#),
            &opts,
            opts.priority,
            1_000_000,
        )
        .expect("body");
        let v = parsed(&b);
        let a = &v["message"]["android"];
        assert_eq!(a["priority"], "HIGH");
        assert_eq!(a["ttl"], "100s");
        assert_eq!(a["collapse_key"], "news\"x");
        // ttl_s wins over expiration; Low is NORMAL.
        let opts = PushOptions {
            priority: Some(Priority::Low),
            ttl_s: Some(0),
            expiration: Some(5),
            ..Default::default()
        };
        let v = parsed(&build("t", &raw("{}"), &opts, opts.priority, 0).expect("body"));
        assert_eq!(v["message"]["android"]["priority"], "NORMAL");
        assert_eq!(v["message"]["android"]["ttl"], "0s");
    }

    #[test]
    fn the_producers_android_block_is_left_alone() {
        let opts = PushOptions {
            priority: Some(Priority::High),
            ttl_s: Some(60),
            ..Default::default()
        };
        let p = raw(r#"{"android":{"priority":"NORMAL"},"data":{"a":"1"}}"#);
        let v = parsed(&build("t", &p, &opts, opts.priority, 0).expect("body"));
        assert_eq!(
            v["message"]["android"],
            serde_json::json!({"priority": "NORMAL"})
        );
        // A nested "android" key is not the message's own block.
        let p = raw(r#"{"data":{"android":"x"}}"#);
        let v = parsed(&build("t", &p, &opts, opts.priority, 0).expect("body"));
        assert_eq!(v["message"]["android"]["ttl"], "60s");
    }

    /// The body as the adapter builds it for `job`'s first device.
    fn for_job(job: &crate::job::Job) -> Bytes {
        build(
            &job.devices[0],
            &job.payload,
            &job.options,
            job.push_priority(),
            0,
        )
        .expect("body")
    }

    #[test]
    fn the_campaign_class_priority_counts_as_an_option() {
        let text = br#"{"job_id":"j","campaign_id":"c","devices":["t"],"payload":{}}"#;
        let mut job = crate::job::decode(text).expect("job");
        // No option and no class: the body is unchanged, no `android` block.
        assert_eq!(&for_job(&job)[..], br#"{"message":{"token":"t"}}"#);
        // The class alone gives the block.
        job.class_priority.set(Some(Priority::High));
        assert_eq!(
            &for_job(&job)[..],
            br#"{"message":{"token":"t","android":{"priority":"HIGH"}}}"#
        );
        job.class_priority.set(Some(Priority::Normal));
        let v = parsed(&for_job(&job));
        assert_eq!(v["message"]["android"]["priority"], "NORMAL");
        // The job's own priority wins over its class's.
        job.options.priority = Some(Priority::High);
        let v = parsed(&for_job(&job));
        assert_eq!(v["message"]["android"]["priority"], "HIGH");
        // A producer's own `android` block wins over both.
        job.payload = raw(r#"{"android":{"ttl":"5s"}}"#);
        let v = parsed(&for_job(&job));
        assert_eq!(v["message"]["android"], serde_json::json!({"ttl": "5s"}));
    }
}
