//! Who may ask: the admin token on changes (and dead letters), and the `Host` check
//! against DNS rebinding.

use super::{spawn_app, spawn_app_on, TOKEN};
use crate::helpers::fresh_database;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_need_the_admin_token() {
    let app = spawn_app().await;
    let body = r#"{"send_rate": 10}"#;
    let put = |auth: Option<&'static str>| {
        let app = &app;
        async move {
            app.request(
                reqwest::Method::PUT,
                "/api/campaigns/guarded",
                Some(body),
                auth,
            )
            .await
        }
    };
    let r = put(None).await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert!(r.body["error"].as_str().unwrap().contains("Bearer"));
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    let r = put(Some("Basic dGVzdDp0ZXN0")).await;
    assert_eq!(r.status, 401);
    let r = put(Some("Bearer not-the-token")).await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.body["error"].as_str().unwrap().contains("does not match"));
    // Same length, one byte off.
    let mut wrong = TOKEN.to_string();
    wrong.pop();
    wrong.push('X');
    let r = app
        .request(
            reqwest::Method::PUT,
            "/api/campaigns/guarded",
            Some(body),
            Some(&format!("Bearer {wrong}")),
        )
        .await;
    assert_eq!(r.status, 403);
    for path in [
        "/api/campaigns/guarded/pause",
        "/api/campaigns/guarded/resume",
    ] {
        let r = app.request(reqwest::Method::POST, path, None, None).await;
        assert_eq!(r.status, 401, "{path}");
        let r = app
            .request(reqwest::Method::POST, path, None, Some("Bearer nope"))
            .await;
        assert_eq!(r.status, 403, "{path}");
    }
    // Nothing was written by the refused requests.
    assert_eq!(app.get("/api/campaigns/guarded").await.status, 404);
    let r = app.put("/api/campaigns/guarded", body).await;
    assert_eq!(r.status, 201, "{}", r.text);

    // No token configured: every change is refused, saying how to set one.
    let (pool, url) = fresh_database().await;
    let open = spawn_app_on(pool, url, "", None, None, &[]).await;
    for auth in [
        None,
        Some(format!("Bearer {TOKEN}")),
        Some("Bearer ".into()),
    ] {
        let r = open
            .request(
                reqwest::Method::PUT,
                "/api/campaigns/x",
                Some(body),
                auth.as_deref(),
            )
            .await;
        assert_eq!(r.status, 403, "{}", r.text);
        let msg = r.body["error"].as_str().unwrap();
        assert!(msg.contains("PUSHPACE__HTTP__ADMIN_TOKEN"), "{msg}");
        assert!(msg.contains("http.admin_token"), "{msg}");
    }
    // Reads need no token, except the dead letters, which are refused like changes.
    assert_eq!(open.get("/api/campaigns").await.status, 200);
    let r = open.get("/api/dead-letters").await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(r.body["error"]
        .as_str()
        .unwrap()
        .contains("http.admin_token"));
    app.app.stop().await.unwrap();
    open.app.stop().await.unwrap();
}

/// A request must name this server in its `Host` (DNS rebinding: a page on another site
/// that resolves its own name to 127.0.0.1 must not read the API), for the API, the
/// dashboard and unknown paths alike; the bound address and `http.allowed_hosts` pass.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_known_hosts_are_served() {
    let (pool, url) = fresh_database().await;
    let extra = [(
        "http.allowed_hosts",
        "pushpace.test, ops.example:9000".to_string(),
    )];
    let app = spawn_app_on(pool, url, TOKEN, None, None, &extra).await;
    let port = app.app.port;
    for path in [
        "/api/campaigns",
        "/",
        "/healthz",
        "/assets/dashboard.js",
        "/nowhere",
    ] {
        for host in [
            "evil.example".to_string(),
            format!("evil.example:{port}"),
            format!("127.0.0.1.evil.example:{port}"),
            format!("localhost:{}", port.wrapping_add(1)),
            "ops.example:9001".to_string(),
        ] {
            let r = app.get_with_host(path, &host).await;
            assert_eq!(r.status, 421, "{path} as {host}: {}", r.text);
            assert!(
                r.body["error"]
                    .as_str()
                    .unwrap()
                    .contains("http.allowed_hosts"),
                "{}",
                r.text
            );
        }
    }
    // Refused before the token is looked at, and nothing is written.
    let res = app
        .http
        .put(app.url("/api/campaigns/rebound"))
        .header(reqwest::header::HOST, "evil.example")
        .bearer_auth(TOKEN)
        .body(r#"{"send_rate": 5}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status().as_u16(), 421);
    assert_eq!(app.get("/api/campaigns/rebound").await.status, 404);

    for host in [
        format!("127.0.0.1:{port}"),
        format!("localhost:{port}"),
        format!("LOCALHOST:{port}"),
        format!("[::1]:{port}"),
        "pushpace.test".to_string(),
        "pushpace.test:8443".to_string(),
        "ops.example:9000".to_string(),
    ] {
        let r = app.get_with_host("/api/campaigns", &host).await;
        assert_eq!(r.status, 200, "{host}: {}", r.text);
        let r = app.get_with_host("/", &host).await;
        assert_eq!(r.status, 200, "dashboard as {host}");
    }
    app.app.stop().await.unwrap();
}
