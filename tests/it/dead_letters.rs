//! Dead letters and invalid tokens against real PostgreSQL: no byte in a letter can make
//! its write fail, a letter is written once per message and device, retention deletes in
//! bounded statements, and the migration keeps the rows written before it.

use crate::api::{spawn_app, TOKEN};
use crate::helpers::{fresh_database, pg_server, unique_name};
use pushpace::hygiene::{BloomFilter, TokenHygiene, DEFAULT_INVALID_TTL};
use pushpace::store::dead_letters::{
    self, DeadLetter, LISTED_PREFIX_BYTES, MAX_KEY_BYTES, MAX_RAW_BYTES, MAX_REASON_BYTES,
};
use pushpace::store::{self, DeadLetterKind, StoreError};
use sqlx::PgPool;

fn letter<'a>(kind: DeadLetterKind, offset: i64, device: Option<u32>) -> DeadLetter<'a> {
    DeadLetter {
        kind,
        topic: "pushpace.jobs",
        partition: 3,
        kafka_offset: offset,
        campaign_id: Some("dl"),
        job_id: Some("job-1"),
        device_token: device.map(|_| "tok"),
        reason: "permanent failure (HTTP 410)",
        raw: b"{}",
        key: Some(b"dl"),
        device,
    }
}

async fn count(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM dead_letters")
        .fetch_one(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn a_nul_in_text_is_a_data_error_that_is_not_transient() {
    let (pool, _) = fresh_database().await;
    // Bound as it is, without safe_text: PostgreSQL refuses it.
    let err = sqlx::query("SELECT $1::text")
        .bind("job\0id")
        .execute(&pool)
        .await
        .unwrap_err();
    let code = err.as_database_error().and_then(|d| d.code()).unwrap();
    assert_eq!(code, "22021", "{err}");
    let err = StoreError::from(err);
    assert!(!err.is_transient(), "{err}");
    // The same text through safe_text is stored.
    let stored: String = sqlx::query_scalar("SELECT $1::text")
        .bind(store::safe_text("job\0id").as_ref())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(stored, "job\\0id");
}

#[tokio::test]
async fn a_closed_pool_is_final_and_a_refused_connection_is_transient() {
    let (pool, url) = fresh_database().await;
    pool.close().await;
    let err = StoreError::from(sqlx::query("SELECT 1").execute(&pool).await.unwrap_err());
    assert!(!err.is_transient(), "{err}");
    // A port with nothing listening on loopback: connection refused.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    drop(listener);
    let db = url.rsplit('/').next().unwrap();
    let err = store::connect(
        &format!("postgres://postgres@127.0.0.1:{port}/{db}"),
        1,
        std::time::Duration::from_secs(2),
    )
    .await
    .unwrap_err();
    assert!(err.is_transient(), "{err}");
}

#[tokio::test]
async fn the_same_letter_twice_is_one_row() {
    let (pool, _) = fresh_database().await;
    let whole = letter(DeadLetterKind::InvalidJob, 10, None);
    let id = dead_letters::insert(&pool, &whole).await.unwrap();
    assert!(id.is_some());
    assert_eq!(dead_letters::insert(&pool, &whole).await.unwrap(), None);
    // Re-read after a crash, with another reason: still the first letter only.
    let again = DeadLetter {
        reason: "another reason",
        ..whole
    };
    assert_eq!(dead_letters::insert(&pool, &again).await.unwrap(), None);
    assert_eq!(count(&pool).await, 1);

    // Devices of one message: one letter each, once.
    let d0 = letter(DeadLetterKind::Undeliverable, 11, Some(0));
    let d1 = letter(DeadLetterKind::Undeliverable, 11, Some(1));
    assert!(dead_letters::insert(&pool, &d0).await.unwrap().is_some());
    assert_eq!(
        dead_letters::insert_batch(&pool, &[d0, d1, d1])
            .await
            .unwrap(),
        1,
        "only device 1 is new, and only once"
    );
    assert_eq!(
        dead_letters::insert_batch(&pool, &[d0, d1, whole])
            .await
            .unwrap(),
        0
    );
    assert_eq!(dead_letters::insert_batch(&pool, &[]).await.unwrap(), 0);
    // The same offset in another partition or topic is another message.
    let other_partition = DeadLetter {
        partition: 4,
        ..whole
    };
    let other_topic = DeadLetter {
        topic: "other",
        ..whole
    };
    assert_eq!(
        dead_letters::insert_batch(&pool, &[other_partition, other_topic])
            .await
            .unwrap(),
        2
    );
    assert_eq!(count(&pool).await, 5);
    let listed = dead_letters::list(&pool, Some("dl"), None, 100)
        .await
        .unwrap();
    let mut devices: Vec<Option<u32>> = listed
        .iter()
        .filter(|l| l.kafka_offset == 11)
        .map(|l| l.device)
        .collect();
    devices.sort();
    assert_eq!(devices, [Some(0), Some(1)]);
}

#[tokio::test]
async fn nul_bytes_everywhere_and_a_whole_mebibyte_are_stored() {
    let (pool, _) = fresh_database().await;
    let raw: Vec<u8> = (0..MAX_RAW_BYTES).map(|i| (i % 251) as u8).collect();
    let over: Vec<u8> = vec![0; MAX_RAW_BYTES + 100];
    let long_key = vec![0u8; MAX_KEY_BYTES + 5];
    let reason = "bad\0reason ✓\0";
    let letters = [
        DeadLetter {
            kind: DeadLetterKind::MalformedJob,
            topic: "jobs\0topic",
            partition: 0,
            kafka_offset: 1,
            campaign_id: Some("camp\0aign"),
            job_id: Some("job\0id"),
            device_token: None,
            reason,
            raw: &raw,
            key: Some(b"k\0ey"),
            device: None,
        },
        DeadLetter {
            kind: DeadLetterKind::Undeliverable,
            topic: "jobs\0topic",
            partition: 0,
            kafka_offset: 2,
            campaign_id: Some("camp\0aign"),
            job_id: Some("job\0id"),
            device_token: Some("tok\0en"),
            reason,
            raw: &over,
            key: Some(&long_key),
            device: Some(7),
        },
        DeadLetter {
            kind: DeadLetterKind::ExpiredOffset,
            topic: "jobs\0topic",
            partition: 0,
            kafka_offset: 3,
            campaign_id: Some("camp\0aign"),
            job_id: None,
            device_token: None,
            reason: "offset 3 was deleted by retention before it was re-read",
            raw: &[],
            key: None,
            device: None,
        },
    ];
    assert_eq!(
        dead_letters::insert_batch(&pool, &letters).await.unwrap(),
        3
    );
    // One more through the single insert.
    let single = DeadLetter {
        kafka_offset: 4,
        ..letters[0]
    };
    assert!(dead_letters::insert(&pool, &single)
        .await
        .unwrap()
        .is_some());

    let listed = dead_letters::list(&pool, Some("camp\0aign"), None, 10)
        .await
        .unwrap();
    assert_eq!(listed.len(), 4, "the campaign filter is escaped as stored");
    let by_offset = |o: i64| listed.iter().find(|l| l.kafka_offset == o).unwrap();
    let first = by_offset(1);
    assert_eq!(first.topic, "jobs\\0topic");
    assert_eq!(first.campaign_id.as_deref(), Some("camp\\0aign"));
    assert_eq!(first.job_id.as_deref(), Some("job\\0id"));
    assert_eq!(first.reason, "bad\\0reason ✓\\0");
    assert_eq!(first.raw_len, MAX_RAW_BYTES);
    assert_eq!(first.raw_prefix, raw[..LISTED_PREFIX_BYTES]);
    assert_eq!(first.key_prefix.as_deref(), Some(&b"k\0ey"[..]));
    assert_eq!(first.key_len, Some(4));
    assert_eq!(first.device, None);

    let second = by_offset(2);
    assert_eq!(second.kind, DeadLetterKind::Undeliverable);
    assert_eq!(second.device_token.as_deref(), Some("tok\\0en"));
    assert_eq!(second.device, Some(7));
    assert_eq!(second.raw_len, MAX_RAW_BYTES, "cut at 1 MiB");
    assert_eq!(
        second.key_len,
        Some(MAX_KEY_BYTES + 5),
        "length as received"
    );
    assert_eq!(
        second.key_prefix.as_ref().map(Vec::len),
        Some(LISTED_PREFIX_BYTES)
    );
    let third = by_offset(3);
    assert_eq!(third.kind, DeadLetterKind::ExpiredOffset);
    assert_eq!((third.key_prefix.as_ref(), third.key_len), (None, None));

    // The whole message and the kept key are stored byte for byte.
    let (stored_raw, stored_key): (Vec<u8>, Vec<u8>) = sqlx::query_as(
        "SELECT raw, kafka_key FROM dead_letters WHERE kafka_offset = 1 AND partition = 0",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(stored_raw, raw);
    assert_eq!(stored_key, b"k\0ey");
    let key_kept: i32 = sqlx::query_scalar(
        "SELECT octet_length(kafka_key) FROM dead_letters WHERE kafka_offset = 2",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(key_kept as usize, MAX_KEY_BYTES);
}

#[tokio::test]
async fn a_long_reason_is_cut_on_a_character_boundary() {
    let (pool, _) = fresh_database().await;
    // 3,000 two-byte characters and a NUL near the cut.
    let mut reason = "é".repeat(2047);
    reason.push('\0');
    reason.push_str(&"é".repeat(1000));
    let l = DeadLetter {
        reason: &reason,
        ..letter(DeadLetterKind::InvalidJob, 1, None)
    };
    dead_letters::insert(&pool, &l).await.unwrap().unwrap();
    let stored = &dead_letters::list(&pool, None, None, 1).await.unwrap()[0].reason;
    assert!(stored.len() <= MAX_REASON_BYTES, "{}", stored.len());
    // 2,047 × 2 bytes, then the two-byte escape: exactly 4,096.
    assert_eq!(stored.len(), 4096);
    assert!(stored.ends_with("é\\0"));
    assert!(reason.replace('\0', "\\0").starts_with(stored.as_str()));
}

#[tokio::test]
async fn invalid_token_reasons_with_nul_are_stored() {
    let (pool, _) = fresh_database().await;
    let hygiene = TokenHygiene::with_filter(
        pool.clone(),
        BloomFilter::with_rate(100, 0.01).unwrap(),
        DEFAULT_INVALID_TTL,
        &[],
    )
    .await
    .unwrap();
    hygiene
        .record_invalid("tok\0en", "p\0", "410 Gone: \0Unregistered")
        .await
        .unwrap();
    hygiene
        .record_invalid("tok\0en", "p\0", "410 Gone again")
        .await
        .unwrap();
    let reasons: Vec<String> = sqlx::query_scalar("SELECT reason FROM invalid_tokens")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(reasons, ["410 Gone: \\0Unregistered"]);
    let found = hygiene
        .invalid_among(&["tok\0en".to_string(), "other".to_string()], "p\0")
        .await
        .unwrap();
    assert_eq!(found, [0]);
}

#[tokio::test]
async fn old_dead_letters_are_pruned_in_bounded_statements() {
    let (pool, _) = fresh_database().await;
    // Counts the rows of every DELETE statement on dead_letters.
    sqlx::raw_sql(
        "CREATE TABLE delete_log (n bigint NOT NULL); \
         CREATE FUNCTION log_delete() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN INSERT INTO delete_log SELECT count(*) FROM old_rows; RETURN NULL; END $$; \
         CREATE TRIGGER dead_letters_delete_log AFTER DELETE ON dead_letters \
         REFERENCING OLD TABLE AS old_rows FOR EACH STATEMENT EXECUTE FUNCTION log_delete();",
    )
    .execute(&pool)
    .await
    .unwrap();
    const OLD: i64 = 20_005;
    sqlx::query(
        "INSERT INTO dead_letters (kind, topic, partition, kafka_offset, reason, raw, created_at) \
         SELECT 'malformed_job', 't', 0, s, 'old', '', now() - interval '100 days' \
         FROM generate_series(1, $1) AS s",
    )
    .bind(OLD)
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO dead_letters (kind, topic, partition, kafka_offset, reason, raw, created_at) \
         VALUES ('malformed_job', 't', 1, 1, 'middle-aged', '', now() - interval '40 days'), \
                ('malformed_job', 't', 1, 2, 'new', '', now())",
    )
    .execute(&pool)
    .await
    .unwrap();

    // Dead letters kept for 90 days while the rest goes at 30: only the 100-day-old go,
    // and no statement deletes more than 10,000 although the batch allows 50,000.
    let report = store::prune_with_dead_letters(
        &pool,
        chrono::Duration::days(30),
        chrono::Duration::days(90),
        50_000,
    )
    .await
    .unwrap();
    assert_eq!(report.dead_letters, OLD as u64);
    let sizes: Vec<i64> = sqlx::query_scalar("SELECT n FROM delete_log")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(sizes.iter().sum::<i64>(), OLD);
    assert_eq!(sizes.iter().max(), Some(&10_000), "{sizes:?}");
    let left: Vec<String> = sqlx::query_scalar("SELECT reason FROM dead_letters ORDER BY id")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert_eq!(left, ["middle-aged", "new"]);

    // `prune` keeps dead letters as long as the rest; a smaller batch splits further.
    sqlx::query("DELETE FROM delete_log")
        .execute(&pool)
        .await
        .unwrap();
    let report = store::prune(&pool, chrono::Duration::days(30), 1)
        .await
        .unwrap();
    assert_eq!(report.dead_letters, 1);
    let sizes: Vec<i64> = sqlx::query_scalar("SELECT n FROM delete_log")
        .fetch_all(&pool)
        .await
        .unwrap();
    assert!(sizes.iter().all(|&n| n <= 1), "{sizes:?}");
    assert_eq!(count(&pool).await, 1);
    let again = store::prune(&pool, chrono::Duration::days(30), 1)
        .await
        .unwrap();
    assert_eq!(again.dead_letters, 0);
    assert_eq!(
        store::prune_dead_letters_before(&pool, chrono::Utc::now(), 0)
            .await
            .unwrap_err()
            .field(),
        Some("batch")
    );
    assert_eq!(
        store::prune_with_dead_letters(
            &pool,
            chrono::Duration::days(1),
            chrono::Duration::days(-1),
            10
        )
        .await
        .unwrap_err()
        .field(),
        Some("dead_letters_older_than")
    );
}

/// The migration numbers the device letters written before it and drops duplicated
/// whole-message letters, so that the unique index can be built over existing rows.
#[tokio::test]
async fn the_migration_keeps_existing_rows() {
    let url = format!("{}/{}", pg_server(), unique_name("pushpace_test"));
    store::ensure_database(&url).await.unwrap();
    let pool = store::connect(&url, 2, std::time::Duration::from_secs(10))
        .await
        .unwrap();
    // The migrations before this one, from a copy of the directory.
    let dir = tempfile::tempdir().unwrap();
    let source = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("migrations");
    for entry in std::fs::read_dir(&source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        if name.as_str() < "20261125000100" {
            std::fs::copy(&path, dir.path().join(&name)).unwrap();
        }
    }
    sqlx::migrate::Migrator::new(dir.path())
        .await
        .unwrap()
        .run(&pool)
        .await
        .unwrap();
    sqlx::query(
        "INSERT INTO dead_letters (kind, topic, partition, kafka_offset, device_token, reason, raw) \
         VALUES ('malformed_job', 't', 0, 5, NULL, 'first', ''), \
                ('malformed_job', 't', 0, 5, NULL, 'duplicate', ''), \
                ('invalid_job', 't', 1, 5, NULL, 'other partition', ''), \
                ('undeliverable', 't', 0, 6, 'a', 'd', ''), \
                ('undeliverable', 't', 0, 6, 'b', 'd', ''), \
                ('undeliverable', 't', 0, 6, 'a', 'd again', ''), \
                ('undeliverable', 't', 0, 7, 'c', 'd', '')",
    )
    .execute(&pool)
    .await
    .unwrap();
    store::migrate(&pool).await.unwrap();
    /// partition, offset, device token, device, reason
    type OldRow = (i32, i64, Option<String>, Option<i32>, String);
    let rows: Vec<OldRow> = sqlx::query_as(
        "SELECT partition, kafka_offset, device_token, device, reason FROM dead_letters ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let rows: Vec<_> = rows
        .iter()
        .map(|(p, o, t, d, r)| (*p, *o, t.as_deref(), *d, r.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            (0, 5, None, None, "first"),
            (1, 5, None, None, "other partition"),
            (0, 6, Some("a"), Some(0), "d"),
            (0, 6, Some("b"), Some(1), "d"),
            (0, 6, Some("a"), Some(2), "d again"),
            (0, 7, Some("c"), Some(0), "d"),
        ]
    );
    // And the index now holds: the first letter again is skipped.
    let again = DeadLetter {
        topic: "t",
        partition: 0,
        ..letter(DeadLetterKind::MalformedJob, 5, None)
    };
    assert_eq!(dead_letters::insert(&pool, &again).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_shows_prefixes_lengths_key_and_device() {
    let app = spawn_app().await;
    let raw = vec![b'r'; 3000];
    let key = [b'k', 0, 0xff, b'\\'];
    let l = DeadLetter {
        raw: &raw,
        key: Some(&key),
        device_token: Some("t\0k"),
        ..letter(DeadLetterKind::Undeliverable, 9, Some(4))
    };
    dead_letters::insert(&app.pool, &l).await.unwrap().unwrap();
    // The token is sent so that this test holds whether or not the route requires it.
    let auth = format!("Bearer {TOKEN}");
    let r = app
        .request(reqwest::Method::GET, "/api/dead-letters", None, Some(&auth))
        .await;
    assert_eq!(r.status, 200, "{}", r.text);
    let item = &r.body["items"][0];
    assert_eq!(item["raw_len"], 3000);
    assert_eq!(item["raw_truncated"], true);
    assert_eq!(item["raw"].as_str().unwrap().len(), LISTED_PREFIX_BYTES);
    assert_eq!(item["key"], "k\\x00\\xff\\\\");
    assert_eq!(item["key_len"], 4);
    assert_eq!(item["key_truncated"], false);
    assert_eq!(item["device"], 4);
    assert_eq!(item["device_token"], "t\\0k");
    app.app.stop().await.unwrap();
}

/// A job's replay template goes once no letter of its message is left (and not while a
/// letter may still be on its way: only templates over an hour old).
#[tokio::test]
async fn replay_templates_without_letters_are_pruned() {
    let (pool, _) = fresh_database().await;
    let l = letter(DeadLetterKind::Undeliverable, 1, Some(0));
    dead_letters::insert(&pool, &l).await.unwrap().unwrap();
    for (offset, age) in [(1i64, "2 hours"), (2, "2 hours"), (3, "1 minute")] {
        sqlx::query(
            "INSERT INTO dead_letter_jobs (topic, partition, kafka_offset, job, created_at) \
             VALUES ('pushpace.jobs', 3, $1, '{}', now() - $2::interval)",
        )
        .bind(offset)
        .bind(age)
        .execute(&pool)
        .await
        .unwrap();
    }
    let report = store::prune_with_dead_letters(
        &pool,
        chrono::Duration::days(2),
        chrono::Duration::days(2),
        100,
    )
    .await
    .unwrap();
    assert_eq!(report.letter_jobs_deleted, 1);
    let left: Vec<i64> =
        sqlx::query_scalar("SELECT kafka_offset FROM dead_letter_jobs ORDER BY kafka_offset")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(left, [1, 3], "kept: the one with a letter, the recent one");
}
