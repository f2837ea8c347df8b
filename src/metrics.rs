//! Prometheus metrics: the `metrics` facade's recorder, rendered by
//! metrics-exporter-prometheus (without its own HTTP listener: `GET /metrics` serves it).
//!
//! Who emits what:
//! - the worker, through the facade: `retries_total`,
//!   `dead_letters_total{kind}`, `consumer_lag{partition}`, `stats_flush_seconds`,
//!   `stats_flushes_total`, `stats_flush_statements_total`;
//! - [`sample`] (run by [`spawn_sampler`] and at every scrape), from the worker's
//!   snapshots: `delivered_total`, `active_campaigns`, `buffered_jobs`, `buffered_devices`,
//!   `parked_jobs`, `window_jobs`, `parked_rereads_total`, `paused_partitions`, `halted_campaigns`,
//!   `class_starved_seconds{class}`;
//! - [`render`], straight from the scheduler's snapshot: `sends_total{campaign,outcome}`
//!   and `limiter_wait_seconds` (a histogram the scheduler keeps itself: one wait per
//!   turn is too many for the facade's atomic buckets).
//!
//! Why `sends_total` bypasses the recorder: campaign labels must exist only while the
//! campaign is held by the worker, and metrics-exporter-prometheus 0.18 cannot drop one
//! series; its only removal is an idle timeout per metric *kind*, which would also drop
//! quiet counters such as `retries_total`. Rendering those lines from the snapshot makes
//! an ended campaign's series vanish at the next scrape, and keeps cardinality bounded
//! by `worker.max_active_campaigns` plus the waiting ones.
//!
//! The recorder is process-global and must be installed before the worker starts: the
//! worker takes its metric handles when it is built, and handles taken earlier go
//! nowhere.

use crate::job::PriorityClass;
use crate::worker::consumer::ConsumerStats;
use crate::worker::scheduler::{CampaignLive, SchedulerStats, WaitHistogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::fmt::Write as _;
use std::sync::OnceLock;
use std::time::Duration;
use tokio::sync::watch;

/// Errors installing the recorder.
#[derive(Debug, Clone, thiserror::Error)]
pub enum MetricsError {
    #[error("installing the Prometheus recorder: {0}")]
    Install(String),
}

/// Histogram buckets for a stats flush transaction, in seconds.
const FLUSH_BUCKETS: &[f64] = &[
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];
/// How often the exporter's histogram buffers are folded in.
const UPKEEP_EVERY: Duration = Duration::from_secs(5);

/// Installs the global recorder once per process and returns its handle; later calls
/// return the same handle (or the same error, if another recorder was there first).
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    static HANDLE: OnceLock<Result<PrometheusHandle, MetricsError>> = OnceLock::new();
    HANDLE.get_or_init(install_once).clone()
}

fn install_once() -> Result<PrometheusHandle, MetricsError> {
    let err = |e: metrics_exporter_prometheus::BuildError| MetricsError::Install(e.to_string());
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Full("stats_flush_seconds".into()), FLUSH_BUCKETS)
        .map_err(err)?
        .install_recorder()
        .map_err(err)?;
    describe();
    zero_values();
    let upkeep = handle.clone();
    let spawned = std::thread::Builder::new()
        .name("metrics-upkeep".into())
        .spawn(move || loop {
            std::thread::sleep(UPKEEP_EVERY);
            upkeep.run_upkeep();
        });
    if let Err(e) = spawned {
        // Rendering still works; only histogram memory would grow between scrapes.
        tracing::warn!(error = %e, "cannot start the metrics upkeep thread");
    }
    Ok(handle)
}

