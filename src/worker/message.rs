//! Turns a Kafka message into a job or a dead-letter rejection, without panicking on any
//! input.
//!
//! rdkafka's own header accessors (`Headers::get`, `try_get`, `iter`) unwrap the header
//! name as UTF-8, so a producer that writes a non-UTF-8 header name would panic the
//! consumer thread. Headers are read here through librdkafka's C API instead, names as
//! bytes, and a message whose header name or value is not UTF-8 text, or that has more
//! than [`MAX_HEADERS`] headers, is refused as `malformed_job`.
//!
//! librdkafka hands out header names as C strings: a name with a NUL byte inside is seen
//! (by any reader of that API) up to its first NUL only. Values come with their length.

use crate::job::{self, Job, JobError};
use crate::store::DeadLetterKind;
use rdkafka::bindings as rdsys;
use rdkafka::message::{BorrowedMessage, OwnedHeaders, OwnedMessage};
use rdkafka::types::{RDKafkaErrorCode, RDKafkaRespErr};
use rdkafka::Message;
use std::ffi::CStr;
use std::fmt;
use std::marker::PhantomData;

/// Most headers a job message may carry. Jobs need none; a few are normal for tracing.
/// The bound keeps the work per message small whatever a producer writes.
pub const MAX_HEADERS: usize = 64;

/// Longest echo of a header's bytes inside a reason, in characters after escaping, so
/// that a reason (which may echo a name and a value) stays under 300 characters.
const MAX_ECHO_CHARS: usize = 48;

/// Why a message is dead-lettered: the kind and a reason fit to store and to print.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    pub kind: DeadLetterKind,
    pub reason: String,
}

/// How much of a panic's text a letter keeps (a bounds message is about 60).
const PANIC_TEXT_CHARS: usize = 300;

impl Rejection {
    /// A message whose checks panicked (a bug in them): an invalid job with the panic's
    /// text, so that the message is kept and the partition goes on.
    pub(crate) fn from_panic(panic: &(dyn std::any::Any + Send)) -> Self {
        let what = panic
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| panic.downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "a panic".into());
        Rejection {
            kind: DeadLetterKind::InvalidJob,
            reason: format!(
                "pushpace could not check this job (a bug, please report it): {}",
                what.chars().take(PANIC_TEXT_CHARS).collect::<String>()
            ),
        }
    }

    fn malformed(reason: String) -> Self {
        Rejection {
            kind: DeadLetterKind::MalformedJob,
            reason,
        }
    }
}

impl From<JobError> for Rejection {
    fn from(e: JobError) -> Self {
        Rejection {
            kind: e.kind(),
            reason: e.to_string(),
        }
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.kind.as_str(), self.reason)
    }
}

/// Checks a message's headers, then decodes its value as a job. The key plays no part.
///
/// Headers are `(name, value)` pairs in message order; a `None` value is a null header.
pub fn inspect<'h>(
    value: Option<&[u8]>,
    headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>,
) -> Result<Job, Rejection> {
    check_headers(headers)?;
    Ok(job::decode(value.unwrap_or(&[]))?)
}

/// Refuses more than [`MAX_HEADERS`] headers, or one whose name or value is not text.
fn check_headers<'h>(
    headers: impl IntoIterator<Item = (&'h [u8], Option<&'h [u8]>)>,
) -> Result<(), Rejection> {
    for (idx, (name, value)) in headers.into_iter().enumerate() {
        if idx == MAX_HEADERS {
            return Err(Rejection::malformed(format!(
                "the message has more than {MAX_HEADERS} headers; the limit is {MAX_HEADERS}"
            )));
        }
        header_problem(idx, name, value).map_err(Rejection::malformed)?;
    }
    Ok(())
}

/// [`inspect`] on a message read from Kafka: its value and its headers, read without
/// rdkafka's panicking accessors.
pub fn inspect_message<M: HeaderSource>(msg: &M) -> Result<Job, Rejection> {
    let headers = msg.header_list()?;
    inspect(msg.payload(), headers.iter())
}

