//! `/healthz`, `/readyz` (the broker, PostgreSQL, the applied migrations and the
//! consumer thread, checked at once; the first three at most once a second,
//! [`ReadyCache`]) and the Prometheus `/metrics`.

use crate::api::AppState;
use crate::limiter::{Clock, Nanos};
use crate::store::MIGRATOR;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use rdkafka::consumer::{BaseConsumer, Consumer};
use sqlx::postgres::PgPoolOptions;
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration as StdDuration;

pub async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// One readiness check's result.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Check {
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, serde::Serialize)]
pub struct Checks {
    pub broker: Check,
    pub postgres: Check,
    pub migrations: Check,
    /// The worker's Kafka consumer thread (absent when no worker runs in-process).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumer: Option<Check>,
}

#[derive(Debug, serde::Serialize)]
pub struct Readiness {
    pub ready: bool,
    pub checks: Checks,
}

pub async fn readyz(State(state): State<AppState>) -> (StatusCode, Json<Readiness>) {
    let (broker, postgres, migrations) = state.readiness().checks().await;
    let consumer = state.worker().map(|w| {
        let held = w.consumer.borrow().undecodable.clone();
        if !held.is_empty() {
            // A partition held at a batch it cannot decode (docs/RELIABILITY.md).
            let reasons: Vec<String> = held.iter().map(|h| h.to_string()).collect();
            fail(reasons.join("; "))
        } else if *w.consumer_running.borrow() {
            Check {
                ok: true,
                detail: "running".into(),
            }
        } else {
            Check {
                ok: false,
                detail: "the Kafka consumer thread has stopped".into(),
            }
        }
    });
    let ready = broker.ok && postgres.ok && migrations.ok && consumer.as_ref().is_none_or(|c| c.ok);
    let status = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    let checks = Checks {
        broker,
        postgres,
        migrations,
        consumer,
    };
    (status, Json(Readiness { ready, checks }))
}

/// How long one answer of the broker, PostgreSQL and migration checks serves: `/readyz`
/// is unauthenticated, so a flood of requests costs one check a second.
pub const READY_CACHE: StdDuration = StdDuration::from_secs(1);

/// The broker, PostgreSQL and migration checks behind `/readyz`: run at most once per
/// [`READY_CACHE`] (requests meanwhile share the answer, or wait for the one check
/// under way), over a connection of their own (never the worker's pool) and one
/// metadata client kept for the process (not a client per request).
pub struct ReadyCache {
    clock: Arc<dyn Clock>,
    /// One connection, opened when first needed.
    pool: PgPool,
    kafka: crate::config::KafkaSettings,
    bootstrap: String,
    broker_timeout: StdDuration,
    client: parking_lot::Mutex<Option<Arc<BaseConsumer<ReadyContext>>>>,
    last: tokio::sync::Mutex<Option<(Nanos, [Check; 3])>>,
    runs: AtomicU64,
}

impl ReadyCache {
    /// `pool`: the worker's, whose connect options (not connections) are used.
    pub fn new(
        clock: Arc<dyn Clock>,
        pool: &PgPool,
        kafka: crate::config::KafkaSettings,
        bootstrap: String,
        broker_timeout: StdDuration,
    ) -> Self {
        let own = PgPoolOptions::new()
            .max_connections(1)
            .acquire_timeout(CHECK_TIMEOUT)
            .connect_lazy_with((*pool.connect_options()).clone());
        Self {
            clock,
            pool: own,
            kafka,
            bootstrap,
            broker_timeout,
            client: parking_lot::Mutex::new(None),
            last: tokio::sync::Mutex::new(None),
            runs: AtomicU64::new(0),
        }
    }

    /// How many times the checks ran.
    #[cfg(test)]
    fn runs(&self) -> u64 {
        self.runs.load(Ordering::Relaxed)
    }

    /// The checks' answer: cached for [`READY_CACHE`] of the clock.
    pub async fn checks(&self) -> (Check, Check, Check) {
        let mut last = self.last.lock().await;
        let now = self.clock.now();
        let fresh = last
            .as_ref()
            .is_some_and(|(at, _)| now.saturating_sub(*at) < READY_CACHE.as_nanos() as Nanos);
        if !fresh {
            self.runs.fetch_add(1, Ordering::Relaxed);
            let (b, p, m) = tokio::join!(
                self.check_broker(),
                check_postgres(&self.pool),
                check_migrations(&self.pool)
            );
            *last = Some((now, [b, p, m]));
        }
        let [b, p, m] = &last.as_ref().expect("filled above").1;
        (b.clone(), p.clone(), m.clone())
    }

