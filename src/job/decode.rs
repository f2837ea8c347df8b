//! The single-pass decoder behind [`super::decode`]: a hand-written serde visitor over
//! the job object. Strings are copied once into the job, the payload is kept as raw JSON
//! text, unknown fields are skipped without being materialised, and the first field
//! error is recorded (with its path) in a slot, because serde errors carry only text.

use super::devices::DevicesSeed;
use super::lifecycle::{self, Lifecycle};
use super::options::{self, Scalar};
use super::window::Zone;
use super::{check_id, check_payload, echo, Job, JobError, PushOptions};
use crate::limiter::{Algorithm, Rate, RateError};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, Visitor};
use serde::Deserialize;
use serde_json::value::RawValue;
use std::fmt;

fn rate_problem(e: &RateError) -> String {
    match e {
        RateError::NotFinite(v) => format!("must be a finite number, got {v}"),
        RateError::NotPositive(v) => format!("must be greater than 0 sends per second, got {v}"),
        RateError::TooLow(v) => format!(
            "must be at least {} sends per second (one every 1000 s), got {v}",
            crate::limiter::rate::MIN_RATE_PER_SECOND
        ),
        RateError::TooHigh(v) => format!(
            "must be at most {} sends per second, got {v}",
            crate::limiter::MAX_RATE_PER_SECOND
        ),
    }
}

/// Records `problem` for `field` (unless a deeper error is already recorded) and returns
/// the serde error that unwinds the parse. The structured error travels in the slot
/// because serde errors carry only text.
pub(super) fn fail<E: de::Error>(
    slot: &mut Option<JobError>,
    field: impl FnOnce() -> String,
    problem: impl FnOnce() -> String,
) -> E {
    if slot.is_none() {
        *slot = Some(JobError::field_problem(field(), problem()));
    }
    E::custom("invalid job")
}

/// Like [`fail`] for an error raised by serde itself (a wrong type), keeping its text.
pub(super) fn wrap<E: de::Error + fmt::Display>(
    slot: &mut Option<JobError>,
    field: impl FnOnce() -> String,
    e: E,
) -> E {
    if slot.is_none() {
        *slot = Some(JobError::field_problem(field(), e.to_string()));
    }
    e
}

pub(super) fn problem_of(e: JobError) -> String {
    match e {
        JobError::Field { problem, .. } => problem,
        other => other.to_string(),
    }
}

#[derive(Clone, Copy)]
pub(super) enum Field {
    JobId,
    CampaignId,
    AppId,
    SendRate,
    Algorithm,
    Devices,
    Payload,
    Provider,
    Priority,
    CollapseId,
    Expiration,
    TtlS,
    PushType,
    NotBefore,
    ExpiresAt,
    CampaignTotalDevices,
    Tz,
    // Last, and not in `NAMED`: `seen` has one entry per named field (checked below).
    Other,
}

impl Field {
    const NAMED: [(Field, &'static str); 17] = [
        (Field::JobId, "job_id"),
        (Field::CampaignId, "campaign_id"),
        (Field::AppId, "app_id"),
        (Field::SendRate, "send_rate"),
        (Field::Algorithm, "algorithm"),
        (Field::Devices, "devices"),
        (Field::Payload, "payload"),
        (Field::Provider, "provider"),
        (Field::Priority, "priority"),
        (Field::CollapseId, "collapse_id"),
        (Field::Expiration, "expiration"),
        (Field::TtlS, "ttl_s"),
        (Field::PushType, "push_type"),
        (Field::NotBefore, "not_before"),
        (Field::ExpiresAt, "expires_at"),
        (Field::CampaignTotalDevices, "campaign_total_devices"),
        (Field::Tz, "tz"),
    ];

    fn name(self) -> &'static str {
        Self::NAMED
            .iter()
            .find(|(f, _)| f.index() == self.index())
            .map_or("", |(_, n)| n)
    }

    fn index(self) -> usize {
        self as usize
    }
}

// `Parts::seen` is indexed by `Field as usize`: every named field must sit at its own
// index in `NAMED`, and `Other` (never marked seen) just past its end. A field added to
// the enum but not to `NAMED`, or out of order, fails the build here.
const _: () = {
    let mut i = 0;
    while i < Field::NAMED.len() {
        assert!(Field::NAMED[i].0 as usize == i, "Field::NAMED out of order");
        i += 1;
    }
    assert!(Field::Other as usize == Field::NAMED.len());
};

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct FieldVisitor;
        impl Visitor<'_> for FieldVisitor {
            type Value = Field;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a field name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Field, E> {
                Ok(Field::NAMED
                    .iter()
                    .find(|(_, n)| *n == v)
                    .map_or(Field::Other, |(f, _)| *f))
            }
        }
        d.deserialize_identifier(FieldVisitor)
    }
}

pub(super) struct JobSeed<'s> {
    pub(super) slot: &'s mut Option<JobError>,
}

