//! Cache hints over a round's turns. With a thousand campaigns their state does not stay
//! cached between a slow campaign's turns, and a turn walks a chain of objects (the
//! campaign, its limiter, its queue, the job, the job's bitmaps and cells, the
//! campaign's counter), each a miss waiting on the one before. Knowing the round's
//! campaigns up front, the scheduler asks for each link of every chain in passes, one
//! link per pass, so that the misses of all campaigns overlap instead of queueing one
//! after another inside the turns. The round does this for a batch of turns just before
//! they run (`PREFETCH_BATCH` in due.rs), so that the lines are still cached when used
//! (docs/BENCHMARKS.md has the figures).

use super::*;
use crate::prefetch;

impl Scheduler {
    /// Hints, in passes, what the turns of `slots` will read at `unix_sec`.
    pub(super) fn prefetch_turns(&self, slots: &[u32], unix_sec: u64) {
        let campaign_size = std::mem::size_of::<Option<Campaign>>();
        for &slot in slots {
            if let Some(c) = self.campaigns.get(slot as usize) {
                prefetch::bytes(c, campaign_size);
            }
        }
        for &slot in slots {
            if let Some(c) = self.campaign_ref(slot) {
                prefetch::line(Arc::as_ptr(&c.limiter));
                c.counter.prefetch(unix_sec);
                if let Some(front) = c.queue.as_slices().0.first() {
                    prefetch::line(front);
                }
            }
        }
        let job_size = std::mem::size_of::<Option<ActiveJob>>();
        for &slot in slots {
            if let Some(job) = self.front_job_slot(slot).and_then(|j| self.jobs.get(j)) {
                prefetch::bytes(job, job_size);
            }
        }
        for &slot in slots {
            if let Some(job) = self.front_job(slot) {
                prefetch::line(Arc::as_ptr(&job.dispatched));
                prefetch::line(Arc::as_ptr(&job.job));
                if let Some(word) = job.done.get((job.next / 64) as usize) {
                    prefetch::line(word);
                }
                job.progress.prefetch();
            }
        }
        for &slot in slots {
            if let Some(job) = self.front_job(slot) {
                job.progress.prefetch_word(job.next);
            }
        }
    }

    pub(super) fn campaign_ref(&self, slot: u32) -> Option<&Campaign> {
        self.campaigns.get(slot as usize).and_then(Option::as_ref)
    }

    fn front_job_slot(&self, slot: u32) -> Option<usize> {
        let c = self.campaign_ref(slot)?;
        c.queue.front().map(|&j| j as usize)
    }

    fn front_job(&self, slot: u32) -> Option<&ActiveJob> {
        self.jobs.get(self.front_job_slot(slot)?)?.as_ref()
    }
}