/// What parking needs of a message ([`job::peek`]), or `None` when it should be decoded
/// in full now: its headers, like its value, must pass [`inspect`] later.
pub fn peek_message<M: HeaderSource>(msg: &M) -> Option<job::Peek> {
    check_headers(msg.header_list().ok()?.iter()).ok()?;
    job::peek(msg.payload().unwrap_or(&[]))
}

/// Why one header is refused, or `Ok` when its name and value are UTF-8 text.
fn header_problem(idx: usize, name: &[u8], value: Option<&[u8]>) -> Result<(), String> {
    if let Err(e) = std::str::from_utf8(name) {
        return Err(format!(
            "header {idx}: the name is not UTF-8 text (invalid byte at offset {}): {}",
            e.valid_up_to(),
            echo(name)
        ));
    }
    if let Some(v) = value {
        if let Err(e) = std::str::from_utf8(v) {
            return Err(format!(
                "header {idx} ({}): the value is not UTF-8 text (invalid byte at offset {}): {}",
                echo(name),
                e.valid_up_to(),
                echo(v)
            ));
        }
    }
    Ok(())
}

/// Bytes as a quoted, ASCII-escaped string of at most [`MAX_ECHO_CHARS`] characters
/// between the quotes (a byte such as 0xff takes four: `\xff`).
fn echo(bytes: &[u8]) -> String {
    let mut shown = String::new();
    let mut used = 0;
    for &b in bytes {
        let escaped = std::ascii::escape_default(b);
        if shown.len() + escaped.len() > MAX_ECHO_CHARS {
            break;
        }
        shown.extend(escaped.map(char::from));
        used += 1;
    }
    if used < bytes.len() {
        format!("\"{shown}\"… ({} bytes)", bytes.len())
    } else {
        format!("\"{shown}\"")
    }
}

/// A message whose headers can be listed as raw bytes.
pub trait HeaderSource: Message {
    /// The message's headers (empty when it has none), or a rejection when librdkafka
    /// cannot parse them.
    fn header_list(&self) -> Result<HeaderList<'_>, Rejection>;
}

impl HeaderSource for BorrowedMessage<'_> {
    fn header_list(&self) -> Result<HeaderList<'_>, Rejection> {
        // rdkafka's `headers()` reports a parse failure as "no headers"; asking
        // librdkafka directly keeps that case apart.
        match message_headers(self) {
            Ok(ptr) => Ok(HeaderList::from_raw(ptr)),
            Err(RDKafkaRespErr::RD_KAFKA_RESP_ERR__NOENT) => Ok(HeaderList::empty()),
            Err(e) => Err(Rejection::malformed(format!(
                "the message headers cannot be read: {}",
                RDKafkaErrorCode::from(e)
            ))),
        }
    }
}

impl HeaderSource for OwnedMessage {
    fn header_list(&self) -> Result<HeaderList<'_>, Rejection> {
        Ok(self
            .headers()
            .map_or_else(HeaderList::empty, HeaderList::from_owned))
    }
}

/// A read-only view of a native header list that lives for `'a`.
#[derive(Clone, Copy)]
pub struct HeaderList<'a> {
    /// Null for "no headers"; otherwise a list owned by something borrowed for `'a`.
    ptr: *const rdsys::rd_kafka_headers_t,
    _owner: PhantomData<&'a OwnedHeaders>,
}

impl<'a> HeaderList<'a> {
    /// No headers.
    pub fn empty() -> Self {
        Self::from_raw(std::ptr::null())
    }

    /// The headers of an [`OwnedHeaders`], such as a detached message's.
    pub fn from_owned(headers: &'a OwnedHeaders) -> Self {
        // rdkafka's `BorrowedHeaders` is a zero-sized view whose address is the native
        // list (rdkafka builds it by casting that pointer); it offers no public accessor.
        const _: () = assert!(std::mem::size_of::<rdkafka::message::BorrowedHeaders>() == 0);
        let view: *const rdkafka::message::BorrowedHeaders = headers.as_borrowed();
        Self::from_raw(view.cast())
    }

    /// Private: the caller vouches that `ptr` is null or a list alive for `'a`.
    fn from_raw(ptr: *const rdsys::rd_kafka_headers_t) -> Self {
        HeaderList {
            ptr,
            _owner: PhantomData,
        }
    }

