//! Refresh gating for an app's FCM token (issue 55): of 10,000 registered apps few send
//! in any hour, and a refresher per idle app would keep fetching tokens no send uses.
//! With a window, the refresher fetches only while the provider sent within it; past
//! that it sleeps until the next send asks, and that send waits (bounded) for the token.
//! Without one (a `[providers.*]` FCM) it refreshes always, as before.
//!
//! A send costs a clock read and two atomic operations; nothing without a window.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

pub(super) struct UseGate {
    window: Option<Duration>,
    epoch: Instant,
    /// When a send last asked for the token (ms since `epoch`; 0: made then, which
    /// counts as a use: a provider is built for a job that names it).
    last_used_ms: AtomicU64,
    /// The refresher sleeps until a send asks.
    dormant: AtomicBool,
    demand: Notify,
}

impl UseGate {
    pub(super) fn new(window: Option<Duration>) -> UseGate {
        UseGate {
            window,
            epoch: Instant::now(),
            last_used_ms: AtomicU64::new(0),
            dormant: AtomicBool::new(false),
            demand: Notify::new(),
        }
    }

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
    }

    /// A send wants the token: marks the use and wakes a dormant refresher.
    pub(super) fn used(&self) {
        if self.window.is_none() {
            return;
        }
        // SeqCst here and in `until_used`: either the refresher sees this use, or this
        // send sees it dormant and wakes it.
        self.last_used_ms.store(self.now_ms(), SeqCst);
        if self.dormant.load(SeqCst) {
            self.demand.notify_one();
        }
    }

    fn used_within(&self, window: Duration) -> bool {
        let idle = self.now_ms().saturating_sub(self.last_used_ms.load(SeqCst));
        u128::from(idle) <= window.as_millis()
    }

    /// Returns at once while the provider sent within the window (or there is none);
    /// otherwise sleeps until a send asks. True if it slept.
    pub(super) async fn until_used(&self, name: &str) -> bool {
        let Some(window) = self.window else {
            return false;
        };
        let mut slept = false;
        loop {
            if self.used_within(window) {
                return slept;
            }
            let demand = self.demand.notified();
            tokio::pin!(demand);
            demand.as_mut().enable();
            self.dormant.store(true, SeqCst);
            if self.used_within(window) {
                self.dormant.store(false, SeqCst);
                return slept;
            }
            tracing::debug!(provider = %name, window_s = window.as_secs(),
                "FCM token refresh paused: no send within the window");
            demand.await;
            self.dormant.store(false, SeqCst);
            slept = true;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Paused time: the clock moves only when every task waits, so the window is exact.
    #[tokio::test(start_paused = true)]
    async fn returns_while_used_and_sleeps_after_the_window_until_a_send() {
        let gate = std::sync::Arc::new(UseGate::new(Some(Duration::from_secs(60))));
        assert!(!gate.until_used("p").await, "made just now counts as a use");
        tokio::time::advance(Duration::from_secs(59)).await;
        gate.used();
        tokio::time::advance(Duration::from_secs(60)).await;
        assert!(!gate.until_used("p").await, "used 60 s ago: within");
        tokio::time::advance(Duration::from_secs(1)).await;
        let waiting = tokio::spawn({
            let gate = gate.clone();
            async move { gate.until_used("p").await }
        });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!waiting.is_finished(), "no send: still asleep an hour on");
        gate.used();
        assert!(waiting.await.unwrap(), "woken by the send");
    }

    #[tokio::test(start_paused = true)]
    async fn without_a_window_it_never_sleeps() {
        let gate = UseGate::new(None);
        tokio::time::advance(Duration::from_secs(86_400)).await;
        assert!(!gate.until_used("p").await);
    }
}
