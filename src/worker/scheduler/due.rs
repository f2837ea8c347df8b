//! Which campaigns a round visits: only those with something due, so that a round costs
//! O(campaigns with work due), not O(all active). A campaign at 1/s is visited about
//! once a second, when its limiter said, not in every 10 ms round.
//!
//! A turn that names an instant (its limiter's next permit, a retry, a start, a lane
//! pause) puts the campaign to sleep until then; one that names none (no work, or
//! paused) leaves it idle until an event marks it ready: a job, an answer, a settings
//! change, a new share under a cap, activation. Sleep entries are not removed when a
//! campaign wakes early: a stale one only costs one extra, harmless turn. As a net under
//! an event this file might miss, every active campaign with work is visited at least
//! once per [`VISIT_ALL_EVERY`] (by its own wake-up when that falls within it).
//!
//! A turn cut below the campaign's share by a full pool (or provider) joins the room
//! waiters, which take freed room before the ready list, longest waiting first. Without
//! them, freed room went to the campaigns whose answers freed it, and one with nothing
//! in flight (just started, or a slow one) waited for the net: a second per try.

use super::*;

/// How often the net looks at every active campaign: a missed wake-up costs at most
/// twice this much delay, and the net costs O(active) reads once a second, not per round.
pub(super) const VISIT_ALL_EVERY: Duration = Duration::from_secs(1);

/// Turns whose state is hinted at once, just before they run. About 12 cache lines a
/// turn: 32 turns' are 24 KiB, within any x86_64 L1 data cache, so none is evicted
/// before its turn; hinting a whole round of thousands (100,000 registered) evicted
/// the first before they ran and made rounds slower.
const PREFETCH_BATCH: usize = 32;

impl Scheduler {
    /// The campaign has something new (a job, an answer, a setting): visit it next round.
    pub(super) fn mark_ready(&mut self, slot: u32) {
        let Some(c) = self
            .campaigns
            .get_mut(slot as usize)
            .and_then(Option::as_mut)
        else {
            return;
        };
        if c.active && !c.ready {
            c.ready = true;
            self.ready.push(slot);
        }
    }

    /// Moves the campaigns whose sleep ended by `now`, and on the net's schedule every
    /// active one, to the ready list.
    pub(super) fn wake_due(&mut self, now: Nanos) {
        let mut woken = std::mem::take(&mut self.woken);
        self.sleeping.drain_due(now, &mut woken);
        for &slot in &woken {
            self.mark_ready(slot);
        }
        woken.clear();
        self.woken = woken;
        let every = self.visit_all_every();
        if now.saturating_sub(self.last_visit_all) >= every {
            self.last_visit_all = now;
            // Every round (the benchmarks' baseline): all of them, as a scheduler without
            // wake-ups would.
            let all = every == 0;
            for k in 0..self.active.len() {
                let slot = self.active[k];
                if all || self.may_have_missed(slot, now, every) {
                    self.mark_ready(slot);
                }
            }
        }
    }

    /// Whether the net should visit the campaign: it has work, and its limiter's instant
    /// has passed, or is more than a net's period ahead, or was never named. One whose
    /// instant falls within the period has a sleep entry for it (pushed by the turn that
    /// learnt it) and is visited by then; were that entry missing, the next net finds
    /// the instant passed. One with no work waits for a job, which marks it ready.
    /// Visiting all of them cost a turn per active campaign a second, most of the net's
    /// cost at 1,000 campaigns.
    fn may_have_missed(&self, slot: u32, now: Nanos, every: Nanos) -> bool {
        self.campaign_ref(slot).is_some_and(|c| {
            c.has_work()
                && c.next_at
                    .is_none_or(|t| t <= now || t > now.saturating_add(every))
        })
    }

    fn visit_all_every(&self) -> Nanos {
        self.config
            .visit_all_every
            .unwrap_or(VISIT_ALL_EVERY)
            .as_nanos() as Nanos
    }

    /// The campaign's turn was cut below its share by a full pool or provider: it gets
    /// a turn as soon as room frees, before the ready list.
    pub(super) fn wait_for_room(&mut self, slot: u32) {
        if let Some(c) = self.campaigns[slot as usize].as_mut() {
            if !c.waiting_room {
                c.waiting_room = true;
                self.room_waiters.push_back(slot);
            }
        }
    }

    /// Turns for the room waiters, in order, while the pool has room. One whose provider
    /// is still full goes to the back without a turn; each is looked at once a round.
    fn visit_room_waiters(&mut self, share: u32, now: Nanos, unix_sec: u64) {
        for _ in 0..self.room_waiters.len() {
            if self.in_flight >= self.config.max_in_flight {
                return;
            }
            let Some(slot) = self.room_waiters.pop_front() else {
                return;
            };
            let Some(c) = self.campaigns[slot as usize].as_mut() else {
                continue;
            };
            let provider = usize::from(c.provider);
            let provider_full = self
                .provider_max_in_flight
                .get(provider)
                .is_some_and(|&max| self.provider_in_flight[provider] >= max);
            if provider_full {
                self.room_waiters.push_back(slot);
                continue;
            }
            c.waiting_room = false;
            if !c.active {
                continue;
            }
            // Its turn is now: an entry in the ready list is skipped this round.
            c.ready = false;
            if let Some(t) = self.turn(slot, share, now, unix_sec) {
                self.sleeping.push(t, slot);
            }
        }
    }

    /// Visits the room waiters, then the ready campaigns once each, from a rotating
    /// start; those that name an instant sleep until it.
    pub(super) fn visit_ready(&mut self, share: u32, now: Nanos, unix_sec: u64) {
        self.visit_room_waiters(share, now, unix_sec);
        // Taken so that turns may mark campaigns ready for the next round; the buffer
        // comes back, so a round allocates nothing.
        let mut ready = std::mem::take(&mut self.ready);
        let m = ready.len();
        let start = if m == 0 { 0 } else { self.rotate % m };
        self.rotate = self.rotate.wrapping_add(1);
        let mut batch = [0u32; PREFETCH_BATCH];
        for k in 0..m {
            if k % PREFETCH_BATCH == 0 {
                let n = PREFETCH_BATCH.min(m - k);
                for (j, b) in batch[..n].iter_mut().enumerate() {
                    *b = ready[(start + k + j) % m];
                }
                self.prefetch_turns(&batch[..n], unix_sec);
            }
            let slot = ready[(start + k) % m];
            let Some(c) = self.campaigns[slot as usize].as_mut() else {
                continue;
            };
            if !c.ready {
                continue;
            }
            c.ready = false;
            if !c.active {
                continue;
            }
            if let Some(t) = self.turn(slot, share, now, unix_sec) {
                self.sleeping.push(t, slot);
            }
        }
        ready.clear();
        ready.append(&mut self.ready);
        self.ready = ready;
    }

    /// The earliest instant a sleeping campaign named.
    pub(super) fn next_due(&self) -> Option<Nanos> {
        self.sleeping.next_due()
    }

    /// Summed send_rate of the active campaigns (cached until the active set or a
    /// rate changes).
    pub(super) fn rate_sum(&self) -> f64 {
        if let Some(sum) = self.rate_sum.get() {
            return sum;
        }
        let sum = self
            .active
            .iter()
            .filter_map(|&s| self.campaigns[s as usize].as_ref())
            .map(|c| c.settings.rate.as_f64())
            .sum();
        self.rate_sum.set(Some(sum));
        sum
    }
}
