//! The pool's slots: each holds at most one live connection, connects it lazily (one
//! attempt at a time), and backs off after a failed connect so that a provider that
//! cannot be reached sees a handful of attempts, not one per send.

use super::budget::Member;
use super::connection::Conn;
use super::{H2Pool, TransportError};
use parking_lot::Mutex;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

/// The first wait after a failed connect; it doubles per failure up to [`BACKOFF_MAX`].
const BACKOFF_START: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(30);

#[derive(Default)]
pub(super) struct Slot {
    /// The live connection. Held only to clone or replace it.
    live: Mutex<Option<Arc<Conn>>>,
    /// One connection attempt at a time; other sends through the slot wait for it.
    connecting: tokio::sync::Mutex<()>,
    backoff: Mutex<Backoff>,
}

#[derive(Default)]
struct Backoff {
    failures: u32,
    retry_at: Option<Instant>,
    last_error: String,
}

impl Slot {
    pub(super) fn live(&self) -> Option<Arc<Conn>> {
        self.live.lock().clone()
    }

    /// The error to fail with while the slot waits before its next attempt.
    fn backing_off(&self, pool: &H2Pool) -> Option<TransportError> {
        let backoff = self.backoff.lock();
        let wait = backoff.retry_at?.checked_duration_since(Instant::now())?;
        Some(TransportError::Connect {
            pool: pool.config.name.clone(),
            endpoint: pool.address.clone(),
            reason: backoff.last_error.clone(),
            retry_in_ms: wait.as_millis().max(1) as u64,
        })
    }

    /// Records a failed attempt; the wait before the next one.
    fn failed(&self, error: &str) -> Duration {
        let mut backoff = self.backoff.lock();
        backoff.failures = backoff.failures.saturating_add(1);
        let doubled = BACKOFF_START.saturating_mul(1 << (backoff.failures - 1).min(20));
        let full = doubled.min(BACKOFF_MAX);
        // Jitter in [full/2, full]: slots (and workers) do not retry in step.
        let wait = full / 2 + full.mul_f64(fastrand::f64() / 2.0);
        backoff.retry_at = Some(Instant::now() + wait);
        backoff.last_error = error.to_string();
        wait
    }

    fn connected(&self, conn: Arc<Conn>) {
        *self.backoff.lock() = Backoff::default();
        *self.live.lock() = Some(conn);
    }
}

impl H2Pool {
    /// A live connection for the next send: the next slot's, connecting it if needed;
    /// while that slot backs off, any other slot's live connection.
    pub(super) async fn connection(self: &Arc<Self>) -> Result<Arc<Conn>, TransportError> {
        let count = self.slots.len();
        let first = self.next.fetch_add(1, Relaxed) % count;
        let slot = &self.slots[first];
        if let Some(conn) = slot.live() {
            return Ok(conn);
        }
        if let Some(error) = slot.backing_off(self) {
            let other = (1..count).find_map(|i| self.slots[(first + i) % count].live());
            return other.ok_or(error);
        }
        self.connect_slot(first).await
    }

    async fn connect_slot(self: &Arc<Self>, index: usize) -> Result<Arc<Conn>, TransportError> {
        let slot = &self.slots[index];
        let _connecting = slot.connecting.lock().await;
        if let Some(conn) = slot.live() {
            return Ok(conn);
        }
        // The attempt this send waited for may just have failed.
        if let Some(error) = slot.backing_off(self) {
            return Err(error);
        }
        // An app pool asks the budget first (it may close another pool's idle ones).
        let ticket = self.config.budget.as_ref().map(|budget| {
            let me: Weak<dyn Member> = Arc::downgrade(self) as Weak<dyn Member>;
            budget.admit(self.member, &me)
        });
        self.connect_attempts.fetch_add(1, Relaxed);
        let generation = self.generations.fetch_add(1, Relaxed) + 1;
        match Conn::connect(self, index, generation, ticket).await {
            Ok(conn) => {
                slot.connected(conn.clone());
                tracing::debug!(pool = %self.config.name, slot = index, "provider connection open");
                Ok(conn)
            }
            Err(reason) => {
                let wait = slot.failed(&reason);
                tracing::warn!(pool = %self.config.name, %reason, "provider connect failed");
                Err(TransportError::Connect {
                    pool: self.config.name.clone(),
                    endpoint: self.address.clone(),
                    reason,
                    retry_in_ms: wait.as_millis() as u64,
                })
            }
        }
    }

    /// A connection of slot `index` closed before any answer: back off as after a
    /// failed connect.
    pub(super) fn connection_failed(&self, index: usize, reason: &str) {
        let wait =
            self.slots[index].failed(&format!("connection closed before any answer: {reason}"));
        tracing::warn!(pool = %self.config.name, %reason, wait_ms = wait.as_millis() as u64,
            "provider connection closed before any answer");
    }

    /// Forgets slot `index`'s connection if it is still generation `generation`.
    pub(super) fn forget(&self, index: usize, generation: u64) {
        let mut live = self.slots[index].live.lock();
        if live.as_ref().is_some_and(|c| c.generation == generation) {
            if let Some(conn) = live.take() {
                conn.release_budget();
            }
        }
    }

    /// Lets go of slot `index`'s connection (generation `generation`, or any) when it
    /// has no stream in flight: h2 closes it with a GOAWAY once no send holds it.
    pub(super) fn retire_if_idle(&self, index: usize, generation: Option<u64>) -> Retire {
        let mut live = self.slots[index].live.lock();
        let Some(conn) = live.as_ref() else {
            return Retire::Gone;
        };
        if generation.is_some_and(|g| g != conn.generation) {
            return Retire::Gone;
        }
        if !conn.idle() {
            return Retire::Busy;
        }
        if let Some(conn) = live.take() {
            conn.retire();
        }
        Retire::Retired
    }
}

/// What [`H2Pool::retire_if_idle`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retire {
    Retired,
    /// A stream is in flight on it: kept.
    Busy,
    /// The slot holds no such connection (any more).
    Gone,
}
