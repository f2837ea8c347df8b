//! `/api/campaigns/{id}/series`: zero-filled gaps, time zones, `last`, and the range
//! bounds.

use super::{second_now, seed_seconds, spawn_app};
use chrono::{DateTime, Duration as ChronoDuration, TimeZone, Utc};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_fills_gaps_with_zeros_and_bounds_the_range() {
    let app = spawn_app().await;
    assert_eq!(app.put("/api/campaigns/s1", "{}").await.status, 201);
    let t0 = Utc.with_ymd_and_hms(2026, 1, 5, 12, 0, 0).unwrap();
    seed_seconds(
        &app.pool,
        "s1",
        &[
            (t0 + ChronoDuration::seconds(1), 7, 1),
            (t0 + ChronoDuration::seconds(3), 9, 0),
        ],
    )
    .await;
    let r = app
        .get("/api/campaigns/s1/series?from=2026-01-05T12:00:00Z&to=2026-01-05T12:00:05Z")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let points = r.body.as_array().unwrap();
    let sent: Vec<i64> = points.iter().map(|p| p["sent"].as_i64().unwrap()).collect();
    let failed: Vec<i64> = points
        .iter()
        .map(|p| p["failed"].as_i64().unwrap())
        .collect();
    assert_eq!(sent, [0, 7, 0, 9, 0]);
    assert_eq!(failed, [0, 1, 0, 0, 0]);
    let times: Vec<DateTime<Utc>> = points
        .iter()
        .map(|p| p["t"].as_str().unwrap().parse().unwrap())
        .collect();
    for (i, t) in times.iter().enumerate() {
        assert_eq!(*t, t0 + ChronoDuration::seconds(i as i64));
    }
    // Another time zone and a sub-second start mean the same seconds.
    let r = app
        .get(
            "/api/campaigns/s1/series?from=2026-01-05T13:00:01.500%2B01:00&to=2026-01-05T12:00:04Z",
        )
        .await;
    let sent: Vec<i64> = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["sent"].as_i64().unwrap())
        .collect();
    assert_eq!(sent, [7, 0, 9]);

    // `last` ends now; the current second is left out.
    let now = second_now();
    seed_seconds(&app.pool, "s1", &[(now - ChronoDuration::seconds(2), 4, 0)]).await;
    let r = app.get("/api/campaigns/s1/series?last=10s").await;
    let points = r.body.as_array().unwrap();
    assert!((10..=11).contains(&points.len()), "{}", points.len());
    assert_eq!(
        points
            .iter()
            .map(|p| p["sent"].as_i64().unwrap())
            .sum::<i64>(),
        4
    );
    // The default is the last 5 minutes.
    let r = app.get("/api/campaigns/s1/series").await;
    assert!((300..=301).contains(&r.body.as_array().unwrap().len()));

    let bad: &[(&str, &str)] = &[
        // Longer than 24 h is read in minute steps, up to 400 days.
        ("from=2024-01-04T12:00:00Z&to=2026-01-05T12:00:01Z", "to"),
        ("from=2026-01-05T12:00:05Z&to=2026-01-05T12:00:00Z", "from"),
        ("from=yesterday", "from"),
        ("to=2026-13-01T00:00:00Z", "to"),
        ("last=401d", "to"),
        ("last=5parsecs", "last"),
        ("last=5m&from=2026-01-05T12:00:00Z", "last"),
        ("form=2026-01-05T12:00:00Z", "form"),
    ];
    for (q, field) in bad {
        let r = app.get(&format!("/api/campaigns/s1/series?{q}")).await;
        assert_eq!(r.status, 422, "{q}: {}", r.text);
        assert_eq!(r.body["field"], *field, "{q}: {}", r.text);
    }
    // Exactly 24 h is allowed.
    let r = app
        .get("/api/campaigns/s1/series?from=2026-01-04T12:00:00Z&to=2026-01-05T12:00:00Z&step=1")
        .await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body.as_array().unwrap().len(), 86_400);
    app.app.stop().await.unwrap();
}
