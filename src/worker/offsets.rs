//! Per-partition offset watermarks for at-least-once delivery.
//!
//! Jobs of different campaigns in one partition finish out of order. A partition's
//! committable offset is the lowest offset not yet finished (or the next offset to read
//! when everything read is finished), so a restart re-reads every unfinished job and no
//! finished job is ever skipped unfinished.

use std::collections::{BTreeSet, HashMap};

/// The watermark of one partition.
#[derive(Debug, Default, Clone)]
pub struct PartitionOffsets {
    /// Offsets read but not finished.
    pending: BTreeSet<i64>,
    /// One past the highest offset read.
    next_to_read: Option<i64>,
    /// The last watermark handed out for commit, to skip needless commits.
    committed: Option<i64>,
}

impl PartitionOffsets {
    /// A message at `offset` was read and its work is under way.
    pub fn started(&mut self, offset: i64) {
        self.pending.insert(offset);
        self.next_to_read = Some(self.next_to_read.map_or(offset + 1, |n| n.max(offset + 1)));
    }

    /// The work of the message at `offset` is finished (delivered, failed for good,
    /// or dead-lettered).
    pub fn finished(&mut self, offset: i64) {
        self.pending.remove(&offset);
    }

    /// The offset to commit: every offset below it is finished.
    pub fn watermark(&self) -> Option<i64> {
        match self.pending.first() {
            Some(&lowest) => Some(lowest),
            None => self.next_to_read,
        }
    }

    /// The watermark, if it moved since the last call that returned one.
    pub fn take_new_watermark(&mut self) -> Option<i64> {
        let w = self.watermark()?;
        if self.committed == Some(w) {
            return None;
        }
        self.committed = Some(w);
        Some(w)
    }

    /// A commit of `offset` failed: hand it out again at the next call (the commit
    /// timer's), unless a later watermark was handed out since.
    pub fn commit_failed(&mut self, offset: i64) {
        if self.committed == Some(offset) {
            self.committed = None;
        }
    }

    pub fn pending(&self) -> usize {
        self.pending.len()
    }
}

/// Watermarks for every assigned partition of one topic.
#[derive(Debug, Default)]
pub struct OffsetTracker {
    partitions: HashMap<i32, PartitionOffsets>,
}

impl OffsetTracker {
    pub fn started(&mut self, partition: i32, offset: i64) {
        self.partitions
            .entry(partition)
            .or_default()
            .started(offset);
    }

    pub fn finished(&mut self, partition: i32, offset: i64) {
        if let Some(p) = self.partitions.get_mut(&partition) {
            p.finished(offset);
        }
    }

    /// Partitions whose watermark moved, with the offset to commit.
    pub fn take_new_watermarks(&mut self) -> Vec<(i32, i64)> {
        let mut out: Vec<(i32, i64)> = self
            .partitions
            .iter_mut()
            .filter_map(|(p, o)| o.take_new_watermark().map(|w| (*p, w)))
            .collect();
        out.sort_unstable();
        out
    }

    /// The current watermark of every partition, moved or not.
    pub fn watermarks(&self) -> Vec<(i32, i64)> {
        let mut out: Vec<(i32, i64)> = self
            .partitions
            .iter()
            .filter_map(|(p, o)| o.watermark().map(|w| (*p, w)))
            .collect();
        out.sort_unstable();
        out
    }

    /// A commit of these watermarks failed: the next [`Self::take_new_watermarks`]
    /// returns them again (without a move of the watermark they would never be retried).
    pub fn commit_failed(&mut self, marks: &[(i32, i64)]) {
        for (p, o) in marks {
            if let Some(po) = self.partitions.get_mut(p) {
                po.commit_failed(*o);
            }
        }
    }

    /// Forgets a revoked partition; its unfinished jobs will be re-read by its next owner.
    pub fn forget(&mut self, partition: i32) {
        self.partitions.remove(&partition);
    }

    pub fn pending(&self, partition: i32) -> usize {
        self.partitions.get(&partition).map_or(0, |p| p.pending())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn out_of_order_finishes_hold_the_watermark() {
        let mut p = PartitionOffsets::default();
        assert_eq!(p.watermark(), None);
        for o in 10..15 {
            p.started(o);
        }
        assert_eq!(p.watermark(), Some(10));
        p.finished(12);
        p.finished(11);
        assert_eq!(p.watermark(), Some(10));
        p.finished(10);
        assert_eq!(p.watermark(), Some(13));
        p.finished(14);
        p.finished(13);
        assert_eq!(p.watermark(), Some(15));
        assert_eq!(p.take_new_watermark(), Some(15));
        assert_eq!(p.take_new_watermark(), None);
    }

    #[test]
    fn a_failed_commit_is_handed_out_again() {
        let mut t = OffsetTracker::default();
        for o in 0..3 {
            t.started(0, o);
            t.finished(0, o);
        }
        assert_eq!(t.take_new_watermarks(), vec![(0, 3)]);
        t.commit_failed(&[(0, 3)]);
        assert_eq!(t.take_new_watermarks(), vec![(0, 3)], "retried");
        assert_eq!(t.take_new_watermarks(), vec![], "once committed, not again");
        // A failure of an older watermark does not hide a newer one handed out since.
        t.started(0, 3);
        t.finished(0, 3);
        assert_eq!(t.take_new_watermarks(), vec![(0, 4)]);
        t.commit_failed(&[(0, 3)]);
        assert_eq!(t.take_new_watermarks(), vec![]);
    }

    proptest! {
        /// Whatever the finishing order, every offset below the watermark is finished.
        #[test]
        fn watermark_never_passes_an_unfinished_offset(order in Just((0i64..60).collect::<Vec<_>>()).prop_shuffle(), cut in 0usize..60) {
            let mut p = PartitionOffsets::default();
            for o in 0..60 { p.started(o); }
            let finished: std::collections::HashSet<i64> = order[..cut].iter().copied().collect();
            for o in &order[..cut] { p.finished(*o); }
            let w = p.watermark().unwrap();
            for o in 0..w { prop_assert!(finished.contains(&o)); }
            prop_assert!(w == 60 || !finished.contains(&w));
        }
    }
}
