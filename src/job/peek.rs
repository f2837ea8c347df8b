//! A light read of a job for the intake's parking decision: its campaign, the rate and
//! algorithm it states, and how many devices it lists, without checking or copying the
//! devices. A job parked behind its campaign's lookahead is decoded in full when it is
//! handed over; decoding it in full when read as well cost every parked job a second
//! decode and hundreds of short-lived strings (docs/BENCHMARKS.md). Anything unusual
//! (a syntax error, a duplicate or mistyped field, an invalid id or rate) makes [`peek`]
//! give up, and the caller decodes in full at once, so a bad job's dead letter says what
//! [`super::decode`] says.

use super::decode::{AlgorithmName, Field, RateNumber};
use super::window::Zone;
use super::{check_id, MAX_DEVICES, MAX_MESSAGE_BYTES};
use crate::limiter::{Algorithm, Rate};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use std::fmt;

/// What parking needs of a job.
#[derive(Debug, Clone, PartialEq)]
pub struct Peek {
    pub campaign_id: String,
    pub send_rate: Option<Rate>,
    pub algorithm: Option<Algorithm>,
    /// Entries in `devices` (1–[`MAX_DEVICES`]); each is checked only by the full decode.
    pub devices: u32,
    /// The recipients' zone (`tz`), for their campaign's local-time window.
    pub zone: Option<Zone>,
}

/// The campaign and size of a job message, or `None` when the full decode should look
/// at it now.
pub fn peek(value: &[u8]) -> Option<Peek> {
    if value.len() > MAX_MESSAGE_BYTES {
        return None;
    }
    let text = std::str::from_utf8(value).ok()?;
    let mut de = serde_json::Deserializer::from_str(text);
    let peeked = de::Deserializer::deserialize_map(&mut de, PeekVisitor).ok()?;
    de.end().ok()?;
    peeked
}

struct PeekVisitor;

impl<'de> Visitor<'de> for PeekVisitor {
    type Value = Option<Peek>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a job object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Option<Peek>, A::Error> {
        let mut campaign_id: Option<String> = None;
        let mut send_rate: Option<Option<Rate>> = None;
        let mut algorithm: Option<Option<Algorithm>> = None;
        let mut devices: Option<u32> = None;
        let mut zone: Option<Option<Zone>> = None;
        let refuse = || de::Error::custom("left to the full decode");
        while let Some(field) = map.next_key::<Field>()? {
            match field {
                Field::CampaignId => {
                    let id: String = map.next_value()?;
                    if campaign_id.is_some() || check_id("campaign_id", &id).is_err() {
                        return Err(refuse());
                    }
                    campaign_id = Some(id);
                }
                Field::SendRate => {
                    let v: Option<RateNumber> = map.next_value()?;
                    let rate = match v {
                        Some(RateNumber(n)) => Some(Rate::per_second(n).map_err(|_| refuse())?),
                        None => None,
                    };
                    if send_rate.replace(rate).is_some() {
                        return Err(refuse());
                    }
                }
                Field::Algorithm => {
                    let v: Option<AlgorithmName> = map.next_value()?;
                    if algorithm.replace(v.map(|a| a.0)).is_some() {
                        return Err(refuse());
                    }
                }
                Field::Devices => {
                    let n = map.next_value_seed(CountSeed)?;
                    if devices.replace(n).is_some() {
                        return Err(refuse());
                    }
                }
                Field::Tz => {
                    let v: Option<String> = map.next_value()?;
                    let z = match v {
                        Some(s) => Some(Zone::parse(&s).map_err(|_| refuse())?),
                        None => None,
                    };
                    if zone.replace(z).is_some() {
                        return Err(refuse());
                    }
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(match (campaign_id, devices) {
            (Some(campaign_id), Some(devices)) if devices >= 1 => Some(Peek {
                campaign_id,
                send_rate: send_rate.flatten(),
                algorithm: algorithm.flatten(),
                devices,
                zone: zone.flatten(),
            }),
            _ => None,
        })
    }
}

/// Counts an array's string entries without reading them into memory.
struct CountSeed;

impl<'de> DeserializeSeed<'de> for CountSeed {
    type Value = u32;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<u32, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for CountSeed {
    type Value = u32;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a list of device tokens")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<u32, A::Error> {
        let mut n: u32 = 0;
        while seq.next_element::<IgnoredAny>()?.is_some() {
            n += 1;
            if n as usize > MAX_DEVICES {
                return Err(de::Error::custom("too many devices"));
            }
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(extra: &str) -> String {
        format!(
            r#"{{"job_id":"j1","campaign_id":"c-1","devices":["a1","b2","c3"],"payload":{{"k":"v\"x"}}{extra}}}"#
        )
    }

    #[test]
    fn reads_the_campaign_its_settings_and_the_device_count() {
        let p = peek(job(r#","send_rate":250,"algorithm":"gcra""#).as_bytes()).unwrap();
        assert_eq!(p.campaign_id, "c-1");
        assert_eq!(p.send_rate, Some(Rate::per_second(250.0).unwrap()));
        assert_eq!(p.algorithm, Some(Algorithm::Gcra));
        assert_eq!(p.devices, 3);
        let bare = peek(job("").as_bytes()).unwrap();
        assert_eq!((bare.send_rate, bare.algorithm), (None, None));
    }

    #[test]
    fn agrees_with_the_full_decode_on_what_it_reads() {
        let text =
            job(r#","send_rate":12.5,"provider":"fcm","expires_at":4102444800,"tz":"Asia/Tokyo""#);
        let full = super::super::decode(text.as_bytes()).unwrap();
        let p = peek(text.as_bytes()).unwrap();
        assert_eq!(p.zone, full.zone);
        assert!(p.zone.is_some());
        assert_eq!(p.campaign_id, full.campaign_id);
        assert_eq!(p.send_rate, full.send_rate);
        assert_eq!(p.algorithm, full.algorithm);
        assert_eq!(p.devices as usize, full.devices.len());
    }

    #[test]
    fn gives_up_on_anything_the_full_decode_should_explain() {
        let bad = [
            "not json".to_string(),
            "[1,2]".to_string(),
            job(",").to_string(),
            job(r#","campaign_id":"c-2""#),
            job(r#","send_rate":-1"#),
            job(r#","send_rate":"fast""#),
            job(r#","algorithm":"bogus""#),
            job(r#","tz":"Mars/Olympus""#),
            job(r#","tz":"UTC","tz":"UTC""#),
            job(r#","devices":["x"]"#),
            r#"{"job_id":"j","campaign_id":"bad id!","devices":["a"]}"#.to_string(),
            r#"{"job_id":"j","campaign_id":"c","devices":[]}"#.to_string(),
            r#"{"job_id":"j","devices":["a"]}"#.to_string(),
            r#"{"job_id":"j","campaign_id":"c","devices":"a"}"#.to_string(),
            format!("{} trailing", job("")),
        ];
        for text in &bad {
            assert_eq!(peek(text.as_bytes()), None, "{text}");
        }
        assert_eq!(peek(&[0xff, 0xfe, b'{']), None);
        let big = vec![b' '; MAX_MESSAGE_BYTES + 1];
        assert_eq!(peek(&big), None);
        let many: Vec<String> = (0..=MAX_DEVICES).map(|i| format!("\"t{i}\"")).collect();
        let text = format!(
            r#"{{"job_id":"j","campaign_id":"c","devices":[{}]}}"#,
            many.join(",")
        );
        assert_eq!(peek(text.as_bytes()), None);
    }
}
