//! Token hygiene: tokens a provider called gone for good are not sent through that
//! provider again, until the mark expires.
//!
//! When a send answers "dead token" (HTTP 410 and its kind), the token's SHA-256 goes
//! into the `invalid_tokens` table with the provider (its configured name) that
//! answered, the reason and an expiry (`hygiene.invalid_ttl` from the last answer), and
//! into an in-memory [`BloomFilter`] under a key of the token *and* the provider. At job
//! intake every token is checked against the filter in the job's provider's scope:
//! "certainly not invalid" (nearly all of them) costs no database access; the "maybe"
//! ones of a job are checked against the table in one batched query, which matches only
//! that provider's unexpired rows. A token dead for one app or environment is still
//! sent through another; a false positive costs one indexed lookup, never a notification.
//!
//! Rows written before scopes existed have no provider (legacy): they apply to every
//! provider until they expire (the migration gives them first_seen + 30 days).
//!
//! The filter is built from the unexpired rows at start and kept in step with other
//! workers by an incremental reload (rows whose `last_seen` is newer than the last
//! reload, minus an overlap that covers transactions committing late). Expired rows
//! are never loaded and never matched; `stats prune` deletes them.
//!
//! - [`bloom`]: the lock-free Bloom filter and its sizing.

pub mod bloom;

pub use bloom::{BloomError, BloomFilter};

use chrono::{DateTime, Duration as ChronoDuration, Utc};
use futures::TryStreamExt;
use parking_lot::Mutex;
use sha2::{Digest, Sha256};
use sqlx::PgPool;
use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// Errors of token hygiene.
#[derive(Debug, thiserror::Error)]
pub enum HygieneError {
    #[error(transparent)]
    Bloom(#[from] BloomError),
    #[error("invalid_tokens: {0}")]
    Database(#[from] sqlx::Error),
}

/// A token's identity in `invalid_tokens`: its SHA-256 (tokens themselves are not kept).
pub type TokenHash = [u8; 32];

/// SHA-256 of the token's UTF-8 bytes.
pub fn token_hash(token: &str) -> TokenHash {
    Sha256::digest(token.as_bytes()).into()
}

/// The Bloom filter's key: the first 128 bits of the token hash.
#[inline]
pub fn bloom_key(hash: &TokenHash) -> u128 {
    let mut first = [0u8; 16];
    first.copy_from_slice(&hash[..16]);
    u128::from_le_bytes(first)
}

/// The provider a mark belongs to: its configured name, and the salt its tokens' filter
/// keys are mixed with (so the same token has one key per provider).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    name: Arc<str>,
    salt: u128,
}

impl Scope {
    pub fn new(name: &str) -> Self {
        let digest = Sha256::new()
            .chain_update(b"pushpace invalid-token scope\0")
            .chain_update(name.as_bytes())
            .finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        // Never 0: that is the legacy (unscoped) rows' key.
        let salt = u128::from_le_bytes(first) | 1;
        Self {
            name: Arc::from(name),
            salt,
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The filter key of `hash` in this scope. XOR with a uniform constant keeps the key
    /// uniform, and distinct scopes give the same token distinct keys.
    #[inline]
    pub fn key(&self, hash: &TokenHash) -> u128 {
        bloom_key(hash) ^ self.salt
    }
}

/// A provider's name as stored in `invalid_tokens.provider` (escaped and capped like
/// every stored text, so that neither the write nor the lookup can fail on it).
fn scope_text(provider: &str) -> std::borrow::Cow<'_, str> {
    crate::store::safe_text_capped(provider, crate::store::dead_letters::MAX_ID_BYTES)
}

/// How long a mark skips a token when nothing says otherwise (`hygiene.invalid_ttl`).
pub const DEFAULT_INVALID_TTL: Duration = Duration::from_secs(30 * 24 * 3600);

/// How far back an incremental reload looks past the newest row it has seen: rows are
/// inserted by single short statements, so one committing later than this is not expected.
const RELOAD_OVERLAP_SECS: i64 = 60;

/// Counts since start (for metrics, tests and the benchmark).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HygieneStats {
    /// Tokens checked at intake.
    pub checks: u64,
    /// Tokens the filter could not rule out.
    pub maybe: u64,
    /// Batched lookups against the table (at most one per job).
    pub lookups: u64,
    /// Tokens the table confirmed invalid (skipped).
    pub invalid: u64,
    /// Tokens recorded as invalid by this worker.
    pub recorded: u64,
    /// Rows loaded into the filter from the table.
    pub loaded: u64,
}

#[derive(Default)]
struct Counters {
    checks: AtomicU64,
    maybe: AtomicU64,
    lookups: AtomicU64,
    invalid: AtomicU64,
    recorded: AtomicU64,
    loaded: AtomicU64,
}

/// The filter in front of `invalid_tokens`. Shared (`Arc`) by the consumer thread.
pub struct TokenHygiene {
    pool: PgPool,
    filter: BloomFilter,
    /// The configured providers' scopes, by provider slot.
    scopes: Vec<Scope>,
    /// How long a new mark skips its token.
    ttl: Duration,
    /// Unexpired legacy (unscoped) rows were loaded: checks probe their key too.
    has_legacy: AtomicBool,
    /// The newest `last_seen` loaded so far.
    loaded_until: Mutex<Option<DateTime<Utc>>>,
    counters: Counters,
}

impl std::fmt::Debug for TokenHygiene {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenHygiene")
            .field("filter", &self.filter)
            .field("stats", &self.stats())
            .finish_non_exhaustive()
    }
}

