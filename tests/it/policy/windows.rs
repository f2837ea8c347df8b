//! Recipients' local-time windows through the real worker, on the real clock: the zone
//! is chosen so that it is about 14:00 there now. (The DST change and the day's
//! openings are on the virtual clock: src/worker/scheduler/window_tests.rs.)

use super::*;
use crate::harness::{Producer, Record};
use chrono::{Timelike, Utc};
use pushpace::job::window::Zone;
use pushpace::job::window::{LatePolicy, SendWindow, ALL_DAYS};

/// A UTC offset where it is between 14:00 and 15:00 now, as `±HH:00`.
fn afternoon_zone() -> String {
    zone_at(14)
}

/// A UTC offset where it is between `hour`:00 and `hour`:59 now, as `±HH:00`.
fn zone_at(hour: i32) -> String {
    let mut off = hour - Utc::now().hour() as i32;
    if off > 12 {
        off -= 24;
    } else if off < -12 {
        off += 24;
    }
    format!("{}{:02}:00", if off < 0 { '-' } else { '+' }, off.abs())
}

fn window(from_h: u16, to_h: u16) -> Option<Option<SendWindow>> {
    Some(Some(
        SendWindow::new(from_h * 60, to_h * 60, ALL_DAYS).expect("a window"),
    ))
}

fn zoned(list: Vec<Job>, zone: &str) -> Vec<Job> {
    let z = Zone::parse(zone).expect("zone");
    list.into_iter().map(|j| j.with_zone(Some(z))).collect()
}