    /// The one metadata client, built on first use.
    fn client(&self) -> Result<Arc<BaseConsumer<ReadyContext>>, String> {
        let mut slot = self.client.lock();
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let c: BaseConsumer<ReadyContext> =
            crate::broker::client_config(&self.kafka, &self.bootstrap)
                .create_with_context(ReadyContext::default())
                .map_err(|e| e.to_string())?;
        let c = Arc::new(c);
        *slot = Some(c.clone());
        Ok(c)
    }

    async fn check_broker(&self) -> Check {
        let client = match self.client() {
            Ok(c) => c,
            Err(e) => return fail(e),
        };
        let timeout = self.broker_timeout;
        // librdkafka's metadata call blocks its thread.
        let ping =
            tokio::task::spawn_blocking(move || match client.fetch_metadata(None, timeout) {
                Ok(md) => {
                    // An error of a connection that has since recovered is no cause.
                    let _ = client.context().take();
                    Ok(md.brokers().len())
                }
                Err(e) => {
                    // Error events (authentication, TLS) reach the context only when polled.
                    for _ in 0..64 {
                        let _ = client.poll(StdDuration::ZERO);
                    }
                    Err(client.context().take().unwrap_or_else(|| e.to_string()))
                }
            });
        match tokio::time::timeout(timeout + StdDuration::from_secs(1), ping).await {
            Ok(Ok(Ok(n))) => Check {
                ok: true,
                detail: format!("{n} broker(s) answered"),
            },
            Ok(Ok(Err(cause))) => fail(format!(
                "cannot reach the Kafka brokers at {}: {cause}",
                self.bootstrap
            )),
            Ok(Err(e)) => fail(format!("ping task failed: {e}")),
            Err(_) => fail(format!("no answer within {} ms", timeout.as_millis())),
        }
    }
}

fn fail(detail: String) -> Check {
    Check { ok: false, detail }
}

/// PostgreSQL's and the migrations' bound.
const CHECK_TIMEOUT: StdDuration = StdDuration::from_secs(2);

/// Keeps the last error librdkafka reported (authentication, TLS), which a failed
/// metadata call would otherwise hide behind a timeout (as `broker::LastError`).
#[derive(Default)]
pub struct ReadyContext(parking_lot::Mutex<Option<String>>);

impl ReadyContext {
    fn take(&self) -> Option<String> {
        self.0.lock().take()
    }
}

impl rdkafka::ClientContext for ReadyContext {
    /// A connection's own failure (from `log`) says more than "all brokers down".
    fn error(&self, error: rdkafka::error::KafkaError, reason: &str) {
        self.0
            .lock()
            .get_or_insert_with(|| format!("{error}: {reason}"));
    }

    fn log(&self, level: rdkafka::config::RDKafkaLogLevel, fac: &str, message: &str) {
        use rdkafka::config::RDKafkaLogLevel as L;
        let serious = matches!(
            level,
            L::Emerg | L::Alert | L::Critical | L::Error | L::Warning
        );
        if serious && fac == "FAIL" {
            let cause = message.split_once(": ").map_or(message, |(_, c)| c);
            *self.0.lock() = Some(cause.to_string());
        }
    }
}

impl rdkafka::consumer::ConsumerContext for ReadyContext {}

async fn check_postgres(pool: &PgPool) -> Check {
    let q = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(pool);
    match tokio::time::timeout(CHECK_TIMEOUT, q).await {
        Ok(Ok(_)) => Check {
            ok: true,
            detail: "answered".into(),
        },
        Ok(Err(e)) => Check {
            ok: false,
            detail: crate::store::StoreError::from(e).to_string(),
        },
        Err(_) => Check {
            ok: false,
            detail: "no answer within 2000 ms".into(),
        },
    }
}

