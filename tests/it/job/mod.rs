//! Job decoding: the bad-input corpus of issue 7 (each case is dead-lettered with the
//! right kind and a reason naming the field), the limits at their edges, and property
//! tests (valid jobs round-trip; arbitrary bytes never panic); and, against the real
//! broker, that the message key plays no part. The provider fields, subscription
//! devices and each provider kind's rules are in [`providers`].

mod corpus;
mod properties;
mod providers;

use crate::harness::{job_at, Producer, Record, TestWorker};
use crate::helpers::{unique_name, wait_for};
use pushpace::job::{
    decode, Job, JobError, MAX_DEVICES, MAX_DEVICE_TOKEN_BYTES, MAX_MESSAGE_BYTES,
    MAX_PAYLOAD_BYTES,
};
use pushpace::limiter::{Algorithm, Rate};
use pushpace::store::DeadLetterKind;
use serde_json::json;
use serde_json::value::RawValue;
use std::time::Duration;

const EXAMPLE: &str = r#"{"job_id": "j-000123", "campaign_id": "spring-sale", "send_rate": 500, "algorithm": "gcra",
 "devices": ["tok-a", "tok-b"], "payload": {"title": "Hi", "body": "…"}}"#;

/// A valid job as a JSON value, to break one field at a time.
fn base() -> serde_json::Value {
    json!({
        "job_id": "j-1",
        "campaign_id": "c-1",
        "send_rate": 100,
        "algorithm": "gcra",
        "devices": ["tok-a", "tok-b", "tok-c"],
        "payload": {"title": "Hi"}
    })
}

fn with(field: &str, value: serde_json::Value) -> Vec<u8> {
    let mut v = base();
    v[field] = value;
    serde_json::to_vec(&v).unwrap()
}

fn without(field: &str) -> Vec<u8> {
    let mut v = base();
    v.as_object_mut().unwrap().remove(field);
    serde_json::to_vec(&v).unwrap()
}

/// Asserts the message is dead-lettered as `kind`, its reason names `field` (for invalid
/// jobs) and contains `needle`, and is fit to show a person and store in PostgreSQL.
#[track_caller]
fn rejects(msg: &[u8], kind: DeadLetterKind, field: Option<&str>, needle: &str) -> JobError {
    let err = match decode(msg) {
        Ok(job) => panic!("accepted {job:?}"),
        Err(e) => e,
    };
    assert_eq!(err.kind(), kind, "{err}");
    assert_eq!(err.field(), field, "{err}");
    let reason = err.to_string();
    if let Some(field) = field {
        assert!(reason.starts_with(&format!("{field}: ")), "{reason}");
    }
    assert!(reason.contains(needle), "{reason:?} lacks {needle:?}");
    assert!(reason.chars().count() <= 400, "reason too long: {reason}");
    assert!(
        !reason.chars().any(|c| c.is_control()),
        "control character in {reason:?}"
    );
    err
}

const MALFORMED: DeadLetterKind = DeadLetterKind::MalformedJob;
const INVALID: DeadLetterKind = DeadLetterKind::InvalidJob;

#[test]
fn the_issue_example_decodes() {
    let job = decode(EXAMPLE.as_bytes()).unwrap();
    assert_eq!(job.job_id, "j-000123");
    assert_eq!(job.campaign_id, "spring-sale");
    assert_eq!(job.send_rate, Some(Rate::per_second(500.0).unwrap()));
    assert_eq!(job.algorithm, Some(Algorithm::Gcra));
    assert_eq!(job.devices, ["tok-a", "tok-b"]);
    // Raw text, not re-encoded: the spacing and the non-ASCII character stay as written.
    assert_eq!(job.payload.get(), r#"{"title": "Hi", "body": "…"}"#);
}

#[test]
fn optional_fields_may_be_absent_or_null_and_unknown_fields_are_ignored() {
    let job = decode(
        br#"{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{},"send_rate":null,"algorithm":null,
            "extra":{"deep":[1,2,{"x":null}]},"priority":"high"}"#,
    )
    .unwrap();
    assert_eq!(job.send_rate, None);
    assert_eq!(job.algorithm, None);
    assert_eq!(job.payload.get(), "{}");
}

#[test]
fn escaped_field_names_and_values_are_understood() {
    let job = decode(
        br#"{"job\u005fid":"j\u002d1","campaign_id":"c","devices":["t\"ok\/\u00e9"],"payload":{"a":"\u00e9"}}"#,
    )
    .unwrap();
    assert_eq!(job.job_id, "j-1");
    assert_eq!(job.devices, ["t\"ok/é"]);
    assert_eq!(job.payload.get(), r#"{"a":"\u00e9"}"#);
}

#[test]
fn every_algorithm_name_is_accepted() {
    for a in Algorithm::ALL {
        let job = decode(&with("algorithm", json!(a.as_str()))).unwrap();
        assert_eq!(job.algorithm, Some(a));
    }
}

#[test]
fn limits_are_inclusive() {
    let id = "a".repeat(128);
    let mut v = base();
    v["job_id"] = json!(id);
    v["campaign_id"] = json!(id);
    v["devices"] = json!((0..MAX_DEVICES)
        .map(|i| format!("t{i}"))
        .collect::<Vec<_>>());
    let job = decode(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(job.devices.len(), MAX_DEVICES);

    let token = "x".repeat(MAX_DEVICE_TOKEN_BYTES);
    let job = decode(&with("devices", json!([token]))).unwrap();
    assert_eq!(job.devices[0].len(), MAX_DEVICE_TOKEN_BYTES);

    // A payload of exactly the decoder's limit: {"p":"xxx…"} is 8 bytes of framing.
    let payload = format!(r#"{{"p":"{}"}}"#, "x".repeat(MAX_PAYLOAD_BYTES - 8));
    assert_eq!(payload.len(), MAX_PAYLOAD_BYTES);
    let msg = format!(r#"{{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{payload}}}"#);
    assert_eq!(decode(msg.as_bytes()).unwrap().payload.get(), payload);

    let tiny = Rate::per_second(0.001).unwrap();
    assert_eq!(
        decode(&with("send_rate", json!(0.001))).unwrap().send_rate,
        Some(tiny)
    );
    assert!(decode(&with("send_rate", json!(10_000_000))).is_ok());
}

/// A valid message padded (with an ignored field) to exactly `len` bytes.
fn padded_message(len: usize) -> Vec<u8> {
    let head = br#"{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{},"pad":""#;
    let mut msg = head.to_vec();
    msg.resize(len - 2, b'x');
    msg.extend_from_slice(b"\"}");
    msg
}

#[test]
fn a_message_of_exactly_one_mib_is_accepted_and_one_byte_more_is_not() {
    assert!(decode(&padded_message(MAX_MESSAGE_BYTES)).is_ok());
    let err = rejects(
        &padded_message(MAX_MESSAGE_BYTES + 1),
        MALFORMED,
        None,
        "1048577 bytes",
    );
    assert_eq!(
        err,
        JobError::TooLarge {
            size: MAX_MESSAGE_BYTES + 1,
            limit: MAX_MESSAGE_BYTES
        }
    );
}
