//! Job messages: decoding and validation of the JSON that arrives on the jobs topic.
//!
//! A job is one notification (`payload`) for a list of device tokens, belonging to one
//! campaign. [`decode`] turns a Kafka message value into a validated [`Job`] or
//! a [`JobError`] that says which field is wrong and how, so that a person reading the
//! dead-letter table can act on it. The rules are in `docs/JOB_FORMAT.md`.
//!
//! Decoding is a single pass over the message with a hand-written serde visitor
//! ([`decode`](mod@decode)): strings are copied once into the job, the payload is kept as raw JSON
//! text (never re-encoded, so the provider receives the producer's bytes), unknown
//! fields are skipped without being materialised, and a field error stops the parse at
//! once. The rules of each provider kind (payload sizes, FCM `data`, APNs tokens, Web
//! Push subscriptions) are checked at intake by [`check_for_provider`]
//! ([`provider_rules`]), once the job's provider is known.

mod decode;
mod devices;
mod kinds;
mod lifecycle;
mod options;
mod peek;
pub mod policy;
pub mod provider_rules;
pub mod webpush_subscription;
pub mod window;

pub use devices::{Subscription, SubscriptionKeys};
pub use kinds::{DeadLetterKind, ProviderKind};
pub use lifecycle::{bound_by_campaign_expiry, Lifecycle, MAX_CAMPAIGN_TOTAL, MAX_UNIX_S};
pub use options::{
    check_provider_name, Priority, PushOptions, PushType, MAX_COLLAPSE_ID_BYTES, MAX_PROVIDER_NAME,
    MAX_TTL_S,
};
pub use peek::{peek, Peek};
pub use policy::{ClassPriority, PriorityClass};
pub use provider_rules::check_for_provider;
pub use window::{LatePolicy, LocalPolicy, Release, SendWindow, WindowError, Zone};

use crate::limiter::{Algorithm, Rate};
use devices::{check_token, devices_count_error};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;
use std::io::Write;

/// Largest message value accepted, in bytes (1 MiB).
pub const MAX_MESSAGE_BYTES: usize = 1 << 20;
/// Longest `job_id` / `campaign_id`, in characters.
pub const MAX_ID_CHARS: usize = 128;
/// Most device tokens in one job.
pub const MAX_DEVICES: usize = 10_000;
/// Longest device token, in bytes.
pub const MAX_DEVICE_TOKEN_BYTES: usize = 4096;
/// Largest payload the decoder takes, in bytes of JSON text: APNs VoIP's limit, the
/// largest of any provider. Each provider's own limit is checked at intake
/// ([`provider_rules`]): 4096 for APNs (other push types), FCM and the webhook.
pub const MAX_PAYLOAD_BYTES: usize = 5120;

/// Longest reason text kept in an error; echoed input beyond this is cut.
const MAX_REASON_CHARS: usize = 300;
/// Longest echo of a bad value inside a reason.
const MAX_ECHO_CHARS: usize = 48;

/// A validated job. Build one with [`decode`] or [`Job::new`]; both apply the same rules.
#[derive(Debug, Clone)]
pub struct Job {
    /// 1–128 characters from `[A-Za-z0-9._:-]`.
    pub job_id: String,
    /// 1–128 characters from `[A-Za-z0-9._:-]`. The Kafka message key plays no part:
    /// it is the producer's partitioning choice.
    pub campaign_id: String,
    /// Used when the campaign is first seen; the campaign's stored settings win after that.
    pub send_rate: Option<Rate>,
    /// Used when the campaign is first seen, like `send_rate`.
    pub algorithm: Option<Algorithm>,
    /// 1–10,000 device tokens, each 1–4,096 bytes. A Web Push subscription is its
    /// compact JSON text (see [`Subscription`]).
    pub devices: Vec<String>,
    /// A JSON object (or, for Web Push, a string) of at most [`MAX_PAYLOAD_BYTES`],
    /// exactly as the producer wrote it.
    pub payload: Box<RawValue>,
    /// The provider the job names (`None`: `sender.default_provider`).
    pub provider: Option<String>,
    /// The registered app the job sends for (`app_id`, the id rule of `job_id`).
    pub app_id: Option<String>,
    /// The provider's index in the worker's [`crate::provider::Providers`], set at intake
    /// by [`crate::provider::Providers::resolve`]; 0 until then.
    pub provider_slot: u16,
    /// Optional headers for the provider.
    pub options: PushOptions,
    /// Start, expiry and the campaign's stated size.
    pub lifecycle: Lifecycle,
    /// The provider-level priority of its campaign's class, when `options` sets none.
    pub class_priority: ClassPriority,
    /// The recipients' time zone (`tz`), for their campaign's local-time window
    /// ([`window`]); `None`: UTC.
    pub zone: Option<Zone>,
}

