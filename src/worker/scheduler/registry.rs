//! The campaign registry: settings applied from the store, jobs taken from intake, a
//! campaign's slot and limiter, activation within `max_active_campaigns`, and release
//! (and forgetting) of idle campaigns.

use super::*;

impl Scheduler {
    /// Applies settings from the store (rate change, pause, algorithm change).
    pub fn apply_settings(&mut self, s: CampaignSettings, now: Nanos) {
        self.now_hint = self.now_hint.max(now);
        self.known.insert(s.id.clone(), (s.clone(), self.now_hint));
        let Some(&slot) = self.by_id.get(&s.id) else {
            return;
        };
        self.counters.rate_changes += 1;
        let rebuild = {
            let c = self.campaigns[slot as usize]
                .as_ref()
                .expect("indexed campaign");
            c.settings.algorithm != s.algorithm
                || c.settings.burst != s.burst
                || c.settings.limiter_scope != s.limiter_scope
        };
        let effective = self.campaigns[slot as usize]
            .as_ref()
            .map_or(s.rate, |c| c.effective_rate);
        let limiter = rebuild.then(|| self.build_limiter(&s, effective));
        let c = self.campaigns[slot as usize]
            .as_mut()
            .expect("indexed campaign");
        if let Some(l) = limiter {
            c.limiter = l;
            // The new limiter is not served first until the next rebalance says so.
            c.first_under_global = false;
        }
        c.next_at = None;
        self.rate_sum.set(None);
        self.mark_ready(slot);
        let c = self.campaigns[slot as usize]
            .as_mut()
            .expect("indexed campaign");
        tracing::info!(campaign = %s.id, rate = %s.rate, algorithm = %s.algorithm, paused = s.paused, halted = s.halted, priority = %s.priority, "campaign settings applied");
        let (halted, paused, cancelled) = (s.halted, s.paused, s.cancelled);
        let was_stopped = c.settings.paused || c.settings.halted || c.halt.is_some();
        let reclassed = (c.settings.priority != s.priority).then_some(s.priority);
        let reramped = (c.settings.ramp_up_s, c.settings.ramp_from) != (s.ramp_up_s, s.ramp_from)
            && c.ramp.is_some();
        let relocal = c.settings.local != s.local;
        c.settings = s;
        self.apply_halt_settings(slot, halted, paused);
        if let Some(class) = reclassed {
            self.restamp_jobs(slot, class);
        }
        if relocal {
            self.recheck_windows(slot, now);
        }
        let c = self.campaigns[slot as usize]
            .as_ref()
            .expect("indexed campaign");
        let stopped = c.settings.paused || c.settings.halted || c.halt.is_some();
        if (was_stopped && !stopped) || reramped {
            // A campaign that resumes climbs again (FCM: no sudden change of rate).
            self.start_ramp(slot, now);
        }
        if cancelled {
            self.cancel_campaign(slot, now);
        }
        // The new rate (or pause) changes everyone's fair share under a cap.
        self.sync_rate(slot, now);
    }

    /// Takes a job from the consumer.
    pub fn add_job(&mut self, incoming: IncomingJob, now: Nanos) {
        self.now_hint = self.now_hint.max(now);
        if self.is_revoking(incoming.partition) {
            // Assigned again before its revoked sends came back: intake counts the job
            // (offset, load, backlog), so it waits for the revocation, never dropped.
            self.hold_until_revoked(incoming);
            return;
        }
        let IncomingJob {
            mut job,
            partition,
            offset,
            already_done,
            skip_done,
            settings,
            skip_invalid,
            skip_capped,
            dispatched,
        } = incoming;
        let campaign_id: Arc<str> = Arc::from(job.campaign_id.as_str());
        let settings = self
            .known
            .get(&campaign_id)
            .map_or(settings, |(s, _)| s.clone());
        crate::job::bound_by_campaign_expiry(&mut job, settings.expires_at_ms);
        self.known
            .insert(campaign_id.clone(), (settings.clone(), now));
        // An app slot's state (gate, cap, lane) exists before its first job is held.
        self.ensure_slot(job.provider_slot);
        self.stamp_class(&job, settings.priority);
        let cslot = self.campaign_slot(settings, job.provider_slot);
        let mut active =
            self.new_active_job(job, cslot, (partition, offset), already_done, dispatched);
        self.skip_at_intake(
            &mut active,
            cslot,
            [&skip_done, &skip_invalid, &skip_capped],
        );
        if active.done_count == active.total() {
            // Finished in an earlier run: nothing to send.
            let _ = self.events.send(Event::JobFinished {
                partition,
                offset,
                devices: active.total(),
                progress: active.progress,
            });
            self.release_campaign_if_idle(cslot);
            return;
        }
        let stated = active.job.lifecycle.campaign_total_devices;
        let slot = match self.free_jobs.pop() {
            Some(s) => {
                self.jobs[s as usize] = Some(active);
                s
            }
            None => {
                self.jobs.push(Some(active));
                (self.jobs.len() - 1) as u32
            }
        };
        self.queue_job(cslot, slot, now);
        self.open_job(cslot, stated, now);
    }

