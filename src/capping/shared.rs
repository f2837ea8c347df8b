//! `capping.scope = "redis"`: the exact cap, shared by every worker through Redis.
//!
//! The decision is made per held job at intake (the consumer's lookup task, next to the
//! token-hygiene skip set), never on the scheduler's path: one EVALSHA per job, or per
//! [`CHUNK`] devices of a larger one. The script reserves a send for each device under
//! the cap in the current window and returns the ones at the cap; those join the job's
//! skip set and are counted as `capped`.
//!
//! Keys and members (no raw token or id reaches Redis):
//! - one set per (window, device): `{prefix}:cap:{window}:{first 16 bytes of the token's
//!   SHA-256, hex}`, expiring [`TTL_MARGIN`] after the window ends;
//! - its members: one 64-bit integer per reserved send, a hash of (campaign, job_id,
//!   device index), so the count is the set's size. Re-reserving the same member is a
//!   no-op: a job read again after a crash or a rebalance counts nothing twice. Integer
//!   members keep the set in Redis's compact intset encoding.
//!
//! The window is `Redis TIME / window`, so all workers agree on its edges whatever their
//! clocks. Exact in both directions: the script is atomic, so across any number of
//! workers a device under the cap is never refused and one at it always is.
//!
//! **Window edges.** A reservation is made at intake, when the job is held: up to
//! `worker.lookahead_ms` before the device's send (longer if its campaign is paused or
//! slowed after intake). The send counts in the window of its reservation, so near an
//! edge a send reserved at the end of window w may go out at the start of w+1 and
//! still count in w. Reservations per device and window never exceed the cap; as with
//! any fixed window, a device may get `max_per_device` sends at the end of one window
//! and as many at the start of the next, and the lookahead only moves that edge by up
//! to `lookahead_ms`. A job read again in a later window reserves in that window (its
//! sends are new sends there).
//!
//! **Failed sends.** A send that fails for good (dead letter: HTTP 410, a permanent
//! failure, a give-up) gives its reservation back through [`SharedCap::release`]:
//! queued, and removed in batches (one EVALSHA per [`CHUNK`]) by a background task,
//! from the current window only (a reservation of a window already over no longer
//! matters). A release that cannot reach Redis is kept and retried (up to
//! 100,000 queued); one lost leaves the failed send counted: that device may be refused
//! one send early in that window, never sent over the cap. A transient failure that is
//! retried keeps its reservation (one send, however many attempts).
//!
//! **Redis unreachable.** The job is held, never sent uncapped and never dropped: its
//! lookup retries with backoff (the outage logged once, the recovery once). Jobs already
//! held keep sending; consumption stops once the lookups in flight (32) all wait, as
//! when the database is down. Falling back to the local cap was rejected: devices sent
//! uncounted during the outage would be invisible to Redis afterwards, so the cap would
//! be broken across workers for the rest of the window, silently.

use super::{CapConfig, CapError};
use crate::hygiene::token_hash;
use crate::redis_link::{self, RedisLink, RedisTarget};
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;
use tokio::sync::Notify;

/// Devices per script call: bounds how long one call holds Redis (about 4 commands per
/// device inside the script) and the size of one request.
pub const CHUNK: usize = 1000;

/// How long a window's key outlives the window: covers clock steps and a release that
/// arrives late.
pub const TTL_MARGIN: Duration = Duration::from_secs(60);

/// Releases kept while Redis is unreachable; beyond, the oldest are dropped (a dropped
/// release only refuses a device early in the current window, see the module doc).
const MAX_QUEUED_RELEASES: usize = 100_000;

/// ARGV: key base (`{prefix}:cap:`), window ms, cap, ttl ms, then per device its hash
/// and its member. Returns `{window, {1-based positions of the devices at the cap}}`.
pub const RESERVE_LUA: &str = r#"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local win = math.floor(now_ms / tonumber(ARGV[2]))
local cap = tonumber(ARGV[3])
local base = ARGV[1] .. string.format('%d', win) .. ':'
local capped = {}
for i = 5, #ARGV, 2 do
  local key = base .. ARGV[i]
  if redis.call('SISMEMBER', key, ARGV[i + 1]) == 0 then
    local count = redis.call('SCARD', key)
    if count < cap then
      redis.call('SADD', key, ARGV[i + 1])
      if count == 0 then redis.call('PEXPIRE', key, ARGV[4]) end
    else
      capped[#capped + 1] = (i - 3) / 2
    end
  end
end
return {win, capped}
"#;

/// ARGV: key base, window ms, then per device its hash and its member. Removes the
/// members from the current window's sets; returns how many were there.
pub const RELEASE_LUA: &str = r#"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local win = math.floor(now_ms / tonumber(ARGV[2]))
local base = ARGV[1] .. string.format('%d', win) .. ':'
local n = 0
for i = 3, #ARGV, 2 do
  n = n + redis.call('SREM', base .. ARGV[i], ARGV[i + 1])
end
return n
"#;

static RESERVE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RESERVE_LUA));
static RELEASE: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(RELEASE_LUA));

