//! Fuzzes what the consumer does with a message: headers with any name and value bytes,
//! built in librdkafka's native header list, read back without rdkafka's panicking
//! accessors, then the header rules and the job decoder. No input may panic; the reader
//! returns what was written; refusals name the first bad header; accepted jobs obey the
//! job rules.
//!
//! Input layout (anything short ends the headers early):
//! `count:u8`, then per header `name_len:u8 name value_len:u8 value` (a `value_len` of
//! 255 is a null value), then `key_len:u8 key`, and the rest is the message value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use pushpace::job::{decode, MAX_DEVICES, MAX_DEVICE_TOKEN_BYTES, MAX_PAYLOAD_BYTES};
use pushpace::store::DeadLetterKind;
use pushpace::worker::message::{
    inspect, inspect_message, raw_headers, HeaderList, Rejection, MAX_HEADERS,
};
use rdkafka::message::{OwnedMessage, Timestamp};

type Pair<'a> = (&'a [u8], Option<&'a [u8]>);

struct Input<'a> {
    headers: Vec<Pair<'a>>,
    key: Option<&'a [u8]>,
    value: Option<&'a [u8]>,
}

fn take<'a>(data: &mut &'a [u8], n: usize) -> Option<&'a [u8]> {
    if data.len() < n {
        return None;
    }
    let (head, rest) = data.split_at(n);
    *data = rest;
    Some(head)
}

fn split(mut data: &[u8]) -> Input<'_> {
    let mut input = Input {
        headers: Vec::new(),
        key: None,
        value: None,
    };
    let Some(&[count]) = take(&mut data, 1) else {
        return input;
    };
    // Up to a few past the cap, so that the cap is reached.
    for _ in 0..count % (MAX_HEADERS as u8 + 8) {
        let Some(name) = take(&mut data, 1).and_then(|n| take(&mut data, n[0] as usize)) else {
            return input;
        };
        let Some(&[len]) = take(&mut data, 1) else {
            return input;
        };
        let value = match len {
            255 => None,
            n => match take(&mut data, n as usize) {
                Some(v) => Some(v),
                None => return input,
            },
        };
        input.headers.push((name, value));
    }
    input.key = take(&mut data, 1).and_then(|n| take(&mut data, n[0] as usize));
    input.value = Some(data);
    input
}

/// What librdkafka gives back for a written header: the name up to its first NUL.
fn as_read<'a>((name, value): Pair<'a>) -> Pair<'a> {
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    (&name[..end], value)
}

fn check_job(job: &pushpace::job::Job) {
    assert!(!job.devices.is_empty() && job.devices.len() <= MAX_DEVICES);
    assert!(job
        .devices
        .iter()
        .all(|d| !d.is_empty() && d.len() <= MAX_DEVICE_TOKEN_BYTES));
    assert!(job.payload.get().starts_with('{') || job.payload.get().starts_with('"'));
    assert!(job.payload.get().len() <= MAX_PAYLOAD_BYTES);
    let again = decode(&job.to_json()).expect("a re-encoded job decodes");
    assert_eq!(&again, job);
}

fn check_reason(r: &Rejection) {
    assert!(!r.reason.is_empty());
    assert!(!r.reason.chars().any(char::is_control), "{:?}", r.reason);
    assert!(r.reason.chars().count() <= 400, "{}", r.reason);
}

fuzz_target!(|data: &[u8]| {
    let input = split(data);
    let native = raw_headers(&input.headers);
    let expected: Vec<Pair<'_>> = input.headers.iter().copied().map(as_read).collect();
    let listed: Vec<Pair<'_>> = HeaderList::from_owned(&native).iter().collect();
    assert_eq!(listed, expected, "the reader returns what was written");

    let msg = OwnedMessage::new(
        input.value.map(<[u8]>::to_vec),
        input.key.map(<[u8]>::to_vec),
        "jobs".into(),
        Timestamp::NotAvailable,
        0,
        0,
        Some(native),
    );
    let result = inspect_message(&msg);
    assert_eq!(result, inspect(input.value, expected.iter().copied()));

    let first_bad = expected.iter().take(MAX_HEADERS).position(|(n, v)| {
        std::str::from_utf8(n).is_err() || v.is_some_and(|v| std::str::from_utf8(v).is_err())
    });
    match (&result, first_bad) {
        (Err(r), Some(i)) => {
            assert_eq!(r.kind, DeadLetterKind::MalformedJob);
            assert!(r.reason.starts_with(&format!("header {i}")), "{}", r.reason);
        }
        (Ok(_), Some(i)) => panic!("header {i} is not UTF-8 yet the message was accepted"),
        (_, None) if expected.len() > MAX_HEADERS => {
            let r = result.as_ref().expect_err("too many headers were accepted");
            assert_eq!(r.kind, DeadLetterKind::MalformedJob);
            assert!(
                r.reason.starts_with("the message has more than"),
                "{}",
                r.reason
            );
        }
        (_, None) => {
            let decoded = decode(input.value.unwrap_or(&[])).map_err(Rejection::from);
            assert_eq!(result, decoded);
        }
    }
    match &result {
        Ok(job) => check_job(job),
        Err(r) => check_reason(r),
    }
});