    /// A job's scheduler state, with its first `already_done` devices finished.
    fn new_active_job(
        &mut self,
        job: Arc<Job>,
        cslot: u32,
        (partition, offset): (i32, i64),
        already_done: u32,
        dispatched: Arc<AtomicU32>,
    ) -> ActiveJob {
        let total = job.devices.len() as u32;
        let progress = self.stats.track_job(JobKey {
            job_id: job.job_id.clone(),
            campaign_id: job.campaign_id.clone(),
            partition,
            offset,
            devices_total: total,
        });
        let already_done = already_done.min(total);
        let mut active = ActiveJob {
            job,
            total,
            campaign: cslot,
            partition,
            offset,
            next: already_done,
            done: vec![0; total.div_ceil(64) as usize],
            done_count: 0,
            done_prefix: 0,
            in_flight: 0,
            progress,
            done_ahead: 0,
            dispatched,
            ended: Default::default(),
            closes_ms: None,
        };
        active.dispatched.store(already_done, Ordering::Relaxed);
        for i in 0..already_done {
            active.mark_done(i);
        }
        active
    }

    /// Marks the devices intake found finished before, gone (invalid) or capped as done
    /// ahead of the cursor, and counts the last two.
    fn skip_at_intake(&mut self, active: &mut ActiveJob, cslot: u32, lists: [&[u32]; 3]) {
        let (start, total) = (active.next, active.total());
        let mut skip = |list: &[u32]| {
            let mut skipped = 0u32;
            for &i in list.iter().filter(|&&i| i >= start && i < total) {
                if !active.is_done(i) {
                    active.mark_done(i);
                    active.done_ahead += 1;
                    skipped += 1;
                }
            }
            skipped
        };
        // Finished before: done, but not skipped now (no count, no skipped_invalid).
        let _ = skip(lists[0]);
        let skipped = skip(lists[1]);
        let capped = skip(lists[2]);
        for (n, outcome) in [
            (skipped, Outcome::SkippedInvalid),
            (capped, Outcome::Capped),
        ] {
            if n > 0 {
                if let Some(c) = self.campaigns[cslot as usize].as_ref() {
                    c.counter.record(unix_now(), outcome, n);
                }
            }
        }
        self.counters.skipped_invalid += u64::from(skipped);
        self.skipped_total.increment(u64::from(skipped));
        self.counters.capped += u64::from(capped);
        self.capped_total.increment(u64::from(capped));
    }

    /// Counts a queued job against its campaign and makes the campaign active (or
    /// waiting for room); a cancelled campaign's job is finished at once.
    fn open_job(&mut self, cslot: u32, stated_total: Option<u64>, now: Nanos) {
        let c = self.campaigns[cslot as usize]
            .as_mut()
            .expect("campaign slot");
        c.open_jobs += 1;
        if let Some(n) = stated_total {
            c.total_devices = Some(c.total_devices.map_or(n, |t| t.max(n)));
        }
        if c.settings.cancelled {
            // A job of a cancelled campaign: finished at once, counted `cancelled`.
            self.cancel_campaign(cslot, now);
            return;
        }
        if !c.active && !self.waiting.contains(&cslot) {
            if self.active.len() < self.config.max_active_campaigns {
                self.activate(cslot);
            } else {
                self.waiting.push_back(cslot);
            }
        }
        self.mark_ready(cslot);
    }

