//! The `devices` array: device token strings, or Web Push subscription objects
//! `{"endpoint", "keys": {"p256dh", "auth"}}`. A subscription is kept as its compact JSON
//! text with the keys in that order, so that it is a token like any other everywhere
//! else (hygiene, `invalid_tokens`, dead letters). Only the shape is checked here; the
//! key lengths and the curve are the Web Push provider's rules
//! (`super::provider_rules`).

use super::decode::{fail, problem_of, wrap};
use super::{JobError, MAX_DEVICES, MAX_DEVICE_TOKEN_BYTES};
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

pub(super) fn check_token(index: usize, token: &str) -> Result<(), JobError> {
    if token.is_empty() || token.len() > MAX_DEVICE_TOKEN_BYTES {
        return Err(JobError::field_problem(
            format!("devices[{index}]"),
            format!(
                "must be 1–{MAX_DEVICE_TOKEN_BYTES} bytes, got {}",
                token.len()
            ),
        ));
    }
    // No provider issues a token with control characters; a NUL or newline is a
    // producer's bug, and would break the provider's request or our own records.
    if let Some(at) = token.bytes().position(|b| b.is_ascii_control()) {
        return Err(JobError::field_problem(
            format!("devices[{index}]"),
            format!(
                "must not contain control characters (byte 0x{:02x} at {at})",
                token.as_bytes()[at]
            ),
        ));
    }
    Ok(())
}

pub(super) fn devices_count_error(n: usize) -> JobError {
    JobError::field_problem(
        "devices",
        format!("must hold 1–{MAX_DEVICES} device tokens, got {n}"),
    )
}

/// A subscription's parts, borrowed from its compact text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subscription<'a> {
    pub endpoint: &'a str,
    #[serde(borrow)]
    pub keys: SubscriptionKeys<'a>,
}

/// `keys` of a subscription: base64url text as the browser gave it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SubscriptionKeys<'a> {
    pub p256dh: &'a str,
    pub auth: &'a str,
}

impl<'a> Subscription<'a> {
    /// Reads a device string in the stored form: exactly what the decoder makes of a
    /// subscription object, its shape checks included (so [`super::Job::to_json`] may
    /// write it back as the object).
    pub fn parse(device: &'a str) -> Option<Self> {
        if !device.starts_with("{\"endpoint\":") {
            return None;
        }
        let s: Subscription<'a> = serde_json::from_str(device).ok()?;
        let shape_ok = check_endpoint(s.endpoint).is_ok()
            && check_key(s.keys.p256dh).is_ok()
            && check_key(s.keys.auth).is_ok();
        (shape_ok && s.to_text() == device).then_some(s)
    }

    /// The stored form: `{"endpoint":"…","keys":{"p256dh":"…","auth":"…"}}`. The parts
    /// need no escaping (checked at decode: printable ASCII without quotes or
    /// backslashes, base64url).
    pub fn to_text(&self) -> String {
        let k = &self.keys;
        let mut s = String::with_capacity(48 + self.endpoint.len() + k.p256dh.len() + k.auth.len());
        s.push_str("{\"endpoint\":\"");
        s.push_str(self.endpoint);
        s.push_str("\",\"keys\":{\"p256dh\":\"");
        s.push_str(k.p256dh);
        s.push_str("\",\"auth\":\"");
        s.push_str(k.auth);
        s.push_str("\"}}");
        s
    }
}

/// The endpoint's shape: `https://` and printable ASCII with no space, quote or backslash.
fn check_endpoint(e: &str) -> Result<(), String> {
    if !e.starts_with("https://") || e.len() <= "https://".len() {
        return Err("must be an https:// URL".into());
    }
    if let Some(c) = e
        .chars()
        .find(|c| !c.is_ascii_graphic() || matches!(c, '"' | '\\'))
    {
        return Err(format!(
            "must be printable ASCII with no spaces, quotes or backslashes, found {c:?}"
        ));
    }
    Ok(())
}

/// A key's shape: non-empty base64url (padding allowed).
fn check_key(k: &str) -> Result<(), String> {
    let body = k.trim_end_matches('=');
    if body.is_empty()
        || !body
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_'))
    {
        return Err("must be base64url text (A-Z a-z 0-9 - _)".into());
    }
    Ok(())
}

pub(super) struct DevicesSeed<'s> {
    pub(super) slot: &'s mut Option<JobError>,
}

