//! The body of `PUT /api/apps/{id}`, checked field by field: a refusal names the field
//! (`apns.key`, `fcm.service_account.private_key`, `webpush.subject`…) and never
//! quotes a secret. serde's own messages can echo a value, so the body is read as JSON
//! values and each field is taken by hand.

use super::model::{
    check_apns_key, vapid_public_key, ApnsCredentials, ApnsSettings, AppInput, Credentials,
    FcmCredentials, FcmSettings, Limits, WebPushCredentials, WebPushSettings,
};
use super::FieldError;
use crate::limiter::rate::MAX_RATE_PER_SECOND;
use secrecy::{ExposeSecret, SecretString};
use serde_json::{Map, Value};

const LIMIT_FIELDS: [&str; 7] = [
    "max_rate",
    "max_in_flight",
    "adaptive",
    "adaptive_increase",
    "adaptive_decrease",
    "adaptive_floor",
    "latency_target_ms",
];

/// An object of the body, with the path its fields are named under.
struct Obj<'a> {
    path: String,
    map: &'a Map<String, Value>,
}

impl<'a> Obj<'a> {
    fn of(path: impl Into<String>, v: &'a Value) -> Result<Obj<'a>, FieldError> {
        let path = path.into();
        match v {
            Value::Object(map) => Ok(Obj { path, map }),
            _ => Err(FieldError::new(path, "must be a JSON object")),
        }
    }

    fn name(&self, field: &str) -> String {
        if self.path.is_empty() {
            field.to_string()
        } else {
            format!("{}.{field}", self.path)
        }
    }

    fn deny_unknown(&self, known: &[&str]) -> Result<(), FieldError> {
        match self.map.keys().find(|k| !known.contains(&k.as_str())) {
            Some(k) => Err(FieldError::new(
                self.name(&if k.len() <= 64 {
                    k.clone()
                } else {
                    crate::job::echo(k)
                }),
                format!("unknown field; expected one of {}", known.join(", ")),
            )),
            None => Ok(()),
        }
    }

    /// A present field that is not `null`.
    fn get(&self, field: &str) -> Option<&'a Value> {
        self.map.get(field).filter(|v| !v.is_null())
    }

    fn text_opt(&self, field: &str) -> Result<Option<&'a str>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::String(s)) if !s.trim().is_empty() => Ok(Some(s)),
            Some(_) => Err(FieldError::new(
                self.name(field),
                "must be a non-empty string",
            )),
        }
    }

    fn text(&self, field: &str) -> Result<&'a str, FieldError> {
        self.text_opt(field)?
            .ok_or_else(|| FieldError::new(self.name(field), "is required"))
    }

    fn number(
        &self,
        field: &str,
        ok: impl Fn(f64) -> bool,
        range: &str,
    ) -> Result<Option<f64>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_f64().is_some_and(&ok) => Ok(n.as_f64()),
            Some(_) => Err(FieldError::new(
                self.name(field),
                format!("must be a number {range}"),
            )),
        }
    }

    fn whole(&self, field: &str, max: u64) -> Result<Option<u64>, FieldError> {
        match self.get(field) {
            None => Ok(None),
            Some(Value::Number(n)) if n.as_u64().is_some_and(|v| v <= max) => Ok(n.as_u64()),
            Some(_) => Err(FieldError::new(
                self.name(field),
                format!("must be a whole number from 0 to {max}"),
            )),
        }
    }

    fn limits(&self) -> Result<Limits, FieldError> {
        let adaptive = match self.get("adaptive") {
            None => None,
            Some(Value::Bool(b)) => Some(*b),
            Some(_) => {
                return Err(FieldError::new(
                    self.name("adaptive"),
                    "must be true or false",
                ))
            }
        };
        let in_flight = self.whole("max_in_flight", 1_000_000)?;
        if in_flight == Some(0) {
            return Err(FieldError::new(
                self.name("max_in_flight"),
                "must be 1–1000000",
            ));
        }
        Ok(Limits {
            max_rate: self.number(
                "max_rate",
                |r| r > 0.0 && r <= MAX_RATE_PER_SECOND,
                &format!("above 0 and at most {MAX_RATE_PER_SECOND} (sends/s)"),
            )?,
            max_in_flight: in_flight.map(|n| n as u32),
            adaptive,
            adaptive_increase: self.number(
                "adaptive_increase",
                |a| a > 0.0 && a <= 1.0,
                "above 0 and at most 1",
            )?,
            adaptive_decrease: self.number(
                "adaptive_decrease",
                |b| b > 0.0 && b < 1.0,
                "above 0 and below 1",
            )?,
            adaptive_floor: self.number(
                "adaptive_floor",
                |f| (1.0..=MAX_RATE_PER_SECOND).contains(&f),
                "of at least 1 (sends/s)",
            )?,
            latency_target_ms: self.whole("latency_target_ms", 600_000)?,
        })
    }
}

