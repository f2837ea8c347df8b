//! [`ProcessRun`]: `pushpace run` workers in one group on a fresh topic, settled before
//! anything is measured.

use super::*;
/// Worker processes, killed if the test fails before stopping them.
pub(super) struct Children(pub(super) Vec<std::process::Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for c in &mut self.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// How long a push released at the end of a second may still be on its way to the sink
/// when that second is read: far above the loopback's latency, which stalls of the shared
/// cores stretch to tens of ms.
const IN_TRANSIT: Duration = Duration::from_millis(300);

/// A campaign's requests per unix second of their release by a worker (the
/// `x-pushpace-sent-at` stamp). The process tests count these: pushpace's own release
/// times, which arrival at the sink blurs, since the workers, the sink, tansu and
/// PostgreSQL share two cores (a stall near a second's boundary moved arrivals into the
/// next second: 1,948 then 2,043 at 2,000/s, 3,991 in the two).
pub(super) fn released(
    sink: &pushpace::tools::sink::SinkHandle,
    campaign: &str,
) -> std::collections::BTreeMap<u64, u64> {
    sink.released_per_second(campaign)
}

/// The unix second `IN_TRANSIT` ago: the seconds before it are whole at the sink.
pub(super) fn settled_unix_now() -> u64 {
    (std::time::SystemTime::now() - IN_TRANSIT)
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs()
}

/// A campaign's releases in each of the unix `seconds`, zero where it sent nothing.
pub(super) fn released_in(
    sink: &pushpace::tools::sink::SinkHandle,
    campaign: &str,
    seconds: std::ops::RangeInclusive<u64>,
) -> Vec<u64> {
    let counts = released(sink, campaign);
    seconds
        .map(|s| counts.get(&s).copied().unwrap_or(0))
        .collect()
}

/// A campaign's releases in the whole unix seconds within the next `span`.
pub(super) async fn whole_seconds(
    sink: &pushpace::tools::sink::SinkHandle,
    campaign: &str,
    span: Duration,
) -> Vec<u64> {
    let first = unix_now() + 1;
    tokio::time::sleep(span + Duration::from_millis(1100)).await;
    let last = unix_now() - 1;
    tokio::time::sleep(IN_TRANSIT).await;
    released_in(sink, campaign, first..=last)
}

/// `pushpace run` workers in one group, scope redis, on a fresh 6-partition topic whose
/// jobs are spread round-robin, sending to a sink of the test's own.
pub(super) struct ProcessRun {
    pub(super) sink: pushpace::tools::sink::SinkHandle,
    pub(super) campaigns: Vec<(String, f64)>,
    pub(super) total: u64,
    /// What was produced, for [`ProcessRun::settle`]'s top-ups (each adds to it).
    pub(super) plan: ProducePlan,
    pub(super) topic: String,
    pub(super) workers: Children,
    /// Each worker's log, where it reports the partitions it is assigned and revoked.
    pub(super) logs: Vec<std::path::PathBuf>,
}

pub(super) async fn start_workers(
    campaigns: &[(f64, usize)],
    workers: usize,
    redis_url: Option<String>,
) -> ProcessRun {
    let (_pool, db_url) = fresh_database().await;
    let topic = unique_name("jobs");
    pushpace::broker::ensure_topic(&crate::helpers::kafka(), &brokers(), &topic, 6)
        .await
        .unwrap();
    let sink = Sink::start(SinkConfig::default()).await.unwrap();
    let run_id = unique_name("dist").replace('_', "-");
    let plan = ProducePlan::with_rates(&run_id, campaigns, 250, None).unwrap();
    produce_spread(&topic, &plan, 6).await;
    let group = unique_name("g");
    let prefix = unique_name("pp");
    let redis_url = redis_url.unwrap_or_else(|| format!("redis://{REDIS}"));
    let env = [
        ("PUSHPACE__LIMITER__SCOPE", "redis"),
        ("PUSHPACE__LIMITER__WORKERS_ESTIMATE", "3"),
        ("PUSHPACE__REDIS__KEY_PREFIX", prefix.as_str()),
        ("PUSHPACE__REDIS__URL", redis_url.as_str()),
        ("PUSHPACE__REDIS__CONNECT_TIMEOUT_MS", "500"),
        ("PUSHPACE__KAFKA__ISOLATION_LEVEL", "read_uncommitted"),
        ("PUSHPACE__SENDER__MAX_IN_FLIGHT", "64"),
    ];
    let children = (0..workers)
        .map(|i| {
            spawn_logged(
                &topic,
                &group,
                &db_url,
                &sink.url(),
                &env,
                &format!("{prefix}-{i}"),
            )
        })
        .collect();
    ProcessRun {
        campaigns: plan
            .campaigns
            .iter()
            .map(|c| (c.id.clone(), c.send_rate.as_f64()))
            .collect(),
        total: plan.total_devices() as u64,
        plan,
        topic,
        sink,
        workers: Children(children),
        logs: (0..workers)
            .map(|i| worker_log(&format!("{prefix}-{i}")))
            .collect(),
    }
}

/// Whole seconds in a row within ±2% before a run counts as settled. tansu rebalances a
/// few times while members join, a heartbeat or a few apart; three seconds could fall
/// between two rebalances, and then the next measurement saw one (a whole-suite run read
/// 1,627–2,001 in its 6 s check). Six outlast that rhythm.
const SETTLED_SECONDS: u64 = 6;

/// How long each step of [`ProcessRun::settle`] may take: sending to start and the
/// partitions to stop moving (together), then the rate to hold within ±2%. A run whose
/// rate does not settle within this fails: its rates would measure the broker's
/// rebalancing, not pushpace.
pub(super) const SETTLE_LIMIT: Duration = Duration::from_secs(60);

/// Devices each campaign keeps unsent while the group settles (topped up to twice this
/// when fewer are left, so top-ups are few), so that a long settling never ends a
/// campaign: a top-up of 40 s at 2,000/s is 320 jobs, produced and read within seconds.
const SETTLING_AHEAD: Duration = Duration::from_secs(20);

/// Watches on a settled group before [`ProcessRun::watch_settled`] gives up: a group that
/// moves during three watches in a row, each after 6 settled seconds, is not settling,
/// and the test says so.
const WATCH_TRIES: usize = 3;

impl ProcessRun {
    /// Waits for sending to start and the group to settle (tansu may rebalance a few
    /// times while members join); returns how long that took. Fails the test when the
    /// group does not settle within [`SETTLE_LIMIT`] per step.
    pub(super) async fn settle(&mut self, ahead: Duration) -> Duration {
        let t = Instant::now();
        let end = t + SETTLE_LIMIT;
        while self.sink.summary().delivered < 1000 {
            assert!(
                Instant::now() < end,
                "the workers sent {} devices within {SETTLE_LIMIT:?}, not 1000; logs {:?}",
                self.sink.summary().delivered,
                self.logs
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The group settles in steps (a member joining late, tansu rebalancing again):
        // wait until every worker owns partitions, all six are owned, and nothing has
        // moved for 6 s (six heartbeats, two of tansu's 3 s join pauses). Partitions may still move at
        // the limit (cooperative moves need not disturb the rate): the rate check decides.
        let mut last = Vec::new();
        let mut unchanged_since = Instant::now();
        while Instant::now() < end {
            let owned = owned_partitions(&self.logs);
            if owned != last {
                last = owned;
                unchanged_since = Instant::now();
            }
            self.top_up(SETTLING_AHEAD, 2 * SETTLING_AHEAD).await;
            let all: usize = last.iter().map(|o| o.len()).sum();
            let union: std::collections::BTreeSet<i32> = last.iter().flatten().copied().collect();
            if last.iter().all(|o| !o.is_empty())
                && all == 6
                && union.len() == 6
                && unchanged_since.elapsed() >= Duration::from_secs(6)
            {
                break;
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        assert!(
            self.stable_within(SETTLE_LIMIT).await.is_some(),
            "the consumer group did not settle: no {SETTLED_SECONDS} whole seconds in a row \
             within ±2% of every campaign's rate within {SETTLE_LIMIT:?} (partitions owned: \
             {:?}; logs {:?}; the last seconds at the sink:\n{})",
            owned_partitions(&self.logs),
            self.logs,
            self.last_seconds(12)
        );
        let took = t.elapsed();
        self.top_up(ahead, ahead).await;
        took
    }

    /// Waits out `span` plus the second it starts in, and returns the whole unix seconds
    /// it covered, on a group that did not move meanwhile. tansu now and then rebalances
    /// a settled group (one whole-suite run: partitions 0 and 3 revoked 44 s after
    /// settling, one campaign's second 40 of 50); a watch across such a move measures the
    /// broker, not pushpace, and the recovery tests measure moves on their own. So when
    /// the workers logged an assignment or a revocation during the watch, the group must
    /// settle again and the watch is repeated, at most [`WATCH_TRIES`] times.
    pub(super) async fn watch_settled(&mut self, span: Duration) -> std::ops::RangeInclusive<u64> {
        for attempt in 1..=WATCH_TRIES {
            let moves = group_moves(&self.logs);
            let first = unix_now() + 1;
            tokio::time::sleep(span + Duration::from_millis(1100)).await;
            let last = unix_now() - 1;
            tokio::time::sleep(IN_TRANSIT).await;
            if group_moves(&self.logs) == moves {
                return first..=last;
            }
            eprintln!(
                "the group moved during watch {attempt} (partitions owned now: {:?}); settling again",
                owned_partitions(&self.logs)
            );
            assert!(
                self.stable_within(SETTLE_LIMIT).await.is_some(),
                "the group did not settle again within {SETTLE_LIMIT:?} after moving during \
                 a watch; the last seconds at the sink:\n{}",
                self.last_seconds(12)
            );
            self.top_up(span + SETTLING_AHEAD, span + SETTLING_AHEAD)
                .await;
        }
        panic!("the group moved during each of {WATCH_TRIES} watches of {span:?}");
    }

    /// A campaign's releases in each of the unix `seconds`.
    pub(super) fn seconds_in(
        &self,
        campaign: &str,
        seconds: std::ops::RangeInclusive<u64>,
    ) -> Vec<u64> {
        released_in(&self.sink, campaign, seconds)
    }

    /// Produces more devices (for `up_to` seconds) for each campaign that has fewer than
    /// `ahead` of its seconds left unsent, so that what the test watches after settling is never the
    /// end of its devices: settling has taken from 10 s to over 90 s (a whole-suite
    /// run: 95 s, after which a 100 s campaign ran dry in the watch). New devices join
    /// the end of the partitions; the campaigns still hold devices while they arrive.
    pub(super) async fn top_up(&mut self, ahead: Duration, up_to: Duration) {
        let sink = &self.sink;
        let sent = |id: &str| sink.campaign(id).map_or(0, |c| c.distinct_delivered);
        let plan = &mut self.plan;
        let Some(more) = crate::helpers::top_up_plan(plan, (ahead, up_to), sent) else {
            return;
        };
        eprintln!(
            "topped up for {ahead:?} ahead: {:?}",
            more.campaigns.iter().map(|c| c.devices).collect::<Vec<_>>()
        );
        produce_spread(&self.topic, &more, 6).await;
        self.total += more.total_devices() as u64;
    }

    /// Each campaign's rate and its last `n` whole seconds released, oldest first.
    pub(super) fn last_seconds(&self, n: u64) -> String {
        let now = settled_unix_now();
        let mut out = String::new();
        for (id, rate) in &self.campaigns {
            let secs = self.seconds_in(id, now - n..=now - 1);
            out.push_str(&format!("{rate}/s: {secs:?}\n"));
        }
        out
    }

    /// Waits until [`SETTLED_SECONDS`] whole seconds in a row carry the summed rate, and
    /// each campaign's own, within ±2% (+1: one send late, the next on time); returns how long that
    /// took, or `None` after `limit`.
    pub(super) async fn stable_within(&mut self, limit: Duration) -> Option<Duration> {
        const N: usize = SETTLED_SECONDS as usize;
        let t = Instant::now();
        let since = unix_now();
        let target: f64 = self.campaigns.iter().map(|(_, r)| r).sum();
        while t.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(250)).await;
            self.top_up(SETTLING_AHEAD, 2 * SETTLING_AHEAD).await;
            let now = settled_unix_now();
            if now < since + SETTLED_SECONDS + 1 {
                continue; // whole seconds after the call
            }
            let in_band =
                |n: u64, rate: f64| (0.98 * rate - 1.0..=1.02 * rate + 1.0).contains(&(n as f64));
            let mut sums = [0u64; N];
            let mut each_in_band = true;
            for (id, rate) in &self.campaigns {
                let own = self.seconds_in(id, now - SETTLED_SECONDS..=now - 1);
                each_in_band &= own.iter().all(|&n| in_band(n, *rate));
                for (sum, n) in sums.iter_mut().zip(own) {
                    *sum += n;
                }
            }
            if each_in_band
                && sums
                    .iter()
                    .all(|&n| (0.98 * target..=1.02 * target + 1.0).contains(&(n as f64)))
            {
                return Some(t.elapsed());
            }
        }
        None
    }

    /// The whole seconds of the `watch` after `event` (unix seconds), summed over the
    /// campaigns, and when the rate was back: the start of the first three seconds in a
    /// row within ±2% of the target, and the start of the last run of in-band seconds
    /// that lasts to the end of the watch ("for good"), both in seconds after `event`.
    pub(super) async fn recovery(&self, event: f64, watch: Duration) -> Recovery {
        let first = event.floor() as u64 + 1;
        let last = first + watch.as_secs() - 1;
        while unix_now() <= last + 1 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let target: f64 = self.campaigns.iter().map(|(_, r)| r).sum();
        let mut seconds = vec![0u64; (last - first + 1) as usize];
        for (id, _) in &self.campaigns {
            for (sum, n) in seconds.iter_mut().zip(self.seconds_in(id, first..=last)) {
                *sum += n;
            }
        }
        let in_band = |n: u64| (0.98 * target..=1.02 * target + 1.0).contains(&(n as f64));
        let at = |i: usize| (first + i as u64) as f64 - event;
        let back_at = seconds
            .windows(3)
            .position(|w| w.iter().all(|&n| in_band(n)));
        let back = back_at.map(at);
        let for_good = match seconds.iter().rposition(|&n| !in_band(n)) {
            None => Some(at(0)),
            Some(i) if i + 1 < seconds.len() => Some(at(i + 1)),
            Some(_) => None,
        };
        // From the return to the end of the watch.
        let after = &seconds[back_at.unwrap_or(seconds.len())..];
        let mean_after = after.iter().sum::<u64>() as f64 / after.len().max(1) as f64;
        Recovery {
            back,
            for_good,
            mean_after,
            seconds,
        }
    }

    /// [`Self::finish`], and the seconds within bounds over the watch, once the group
    /// has settled (unix seconds `from`..`to`). The start-up, while tansu still moves
    /// partitions, and the wind-down are left out: runs saw 2,053–2,063 at the sink there
    /// while no watched second passed 2,007.
    ///
    /// Counted on release, no second holds more than the ±2% band. Counted on arrival, a
    /// stall near a second's boundary moves sends into the next second (1,954 then 2,045
    /// in one run, 3,999 in the two): a shift leaves the sum of two adjacent seconds
    /// alone, an excess does not, so each pair is held to twice the band.
    pub(super) async fn finish_checked(self, from: f64, to: f64) {
        let id = self.campaigns[0].0.clone();
        let watched = from.ceil() as u64..=to.floor() as u64 - 1;
        let released_watched = self.seconds_in(&id, watched.clone());
        let max_released = released_watched.iter().copied().max().unwrap_or(0);
        let at_sink = self.sink.per_second(&id);
        let arrived: Vec<u64> = watched
            .clone()
            .map(|second| {
                at_sink
                    .iter()
                    .find(|s| s.unix_second == second)
                    .map_or(0, |s| s.requests)
            })
            .collect();
        let max_pair = arrived.windows(2).map(|w| w[0] + w[1]).max().unwrap_or(0);
        let max_all = released(&self.sink, &id).into_values().max().unwrap_or(0);
        let duplicates = self.finish().await;
        eprintln!(
            "largest second released: {max_released} from the settled group to the end of \
             the watch ({max_all} in the whole run); at the sink, largest two in a row \
             {max_pair}; duplicates {duplicates}"
        );
        // The ±2% band at 2,000/s: the limiter's promise (+1: one send late, the next on
        // time) within the project's ±2%.
        const BAND: u64 = 2_041;
        assert!(
            max_released <= BAND,
            "largest second released {max_released}"
        );
        // Both series in the message: a pair over the band is a shift across two
        // boundaries when the released seconds beside it are short.
        assert!(
            max_pair <= 2 * BAND,
            "largest two seconds at the sink {max_pair}; at the sink {arrived:?}, \
             released {released_watched:?}"
        );
    }

    /// Waits until every device arrived (or 120 s), stops the workers, checks nothing
    /// was lost, and returns the duplicates.
    pub(super) async fn finish(mut self) -> u64 {
        let end = Instant::now() + Duration::from_secs(120);
        while self.sink.summary().distinct_delivered < self.total && Instant::now() < end {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for c in &mut self.workers.0 {
            if matches!(c.try_wait(), Ok(None)) {
                let status = crate::helpers::sigterm_and_wait(c);
                assert!(status.success(), "{status}");
            }
        }
        let s = self.sink.summary();
        assert_eq!(s.distinct_delivered, self.total, "no device lost");
        s.duplicates
    }
}

/// The goal: after a worker leaves or dies, the rate is back within ±2% within
/// 10 s. Met with cooperative (incremental) rebalancing, the default
/// `kafka.assignment_strategy`: only the moving partitions are revoked. With eager
/// rebalancing tansu could revoke every partition at each heartbeat for 10–20 s after a
/// member left (15.9 s in one whole-suite run; docs/BENCHMARKS.md).
pub(super) const RECOVERY: f64 = 10.0;
/// What [`ProcessRun::recovery`] saw.
#[derive(Debug)]
pub(super) struct Recovery {
    pub(super) back: Option<f64>,
    pub(super) for_good: Option<f64>,
    /// The mean second from `back` to the end of the watch.
    pub(super) mean_after: f64,
    pub(super) seconds: Vec<u64>,
}

impl Recovery {
    /// Back within ±2% (three whole seconds in a row) within the 10 s
    /// ([`RECOVERY`]); the group settled before the event (see [`ProcessRun::settle`]).
    /// "For good" is printed only.
    pub(super) fn check(&self, what: &str) {
        let goal = match self.back {
            Some(b) if b <= RECOVERY => "within",
            _ => "NOT within",
        };
        eprintln!(
            "after {what}: back within ±2% after {:?} s ({goal} the {RECOVERY} s goal; three whole seconds in a row), for good after {:?} s, mean from then {:.1}/s; seconds {:?}",
            self.back, self.for_good, self.mean_after, self.seconds
        );
        assert!(
            self.back.is_some_and(|b| b <= RECOVERY),
            "{what}: rate not back within ±2% within {RECOVERY} s: {self:?}"
        );
    }
}