/// What the shared cap needs.
#[derive(Clone)]
pub struct SharedCapConfig {
    /// `max_per_device` and `window` (the sketch size is not used in this scope).
    pub cap: CapConfig,
    /// Where and how to connect (URL, credentials, TLS).
    pub target: RedisTarget,
    /// Bounds connecting and every call.
    pub timeout: Duration,
    pub key_prefix: String,
}

impl SharedCapConfig {
    pub fn from_settings(settings: &crate::config::Settings) -> SharedCapConfig {
        SharedCapConfig {
            cap: settings.capping.cap_config(),
            target: settings.redis.target(),
            timeout: settings.redis.connect_timeout(),
            key_prefix: settings.redis.key_prefix.clone(),
        }
    }
}

impl std::fmt::Debug for SharedCapConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCapConfig")
            .field("cap", &self.cap)
            .field("target", &self.target)
            .field("timeout", &self.timeout)
            .field("key_prefix", &self.key_prefix)
            .finish()
    }
}

/// Counters since start (metrics, tests, the benchmark figure).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct SharedCapStats {
    /// Script calls (reserve and release), failed ones included.
    pub round_trips: u64,
    /// Devices decided (reserved or refused), counted when the whole job is decided.
    pub checked: u64,
    /// Devices refused (at the cap).
    pub capped: u64,
    /// Reservations handed back by failed sends (removed from a live set).
    pub released: u64,
    /// Calls that failed (Redis unreachable, timeout, script error).
    pub failures: u64,
}

#[derive(Default)]
struct Counters {
    round_trips: AtomicU64,
    checked: AtomicU64,
    capped: AtomicU64,
    released: AtomicU64,
    failures: AtomicU64,
}

struct Inner {
    config: SharedCapConfig,
    /// `{prefix}:cap:`
    base: String,
    window_ms: u64,
    ttl_ms: u64,
    link: RedisLink,
    counters: Counters,
    outage_logged: AtomicBool,
    releases: Mutex<Vec<(DeviceKey, i64)>>,
    release_wanted: Notify,
}

/// A device's key part: the first 16 bytes of its token's SHA-256.
type DeviceKey = [u8; 16];

fn device_key(token: &str) -> DeviceKey {
    let h = token_hash(token);
    let mut k = [0u8; 16];
    k.copy_from_slice(&h[..16]);
    k
}

