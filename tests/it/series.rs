//! The dashboard's reads against a real server and a fresh database: a series summed
//! into steps on the server (asked for, or picked so a long range stays within 600
//! points), and `GET /api/summary`.

use crate::api::{seed_seconds, spawn_app, Reply, TestApp};
use chrono::{DateTime, Duration, TimeZone, Utc};
use pushpace::store::campaigns::{self, CampaignDefaults, CampaignPatch, CampaignStatus};
use pushpace::store::{DeadLetter, DeadLetterKind};

fn sent(r: &Reply) -> Vec<i64> {
    r.body
        .as_array()
        .unwrap_or_else(|| panic!("an array: {}", r.text))
        .iter()
        .map(|p| p["sent"].as_i64().unwrap())
        .collect()
}

fn times(r: &Reply) -> Vec<DateTime<Utc>> {
    r.body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["t"].as_str().unwrap().parse().unwrap())
        .collect()
}

fn step_header(r: &Reply) -> &str {
    r.headers["x-series-step"].to_str().unwrap()
}

async fn series(app: &TestApp, query: &str) -> Reply {
    let r = app.get(&format!("/api/campaigns/ds/series?{query}")).await;
    assert_eq!(r.status, 200, "{query}: {}", r.text);
    r
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_are_summed_into_steps_on_the_server() {
    let app = spawn_app().await;
    assert_eq!(app.put("/api/campaigns/ds", "{}").await.status, 201);
    let t0 = Utc.with_ymd_and_hms(2026, 1, 5, 12, 0, 0).unwrap();
    let at = |s: i64| t0 + Duration::seconds(s);
    let seeded = [(0, 1), (4, 2), (5, 4), (59, 8), (60, 16), (3599, 32)];
    let rows: Vec<_> = seeded.iter().map(|&(s, n)| (at(s), n, 1)).collect();
    seed_seconds(&app.pool, "ds", &rows).await;
    let hour = "from=2026-01-05T12:00:00Z&to=2026-01-05T13:00:00Z";

    // A step asked for: 60 buckets of a minute, each the sum of its seconds.
    let r = series(&app, &format!("{hour}&step=60")).await;
    assert_eq!(step_header(&r), "60");
    let s = sent(&r);
    assert_eq!(s.len(), 60);
    assert_eq!((s[0], s[1], s[59]), (15, 16, 32), "{s:?}");
    assert_eq!(s.iter().sum::<i64>(), 63);
    let failed: i64 = r
        .body
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["failed"].as_i64().unwrap())
        .sum();
    assert_eq!(failed, 6, "every count is summed, not only sent");
    for (i, t) in times(&r).iter().enumerate() {
        assert_eq!(*t, at(60 * i as i64), "t is the bucket's start");
    }

    // No step: an hour is too long for one point a second; 10 s gives 360 points.
    let r = series(&app, hour).await;
    assert_eq!(step_header(&r), "10");
    let s = sent(&r);
    assert_eq!(s.len(), 360);
    assert_eq!((s[0], s[5], s[6], s[359]), (7, 8, 16, 32), "{s:?}");
    // 24 h: 5-minute steps, 288 points.
    let r = series(&app, "from=2026-01-05T00:00:00Z&to=2026-01-06T00:00:00Z").await;
    assert_eq!(step_header(&r), "300");
    assert_eq!(sent(&r).len(), 288);
    assert_eq!(sent(&r).iter().sum::<i64>(), 63);
    // 600 s still come one a second; 601 s do not.
    let r = series(&app, "from=2026-01-05T12:00:00Z&to=2026-01-05T12:10:00Z").await;
    assert_eq!((step_header(&r), sent(&r).len()), ("1", 600));
    let r = series(&app, "from=2026-01-05T12:00:00Z&to=2026-01-05T12:10:01Z").await;
    assert_eq!((step_header(&r), sent(&r).len()), ("5", 121));
    // step=1 is the per-second series, for any range up to 24 h.
    let r = series(&app, &format!("{hour}&step=1")).await;
    assert_eq!(sent(&r).len(), 3600);
    assert_eq!(&sent(&r)[..6], [1, 0, 0, 0, 2, 4]);

    // A range that starts or ends inside a bucket is widened to whole buckets, aligned
    // on the epoch, so a chart read again later keeps its points.
    let r = series(
        &app,
        "from=2026-01-05T12:00:07Z&to=2026-01-05T12:02:01Z&step=60",
    )
    .await;
    assert_eq!(times(&r), [at(0), at(60), at(120)]);
    assert_eq!(sent(&r), [15, 16, 0]);

    for bad in ["step=0", "step=3601", "step=1.5", "step=ten", "step="] {
        let r = app
            .get(&format!("/api/campaigns/ds/series?{hour}&{bad}"))
            .await;
        assert_eq!(r.status, 422, "{bad}: {}", r.text);
        assert_eq!(r.body["field"], "step", "{bad}: {}", r.text);
    }
    // Past 24 h the range is read in whole-minute steps (per-second rows and rolled-up
    // minutes together), up to 400 days.
    let r = app
        .get("/api/campaigns/ds/series?from=2026-01-04T00:00:00Z&to=2026-01-05T00:00:01Z&step=3600")
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.headers["x-series-step"], "3600");
    let r = app
        .get(
            "/api/campaigns/ds/series?from=2024-01-04T00:00:00Z&to=2026-01-05T00:00:01Z&step=86400",
        )
        .await;
    assert_eq!(
        (r.status, r.body["field"].as_str()),
        (422, Some("to")),
        "{}",
        r.text
    );
    app.app.stop().await.unwrap();
}