fn with_limits<'a>(fields: &[&'a str]) -> Vec<&'a str> {
    fields.iter().copied().chain(LIMIT_FIELDS).collect()
}

/// Parses and checks a PUT body (JSON text). At least one kind must be given.
pub fn parse_app(body: &[u8]) -> Result<AppInput, FieldError> {
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        FieldError::new(
            "body",
            format!(
                "is not JSON (error at line {} column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    let top = Obj::of("", &v).map_err(|_| FieldError::new("body", "must be a JSON object"))?;
    top.deny_unknown(&["apns", "fcm", "webpush"])?;
    let input = AppInput {
        apns: top
            .get("apns")
            .map(|v| apns(&Obj::of("apns", v)?))
            .transpose()?,
        fcm: top
            .get("fcm")
            .map(|v| fcm(&Obj::of("fcm", v)?))
            .transpose()?,
        webpush: top
            .get("webpush")
            .map(|v| webpush(&Obj::of("webpush", v)?))
            .transpose()?,
    };
    if input.kinds().next().is_none() {
        return Err(FieldError::new(
            "body",
            "names no credentials: give at least one of apns, fcm, webpush",
        ));
    }
    Ok(input)
}

/// Apple's key and team ids: 10 characters from A-Z and 0-9.
fn ten_chars(o: &Obj, field: &str) -> Result<String, FieldError> {
    let v = o.text(field)?;
    if v.len() != 10 || !v.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return Err(FieldError::new(
            o.name(field),
            format!(
                "must be 10 characters (A-Z, 0-9) as Apple shows it, got {} characters",
                v.chars().count()
            ),
        ));
    }
    Ok(v.to_string())
}

fn apns(o: &Obj) -> Result<Credentials, FieldError> {
    o.deny_unknown(&with_limits(&[
        "key",
        "key_id",
        "team_id",
        "topic",
        "environment",
        "endpoint",
    ]))?;
    let key = SecretString::from(o.text("key")?.trim().to_string());
    check_apns_key(&o.name("key"), &key)?;
    let key_id = ten_chars(o, "key_id")?;
    let team_id = ten_chars(o, "team_id")?;
    let topic = o.text("topic")?;
    if topic.bytes().any(|b| !b.is_ascii_graphic()) {
        return Err(FieldError::new(
            o.name("topic"),
            "must be the app's bundle id (printable ASCII, no spaces)",
        ));
    }
    let environment = match o.text("environment")? {
        e @ ("production" | "sandbox") => e.to_string(),
        other => {
            return Err(FieldError::new(
                o.name("environment"),
                format!(
                    "unknown environment {}; expected production or sandbox",
                    crate::job::echo(other)
                ),
            ))
        }
    };
    let endpoint = o
        .text_opt("endpoint")?
        .map(|e| endpoint(&o.name("endpoint"), e))
        .transpose()?;
    Ok(Credentials::Apns(ApnsCredentials {
        key,
        settings: ApnsSettings {
            key_id,
            team_id,
            topic: topic.to_string(),
            environment,
            endpoint,
            limits: o.limits()?,
        },
    }))
}

/// `https://host[:port]` with no path; `http://` only to a loopback host (the mocks).
fn endpoint(field: &str, raw: &str) -> Result<String, FieldError> {
    let u =
        url::Url::parse(raw).map_err(|e| FieldError::new(field, format!("is not a URL: {e}")))?;
    let loopback = matches!(u.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
    let scheme_ok = u.scheme() == "https" || (u.scheme() == "http" && loopback);
    if !scheme_ok || u.host_str().is_none() {
        return Err(FieldError::new(
            field,
            "must be https://host[:port] (http:// only to a loopback host)",
        ));
    }
    if u.path() != "/" || u.query().is_some() {
        return Err(FieldError::new(
            field,
            "must be https://host[:port], with no path",
        ));
    }
    Ok(raw.trim_end_matches('/').to_string())
}

fn fcm(o: &Obj) -> Result<Credentials, FieldError> {
    o.deny_unknown(&with_limits(&["service_account", "endpoint"]))?;
    let field = o.name("service_account");
    let text = match o.get("service_account") {
        None => return Err(FieldError::new(field, "is required")),
        Some(Value::String(s)) => SecretString::from(s.clone()),
        Some(v @ Value::Object(_)) => SecretString::from(v.to_string()),
        Some(_) => {
            return Err(FieldError::new(
                field,
                "must be the service-account JSON, as an object or as a string",
            ))
        }
    };
    let account = service_account_text(&field, &text)?;
    Ok(Credentials::Fcm(FcmCredentials {
        service_account: text,
        settings: FcmSettings {
            project_id: account.project_id,
            client_email: account.client_email,
            token_uri: account.token_uri,
            endpoint: o
                .text_opt("endpoint")?
                .map(|e| endpoint(&o.name("endpoint"), e))
                .transpose()?,
            limits: o.limits()?,
        },
    }))
}

/// The public fields of a checked service account.
pub(crate) struct AccountFields {
    pub project_id: String,
    pub client_email: String,
    pub token_uri: String,
}

/// Checks a service-account JSON text: `project_id`, `client_email`, `private_key`
/// (PKCS#8 RSA in PEM) and `token_uri` are required; each refusal names its field
/// under `field`.
pub(crate) fn service_account_text(
    field: &str,
    text: &SecretString,
) -> Result<AccountFields, FieldError> {
    let v: Value = serde_json::from_str(text.expose_secret()).map_err(|e| {
        FieldError::new(
            field,
            format!(
                "is not JSON (error at line {} column {})",
                e.line(),
                e.column()
            ),
        )
    })?;
    let o = Obj::of(field, &v)?;
    let project_id = o.text("project_id")?;
    if !project_id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b':' | b'_'))
    {
        return Err(FieldError::new(
            o.name("project_id"),
            "has characters other than A-Z a-z 0-9 - . : _",
        ));
    }
    let client_email = o.text("client_email")?;
    if !client_email.contains('@') || client_email.contains(char::is_whitespace) {
        return Err(FieldError::new(
            o.name("client_email"),
            "is not an email address",
        ));
    }
    let key = o.text("private_key")?;
    {
        use rsa::pkcs8::DecodePrivateKey;
        rsa::RsaPrivateKey::from_pkcs8_pem(key.trim()).map_err(|e| {
            FieldError::new(
                o.name("private_key"),
                format!("is not a PKCS#8 RSA private key in PEM: {e}"),
            )
        })?;
    }
    let token_uri = o.text("token_uri")?;
    let u = url::Url::parse(token_uri)
        .map_err(|e| FieldError::new(o.name("token_uri"), format!("is not a URL: {e}")))?;
    let loopback = matches!(u.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
    if !(u.scheme() == "https" || (u.scheme() == "http" && loopback)) {
        return Err(FieldError::new(
            o.name("token_uri"),
            "must be an https:// URL (http:// only to a loopback host)",
        ));
    }
    Ok(AccountFields {
        project_id: project_id.to_string(),
        client_email: client_email.to_string(),
        token_uri: token_uri.to_string(),
    })
}

fn webpush(o: &Obj) -> Result<Credentials, FieldError> {
    o.deny_unknown(&with_limits(&["vapid_key", "subject"]))?;
    let vapid_key = SecretString::from(o.text("vapid_key")?.trim().to_string());
    let public_key = vapid_public_key(&o.name("vapid_key"), &vapid_key)?;
    let subject = o.text("subject")?;
    crate::provider::webpush::vapid::check_subject(subject).map_err(|_| {
        FieldError::new(
            o.name("subject"),
            "must be mailto:<address> or an https: URL (RFC 8292)",
        )
    })?;
    Ok(Credentials::WebPush(WebPushCredentials {
        vapid_key,
        settings: WebPushSettings {
            subject: subject.to_string(),
            public_key,
            limits: o.limits()?,
        },
    }))
}