impl TokenHygiene {
    /// Sizes the filter for `expected_tokens` at `false_positive_rate` and loads the
    /// table. `providers` are the configured providers' names, by slot.
    pub async fn start(
        pool: PgPool,
        expected_tokens: u64,
        false_positive_rate: f64,
        ttl: Duration,
        providers: &[Arc<str>],
    ) -> Result<Self, HygieneError> {
        let filter = BloomFilter::with_rate(expected_tokens, false_positive_rate)?;
        Self::with_filter(pool, filter, ttl, providers).await
    }

    /// Uses `filter` (e.g. a tiny one in tests) and loads the table into it.
    pub async fn with_filter(
        pool: PgPool,
        filter: BloomFilter,
        ttl: Duration,
        providers: &[Arc<str>],
    ) -> Result<Self, HygieneError> {
        let h = Self {
            pool,
            filter,
            scopes: providers.iter().map(|p| Scope::new(p)).collect(),
            ttl,
            has_legacy: AtomicBool::new(false),
            loaded_until: Mutex::new(None),
            counters: Counters::default(),
        };
        h.reload().await?;
        Ok(h)
    }

    /// The name of the provider at `slot` (a provider not configured at start: `""`,
    /// which no row is recorded under).
    pub fn scope_of(&self, slot: u16) -> &str {
        self.scopes.get(usize::from(slot)).map_or("", Scope::name)
    }