async fn sum_expired(pool: &PgPool, campaign: &str) -> i64 {
    sqlx::query_scalar::<_, Option<i64>>(
        "SELECT sum(expired)::bigint FROM delivery_seconds WHERE campaign_id = $1",
    )
    .bind(campaign)
    .fetch_one(pool)
    .await
    .unwrap()
    .unwrap_or(0)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_wait_parked_for_their_zones_window_and_a_passed_time_is_skipped() {
    let mut tw = TestWorker::options().partitions(2).prepare().await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let zone = afternoon_zone();
    let (open, closed, skip) = (name("open"), name("closed"), name("skip"));
    store(
        &pool,
        &open,
        CampaignPatch {
            send_window: window(9, 21),
            ..Default::default()
        },
    )
    .await;
    // 02:00–03:00 has passed today there: it waits for tomorrow's.
    store(
        &pool,
        &closed,
        CampaignPatch {
            send_rate: Some(10.0),
            send_window: window(2, 3),
            ..Default::default()
        },
    )
    .await;
    store(
        &pool,
        &skip,
        CampaignPatch {
            deliver_at_local: Some(Some(10 * 60)),
            late_policy: Some(LatePolicy::Skip),
            ..Default::default()
        },
    )
    .await;
    produce_jobs(&topic, &zoned(jobs(&open, 1_000.0, 2, 100), &zone), None).await;
    // 10/s: the lookahead (10 s) holds two of these jobs; the rest are parked.
    produce_jobs(&topic, &zoned(jobs(&closed, 10.0, 40, 50), &zone), Some(0)).await;
    produce_jobs(&topic, &zoned(jobs(&skip, 1_000.0, 3, 20), &zone), None).await;
    let bad = format!(
        r#"{{"job_id":"bad-tz","campaign_id":"{open}","devices":["x"],"payload":{{}},"tz":"Mars/Olympus"}}"#
    );
    Producer::new()
        .send(&topic, Record::of(bad.as_bytes()))
        .await;
    tw.start().await;
    let worker = tw.take_worker();
    wait_for("the open zone's jobs sent", GROUP_JOIN_LIMIT, || {
        sink.campaign(&open)
            .is_some_and(|s| s.distinct_delivered == 200)
    })
    .await;
    // The skipped jobs' letters and counts are durable within a flush or two.
    let end = std::time::Instant::now() + Duration::from_secs(20);
    let letters = loop {
        let all = pushpace::store::dead_letters::list(&pool, None, None, 100)
            .await
            .unwrap();
        if all.len() >= 4 || std::time::Instant::now() > end {
            break all;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    tokio::time::sleep(Duration::from_secs(2)).await;
    let stats = worker.consumer_stats.borrow().clone();
    worker.shutdown().await.unwrap();
    assert!(
        sink.campaign(&skip).is_none(),
        "nothing of the skipped campaign sent"
    );
    assert!(
        sink.campaign(&closed).is_none(),
        "nothing outside the window sent"
    );
    let skipped: Vec<_> = letters
        .iter()
        .filter(|l| l.campaign_id.as_deref() == Some(skip.as_str()))
        .collect();
    assert_eq!(skipped.len(), 3, "one letter per skipped job: {letters:#?}");
    for l in &skipped {
        assert_eq!(l.kind.as_str(), "expired", "{l:?}");
        assert!(
            l.reason.contains("20 of 20 devices")
                && l.reason.contains("deliver_at_local 10:00")
                && l.reason.contains("late_policy is skip"),
            "{}",
            l.reason
        );
    }
    assert_eq!(
        sum_expired(&pool, &skip).await,
        60,
        "the skipped devices count expired"
    );
    let bad_tz: Vec<_> = letters
        .iter()
        .filter(|l| l.kind.as_str() == "invalid_job")
        .collect();
    assert_eq!(bad_tz.len(), 1, "{letters:#?}");
    assert!(bad_tz[0].reason.contains("tz"), "{}", bad_tz[0].reason);
    // The waiting campaign's jobs are parked upstream, not held: memory holds its
    // lookahead (10 s at 10/s: two jobs of 50) and one job more at most.
    assert!(
        stats.parked_jobs >= 37 && stats.buffered_jobs <= 3,
        "parked {} jobs, buffered {} ({stats:?})",
        stats.parked_jobs,
        stats.buffered_jobs
    );
}

/// A campaign for two zones: its jobs for a zone whose window is closed come first and
/// are more than its lookahead (20/s × 10 s: 200 devices). They wait parked for their
/// window, so its jobs for a zone whose window is open go out at once; when its window
/// is widened, the waiting jobs go too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_zone_waiting_for_its_window_does_not_hold_back_a_zone_whose_window_is_open() {
    let mut tw = TestWorker::options().api().prepare().await;
    let (pool, topic, sink) = (tw.pool.clone(), tw.topic.clone(), tw.sink());
    let id = name("zones");
    store(
        &pool,
        &id,
        CampaignPatch {
            send_rate: Some(20.0),
            send_window: window(9, 21),
            ..Default::default()
        },
    )
    .await;
    let asleep_zone = zone_at(2);
    let asleep: Vec<Job> = zoned(jobs(&id, 20.0, 10, 30), &asleep_zone);
    let awake: Vec<Job> = zoned(jobs(&format!("{id}-x"), 20.0, 2, 50), &afternoon_zone())
        .into_iter()
        .enumerate()
        .map(|(i, j)| Job {
            job_id: format!("{id}-awake-{i}"),
            campaign_id: id.clone(),
            ..j
        })
        .collect();
    produce_jobs(&topic, &asleep, Some(0)).await;
    produce_jobs(&topic, &awake, Some(0)).await;
    tw.start().await;
    let api = tw.take_api();
    let worker = tw.take_worker();
    wait_for(
        "the awake zone's 100 devices sent",
        GROUP_JOIN_LIMIT,
        || {
            sink.campaign(&id)
                .is_some_and(|s| s.distinct_delivered == 100)
        },
    )
    .await;
    let stats = worker.consumer_stats.borrow().clone();
    assert_eq!(stats.window_jobs, 10, "{stats:?}");
    assert!(stats.buffered_jobs <= 2, "{stats:?}");
    let awake_tokens = sink
        .arrivals()
        .iter()
        .filter(|a| *a.campaign_id == *id)
        .filter(|a| a.device_token.contains("-x-"))
        .count();
    assert_eq!(awake_tokens, 100, "only the awake zone's devices went");
    // The campaign's view names the waiting zone and its next window: 09:00 there.
    let view = api.get(&format!("/api/campaigns/{id}")).await.body;
    let next = view["policy"]["next_windows"]
        .as_array()
        .expect("next_windows");
    let entry = next
        .iter()
        .find(|w| w["zone"] == asleep_zone.as_str())
        .unwrap_or_else(|| panic!("no window for {asleep_zone}: {view:#}"));
    let opens: chrono::DateTime<Utc> = entry["opens"].as_str().unwrap().parse().unwrap();
    let offset: chrono::FixedOffset = asleep_zone.parse().unwrap();
    let local = opens.with_timezone(&offset);
    assert!(opens > Utc::now(), "{entry}");
    assert_eq!((local.hour(), local.minute()), (9, 0), "{entry}");
    // And `campaign show` prints it: on the `next_window` line, or on the one under it
    // while the awake zone's jobs are still held here (held zones come first).
    let (ok, out, err) = crate::policy_cli::run(&api.app.url(), &["campaign", "show", &id]).await;
    assert!(ok, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    let first = lines.iter().position(|l| l.starts_with("next_window"));
    let shown = lines
        .iter()
        .position(|l| l.contains(&format!("{asleep_zone}: opens")));
    assert!(
        matches!((first, shown), (Some(f), Some(s)) if s == f || s == f + 1),
        "{out}"
    );
    // The window widened to the whole day: the asleep zone's 300 devices go too.
    store(
        &pool,
        &id,
        CampaignPatch {
            send_window: Some(None),
            ..Default::default()
        },
    )
    .await;
    // 300 devices at 20/s are 15 s, once the change reached the worker (within 1 s).
    wait_for(
        "the asleep zone's devices sent",
        Duration::from_secs(60),
        || {
            sink.campaign(&id)
                .is_some_and(|s| s.distinct_delivered == 400)
        },
    )
    .await;
    assert_eq!(worker.consumer_stats.borrow().window_jobs, 0);
    worker.shutdown().await.unwrap();
    api.app.stop().await.expect("server stops");
}
