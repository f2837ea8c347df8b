//! `redis-gcra`: GCRA kept in Redis by a Lua script, so that a lease is one atomic round
//! trip (EVALSHA) however many workers ask at once.
//!
//! The key holds the campaign's theoretical arrival time (TAT) in microseconds of Redis's
//! own clock (`TIME`), so workers' clocks never need to agree. A lease asks for up to `n`
//! permits and receives the next `k` slots of the campaign's schedule that start within
//! `horizon` of now: `k` permits spaced by the interval, starting `offset` µs from now.
//! Every slot belongs to exactly one worker, so the workers together follow one smooth
//! schedule at the campaign's rate, and a lease never reaches beyond the horizon.

use super::{DistributedError, LeaseAnswer};
use crate::limiter::{Rate, FP_SHIFT};
use redis::aio::ConnectionManager;
use std::sync::LazyLock;
use std::time::Duration;

/// KEYS[1]: the campaign's TAT key. ARGV: interval µs, n, horizon µs, tolerance µs (the
/// burst), ttl ms. Returns `{k, offset_µs, now_µs}` with k ≥ 1, or `{0, wait_µs, now_µs}`:
/// `now_µs` lets the worker place the slots by Redis's clock ([`super::redis_clock`]).
pub const LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local interval = tonumber(ARGV[1])
local n = tonumber(ARGV[2])
local horizon = tonumber(ARGV[3])
local tolerance = tonumber(ARGV[4])
local tat = tonumber(redis.call('GET', KEYS[1]) or '0')
-- idle time is not banked beyond the burst
if tat < now - tolerance then tat = now - tolerance end
local room = math.floor((now + horizon - tat) / interval)
if room < 1 then
  return {0, math.ceil(tat + interval - horizon - now), now}
end
local k = math.min(n, room)
redis.call('SET', KEYS[1], string.format('%.3f', tat + k * interval), 'PX', ARGV[5])
return {k, math.floor(tat - now), now}
"#;

static SCRIPT: LazyLock<redis::Script> = LazyLock::new(|| redis::Script::new(LUA));

/// The key of a campaign's TAT.
pub fn key(prefix: &str, campaign: &str) -> String {
    format!("{prefix}:gcra:{campaign}")
}

/// One lease request: up to `n` slots starting within `horizon`.
pub async fn lease(
    conn: &mut ConnectionManager,
    key: &str,
    rate: Rate,
    burst: u32,
    n: u32,
    horizon: Duration,
) -> Result<LeaseAnswer, DistributedError> {
    let interval_us = interval_micros(rate);
    let horizon_us = horizon.as_micros() as f64;
    let tolerance_us = interval_us * f64::from(burst);
    // The key outlives the schedule it holds by a margin; an idle campaign's key expires.
    let ttl_ms = (horizon_us + tolerance_us) / 1000.0 + 60_000.0;
    let (k, t, now): (i64, i64, i64) = SCRIPT
        .key(key)
        .arg(format!("{interval_us:.4}"))
        .arg(n)
        .arg(horizon_us)
        .arg(tolerance_us)
        .arg(ttl_ms.ceil() as u64)
        .invoke_async(conn)
        .await?;
    Ok(answer(k, t, now))
}

/// The interval of `rate` in microseconds, from the same fixed point the local limiters
/// use, so local and Redis schedules agree.
pub fn interval_micros(rate: Rate) -> f64 {
    (rate.interval_fp() as f64) / f64::from(1u32 << FP_SHIFT) / 1000.0
}

fn answer(k: i64, t: i64, now: i64) -> LeaseAnswer {
    match u32::try_from(k) {
        Ok(permits) if permits > 0 => LeaseAnswer::Granted {
            permits,
            offset_micros: t,
            redis_now_micros: Some(now),
        },
        _ => LeaseAnswer::Wait(Duration::from_micros(t.max(1) as u64)),
    }
}