impl<'de> DeserializeSeed<'de> for JobSeed<'_> {
    type Value = Job;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Job, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for JobSeed<'_> {
    type Value = Job;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a job object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Job, A::Error> {
        let slot = self.slot;
        let mut parts = Parts::default();
        while let Some(field) = map.next_key::<Field>()? {
            if matches!(field, Field::Other) {
                map.next_value::<IgnoredAny>()?;
                continue;
            }
            if parts.seen[field.index()] {
                // Two values for one field could be read differently by other parsers.
                return Err(fail(
                    slot,
                    || field.name().into(),
                    || "appears more than once".into(),
                ));
            }
            parts.seen[field.index()] = true;
            parts.read(field, &mut map, slot)?;
        }
        parts.finish(slot)
    }
}

/// The fields read so far.
#[derive(Default)]
struct Parts {
    seen: [bool; Field::NAMED.len()],
    job_id: Option<String>,
    campaign_id: Option<String>,
    app_id: Option<String>,
    send_rate: Option<Rate>,
    algorithm: Option<Algorithm>,
    devices: Option<Vec<String>>,
    payload: Option<Box<RawValue>>,
    provider: Option<String>,
    options: PushOptions,
    lifecycle: Lifecycle,
    zone: Option<Zone>,
}

impl Parts {
    fn read<'de, A: MapAccess<'de>>(
        &mut self,
        field: Field,
        map: &mut A,
        slot: &mut Option<JobError>,
    ) -> Result<(), A::Error> {
        let name = field.name();
        match field {
            Field::JobId | Field::CampaignId | Field::AppId => {
                let id: String = map
                    .next_value()
                    .map_err(|e| wrap(slot, || name.into(), e))?;
                check_id(name, &id).map_err(|e| fail(slot, || name.into(), || problem_of(e)))?;
                match field {
                    Field::JobId => self.job_id = Some(id),
                    Field::CampaignId => self.campaign_id = Some(id),
                    _ => self.app_id = Some(id),
                }
            }
            Field::SendRate => {
                let v: Option<RateNumber> = map
                    .next_value()
                    .map_err(|e| wrap(slot, || name.into(), e))?;
                if let Some(RateNumber(n)) = v {
                    let rate = Rate::per_second(n)
                        .map_err(|e| fail(slot, || name.into(), || rate_problem(&e)))?;
                    self.send_rate = Some(rate);
                }
            }
            Field::Algorithm => {
                let v: Option<AlgorithmName> = map
                    .next_value()
                    .map_err(|e| wrap(slot, || name.into(), e))?;
                self.algorithm = v.map(|a| a.0);
            }
            Field::Devices => {
                let list = map
                    .next_value_seed(DevicesSeed { slot: &mut *slot })
                    .map_err(|e| wrap(slot, || name.into(), e))?;
                self.devices = Some(list);
            }
            Field::Payload => {
                let raw: &'de RawValue = map
                    .next_value()
                    .map_err(|e| wrap(slot, || name.into(), e))?;
                check_payload(raw).map_err(|e| fail(slot, || name.into(), || problem_of(e)))?;
                self.payload = Some(raw.to_owned());
            }
            _ => {
                let v: Option<Scalar> = map
                    .next_value()
                    .map_err(|e| wrap(slot, || name.into(), e))?;
                if let Some(v) = v {
                    self.option(field, v)
                        .map_err(|problem| fail(slot, || name.into(), || problem))?;
                }
            }
        }
        Ok(())
    }

    /// Sets one of the optional provider fields.
    fn option(&mut self, field: Field, v: Scalar) -> Result<(), String> {
        let o = &mut self.options;
        match field {
            Field::Provider => self.provider = Some(options::provider(v)?),
            Field::Priority => o.priority = Some(options::priority(v)?),
            Field::CollapseId => o.collapse_id = Some(options::collapse_id(v)?),
            Field::Expiration => o.expiration = Some(options::expiration(v)?),
            Field::TtlS => o.ttl_s = Some(options::ttl_s(v)?),
            Field::PushType => o.push_type = Some(options::push_type(v)?),
            Field::NotBefore => self.lifecycle.not_before_ms = Some(lifecycle::instant(v)?),
            Field::ExpiresAt => self.lifecycle.expires_at_ms = Some(lifecycle::instant(v)?),
            Field::CampaignTotalDevices => {
                self.lifecycle.campaign_total_devices = Some(lifecycle::total_devices(v)?)
            }
            Field::Tz => self.zone = Some(zone(v)?),
            _ => {}
        }
        Ok(())
    }

