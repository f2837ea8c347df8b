//! Web Push subscriptions: the device string of a Web Push job is the browser's
//! `PushSubscription.toJSON()` in compact JSON. [`parse`] turns it into the endpoint and
//! the keys the encryption needs; [`check`] is the same parse for job validation, so a
//! subscription that could never be sent to is dead-lettered at intake with a reason.

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::Engine;
use p256::PublicKey;
use serde::Deserialize;
use std::borrow::Cow;

/// Longest endpoint URL accepted, in bytes.
pub const MAX_ENDPOINT_BYTES: usize = 2048;
/// Length of the `auth` secret (RFC 8291 section 3.2).
pub const AUTH_LEN: usize = 16;
/// Length of an uncompressed P-256 point.
pub const POINT_LEN: usize = 65;

/// Base64url that takes keys with or without `=` padding: browsers send them unpadded,
/// some server libraries store them padded.
pub(crate) const B64URL: GeneralPurpose = GeneralPurpose::new(
    &base64::alphabet::URL_SAFE,
    GeneralPurposeConfig::new()
        .with_encode_padding(false)
        .with_decode_padding_mode(DecodePaddingMode::Indifferent),
);

/// A parsed subscription.
#[derive(Clone)]
pub struct Subscription {
    /// The push resource to POST to (`https://…`).
    pub endpoint: url::Url,
    /// The user agent's ECDH public key (`keys.p256dh`).
    pub p256dh: PublicKey,
    /// The authentication secret (`keys.auth`).
    pub auth: [u8; AUTH_LEN],
}

impl std::fmt::Debug for Subscription {
    // The endpoint is a capability URL and `auth` a secret: neither is printed.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Subscription")
            .field("origin", &self.endpoint.origin().ascii_serialization())
            .finish_non_exhaustive()
    }
}

#[derive(Deserialize)]
struct RawSubscription<'a> {
    #[serde(borrow)]
    endpoint: Cow<'a, str>,
    #[serde(borrow)]
    keys: RawKeys<'a>,
}

#[derive(Deserialize)]
struct RawKeys<'a> {
    #[serde(borrow)]
    p256dh: Cow<'a, str>,
    #[serde(borrow)]
    auth: Cow<'a, str>,
}

/// Parses a subscription's JSON text. The error says what is wrong, without echoing
/// the endpoint or the keys.
pub fn parse(device: &str) -> Result<Subscription, String> {
    let raw: RawSubscription<'_> = serde_json::from_str(device).map_err(|e| {
        format!(
            "not a Web Push subscription ({{\"endpoint\":\"https://…\",\"keys\":{{\"p256dh\":…,\"auth\":…}}}}): {}",
            e.classify_reason()
        )
    })?;
    let endpoint = parse_endpoint(&raw.endpoint)?;
    let p256dh = parse_p256dh(&raw.keys.p256dh)?;
    let auth = parse_auth(&raw.keys.auth)?;
    Ok(Subscription {
        endpoint,
        p256dh,
        auth,
    })
}

/// Checks a subscription without keeping it: the job validation's entry point.
pub fn check(device: &str) -> Result<(), String> {
    parse(device).map(|_| ())
}

trait ClassifyReason {
    fn classify_reason(&self) -> &'static str;
}

impl ClassifyReason for serde_json::Error {
    // serde_json's own message may quote the input; a category says enough.
    fn classify_reason(&self) -> &'static str {
        match self.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "invalid JSON"
            }
            serde_json::error::Category::Data => {
                "missing or mistyped field (endpoint, keys.p256dh and keys.auth are strings)"
            }
            serde_json::error::Category::Io => "unreadable",
        }
    }
}