    /// The headers in order, as `(name, value)`; `None` is a null value.
    pub fn iter(&self) -> impl Iterator<Item = (&'a [u8], Option<&'a [u8]>)> {
        let list = *self;
        (0..).map_while(move |idx| header_at(list, idx))
    }
}

/// The headers librdkafka holds for a consumed or delivered message: `Ok` with the list,
/// or the error (`__NOENT` when there are none, `__BAD_MSG` when they cannot be parsed).
fn message_headers(
    msg: &BorrowedMessage<'_>,
) -> Result<*const rdsys::rd_kafka_headers_t, RDKafkaRespErr> {
    let mut hdrs: *mut rdsys::rd_kafka_headers_t = std::ptr::null_mut();
    // SAFETY: `msg.ptr()` is a live rd_kafka_message_t for as long as `msg` is borrowed,
    // and `hdrs` is a valid out-pointer. The list librdkafka returns belongs to the
    // message and lives as long as it (rdkafka's own `headers()` makes the same call).
    let err = unsafe { rdsys::rd_kafka_message_headers(msg.ptr(), &mut hdrs) };
    match err {
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR if !hdrs.is_null() => Ok(hdrs),
        RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR => Err(RDKafkaRespErr::RD_KAFKA_RESP_ERR__NOENT),
        e => Err(e),
    }
}

/// Header `idx` of `list`, or `None` past the end. Names are read up to their first NUL
/// byte (librdkafka hands them out as C strings).
fn header_at<'a>(list: HeaderList<'a>, idx: usize) -> Option<(&'a [u8], Option<&'a [u8]>)> {
    if list.ptr.is_null() {
        return None;
    }
    let mut name: *const std::ffi::c_char = std::ptr::null();
    let mut value: *const std::ffi::c_void = std::ptr::null();
    let mut size: usize = 0;
    // SAFETY: `list.ptr` is a live header list for the list's lifetime (see HeaderList)
    // and nothing mutates it meanwhile (the owner is borrowed shared). On success
    // librdkafka points `name` at a NUL-terminated copy of the name and `value` at
    // `size` bytes (or null for a null value), both inside the list, so the slices live
    // as long as the list.
    unsafe {
        let err = rdsys::rd_kafka_header_get_all(list.ptr, idx, &mut name, &mut value, &mut size);
        if err != RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR {
            return None;
        }
        let name = if name.is_null() {
            &[][..]
        } else {
            CStr::from_ptr(name).to_bytes()
        };
        let value = match (value.is_null(), size) {
            (true, _) => None,
            (false, 0) => Some(&[][..]),
            (false, n) => Some(std::slice::from_raw_parts(value.cast::<u8>(), n)),
        };
        Some((name, value))
    }
}

/// Headers with any name and value bytes, which rdkafka's `OwnedHeaders::insert` (a
/// `&str` name) cannot build: for tests, fuzzing and tools that must produce such
/// messages. Hand them to a producer record with `.headers(…)`.
pub fn raw_headers(headers: &[(&[u8], Option<&[u8]>)]) -> OwnedHeaders {
    let owned = OwnedHeaders::new_with_capacity(headers.len());
    let view: *const rdkafka::message::BorrowedHeaders = owned.as_borrowed();
    let list = view.cast::<rdsys::rd_kafka_headers_t>().cast_mut();
    for (name, value) in headers {
        let (value_ptr, value_len) = match value {
            Some(v) => (v.as_ptr().cast(), v.len() as isize),
            None => (std::ptr::null(), 0),
        };
        // SAFETY: `list` is the writable list `owned` just created (see `from_owned`),
        // used by nothing else yet; librdkafka copies `name.len()` name bytes and
        // `value_len` value bytes, both from live slices.
        let err = unsafe {
            rdsys::rd_kafka_header_add(
                list,
                name.as_ptr().cast(),
                name.len() as isize,
                value_ptr,
                value_len,
            )
        };
        assert_eq!(
            err,
            RDKafkaRespErr::RD_KAFKA_RESP_ERR_NO_ERROR,
            "a new header list is writable"
        );
    }
    owned
}

