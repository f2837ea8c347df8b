//! The FCM OAuth2 access token: an RS256 assertion signed with the service account's
//! key, exchanged at `token_uri` for an access token (RFC 7523, Google's
//! "service account" flow).
//!
//! A background task keeps one token: it fetches the first at once, then a new one
//! `margin` before the current expires, so that sends never wait on the token endpoint
//! (only the very first sends wait, bounded, for the first token). When the endpoint is
//! down the task retries with jittered backoff; sends keep using the current token while
//! it is valid, and once it has expired they wait (bounded) and then become
//! `RetryProvider` ("FCM token endpoint unavailable: …"), never a halt or a rejection.
//! A token the endpoint *refuses* (4xx other than 408/429: `invalid_grant`, a revoked or
//! wrong key) is a configuration error: `Halt{Provider}`; the task still retries, slowly.
//!
//! With `refresh_if_used_within` (an app's FCM) the task fetches only while a send asked
//! within that window ([`super::use_gate`]); an idle app's next send wakes it and waits
//! for the token like a first send.
//!
//! The access token lives only in a sensitive `HeaderValue`; `Debug` and logs never show
//! it, nor the assertion.

use super::account::ServiceAccount;
use super::use_gate::UseGate;
use crate::provider::ProviderError;
use crate::sender::{backoff_ceiling, HaltScope, SendOutcome};
use http::HeaderValue;
use parking_lot::{Mutex, RwLock};
use secrecy::{ExposeSecret, SecretString};
use serde::{Deserialize, Serialize};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The OAuth scope of FCM HTTP v1.
pub const SCOPE: &str = "https://www.googleapis.com/auth/firebase.messaging";
/// The RFC 7523 grant type.
pub const GRANT_TYPE: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// The assertion's lifetime: Google accepts at most one hour.
const ASSERTION_LIFETIME_S: u64 = 3600;
/// When the endpoint gives no `expires_in`, Google's usual lifetime.
const DEFAULT_EXPIRES_IN: Duration = Duration::from_secs(3600);
/// Retry backoff of the refresher: from 200 ms, doubling, up to 30 s.
const BACKOFF_BASE: Duration = Duration::from_millis(200);
const BACKOFF_MAX: Duration = Duration::from_secs(30);
/// Longest error text kept from the token endpoint.
const MAX_ERROR_CHARS: usize = 300;

/// How the token is fetched and kept.
#[derive(Debug, Clone)]
pub struct TokenConfig {
    /// Refresh this long before expiry (a token shorter-lived than twice the margin is
    /// refreshed at half its life).
    pub margin: Duration,
    /// Bound on one token request.
    pub request_timeout: Duration,
    /// How long a send waits for a token when there is no valid one.
    pub wait: Duration,
    /// Extra trusted roots for the token endpoint (PEM).
    pub ca_pem: Option<Vec<u8>>,
    /// Refresh only while a send asked for the token within this long (`None`: always).
    pub refresh_if_used_within: Option<Duration>,
}

/// Where the refresher gets a token: the token endpoint ([`Fetcher`]), or a test's.
pub trait Fetch: Send + Sync + 'static {
    fn fetch(
        &self,
    ) -> impl std::future::Future<Output = Result<(HeaderValue, Duration), TokenError>> + Send;
}

impl Fetch for Fetcher {
    fn fetch(
        &self,
    ) -> impl std::future::Future<Output = Result<(HeaderValue, Duration), TokenError>> + Send {
        Fetcher::fetch(self)
    }
}

/// The `authorization` header of one token, with its generation (to ask for a newer
/// one after a 401).
#[derive(Clone)]
pub struct Bearer {
    pub header: HeaderValue,
    pub generation: u64,
}

impl std::fmt::Debug for Bearer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Bearer(<redacted>, generation {})", self.generation)
    }
}

/// Why there is no token.
#[derive(Debug, Clone, thiserror::Error)]
pub enum TokenError {
    /// Down, slow, 5xx, 429, a TLS or connection error: retry.
    #[error("{0}")]
    Unavailable(String),
    /// The endpoint answered that it will not grant a token (4xx).
    #[error("{0}")]
    Refused(String),
}

impl TokenError {
    /// The send outcome while this is the reason there is no token.
    pub fn to_outcome(&self) -> SendOutcome {
        match self {
            TokenError::Unavailable(e) => SendOutcome::RetryProvider {
                after: None,
                reason: format!("FCM token endpoint unavailable: {e}"),
                // The token endpoint's trouble says nothing of the send quota.
                signal: None,
            },
            TokenError::Refused(e) => SendOutcome::Halt {
                scope: HaltScope::Provider,
                reason: format!("FCM token endpoint refused the service account: {e}"),
            },
        }
    }
}

