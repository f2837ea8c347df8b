//! `GET /api/campaigns` paged by keyset (issue 24): pages, filters, `active_first`, the
//! `x-next-after` header and the refusals, against a real server and a fresh database.

use crate::api::{spawn_app, Reply, TestApp};

fn ids(r: &Reply) -> Vec<String> {
    assert_eq!(r.status, 200, "{}", r.text);
    r.body
        .as_array()
        .unwrap_or_else(|| panic!("an array: {}", r.text))
        .iter()
        .map(|c| c["id"].as_str().unwrap().to_string())
        .collect()
}

fn next_after(r: &Reply) -> Option<String> {
    r.headers
        .get("x-next-after")
        .map(|v| v.to_str().unwrap().to_string())
}

/// `l-01` … `l-25`: active when n % 3 = 0 (8), paused when n % 3 = 1 (9), else done (8).
async fn seed(app: &TestApp) {
    sqlx::query(
        "INSERT INTO campaigns (id, send_rate, algorithm, status) \
         SELECT 'l-' || lpad(n::text, 2, '0'), 10, 'gcra', \
                CASE n % 3 WHEN 0 THEN 'active' WHEN 1 THEN 'paused' ELSE 'done' END \
         FROM generate_series(1, $1::int8) n",
    )
    .bind(25_i64)
    .execute(&app.pool)
    .await
    .unwrap();
}

/// Follows `x-next-after` from `first` to the last page; the pages' ids in order.
async fn walk(app: &TestApp, first: &str) -> Vec<Vec<String>> {
    let mut pages = Vec::new();
    let mut r = app.get(first).await;
    loop {
        pages.push(ids(&r));
        let Some(next) = next_after(&r) else {
            return pages;
        };
        r = app.get(&format!("{first}&after={next}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_list_pages_by_id_filters_by_status_and_says_where_to_go_on() {
    let app = spawn_app().await;
    seed(&app).await;
    let all = app.get("/api/campaigns").await;
    assert_eq!(
        ids(&all).len(),
        25,
        "no parameter: the whole list, as before"
    );
    assert_eq!(next_after(&all), None);
    let pages = walk(&app, "/api/campaigns?limit=10").await;
    let sizes: Vec<usize> = pages.iter().map(Vec::len).collect();
    assert_eq!(sizes, [10, 10, 5]);
    assert_eq!(pages.concat(), ids(&all), "every campaign once, by id");
    // A last page that is exactly full has no next page either.
    let sizes: Vec<usize> = walk(&app, "/api/campaigns?limit=5")
        .await
        .iter()
        .map(Vec::len)
        .collect();
    assert_eq!(sizes, [5; 5]);

    let paused = walk(&app, "/api/campaigns?status=paused&limit=4").await;
    assert_eq!(paused.iter().map(Vec::len).collect::<Vec<_>>(), [4, 4, 1]);
    let paused = paused.concat();
    assert_eq!(paused[0], "l-01");
    assert!(paused.windows(2).all(|w| w[0] < w[1]));
    let r = app.get("/api/campaigns?status=done&after=l-20").await;
    assert_eq!(ids(&r), ["l-23"]);
    assert_eq!(next_after(&r), None, "no limit: the rest of the list");
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn active_first_pages_survive_a_status_change_between_pages() {
    let app = spawn_app().await;
    seed(&app).await;
    let r = app.get("/api/campaigns?order=active_first&limit=3").await;
    assert_eq!(ids(&r), ["l-03", "l-06", "l-09"]);
    assert_eq!(next_after(&r).as_deref(), Some("active:l-09"));
    // The cursor's own campaign is paused before the next page: the page still goes on
    // after it among the active ones, skipping none.
    assert_eq!(app.post("/api/campaigns/l-09/pause").await.status, 200);
    let rest = walk(&app, "/api/campaigns?order=active_first&limit=3").await;
    let rest = rest.concat();
    let active: Vec<&str> = ["l-03", "l-06", "l-12", "l-15", "l-18", "l-21", "l-24"].into();
    assert_eq!(&rest[..7], active.as_slice(), "{rest:?}");
    assert_eq!(rest.len(), 25);
    let r = app
        .get("/api/campaigns?order=active_first&limit=3&after=active:l-09")
        .await;
    assert_eq!(ids(&r), ["l-12", "l-15", "l-18"]);
    let r = app
        .get("/api/campaigns?order=active_first&limit=2&after=active:l-24")
        .await;
    assert_eq!(ids(&r), ["l-01", "l-02"], "then the others, by id");
    assert_eq!(next_after(&r).as_deref(), Some("other:l-02"));
    let r = app
        .get("/api/campaigns?order=active_first&status=paused&limit=20")
        .await;
    assert_eq!(ids(&r).len(), 10, "l-09 is paused now");
    app.app.stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bad_list_parameter_is_a_422_naming_it() {
    let app = spawn_app().await;
    for (query, field) in [
        ("page=2", "page"),
        ("limit=0", "limit"),
        ("limit=1001", "limit"),
        ("limit=many", "limit"),
        ("status=gone", "status"),
        ("order=newest", "order"),
        ("after=a%20b", "after"),
        ("order=active_first&after=l-01", "after"),
    ] {
        let r = app.get(&format!("/api/campaigns?{query}")).await;
        assert_eq!(r.status, 422, "{query}: {}", r.text);
        assert_eq!(r.body["field"], field, "{query}: {}", r.text);
    }
    assert_eq!(app.get("/api/campaigns?limit=1000").await.status, 200);
    app.app.stop().await.unwrap();
}
