//! The limiter's waits as a histogram kept by the scheduler itself, and published with
//! its snapshot: a turn records one wait, and through the metrics facade each was an
//! atomic push into the exporter's bucket list, an epoch pin and now and then a block
//! allocation, about 2% of the worker's CPU with a thousand campaigns. Here it is one
//! compare loop over 13 bounds and two adds; `GET /metrics` renders the counts. The
//! driver keeps its wake-ups' lateness in one too (a few hundred a second).

/// Bucket bounds, in seconds (a quantum is 10 ms–1 s).
pub const WAIT_BUCKETS: [f64; 13] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
];

/// Counts per bucket (not cumulative; the last counts waits above every bound), their
/// number and their sum.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct WaitHistogram {
    pub counts: [u64; WAIT_BUCKETS.len() + 1],
    pub count: u64,
    pub sum: f64,
}

impl WaitHistogram {
    pub fn record(&mut self, seconds: f64) {
        let i = WAIT_BUCKETS
            .iter()
            .position(|&bound| seconds <= bound)
            .unwrap_or(WAIT_BUCKETS.len());
        self.counts[i] += 1;
        self.count += 1;
        self.sum += seconds;
    }

    /// Waits at or below each bound, then all (`+Inf`), as Prometheus's buckets are.
    pub fn cumulative(&self) -> impl Iterator<Item = (Option<f64>, u64)> + '_ {
        let bounds = WAIT_BUCKETS.iter().map(|&b| Some(b)).chain([None]);
        bounds.zip(self.counts.iter().scan(0u64, |acc, &n| {
            *acc += n;
            Some(*acc)
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waits_land_in_the_first_bucket_that_holds_them() {
        let mut h = WaitHistogram::default();
        for w in [0.0, 0.0005, 0.0006, 0.01, 7.0] {
            h.record(w);
        }
        let c: Vec<(Option<f64>, u64)> = h.cumulative().collect();
        assert_eq!(c[0], (Some(0.0005), 2), "a bound holds its own value");
        assert_eq!(c[1], (Some(0.001), 3));
        assert_eq!(c[4], (Some(0.01), 4));
        assert_eq!(c[12], (Some(5.0), 4));
        assert_eq!(c[13], (None, 5), "+Inf holds every wait");
        assert_eq!(h.count, 5);
        assert!((h.sum - 7.0111).abs() < 1e-9);
    }
}
