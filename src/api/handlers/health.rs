//! `/healthz`, `/readyz` (the broker, PostgreSQL, the applied migrations and the
//! consumer thread, checked at once) and the Prometheus `/metrics`.

use crate::api::AppState;
use crate::store::MIGRATOR;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use std::collections::HashMap;
use std::time::Duration as StdDuration;

pub async fn healthz() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// One readiness check's result.
#[derive(Debug, serde::Serialize)]
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
    let (broker, postgres, migrations) = tokio::join!(
        check_broker(&state),
        check_postgres(&state),
        check_migrations(&state)
    );
    let consumer = state.worker().map(|w| {
        if *w.consumer_running.borrow() {
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

async fn check_broker(state: &AppState) -> Check {
    let bootstrap = state.inner.bootstrap.clone();
    let timeout = state.inner.broker_timeout;
    // librdkafka's metadata call blocks its thread.
    let kafka = state.inner.kafka.clone();
    let ping =
        tokio::task::spawn_blocking(move || crate::broker::ping(&kafka, &bootstrap, timeout));
    match tokio::time::timeout(timeout + StdDuration::from_secs(1), ping).await {
        Ok(Ok(Ok(n))) => Check {
            ok: true,
            detail: format!("{n} broker(s) answered"),
        },
        Ok(Ok(Err(e))) => Check {
            ok: false,
            detail: e.to_string(),
        },
        Ok(Err(e)) => Check {
            ok: false,
            detail: format!("ping task failed: {e}"),
        },
        Err(_) => Check {
            ok: false,
            detail: format!("no answer within {} ms", timeout.as_millis()),
        },
    }
}

async fn check_postgres(state: &AppState) -> Check {
    let q = sqlx::query_scalar::<_, i32>("SELECT 1").fetch_one(state.pool());
    match tokio::time::timeout(StdDuration::from_secs(2), q).await {
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

async fn check_migrations(state: &AppState) -> Check {
    let q = sqlx::query_as::<_, (i64, Vec<u8>)>(
        "SELECT version, checksum FROM _sqlx_migrations WHERE success",
    )
    .fetch_all(state.pool());
    let applied = match tokio::time::timeout(StdDuration::from_secs(2), q).await {
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
