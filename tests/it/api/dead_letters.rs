//! `/api/dead-letters`: behind the admin token, newest first, in pages.

use super::spawn_app;
use pushpace::store::{DeadLetter, DeadLetterKind};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letters_are_listed_newest_first_in_pages() {
    let app = spawn_app().await;
    let mut ids = Vec::new();
    for i in 0..5 {
        let campaign = if i % 2 == 0 { "dl-a" } else { "dl-b" };
        let raw = format!("{{\"job\": {i}}}");
        let letter = DeadLetter {
            kind: if i == 4 {
                DeadLetterKind::MalformedJob
            } else {
                DeadLetterKind::Undeliverable
            },
            topic: "pushpace.jobs",
            partition: 1,
            kafka_offset: 100 + i,
            campaign_id: Some(campaign),
            job_id: Some("j-1"),
            device_token: Some("tok"),
            reason: "permanent failure (HTTP 410)",
            raw: raw.as_bytes(),
            key: None,
            device: None,
        };
        ids.push(
            pushpace::store::dead_letters::insert(&app.pool, &letter)
                .await
                .unwrap()
                .unwrap(),
        );
    }
    let big = vec![b'z'; 5000];
    let id_big = pushpace::store::dead_letters::insert(
        &app.pool,
        &DeadLetter {
            kind: DeadLetterKind::MalformedJob,
            topic: "pushpace.jobs",
            partition: 0,
            kafka_offset: 7,
            campaign_id: None,
            job_id: None,
            device_token: None,
            reason: "not JSON",
            raw: &big,
            key: None,
            device: None,
        },
    )
    .await
    .unwrap()
    .unwrap();

    // Dead letters hold device tokens and payloads: the admin token is needed.
    let r = app.get("/api/dead-letters").await;
    assert_eq!(r.status, 401, "{}", r.text);
    assert_eq!(r.headers["www-authenticate"], "Bearer");
    assert!(r.body.get("items").is_none(), "{}", r.text);
    let r = app
        .request(
            reqwest::Method::GET,
            "/api/dead-letters",
            None,
            Some("Bearer not-the-token"),
        )
        .await;
    assert_eq!(r.status, 403, "{}", r.text);
    assert!(!r.text.contains("device_token"), "{}", r.text);
    let r = app.read("/api/dead-letters").await;
    assert_eq!(r.status, 200, "{}", r.text);
    let items = r.body["items"].as_array().unwrap();
    assert_eq!(items.len(), 6);
    assert_eq!(items[0]["id"], id_big);
    assert_eq!(items[0]["raw_len"], 5000);
    assert_eq!(items[0]["raw_truncated"], true);
    assert_eq!(items[0]["raw"].as_str().unwrap().len(), 1024);
    assert!(r.body["next_before"].is_null());

    let r = app.read("/api/dead-letters?campaign=dl-a&limit=2").await;
    let items = r.body["items"].as_array().unwrap();
    let got: Vec<i64> = items.iter().map(|d| d["id"].as_i64().unwrap()).collect();
    assert_eq!(got, [ids[4], ids[2]]);
    assert_eq!(items[0]["kind"], "malformed_job");
    assert_eq!(items[1]["kind"], "undeliverable");
    assert_eq!(items[1]["raw"], "{\"job\": 2}");
    assert_eq!(items[1]["reason"], "permanent failure (HTTP 410)");
    assert_eq!(items[1]["kafka_offset"], 102);
    let next = r.body["next_before"].as_i64().unwrap();
    assert_eq!(next, ids[2]);
    let r = app
        .read(&format!(
            "/api/dead-letters?campaign=dl-a&limit=2&before={next}"
        ))
        .await;
    let got: Vec<i64> = r.body["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["id"].as_i64().unwrap())
        .collect();
    assert_eq!(got, [ids[0]]);
    assert!(r.body["next_before"].is_null());
    assert_eq!(
        app.read("/api/dead-letters?campaign=none").await.body["items"],
        json!([])
    );

    for (q, field) in [
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=ten", "limit"),
        ("before=x", "before"),
        ("campaing=dl-a", "campaing"),
    ] {
        let r = app.read(&format!("/api/dead-letters?{q}")).await;
        assert_eq!(r.status, 422, "{q}: {}", r.text);
        assert_eq!(r.body["field"], field, "{q}");
    }
    app.app.stop().await.unwrap();
}
