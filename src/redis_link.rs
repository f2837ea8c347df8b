//! The Redis connection a component keeps (the limiter leases in `distributed`, the
//! frequency cap in `capping::shared`): opened in the background so that start-up
//! never waits for Redis, retried until it answers, then kept by the connection
//! manager, which reconnects by itself. Every call is bounded by a timeout, and one
//! error type says what went wrong.

use parking_lot::Mutex;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::future::Future;
use std::sync::Weak;
use std::time::Duration;

/// How long a failed first connection waits before the next attempt.
const RECONNECT_EVERY: Duration = Duration::from_millis(500);

/// What went wrong with Redis.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    #[error("redis.url: {0}")]
    Url(#[source] redis::RedisError),
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("redis: not connected")]
    NotConnected,
    #[error("redis: no answer within {0:?}")]
    Timeout(Duration),
    #[error("a Redis connection needs a Tokio runtime")]
    NoRuntime,
}

/// The connection slot, empty until the first connection is made.
pub struct RedisLink {
    conn: Mutex<Option<ConnectionManager>>,
    timeout: Duration,
}

impl RedisLink {
    /// An empty slot; calls are bounded by `timeout`.
    pub fn new(timeout: Duration) -> RedisLink {
        RedisLink {
            conn: Mutex::new(None),
            timeout,
        }
    }

    /// The current runtime and a client for `url`, checked before anything is spawned.
    pub fn open(url: &str) -> Result<(tokio::runtime::Handle, redis::Client), LinkError> {
        let runtime = tokio::runtime::Handle::try_current().map_err(|_| LinkError::NoRuntime)?;
        let client = redis::Client::open(url).map_err(LinkError::Url)?;
        Ok((runtime, client))
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
        match tokio::time::timeout(
            timeout,
            ConnectionManager::new_with_config(client.clone(), config),
        )
        .await
        {
            Ok(Ok(conn)) => {
                *link(&o).conn.lock() = Some(conn);
                return connected(&o);
            }
            Ok(Err(e)) => failed(&o, LinkError::Redis(e)),
            Err(_) => failed(&o, LinkError::Timeout(timeout)),
        }
        drop(o);
        tokio::time::sleep(RECONNECT_EVERY).await;
    }
}
