//! Who may call the API: the admin token, and the `Host` check.
//!
//! The admin token guards every mutating endpoint and the dead letters (which hold device
//! tokens and payloads): `Authorization: Bearer <http.admin_token>`: missing → 401,
//! wrong → 403, and when no token is configured they are refused with a message saying
//! how to set one. The comparison takes the same time whatever the bytes (it leaks only
//! the length), and the token is never logged.
//!
//! The `Host` check guards every request, the dashboard included: a web page on another
//! site could otherwise point its own name at 127.0.0.1 (DNS rebinding) and read the
//! API as same-origin. Only the bound address (`127.0.0.1:PORT`, `localhost:PORT`,
//! `[::1]:PORT`, and the bound IP) and `http.allowed_hosts` are served; any other
//! `Host` is answered 421.

use super::error::ApiError;
use super::AppState;
use axum::extract::{Request, State};
use axum::http::header::{AUTHORIZATION, HOST};
use axum::middleware::Next;
use axum::response::Response;
use std::net::{IpAddr, Ipv6Addr, SocketAddr};
use std::sync::Arc;
use subtle::ConstantTimeEq;

/// Middleware: lets the request through only with the configured admin token.
pub async fn require_admin(
    State(state): State<AppState>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    check(state.admin_token(), request.headers().get(AUTHORIZATION))?;
    Ok(next.run(request).await)
}

/// The decision, apart from the HTTP plumbing.
pub fn check(
    configured: Option<&str>,
    header: Option<&axum::http::HeaderValue>,
) -> Result<(), ApiError> {
    let expected = configured.ok_or(ApiError::TokenNotConfigured)?;
    let header = header.ok_or(ApiError::Unauthorized)?;
    let value = header.to_str().map_err(|_| ApiError::Unauthorized)?;
    let (scheme, token) = value.split_once(' ').ok_or(ApiError::Unauthorized)?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(ApiError::Unauthorized);
    }
    if tokens_match(token.trim().as_bytes(), expected.as_bytes()) {
        Ok(())
    } else {
        Err(ApiError::Forbidden)
    }
}

/// Constant-time equality (for equal lengths; a length mismatch is not secret).
pub fn tokens_match(given: &[u8], expected: &[u8]) -> bool {
    given.len() == expected.len() && bool::from(given.ct_eq(expected))
}

/// The port a `Host` without one means: the API speaks plain HTTP.
const DEFAULT_PORT: u16 = 80;

/// One accepted host: a name (DNS name, IPv4, or `[IPv6]`, lower case) and a port, or
/// any port when none was given.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern {
    name: String,
    port: Option<u16>,
}

impl HostPattern {
    /// Parses `name` or `name:port` (`[::1]:8080` for IPv6), as a `Host` header or an
    /// `http.allowed_hosts` entry writes it.
    pub fn parse(raw: &str) -> Result<HostPattern, String> {
        let bad = |why: &str| format!("{:?} is not a host or host:port: {why}", clip(raw));
        let (name, port) = if let Some(rest) = raw.strip_prefix('[') {
            let (ip, after) = rest.split_once(']').ok_or_else(|| bad("no closing ]"))?;
            let ip = ip
                .parse::<Ipv6Addr>()
                .map_err(|_| bad("not an IPv6 address in [ ]"))?;
            let port = match after {
                "" => None,
                p => Some(p.strip_prefix(':').ok_or_else(|| bad("junk after ]"))?),
            };
            (format!("[{ip}]"), port)
        } else {
            let (name, port) = match raw.split_once(':') {
                Some((n, p)) => (n, Some(p)),
                None => (raw, None),
            };
            let name_ok = !name.is_empty()
                && name.len() <= 253
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'));
            if !name_ok {
                return Err(bad("a name has only letters, digits, '.', '-' and '_'"));
            }
            (name.to_ascii_lowercase(), port)
        };
        let port = match port {
            None => None,
            Some(p) => Some(
                p.parse::<u16>()
                    .ok()
                    .filter(|_| p.bytes().all(|b| b.is_ascii_digit()))
                    .ok_or_else(|| bad("the port is not 0-65535"))?,
            ),
        };
        Ok(HostPattern { name, port })
    }

    fn exact(name: impl Into<String>, port: u16) -> HostPattern {
        HostPattern {
            name: name.into(),
            port: Some(port),
        }
    }

    /// Whether a parsed `Host` (whose missing port means 80) is this pattern.
    fn matches(&self, host: &HostPattern) -> bool {
        self.name == host.name
            && self
                .port
                .is_none_or(|p| p == host.port.unwrap_or(DEFAULT_PORT))
    }
}

/// The hosts the API answers to: the bound address and `http.allowed_hosts`.
#[derive(Debug, Clone)]
pub struct AllowedHosts {
    patterns: Vec<HostPattern>,
}

