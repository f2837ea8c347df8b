//! The intake's parking and pause policy: parked jobs handed over when their campaign
//! runs low, and partitions paused while too much is parked.

use super::*;

/// How often the search for partitions where a campaign starves runs: it walks every
/// campaign and reads each held job's cursor, which the scheduler's thread writes (at
/// 1,000 campaigns 145 µs a walk; at every bookkeeping pass, 3 ms of CPU a second).
/// A campaign starves below the backlog's low water, 2 s of its sends, and its next
/// job was found up to 0.7 s after that in the 1,000-campaign bench: 100 ms later
/// leaves it more than a second (docs/BENCHMARKS.md, "the intake's walks").
pub(super) const STARVING_EVERY: Duration = Duration::from_millis(100);

impl Loop {
    /// Hands over parked jobs of campaigns running low, most starved first: from memory,
    /// or re-read from Kafka.
    pub(super) fn unpark_due(&mut self) {
        // Bounded per step, in count and in time, so that the loop still polls often
        // (the group's poll interval) and serves new messages and rebalances.
        const MAX_PER_STEP: usize = 64;
        const MAX_STEP_TIME: Duration = Duration::from_millis(200);
        let started = Instant::now();
        for _ in 0..MAX_PER_STEP {
            if started.elapsed() > MAX_STEP_TIME || self.under_pressure() {
                return;
            }
            let room = self.has_room();
            let now = Instant::now();
            let Some((campaign, parked)) =
                self.with_state(|s, _| s.backlog.next_to_unpark(room, now))
            else {
                return;
            };
            let (at, devices) = (parked.at, parked.devices);
            let fetched = match parked.message {
                Some(m) => Ok(m),
                None => {
                    self.with_state(|s, _| s.stats.parked_rereads += 1);
                    self.refetcher.fetch(&self.topic, at)
                }
            };
            let span = tracing::info_span!(
                "job",
                partition = at.partition,
                offset = at.offset,
                refetched = true
            );
            let _g = span.enter();
            match fetched {
                Ok(msg) => {
                    let job = self.decode_or_dead_letter(&msg, at.partition, at.offset);
                    // Its rules may have changed since it was parked: it may wait again.
                    if let Some(job) = job.filter(|j| {
                        !self.park_for_window(&j.campaign_id, j.zone, at, j.devices.len() as u32)
                    }) {
                        let settings = self.campaign_settings(&job);
                        self.hand_over(job, settings, at.partition, at.offset);
                    }
                }
                Err(RefetchError::Gone { offset, earliest }) => {
                    let reason = format!(
                        "parked job at offset {offset} was deleted by retention before it was re-read (the partition now starts at {earliest})"
                    );
                    tracing::error!(%campaign, %reason, "parked job lost to retention; dead-lettered");
                    self.with_state(|s, _| {
                        s.dead_letter_message(Letter {
                            kind: DeadLetterKind::ExpiredOffset,
                            partition: at.partition,
                            offset: at.offset,
                            campaign_id: Some(campaign.clone()),
                            job_id: None,
                            device: None,
                            device_token: None,
                            reason,
                            key: None,
                            raw: Vec::new(),
                            replay: None,
                        })
                    });
                }
                Err(RefetchError::Transient(e)) => {
                    tracing::warn!(error = %e, %campaign, "cannot re-read a parked job; this campaign retries in 1 s");
                    let retry_at = Instant::now() + REFETCH_BACKOFF;
                    self.with_state(|s, _| {
                        s.backlog.unpark_failed(&campaign, at, devices, retry_at)
                    });
                }
            }
        }
    }

