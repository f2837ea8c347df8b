//! Builds the APNs request for one device: `POST /3/device/<token>` with the provider
//! token and the job's options as `apns-*` headers. Static header values are reused;
//! the path is the one small allocation per send.

use crate::job::{Job, Priority, PushOptions, PushType};
use crate::sender::{HaltScope, SendOutcome};
use http::header::{AUTHORIZATION, CONTENT_TYPE};
use http::{HeaderName, HeaderValue, Method, Request, Uri};

/// The longest device token accepted (Apple's tokens are 32 bytes today, up to 100
/// announced: 200 hex digits).
pub const MAX_TOKEN_HEX: usize = 200;

const DEVICE_PATH: &str = "/3/device/";

static APNS_TOPIC: HeaderName = HeaderName::from_static("apns-topic");
static APNS_PUSH_TYPE: HeaderName = HeaderName::from_static("apns-push-type");
static APNS_PRIORITY: HeaderName = HeaderName::from_static("apns-priority");
static APNS_EXPIRATION: HeaderName = HeaderName::from_static("apns-expiration");
static APNS_COLLAPSE_ID: HeaderName = HeaderName::from_static("apns-collapse-id");

/// The topic header values, built once per provider.
#[derive(Debug, Clone)]
pub struct Topics {
    pub plain: HeaderValue,
    /// `<topic>.voip`, as Apple requires for VoIP pushes.
    pub voip: HeaderValue,
}

impl Topics {
    pub fn new(topic: &str) -> Result<Self, String> {
        let bad = |_| format!("topic {topic:?} is not a valid header value");
        Ok(Self {
            plain: HeaderValue::from_str(topic).map_err(bad)?,
            voip: HeaderValue::try_from(format!("{topic}.voip")).map_err(bad)?,
        })
    }
}

/// Why a device token is refused before it is sent (`None`: it is fine).
pub fn check_token(token: &str) -> Option<String> {
    if token.is_empty() {
        return Some("APNs device token is empty".into());
    }
    if token.len() > MAX_TOKEN_HEX {
        return Some(format!(
            "APNs device token has {} characters; at most {MAX_TOKEN_HEX}",
            token.len()
        ));
    }
    if !token.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Some("APNs device token is not hexadecimal".into());
    }
    None
}

/// The request for `token` (already checked with [`check_token`]); `now` is unix
/// seconds for a `ttl_s` expiration. A job option that cannot be a header value halts
/// the campaign, as Apple's answer to it would.
pub fn build(
    job: &Job,
    token: &str,
    auth: &HeaderValue,
    topics: &Topics,
    now: u64,
) -> Result<Request<()>, SendOutcome> {
    let mut path = String::with_capacity(DEVICE_PATH.len() + token.len());
    path.push_str(DEVICE_PATH);
    path.push_str(token);
    let uri = Uri::try_from(path).map_err(|_| SendOutcome::Rejected {
        status: None,
        reason: "APNs device token does not make a valid path".into(),
    })?;
    let mut req = Request::new(());
    *req.method_mut() = Method::POST;
    *req.uri_mut() = uri;
    let opts = &job.options;
    let push_type = opts.push_type.unwrap_or(PushType::Alert);
    let h = req.headers_mut();
    h.reserve(8);
    h.insert(AUTHORIZATION, auth.clone());
    let topic = match push_type {
        PushType::Voip => &topics.voip,
        _ => &topics.plain,
    };
    h.insert(APNS_TOPIC.clone(), topic.clone());
    h.insert(
        APNS_PUSH_TYPE.clone(),
        HeaderValue::from_static(push_type.as_str()),
    );
    if let Some(p) = priority(job, push_type) {
        h.insert(APNS_PRIORITY.clone(), HeaderValue::from_static(p));
    }
    if let Some(at) = expiration(opts, now) {
        h.insert(APNS_EXPIRATION.clone(), HeaderValue::from(at));
    }
    if let Some(id) = &opts.collapse_id {
        let v = HeaderValue::from_str(id).map_err(|_| SendOutcome::Halt {
            scope: HaltScope::Campaign,
            reason: "apns-collapse-id is not a valid header value".into(),
        })?;
        h.insert(APNS_COLLAPSE_ID.clone(), v);
    }
    h.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(req)
}

/// `apns-priority`: the job's, else its campaign class's, else none (Apple's default,
/// 10). A background push without its own is always 5, whatever the class: Apple refuses
/// 10 (and 1) for it. A job's own value is sent as written.
fn priority(job: &Job, push_type: PushType) -> Option<&'static str> {
    if push_type == PushType::Background && job.options.priority.is_none() {
        return Some("5");
    }
    job.push_priority().map(|p| match p {
        Priority::High => "10",
        Priority::Normal => "5",
        Priority::Low => "1",
    })
}