    /// The campaign's slot; a new campaign takes the provider of its first job (for
    /// the provider's cap).
    pub(super) fn campaign_slot(&mut self, settings: CampaignSettings, provider: u16) -> u32 {
        if let Some(&s) = self.by_id.get(&settings.id) {
            return s;
        }
        let id = settings.id.clone();
        let effective_rate = self.first_rate(&settings);
        let limiter = self.build_limiter(&settings, effective_rate);
        let counter = self.stats.campaign(&settings.id);
        let c = Campaign {
            settings,
            limiter,
            queue: VecDeque::new(),
            retries: BinaryHeap::new(),
            in_flight: 0,
            open_jobs: 0,
            next_at: None,
            counter,
            active: false,
            effective_rate,
            sent: 0,
            failed: 0,
            retried: 0,
            invalid: 0,
            provider,
            halt: None,
            confirmed: false,
            mismatch: answers::MismatchWindow::default(),
            refusals: Default::default(),
            scheduled: BinaryHeap::new(),
            waiting_start: false,
            next_job_expiry: None,
            expired: 0,
            cancelled: 0,
            total_devices: None,
            ready: false,
            waiting_room: false,
            ramp: None,
            plan: self.plans.get(&id).copied(),
            starved_since: None,
            next_close_ms: None,
            first_under_global: false,
        };
        let slot = match self.campaigns.iter().position(|c| c.is_none()) {
            Some(i) => {
                self.campaigns[i] = Some(c);
                i as u32
            }
            None => {
                self.campaigns.push(Some(c));
                (self.campaigns.len() - 1) as u32
            }
        };
        self.by_id.insert(id, slot);
        self.counters.rate_changes += 1;
        self.start_ramp(slot, self.now_hint);
        slot
    }

    pub(super) fn activate(&mut self, slot: u32) {
        let c = self.campaigns[slot as usize]
            .as_mut()
            .expect("campaign slot");
        c.active = true;
        self.active.push(slot);
        self.counters.live_changes += 1;
        self.rate_sum.set(None);
        self.mark_ready(slot);
        let c = self.campaigns[slot as usize]
            .as_mut()
            .expect("campaign slot");
        self.counters.max_active_seen = self.counters.max_active_seen.max(self.active.len());
        tracing::info!(campaign = %c.settings.id, active = self.active.len(), "campaign active");
        self.rebalance(self.now_hint);
    }

    /// Deactivates and forgets a campaign with no open jobs; admits a waiting one.
    pub(super) fn release_campaign_if_idle(&mut self, slot: u32) {
        if self.in_round {
            if !self.deferred_release.contains(&slot) {
                self.deferred_release.push(slot);
            }
            return;
        }
        let idle = self.campaigns[slot as usize]
            .as_ref()
            .is_some_and(|c| !c.has_work() && c.in_flight == 0);
        if !idle {
            return;
        }
        let c = self.campaigns[slot as usize].take().expect("campaign slot");
        self.counters.live_changes += 1;
        self.by_id.remove(&c.settings.id);
        self.active.retain(|&s| s != slot);
        self.rate_sum.set(None);
        self.waiting.retain(|&s| s != slot);
        if c.waiting_room {
            self.room_waiters.retain(|&s| s != slot);
        }
        tracing::info!(campaign = %c.settings.id, "campaign idle");
        drop(c);
        while self.active.len() < self.config.max_active_campaigns {
            match self.waiting.pop_front() {
                Some(next) => self.activate(next),
                None => break,
            }
        }
        self.rebalance(self.now_hint);
    }

    /// Forgets the settings of campaigns that had no job for `forget_after`.
    pub(super) fn sweep_known(&mut self, now: Nanos) {
        if now.saturating_sub(self.last_sweep) < SWEEP_EVERY.as_nanos() as Nanos {
            return;
        }
        self.last_sweep = now;
        let forget = self.config.forget_after.as_nanos() as Nanos;
        let before = self.known.len();
        let by_id = &self.by_id;
        self.known
            .retain(|id, (_, used)| by_id.contains_key(id) || now.saturating_sub(*used) < forget);
        let forgotten = before - self.known.len();
        if forgotten > 0 {
            tracing::debug!(forgotten, "idle campaigns forgotten");
        }
    }
}
