//! A campaign's delivery policy in the store: priority, ramp-up and finish_by round
//! trip, keep or clear, reach the scheduler's settings, are recorded as events, and the
//! schema refuses what the code refuses, naming the field.

use crate::helpers::fresh_database;
use chrono::{DateTime, Duration, Utc};
use pushpace::job::PriorityClass;
use pushpace::limiter::MAX_RATE_PER_SECOND;
use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch};
use pushpace::store::{events, StoreError};

/// A whole second (events record seconds), an hour ahead.
fn deadline() -> DateTime<Utc> {
    DateTime::from_timestamp(Utc::now().timestamp() + 3600, 0).unwrap()
}

fn rfc(t: DateTime<Utc>) -> String {
    t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

#[tokio::test]
async fn the_policy_round_trips_keeps_clears_and_reaches_the_settings() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    let by = deadline();
    let patch = CampaignPatch {
        priority: Some(PriorityClass::Critical),
        ramp_up_s: Some(Some(30.0)),
        ramp_from: Some(Some(0.2)),
        finish_by: Some(Some(by)),
        ..Default::default()
    };
    let c = campaigns::put_by(&pool, "p", &patch, &defaults, Some("ops"))
        .await
        .unwrap();
    assert_eq!(c.priority, PriorityClass::Critical);
    assert_eq!((c.ramp_up_s, c.ramp_from), (Some(30.0), Some(0.2)));
    assert_eq!(c.finish_by, Some(by));
    // A deadline and no rate: the largest rate, which only the caps bound.
    assert_eq!(c.send_rate, MAX_RATE_PER_SECOND);
    assert_eq!(campaigns::get(&pool, "p").await.unwrap(), Some(c.clone()));
    let s = pushpace::worker::to_settings(&c, &defaults);
    assert_eq!(s.priority, PriorityClass::Critical);
    assert_eq!((s.ramp_up_s, s.ramp_from), (Some(30.0), Some(0.2)));
    assert_eq!(s.finish_by_ms, Some(by.timestamp_millis()));

    // Fields left out keep their values; a deadline given later keeps the stored rate.
    let c = campaigns::put(&pool, "p", &CampaignPatch::default(), &defaults)
        .await
        .unwrap();
    assert_eq!(
        (c.priority, c.ramp_up_s, c.ramp_from, c.finish_by),
        (PriorityClass::Critical, Some(30.0), Some(0.2), Some(by))
    );
    // null clears the nullable ones (back to the [limiter] defaults, no deadline).
    let clear = CampaignPatch {
        priority: Some(PriorityClass::Bulk),
        ramp_up_s: Some(None),
        ramp_from: Some(None),
        finish_by: Some(None),
        ..Default::default()
    };
    let c = campaigns::put_by(&pool, "p", &clear, &defaults, Some("ops"))
        .await
        .unwrap();
    assert_eq!(
        (c.priority, c.ramp_up_s, c.ramp_from, c.finish_by),
        (PriorityClass::Bulk, None, None, None)
    );
    assert_eq!(c.send_rate, MAX_RATE_PER_SECOND, "clearing keeps the rate");
    let s = pushpace::worker::to_settings(&c, &defaults);
    assert_eq!((s.ramp_up_s, s.finish_by_ms), (None, None));

    // A stated rate wins over the deadline's default; an existing campaign keeps its
    // rate when given a deadline.
    let both = CampaignPatch {
        send_rate: Some(250.0),
        finish_by: Some(Some(by)),
        ..Default::default()
    };
    let c = campaigns::put(&pool, "capped", &both, &defaults)
        .await
        .unwrap();
    assert_eq!(c.send_rate, 250.0);
    let job = campaigns::upsert_from_job(&pool, "from-job", None, None, &defaults)
        .await
        .unwrap();
    assert_eq!(
        (job.priority, job.ramp_up_s, job.ramp_from, job.finish_by),
        (PriorityClass::Normal, None, None, None)
    );
    let later = CampaignPatch {
        finish_by: Some(Some(by)),
        ..Default::default()
    };
    let c = campaigns::put(&pool, "from-job", &later, &defaults)
        .await
        .unwrap();
    assert_eq!(c.send_rate, defaults.send_rate.as_f64());
    // The store keeps a deadline already past (the API refuses one at input).
    let past = CampaignPatch {
        finish_by: Some(Some(by - Duration::hours(2))),
        ..Default::default()
    };
    let c = campaigns::put(&pool, "from-job", &past, &defaults)
        .await
        .unwrap();
    assert_eq!(c.finish_by, Some(by - Duration::hours(2)));

    // The list reads the same columns.
    let listed = campaigns::list(&pool, Utc::now()).await.unwrap();
    let p = listed.iter().find(|s| s.campaign.id == "p").unwrap();
    assert_eq!(p.campaign.priority, PriorityClass::Bulk);
    let capped = listed.iter().find(|s| s.campaign.id == "capped").unwrap();
    assert_eq!(capped.campaign.finish_by, Some(by));
}

