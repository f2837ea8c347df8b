//! The worker's one retry policy for PostgreSQL and Redis calls: retry while the failure
//! can pass (100 ms doubling to 5 s), return it at once when it cannot.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// The first wait after a failure that can pass, and the longest.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Runs `f` until it succeeds or fails for good (`transient` says false). `down` is
/// raised by the first transient failure and lowered by the next success, so that an
/// outage logs one line when it starts and one when it ends, whatever the call count.
pub async fn until_settled<T, E, F, Fut>(
    what: &str,
    down: &AtomicBool,
    transient: impl Fn(&E) -> bool,
    mut f: F,
) -> Result<T, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let mut backoff = BACKOFF_FIRST;
    loop {
        match f().await {
            Ok(v) => {
                if down.swap(false, Ordering::Relaxed) {
                    tracing::info!(what, "the database answers again");
                }
                return Ok(v);
            }
            Err(e) if transient(&e) => {
                if !down.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, what, "a database call failed; retrying with backoff (the work waits)");
                }
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
            Err(e) => return Err(e),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn transient_failures_wait_and_a_permanent_one_returns_at_once() {
        let down = AtomicBool::new(false);
        let mut calls = 0;
        let started = tokio::time::Instant::now();
        let r: Result<u32, &str> = until_settled(
            "t",
            &down,
            |e: &&str| *e == "later",
            || {
                calls += 1;
                let answer = if calls < 4 { Err("later") } else { Ok(7) };
                async move { answer }
            },
        )
        .await;
        assert_eq!(r, Ok(7));
        // 100 + 200 + 400 ms of backoff, on the paused clock.
        assert_eq!(started.elapsed(), Duration::from_millis(700));
        assert!(!down.load(Ordering::Relaxed));
        let r: Result<u32, &str> = until_settled(
            "t",
            &down,
            |e: &&str| *e == "later",
            || async { Err("never") },
        )
        .await;
        assert_eq!(r, Err("never"));
    }
}
