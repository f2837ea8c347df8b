//! The rounds: the quantum, one turn per active campaign (permits, in-flight room,
//! retries first, then the job cursor) and the dispatch of each send.

use super::*;
use crate::job::PriorityClass;

impl Scheduler {
    /// The round's quantum: short when rates are high, long when they are low. It aims at
    /// about 100 sends per round in total, within [quantum_min, quantum_max].
    pub fn quantum(&self) -> Duration {
        let total = self.rate_sum();
        if total <= 0.0 {
            return self.config.quantum_max;
        }
        Duration::from_secs_f64(100.0 / total)
            .clamp(self.config.quantum_min, self.config.quantum_max)
    }

    /// When the next round runs if nothing arrives first: at the instant `run_round`
    /// named (`wake`), at the latest the end of this round's quantum, and no sooner than
    /// the slack ([`Scheduler::slack`]) after `now`. Without the slack a thousand
    /// campaigns name a thousand instants a second and each costs a wake-up; with it one
    /// wake-up serves all that fell due within it, and a turn makes up the slack on top
    /// of `quantum_min` ([`acquire_catching_up`]), so sends keep their limiter's
    /// schedule, shifted by at most the slack.
    pub fn next_round_at(&self, now: Nanos, wake: Option<Nanos>) -> Nanos {
        let round_end = now + self.quantum().as_nanos() as Nanos;
        let earliest = now + self.slack();
        wake.map_or(round_end, |w| w.max(earliest).min(round_end))
    }

    /// The wake slack in use: `wake_slack`, shortened at summed rates above
    /// [`SENDS_PER_WAKE`] / `wake_slack` so that one wake-up releases about that many
    /// sends at most (2 ms at 100,000/s). A wake-up costs the same whatever it serves,
    /// so below that rate the full slack saves the most; above it the burst, not the
    /// wake-up, is what to bound.
    pub fn slack(&self) -> Nanos {
        let max = self.config.wake_slack.as_nanos() as Nanos;
        let sum = self.rate_sum();
        if sum <= 0.0 {
            return max;
        }
        max.min((SENDS_PER_WAKE / sum * NANOS_PER_SEC as f64) as Nanos)
    }

    /// One round: a turn for every active campaign. Returns when the scheduler next has
    /// something to do (a limiter's next permit or a retry falling due), if sooner than
    /// the next round.
    pub fn run_round(&mut self, now: Nanos, unix_sec: u64) -> Option<Nanos> {
        self.now_hint = self.now_hint.max(now);
        self.counters.rounds += 1;
        self.tick_lanes(now, unix_sec);
        self.settle_letters();
        // Jobs held for a revocation that completed during the last round.
        self.admit_held();
        self.sweep_known(now);
        let n = self.active.len();
        // The flusher holds too many unwritten rows, or the outcomes queue is full
        // (database down): pause, never drop.
        let held = self.letters.back().is_some_and(|l| l.seq.is_none());
        if n == 0 || self.draining || self.stats.backpressure() || held {
            return self.letters_wake(now);
        }
        let share = (self.config.max_in_flight / n).max(1) as u32;
        let ramp_at = self.tick_ramps(now);
        self.wake_due(now);
        // Campaigns that go idle in this round are released after it, so that the
        // active list does not change under the loop.
        self.in_round = true;
        self.visit_ready(share, now, unix_sec);
        self.in_round = false;
        while let Some(slot) = self.deferred_release.pop() {
            self.release_campaign_if_idle(slot);
        }
        [self.next_due(), self.letters_wake(now), ramp_at]
            .into_iter()
            .flatten()
            .min()
    }