impl PartialEq for Job {
    fn eq(&self, other: &Self) -> bool {
        self.job_id == other.job_id
            && self.campaign_id == other.campaign_id
            && self.send_rate == other.send_rate
            && self.algorithm == other.algorithm
            && self.devices == other.devices
            && self.payload.get() == other.payload.get()
            && self.provider == other.provider
            && self.app_id == other.app_id
            && self.options == other.options
            && self.lifecycle == other.lifecycle
            && self.zone == other.zone
    }
}

/// Why a message is not a job. [`JobError::kind`] says which dead-letter kind it gets.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JobError {
    /// The message is over [`MAX_MESSAGE_BYTES`].
    #[error("message is {size} bytes; the limit is {limit} bytes (1 MiB)")]
    TooLarge { size: usize, limit: usize },
    /// The message is not UTF-8.
    #[error("message is not valid UTF-8: {0}")]
    NotUtf8(String),
    /// The message is not JSON (or is empty, or has trailing data).
    #[error("message is not valid JSON: {0}")]
    NotJson(String),
    /// The message is JSON, but not an object.
    #[error("message must be a JSON object, got {0}")]
    NotObject(&'static str),
    /// A field breaks the job rules. `field` is a path such as `devices[3]`.
    #[error("{field}: {problem}")]
    Field { field: String, problem: String },
}

impl JobError {
    /// The dead-letter kind: malformed when the message is not a JSON object at all,
    /// invalid when it is one but breaks a rule.
    pub fn kind(&self) -> DeadLetterKind {
        match self {
            JobError::TooLarge { .. }
            | JobError::NotUtf8(_)
            | JobError::NotJson(_)
            | JobError::NotObject(_) => DeadLetterKind::MalformedJob,
            JobError::Field { .. } => DeadLetterKind::InvalidJob,
        }
    }

    /// The offending field's path, for invalid jobs.
    pub fn field(&self) -> Option<&str> {
        match self {
            JobError::Field { field, .. } => Some(field),
            _ => None,
        }
    }

    pub(crate) fn field_problem(field: impl Into<String>, problem: impl Into<String>) -> Self {
        JobError::Field {
            field: field.into(),
            problem: clip(problem.into()),
        }
    }
}

/// Decodes and validates a job from a Kafka message `value`. The message key is not
/// read: producers key by whatever spreads their load, and the campaign is the body's.
pub fn decode(value: &[u8]) -> Result<Job, JobError> {
    if value.len() > MAX_MESSAGE_BYTES {
        return Err(JobError::TooLarge {
            size: value.len(),
            limit: MAX_MESSAGE_BYTES,
        });
    }
    // Checking UTF-8 up front lets serde_json read from a &str and skip its own checks.
    let text = std::str::from_utf8(value).map_err(|e| {
        JobError::NotUtf8(format!(
            "invalid byte sequence at offset {}",
            e.valid_up_to()
        ))
    })?;
    match text
        .trim_start_matches([' ', '\t', '\n', '\r'])
        .bytes()
        .next()
    {
        Some(b'{') => {}
        None => return Err(JobError::NotJson("the message is empty".into())),
        Some(_) => {
            return Err(match serde_json::from_str::<serde_json::Value>(text) {
                Ok(v) => JobError::NotObject(json_type_name(&v)),
                Err(e) => JobError::NotJson(e.to_string()),
            })
        }
    }

    let mut slot = None;
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = decode::JobSeed { slot: &mut slot }
        .deserialize(&mut de)
        .and_then(|job| de.end().map(|()| job));
    match parsed {
        Ok(job) => Ok(job),
        Err(e) => Err(classify_failure(text, e, slot)),
    }
}

