//! The Redis connection a component keeps (the limiter leases in `distributed`, the
//! frequency cap in `capping::shared`): opened in the background so that start-up
//! never waits for Redis, retried until it answers, then kept by the connection
//! manager, which reconnects by itself. Every call is bounded by a timeout, and one
//! error type says what went wrong. Every Redis client pushpace makes comes from
//! [`client_for`], which applies TLS (`rediss://`, a CA file, a client certificate) and
//! the ACL credentials.

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::IntoConnectionInfo;
use secrecy::{ExposeSecret, SecretString};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::time::Duration;

/// How long a failed first connection waits before the next attempt.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// What went wrong with Redis.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("redis.url: {0}")]
    Url(#[source] redis::RedisError),
    #[error("redis: {}", describe(.0))]
    Redis(#[from] redis::RedisError),
    #[error("redis: not connected")]
    NotConnected,
    #[error("redis: no answer within {0:?}")]
    Timeout(Duration),
    #[error("a Redis connection needs a Tokio runtime")]
    NoRuntime,
    #[error("{key}: cannot read {}: {reason}", path.display())]
    File {
        key: &'static str,
        path: PathBuf,
        reason: String,
    },
    #[error("{0} needs a rediss:// URL (TLS); redis.url is redis://")]
    TlsWithoutRediss(&'static str),
}

/// Where and how to connect: the URL and what overrides or adds to it.
#[derive(Clone)]
pub struct RedisTarget {
    /// `redis://` or `rediss://`; may hold `username:password`.
    pub url: SecretString,
    /// The ACL user, over the URL's.
    pub username: Option<String>,
    /// The password, over the URL's.
    pub password: Option<SecretString>,
    /// The CA that signs the server's certificate (PEM), instead of the public roots.
    pub ca_file: Option<PathBuf>,
    /// A client certificate and its key (PEM), for mutual TLS.
    pub cert_file: Option<PathBuf>,
    pub key_file: Option<PathBuf>,
}

impl RedisTarget {
    /// Just a URL: its own credentials, the public roots for `rediss://`.
    pub fn url(url: impl Into<String>) -> RedisTarget {
        RedisTarget {
            url: SecretString::from(url.into()),
            username: None,
            password: None,
            ca_file: None,
            cert_file: None,
            key_file: None,
        }
    }
}

impl std::fmt::Debug for RedisTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTarget")
            .field("url", &crate::redact::url(self.url.expose_secret()))
            .field("username", &self.username)
            .field("password", &self.password.as_ref().map(|_| "[set]"))
            .field("ca_file", &self.ca_file)
            .field("cert_file", &self.cert_file)
            .field("key_file", &self.key_file)
            .finish()
    }
}

/// The client for `target`: its credentials over the URL's, and with a CA or client
/// certificate, TLS on them. Files are read here, so a missing one fails at start-up.
pub fn client_for(target: &RedisTarget) -> Result<redis::Client, LinkError> {
    let mut info = target
        .url
        .expose_secret()
        .into_connection_info()
        .map_err(LinkError::Url)?;
    if let Some(user) = &target.username {
        info.redis.username = Some(user.clone());
    }
    if let Some(password) = &target.password {
        info.redis.password = Some(password.expose_secret().to_string());
    }
    let tls = matches!(info.addr, redis::ConnectionAddr::TcpTls { .. });
    let files = [
        ("redis.ssl_ca_file", &target.ca_file),
        ("redis.ssl_cert_file", &target.cert_file),
        ("redis.ssl_key_file", &target.key_file),
    ];
    if let Some((key, _)) = files.iter().find(|(_, f)| f.is_some()) {
        if !tls {
            return Err(LinkError::TlsWithoutRediss(key));
        }
    } else {
        return redis::Client::open(info).map_err(LinkError::Url);
    }
    let root_cert = match &target.ca_file {
        Some(p) => Some(read_pem("redis.ssl_ca_file", p)?),
        None => None,
    };
    let client_tls = match (&target.cert_file, &target.key_file) {
        (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
            client_cert: read_pem("redis.ssl_cert_file", cert)?,
            client_key: read_pem("redis.ssl_key_file", key)?,
        }),
        _ => None,
    };
    let certs = redis::TlsCertificates {
        client_tls,
        root_cert,
    };
    redis::Client::build_with_tls(info, certs).map_err(LinkError::Url)
}

