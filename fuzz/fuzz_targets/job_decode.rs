//! Fuzzes the job decoder and validator: no input may panic, every accepted job obeys
//! the rules and survives a round trip, and every refusal is a reason fit to store.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushpace::job::{decode, MAX_DEVICES, MAX_DEVICE_TOKEN_BYTES, MAX_PAYLOAD_BYTES};
use pushpace::store::DeadLetterKind;

fuzz_target!(|data: &[u8]| {
    // The message key plays no part in decoding, so the input is the message value alone.
    match decode(data) {
        Ok(job) => {
            assert!(!job.devices.is_empty() && job.devices.len() <= MAX_DEVICES);
            assert!(job
                .devices
                .iter()
                .all(|d| !d.is_empty() && d.len() <= MAX_DEVICE_TOKEN_BYTES));
            assert!(job.payload.get().starts_with('{') || job.payload.get().starts_with('"'));
            assert!(job.payload.get().len() <= MAX_PAYLOAD_BYTES);
            let again = decode(&job.to_json()).expect("a re-encoded job decodes");
            assert_eq!(again, job);
            // The provider body built from it is JSON with the same fields.
            let mut body = Vec::new();
            pushpace::sender::push_body(&job, &job.devices[0], &mut body);
            let v: serde_json::Value = serde_json::from_slice(&body).expect("body is JSON");
            assert_eq!(v["device_token"].as_str(), Some(job.devices[0].as_str()));
            assert_eq!(v["job_id"].as_str(), Some(job.job_id.as_str()));
        }
        Err(e) => {
            let reason = e.to_string();
            assert!(!reason.is_empty());
            assert!(!reason.chars().any(char::is_control), "{reason:?}");
            assert!(reason.chars().count() <= 400, "{reason}");
            assert_eq!(e.field().is_some(), e.kind() == DeadLetterKind::InvalidJob);
        }
    }
});