/// HELP texts.
fn describe() {
    use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
    describe_counter!(
        "retries_total",
        "Sends retried (429, 5xx, timeouts, connection errors)"
    );
    describe_counter!(
        "dead_letters_total",
        "Messages and devices dead-lettered, by kind"
    );
    describe_gauge!(
        "app_connections_open",
        "HTTP/2 connections open to the apps' providers (apps.max_open_connections caps them)"
    );
    describe_counter!(
        "app_connections_over_cap_total",
        "App connections opened over apps.max_open_connections because every app holding one was sending"
    );
    describe_gauge!(
        "consumer_lag",
        "Messages behind the partition's end, per partition"
    );
    describe_histogram!(
        "stats_flush_seconds",
        Unit::Seconds,
        "Duration of one stats flush transaction"
    );
    describe_gauge!(
        "active_campaigns",
        "Campaigns holding a slot in the scheduler"
    );
    describe_gauge!("buffered_jobs", "Jobs consumed and not yet finished");
    describe_gauge!(
        "buffered_devices",
        "Devices of buffered jobs not yet finished"
    );
    describe_gauge!(
        "parked_jobs",
        "Jobs left in Kafka behind their campaign's lookahead, to be re-read"
    );
    describe_gauge!(
        "window_jobs",
        "Parked jobs waiting for their recipients' local-time window to open"
    );
    describe_gauge!("paused_partitions", "Partitions paused by backpressure");
    metrics::describe_counter!(
        "parked_rereads_total",
        "Parked jobs read from Kafka again when handed over (their message was not kept \
         in memory: past worker.max_parked_bytes)"
    );
    describe_gauge!(
        "halted_campaigns",
        "Campaigns this worker holds that a provider's configuration error halted"
    );
    describe_gauge!(
        CLASS_STARVED,
        Unit::Seconds,
        "The longest a campaign of this priority class has had work but no share under a \
         cap, because higher classes took the cap (0: none waits)"
    );
    metrics::describe_counter!(
        "campaign_halts_total",
        "Campaigns halted by a provider's answer (configuration errors)"
    );
    metrics::describe_counter!(
        "provider_answers_total",
        "Provider answers by provider, class (delivered, dead_token, retry_device, \
         retry_provider, rejected, mismatch, halt) and reason"
    );
    metrics::describe_counter!(
        "delivered_total",
        "Devices delivered since the worker started, all campaigns"
    );
    metrics::describe_counter!(
        "scheduler_rounds_total",
        "Scheduler rounds (wake-ups that visited the due campaigns) since the worker started"
    );
    metrics::describe_counter!(
        "scheduler_turns_total",
        "Campaign turns (one per campaign due in a round) since the worker started"
    );
}

/// Zero values, so that every series exists before its first event.
fn zero_values() {
    metrics::counter!("retries_total").increment(0);
    for kind in [
        crate::store::DeadLetterKind::MalformedJob,
        crate::store::DeadLetterKind::InvalidJob,
        crate::store::DeadLetterKind::Undeliverable,
    ] {
        metrics::counter!("dead_letters_total", "kind" => kind.as_str()).increment(0);
    }
    set_starved(&[0.0; 4]);
    for name in [
        "active_campaigns",
        "buffered_jobs",
        "buffered_devices",
        "parked_jobs",
        "window_jobs",
        "paused_partitions",
        "halted_campaigns",
    ] {
        metrics::gauge!(name).set(0.0);
    }
}

/// Sets the gauges from the worker's snapshots.
pub fn sample(scheduler: &SchedulerStats, consumer: &ConsumerStats) {
    metrics::gauge!("active_campaigns").set(scheduler.active_campaigns as f64);
    metrics::counter!("delivered_total").absolute(scheduler.delivered);
    metrics::counter!("scheduler_rounds_total").absolute(scheduler.rounds);
    metrics::counter!("scheduler_turns_total").absolute(scheduler.turns);
    metrics::gauge!("buffered_jobs").set(consumer.buffered_jobs as f64);
    metrics::gauge!("buffered_devices").set(consumer.buffered_devices as f64);
    metrics::gauge!("parked_jobs").set(consumer.parked_jobs as f64);
    metrics::gauge!("window_jobs").set(consumer.window_jobs as f64);
    metrics::counter!("parked_rereads_total").absolute(consumer.parked_rereads);
    metrics::gauge!("paused_partitions").set(consumer.paused_partitions.len() as f64);
    let halted = scheduler
        .campaigns
        .iter()
        .filter(|c| c.halted.is_some())
        .count();
    metrics::gauge!("halted_campaigns").set(halted as f64);
    set_starved(&starved_by_class(&scheduler.campaigns));
}

/// The gauge of the classes' longest current starvation.
const CLASS_STARVED: &str = "class_starved_seconds";

/// Per class, in [`PriorityClass::ALL`]'s order: the longest `starved_ms` among its
/// campaigns, in seconds (0 when none is starved).
pub fn starved_by_class(campaigns: &[CampaignLive]) -> [f64; 4] {
    let mut out = [0.0_f64; 4];
    for c in campaigns {
        if let Some(ms) = c.starved_ms {
            let slot = &mut out[c.priority.rank()];
            *slot = slot.max(ms as f64 / 1000.0);
        }
    }
    out
}