impl AllowedHosts {
    /// `bound` is the address actually listened on (its real port when `http.bind` asked
    /// for port 0); `extra` are `http.allowed_hosts` entries.
    pub fn new(bound: SocketAddr, extra: &[String]) -> Result<AllowedHosts, String> {
        let port = bound.port();
        let mut patterns = vec![
            HostPattern::exact("127.0.0.1", port),
            HostPattern::exact("localhost", port),
            HostPattern::exact("[::1]", port),
        ];
        // An IP literal cannot be rebound, so the bound IP itself is always safe.
        match bound.ip() {
            ip if ip.is_unspecified() => {}
            IpAddr::V4(ip) => patterns.push(HostPattern::exact(ip.to_string(), port)),
            IpAddr::V6(ip) => patterns.push(HostPattern::exact(format!("[{ip}]"), port)),
        }
        for entry in extra {
            patterns.push(HostPattern::parse(entry)?);
        }
        Ok(AllowedHosts { patterns })
    }

    /// Whether a request naming `host` (a `Host` header value) is served.
    pub fn allows(&self, host: &str) -> bool {
        HostPattern::parse(host).is_ok_and(|h| self.patterns.iter().any(|p| p.matches(&h)))
    }
}

/// Middleware: serves only requests whose `Host` (or HTTP/2 authority) is allowed.
pub async fn require_known_host(
    State(hosts): State<Arc<AllowedHosts>>,
    request: Request,
    next: Next,
) -> Result<Response, ApiError> {
    let host = match request.headers().get(HOST) {
        Some(v) => v.to_str().ok().map(str::to_string),
        None => request.uri().authority().map(|a| a.as_str().to_string()),
    };
    match host {
        Some(h) if hosts.allows(&h) => Ok(next.run(request).await),
        Some(h) => Err(ApiError::UnknownHost(clip(&h))),
        None => Err(ApiError::UnknownHost(String::new())),
    }
}

/// A caller's host, cut for echoing in a message.
fn clip(s: &str) -> String {
    s.chars().take(100).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::http::HeaderValue;

    #[test]
    fn hosts() {
        let bound: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let extra = ["pushpace.internal".to_string(), "ops.example:9000".into()];
        let hosts = AllowedHosts::new(bound, &extra).unwrap();
        for ok in [
            "127.0.0.1:8080",
            "localhost:8080",
            "LocalHost:8080",
            "[::1]:8080",
            "pushpace.internal",
            "pushpace.internal:1234",
            "ops.example:9000",
        ] {
            assert!(hosts.allows(ok), "{ok}");
        }
        for bad in [
            "evil.example",
            "evil.example:8080",
            "127.0.0.1:8081",
            "127.0.0.1",
            "localhost",
            "localhost.:8080",
            "ops.example:9001",
            "ops.example",
            "127.0.0.1:8080@evil",
            "[::2]:8080",
            "",
            "127.0.0.1:+8080",
            "127.0.0.1:8080:1",
        ] {
            assert!(!hosts.allows(bad), "{bad}");
        }
        // Bound on port 80, a Host without a port names it.
        let on_80 = AllowedHosts::new("127.0.0.1:80".parse().unwrap(), &[]).unwrap();
        assert!(on_80.allows("localhost"));
        // A specific bound IP is allowed as itself; 0.0.0.0 is not a host.
        let lan = AllowedHosts::new("10.1.2.3:8080".parse().unwrap(), &[]).unwrap();
        assert!(lan.allows("10.1.2.3:8080"));
        let any = AllowedHosts::new("0.0.0.0:8080".parse().unwrap(), &[]).unwrap();
        assert!(!any.allows("0.0.0.0:8080"));
        let v6 = AllowedHosts::new("[fd00::1]:8080".parse().unwrap(), &[]).unwrap();
        assert!(v6.allows("[FD00::1]:8080"));
        for bad in ["http://x", "x/y", "x:port", "[::1", "a b", ""] {
            assert!(HostPattern::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn decisions() {
        let ok = HeaderValue::from_static("Bearer s3cret");
        assert!(check(Some("s3cret"), Some(&ok)).is_ok());
        assert!(check(
            Some("s3cret"),
            Some(&HeaderValue::from_static("bearer s3cret"))
        )
        .is_ok());
        assert!(matches!(
            check(Some("s3cret"), None),
            Err(ApiError::Unauthorized)
        ));
        assert!(matches!(
            check(
                Some("s3cret"),
                Some(&HeaderValue::from_static("Basic s3cret"))
            ),
            Err(ApiError::Unauthorized)
        ));
        assert!(matches!(
            check(
                Some("s3cret"),
                Some(&HeaderValue::from_static("Bearer s3creT"))
            ),
            Err(ApiError::Forbidden)
        ));
        assert!(matches!(
            check(Some("s3cret"), Some(&HeaderValue::from_static("Bearer s3"))),
            Err(ApiError::Forbidden)
        ));
        assert!(matches!(
            check(None, Some(&ok)),
            Err(ApiError::TokenNotConfigured)
        ));
    }
}
