//! [`CampaignSnapshot`]: every campaign by id, in shards shared between snapshots.

use crate::store::campaigns::Campaign;
use std::collections::HashMap;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::Arc;

/// Shards of a [`CampaignSnapshot`]: a change copies about 1/SHARDS of the campaigns.
const SHARDS: usize = 256;

type Shard = Arc<HashMap<Arc<str>, Arc<Campaign>>>;

/// Every campaign by id, as last read. Cloning is cheap (the shards are shared).
#[derive(Clone)]
pub struct CampaignSnapshot {
    shards: Arc<[Shard]>,
    len: usize,
}

impl Default for CampaignSnapshot {
    fn default() -> Self {
        Self {
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            len: 0,
        }
    }
}

impl std::fmt::Debug for CampaignSnapshot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CampaignSnapshot")
            .field("len", &self.len)
            .finish_non_exhaustive()
    }
}

fn shard_of(id: &str) -> usize {
    // SipHash with fixed keys: the same id always lands in the same shard.
    let mut hasher = DefaultHasher::new();
    id.hash(&mut hasher);
    (hasher.finish() % SHARDS as u64) as usize
}

impl CampaignSnapshot {
    pub fn get(&self, id: &str) -> Option<&Campaign> {
        self.shards[shard_of(id)].get(id).map(|c| &**c)
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Every campaign, in no particular order.
    pub fn iter(&self) -> impl Iterator<Item = &Campaign> + '_ {
        self.shards.iter().flat_map(|s| s.values().map(|c| &**c))
    }

    /// The campaigns of the shards that differ from `earlier`'s (all of them when it is
    /// `None`): every campaign created or changed since, and some others. Unchanged
    /// shards are skipped by pointer, so this costs the changed shards, not the whole map.
    pub fn changed_since<'a>(
        &'a self,
        earlier: Option<&'a CampaignSnapshot>,
    ) -> impl Iterator<Item = &'a Campaign> + 'a {
        self.shards
            .iter()
            .enumerate()
            .filter(move |(i, shard)| {
                earlier.is_none_or(|e| e.shards.get(*i).is_none_or(|old| !Arc::ptr_eq(shard, old)))
            })
            .flat_map(|(_, s)| s.values().map(|c| &**c))
    }

    /// This snapshot with `changed` set and `removed` gone; only the shards they fall in
    /// are copied (each once).
    pub(super) fn with_changes(&self, changed: Vec<Campaign>, removed: &[String]) -> Self {
        let mut shards: Vec<Shard> = self.shards.to_vec();
        let mut len = self.len;
        for c in changed {
            let shard = Arc::make_mut(&mut shards[shard_of(&c.id)]);
            if shard
                .insert(Arc::from(c.id.as_str()), Arc::new(c))
                .is_none()
            {
                len += 1;
            }
        }
        for id in removed {
            if Arc::make_mut(&mut shards[shard_of(id)])
                .remove(id.as_str())
                .is_some()
            {
                len -= 1;
            }
        }
        Self {
            shards: shards.into(),
            len,
        }
    }

    /// A snapshot of exactly `all`, sharing this one's shards where they are unchanged.
    pub(super) fn replaced(&self, all: Vec<Campaign>) -> Self {
        let len = all.len();
        let mut fresh: Vec<HashMap<Arc<str>, Arc<Campaign>>> =
            (0..SHARDS).map(|_| HashMap::new()).collect();
        for c in all {
            fresh[shard_of(&c.id)].insert(Arc::from(c.id.as_str()), Arc::new(c));
        }
        let shards = fresh
            .into_iter()
            .zip(self.shards.iter())
            .map(|(new, old)| {
                if **old == new {
                    old.clone()
                } else {
                    Arc::new(new)
                }
            })
            .collect();
        Self { shards, len }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;
    use crate::store::CampaignStatus;
    use chrono::DateTime;
    use std::collections::HashSet;

    fn campaign(id: &str, send_rate: f64) -> Campaign {
        let at = DateTime::from_timestamp(1_800_000_000, 0).unwrap_or_default();
        Campaign {
            id: id.to_string(),
            send_rate,
            algorithm: Algorithm::Gcra,
            burst: 0,
            status: CampaignStatus::Active,
            limiter_scope: None,
            halt_reason: None,
            halted_at: None,
            weight: 1.0,
            start_at: None,
            expires_at: None,
            priority: Default::default(),
            ramp_up_s: None,
            ramp_from: None,
            finish_by: None,
            local: Default::default(),
            created_at: at,
            updated_at: at,
        }
    }

    fn many(n: usize) -> Vec<Campaign> {
        (0..n).map(|i| campaign(&format!("c{i}"), 10.0)).collect()
    }

    #[test]
    fn a_change_copies_one_shard_and_readers_see_only_that_shard() {
        let base = CampaignSnapshot::default().replaced(many(10_000));
        assert_eq!(base.len(), 10_000);
        let next = base.with_changes(vec![campaign("c42", 99.0), campaign("new", 1.0)], &[]);
        assert_eq!(next.len(), 10_001);
        assert_eq!(next.get("c42").map(|c| c.send_rate), Some(99.0));
        assert_eq!(base.get("c42").map(|c| c.send_rate), Some(10.0));
        let shared = (0..SHARDS)
            .filter(|&i| Arc::ptr_eq(&base.shards[i], &next.shards[i]))
            .count();
        let touched: HashSet<usize> = ["c42", "new"].iter().map(|id| shard_of(id)).collect();
        assert_eq!(shared, SHARDS - touched.len());
        let seen: Vec<&str> = next
            .changed_since(Some(&base))
            .map(|c| c.id.as_str())
            .collect();
        assert!(seen.contains(&"c42") && seen.contains(&"new"));
        // The two shards' campaigns, not the whole map.
        assert!(seen.len() < 10_000 * 4 / SHARDS, "{}", seen.len());
        assert_eq!(next.changed_since(None).count(), 10_001);
        assert_eq!(next.changed_since(Some(&next)).count(), 0);

        let removed = next.with_changes(Vec::new(), &["new".to_string(), "absent".to_string()]);
        assert_eq!(removed.len(), 10_000);
        assert!(removed.get("new").is_none());
    }

    #[test]
    fn a_full_read_keeps_the_unchanged_shards() {
        let base = CampaignSnapshot::default().replaced(many(1_000));
        let mut fresh = many(1_000);
        fresh[7].send_rate = 5.0;
        fresh.pop();
        let next = base.replaced(fresh);
        assert_eq!(next.len(), 999);
        assert_eq!(next.get("c7").map(|c| c.send_rate), Some(5.0));
        assert!(next.get("c999").is_none());
        let changed: HashSet<usize> = ["c7", "c999"].iter().map(|id| shard_of(id)).collect();
        for i in 0..SHARDS {
            assert_eq!(
                Arc::ptr_eq(&base.shards[i], &next.shards[i]),
                !changed.contains(&i),
                "shard {i}"
            );
        }
    }
}