fn hex(k: &DeviceKey) -> String {
    let mut s = String::with_capacity(32);
    for b in k {
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// The identity of one send: a hash of (campaign, job_id, device index). Distinct
/// indexes of one job never collide (`mix` is a bijection); different jobs collide on
/// one device's set with probability about 2^-64 per pair.
pub fn member(campaign_id: &str, job_id: &str, device: u32) -> i64 {
    member_of(job_key(campaign_id, job_id), device)
}

/// The job's part of its members (hashed once per job).
fn job_key(campaign_id: &str, job_id: &str) -> u64 {
    let mut h = Sha256::new();
    h.update(campaign_id.as_bytes());
    h.update([0u8]);
    h.update(job_id.as_bytes());
    let d = h.finalize();
    let mut first = [0u8; 8];
    first.copy_from_slice(&d[..8]);
    u64::from_le_bytes(first)
}

fn member_of(job: u64, device: u32) -> i64 {
    super::count_min::mix(job.wrapping_add(u64::from(device))) as i64
}

/// The frequency cap kept in Redis. Cheap to clone; clones share the connection.
#[derive(Clone)]
pub struct SharedCap {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for SharedCap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SharedCap")
            .field("config", &self.inner.config)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl SharedCap {
    /// Starts connecting in the background (start-up never waits for Redis) and the
    /// release task. Must be called inside a Tokio runtime.
    pub fn new(config: SharedCapConfig) -> Result<SharedCap, CapError> {
        if !(1..=254).contains(&config.cap.max_per_device) {
            return Err(CapError::BadCap(config.cap.max_per_device));
        }
        let window_ms = config.cap.window / 1_000_000;
        if window_ms == 0 {
            return Err(CapError::BadWindow);
        }
        let (runtime, client) = RedisLink::open(&config.target)?;
        let inner = Arc::new(Inner {
            base: format!("{}:cap:", config.key_prefix),
            window_ms,
            ttl_ms: window_ms + TTL_MARGIN.as_millis() as u64,
            link: RedisLink::new(config.timeout),
            config,
            counters: Counters::default(),
            outage_logged: AtomicBool::new(false),
            releases: Mutex::new(Vec::new()),
            release_wanted: Notify::new(),
        });
        runtime.spawn(connect(Arc::downgrade(&inner), client));
        runtime.spawn(release_loop(Arc::downgrade(&inner)));
        Ok(SharedCap { inner })
    }

    /// Whether a connection has been made (it reconnects by itself afterwards).
    pub fn is_connected(&self) -> bool {
        self.inner.link.is_connected()
    }

    /// Why the first connection is not made yet (refused, TLS, credentials), if tried.
    pub fn connect_error(&self) -> Option<String> {
        self.inner.link.last_error()
    }

    pub fn stats(&self) -> SharedCapStats {
        let c = &self.inner.counters;
        SharedCapStats {
            round_trips: c.round_trips.load(Relaxed),
            checked: c.checked.load(Relaxed),
            capped: c.capped.load(Relaxed),
            released: c.released.load(Relaxed),
            failures: c.failures.load(Relaxed),
        }
    }

    /// Reserves a send for every device of the job from `first` on, except `skip`
    /// (ascending indexes: devices that will not be sent), and returns the indexes
    /// (ascending) of the devices at the cap. One call per [`CHUNK`] devices.
    pub async fn try_reserve(
        &self,
        campaign_id: &str,
        job_id: &str,
        devices: &[String],
        first: u32,
        skip: &[u32],
    ) -> Result<Vec<u32>, CapError> {
        let mut wanted = Vec::with_capacity(devices.len().saturating_sub(first as usize));
        let mut skip = skip.iter().peekable();
        for i in first..devices.len() as u32 {
            while skip.next_if(|&&s| s < i).is_some() {}
            if skip.next_if(|&&s| s == i).is_none() {
                wanted.push(i);
            }
        }
        let job = job_key(campaign_id, job_id);
        let mut capped = Vec::new();
        for chunk in wanted.chunks(CHUNK) {
            let mut call = RESERVE.prepare_invoke();
            call.arg(&self.inner.base)
                .arg(self.inner.window_ms)
                .arg(self.inner.config.cap.max_per_device)
                .arg(self.inner.ttl_ms);
            for &i in chunk {
                call.arg(hex(&device_key(&devices[i as usize])))
                    .arg(member_of(job, i));
            }
            let (_window, positions): (i64, Vec<usize>) = self.inner.call(&call).await?;
            for p in positions {
                // The script answers 1-based positions within the chunk.
                match p.checked_sub(1).and_then(|p| chunk.get(p)) {
                    Some(&i) => capped.push(i),
                    None => return Err(CapError::BadAnswer(p)),
                }
            }
        }
        // Counted once the whole job is decided: a retried job is not counted twice.
        let c = &self.inner.counters;
        c.checked.fetch_add(wanted.len() as u64, Relaxed);
        c.capped.fetch_add(capped.len() as u64, Relaxed);
        Ok(capped)
    }

    /// [`Self::try_reserve`] until Redis answers: the job is held, never sent
    /// uncapped and never dropped. The outage is logged once, the recovery once.
    pub async fn reserve(
        &self,
        campaign_id: &str,
        job_id: &str,
        devices: &[String],
        first: u32,
        skip: &[u32],
    ) -> Vec<u32> {
        let mut backoff = Duration::from_millis(100);
        loop {
            match self
                .try_reserve(campaign_id, job_id, devices, first, skip)
                .await
            {
                Ok(capped) => {
                    self.inner.recovered();
                    return capped;
                }
                Err(e) => {
                    self.inner.outage(&e);
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }

    /// Hands back the reservation of a send that failed for good (device `device` of
    /// the job). Queued and sent in batches by a background task; never waits.
    pub fn release(&self, campaign_id: &str, job_id: &str, device: u32, token: &str) {
        let entry = (device_key(token), member(campaign_id, job_id, device));
        {
            let mut q = self.inner.releases.lock();
            if q.len() >= MAX_QUEUED_RELEASES {
                q.remove(0);
            }
            q.push(entry);
        }
        self.inner.release_wanted.notify_one();
    }

    /// Sends the queued releases now (also done in the background); returns how many
    /// reservations were removed. On failure the releases stay queued.
    pub async fn flush_releases(&self) -> Result<u64, CapError> {
        self.inner.flush_releases().await
    }
}

impl Inner {
    /// One script call, bounded by the timeout.
    async fn call<T: redis::FromRedisValue>(
        &self,
        invocation: &redis::ScriptInvocation<'_>,
    ) -> Result<T, CapError> {
        let result = self
            .link
            .call(|mut conn| async move {
                self.counters.round_trips.fetch_add(1, Relaxed);
                metrics::counter!("capping_redis_round_trips_total").increment(1);
                invocation
                    .invoke_async(&mut conn)
                    .await
                    .map_err(CapError::from)
            })
            .await;
        if result.is_err() {
            self.counters.failures.fetch_add(1, Relaxed);
        }
        result
    }

    async fn flush_releases(&self) -> Result<u64, CapError> {
        let batch = std::mem::take(&mut *self.releases.lock());
        let mut removed = 0;
        for (n, chunk) in batch.chunks(CHUNK).enumerate() {
            let mut call = RELEASE.prepare_invoke();
            call.arg(&self.base).arg(self.window_ms);
            for (key, member) in chunk {
                call.arg(hex(key)).arg(*member);
            }
            match self.call::<u64>(&call).await {
                Ok(r) => removed += r,
                Err(e) => {
                    // Put the unsent ones back in front of any queued since.
                    let mut q = self.releases.lock();
                    let mut rest = batch[n * CHUNK..].to_vec();
                    rest.append(&mut q);
                    let over = rest.len().saturating_sub(MAX_QUEUED_RELEASES);
                    rest.drain(..over);
                    *q = rest;
                    return Err(e);
                }
            }
        }
        self.counters.released.fetch_add(removed, Relaxed);
        Ok(removed)
    }

    fn outage(&self, error: &CapError) {
        if !self.outage_logged.swap(true, Relaxed) {
            tracing::warn!(%error, "redis unreachable; new jobs wait for their frequency-cap reservations (nothing is sent uncapped)");
        }
    }

    fn recovered(&self) {
        if self.outage_logged.swap(false, Relaxed) {
            tracing::info!("redis answers again; frequency-cap reservations resume");
        }
    }
}

/// Sends queued releases: at most one batch per 100 ms, retried with backoff while
/// Redis is unreachable. Ends when the cap is dropped.
async fn release_loop(inner: Weak<Inner>) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let Some(i) = inner.upgrade() else { return };
        if i.releases.lock().is_empty() {
            // `notify_one` keeps a permit, so a release queued since the check is not
            // missed; the timeout notices the cap being dropped.
            let _ = tokio::time::timeout(Duration::from_secs(1), i.release_wanted.notified()).await;
            continue;
        }
        let wait = match i.flush_releases().await {
            Ok(_) => {
                i.recovered();
                backoff = Duration::from_millis(100);
                backoff
            }
            Err(e) => {
                i.outage(&e);
                let b = backoff;
                backoff = (backoff * 2).min(Duration::from_secs(5));
                b
            }
        };
        drop(i);
        tokio::time::sleep(wait).await;
    }
}

/// Makes the first connection, retrying until Redis answers; the connection manager
/// reconnects by itself after that.
async fn connect(inner: Weak<Inner>, client: redis::Client) {
    redis_link::connect_until_up(
        inner,
        client,
        |i| &i.link,
        |_| {},
        |i, e| i.outage(&CapError::Link(e)),
    )
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_differ_by_index_job_and_campaign() {
        let a = member("c", "j", 0);
        assert_ne!(a, member("c", "j", 1));
        assert_ne!(a, member("c", "k", 0));
        assert_ne!(a, member("d", "j", 0));
        assert_eq!(
            a,
            member("c", "j", 0),
            "stable: a re-read job reserves the same"
        );
        // The separator keeps ("ab", "c") and ("a", "bc") apart.
        assert_ne!(member("ab", "c", 0), member("a", "bc", 0));
    }

    #[test]
    fn device_keys_are_hex_of_the_token_hash() {
        let k = hex(&device_key("token"));
        assert_eq!(k.len(), 32);
        assert!(!k.contains("token"));
        assert_eq!(k, hex(&device_key("token")));
        assert_ne!(k, hex(&device_key("token2")));
    }
}