fn set_starved(by_class: &[f64; 4]) {
    for (class, s) in PriorityClass::ALL.iter().zip(by_class) {
        metrics::gauge!(CLASS_STARVED, "class" => class.as_str()).set(*s);
    }
}

/// How often the background sampler sets the gauges at most. The consumer's snapshot
/// changes up to 200 times a second and each sample counts the halted campaigns: at
/// 1,000 campaigns that was 1 ms of CPU a second (docs/BENCHMARKS.md, ninth session).
/// A scrape samples afresh anyway ([`render`]).
const SAMPLE_EVERY: Duration = Duration::from_millis(250);

/// Samples on the worker's snapshots, at most every [`SAMPLE_EVERY`], until `stop` is
/// cancelled or the worker is gone.
pub fn spawn_sampler(
    mut scheduler: watch::Receiver<SchedulerStats>,
    mut consumer: watch::Receiver<ConsumerStats>,
    stop: tokio_util::sync::CancellationToken,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        loop {
            {
                let s = scheduler.borrow_and_update();
                let c = consumer.borrow_and_update();
                sample(&s, &c);
            }
            tokio::select! {
                _ = tokio::time::sleep(SAMPLE_EVERY) => {}
                _ = stop.cancelled() => return,
            }
            tokio::select! {
                r = scheduler.changed() => if r.is_err() { return },
                r = consumer.changed() => if r.is_err() { return },
                _ = stop.cancelled() => return,
            }
        }
    })
}

/// The exposition text: the recorder's metrics (when installed), then `sends_total` for
/// the campaigns the worker holds (when there is a worker).
pub fn render(
    handle: Option<&PrometheusHandle>,
    worker: Option<(&SchedulerStats, &ConsumerStats)>,
    per_campaign: bool,
) -> String {
    if let Some((s, c)) = worker {
        sample(s, c);
    }
    let mut out = handle.map(PrometheusHandle::render).unwrap_or_default();
    if !out.is_empty() && !out.ends_with('\n') {
        out.push('\n');
    }
    if let Some((s, _)) = worker {
        render_waits(&mut out, LIMITER_WAITS, &s.limiter_waits);
        render_waits(&mut out, WAKE_LATENESS, &s.wake_lateness);
        render_round_seconds(&mut out, s.round_nanos);
    }
    if per_campaign {
        render_sends(&mut out, worker.map(|(s, _)| s));
    }
    out
}

/// A histogram the scheduler keeps itself: (name, help).
type Family = (&'static str, &'static str);

const LIMITER_WAITS: Family = (
    "limiter_wait_seconds",
    "How long a campaign's limiter asked it to wait for its next permit",
);
const WAKE_LATENESS: Family = (
    "scheduler_wake_lateness_seconds",
    "How late the scheduler woke for a timed round (a stalled process shows here)",
);

/// Appends the scheduler's time in rounds, in seconds (the recorder's counters hold
/// integers only).
fn render_round_seconds(out: &mut String, nanos: u64) {
    let name = "scheduler_round_seconds_total";
    let _ = writeln!(
        out,
        "# HELP {name} Time the scheduler spent in its rounds since the worker started"
    );
    let _ = writeln!(out, "# TYPE {name} counter");
    let _ = writeln!(out, "{name} {}", nanos as f64 / 1e9);
}

/// Appends one of the scheduler's own histograms.
fn render_waits(out: &mut String, (name, help): Family, h: &WaitHistogram) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} histogram");
    for (bound, n) in h.cumulative() {
        let _ = write!(out, "{name}_bucket{{le=\"");
        match bound {
            Some(b) => {
                let _ = write!(out, "{b}");
            }
            None => out.push_str("+Inf"),
        }
        let _ = writeln!(out, "\"}} {n}");
    }
    let _ = writeln!(out, "{name}_sum {}", h.sum);
    let _ = writeln!(out, "{name}_count {}", h.count);
}