fn parse_endpoint(endpoint: &str) -> Result<url::Url, String> {
    if endpoint.len() > MAX_ENDPOINT_BYTES {
        return Err(format!(
            "endpoint is {} bytes; at most {MAX_ENDPOINT_BYTES}",
            endpoint.len()
        ));
    }
    let url = url::Url::parse(endpoint).map_err(|e| format!("endpoint is not a URL: {e}"))?;
    if url.scheme() != "https" {
        return Err(format!(
            "endpoint scheme is {:?}; push services are https only",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("endpoint has no host".into());
    }
    if !url.username().is_empty() || url.password().is_some() {
        return Err("endpoint carries user information; push endpoints never do".into());
    }
    Ok(url)
}

fn parse_p256dh(text: &str) -> Result<PublicKey, String> {
    let bytes = B64URL
        .decode(text)
        .map_err(|_| "keys.p256dh is not base64url".to_string())?;
    if bytes.len() != POINT_LEN || bytes[0] != 0x04 {
        return Err(format!(
            "keys.p256dh is {} bytes; an uncompressed P-256 point is {POINT_LEN} bytes starting 0x04",
            bytes.len()
        ));
    }
    PublicKey::from_sec1_bytes(&bytes).map_err(|_| "keys.p256dh is not a point on P-256".into())
}

fn parse_auth(text: &str) -> Result<[u8; AUTH_LEN], String> {
    let bytes = B64URL
        .decode(text)
        .map_err(|_| "keys.auth is not base64url".to_string())?;
    bytes
        .as_slice()
        .try_into()
        .map_err(|_| format!("keys.auth is {} bytes; it must be {AUTH_LEN}", bytes.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    // RFC 8291 Appendix A's user agent key and secret.
    const P256DH: &str =
        "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
    const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";

    fn sub(endpoint: &str, p256dh: &str, auth: &str) -> String {
        serde_json::json!({"endpoint": endpoint, "keys": {"p256dh": p256dh, "auth": auth}})
            .to_string()
    }

    #[test]
    fn parses_a_browser_subscription() {
        let text = sub("https://push.example.net:8443/wpush/v2/abc", P256DH, AUTH);
        let s = parse(&text).expect("valid");
        assert_eq!(
            s.endpoint.as_str(),
            "https://push.example.net:8443/wpush/v2/abc"
        );
        assert_eq!(
            s.p256dh.to_sec1_bytes().as_ref(),
            B64URL.decode(P256DH).expect("b64").as_slice()
        );
        assert_eq!(s.auth.to_vec(), B64URL.decode(AUTH).expect("b64"));
        // Extra fields such as expirationTime are ignored, padded keys accepted.
        let extra = format!(
            r#"{{"endpoint":"https://h/x","expirationTime":null,"keys":{{"p256dh":"{P256DH}","auth":"{AUTH}=="}}}}"#
        );
        assert!(check(&extra).is_ok());
    }

    #[test]
    fn rejects_with_reasons() {
        let cases = [
            ("not json".to_string(), "invalid JSON"),
            (r#"{"endpoint":"https://h/x"}"#.to_string(), "missing"),
            (sub("http://h/x", P256DH, AUTH), "https only"),
            (sub("ftp://h/x", P256DH, AUTH), "https only"),
            (sub("https://u:p@h/x", P256DH, AUTH), "user information"),
            (sub("no url", P256DH, AUTH), "not a URL"),
            (
                sub(&format!("https://h/{}", "a".repeat(2048)), P256DH, AUTH),
                "at most 2048",
            ),
            (sub("https://h/x", "!!", AUTH), "p256dh is not base64url"),
            (sub("https://h/x", &P256DH[..40], AUTH), "65 bytes"),
            (sub("https://h/x", P256DH, "AAAA"), "must be 16"),
        ];
        for (text, want) in cases {
            let err = check(&text).expect_err(&text);
            assert!(err.contains(want), "{text}: {err}");
        }
    }

    #[test]
    fn rejects_a_point_off_the_curve() {
        let mut bytes = B64URL.decode(P256DH).expect("b64");
        bytes[64] ^= 1;
        let text = sub("https://h/x", &B64URL.encode(&bytes), AUTH);
        let err = check(&text).expect_err("off curve");
        assert!(err.contains("not a point on P-256"), "{err}");
    }

    #[test]
    fn errors_and_debug_do_not_echo_secrets() {
        let text = sub("https://push.example.net/secret-path", P256DH, "AAAA");
        let err = check(&text).expect_err("bad auth");
        assert!(
            !err.contains("secret-path") && !err.contains("AAAA"),
            "{err}"
        );
        let s = parse(&sub("https://push.example.net/secret-path", P256DH, AUTH)).expect("ok");
        let dbg = format!("{s:?}");
        assert!(
            dbg.contains("push.example.net") && !dbg.contains("secret-path"),
            "{dbg}"
        );
    }
}