#[cfg(test)]
mod tests {
    use super::*;
    use rdkafka::message::{Header, Headers, Timestamp};

    #[test]
    fn a_panic_in_the_checks_becomes_an_invalid_job_naming_it() {
        let caught = std::panic::catch_unwind(|| -> Result<(), Rejection> {
            let seen = [false; 3];
            let i = seen.len();
            panic!("index out of bounds: the len is 3 but the index is {i}")
        });
        let r = Rejection::from_panic(&*caught.unwrap_err());
        assert_eq!(r.kind, DeadLetterKind::InvalidJob);
        assert!(
            r.reason.contains("the len is 3 but the index is 3"),
            "{}",
            r.reason
        );
    }

    const JOB: &[u8] = br#"{"job_id":"j1","campaign_id":"c1","devices":["t"],"payload":{}}"#;

    fn message(key: Option<&[u8]>, headers: Option<OwnedHeaders>) -> OwnedMessage {
        OwnedMessage::new(
            Some(JOB.to_vec()),
            key.map(<[u8]>::to_vec),
            "jobs".into(),
            Timestamp::NotAvailable,
            0,
            0,
            headers,
        )
    }

    fn listed(h: &OwnedHeaders) -> Vec<(Vec<u8>, Option<Vec<u8>>)> {
        HeaderList::from_owned(h)
            .iter()
            .map(|(n, v)| (n.to_vec(), v.map(<[u8]>::to_vec)))
            .collect()
    }

    fn assert_storable(reason: &str) {
        assert!(!reason.is_empty());
        assert!(!reason.chars().any(char::is_control), "{reason:?}");
        assert!(reason.chars().count() <= 400, "{reason}");
    }

    #[test]
    fn a_non_utf8_header_name_is_refused_not_a_panic() {
        let h = raw_headers(&[(b"trace", Some(b"t-1")), (&[0xff, 0xfe], Some(b"x"))]);
        // The premise: rdkafka's own reader panics on this header.
        let h2 = h.clone();
        assert!(std::panic::catch_unwind(move || h2.iter().count()).is_err());

        let r = inspect_message(&message(Some(b"c1"), Some(h))).unwrap_err();
        assert_eq!(r.kind, DeadLetterKind::MalformedJob);
        assert_eq!(
            r.reason,
            r#"header 1: the name is not UTF-8 text (invalid byte at offset 0): "\xff\xfe""#
        );
        assert_storable(&r.reason);
    }

    #[test]
    fn a_non_utf8_header_value_is_refused_with_its_name() {
        let h = raw_headers(&[(b"ok", None), (b"b\"in", Some(&[b'a', 0xc3, b'(']))]);
        let r = inspect_message(&message(None, Some(h))).unwrap_err();
        assert_eq!(r.kind, DeadLetterKind::MalformedJob);
        assert_eq!(
            r.reason,
            r#"header 1 ("b\"in"): the value is not UTF-8 text (invalid byte at offset 1): "a\xc3(""#
        );
    }