async fn dead_letter(app: &TestApp, offset: i64) -> i64 {
    let letter = DeadLetter {
        kind: DeadLetterKind::Undeliverable,
        topic: "pushpace.jobs",
        partition: 0,
        kafka_offset: offset,
        campaign_id: Some("s-active"),
        job_id: Some("j-1"),
        device_token: Some("secret-device-token"),
        reason: "permanent failure (HTTP 400)",
        raw: b"{\"job\": 1}",
        key: None,
        device: Some(0),
    };
    pushpace::store::dead_letters::insert(&app.pool, &letter)
        .await
        .unwrap()
        .unwrap()
}

/// One campaign in each state, sends in the last 10 s for one of them, and dead letters
/// inside and outside the last hour.
async fn seed_summary(app: &TestApp) {
    let pool = &app.pool;
    let defaults = CampaignDefaults::default();
    let put = |id: &'static str, patch: CampaignPatch| async move {
        campaigns::put(pool, id, &patch, &CampaignDefaults::default())
            .await
            .unwrap()
    };
    let rate = |r: f64| CampaignPatch {
        send_rate: Some(r),
        ..Default::default()
    };
    put("s-active", rate(100.0)).await;
    put("s-idle", rate(40.0)).await;
    for (id, status) in [
        ("s-paused", CampaignStatus::Paused),
        ("s-cancel", CampaignStatus::Cancelled),
        ("s-done", CampaignStatus::Done),
    ] {
        put(id, rate(1000.0)).await;
        campaigns::set_status(pool, id, status).await.unwrap();
    }
    put("s-halted", rate(1000.0)).await;
    assert!(campaigns::halt(pool, "s-halted", "bad key").await.unwrap());
    let later = CampaignPatch {
        send_rate: Some(1000.0),
        start_at: Some(Some(Utc::now() + Duration::hours(1))),
        ..Default::default()
    };
    campaigns::put(pool, "s-sched", &later, &defaults)
        .await
        .unwrap();
    let now = Utc.timestamp_opt(Utc::now().timestamp(), 0).unwrap();
    let recent = [
        (now - Duration::seconds(2), 50, 0),
        (now - Duration::seconds(3), 30, 0),
    ];
    seed_seconds(pool, "s-active", &recent).await;
    dead_letter(app, 1).await;
    dead_letter(app, 2).await;
    let old = dead_letter(app, 3).await;
    sqlx::query("UPDATE dead_letters SET created_at = now() - interval '2 hours' WHERE id = $1")
        .bind(old)
        .execute(pool)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_summary_counts_campaigns_rates_and_recent_dead_letters() {
    let app = spawn_app().await;
    seed_summary(&app).await;
    // Public: no token, and none of the dead letters' contents.
    let r = app.get("/api/summary").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert!(!r.text.contains("secret-device-token"), "{}", r.text);
    let b = &r.body;
    assert_eq!(
        b["sends_per_s"], 8.0,
        "80 sends in the last 10 s: {}",
        r.text
    );
    // Only the active campaign that is sending asks for its rate; the idle one, the
    // scheduled one and the stopped ones do not.
    assert_eq!(b["send_rate_sum"], 100.0, "{}", r.text);
    assert_eq!(
        b["campaigns"],
        serde_json::json!({"active": 2, "paused": 1, "halted": 1, "scheduled": 1,
                           "cancelled": 1, "done": 1}),
        "{}",
        r.text
    );
    assert_eq!(b["dead_letters_last_hour"], 2, "{}", r.text);
    assert_eq!(b["providers"], serde_json::json!([]), "no worker here");
    assert!(b["caps"]["global"].is_null(), "{}", r.text);
    app.app.stop().await.unwrap();
}

#[tokio::test]
async fn the_summary_shows_the_configured_global_cap() {
    let (pool, url) = crate::helpers::fresh_database().await;
    let app = crate::api::spawn_app_on(
        pool,
        url,
        crate::api::TOKEN,
        None,
        None,
        &[("limiter.global_rate", "600".to_string())],
    )
    .await;
    let r = app.get("/api/summary").await;
    assert_eq!(r.body["caps"]["global"], 600.0, "{}", r.text);
    app.app.stop().await.unwrap();
}

/// A range older than a day is read from the per-minute rollup as well: seeded minutes
/// three days ago come back summed, in steps of whole minutes; a step that is not whole
/// minutes is refused for such a range, naming `step`.
#[tokio::test]
async fn an_old_range_reads_the_rolled_up_minutes() {
    let app = spawn_app().await;
    campaigns::put(
        &app.pool,
        "old",
        &CampaignPatch::default(),
        &CampaignDefaults::default(),
    )
    .await
    .unwrap();
    let base = DateTime::from_timestamp(
        (Utc::now() - Duration::days(3)).timestamp() / 3600 * 3600,
        0,
    )
    .unwrap();
    for m in 0..60 {
        sqlx::query("INSERT INTO delivery_minutes (campaign_id, minute, sent) VALUES ($1, $2, $3)")
            .bind("old")
            .bind(base + Duration::minutes(m))
            .bind(10 + m)
            .execute(&app.pool)
            .await
            .unwrap();
    }
    let from = base.to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let to = (base + Duration::hours(1)).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let r = app
        .get(&format!("/api/campaigns/old/series?from={from}&to={to}"))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.headers["x-series-step"], "60");
    let got = sent(&r);
    assert_eq!(got.len(), 60, "{}", r.text);
    assert_eq!(got.iter().sum::<i64>(), (10..70).sum::<i64>());
    let r = app
        .get(&format!(
            "/api/campaigns/old/series?from={from}&to={to}&step=30"
        ))
        .await;
    assert_eq!(r.status, 422, "{}", r.text);
    assert_eq!(r.body["field"], "step");
    app.app.stop().await.unwrap();
}
