//! The worker's [`AppWatcher`] against the real PostgreSQL: a watched kind follows a
//! PUT, a disable, an enable, a rotation and a delete within a second (LISTEN on
//! `app_changed`); a change made with the triggers off (so no NOTIFY) is caught by the
//! fallback re-read; a corrupted row halts only its app; and only watched apps are
//! opened, however many are registered.

use super::{parse, ring, webpush_body, Secrets};
use crate::helpers::fresh_database;
use pushpace::apps::watcher::{AppEntry, AppStatus, AppWatcher};
use pushpace::apps::{store, AppKind, Keyring};
use pushpace::store::listen::WatcherConfig;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

/// The bound from a change to every worker seeing it. A NOTIFY reaches the
/// listener in milliseconds on loopback; the rest is one open (a decryption and a few
/// queries).
const NOTICE_BOUND: Duration = Duration::from_secs(1);

/// The fallback's period in the lost-notification test, well under the default 5 s so
/// the test stays short.
const REFRESH: Duration = Duration::from_millis(200);

fn config(refresh: Duration) -> WatcherConfig {
    WatcherConfig {
        refresh_interval: refresh,
        ..WatcherConfig::default()
    }
}

/// Waits (up to `bound`) for `id`'s `kind` to satisfy `ok`; the entry and how long it took.
async fn until(
    w: &AppWatcher,
    id: &str,
    kind: AppKind,
    bound: Duration,
    ok: impl Fn(&AppEntry) -> bool,
) -> (AppEntry, Duration) {
    let start = Instant::now();
    loop {
        let e = w.get(id, kind).expect("watched");
        if ok(&e) {
            return (e, start.elapsed());
        }
        assert!(
            start.elapsed() < bound,
            "{id}/{kind} still {e:?} after {bound:?}"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ready_with(fingerprint: &str) -> impl Fn(&AppEntry) -> bool + '_ {
    move |e| matches!(&e.status, AppStatus::Ready(c) if c.fingerprint() == fingerprint)
}

fn waiting_for(text: &str) -> impl Fn(&AppEntry) -> bool + '_ {
    move |e| matches!(&e.status, AppStatus::Waiting(r) if r.contains(text))
}

async fn fingerprint(pool: &sqlx::PgPool, id: &str, kind: AppKind) -> String {
    let app = store::get(pool, id).await.unwrap().unwrap();
    app.credentials[&kind].fingerprint.clone()
}

async fn put(pool: &sqlx::PgPool, keys: &Keyring, id: &str, s: &Secrets) {
    let body = parse(&s.body(&format!("{id}@example.com")));
    store::put(pool, Some(keys), id, &body, None).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watched_app_follows_every_change_within_a_second() {
    let (pool, _) = fresh_database().await;
    let keys = Arc::new(ring());
    let stop = CancellationToken::new();
    // No fallback within the test: every change must come through LISTEN.
    let (w, task) = AppWatcher::start(
        pool.clone(),
        Some(keys.clone()),
        config(Duration::from_secs(3600)),
        stop.clone(),
    );
    let first = w.watch("late", AppKind::Apns);
    assert!(matches!(first.status, AppStatus::Waiting(_)), "{first:?}");
    until(
        &w,
        "late",
        AppKind::Apns,
        NOTICE_BOUND,
        waiting_for("not registered"),
    )
    .await;

    let s = Secrets::new();
    put(&pool, &keys, "late", &s).await;
    let fp = fingerprint(&pool, "late", AppKind::Apns).await;
    let (e, took) = until(&w, "late", AppKind::Apns, NOTICE_BOUND, ready_with(&fp)).await;
    println!("put seen after {took:?}");
    let v = e.version;

    store::set_enabled(&pool, "late", false, None)
        .await
        .unwrap();
    until(
        &w,
        "late",
        AppKind::Apns,
        NOTICE_BOUND,
        waiting_for("disabled"),
    )
    .await;
    store::set_enabled(&pool, "late", true, None).await.unwrap();
    until(&w, "late", AppKind::Apns, NOTICE_BOUND, ready_with(&fp)).await;

    // A rotation: another key for the same app.
    let s2 = Secrets::new();
    put(&pool, &keys, "late", &s2).await;
    let fp2 = fingerprint(&pool, "late", AppKind::Apns).await;
    assert_ne!(fp, fp2);
    let (e, _) = until(&w, "late", AppKind::Apns, NOTICE_BOUND, ready_with(&fp2)).await;
    assert!(
        e.version >= v + 3,
        "each change bumps the version: {} then {}",
        v,
        e.version
    );

    // A kind the app does not have waits, saying so.
    let body = parse(&webpush_body());
    store::put(&pool, Some(&keys), "web-only", &body, None)
        .await
        .unwrap();
    w.watch("web-only", AppKind::Fcm);
    until(
        &w,
        "web-only",
        AppKind::Fcm,
        NOTICE_BOUND,
        waiting_for("no fcm credentials"),
    )
    .await;

    store::delete(&pool, "late", true, None).await.unwrap();
    until(&w, "late", AppKind::Apns, NOTICE_BOUND, |e| {
        matches!(e.status, AppStatus::Deleted)
    })
    .await;
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_without_a_notification_is_caught_by_the_fallback() {
    let (pool, _) = fresh_database().await;
    let keys = Arc::new(ring());
    let s = Secrets::new();
    put(&pool, &keys, "quiet", &s).await;
    let fp = fingerprint(&pool, "quiet", AppKind::Fcm).await;
    let stop = CancellationToken::new();
    let (w, task) = AppWatcher::start(pool.clone(), Some(keys), config(REFRESH), stop.clone());
    w.watch("quiet", AppKind::Fcm);
    until(&w, "quiet", AppKind::Fcm, NOTICE_BOUND, ready_with(&fp)).await;

    // Triggers off for this transaction: no NOTIFY, no event, updated_at set by hand.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL session_replication_role = replica")
        .execute(&mut *tx)
        .await
        .unwrap();
    sqlx::query(
        "UPDATE app_credentials SET status = 'disabled', updated_at = now() \
         WHERE app_id = 'quiet' AND kind = 'fcm'",
    )
    .execute(&mut *tx)
    .await
    .unwrap();
    tx.commit().await.unwrap();
    let events = super::count_events(&pool, "quiet", None, Some("disabled")).await;
    assert_eq!(
        events, 0,
        "the triggers were off: no event, so no NOTIFY either"
    );
    let (_, took) = until(
        &w,
        "quiet",
        AppKind::Fcm,
        REFRESH + NOTICE_BOUND,
        waiting_for("disabled"),
    )
    .await;
    println!("lost notification caught after {took:?}");
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupted_row_halts_only_its_app_and_idle_apps_are_never_opened() {
    let (pool, _) = fresh_database().await;
    let keys = Arc::new(ring());
    for i in 0..200 {
        let body = parse(&webpush_body());
        store::put(&pool, Some(&keys), &format!("idle-{i}"), &body, None)
            .await
            .unwrap();
    }
    let (sa, sb) = (Secrets::new(), Secrets::new());
    put(&pool, &keys, "a", &sa).await;
    put(&pool, &keys, "b", &sb).await;
    let fb = fingerprint(&pool, "b", AppKind::Apns).await;
    let stop = CancellationToken::new();
    let (w, task) = AppWatcher::start(
        pool.clone(),
        Some(keys),
        config(Duration::from_secs(3600)),
        stop.clone(),
    );
    w.watch("a", AppKind::Apns);
    w.watch("b", AppKind::Apns);
    until(&w, "a", AppKind::Apns, NOTICE_BOUND, |e| {
        matches!(e.status, AppStatus::Ready(_))
    })
    .await;
    until(&w, "b", AppKind::Apns, NOTICE_BOUND, ready_with(&fb)).await;

    super::flip_a_sealed_bit(&pool, "a", AppKind::Apns).await;
    let (e, _) = until(&w, "a", AppKind::Apns, NOTICE_BOUND, |e| {
        matches!(e.status, AppStatus::Halted(_))
    })
    .await;
    let text = format!("{e:?}");
    assert!(text.contains("altered"), "{text}");
    sa.assert_absent(&text);
    let b = w.get("b", AppKind::Apns).unwrap();
    assert!(ready_with(&fb)(&b), "b is untouched: {b:?}");
    assert_eq!(w.watched(), 2, "only the kinds jobs named are held");
    assert!(
        w.opens() <= 8,
        "the 200 idle apps were never opened: {} opens",
        w.opens()
    );
    stop.cancel();
    task.await.unwrap();
}
