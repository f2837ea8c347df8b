//! `/healthz` and `/readyz` (each check by name, a stopped consumer), and the dashboard
//! served from the binary.

use super::{spawn_app, spawn_app_on, spawn_worker_app, TOKEN};
use crate::helpers::{free_port, fresh_database, pg_server, unique_name};
use std::time::Duration;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn liveness_and_readiness_report_each_check_by_name() {
    let app = spawn_app().await;
    let r = app.get("/healthz").await;
    assert_eq!(r.status, 200);
    assert_eq!(r.body["status"], "ok");

    let r = app.get("/readyz").await;
    assert_eq!(r.status, 200, "{}", r.text);
    assert_eq!(r.body["ready"], true);
    for check in ["broker", "postgres", "migrations"] {
        assert_eq!(r.body["checks"][check]["ok"], true, "{check}: {}", r.text);
    }
    let n = pushpace::store::MIGRATOR.iter().count();
    assert_eq!(
        r.body["checks"]["migrations"]["detail"],
        format!("{n} of {n} applied")
    );

    // A broker nobody listens on: not ready, and the broker check says why.
    let (pool, url) = fresh_database().await;
    let dead = format!("127.0.0.1:{}", free_port());
    let lonely = spawn_app_on(pool, url, TOKEN, None, Some(dead), &[]).await;
    let r = lonely.get("/readyz").await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.body["ready"], false);
    assert_eq!(r.body["checks"]["broker"]["ok"], false);
    assert!(!r.body["checks"]["broker"]["detail"]
        .as_str()
        .unwrap()
        .is_empty());
    assert_eq!(r.body["checks"]["postgres"]["ok"], true);
    assert_eq!(r.body["checks"]["migrations"]["ok"], true);

    // A database that was never migrated.
    let url = format!("{}/{}", pg_server(), unique_name("pushpace_unmigrated"));
    pushpace::store::ensure_database(&url).await.unwrap();
    let pool = pushpace::store::connect(&url, 2, Duration::from_secs(5))
        .await
        .unwrap();
    let bare = spawn_app_on(pool.clone(), url, TOKEN, None, None, &[]).await;
    let r = bare.get("/readyz").await;
    assert_eq!(r.status, 503, "{}", r.text);
    assert_eq!(r.body["checks"]["migrations"]["ok"], false);
    assert!(
        r.body["checks"]["migrations"]["detail"]
            .as_str()
            .unwrap()
            .contains("pushpace migrate"),
        "{}",
        r.text
    );
    // Half migrated: the missing versions are named.
    let first = pushpace::store::MIGRATOR.iter().next().unwrap();
    sqlx::raw_sql(&first.sql).execute(&pool).await.unwrap();
    sqlx::query(
        "CREATE TABLE _sqlx_migrations (version BIGINT PRIMARY KEY, description TEXT NOT NULL, \
         installed_on TIMESTAMPTZ NOT NULL DEFAULT now(), success BOOLEAN NOT NULL, \
         checksum BYTEA NOT NULL, execution_time BIGINT NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO _sqlx_migrations (version, description, success, checksum, execution_time) \
         VALUES ($1, $2, true, $3, 0)",
    )
    .bind(first.version)
    .bind(&*first.description)
    .bind(&*first.checksum)
    .execute(&pool)
    .await
    .unwrap();
    // The checks' answer is cached for a second (READY_CACHE); a little past it.
    tokio::time::sleep(std::time::Duration::from_millis(1_100)).await;
    let r = bare.get("/readyz").await;
    assert_eq!(r.status, 503);
    let detail = r.body["checks"]["migrations"]["detail"].as_str().unwrap();
    let last = pushpace::store::MIGRATOR.iter().last().unwrap();
    assert!(detail.starts_with("not applied: "), "{detail}");
    assert!(detail.contains(&last.version.to_string()), "{detail}");
    assert!(!detail.contains(&format!("{},", first.version)), "{detail}");

    for a in [app, lonely, bare] {
        a.app.stop().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dashboard_and_its_assets_come_from_the_binary() {
    let app = spawn_app().await;
    let r = app.get("/").await;
    assert_eq!(r.status, 200);
    assert!(r.headers["content-type"]
        .to_str()
        .unwrap()
        .starts_with("text/html"));
    let csp = r.headers["content-security-policy"].to_str().unwrap();
    assert!(csp.contains("default-src 'self'"), "{csp}");
    assert!(r
        .text
        .contains(r#"<script src="/assets/uPlot.iife.min.js">"#));
    assert!(
        !r.text.contains("http://") && !r.text.contains("https://"),
        "no CDN"
    );
    for (path, kind, needle) in [
        ("/assets/uPlot.iife.min.js", "text/javascript", "uPlot"),
        ("/assets/uPlot.min.css", "text/css", ".uplot"),
        ("/assets/dashboard.js", "text/javascript", "sessionStorage"),
        ("/assets/dashboard.css", "text/css", "#charts"),
        ("/assets/uPlot.LICENSE", "text/plain", "The MIT License"),
    ] {
        let r = app.get(path).await;
        assert_eq!(r.status, 200, "{path}");
        assert!(
            r.headers["content-type"]
                .to_str()
                .unwrap()
                .starts_with(kind),
            "{path}"
        );
        assert!(r.text.contains(needle), "{path}");
    }
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_fails_once_the_consumer_thread_has_stopped() {
    let mut app = spawn_worker_app(&[(100.0, 10)]).await;
    let r = app.api.get("/readyz").await;
    assert_eq!(r.status, 200, "{:?}", r.body);
    assert_eq!(r.body["checks"]["consumer"]["ok"], true);
    // The consumer thread ends (here at shutdown; in production on its own, when the
    // process then exits non-zero): readiness must say so, not look healthy.
    let worker = app.worker.take().unwrap();
    let mut running = worker.consumer_running.clone();
    worker.shutdown().await.expect("worker shutdown");
    assert!(!*running.borrow_and_update());
    let r = app.api.get("/readyz").await;
    assert_eq!(r.status, 503, "{:?}", r.body);
    assert_eq!(r.body["checks"]["consumer"]["ok"], false);
    app.stop().await;
}