#[tokio::test]
async fn policy_changes_are_recorded_as_events() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    let by = deadline();
    campaigns::put_by(
        &pool,
        "e",
        &CampaignPatch::default(),
        &defaults,
        Some("ops"),
    )
    .await
    .unwrap();
    let set = CampaignPatch {
        priority: Some(PriorityClass::High),
        ramp_up_s: Some(Some(120.0)),
        ramp_from: Some(Some(0.05)),
        finish_by: Some(Some(by)),
        ..Default::default()
    };
    campaigns::put_by(&pool, "e", &set, &defaults, Some("ops"))
        .await
        .unwrap();
    // The same values again change nothing, so record nothing.
    campaigns::put_by(&pool, "e", &set, &defaults, Some("ops"))
        .await
        .unwrap();
    let clear = CampaignPatch {
        ramp_up_s: Some(None),
        finish_by: Some(None),
        ..Default::default()
    };
    campaigns::put_by(&pool, "e", &clear, &defaults, Some("cli"))
        .await
        .unwrap();
    let got: Vec<(String, String, Option<String>, Option<String>)> =
        events::list(&pool, "e", events::MAX_EVENTS)
            .await
            .unwrap()
            .into_iter()
            .map(|e| (e.actor, e.field, e.old, e.new))
            .collect();
    let of = |field: &str| -> Vec<(String, Option<String>, Option<String>)> {
        got.iter()
            .filter(|(_, f, _, _)| f == field)
            .map(|(a, _, o, n)| (a.clone(), o.clone(), n.clone()))
            .collect()
    };
    let s = |v: &str| Some(v.to_string());
    assert_eq!(
        of("priority"),
        [
            ("ops".into(), None, s("normal")),
            ("ops".into(), s("normal"), s("high"))
        ],
        "{got:?}"
    );
    assert_eq!(
        of("ramp_up_s"),
        [
            ("ops".into(), None, s("120")),
            ("cli".into(), s("120"), None)
        ],
        "{got:?}"
    );
    assert_eq!(
        of("ramp_from"),
        [("ops".into(), None, s("0.05"))],
        "{got:?}"
    );
    assert_eq!(
        of("finish_by"),
        [
            ("ops".into(), None, Some(rfc(by))),
            ("cli".into(), Some(rfc(by)), None)
        ],
        "{got:?}"
    );
    // The fields recorded before are recorded still.
    for field in ["send_rate", "weight", "status", "algorithm"] {
        assert_eq!(of(field).len(), 1, "{field} at creation: {got:?}");
    }
}