/// Turns a failed parse into the error a person should see. A syntax error anywhere in
/// the message makes it malformed, even when a field error was met first.
fn classify_failure(text: &str, e: serde_json::Error, slot: Option<JobError>) -> JobError {
    use serde_json::error::Category;
    match e.classify() {
        Category::Syntax | Category::Eof | Category::Io => JobError::NotJson(e.to_string()),
        Category::Data => match serde_json::from_str::<IgnoredAny>(text) {
            Err(syntax) => JobError::NotJson(syntax.to_string()),
            Ok(_) => slot.unwrap_or_else(|| JobError::NotJson(e.to_string())),
        },
    }
}

impl Job {
    /// The provider-level priority to send with: the job's own, else its campaign
    /// class's (APNs `apns-priority`, FCM `android.priority`, Web Push `Urgency`).
    pub fn push_priority(&self) -> Option<Priority> {
        self.options.priority.or_else(|| self.class_priority.get())
    }

    /// Builds a job from parts, applying the same rules as [`decode`].
    pub fn new(
        job_id: impl Into<String>,
        campaign_id: impl Into<String>,
        devices: Vec<String>,
        payload: Box<RawValue>,
    ) -> Result<Self, JobError> {
        let job_id = job_id.into();
        let campaign_id = campaign_id.into();
        check_id("job_id", &job_id)?;
        check_id("campaign_id", &campaign_id)?;
        if devices.is_empty() || devices.len() > MAX_DEVICES {
            return Err(devices_count_error(devices.len()));
        }
        for (i, token) in devices.iter().enumerate() {
            check_token(i, token)?;
        }
        check_payload(&payload)?;
        Ok(Job {
            job_id,
            campaign_id,
            send_rate: None,
            algorithm: None,
            devices,
            payload,
            provider: None,
            app_id: None,
            provider_slot: 0,
            options: PushOptions::default(),
            lifecycle: Lifecycle::default(),
            class_priority: ClassPriority::default(),
            zone: None,
        })
    }

    /// Sets the optional send rate.
    pub fn with_send_rate(mut self, rate: Rate) -> Self {
        self.send_rate = Some(rate);
        self
    }

    /// Names the provider (`None`: `sender.default_provider`).
    pub fn with_provider(mut self, provider: Option<String>) -> Self {
        self.provider = provider;
        self
    }

    /// Names the registered app the job sends for.
    pub fn with_app(mut self, app_id: Option<String>) -> Self {
        self.app_id = app_id;
        self
    }

    /// Sets the recipients' time zone (`None`: UTC).
    pub fn with_zone(mut self, zone: Option<Zone>) -> Self {
        self.zone = zone;
        self
    }