/// `apns-expiration`: the job's unix time, else now + `ttl_s`.
fn expiration(opts: &PushOptions, now: u64) -> Option<i64> {
    opts.expiration.or_else(|| {
        opts.ttl_s.map(|ttl| {
            i64::try_from(now)
                .unwrap_or(i64::MAX)
                .saturating_add(i64::from(ttl))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(options: PushOptions) -> Job {
        let mut job = crate::job::decode(
            br#"{"job_id":"j","campaign_id":"c","devices":["ab"],"payload":{"aps":{}}}"#,
        )
        .expect("job");
        job.options = options;
        job
    }

    fn get<'r>(req: &'r Request<()>, name: &str) -> Option<&'r str> {
        req.headers().get(name).and_then(|v| v.to_str().ok())
    }

    #[test]
    fn tokens_must_be_hex() {
        assert_eq!(check_token("00ff"), None);
        assert_eq!(check_token(&"A".repeat(200)), None);
        assert!(check_token("").is_some());
        assert!(check_token("00fg").is_some());
        assert!(check_token("ab/../x").is_some());
        assert!(check_token(&"a".repeat(201)).is_some());
    }

    #[test]
    fn headers_follow_the_options() {
        let topics = Topics::new("com.example.app").expect("topics");
        let auth = HeaderValue::from_static("bearer x.y.z");
        let req = build(&job(PushOptions::default()), "ab", &auth, &topics, 100).expect("req");
        assert_eq!(req.method(), Method::POST);
        assert_eq!(req.uri().path(), "/3/device/ab");
        assert_eq!(get(&req, "authorization"), Some("bearer x.y.z"));
        assert_eq!(get(&req, "apns-topic"), Some("com.example.app"));
        assert_eq!(get(&req, "apns-push-type"), Some("alert"));
        assert_eq!(get(&req, "apns-priority"), None);
        assert_eq!(get(&req, "apns-expiration"), None);
        assert_eq!(get(&req, "content-type"), Some("application/json"));

        let voip = PushOptions {
            push_type: Some(PushType::Voip),
            priority: Some(Priority::Low),
            ttl_s: Some(60),
            collapse_id: Some("c1".into()),
            ..PushOptions::default()
        };
        let req = build(&job(voip), "ab", &auth, &topics, 100).expect("req");
        assert_eq!(get(&req, "apns-topic"), Some("com.example.app.voip"));
        assert_eq!(get(&req, "apns-priority"), Some("1"));
        assert_eq!(get(&req, "apns-expiration"), Some("160"));
        assert_eq!(get(&req, "apns-collapse-id"), Some("c1"));

        let background = PushOptions {
            push_type: Some(PushType::Background),
            expiration: Some(0),
            ttl_s: Some(60),
            ..PushOptions::default()
        };
        let req = build(&job(background), "ab", &auth, &topics, 100).expect("req");
        assert_eq!(get(&req, "apns-priority"), Some("5"));
        assert_eq!(get(&req, "apns-expiration"), Some("0"));
    }

    #[test]
    fn the_campaign_class_priority_applies_when_the_job_sets_none() {
        let topics = Topics::new("t").expect("topics");
        let auth = HeaderValue::from_static("bearer x");
        let sent = |options: PushOptions, class: Option<Priority>| {
            let job = job(options);
            job.class_priority.set(class);
            let req = build(&job, "ab", &auth, &topics, 0).expect("req");
            get(&req, "apns-priority").map(str::to_string)
        };
        let plain = PushOptions::default;
        assert_eq!(sent(plain(), Some(Priority::High)).as_deref(), Some("10"));
        assert_eq!(sent(plain(), Some(Priority::Normal)).as_deref(), Some("5"));
        assert_eq!(sent(plain(), None), None, "no class: Apple's default");
        let own = |p| PushOptions {
            priority: Some(p),
            ..PushOptions::default()
        };
        assert_eq!(
            sent(own(Priority::High), Some(Priority::Normal)).as_deref(),
            Some("10"),
            "the job's own wins"
        );
        assert_eq!(
            sent(own(Priority::Low), Some(Priority::High)).as_deref(),
            Some("1")
        );
        // A background push never takes 10 (nor 1) from its class.
        let background = || PushOptions {
            push_type: Some(PushType::Background),
            ..PushOptions::default()
        };
        for class in [Some(Priority::High), Some(Priority::Low), None] {
            assert_eq!(sent(background(), class).as_deref(), Some("5"), "{class:?}");
        }
    }

    #[test]
    fn a_collapse_id_that_is_no_header_halts_the_campaign() {
        let topics = Topics::new("t").expect("topics");
        let auth = HeaderValue::from_static("bearer x");
        let bad = PushOptions {
            collapse_id: Some("a\nb".into()),
            ..PushOptions::default()
        };
        let out = build(&job(bad), "ab", &auth, &topics, 0).expect_err("halt");
        assert!(
            matches!(
                out,
                SendOutcome::Halt {
                    scope: HaltScope::Campaign,
                    ..
                }
            ),
            "{out:?}"
        );
    }
}