#[tokio::test]
async fn the_schema_refuses_bad_policy_values_naming_the_field() {
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    for (patch, field) in [
        (
            CampaignPatch {
                ramp_up_s: Some(Some(86_401.0)),
                ..Default::default()
            },
            "ramp_up_s",
        ),
        (
            CampaignPatch {
                ramp_up_s: Some(Some(-1.0)),
                ..Default::default()
            },
            "ramp_up_s",
        ),
        (
            CampaignPatch {
                ramp_from: Some(Some(0.0)),
                ..Default::default()
            },
            "ramp_from",
        ),
        (
            CampaignPatch {
                ramp_from: Some(Some(1.5)),
                ..Default::default()
            },
            "ramp_from",
        ),
    ] {
        let err = campaigns::put(&pool, "c", &patch, &defaults)
            .await
            .unwrap_err();
        assert_eq!(err.field(), Some(field), "{patch:?}: {err}");
    }
    // The same values written with plain SQL: the constraint's name maps to the field.
    let raw = |column: &'static str, value: &'static str| {
        let pool = pool.clone();
        async move {
            let sql = format!(
                "INSERT INTO campaigns (id, send_rate, algorithm, {column}) \
                 VALUES ('raw', 10, 'gcra', $1::text::{})",
                if column == "priority" {
                    "text"
                } else {
                    "float8"
                }
            );
            let e: StoreError = sqlx::query(&sql)
                .bind(value)
                .execute(&pool)
                .await
                .unwrap_err()
                .into();
            e
        }
    };
    for (column, value) in [
        ("priority", "urgent"),
        ("priority", "Critical"),
        ("ramp_up_s", "86400.5"),
        ("ramp_up_s", "NaN"),
        ("ramp_from", "0.009"),
        ("ramp_from", "1.01"),
    ] {
        let e = raw(column, value).await;
        assert_eq!(e.field(), Some(column), "{column}={value}: {e}");
    }
    assert!(campaigns::all(&pool).await.unwrap().is_empty());
    // The bounds themselves are stored.
    let edges = CampaignPatch {
        ramp_up_s: Some(Some(86_400.0)),
        ramp_from: Some(Some(0.01)),
        ..Default::default()
    };
    let c = campaigns::put(&pool, "edges", &edges, &defaults)
        .await
        .unwrap();
    assert_eq!((c.ramp_up_s, c.ramp_from), (Some(86_400.0), Some(0.01)));
}

#[tokio::test]
async fn local_time_rules_round_trip_are_checked_together_and_recorded() {
    use pushpace::job::window::{LatePolicy, SendWindow};
    let (pool, _) = fresh_database().await;
    let defaults = CampaignDefaults::default();
    let weekdays = 0b001_1111;
    let window = SendWindow::new(9 * 60, 21 * 60, weekdays).unwrap();
    let set = CampaignPatch {
        send_window: Some(Some(window)),
        deliver_at_local: Some(Some(10 * 60)),
        late_policy: Some(LatePolicy::Skip),
        ..Default::default()
    };
    let c = campaigns::put_by(&pool, "w", &set, &defaults, Some("ops"))
        .await
        .unwrap();
    assert_eq!(
        (c.local.window, c.local.deliver_at_local, c.local.late),
        (Some(window), Some(600), LatePolicy::Skip)
    );
    assert_eq!(campaigns::get(&pool, "w").await.unwrap(), Some(c.clone()));
    let s = pushpace::worker::to_settings(&c, &defaults);
    assert_eq!(s.local, c.local);
    // A deliver time outside the stored window is refused, naming it; nothing changes.
    let outside = CampaignPatch {
        deliver_at_local: Some(Some(22 * 60)),
        ..Default::default()
    };
    match campaigns::put(&pool, "w", &outside, &defaults).await {
        Err(StoreError::Invalid { field, reason }) => {
            assert_eq!(field, "deliver_at_local", "{reason}");
            assert!(reason.contains("inside send_window"), "{reason}");
        }
        other => panic!("expected a refusal naming deliver_at_local, got {other:?}"),
    }
    assert_eq!(campaigns::get(&pool, "w").await.unwrap(), Some(c));
    // null clears the window and the deliver time; the late policy is kept.
    let clear = CampaignPatch {
        send_window: Some(None),
        deliver_at_local: Some(None),
        ..Default::default()
    };
    let c = campaigns::put_by(&pool, "w", &clear, &defaults, Some("cli"))
        .await
        .unwrap();
    assert!(
        c.local.is_empty() && c.local.late == LatePolicy::Skip,
        "{c:?}"
    );
    let fields: Vec<(String, Option<String>)> = events::list(&pool, "w", events::MAX_EVENTS)
        .await
        .unwrap()
        .into_iter()
        .map(|e| (e.field, e.new))
        .collect();
    for field in ["send_window", "deliver_at_local", "late_policy"] {
        assert!(
            fields.iter().filter(|(f, _)| f == field).count() >= 1,
            "{field} recorded: {fields:?}"
        );
    }
    assert!(
        fields.contains(&("deliver_at_local".into(), Some("10:00".into()))),
        "{fields:?}"
    );
    assert!(fields.contains(&("send_window".into(), None)), "{fields:?}");
}