    /// Sets the optional algorithm.
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = Some(algorithm);
        self
    }

    /// Encodes the job as a message value that [`decode`] accepts (for producers).
    /// The payload is written verbatim.
    pub fn to_json(&self) -> Vec<u8> {
        let tokens: usize = self.devices.iter().map(|d| d.len() + 3).sum();
        let mut out = Vec::with_capacity(128 + tokens + self.payload.get().len());
        self.write_json(&mut out);
        out
    }

    fn write_json(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(b"{\"job_id\":");
        write_json_str(out, &self.job_id);
        out.extend_from_slice(b",\"campaign_id\":");
        write_json_str(out, &self.campaign_id);
        if let Some(rate) = self.send_rate {
            // Rates are finite (Rate guarantees it), so this always writes a JSON number.
            let _ = write!(out, ",\"send_rate\":{}", rate.as_f64());
        }
        if let Some(algorithm) = self.algorithm {
            out.extend_from_slice(b",\"algorithm\":\"");
            out.extend_from_slice(algorithm.as_str().as_bytes());
            out.push(b'"');
        }
        self.write_options(out);
        self.lifecycle.write_json(out);
        out.extend_from_slice(b",\"devices\":[");
        for (i, token) in self.devices.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            // A subscription in its stored form goes back as the object it came from.
            if Subscription::parse(token).is_some() {
                out.extend_from_slice(token.as_bytes());
            } else {
                write_json_str(out, token);
            }
        }
        out.extend_from_slice(b"],\"payload\":");
        out.extend_from_slice(self.payload.get().as_bytes());
        out.push(b'}');
    }

    fn write_options(&self, out: &mut Vec<u8>) {
        if let Some(p) = &self.provider {
            out.extend_from_slice(b",\"provider\":");
            write_json_str(out, p);
        }
        if let Some(a) = &self.app_id {
            out.extend_from_slice(b",\"app_id\":");
            write_json_str(out, a);
        }
        let o = &self.options;
        if let Some(p) = o.priority {
            let _ = write!(out, ",\"priority\":\"{}\"", p.as_str());
        }
        if let Some(c) = &o.collapse_id {
            out.extend_from_slice(b",\"collapse_id\":");
            write_json_str(out, c);
        }
        if let Some(e) = o.expiration {
            let _ = write!(out, ",\"expiration\":{e}");
        }
        if let Some(t) = o.ttl_s {
            let _ = write!(out, ",\"ttl_s\":{t}");
        }
        if let Some(t) = o.push_type {
            let _ = write!(out, ",\"push_type\":\"{}\"", t.as_str());
        }
        if let Some(z) = &self.zone {
            out.extend_from_slice(b",\"tz\":");
            write_json_str(out, &z.to_string());
        }
    }
}

/// The error for a job naming a provider the worker does not have.
pub fn unknown_provider<'a>(name: &str, known: impl Iterator<Item = &'a str>) -> JobError {
    let known: Vec<&str> = known.collect();
    JobError::field_problem(
        "provider",
        format!(
            "{} is not a configured provider; this worker has: {}",
            echo(name),
            known.join(", ")
        ),
    )
}

/// Appends `s` as a JSON string literal, escaped by serde_json.
pub(crate) fn write_json_str(out: &mut Vec<u8>, s: &str) {
    // Writing a &str into a Vec cannot fail: serde_json only errors on I/O.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn json_type_name(v: &serde_json::Value) -> &'static str {
    match v {
        serde_json::Value::Null => "null",
        serde_json::Value::Bool(_) => "a boolean",
        serde_json::Value::Number(_) => "a number",
        serde_json::Value::String(_) => "a string",
        serde_json::Value::Array(_) => "an array",
        serde_json::Value::Object(_) => "an object",
    }
}

/// A short, escaped echo of a user value: safe to store and to print.
pub(crate) fn echo(s: &str) -> String {
    let n = s.chars().count();
    if n <= MAX_ECHO_CHARS {
        format!("{s:?}")
    } else {
        let head: String = s.chars().take(MAX_ECHO_CHARS).collect();
        format!("{head:?}… ({n} characters)")
    }
}

/// How a device token (or a Web Push subscription, whose endpoint is a capability URL)
/// is named in a reason, which reaches WARN logs and dead letters: its length and a
/// SHA-256 prefix, never its characters. The letter keeps the token itself.
pub(crate) fn token_echo(token: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(token.as_bytes());
    let prefix: String = digest[..6].iter().map(|b| format!("{b:02x}")).collect();
    format!("a token of {} bytes (sha256 {prefix}…)", token.len())
}

fn clip(mut s: String) -> String {
    if s.chars().count() > MAX_REASON_CHARS {
        let cut = s
            .char_indices()
            .nth(MAX_REASON_CHARS)
            .map_or(s.len(), |(i, _)| i);
        s.truncate(cut);
        s.push('…');
    }
    s
}

fn id_char_ok(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b':' | b'-')
}