    #[test]
    fn long_bad_bytes_are_echoed_cut_and_escaped() {
        let name: Vec<u8> = (0..1000u32).map(|i| (i % 256) as u8).skip(1).collect();
        let r = inspect(None, [(&name[..], None)]).unwrap_err();
        assert!(
            r.reason.starts_with(
                "header 0: the name is not UTF-8 text (invalid byte at offset 127): \"\\x01\\x02"
            ),
            "{}",
            r.reason
        );
        assert!(r.reason.ends_with("… (999 bytes)"), "{}", r.reason);
        assert_storable(&r.reason);
        // The fuzzer's case: a long name and a long bad value at a two-digit index.
        let mut pairs: Vec<(&[u8], Option<&[u8]>)> = vec![(b"ok", None); 63];
        let value = [0x7fu8; 1000];
        pairs.push((&value[..66], Some(&name[..])));
        let r = inspect(None, pairs).unwrap_err();
        assert!(r.reason.starts_with(r#"header 63 ("\x7f"#), "{}", r.reason);
        assert_storable(&r.reason);
        assert!(r.reason.chars().count() <= 300, "{}", r.reason);
    }

    #[test]
    fn nul_bytes_inside_names_and_values() {
        // librdkafka returns names as C strings: the name reads up to its NUL. Values
        // keep their length, NUL included, and NUL is UTF-8 text.
        let h = raw_headers(&[(b"a\0\xff", Some(b"x\0y")), (b"\0", Some(b"\0"))]);
        assert_eq!(
            listed(&h),
            vec![
                (b"a".to_vec(), Some(b"x\0y".to_vec())),
                (Vec::new(), Some(b"\0".to_vec())),
            ]
        );
        assert!(inspect_message(&message(None, Some(h))).is_ok());
        // Given as bytes (no C API in between), a NUL in a name is plain UTF-8 too.
        assert!(inspect(Some(JOB), [(&b"a\0b"[..], Some(&b"\0"[..]))]).is_ok());
    }

    #[test]
    fn zero_headers_null_values_and_empty_names_are_fine() {
        let job = inspect_message(&message(None, None)).unwrap();
        assert_eq!(job.campaign_id, "c1");
        assert!(inspect_message(&message(None, Some(OwnedHeaders::new()))).is_ok());
        assert!(inspect(Some(JOB), std::iter::empty()).is_ok());
        let h = raw_headers(&[(b"", None), (b"", Some(b""))]);
        assert_eq!(
            listed(&h),
            vec![(Vec::new(), None), (Vec::new(), Some(Vec::new()))]
        );
        assert!(inspect_message(&message(None, Some(h))).is_ok());
    }

    #[test]
    fn at_most_max_headers() {
        let names: Vec<Vec<u8>> = (0..=MAX_HEADERS)
            .map(|i| format!("h{i}").into_bytes())
            .collect();
        let pairs: Vec<(&[u8], Option<&[u8]>)> =
            names.iter().map(|n| (&n[..], Some(&b"v"[..]))).collect();
        let ok = raw_headers(&pairs[..MAX_HEADERS]);
        assert!(inspect_message(&message(None, Some(ok))).is_ok());
        let over = raw_headers(&pairs);
        let r = inspect_message(&message(None, Some(over))).unwrap_err();
        assert_eq!(r.kind, DeadLetterKind::MalformedJob);
        assert_eq!(
            r.reason,
            "the message has more than 64 headers; the limit is 64"
        );
    }

    #[test]
    fn reads_utf8_headers_as_rdkafka_does() {
        // Guards the pointer taken from rdkafka's header view against a change in rdkafka.
        let h = OwnedHeaders::new()
            .insert(Header {
                key: "a",
                value: Some("1"),
            })
            .insert(Header {
                key: "",
                value: None::<&str>,
            })
            .insert(Header {
                key: "ünï",
                value: Some(&[0u8, 0xff][..]),
            });
        let theirs: Vec<(Vec<u8>, Option<Vec<u8>>)> = h
            .iter()
            .map(|x| (x.key.as_bytes().to_vec(), x.value.map(<[u8]>::to_vec)))
            .collect();
        assert_eq!(theirs.len(), 3);
        assert_eq!(listed(&h), theirs);
    }

    #[test]
    fn the_key_is_not_inspected_and_job_errors_pass_through() {
        assert!(inspect_message(&message(Some(&[0xff, 0]), None)).is_ok());
        let r = inspect(Some(b"[]"), std::iter::empty()).unwrap_err();
        assert_eq!(r, Rejection::from(job::decode(b"[]").unwrap_err()));
        assert_eq!(r.kind, DeadLetterKind::MalformedJob);
        let r = inspect(Some(br#"{"job_id":"j"}"#), std::iter::empty()).unwrap_err();
        assert_eq!(r.kind, DeadLetterKind::InvalidJob);
        // No value at all is an empty message.
        let r = inspect(None, std::iter::empty()).unwrap_err();
        assert_eq!(r.reason, "message is not valid JSON: the message is empty");
        // A bad header is reported before a bad value.
        let r = inspect(Some(b"x"), [(&[0x80u8][..], None)]).unwrap_err();
        assert!(r.reason.starts_with("header 0: "), "{}", r.reason);
    }
}
