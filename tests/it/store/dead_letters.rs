//! Dead letters: stored with their raw bytes (truncated at the limit), paged newest first.

use crate::helpers::fresh_database;
use pushpace::store::dead_letters::{self, DeadLetter, MAX_RAW_BYTES};
use pushpace::store::DeadLetterKind;

#[tokio::test]
async fn dead_letters_are_paged_newest_first() {
    let (pool, _) = fresh_database().await;
    let raw = b"{\"job_id\": 1}".to_vec();
    let mut ids = Vec::new();
    for i in 0..25 {
        let token = format!("tok-{i}");
        let letter = DeadLetter {
            kind: DeadLetterKind::Undeliverable,
            topic: "pushpace.jobs",
            partition: 2,
            kafka_offset: 100 + i,
            campaign_id: Some("dl"),
            job_id: Some("job-dl"),
            device_token: Some(&token),
            reason: "410 Gone: the token is no longer registered",
            raw: &raw,
            key: None,
            device: None,
        };
        ids.push(dead_letters::insert(&pool, &letter).await.unwrap().unwrap());
    }
    let huge = vec![b'x'; MAX_RAW_BYTES + 10];
    for i in 0..5 {
        let letter = DeadLetter {
            kind: DeadLetterKind::MalformedJob,
            topic: "pushpace.jobs",
            partition: 0,
            kafka_offset: i,
            campaign_id: None,
            job_id: None,
            device_token: None,
            reason: "not valid JSON: expected value at line 1 column 1",
            raw: &huge,
            key: None,
            device: None,
        };
        dead_letters::insert(&pool, &letter).await.unwrap();
    }

    let mut seen = Vec::new();
    let mut before = None;
    let mut pages = 0;
    loop {
        let page = dead_letters::list(&pool, Some("dl"), before, 10)
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        pages += 1;
        assert!(page.len() <= 10);
        assert!(page.windows(2).all(|w| w[0].id > w[1].id), "newest first");
        assert!(page.iter().all(|d| d.campaign_id.as_deref() == Some("dl")));
        before = page.last().map(|d| d.id);
        seen.extend(page);
    }
    assert_eq!(pages, 3);
    let mut seen_ids: Vec<i64> = seen.iter().map(|d| d.id).collect();
    seen_ids.reverse();
    assert_eq!(seen_ids, ids);
    let first = seen.last().unwrap();
    assert_eq!(
        (
            first.kind,
            first.topic.as_str(),
            first.partition,
            first.kafka_offset,
            first.device_token.as_deref(),
            first.raw_prefix.as_slice()
        ),
        (
            DeadLetterKind::Undeliverable,
            "pushpace.jobs",
            2,
            100,
            Some("tok-0"),
            raw.as_slice()
        )
    );
    let all = dead_letters::list(&pool, None, None, 1000).await.unwrap();
    assert_eq!(all.len(), 30);
    let malformed = &all[0];
    assert_eq!(malformed.kind, DeadLetterKind::MalformedJob);
    assert_eq!(
        malformed.raw_len, MAX_RAW_BYTES,
        "raw is truncated at 1 MiB"
    );
    assert_eq!(malformed.campaign_id, None);
}