/// Appends the `sends_total` family: one series per held campaign and outcome.
pub fn render_sends(out: &mut String, scheduler: Option<&SchedulerStats>) {
    out.push_str("# HELP sends_total Sends by campaign and outcome, since the worker took the campaign up (series exist only for campaigns the worker holds)\n");
    out.push_str("# TYPE sends_total counter\n");
    let Some(s) = scheduler else { return };
    for c in s.campaigns.iter() {
        for (outcome, n) in [
            ("sent", c.sent),
            ("failed", c.failed),
            ("invalid", c.invalid),
        ] {
            out.push_str("sends_total{campaign=\"");
            escape_label(out, &c.id);
            let _ = writeln!(out, "\",outcome=\"{outcome}\"}} {n}");
        }
    }
}

/// Escapes a label value as the text format requires: `\`, `"` and newlines.
fn escape_label(out: &mut String, value: &str) {
    for ch in value.chars() {
        match ch {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::Algorithm;
    use std::sync::Arc;

    fn live(id: &str, sent: u64, failed: u64) -> CampaignLive {
        CampaignLive {
            id: Arc::from(id),
            rate: 10.0,
            effective_rate: 10.0,
            weight: 1.0,
            algorithm: Algorithm::Gcra,
            paused: false,
            halted: None,
            active: true,
            sent,
            failed,
            retried: 0,
            invalid: 0,
            in_flight: 0,
            open_jobs: 1,
            expired: 0,
            cancelled: 0,
            held_devices: 0,
            total_devices: None,
            waiting_start: false,
            waiting_for_app: None,
            app_id: None,
            priority: PriorityClass::Normal,
            ramp: None,
            starved_ms: None,
            finish_by_ms: None,
            zones: Vec::new(),
        }
    }

    #[test]
    fn starvation_is_the_longest_wait_of_each_class() {
        let starved = |id: &str, class: PriorityClass, ms: Option<u64>| CampaignLive {
            priority: class,
            starved_ms: ms,
            ..live(id, 0, 0)
        };
        assert_eq!(starved_by_class(&[]), [0.0; 4]);
        let list = [
            starved("crit", PriorityClass::Critical, None),
            starved("b1", PriorityClass::Bulk, Some(1_500)),
            starved("b2", PriorityClass::Bulk, Some(42_250)),
            starved("b3", PriorityClass::Bulk, None),
            starved("n1", PriorityClass::Normal, Some(0)),
            starved("h1", PriorityClass::High, Some(700)),
        ];
        assert_eq!(starved_by_class(&list), [0.0, 0.7, 0.0, 42.25]);
    }

    #[test]
    fn limiter_waits_render_as_a_cumulative_histogram() {
        let mut h = WaitHistogram::default();
        h.record(0.0002);
        h.record(0.02);
        h.record(9.0);
        let mut out = String::new();
        render_waits(&mut out, LIMITER_WAITS, &h);
        assert!(out.contains("# TYPE limiter_wait_seconds histogram\n"));
        assert!(
            out.contains("limiter_wait_seconds_bucket{le=\"0.0005\"} 1\n"),
            "{out}"
        );
        assert!(
            out.contains("limiter_wait_seconds_bucket{le=\"0.025\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("limiter_wait_seconds_bucket{le=\"5\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("limiter_wait_seconds_bucket{le=\"+Inf\"} 3\n"),
            "{out}"
        );
        assert!(out.contains("limiter_wait_seconds_count 3\n"));
        assert!(out.contains("limiter_wait_seconds_sum 9.0202\n"), "{out}");
    }

    #[test]
    fn sends_follow_the_held_campaigns_and_escape_labels() {
        let mut stats = SchedulerStats {
            campaigns: Arc::new(vec![live("a", 5, 1), live("we\"ird\\id\n", 2, 0)]),
            ..SchedulerStats::default()
        };
        let mut out = String::new();
        render_sends(&mut out, Some(&stats));
        assert!(out.contains("sends_total{campaign=\"a\",outcome=\"sent\"} 5\n"));
        assert!(out.contains("sends_total{campaign=\"a\",outcome=\"failed\"} 1\n"));
        assert!(out.contains("sends_total{campaign=\"we\\\"ird\\\\id\\n\",outcome=\"sent\"} 2\n"));
        // The campaign ended: its series are gone.
        stats.campaigns = Arc::new(vec![live("we\"ird\\id\n", 3, 0)]);
        let mut out = String::new();
        render_sends(&mut out, Some(&stats));
        assert!(!out.contains("campaign=\"a\""), "{out}");
        assert!(out.contains("# TYPE sends_total counter\n"));
    }
}