    /// One campaign's turn: as many permits as it has work and room for, retries first.
    /// Returns when it next wants a turn, if it knows.
    pub(super) fn turn(
        &mut self,
        slot: u32,
        share: u32,
        now: Nanos,
        unix_sec: u64,
    ) -> Option<Nanos> {
        self.counters.turns += 1;
        let (want, mut wake, cut) = match self.turn_want(slot, share, now, unix_sec) {
            Ok(w) => w,
            Err(wake) => return wake,
        };
        if want == 0 {
            if cut {
                self.wait_for_room(slot);
            }
            return wake;
        }
        // The turn sends through one provider (its oldest work's): that provider's cap,
        // not the campaign's first job's, passes them.
        let c = self.campaigns[slot as usize].as_ref()?;
        let provider = c.provider;
        let critical = c.settings.priority == PriorityClass::Critical;
        let first = self.served_first(provider, c.settings.priority);
        let (want, gate_at) = self.provider_gate(provider, want, now, critical, first);
        if let Some(t) = gate_at {
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        if want == 0 {
            return wake;
        }
        // The slack delays a turn on purpose: it must not use up what a late wake-up
        // may be made up by.
        let budget = self.config.quantum_min.as_nanos() as Nanos + self.slack();
        let horizon = self.edge.horizon(now);
        let c = self.campaigns[slot as usize].as_mut()?;
        let grant = acquire_catching_up(c.limiter.as_ref(), want, c.next_at, horizon, budget);
        c.next_at = grant.next_at;
        self.provider_take(provider, grant.granted, now, (critical, first));
        if cut && gate_at.is_none() && grant.granted == want {
            // Room, not its limiter, held it below its share.
            self.wait_for_room(slot);
        }
        if let Some(t) = grant.next_at.map(|t| self.edge.release_at(t)) {
            self.counters
                .limiter_waits
                .record((t - now) as f64 / NANOS_PER_SEC as f64);
            wake = Some(wake.map_or(t, |w| w.min(t)));
        }
        let left = self.send_due_retries(slot, grant.granted, provider, now, unix_sec);
        self.send_queued(slot, left, provider, now, unix_sec);
        if self.work_provider(slot, now).is_some_and(|p| p != provider) {
            // Its next work goes through another provider: a turn for it next round.
            self.mark_ready(slot);
        }
        wake
    }

    /// The provider of a campaign's oldest work: its first due retry's job, else its
    /// oldest queued job's.
    pub(super) fn work_provider(&self, slot: u32, now: Nanos) -> Option<u16> {
        let c = self.campaigns[slot as usize].as_ref()?;
        let due = c
            .retries
            .peek()
            .filter(|Reverse(r)| r.not_before <= now)
            .map(|Reverse(r)| r.slot);
        let jslot = due.or_else(|| c.queue.front().copied())?;
        self.job_provider(jslot)
    }

    fn job_provider(&self, jslot: u32) -> Option<u16> {
        self.jobs[jslot as usize]
            .as_ref()
            .map(|j| j.job.provider_slot)
    }

    /// The campaign's sends now go through `provider`: under a cap it takes its share
    /// of that provider's (one max-min pass, once per change of provider, not per send).
    fn follow_provider(&mut self, slot: u32, provider: u16, now: Nanos) {
        let Some(c) = self.campaigns[slot as usize].as_mut() else {
            return;
        };
        if c.provider == provider {
            return;
        }
        c.provider = provider;
        if self.is_capped() {
            self.rebalance(now);
        }
    }

    /// How many permits the turn asks for, the campaign's next retry instant, and
    /// whether a full pool or provider cut it below what its share allows; or, as `Err`,
    /// the wake to return when the campaign may not send now.
    fn turn_want(
        &mut self,
        slot: u32,
        share: u32,
        now: Nanos,
        unix_sec: u64,
    ) -> Result<(u32, Option<Nanos>, bool), Option<Nanos>> {
        let (may_send, gate_wake) = self.lifecycle_gate(slot, now, unix_sec);
        if !may_send {
            return Err(gate_wake);
        }
        let Some(c) = self.campaigns[slot as usize].as_ref() else {
            return Err(None);
        };
        if c.settings.paused || c.settings.halted || c.halt.is_some() {
            return Err(None);
        }
        if let Some(t) = c.next_at.filter(|&t| t > now) {
            return Err(Some(self.edge.release_at(t)));
        }
        if let Some(p) = self.work_provider(slot, now) {
            self.follow_provider(slot, p, now);
        }
        let Some(c) = self.campaigns[slot as usize].as_ref() else {
            return Err(None);
        };
        let provider = c.provider;
        match self.app_gate(provider) {
            None | Some(app_gates::Gate::Open) => {}
            // Its app is not ready: nothing until the router opens the gate (which wakes
            // it); in-flight sends finish.
            Some(app_gates::Gate::Closed(_)) => return Err(None),
            Some(app_gates::Gate::Gone) => {
                self.end_slot_jobs(provider, now, unix_sec);
                return Err(None);
            }
        }
        if let Some(until) = self.lane_paused(provider, now) {
            // The provider asked for a pause: nothing until then, in-flight sends finish.
            return Err(Some(until));
        }
        let (room, allowed) = self.turn_room(slot, share);
        let Some(c) = self.campaigns[slot as usize].as_ref() else {
            return Err(None);
        };
        // Only the work through the turn's provider: its cap and room are the ones asked.
        let ready_retries = c
            .retries
            .iter()
            .filter(|Reverse(r)| r.not_before <= now && self.job_provider(r.slot) == Some(provider))
            .count() as u32;
        // Work across job boundaries up to the room: were `want` cut at the end of a job,
        // the limiter would grant all of it and name no next instant, and the permits due
        // until the next turn would be lost (the turn goes on to the next job itself).
        let mut undispatched: u32 = 0;
        for &j in &c.queue {
            // Past the room by one job at most: enough to tell whether room cut it.
            if ready_retries.saturating_add(undispatched) > room {
                break;
            }
            if let Some(job) = self.jobs[j as usize].as_ref() {
                if job.job.provider_slot != provider {
                    break;
                }
                undispatched = undispatched.saturating_add(job.total() - job.next - job.done_ahead);
            }
        }
        let wake = c
            .retries
            .peek()
            .map(|Reverse(r)| r.not_before)
            .filter(|&t| t > now);
        let work = ready_retries.saturating_add(undispatched);
        let cut = room < allowed && work > room;
        Ok((work.min(room), wake, cut))
    }

    /// The sends a campaign may start now: its share of `max_in_flight` (or more while
    /// half the pool sits idle: the share only has to stop one slow campaign from
    /// starving the others), within the pool's and its provider's room, and within the
    /// probe limit until its first answer. Also what its share and probe alone allow.
    fn turn_room(&self, slot: u32, share: u32) -> (u32, u32) {
        let room_total = self.config.max_in_flight.saturating_sub(self.in_flight) as u32;
        let Some(c) = self.campaigns[slot as usize].as_ref() else {
            return (0, 0);
        };
        let provider = usize::from(c.provider);
        let provider_room = self
            .provider_max_in_flight
            .get(provider)
            .map_or(u32::MAX, |&max| {
                max.saturating_sub(self.provider_in_flight[provider])
            });
        let mut allowed = share.max(room_total / 2).saturating_sub(c.in_flight);
        if !c.confirmed {
            allowed = allowed.min(PROBE_IN_FLIGHT.saturating_sub(c.in_flight));
        }
        (allowed.min(room_total).min(provider_room), allowed)
    }

    /// Spends up to `permits` on the campaign's retries that are due (the oldest work);
    /// returns the permits left.
    /// Retries through another provider than the turn's wait for a turn of their own
    /// (the next round's, `turn`), so that each send counts against its own provider.
    fn send_due_retries(
        &mut self,
        slot: u32,
        permits: u32,
        provider: u16,
        now: Nanos,
        unix_sec: u64,
    ) -> u32 {
        let mut left = permits;
        while left > 0 {
            let Some(c) = self.campaigns[slot as usize].as_mut() else {
                return 0;
            };
            if c.halt.is_some() {
                break;
            }
            let next = c.retries.peek().map(|Reverse(r)| (r.not_before, r.slot));
            match next {
                Some((at, jslot)) if at <= now && self.job_provider(jslot) == Some(provider) => {
                    let c = self.campaigns[slot as usize].as_mut().expect("campaign");
                    let r = c.retries.pop().expect("peeked").0;
                    let sent = self.dispatch(
                        slot,
                        r.slot,
                        r.device,
                        (r.attempt, r.first_failed),
                        now,
                        unix_sec,
                    );
                    // A device its origin's ceiling holds waits again, without the permit.
                    left -= u32::from(sent);
                }
                _ => break,
            }
        }
        left
    }

    /// Spends up to `permits` on the next devices of the campaign's queued jobs that go
    /// through `provider` (the turn's); a job through another waits for its own turn.
    fn send_queued(&mut self, slot: u32, permits: u32, provider: u16, now: Nanos, unix_sec: u64) {
        let mut left = permits;
        while left > 0 {
            let Some(c) = self.campaigns[slot as usize].as_mut() else {
                return;
            };
            if c.halt.is_some() {
                break;
            }
            let Some(&jslot) = c.queue.front() else { break };
            let job = self.jobs[jslot as usize].as_mut().expect("queued job");
            if job.job.provider_slot != provider {
                break;
            }
            let device = job.next;
            job.next += 1;
            let skipped = job.is_done(device);
            if skipped {
                job.done_ahead -= 1;
            }
            // Step over devices skipped at intake, so a finished job is never queued.
            while job.next < job.total() && job.is_done(job.next) {
                job.next += 1;
                job.done_ahead -= 1;
            }
            job.dispatched.store(job.next, Ordering::Relaxed);
            if job.next == job.total() {
                c.queue.pop_front();
            }
            if skipped {
                // Skipped at intake: no send, and its permit goes to the next device.
                continue;
            }
            if self.capped_at_send(slot, jslot, device, now, unix_sec) {
                // A policy outcome: finished without a send; the permit is kept.
                continue;
            }
            if self.dispatch(slot, jslot, device, (0, 0), now, unix_sec) {
                left -= 1;
            }
        }
    }

    /// The local frequency cap's decision for one device; a capped device is finished
    /// without a send.
    fn capped_at_send(
        &mut self,
        slot: u32,
        jslot: u32,
        device: u32,
        now: Nanos,
        unix_sec: u64,
    ) -> bool {
        let Some(cap) = self.capping.as_mut() else {
            return false;
        };
        let job = self.jobs[jslot as usize].as_mut().expect("queued job");
        if cap.check(&job.job.devices[device as usize], now) != CapDecision::Capped {
            return false;
        }
        if let Some(c) = self.campaigns[slot as usize].as_ref() {
            c.counter.record(unix_sec, Outcome::Capped, 1);
        }
        self.counters.capped += 1;
        self.capped_total.increment(1);
        job.mark_done(device);
        if job.done_count == job.total() {
            self.finish_job(jslot);
        }
        true
    }

    /// Sends one device; `false` when it waits instead (its Web Push origin's ceiling or
    /// its provider's pause), keeping the turn's permit for the next device.
    pub(super) fn dispatch(
        &mut self,
        cslot: u32,
        jslot: u32,
        device: u32,
        (attempt, first_failed): (u32, Nanos),
        now: Nanos,
        unix_sec: u64,
    ) -> bool {
        let provider = self.jobs[jslot as usize]
            .as_ref()
            .map_or(0, |j| j.job.provider_slot);
        let reserved = attempt & origins::RESERVED != 0;
        let attempt = attempt & !origins::RESERVED;
        if let Some(reason) = self.provider_halt(provider) {
            // Its provider refused its configuration: no send, the device waits.
            self.halt_campaign(cslot, &reason, now);
            self.hold_for_resume((jslot, device, attempt, first_failed), now);
            return true;
        }
        if !matches!(self.app_gate(provider), None | Some(app_gates::Gate::Open)) {
            // Its app's gate closed during the turn (an answer ready at once): it waits
            // for the gate, with its permit spent, so the turn ends.
            self.hold_for_resume((jslot, device, attempt, first_failed), now);
            return true;
        }
        let gate = match self.origin_gate(jslot, device, reserved, now) {
            Ok(origin) => self
                .lane_paused(provider, now)
                .map_or(Ok(origin), |u| Err((u, false))),
            Err(wait) => Err(wait),
        };
        let origin = match gate {
            Ok(origin) => origin,
            Err((not_before, reserved)) => {
                // Its origin is at its ceiling (or paused), or its provider asked for a
                // pause after the turn looked: the device waits, holding its slot when
                // it has one.
                let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
                let attempt = if reserved {
                    attempt | origins::RESERVED
                } else {
                    attempt
                };
                c.retries.push(Reverse(RetryItem {
                    not_before,
                    slot: jslot,
                    device,
                    attempt,
                    first_failed,
                }));
                return false;
            }
        };
        self.lane_sent(provider, origin, now);
        let job = self.jobs[jslot as usize].as_mut().expect("dispatched job");
        job.in_flight += 1;
        if let Some(n) = self.provider_in_flight.get_mut(usize::from(provider)) {
            *n += 1;
        }
        let future: SendFuture = self.providers.send(&job.job, device as usize);
        let epoch = self.slot_epoch(provider);
        let c = self.campaigns[cslot as usize].as_mut().expect("campaign");
        c.in_flight += 1;
        self.in_flight += 1;
        self.counters.sends += 1;
        match future.into_ready() {
            Ok(outcome) => self.complete(
                Completion {
                    slot: jslot,
                    device,
                    attempt,
                    first_failed,
                    outcome,
                    latency_ns: 0,
                    epoch,
                },
                now,
                unix_sec,
            ),
            Err(pending) => {
                let tx = self.completions.clone();
                tokio::spawn(async move {
                    let started = std::time::Instant::now();
                    let outcome = pending.await;
                    let _ = tx.send(Completion {
                        slot: jslot,
                        device,
                        attempt,
                        first_failed,
                        outcome,
                        latency_ns: started.elapsed().as_nanos() as u64,
                        epoch,
                    });
                });
            }
        }
        true
    }
}