fn read_pem(key: &'static str, path: &Path) -> Result<Vec<u8>, LinkError> {
    std::fs::read(path).map_err(|e| LinkError::File {
        key,
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

/// The connection slot, empty until the first connection is made.
pub struct RedisLink {
    conn: Mutex<Option<ConnectionManager>>,
    /// Why the first connection is not made yet: for logs, tests and readiness.
    last_error: Mutex<Option<String>>,
    timeout: Duration,
}

impl RedisLink {
    /// An empty slot; calls are bounded by `timeout`.
    pub fn new(timeout: Duration) -> RedisLink {
        RedisLink {
            conn: Mutex::new(None),
            last_error: Mutex::new(None),
            timeout,
        }
    }

    /// The current runtime and a client for `target` ([`client_for`]), checked before
    /// anything is spawned.
    pub fn open(
        target: &RedisTarget,
    ) -> Result<(tokio::runtime::Handle, redis::Client), LinkError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| LinkError::NoRuntime)?;
        Ok((runtime, client_for(target)?))
    }

    /// The last failed attempt's error while not connected (`None` once connected).
    pub fn last_error(&self) -> Option<String> {
        self.last_error.lock().clone()
    }

    /// Whether a connection has been made (it reconnects by itself afterwards).
    pub fn is_connected(&self) -> bool {
        self.conn.lock().is_some()
    }

    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// Runs one call on the connection, bounded by the timeout.
    pub async fn call<T, E, Fut>(&self, f: impl FnOnce(ConnectionManager) -> Fut) -> Result<T, E>
    where
        E: From<LinkError>,
        Fut: Future<Output = Result<T, E>>,
    {
        // A clone shares the multiplexed connection; the lock is never held over a wait.
        let conn = self.conn.lock().clone().ok_or(LinkError::NotConnected)?;
        tokio::time::timeout(self.timeout, f(conn))
            .await
            .map_err(|_| LinkError::Timeout(self.timeout))?
    }
}

/// Opens the connection of the [`RedisLink`] that `owner` keeps (found by `link`),
/// retrying every [`RECONNECT_EVERY`] until Redis answers or the owner is dropped.
/// `connected` runs once it is up; `failed` gets each failed attempt's error.
pub async fn connect_until_up<T>(
    owner: Weak<T>,
    client: redis::Client,
    link: impl Fn(&T) -> &RedisLink,
    connected: impl Fn(&T),
    failed: impl Fn(&T, LinkError),
) {
    loop {
        let Some(o) = owner.upgrade() else { return };
        let timeout = link(&o).timeout;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(timeout)
            .set_response_timeout(timeout)
            .set_number_of_retries(1)
            .set_max_delay(1000);
        match tokio::time::timeout(timeout, open_checked(&client, config)).await {
            Ok(Ok(conn)) => {
                *link(&o).conn.lock() = Some(conn);
                *link(&o).last_error.lock() = None;
                return connected(&o);
            }
            Ok(Err(e)) => {
                let e = LinkError::Redis(e);
                *link(&o).last_error.lock() = Some(e.to_string());
                failed(&o, e)
            }
            Err(_) => {
                let e = cause_of_timeout(&client, timeout).await;
                *link(&o).last_error.lock() = Some(e.to_string());
                failed(&o, e)
            }
        }
        drop(o);
        tokio::time::sleep(RECONNECT_EVERY).await;
    }
}

/// A connection manager whose connection answers a PING: a server that wants AUTH
/// accepts the connection and refuses only the first command (NOAUTH).
async fn open_checked(
    client: &redis::Client,
    config: ConnectionManagerConfig,
) -> Result<ConnectionManager, redis::RedisError> {
    let mut conn = ConnectionManager::new_with_config(client.clone(), config).await?;
    redis::cmd("PING").query_async::<()>(&mut conn).await?;
    Ok(conn)
}

/// The manager retries a refused handshake within its own timeout, hiding the cause
/// (an untrusted certificate, WRONGPASS): one direct attempt names it.
async fn cause_of_timeout(client: &redis::Client, timeout: Duration) -> LinkError {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(timeout)
        .set_response_timeout(timeout);
    let attempt = client.get_multiplexed_async_connection_with_config(&config);
    match tokio::time::timeout(timeout, attempt).await {
        Ok(Err(e)) => LinkError::Redis(e),
        _ => LinkError::Timeout(timeout),
    }
}

/// The error as shown: the crate turns the server's WRONGPASS into "Password
/// authentication failed", so the server's word and the keys to check are put back.
fn describe(e: &redis::RedisError) -> String {
    if e.kind() == redis::ErrorKind::AuthenticationFailed {
        format!("WRONGPASS: the server refused the user or its password, check redis.username and redis.password (or the URL's) ({e})")
    } else {
        e.to_string()
    }
}