impl<'de> DeserializeSeed<'de> for DevicesSeed<'_> {
    type Value = Vec<String>;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Vec<String>, D::Error> {
        d.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for DevicesSeed<'_> {
    type Value = Vec<String>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an array of device tokens")
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<String>, A::Error> {
        let slot = self.slot;
        let mut out: Vec<String> =
            Vec::with_capacity(seq.size_hint().unwrap_or(16).min(MAX_DEVICES));
        loop {
            if out.len() == MAX_DEVICES {
                // Count the rest without keeping it, so the reason gives the real size.
                let mut extra = 0usize;
                while seq.next_element::<IgnoredAny>()?.is_some() {
                    extra += 1;
                }
                if extra > 0 {
                    let n = MAX_DEVICES + extra;
                    return Err(fail(
                        slot,
                        || "devices".into(),
                        || problem_of(devices_count_error(n)),
                    ));
                }
                break;
            }
            let i = out.len();
            let seed = DeviceSeed {
                slot: &mut *slot,
                index: i,
            };
            match seq
                .next_element_seed(seed)
                .map_err(|e| wrap(slot, || format!("devices[{i}]"), e))?
            {
                Some(token) => {
                    check_token(i, &token)
                        .map_err(|e| fail(slot, || format!("devices[{i}]"), || problem_of(e)))?;
                    out.push(token);
                }
                None => break,
            }
        }
        if out.is_empty() {
            return Err(fail(
                slot,
                || "devices".into(),
                || problem_of(devices_count_error(0)),
            ));
        }
        Ok(out)
    }
}

/// One device: a string as it is, or a subscription object in its stored form.
struct DeviceSeed<'s> {
    slot: &'s mut Option<JobError>,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for DeviceSeed<'_> {
    type Value = String;
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<String, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for DeviceSeed<'_> {
    type Value = String;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a device token string or a Web Push subscription object")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<String, E> {
        Ok(v.to_owned())
    }

    fn visit_string<E: de::Error>(self, v: String) -> Result<String, E> {
        Ok(v)
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<String, A::Error> {
        let slot = self.slot;
        let i = self.index;
        let mut endpoint: Option<String> = None;
        let mut keys: Option<(String, String)> = None;
        while let Some(key) = map.next_key::<SubKey>()? {
            let path = |name: &str| format!("devices[{i}].{name}");
            let name = match key {
                SubKey::Endpoint if endpoint.is_some() => "endpoint",
                SubKey::Keys if keys.is_some() => "keys",
                _ => "",
            };
            if !name.is_empty() {
                return Err(fail(
                    slot,
                    || path(name),
                    || "appears more than once".into(),
                ));
            }
            match key {
                SubKey::Endpoint => {
                    let e: String = map
                        .next_value()
                        .map_err(|e| wrap(slot, || path("endpoint"), e))?;
                    check_endpoint(&e).map_err(|p| fail(slot, || path("endpoint"), || p))?;
                    endpoint = Some(e);
                }
                SubKey::Keys => {
                    let seed = KeysSeed {
                        slot: &mut *slot,
                        index: i,
                    };
                    let k = map
                        .next_value_seed(seed)
                        .map_err(|e| wrap(slot, || path("keys"), e))?;
                    keys = Some(k);
                }
                // Browsers add `expirationTime`; nothing else is kept.
                SubKey::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        let missing = "missing; a subscription is {\"endpoint\", \"keys\": {\"p256dh\", \"auth\"}}";
        let Some(endpoint) = endpoint else {
            return Err(fail(
                slot,
                || format!("devices[{i}].endpoint"),
                || missing.into(),
            ));
        };
        let Some((p256dh, auth)) = keys else {
            return Err(fail(
                slot,
                || format!("devices[{i}].keys"),
                || missing.into(),
            ));
        };
        Ok(Subscription {
            endpoint: &endpoint,
            keys: SubscriptionKeys {
                p256dh: &p256dh,
                auth: &auth,
            },
        }
        .to_text())
    }
}

enum SubKey {
    Endpoint,
    Keys,
    Other,
}

impl<'de> Deserialize<'de> for SubKey {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = SubKey;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a subscription field")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<SubKey, E> {
                Ok(match v {
                    "endpoint" => SubKey::Endpoint,
                    "keys" => SubKey::Keys,
                    _ => SubKey::Other,
                })
            }
        }
        d.deserialize_identifier(V)
    }
}

/// `keys`: `p256dh` and `auth`, both base64url strings; other members are skipped.
struct KeysSeed<'s> {
    slot: &'s mut Option<JobError>,
    index: usize,
}

impl<'de> DeserializeSeed<'de> for KeysSeed<'_> {
    type Value = (String, String);
    fn deserialize<D: de::Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for KeysSeed<'_> {
    type Value = (String, String);

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("an object {\"p256dh\": string, \"auth\": string}")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let slot = self.slot;
        let i = self.index;
        let mut p256dh: Option<String> = None;
        let mut auth: Option<String> = None;
        while let Some(key) = map.next_key::<String>()? {
            let target = match key.as_str() {
                "p256dh" => &mut p256dh,
                "auth" => &mut auth,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                    continue;
                }
            };
            let path = || format!("devices[{i}].keys.{key}");
            if target.is_some() {
                return Err(fail(slot, path, || "appears more than once".into()));
            }
            let v: String = map.next_value().map_err(|e| wrap(slot, path, e))?;
            check_key(&v).map_err(|p| fail(slot, path, || p))?;
            *target = Some(v);
        }
        match (p256dh, auth) {
            (Some(p), Some(a)) => Ok((p, a)),
            (None, _) => Err(fail(
                slot,
                || format!("devices[{i}].keys.p256dh"),
                || "missing".into(),
            )),
            (_, None) => Err(fail(
                slot,
                || format!("devices[{i}].keys.auth"),
                || "missing".into(),
            )),
        }
    }
}