/// Checks a `job_id` or `campaign_id` (or any id that must follow the same rule, such as
/// the API's campaign ids): 1–128 characters from `[A-Za-z0-9._:-]`. The error names
/// `field` and says what is wrong, with the id escaped.
pub fn check_id(field: &'static str, id: &str) -> Result<(), JobError> {
    if let Some((pos, c)) = id
        .char_indices()
        .find(|&(_, c)| !(c.is_ascii() && id_char_ok(c as u8)))
    {
        let at = id[..pos].chars().count();
        return Err(JobError::field_problem(
            field,
            format!(
                "{} contains {c:?} at character {at}; only A-Z, a-z, 0-9 and . _ : - are allowed",
                echo(id)
            ),
        ));
    }
    // Only ASCII is left, so bytes are characters.
    if id.is_empty() || id.len() > MAX_ID_CHARS {
        return Err(JobError::field_problem(
            field,
            format!(
                "must be 1–{MAX_ID_CHARS} characters from [A-Za-z0-9._:-], got {}",
                id.len()
            ),
        ));
    }
    Ok(())
}

/// The JSON type of a raw value, from its first byte.
fn raw_type_name(raw: &str) -> &'static str {
    match raw.as_bytes().first() {
        Some(b'{') => "an object",
        Some(b'[') => "an array",
        Some(b'"') => "a string",
        Some(b't' | b'f') => "a boolean",
        Some(b'n') => "null",
        _ => "a number",
    }
}

/// The decoder's payload rule, for every provider: a JSON object, or a string (Web Push
/// plaintext; the other providers refuse it at intake), of at most [`MAX_PAYLOAD_BYTES`].
pub(crate) fn check_payload(payload: &RawValue) -> Result<(), JobError> {
    let raw = payload.get();
    if !(raw.starts_with('{') || raw.starts_with('"')) {
        return Err(JobError::field_problem(
            "payload",
            format!(
                "must be a JSON object (or, for Web Push, a string), got {}",
                raw_type_name(raw)
            ),
        ));
    }
    if raw.len() > MAX_PAYLOAD_BYTES {
        return Err(JobError::field_problem(
            "payload",
            format!(
                "must be at most {MAX_PAYLOAD_BYTES} bytes of JSON, got {}",
                raw.len()
            ),
        ));
    }
    // The raw scan that found the payload's end does not decode string escapes, so a
    // lone UTF-16 surrogate (`"\ud83d"`) would pass and then be refused by the provider.
    // Decode every string once here, so what is forwarded is JSON any strict parser takes.
    if let Err(e) = serde_json::from_str::<StrictJson>(raw) {
        return Err(JobError::field_problem(
            "payload",
            format!("is not JSON that every parser accepts: {e} (within the payload)"),
        ));
    }
    Ok(())
}

/// Any JSON value, fully decoded (strings and their escapes included) and then dropped.
struct StrictJson;

impl<'de> Deserialize<'de> for StrictJson {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = StrictJson;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_bool<E: de::Error>(self, _: bool) -> Result<StrictJson, E> {
                Ok(StrictJson)
            }
            fn visit_i64<E: de::Error>(self, _: i64) -> Result<StrictJson, E> {
                Ok(StrictJson)
            }
            fn visit_u64<E: de::Error>(self, _: u64) -> Result<StrictJson, E> {
                Ok(StrictJson)
            }
            fn visit_f64<E: de::Error>(self, _: f64) -> Result<StrictJson, E> {
                Ok(StrictJson)
            }
            fn visit_str<E: de::Error>(self, _: &str) -> Result<StrictJson, E> {
                Ok(StrictJson)
            }
            fn visit_unit<E: de::Error>(self) -> Result<StrictJson, E> {
                Ok(StrictJson)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<StrictJson, A::Error> {
                while seq.next_element::<StrictJson>()?.is_some() {}
                Ok(StrictJson)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<StrictJson, A::Error> {
                while map.next_entry::<StrictJson, StrictJson>()?.is_some() {}
                Ok(StrictJson)
            }
        }
        d.deserialize_any(V)
    }
}