    fn finish<E: de::Error>(self, slot: &mut Option<JobError>) -> Result<Job, E> {
        let mut missing = |name: &'static str, what: &'static str| -> E {
            fail(
                slot,
                || name.into(),
                || format!("missing; required: {what}"),
            )
        };
        const ID: &str = "a string of 1–128 characters from [A-Za-z0-9._:-]";
        let Some(job_id) = self.job_id else {
            return Err(missing("job_id", ID));
        };
        let Some(campaign_id) = self.campaign_id else {
            return Err(missing("campaign_id", ID));
        };
        let Some(devices) = self.devices else {
            return Err(missing(
                "devices",
                "an array of 1–10000 device tokens (strings or Web Push subscriptions)",
            ));
        };
        let Some(payload) = self.payload else {
            return Err(missing(
                "payload",
                "a JSON object (or, for Web Push, a string) of at most 5120 bytes",
            ));
        };
        if self.options.expiration.is_some() && self.options.ttl_s.is_some() {
            return Err(fail(
                slot,
                || "ttl_s".into(),
                || "give expiration or ttl_s, not both".into(),
            ));
        }
        if let Err((field, problem)) = self.lifecycle.check() {
            return Err(fail(slot, || field.into(), || problem));
        }
        let mut options = self.options;
        if options.expiration.is_none() && options.ttl_s.is_none() {
            // The provider drops it too when it could not deliver in time.
            options.expiration = self.lifecycle.expires_at_ms.map(|ms| ms.div_euclid(1000));
        }
        Ok(Job {
            job_id,
            campaign_id,
            send_rate: self.send_rate,
            algorithm: self.algorithm,
            devices,
            payload,
            provider: self.provider,
            app_id: self.app_id,
            provider_slot: 0,
            options,
            lifecycle: self.lifecycle,
            class_priority: Default::default(),
            zone: self.zone,
        })
    }
}

/// The recipients' time zone: an IANA name or a UTC offset (a string).
fn zone(v: Scalar) -> Result<Zone, String> {
    match v {
        Scalar::Str(s) => Zone::parse(&s),
        other => Err(format!(
            "must be an IANA time zone such as \"Europe/Madrid\" or a UTC offset such as \"+02:00\" (a string), got {}",
            other.type_name()
        )),
    }
}

/// A send rate as written: any JSON number.
pub(super) struct RateNumber(pub(super) f64);

impl<'de> Deserialize<'de> for RateNumber {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = RateNumber;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number of sends per second")
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<RateNumber, E> {
                Ok(RateNumber(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<RateNumber, E> {
                Ok(RateNumber(v as f64))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<RateNumber, E> {
                Ok(RateNumber(v as f64))
            }
        }
        d.deserialize_f64(V)
    }
}

/// An algorithm name, parsed without allocating.
pub(super) struct AlgorithmName(pub(super) Algorithm);

impl<'de> Deserialize<'de> for AlgorithmName {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = AlgorithmName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an algorithm name")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<AlgorithmName, E> {
                v.parse()
                    .map(AlgorithmName)
                    .map_err(|_| {
                        E::custom(format_args!(
                            "unknown algorithm {}; expected one of leaky-bucket, token-bucket, fixed-window, sliding-log, sliding-window, gcra, governor",
                            echo(v)
                        ))
                    })
            }
        }
        d.deserialize_str(V)
    }
}

#[cfg(test)]
mod tests {
    use super::Field;

    /// A valid value for each named field: the table must cover every one.
    fn sample(name: &str) -> &'static str {
        match name {
            "job_id" => r#""j""#,
            "campaign_id" => r#""c""#,
            "app_id" => r#""shop-1""#,
            "send_rate" => "10",
            "algorithm" => r#""gcra""#,
            "devices" => r#"["x"]"#,
            "payload" => "{}",
            "provider" => r#""p""#,
            "priority" => r#""high""#,
            "collapse_id" => r#""k""#,
            "expiration" => "0",
            "ttl_s" => "60",
            "push_type" => r#""alert""#,
            "not_before" => "1",
            "expires_at" => "2",
            "campaign_total_devices" => "5",
            "tz" => r#""Europe/Madrid""#,
            other => panic!("no sample value for the new field {other}: add one"),
        }
    }

    /// Every named field, read from `Field::NAMED` so that a new one is covered, given
    /// twice: refused naming it (and never an index past the table of fields seen).
    #[test]
    fn every_named_field_given_twice_is_refused_naming_it() {
        let required = ["job_id", "campaign_id", "devices", "payload"];
        for (_, field) in Field::NAMED {
            let value = sample(field);
            let mut msg = String::from("{");
            for f in required.iter().filter(|f| **f != field) {
                msg.push_str(&format!("\"{f}\":{},", sample(f)));
            }
            let once = format!("{msg}\"{field}\":{value}}}");
            assert!(super::super::decode(once.as_bytes()).is_ok(), "{once}");
            msg.push_str(&format!("\"{field}\":{value},\"{field}\":{value}}}"));
            let e = super::super::decode(msg.as_bytes()).unwrap_err();
            assert_eq!(e.field(), Some(field), "{msg}: {e}");
            assert!(e.to_string().contains("appears more than once"), "{e}");
        }
    }
}