    /// Pauses a partition whose parked jobs exceed its share of `max_parked_jobs`, or,
    /// once parked messages fill `max_parked_bytes`, any partition where no campaign
    /// starves (as last searched, at most [`STARVING_EVERY`] ago): reading ahead is then
    /// driven by need, and parked jobs stay in memory instead of being re-read from Kafka
    /// one by one. Under `pressure` every partition is paused.
    pub(super) fn adjust_pauses(&mut self, pressure: bool) {
        let share = self.parked_share();
        let max_bytes = self.max_parked_bytes;
        let topic = self.topic.clone();
        let due = self
            .starving
            .0
            .is_none_or(|t| t.elapsed() >= STARVING_EVERY);
        let last = std::mem::take(&mut self.starving.1);
        let (starving, above) = self.with_state(|s, c| {
            let evicted = s.backlog.evict_hog(max_bytes);
            if evicted > 0 {
                tracing::info!(evicted, "one campaign filled the parked-bytes budget; its newest parked jobs will be re-read");
            }
            for p in s.assigned.iter() {
                s.load.entry(*p).or_default();
            }
            // Where a campaign starves matters only above ¾ of the byte budget (below it
            // no partition is held for memory); finding out walks every campaign, so it
            // keeps its own pace, with the last answer in between.
            let above = s.backlog.parked_bytes() > max_bytes / 4 * 3;
            let starving_in = match (above, due) {
                (false, _) => Vec::new(),
                (true, true) => s.backlog.starving_partitions(&s.assigned),
                (true, false) => last,
            };
            let partitions: Vec<i32> = s.load.keys().copied().collect();
            for p in partitions {
                let starving = starving_in.contains(&p);
                pause_for_backlog(s, c, &topic, p, share, max_bytes, starving, pressure);
            }
            (starving_in, above)
        });
        // Below ¾ nothing was searched: the first pass above it searches at once.
        if !above {
            self.starving.0 = None;
        } else if due {
            self.starving.0 = Some(Instant::now());
        }
        self.starving.1 = starving;
    }

    /// After a message from `partition` was read: whether its backlog now pauses it,
    /// judged for that partition alone (a read changes only its parked count and the
    /// parked bytes), with the starving partitions last searched. So a
    /// partition stops at its share before its next message, without a walk over every
    /// campaign per message (at 1,000 campaigns' start, a tenth of the intake's CPU).
    pub(super) fn pause_after_read(&mut self, partition: i32) {
        let share = self.parked_share();
        let max_bytes = self.max_parked_bytes;
        let starving = self.starving.1.contains(&partition);
        self.with_state(|s, c| {
            pause_for_backlog(
                s,
                c,
                &self.topic,
                partition,
                share,
                max_bytes,
                starving,
                false,
            );
        });
    }

    /// A partition's share of `max_parked_jobs`.
    fn parked_share(&self) -> usize {
        let n = self.with_state(|s, _| s.load.len().max(s.assigned.len()).max(1));
        (self.max_parked / n).max(1)
    }
}

/// Sets `partition`'s backlog pause from its parked jobs and the parked bytes, and
/// pauses or resumes it in librdkafka when that (or `pressure`) changed what it wants.
#[allow(clippy::too_many_arguments)]
fn pause_for_backlog(
    s: &mut State,
    c: &BaseConsumer<Ctx>,
    topic: &str,
    partition: i32,
    share: usize,
    max_bytes: usize,
    starving: bool,
    pressure: bool,
) {
    let bytes = s.backlog.parked_bytes();
    let parked = s.backlog.parked_in(partition);
    let Some(l) = s.load.get_mut(&partition) else {
        return;
    };
    let too_many = parked >= share;
    // A zero budget keeps nothing in memory: only offsets, no memory pause.
    let memory_full = max_bytes > 0 && bytes >= max_bytes && !starving;
    if too_many || memory_full {
        l.backlog_pause = true;
    } else if parked <= share / 2 && (bytes <= max_bytes / 4 * 3 || starving) {
        l.backlog_pause = false;
    }
    let want = l.backlog_pause || pressure;
    if want == l.paused || !s.assigned.contains(&partition) {
        return;
    }
    // Built only to pause or resume: a partition list is two C allocations.
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition(topic, partition);
    let done = if want { c.pause(&tpl) } else { c.resume(&tpl) };
    if done.is_ok() {
        l.paused = want;
        tracing::debug!(
            partition,
            paused = want,
            parked,
            pressure,
            "partition pause changed"
        );
    }
}
