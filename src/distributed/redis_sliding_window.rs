//! `redis-sliding-window`: Criteo's approximation of a sliding window, kept in Redis.
//!
//! Each window of `length` has its own counter key (`INCRBY`, then `PEXPIRE` so that it
//! disappears two windows later). The count over the sliding window ending now is
//! estimated as `previous × (1 − elapsed fraction) + current`: the previous window's
//! requests are assumed evenly spread. A lease takes permits under the window's limit
//! in one script (one round trip): a whole lease of `n` (at most the
//! limit) or, when it does not fit yet, the wait until it does. The estimate is cheap but
//! not exact: when the previous window's sends were bunched, the real count over a
//! sliding second can exceed the limit; docs/BENCHMARKS.md measures by how much.

use super::{DistributedError, LeaseAnswer};
use crate::limiter::{window_for, Rate, NANOS_PER_SEC};
use redis::aio::ConnectionManager;
use std::sync::LazyLock;
use std::time::Duration;

/// KEYS[1]: the campaign's key prefix. ARGV: limit per window, window ms, n. Returns
/// `{min(n, limit), 0}`, or `{0, wait_µs}`.
pub const LUA: &str = r#"
local t = redis.call('TIME')
local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local limit = tonumber(ARGV[1])
local w = tonumber(ARGV[2])
local n = tonumber(ARGV[3])
local idx = math.floor(now_ms / w)
local cur_key = KEYS[1] .. ':' .. idx
local prev = tonumber(redis.call('GET', KEYS[1] .. ':' .. (idx - 1)) or '0')
local cur = tonumber(redis.call('GET', cur_key) or '0')
local into = now_ms - idx * w
local weighted = prev * (w - into) / w
local room = math.floor(limit - weighted - cur)
-- whole leases only: granting the last few permits one by one would cost a round
-- trip each
local k = math.min(n, limit)
if room < k then
  -- until the previous window's weight has fallen enough, or the window turns
  local wait_ms = w - into
  if prev > 0 then
    local need = weighted + cur + k - limit
    wait_ms = math.min(wait_ms, math.ceil(need * w / prev))
  end
  return {0, math.max(1, wait_ms) * 1000}
end
redis.call('INCRBY', cur_key, k)
redis.call('PEXPIRE', cur_key, 2 * w + 1000)
return {k, 0}
"#;

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(LUA));

/// The key prefix of a campaign's window counters.
pub fn key(prefix: &str, campaign: &str) -> String {
    format!("{prefix}:sw:{campaign}")
}

/// One lease request: up to `n` permits that fit the estimated sliding window.
pub async fn lease(
    conn: &mut ConnectionManager,
    key: &str,
    rate: Rate,
    burst: u32,
    n: u32,
) -> Result<LeaseAnswer, DistributedError> {
    let w = window_for(rate, burst);
    let window_ms = (w.length / (NANOS_PER_SEC / 1000)).max(1);
    let (k, t): (i64, i64) = SCRIPT
        .key(key)
        .arg(w.limit)
        .arg(window_ms)
        .arg(n)
        .invoke_async(conn)
        .await?;
    Ok(match u32::try_from(k) {
        Ok(permits) if permits > 0 => LeaseAnswer::Granted {
            permits,
            offset_micros: 0,
            redis_now_micros: None,
        },
        _ => LeaseAnswer::Wait(Duration::from_micros(t.max(1) as u64)),
    })
}
