//! The master-key rotation against the real PostgreSQL: rows sealed under an old key
//! are re-sealed under the current one, a second run does nothing, a run without the
//! old key changes nothing, and PUTs racing a rotation keep their new secrets.

use super::{parse, webpush_body, Secrets};
use crate::helpers::fresh_database;
use pushpace::apps::store::{self, KindStatus};
use pushpace::apps::{AppKind, Keyring, MasterKey};
use secrecy::ExposeSecret;

fn ring_of(current: &MasterKey, old: &[&MasterKey]) -> Keyring {
    Keyring::new(current.clone(), old.iter().map(|k| (*k).clone()).collect()).unwrap()
}

async fn key_ids(pool: &sqlx::PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT DISTINCT master_key_id FROM app_credentials ORDER BY 1")
        .fetch_all(pool)
        .await
        .unwrap()
}

#[tokio::test]
async fn rotation_reseals_under_the_new_key_and_is_idempotent() {
    let (pool, _) = fresh_database().await;
    let (k1, k2) = (MasterKey::generate(), MasterKey::generate());
    let before = ring_of(&k1, &[]);
    let secrets: Vec<Secrets> = (0..3).map(|_| Secrets::new()).collect();
    for (i, s) in secrets.iter().enumerate() {
        let body = s.body(&format!("sa{i}@example.com"));
        store::put(&pool, Some(&before), &format!("r-{i}"), &parse(&body), None)
            .await
            .unwrap();
    }
    assert_eq!(key_ids(&pool).await, [k1.id()]);

    // Without the old key, nothing opens and nothing is changed.
    let lost = ring_of(&k2, &[]);
    let report = store::rotate_master_key(&pool, &lost, Some("ops"))
        .await
        .unwrap();
    assert_eq!((report.resealed, report.failed.len()), (0, 9), "{report:?}");
    assert!(report.failed[0].2.contains(k1.id()), "{report:?}");
    assert_eq!(key_ids(&pool).await, [k1.id()]);
    let app = store::get(&pool, "r-0").await.unwrap().unwrap();
    assert_eq!(app.status, KindStatus::Active, "rotation does not halt");

    let after = ring_of(&k2, &[&k1]);
    let report = store::rotate_master_key(&pool, &after, Some("ops"))
        .await
        .unwrap();
    assert_eq!(report.current_key_id, k2.id());
    assert_eq!((report.resealed, report.skipped), (9, 0), "{report:?}");
    assert!(report.failed.is_empty(), "{report:?}");
    assert_eq!(key_ids(&pool).await, [k2.id()]);
    let again = store::rotate_master_key(&pool, &after, None).await.unwrap();
    assert_eq!((again.resealed, again.failed.len()), (0, 0), "{again:?}");

    // The old key is no longer needed: every row opens under the new one alone.
    let only_new = ring_of(&k2, &[]);
    for (i, s) in secrets.iter().enumerate() {
        let id = format!("r-{i}");
        let apns = store::open(&pool, Some(&only_new), &id, AppKind::Apns)
            .await
            .unwrap();
        assert_eq!(apns.secret().expose_secret(), s.apns_key.trim());
        for kind in [AppKind::Fcm, AppKind::WebPush] {
            store::open(&pool, Some(&only_new), &id, kind)
                .await
                .unwrap();
        }
    }
    // Each re-sealed row recorded its key change, by the actor, and nothing else.
    let events: Vec<(String, Option<String>, Option<String>)> = sqlx::query_as(
        "SELECT field, old_value, new_value FROM app_events WHERE actor = 'ops' ORDER BY id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(events.len(), 9, "{events:?}");
    for (field, old, new) in &events {
        assert_eq!(field, "master_key_id");
        assert_eq!(old.as_deref(), Some(k1.id()));
        assert_eq!(new.as_deref(), Some(k2.id()));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_racing_a_rotation_keep_their_new_secrets() {
    let (pool, _) = fresh_database().await;
    let (k1, k2) = (MasterKey::generate(), MasterKey::generate());
    let before = ring_of(&k1, &[]);
    const APPS: usize = 60;
    for i in 0..APPS {
        store::put(
            &pool,
            Some(&before),
            &format!("w-{i:02}"),
            &parse(&webpush_body()),
            None,
        )
        .await
        .unwrap();
    }
    let after = ring_of(&k2, &[&k1]);
    // New keys for every app, put under the new ring while the rotation runs.
    let fresh: Vec<serde_json::Value> = (0..APPS).map(|_| webpush_body()).collect();
    let rotation = {
        let (pool, ring) = (pool.clone(), after.clone());
        tokio::spawn(async move { store::rotate_master_key(&pool, &ring, None).await })
    };
    let mut expected = Vec::new();
    for (i, body) in fresh.iter().enumerate() {
        let (app, _) = store::put(
            &pool,
            Some(&after),
            &format!("w-{i:02}"),
            &parse(body),
            None,
        )
        .await
        .unwrap();
        expected.push(app.credentials[&AppKind::WebPush].fingerprint.clone());
    }
    let report = rotation.await.unwrap().unwrap();
    assert!(report.failed.is_empty(), "{report:?}");
    assert!(
        report.resealed + report.skipped <= APPS as u64,
        "{report:?}"
    );
    // Whatever interleaving happened: every row is under the new key, and opens to the
    // key put last (a rotation that wrote back an old secret would not match it).
    assert_eq!(key_ids(&pool).await, [k2.id()]);
    let only_new = ring_of(&k2, &[]);
    for (i, fingerprint) in expected.iter().enumerate() {
        let c = store::open(
            &pool,
            Some(&only_new),
            &format!("w-{i:02}"),
            AppKind::WebPush,
        )
        .await
        .unwrap();
        assert_eq!(&c.fingerprint(), fingerprint);
    }
}