    /// The configured scope named `name`, or a new one (a provider no longer configured).
    fn scope_named(&self, name: &str) -> std::borrow::Cow<'_, Scope> {
        match self.scopes.iter().find(|s| s.name() == name) {
            Some(s) => std::borrow::Cow::Borrowed(s),
            None => std::borrow::Cow::Owned(Scope::new(name)),
        }
    }

    /// Adds the unexpired rows other workers recorded since the last reload; returns how
    /// many rows were read (the overlap re-reads a few; adding them again is harmless).
    pub async fn reload(&self) -> Result<usize, HygieneError> {
        let since = *self.loaded_until.lock();
        let since = since.map(|t| t - ChronoDuration::seconds(RELOAD_OVERLAP_SECS));
        // Streamed: a full load at start may be millions of rows.
        let mut rows = sqlx::query_as::<_, (Vec<u8>, Option<String>, DateTime<Utc>)>(
            "SELECT token_hash, provider, last_seen FROM invalid_tokens \
             WHERE expires_at > now() AND ($1::timestamptz IS NULL OR last_seen >= $1)",
        )
        .bind(since)
        .fetch(&self.pool);
        let mut newest = None;
        let mut read = 0usize;
        while let Some((hash, provider, seen)) = rows.try_next().await? {
            if let Ok(hash) = <TokenHash>::try_from(hash.as_slice()) {
                match provider {
                    Some(p) => self.filter.insert(self.scope_named(&p).key(&hash)),
                    None => {
                        self.has_legacy.store(true, Ordering::Relaxed);
                        self.filter.insert(bloom_key(&hash));
                    }
                }
            }
            newest = newest.max(Some(seen));
            read += 1;
        }
        drop(rows);
        let mut loaded = self.loaded_until.lock();
        *loaded = (*loaded).max(newest);
        self.counters
            .loaded
            .fetch_add(read as u64, Ordering::Relaxed);
        Ok(read)
    }

    /// The indexes of `tokens` that are recorded invalid for `provider` (or by a legacy
    /// row) and not expired. Tokens the filter rules out cost nothing; the rest are
    /// checked in one query. Indexes are in ascending order.
    pub async fn invalid_among(
        &self,
        tokens: &[String],
        provider: &str,
    ) -> Result<Vec<u32>, HygieneError> {
        self.counters
            .checks
            .fetch_add(tokens.len() as u64, Ordering::Relaxed);
        let scope = self.scope_named(provider);
        let legacy = self.has_legacy.load(Ordering::Relaxed);
        let mut maybe: Vec<(u32, TokenHash)> = Vec::new();
        for (i, t) in tokens.iter().enumerate() {
            let hash = token_hash(t);
            if self.filter.may_contain(scope.key(&hash))
                || (legacy && self.filter.may_contain(bloom_key(&hash)))
            {
                maybe.push((i as u32, hash));
            }
        }
        if maybe.is_empty() {
            return Ok(Vec::new());
        }
        self.counters
            .maybe
            .fetch_add(maybe.len() as u64, Ordering::Relaxed);
        self.counters.lookups.fetch_add(1, Ordering::Relaxed);
        let hashes: Vec<Vec<u8>> = maybe.iter().map(|(_, h)| h.to_vec()).collect();
        let found: Vec<Vec<u8>> = sqlx::query_scalar(
            "SELECT token_hash FROM invalid_tokens WHERE token_hash = ANY($1) \
             AND (provider = $2 OR provider IS NULL) AND expires_at > now()",
        )
        .bind(&hashes)
        .bind(scope_text(provider).as_ref())
        .fetch_all(&self.pool)
        .await?;
        let found: HashSet<Vec<u8>> = found.into_iter().collect();
        let invalid: Vec<u32> = maybe
            .into_iter()
            .filter(|(_, h)| found.contains(h.as_slice()))
            .map(|(i, _)| i)
            .collect();
        self.counters
            .invalid
            .fetch_add(invalid.len() as u64, Ordering::Relaxed);
        Ok(invalid)
    }

    /// Records a token as gone for good through `provider` (idempotent: a second answer
    /// keeps the first reason and pushes the expiry to now + the TTL) and adds it to the
    /// filter in that scope. The reason is the provider's text: escaped and capped as a
    /// dead letter's is ([`crate::store::safe_text_capped`]), so that no byte in it can
    /// make the write fail. The token itself is stored only as its hash. Retrying is the
    /// caller's choice.
    pub async fn record_invalid(
        &self,
        token: &str,
        provider: &str,
        reason: &str,
    ) -> Result<(), HygieneError> {
        let hash = token_hash(token);
        let reason =
            crate::store::safe_text_capped(reason, crate::store::dead_letters::MAX_REASON_BYTES);
        let provider_text = scope_text(provider);
        sqlx::query(
            "INSERT INTO invalid_tokens (token_hash, provider, reason, expires_at) \
             VALUES ($1, $2, $3, now() + make_interval(secs => $4)) \
             ON CONFLICT (token_hash, provider) DO UPDATE SET last_seen = now(), \
             expires_at = EXCLUDED.expires_at",
        )
        .bind(hash.as_slice())
        .bind(provider_text.as_ref())
        .bind(reason.as_ref())
        .bind(self.ttl.as_secs_f64())
        .execute(&self.pool)
        .await?;
        self.filter.insert(self.scope_named(provider).key(&hash));
        self.counters.recorded.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }

    pub fn filter(&self) -> &BloomFilter {
        &self.filter
    }

    pub fn stats(&self) -> HygieneStats {
        let c = &self.counters;
        HygieneStats {
            checks: c.checks.load(Ordering::Relaxed),
            maybe: c.maybe.load(Ordering::Relaxed),
            lookups: c.lookups.load(Ordering::Relaxed),
            invalid: c.invalid.load(Ordering::Relaxed),
            recorded: c.recorded.load(Ordering::Relaxed),
            loaded: c.loaded.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_token_has_one_key_per_provider_and_legacy_keys_are_unsalted() {
        let hash = token_hash("tok");
        let (a, b) = (Scope::new("a"), Scope::new("b"));
        assert_ne!(a.key(&hash), b.key(&hash));
        assert_eq!(a.key(&hash), Scope::new("a").key(&hash), "stable");
        assert_ne!(a.key(&hash), bloom_key(&hash), "never the legacy key");
        let filter = BloomFilter::with_rate(1000, 0.001).unwrap();
        filter.insert(a.key(&hash));
        assert!(filter.may_contain(a.key(&hash)));
        assert!(
            !filter.may_contain(b.key(&hash)),
            "another scope is not marked"
        );
    }
}