/// Signs assertions and exchanges them at the token endpoint.
pub struct Fetcher {
    client: reqwest::Client,
    account: Arc<ServiceAccount>,
}

#[derive(Serialize)]
struct Claims<'a> {
    iss: &'a str,
    scope: &'a str,
    aud: &'a str,
    iat: u64,
    exp: u64,
}

#[derive(Deserialize)]
struct Grant {
    access_token: SecretString,
    expires_in: Option<u64>,
}

impl Fetcher {
    /// A client for `token_uri`: rustls with the webpki roots plus `ca_pem`, no proxies.
    pub fn new(
        provider: &str,
        account: Arc<ServiceAccount>,
        cfg: &TokenConfig,
    ) -> Result<Self, ProviderError> {
        let tls = |problem: String| ProviderError::Tls {
            provider: provider.to_string(),
            problem,
        };
        let mut builder = reqwest::Client::builder()
            .no_proxy()
            .https_only(true)
            .timeout(cfg.request_timeout)
            .connect_timeout(cfg.request_timeout);
        if let Some(pem) = &cfg.ca_pem {
            let certs = reqwest::Certificate::from_pem_bundle(pem)
                .map_err(|e| tls(format!("ca_file is not PEM certificates: {e}")))?;
            for cert in certs {
                builder = builder.add_root_certificate(cert);
            }
        }
        let client = builder
            .build()
            .map_err(|e| tls(format!("token endpoint client: {e}")))?;
        Ok(Self { client, account })
    }

    /// The signed assertion (a credential itself: never logged).
    fn assertion(&self) -> Result<SecretString, TokenError> {
        let iat = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let claims = Claims {
            iss: &self.account.client_email,
            scope: SCOPE,
            aud: &self.account.token_uri,
            iat,
            exp: iat + ASSERTION_LIFETIME_S,
        };
        let header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        jsonwebtoken::encode(&header, &claims, &self.account.key)
            .map(SecretString::from)
            .map_err(|e| TokenError::Refused(format!("cannot sign the assertion: {e}")))
    }

    /// One exchange: the `authorization` header value and the token's lifetime.
    pub async fn fetch(&self) -> Result<(HeaderValue, Duration), TokenError> {
        let assertion = self.assertion()?;
        // The JWT is base64url and dots: nothing to escape in a form body.
        let body = format!(
            "grant_type={}&assertion={}",
            GRANT_TYPE.replace(':', "%3A"),
            assertion.expose_secret()
        );
        let answer = self
            .client
            .post(&self.account.token_uri)
            .header(
                http::header::CONTENT_TYPE,
                "application/x-www-form-urlencoded",
            )
            .body(body)
            .send()
            .await
            .map_err(|e| TokenError::Unavailable(error_chain(&e)))?;
        let status = answer.status();
        let bytes = answer
            .bytes()
            .await
            .map_err(|e| TokenError::Unavailable(error_chain(&e)))?;
        if !status.is_success() {
            let text = clip(String::from_utf8_lossy(&bytes).trim());
            let problem = format!("{} from {}: {text}", status, self.account.token_uri);
            let transient = status.is_server_error()
                || status == http::StatusCode::TOO_MANY_REQUESTS
                || status == http::StatusCode::REQUEST_TIMEOUT;
            return Err(if transient {
                TokenError::Unavailable(problem)
            } else {
                TokenError::Refused(problem)
            });
        }
        let grant: Grant = serde_json::from_slice(&bytes).map_err(|_| {
            TokenError::Unavailable("the token endpoint's answer has no access_token".into())
        })?;
        let mut header =
            HeaderValue::from_str(&format!("Bearer {}", grant.access_token.expose_secret()))
                .map_err(|_| {
                    TokenError::Unavailable("the access token is not a header value".into())
                })?;
        header.set_sensitive(true);
        let ttl = grant
            .expires_in
            .map_or(DEFAULT_EXPIRES_IN, Duration::from_secs);
        Ok((header, ttl))
    }
}

/// reqwest's error with its sources ("error sending request: … : connection refused").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    clip(&out)
}

fn clip(s: &str) -> String {
    match s.char_indices().nth(MAX_ERROR_CHARS) {
        Some((cut, _)) => format!("{}…", &s[..cut]),
        None => s.to_string(),
    }
}

struct Current {
    bearer: Bearer,
    expires_at: Instant,
}

/// What the refresher and the senders share.
struct State {
    current: RwLock<Option<Current>>,
    last_error: Mutex<Option<TokenError>>,
    /// Woken after every attempt of the refresher, good or bad.
    changed: Notify,
    /// A sender got 401 with generation `forced`: refresh now.
    force: Notify,
    forced: AtomicU64,
    generation: AtomicU64,
    uses: UseGate,
}

