//! The connection budget every app pool of a worker shares (`apps.max_open_connections`).
//!
//! A pool asks for room before it opens a connection ([`ConnectionBudget::admit`]). At
//! the cap, the least recently used pool with no send in flight is told to close its
//! connections first; a pool in use is never touched. When every pool holding a
//! connection is in use the open goes ahead anyway (a send must not fail because other
//! apps are busy), counted in `app_connections_over_cap_total` and warned of at most
//! once per [`WARN_EVERY_MS`].
//!
//! One mutex guards the holders: it is taken only when a connection opens or closes
//! (rare: connections live for minutes), never per send. Eviction scans the pools that
//! hold a connection (at most about the cap) and calls the victim outside the lock.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Weak};
use std::time::Instant;

/// The over-cap warning's period: one line per 10 s however many opens go over.
pub const WARN_EVERY_MS: u64 = 10_000;

/// A pool as the budget sees it.
pub(super) trait Member: Send + Sync {
    /// When it was last used (the budget's clock, µs), or `None` while a send is in
    /// flight.
    fn idle_since(&self) -> Option<u64>;
    /// Closes (gracefully) each of its connections that has no stream in flight; how
    /// many it closed.
    fn close_idle(&self) -> usize;
}

/// Open app connections of one worker, capped softly.
pub struct ConnectionBudget {
    max_open: usize,
    epoch: Instant,
    holders: Mutex<Holders>,
    /// `holders.open`, readable without the lock.
    open: AtomicUsize,
    over_cap: AtomicU64,
    next_member: AtomicU64,
    warn: WarnGate,
    gauge: metrics::Gauge,
    over_cap_total: metrics::Counter,
}

#[derive(Default)]
struct Holders {
    open: usize,
    /// Pools holding at least one connection, by member id.
    by_member: HashMap<u64, Holder>,
}

struct Holder {
    member: Weak<dyn Member>,
    open: usize,
}

impl std::fmt::Debug for ConnectionBudget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConnectionBudget")
            .field("max_open", &self.max_open)
            .field("open", &self.open())
            .field("over_cap", &self.over_cap())
            .finish()
    }
}

impl ConnectionBudget {
    /// A budget of `max_open` connections (at least 1).
    pub fn new(max_open: usize) -> Arc<ConnectionBudget> {
        Arc::new(ConnectionBudget {
            max_open: max_open.max(1),
            epoch: Instant::now(),
            holders: Mutex::new(Holders::default()),
            open: AtomicUsize::new(0),
            over_cap: AtomicU64::new(0),
            next_member: AtomicU64::new(0),
            warn: WarnGate::default(),
            gauge: metrics::gauge!("app_connections_open"),
            over_cap_total: metrics::counter!("app_connections_over_cap_total"),
        })
    }

    pub fn max_open(&self) -> usize {
        self.max_open
    }

    /// App connections open now (held by a pool's slot).
    pub fn open(&self) -> usize {
        self.open.load(Relaxed)
    }

    /// Opens that went over the cap because every holder was in use.
    pub fn over_cap(&self) -> u64 {
        self.over_cap.load(Relaxed)
    }

    /// A new member's id.
    pub(super) fn member_id(&self) -> u64 {
        self.next_member.fetch_add(1, Relaxed)
    }

    /// The budget's clock (µs since it was made), the one members' `idle_since` reads:
    /// finer than ms, as uses a loopback round trip apart must still be ordered.
    pub(super) fn now_us(&self) -> u64 {
        self.epoch.elapsed().as_micros() as u64
    }

    /// Room for one more connection of member `id`, closing the least recently used
    /// idle members' connections first while at the cap. Always grants.
    pub(super) fn admit(self: &Arc<Self>, id: u64, member: &Weak<dyn Member>) -> Ticket {
        let mut tried = Vec::new();
        loop {
            let victim = {
                let mut holders = self.holders.lock();
                if holders.open < self.max_open {
                    return self.grant(&mut holders, id, member);
                }
                match lru_idle(&holders, id, &tried) {
                    Some(victim) => victim,
                    None => {
                        let ticket = self.grant(&mut holders, id, member);
                        let open = holders.open;
                        drop(holders);
                        self.went_over(open);
                        return ticket;
                    }
                }
            };
            // Outside the lock: the victim's closes release their tickets through it.
            // A victim that closed nothing (a send started meanwhile) is not asked
            // again, so the loop ends.
            tried.push(victim.0);
            victim.1.close_idle();
        }
    }

