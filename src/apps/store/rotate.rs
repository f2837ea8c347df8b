//! `pushpace apps rotate-master-key`: every row not yet under the keyring's current key
//! is opened with the key it names and sealed again under the current one.
//!
//! Safe while workers run: each row is its own short statement, written only if it is
//! still the row that was read (same key id and nonce), so a PUT that lands in between
//! wins and is not overwritten with the old secret. A worker that still holds the old
//! key opens either version, and one that holds only the new key opens the re-sealed
//! rows. Idempotent: a second run finds nothing to do. A row that does not open is left
//! as it is and reported (with a missing old key file, the run can simply be repeated);
//! its status is not touched: halting is for the process that needs the secret.

use super::{as_actor, SealedRow};
use crate::apps::crypto::Keyring;
use crate::apps::{AppKind, AppsError};

/// Rows read per round.
const BATCH: i64 = 200;

/// What a rotation did.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct RotateReport {
    /// The key every re-sealed row is now under.
    pub current_key_id: String,
    /// Rows sealed again under the current key.
    pub resealed: u64,
    /// Rows a concurrent change rewrote between read and write (now current anyway).
    pub skipped: u64,
    /// Rows that did not open: `(app, kind, reason)`; no secret in the reason.
    pub failed: Vec<(String, AppKind, String)>,
}

#[derive(sqlx::FromRow)]
struct Candidate {
    app_id: String,
    kind: String,
    #[sqlx(flatten)]
    row: SealedRow,
}

/// Re-seals every row not under `keyring`'s current key. `actor` names the change in
/// `app_events` (each re-sealed row records its `master_key_id` change).
pub async fn rotate_master_key(
    pool: &sqlx::PgPool,
    keyring: &Keyring,
    actor: Option<&str>,
) -> Result<RotateReport, AppsError> {
    let current = keyring.current_id();
    let mut report = RotateReport {
        current_key_id: current.to_string(),
        ..RotateReport::default()
    };
    // Keyset over (app_id, kind): a row that fails stays behind the cursor, so the
    // loop ends even when some rows never open.
    let mut after = (String::new(), String::new());
    loop {
        let batch: Vec<Candidate> = sqlx::query_as(
            "SELECT app_id, kind, master_key_id, nonce, ciphertext, fingerprint, settings, \
                    status, halted_reason \
             FROM app_credentials \
             WHERE master_key_id <> $1 AND (app_id, kind) > ($2, $3) \
             ORDER BY app_id, kind LIMIT $4",
        )
        .bind(current)
        .bind(&after.0)
        .bind(&after.1)
        .bind(BATCH)
        .fetch_all(pool)
        .await?;
        let Some(last) = batch.last() else {
            return Ok(report);
        };
        after = (last.app_id.clone(), last.kind.clone());
        for c in &batch {
            reseal_one(pool, keyring, actor, c, &mut report).await?;
        }
    }
}

async fn reseal_one(
    pool: &sqlx::PgPool,
    keyring: &Keyring,
    actor: Option<&str>,
    c: &Candidate,
    report: &mut RotateReport,
) -> Result<(), AppsError> {
    let Some(kind) = AppKind::parse(&c.kind) else {
        return Ok(()); // the table's CHECK allows only the known kinds
    };
    let sealed = match keyring.reseal(&c.app_id, kind, &c.row.sealed()) {
        Ok(s) => s,
        Err(e) => {
            let reason = format!("the sealed secret {e}");
            tracing::warn!(app = %c.app_id, kind = %kind, reason = %reason,
                "app credentials not re-sealed");
            report.failed.push((c.app_id.clone(), kind, reason));
            return Ok(());
        }
    };
    let mut tx = as_actor(pool, actor).await?;
    let written = sqlx::query(
        "UPDATE app_credentials SET master_key_id = $3, nonce = $4, ciphertext = $5 \
         WHERE app_id = $1 AND kind = $2 AND master_key_id = $6 AND nonce = $7",
    )
    .bind(&c.app_id)
    .bind(kind.as_str())
    .bind(&sealed.master_key_id)
    .bind(&sealed.nonce)
    .bind(&sealed.ciphertext)
    .bind(&c.row.master_key_id)
    .bind(&c.row.nonce)
    .execute(&mut *tx)
    .await?
    .rows_affected();
    tx.commit().await?;
    if written == 1 {
        report.resealed += 1;
    } else {
        report.skipped += 1;
    }
    Ok(())
}