impl State {
    /// The current token when it is valid and newer than `newer_than`.
    fn usable(&self, newer_than: u64) -> Option<Bearer> {
        let current = self.current.read();
        let c = current.as_ref()?;
        (c.bearer.generation > newer_than && c.expires_at > Instant::now())
            .then(|| c.bearer.clone())
    }
}

/// The cached access token and its background refresher (stopped on drop).
pub struct TokenSource {
    state: Arc<State>,
    task: JoinHandle<()>,
    wait: Duration,
}

impl std::fmt::Debug for TokenSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenSource")
            .field("generation", &self.state.generation.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Drop for TokenSource {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl TokenSource {
    /// Starts the refresher (needs a tokio runtime).
    pub fn start<F: Fetch>(provider: &str, fetcher: F, cfg: &TokenConfig) -> Self {
        let state = Arc::new(State {
            current: RwLock::new(None),
            last_error: Mutex::new(None),
            changed: Notify::new(),
            force: Notify::new(),
            forced: AtomicU64::new(0),
            generation: AtomicU64::new(0),
            uses: UseGate::new(cfg.refresh_if_used_within),
        });
        let task = tokio::spawn(refresh_loop(
            Arc::clone(&state),
            fetcher,
            cfg.margin,
            Arc::from(provider),
        ));
        Self {
            state,
            task,
            wait: cfg.wait,
        }
    }

    /// The current token; waits (bounded) only when there is no valid one.
    pub async fn bearer(&self) -> Result<Bearer, TokenError> {
        self.state.uses.used();
        if let Some(b) = self.state.usable(0) {
            return Ok(b);
        }
        self.wait_newer(0).await
    }

    /// After a 401 with `rejected`: asks for a new token at once and waits (bounded)
    /// for one newer than it.
    pub async fn refresh_after(&self, rejected: &Bearer) -> Result<Bearer, TokenError> {
        self.state.uses.used();
        if let Some(b) = self.state.usable(rejected.generation) {
            return Ok(b);
        }
        self.state
            .forced
            .fetch_max(rejected.generation, Ordering::AcqRel);
        self.state.force.notify_one();
        self.wait_newer(rejected.generation).await
    }

    /// Tokens granted so far.
    pub fn generation(&self) -> u64 {
        self.state.generation.load(Ordering::Acquire)
    }

    async fn wait_newer(&self, newer_than: u64) -> Result<Bearer, TokenError> {
        let deadline = Instant::now() + self.wait;
        loop {
            let changed = self.state.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            if let Some(b) = self.state.usable(newer_than) {
                return Ok(b);
            }
            // A refusal is definitive: no point waiting for the next attempt.
            if let Some(refused @ TokenError::Refused(_)) = &*self.state.last_error.lock() {
                return Err(refused.clone());
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                return Err(self.state.last_error.lock().clone().unwrap_or_else(|| {
                    TokenError::Unavailable(format!("no access token within {:?}", self.wait))
                }));
            }
        }
    }
}

/// When to refresh a token that lives `ttl`: `margin` before expiry, or at half its
/// life when it is too short for the margin.
pub fn refresh_delay(ttl: Duration, margin: Duration) -> Duration {
    if ttl > margin.saturating_mul(2) {
        ttl - margin
    } else {
        ttl / 2
    }
}

async fn refresh_loop<F: Fetch>(state: Arc<State>, fetcher: F, margin: Duration, name: Arc<str>) {
    let mut failures = 0u32;
    loop {
        // An app unused for its window stops here until its next send.
        if state.uses.until_used(&name).await {
            tracing::debug!(provider = %name, "FCM token refresh resumed by a send");
        }
        let asked = Instant::now();
        match fetcher.fetch().await {
            Ok((header, ttl)) => {
                failures = 0;
                let generation = state.generation.fetch_add(1, Ordering::AcqRel) + 1;
                *state.current.write() = Some(Current {
                    bearer: Bearer { header, generation },
                    // Counted from the request, so the token is never kept past expiry.
                    expires_at: asked + ttl,
                });
                *state.last_error.lock() = None;
                state.changed.notify_waiters();
                tracing::debug!(provider = %name, ?ttl, generation, "FCM access token granted");
                let due = asked + refresh_delay(ttl, margin);
                loop {
                    tokio::select! {
                        _ = tokio::time::sleep_until(due) => break,
                        _ = state.force.notified() => {
                            // Only a 401 on this token forces a refresh; an older one
                            // was answered by this very token.
                            if state.forced.load(Ordering::Acquire) >= generation {
                                break;
                            }
                        }
                    }
                }
            }
            Err(e) => {
                failures = failures.saturating_add(1);
                tracing::warn!(provider = %name, failures, error = %e, "FCM access token request failed");
                *state.last_error.lock() = Some(e);
                state.changed.notify_waiters();
                let ceiling = backoff_ceiling(failures, BACKOFF_BASE, BACKOFF_MAX);
                // Jitter in [ceiling/2, ceiling]: several workers do not retry together.
                let nanos = ceiling.as_nanos() as u64;
                let delay = Duration::from_nanos(fastrand::u64(nanos / 2..=nanos));
                tokio::time::sleep(delay).await;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refresh_is_margin_before_expiry_or_at_half_life() {
        let m = Duration::from_secs(300);
        assert_eq!(
            refresh_delay(Duration::from_secs(3600), m),
            Duration::from_secs(3300)
        );
        assert_eq!(
            refresh_delay(Duration::from_secs(3), Duration::from_secs(1)),
            Duration::from_secs(2)
        );
        assert_eq!(
            refresh_delay(Duration::from_secs(400), m),
            Duration::from_secs(200)
        );
    }

    #[test]
    fn errors_map_to_retry_or_halt() {
        let down = TokenError::Unavailable("503".into()).to_outcome();
        assert!(
            matches!(&down, SendOutcome::RetryProvider { reason, .. } if reason.starts_with("FCM token endpoint unavailable: 503"))
        );
        let refused = TokenError::Refused("invalid_grant".into()).to_outcome();
        assert!(matches!(
            refused,
            SendOutcome::Halt {
                scope: HaltScope::Provider,
                ..
            }
        ));
    }

    /// A token endpoint that grants at once and counts its grants.
    struct Counting(Arc<AtomicU64>);

    impl Fetch for Counting {
        fn fetch(
            &self,
        ) -> impl std::future::Future<Output = Result<(HeaderValue, Duration), TokenError>> + Send
        {
            self.0.fetch_add(1, Ordering::SeqCst);
            std::future::ready(Ok((HeaderValue::from_static("Bearer t"), HOUR)))
        }
    }

    const HOUR: Duration = Duration::from_secs(3600);
    const MINUTE: Duration = Duration::from_secs(60);

    /// One-hour tokens refreshed 5 minutes early: a grant every 55 minutes.
    fn source(window: Option<Duration>) -> (TokenSource, Arc<AtomicU64>) {
        let grants = Arc::new(AtomicU64::new(0));
        let cfg = TokenConfig {
            margin: 5 * MINUTE,
            request_timeout: Duration::from_secs(10),
            wait: Duration::from_secs(10),
            ca_pem: None,
            refresh_if_used_within: window,
        };
        (
            TokenSource::start("p", Counting(grants.clone()), &cfg),
            grants,
        )
    }

    fn count(grants: &AtomicU64) -> u64 {
        grants.load(Ordering::SeqCst)
    }

    /// Paused time: the clock jumps only when every task waits, so each refresh falls
    /// exactly on its due instant.
    #[tokio::test(start_paused = true)]
    async fn an_unused_apps_token_stops_refreshing_until_its_next_send() {
        let (app, app_grants) = source(Some(HOUR));
        let (fixed, fixed_grants) = source(None);
        app.bearer().await.unwrap();
        fixed.bearer().await.unwrap();
        tokio::time::sleep(56 * MINUTE).await;
        // At 55 min the last send (at 0) is within the hour: refreshed.
        assert_eq!(count(&app_grants), 2);
        tokio::time::sleep(5 * HOUR).await;
        // At 110 min it is not: no more grants, however long.
        assert_eq!(count(&app_grants), 2);
        // The static provider refreshed all along: at 0, 55, 110, …, 330 min.
        assert_eq!(count(&fixed_grants), 7);
        // The token expired at 115 min: the send waits for a fresh one.
        let before = tokio::time::Instant::now();
        let b = app.bearer().await.unwrap();
        assert_eq!((b.generation, count(&app_grants)), (3, 3));
        assert!(before.elapsed() < Duration::from_secs(1), "fetched at once");
        // And refreshing resumed: 55 min after that grant.
        tokio::time::sleep(56 * MINUTE).await;
        assert_eq!(count(&app_grants), 4);
    }

    #[tokio::test(start_paused = true)]
    async fn a_send_while_dormant_with_a_valid_token_uses_it_and_wakes_the_refresher() {
        let (app, grants) = source(Some(30 * MINUTE));
        app.bearer().await.unwrap();
        // Due at 55 min, unused since 0 past the 30-min window: dormant, token valid to 60.
        tokio::time::sleep(57 * MINUTE).await;
        assert_eq!(count(&grants), 1);
        let b = app.bearer().await.unwrap();
        assert_eq!(b.generation, 1, "the valid token, no wait");
        tokio::time::sleep(MINUTE).await;
        assert_eq!(count(&grants), 2, "the refresher woke and fetched");
    }

    #[test]
    fn bearer_debug_is_redacted() {
        let b = Bearer {
            header: HeaderValue::from_static("Bearer sekrit"),
            generation: 3,
        };
        assert!(!format!("{b:?}").contains("sekrit"));
    }
}