    fn grant(
        self: &Arc<Self>,
        holders: &mut Holders,
        id: u64,
        member: &Weak<dyn Member>,
    ) -> Ticket {
        holders.open += 1;
        holders
            .by_member
            .entry(id)
            .or_insert_with(|| Holder {
                member: member.clone(),
                open: 0,
            })
            .open += 1;
        self.publish(holders.open);
        Ticket {
            budget: Arc::clone(self),
            member: id,
            released: AtomicBool::new(false),
        }
    }

    fn release(&self, id: u64) {
        let mut holders = self.holders.lock();
        holders.open = holders.open.saturating_sub(1);
        if let Some(h) = holders.by_member.get_mut(&id) {
            h.open = h.open.saturating_sub(1);
            if h.open == 0 {
                holders.by_member.remove(&id);
            }
        }
        self.publish(holders.open);
    }

    fn publish(&self, open: usize) {
        self.open.store(open, Relaxed);
        self.gauge.set(open as f64);
    }

    fn went_over(&self, open: usize) {
        self.over_cap.fetch_add(1, Relaxed);
        self.over_cap_total.increment(1);
        if self.warn.should_warn(self.now_us() / 1000) {
            tracing::warn!(
                open,
                max_open = self.max_open,
                "app connections over apps.max_open_connections: every app pool holding one has a send in flight"
            );
        }
    }
}

/// The least recently used member other than `opener` (and those `tried`) with no send
/// in flight.
fn lru_idle(holders: &Holders, opener: u64, tried: &[u64]) -> Option<(u64, Arc<dyn Member>)> {
    let mut best: Option<(u64, u64, Arc<dyn Member>)> = None;
    for (&id, holder) in &holders.by_member {
        if id == opener || tried.contains(&id) {
            continue;
        }
        let Some(member) = holder.member.upgrade() else {
            continue;
        };
        let Some(since) = member.idle_since() else {
            continue;
        };
        if best.as_ref().is_none_or(|(_, t, _)| since < *t) {
            best = Some((id, since, member));
        }
    }
    best.map(|(id, _, member)| (id, member))
}

/// One admitted connection's place in the budget, given back once (when its slot lets
/// go of the connection, or at the latest when the ticket is dropped).
pub(super) struct Ticket {
    budget: Arc<ConnectionBudget>,
    member: u64,
    released: AtomicBool,
}

impl Ticket {
    pub(super) fn release(&self) {
        if !self.released.swap(true, Relaxed) {
            self.budget.release(self.member);
        }
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.release();
    }
}

/// "At most once per [`WARN_EVERY_MS`]", lock-free.
#[derive(Default)]
struct WarnGate {
    /// The last warning's time + 1 (0: never warned).
    last: AtomicU64,
}