async fn check_migrations(pool: &PgPool) -> Check {
    let q = sqlx::query_as::<_, (i64, Vec<u8>)>(
        "SELECT version, checksum FROM _sqlx_migrations WHERE success",
    )
    .fetch_all(pool);
    let applied = match tokio::time::timeout(CHECK_TIMEOUT, q).await {
        Ok(Ok(rows)) => rows,
        Ok(Err(e)) => {
            let missing_table = e
                .as_database_error()
                .and_then(|d| d.code())
                .is_some_and(|c| c == "42P01");
            return Check {
                ok: false,
                detail: if missing_table {
                    "no migration applied (run `pushpace migrate`)".into()
                } else {
                    crate::store::StoreError::from(e).to_string()
                },
            };
        }
        Err(_) => {
            return Check {
                ok: false,
                detail: "no answer within 2000 ms".into(),
            }
        }
    };
    let applied: HashMap<i64, Vec<u8>> = applied.into_iter().collect();
    let expected: Vec<_> = MIGRATOR
        .iter()
        .filter(|m| !m.migration_type.is_down_migration())
        .collect();
    let missing: Vec<String> = expected
        .iter()
        .filter(|m| !applied.contains_key(&m.version))
        .map(|m| m.version.to_string())
        .collect();
    let changed: Vec<String> = expected
        .iter()
        .filter(|m| applied.get(&m.version).is_some_and(|c| **c != *m.checksum))
        .map(|m| m.version.to_string())
        .collect();
    if missing.is_empty() && changed.is_empty() {
        Check {
            ok: true,
            detail: format!("{} of {} applied", expected.len(), expected.len()),
        }
    } else {
        let mut detail = Vec::new();
        if !missing.is_empty() {
            detail.push(format!("not applied: {}", missing.join(", ")));
        }
        if !changed.is_empty() {
            detail.push(format!("changed since applied: {}", changed.join(", ")));
        }
        Check {
            ok: false,
            detail: detail.join("; "),
        }
    }
}

/// `GET /metrics[?per_campaign=false]`.
#[derive(Debug, serde::Deserialize)]
pub struct MetricsQuery {
    /// `false` leaves out the per-campaign series (`sends_total`): for a scraper that
    /// polls often, or a Prometheus that should not hold a series per campaign.
    per_campaign: Option<bool>,
}

pub async fn metrics(
    State(state): State<AppState>,
    axum::extract::Query(query): axum::extract::Query<MetricsQuery>,
) -> Response {
    let stats = state
        .worker()
        .map(|w| (w.scheduler.borrow().clone(), w.consumer.borrow().clone()));
    let body = crate::metrics::render(
        state.inner.metrics.as_ref(),
        stats.as_ref().map(|(s, c)| (s, c)),
        query.per_campaign.unwrap_or(true),
    );
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limiter::ManualClock;

    /// Nothing listens here: every check fails at once, which is all the count needs.
    const CLOSED: &str = "127.0.0.1:1";

    fn cache(clock: Arc<ManualClock>) -> ReadyCache {
        let settings = crate::config::Settings::load(&crate::config::LoadOptions {
            config_dir: Some(concat!(env!("CARGO_MANIFEST_DIR"), "/config").into()),
            environment: Some("local".into()),
            overrides: Vec::new(),
        })
        .unwrap();
        let worker_pool = PgPoolOptions::new()
            .max_connections(10)
            .connect_lazy(&format!("postgres://postgres@{CLOSED}/pushpace"))
            .unwrap();
        ReadyCache::new(
            clock,
            &worker_pool,
            settings.kafka,
            CLOSED.into(),
            StdDuration::from_millis(100),
        )
    }

    #[tokio::test]
    async fn requests_within_a_second_share_one_check() {
        let clock = Arc::new(ManualClock::new(0));
        let cache = cache(clock.clone());
        let answers = futures::future::join_all((0..10).map(|_| cache.checks())).await;
        assert_eq!(cache.runs(), 1, "ten requests at once, one check");
        assert!(answers.iter().all(|(b, p, m)| !b.ok && !p.ok && !m.ok));
        let second = READY_CACHE.as_nanos() as Nanos;
        clock.advance(second - 1);
        cache.checks().await;
        assert_eq!(cache.runs(), 1, "still within the second");
        clock.advance(1);
        cache.checks().await;
        assert_eq!(cache.runs(), 2, "a second later, checked again");
        // Its own connection, not the worker's pool.
        assert_eq!(cache.pool.options().get_max_connections(), 1);
        assert!(cache.client.lock().is_some(), "one metadata client, kept");
    }
}
