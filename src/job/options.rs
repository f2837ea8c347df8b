//! Per-job delivery options that map to each provider's own headers
//! (docs/JOB_FORMAT.md, "Delivery options").

/// How urgently the provider should deliver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Priority {
    /// APNs 10, FCM `HIGH`, Web Push `Urgency: high`.
    High,
    /// APNs 5, FCM `NORMAL`, Web Push `Urgency: normal`.
    Normal,
    /// APNs 1, FCM `NORMAL`, Web Push `Urgency: low`.
    Low,
}

impl Priority {
    pub fn as_str(self) -> &'static str {
        match self {
            Priority::High => "high",
            Priority::Normal => "normal",
            Priority::Low => "low",
        }
    }
}

/// APNs `apns-push-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushType {
    Alert,
    Background,
    Voip,
    Location,
    Fileprovider,
    Mdm,
    Liveactivity,
    Pushtotalk,
}

impl PushType {
    pub const ALL: [PushType; 8] = [
        PushType::Alert,
        PushType::Background,
        PushType::Voip,
        PushType::Location,
        PushType::Fileprovider,
        PushType::Mdm,
        PushType::Liveactivity,
        PushType::Pushtotalk,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            PushType::Alert => "alert",
            PushType::Background => "background",
            PushType::Voip => "voip",
            PushType::Location => "location",
            PushType::Fileprovider => "fileprovider",
            PushType::Mdm => "mdm",
            PushType::Liveactivity => "liveactivity",
            PushType::Pushtotalk => "pushtotalk",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|t| t.as_str() == s)
    }
}

/// The optional fields of a job that become provider headers. All `None` by default:
/// then each provider's own default applies.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PushOptions {
    pub priority: Option<Priority>,
    /// APNs `apns-collapse-id`, FCM `collapse_key`, Web Push `Topic`: at most 64 bytes.
    pub collapse_id: Option<String>,
    /// Unix seconds after which the provider should not deliver (APNs `apns-expiration`).
    pub expiration: Option<i64>,
    /// Seconds the provider may store it (FCM `android.ttl`, Web Push `TTL`).
    pub ttl_s: Option<u32>,
    /// APNs only.
    pub push_type: Option<PushType>,
}

/// Longest `collapse_id`, in bytes (APNs `apns-collapse-id`).
pub const MAX_COLLAPSE_ID_BYTES: usize = 64;
/// Longest `ttl_s`: 28 days, FCM's and most push services' maximum.
pub const MAX_TTL_S: u32 = 2_419_200;
/// Longest provider name, in characters.
pub const MAX_PROVIDER_NAME: usize = 64;

/// An option's value as written, of any JSON type, so that a wrong type gets this
/// module's message rather than serde's.
pub(super) enum Scalar {
    Str(String),
    Int(i128),
    Float(f64),
    Other(&'static str),
}

impl Scalar {
    pub(super) fn type_name(&self) -> &'static str {
        match self {
            Scalar::Str(_) => "a string",
            Scalar::Int(_) | Scalar::Float(_) => "a number",
            Scalar::Other(t) => t,
        }
    }
}

impl<'de> serde::Deserialize<'de> for Scalar {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::{IgnoredAny, MapAccess, SeqAccess, Visitor};
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string or a number")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar::Str(v.to_owned()))
            }
            fn visit_string<E: serde::de::Error>(self, v: String) -> Result<Scalar, E> {
                Ok(Scalar::Str(v))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v.into()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar::Int(v.into()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar::Float(v))
            }
            fn visit_bool<E: serde::de::Error>(self, _: bool) -> Result<Scalar, E> {
                Ok(Scalar::Other("a boolean"))
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Scalar, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other("an array"))
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Scalar, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Scalar::Other("an object"))
            }
        }
        d.deserialize_any(V)
    }
}

/// Checks a provider name: 1–64 characters from `[a-z0-9_-]`.
pub fn check_provider_name(name: &str) -> Result<(), String> {
    let ok = !name.is_empty()
        && name.len() <= MAX_PROVIDER_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || matches!(b, b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(format!(
            "must be 1–{MAX_PROVIDER_NAME} characters from [a-z0-9_-], got {}",
            super::echo(name)
        ))
    }
}

pub(super) fn provider(v: Scalar) -> Result<String, String> {
    match v {
        Scalar::Str(s) => check_provider_name(&s).map(|()| s),
        other => Err(format!(
            "must be a provider name (a string), got {}",
            other.type_name()
        )),
    }
}

pub(super) fn priority(v: Scalar) -> Result<Priority, String> {
    let p = match &v {
        Scalar::Str(s) => match s.as_str() {
            "high" => Some(Priority::High),
            "normal" => Some(Priority::Normal),
            "low" => Some(Priority::Low),
            _ => None,
        },
        Scalar::Int(10) => Some(Priority::High),
        Scalar::Int(5) => Some(Priority::Normal),
        Scalar::Int(1) => Some(Priority::Low),
        _ => None,
    };
    p.ok_or_else(|| {
        let got = match &v {
            Scalar::Str(s) => super::echo(s),
            Scalar::Int(n) => n.to_string(),
            Scalar::Float(f) => f.to_string(),
            Scalar::Other(t) => (*t).to_string(),
        };
        format!("must be \"high\", \"normal\" or \"low\" (or APNs 10, 5, 1), got {got}")
    })
}

pub(super) fn collapse_id(v: Scalar) -> Result<String, String> {
    let Scalar::Str(s) = v else {
        return Err(format!("must be a string, got {}", v.type_name()));
    };
    if s.is_empty() || s.len() > MAX_COLLAPSE_ID_BYTES {
        return Err(format!(
            "must be 1–{MAX_COLLAPSE_ID_BYTES} bytes, got {}",
            s.len()
        ));
    }
    // It becomes an HTTP header value.
    if let Some(at) = s.bytes().position(|b| b.is_ascii_control()) {
        return Err(format!(
            "must not contain control characters (byte 0x{:02x} at {at})",
            s.as_bytes()[at]
        ));
    }
    Ok(s)
}

fn whole_number(v: &Scalar, what: &str) -> Result<i128, String> {
    match v {
        Scalar::Int(n) => Ok(*n),
        Scalar::Float(f) => Err(format!("must be a whole number of {what}, got {f}")),
        other => Err(format!(
            "must be a whole number of {what}, got {}",
            other.type_name()
        )),
    }
}

pub(super) fn expiration(v: Scalar) -> Result<i64, String> {
    let n = whole_number(&v, "unix seconds")?;
    i64::try_from(n)
        .ok()
        .filter(|n| *n >= 0)
        .ok_or_else(|| format!("must be unix seconds ≥ 0 (0: do not store), got {n}"))
}

pub(super) fn ttl_s(v: Scalar) -> Result<u32, String> {
    let n = whole_number(&v, "seconds")?;
    u32::try_from(n)
        .ok()
        .filter(|n| *n <= MAX_TTL_S)
        .ok_or_else(|| format!("must be 0–{MAX_TTL_S} seconds (28 days), got {n}"))
}

pub(super) fn push_type(v: Scalar) -> Result<PushType, String> {
    let Scalar::Str(s) = &v else {
        return Err(format!("must be a string, got {}", v.type_name()));
    };
    PushType::parse(s).ok_or_else(|| {
        let names: Vec<&str> = PushType::ALL.iter().map(|t| t.as_str()).collect();
        format!(
            "unknown push type {}; expected one of {}",
            super::echo(s),
            names.join(", ")
        )
    })
}