impl WarnGate {
    fn should_warn(&self, now_ms: u64) -> bool {
        let last = self.last.load(Relaxed);
        if last != 0 && now_ms < (last - 1).saturating_add(WARN_EVERY_MS) {
            return false;
        }
        self.last
            .compare_exchange(last, now_ms + 1, Relaxed, Relaxed)
            .is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A pool stand-in: its last use (None: a send in flight) and its tickets.
    struct Fake {
        idle_since: Mutex<Option<u64>>,
        tickets: Mutex<Vec<Ticket>>,
        id: u64,
    }

    impl Member for Fake {
        fn idle_since(&self) -> Option<u64> {
            *self.idle_since.lock()
        }
        fn close_idle(&self) -> usize {
            if self.idle_since().is_none() {
                return 0;
            }
            let closed = std::mem::take(&mut *self.tickets.lock());
            closed.len()
        }
    }

    fn fake(budget: &ConnectionBudget, idle_since: Option<u64>) -> Arc<Fake> {
        Arc::new(Fake {
            idle_since: Mutex::new(idle_since),
            tickets: Mutex::new(Vec::new()),
            id: budget.member_id(),
        })
    }

    fn open(budget: &Arc<ConnectionBudget>, f: &Arc<Fake>) {
        let weak: Weak<dyn Member> = Arc::downgrade(f) as Weak<dyn Member>;
        let ticket = budget.admit(f.id, &weak);
        f.tickets.lock().push(ticket);
    }

    fn held(f: &Fake) -> usize {
        f.tickets.lock().len()
    }

    #[test]
    fn under_the_cap_nothing_is_closed() {
        let budget = ConnectionBudget::new(3);
        let (a, b) = (fake(&budget, Some(1)), fake(&budget, Some(2)));
        open(&budget, &a);
        open(&budget, &a);
        open(&budget, &b);
        assert_eq!((held(&a), held(&b), budget.open()), (2, 1, 3));
        assert_eq!(budget.over_cap(), 0);
    }

    #[test]
    fn at_the_cap_the_least_recently_used_idle_pool_closes_never_a_busy_one() {
        let budget = ConnectionBudget::new(2);
        // `a` was used longest ago but has a send in flight; `b` is the LRU idle one.
        let (a, b, c) = (
            fake(&budget, None),
            fake(&budget, Some(5)),
            fake(&budget, Some(9)),
        );
        open(&budget, &a);
        open(&budget, &b);
        open(&budget, &c);
        assert_eq!((held(&a), held(&b), held(&c)), (1, 0, 1));
        assert_eq!(budget.open(), 2);
        // Now `a` is idle and older than `c`: `a` goes for the next opener.
        *a.idle_since.lock() = Some(1);
        let d = fake(&budget, None);
        open(&budget, &d);
        assert_eq!((held(&a), held(&c), held(&d)), (0, 1, 1));
        assert_eq!(budget.over_cap(), 0);
    }

    #[test]
    fn the_opener_itself_is_never_its_own_victim() {
        let budget = ConnectionBudget::new(1);
        let a = fake(&budget, Some(0));
        open(&budget, &a);
        open(&budget, &a);
        assert_eq!(held(&a), 2, "a second slot of the same pool");
        assert_eq!(budget.over_cap(), 1);
    }

    #[test]
    fn when_every_pool_is_busy_the_open_is_allowed_and_counted() {
        let budget = ConnectionBudget::new(2);
        let (a, b, c) = (
            fake(&budget, None),
            fake(&budget, None),
            fake(&budget, None),
        );
        open(&budget, &a);
        open(&budget, &b);
        open(&budget, &c);
        assert_eq!((held(&a), held(&b), held(&c)), (1, 1, 1));
        assert_eq!((budget.open(), budget.over_cap()), (3, 1));
        // Closing gives the places back; the next open fits again.
        drop(std::mem::take(&mut *b.tickets.lock()));
        drop(std::mem::take(&mut *c.tickets.lock()));
        assert_eq!(budget.open(), 1);
        open(&budget, &b);
        assert_eq!((budget.open(), budget.over_cap()), (2, 1));
    }

    #[test]
    fn a_dropped_pool_is_skipped_and_its_tickets_come_back() {
        let budget = ConnectionBudget::new(1);
        let a = fake(&budget, Some(0));
        open(&budget, &a);
        drop(a);
        assert_eq!(budget.open(), 0);
        let b = fake(&budget, Some(0));
        open(&budget, &b);
        assert_eq!((budget.open(), budget.over_cap()), (1, 0));
    }

    #[test]
    fn a_ticket_is_given_back_once() {
        let budget = ConnectionBudget::new(4);
        let a = fake(&budget, Some(0));
        open(&budget, &a);
        open(&budget, &a);
        let t = a.tickets.lock().pop().unwrap();
        t.release();
        t.release();
        drop(t);
        assert_eq!(budget.open(), 1);
    }

    #[test]
    fn the_over_cap_warning_is_at_most_once_per_period() {
        let gate = WarnGate::default();
        assert!(gate.should_warn(0));
        assert!(!gate.should_warn(1));
        assert!(!gate.should_warn(WARN_EVERY_MS - 1));
        assert!(gate.should_warn(WARN_EVERY_MS));
        assert!(!gate.should_warn(WARN_EVERY_MS + 5));
        assert!(gate.should_warn(3 * WARN_EVERY_MS));
    }
}
