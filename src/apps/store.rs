//! The registry in PostgreSQL: `apps`, `app_credentials` (secrets sealed, see
//! [`super::crypto`]) and `app_events` (written by trigger, so no writer can forget it).
//!
//! Every statement binds its values. Changes run in a transaction that names the actor
//! for `app_events` (`pushpace.actor`, as for campaign events). Reads never open a
//! secret: only [`open`] does, for use, and a row that does not open (altered, moved,
//! sealed under a key this process lacks, or no longer valid) is marked `halted` with the
//! reason instead of failing anything else.

mod rotate;

pub use rotate::{rotate_master_key, RotateReport};

use super::crypto::{Keyring, Sealed};
use super::model::Credentials;
use super::{AppInput, AppKind, AppsError, FieldError};
use chrono::{DateTime, Utc};
use secrecy::{ExposeSecret, SecretString};
use sqlx::{PgPool, Postgres, Transaction};
use std::collections::BTreeMap;

/// The largest page of [`page`].
pub const MAX_PAGE: i64 = 1000;

/// A kind's status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum KindStatus {
    Active,
    Disabled,
    /// Its credentials failed (they did not open, or a provider refused them); see
    /// `halted_reason`. Ends with enable or a new PUT.
    Halted,
}

impl KindStatus {
    fn parse(s: &str) -> KindStatus {
        match s {
            "disabled" => KindStatus::Disabled,
            "halted" => KindStatus::Halted,
            _ => KindStatus::Active,
        }
    }
}

/// One kind of an app as the API shows it: no secret, only its fingerprint.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct KindView {
    pub fingerprint: String,
    pub status: KindStatus,
    pub halted_reason: Option<String>,
    /// The master key that sealed it.
    pub master_key_id: String,
    /// The non-secret settings (ids, topic, environment, limits…).
    pub settings: serde_json::Value,
    pub updated_at: DateTime<Utc>,
}

/// An app as the API shows it.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct AppView {
    pub id: String,
    /// `halted` if a kind is halted, else `disabled` if every kind is, else `active`.
    pub status: KindStatus,
    pub created_at: DateTime<Utc>,
    pub updated_at: DateTime<Utc>,
    pub credentials: BTreeMap<AppKind, KindView>,
}

#[derive(sqlx::FromRow)]
struct Row {
    id: String,
    created_at: DateTime<Utc>,
    updated_at: DateTime<Utc>,
    kind: Option<String>,
    master_key_id: Option<String>,
    fingerprint: Option<String>,
    settings: Option<serde_json::Value>,
    status: Option<String>,
    halted_reason: Option<String>,
    kind_updated_at: Option<DateTime<Utc>>,
}

/// The columns [`Row`] reads, from `apps a LEFT JOIN app_credentials c`.
const COLUMNS: &str = "a.id, a.created_at, a.updated_at, c.kind, c.master_key_id, \
     c.fingerprint, c.settings, c.status, c.halted_reason, c.updated_at AS kind_updated_at";

/// Groups rows ordered by app id into apps.
fn group(rows: Vec<Row>) -> Vec<AppView> {
    let mut out: Vec<AppView> = Vec::new();
    for r in rows {
        if out.last().is_none_or(|a| a.id != r.id) {
            out.push(AppView {
                id: r.id.clone(),
                status: KindStatus::Active,
                created_at: r.created_at,
                updated_at: r.updated_at,
                credentials: BTreeMap::new(),
            });
        }
        let app = out.last_mut().expect("pushed above");
        let Some(kind) = r.kind.as_deref().and_then(AppKind::parse) else {
            continue;
        };
        app.credentials.insert(
            kind,
            KindView {
                fingerprint: r.fingerprint.unwrap_or_default(),
                status: KindStatus::parse(r.status.as_deref().unwrap_or_default()),
                halted_reason: r.halted_reason,
                master_key_id: r.master_key_id.unwrap_or_default(),
                settings: r.settings.unwrap_or_default(),
                updated_at: r.kind_updated_at.unwrap_or(r.updated_at),
            },
        );
    }
    for app in &mut out {
        let statuses = || app.credentials.values().map(|k| k.status);
        app.status = if statuses().any(|s| s == KindStatus::Halted) {
            KindStatus::Halted
        } else if statuses().next().is_some() && statuses().all(|s| s == KindStatus::Disabled) {
            KindStatus::Disabled
        } else {
            KindStatus::Active
        };
    }
    out
}

/// Checks an app id with the job format's rule, as field `id`.
pub fn check_id(id: &str) -> Result<(), FieldError> {
    crate::job::check_id("id", id).map_err(|e| match e {
        crate::job::JobError::Field { problem, .. } => FieldError::new("id", problem),
        other => FieldError::new("id", other.to_string()),
    })
}

/// A transaction whose `app_events` rows name `actor` (else `worker`).
async fn as_actor(
    pool: &PgPool,
    actor: Option<&str>,
) -> Result<Transaction<'static, Postgres>, AppsError> {
    let mut tx = pool.begin().await?;
    if let Some(actor) = actor {
        crate::store::campaigns::validate_actor(actor).map_err(|e| match e {
            crate::store::StoreError::Invalid { reason, .. } => FieldError::new("actor", reason),
            other => FieldError::new("actor", other.to_string()),
        })?;
        sqlx::query("SELECT set_config('pushpace.actor', $1, true)")
            .bind(actor)
            .execute(&mut *tx)
            .await?;
    }
    Ok(tx)
}

/// Creates or replaces an app: its kinds become exactly those given, each sealed under
/// the keyring's current key. A replaced kind keeps `disabled` if it was, and a halt
/// ends (new credentials are the fix); a new kind starts `disabled` when every kind the
/// app had was. Returns the app and whether it was created.
pub async fn put(
    pool: &PgPool,
    keyring: Option<&Keyring>,
    id: &str,
    input: &AppInput,
    actor: Option<&str>,
) -> Result<(AppView, bool), AppsError> {
    check_id(id)?;
    let keyring = keyring.ok_or(AppsError::NoMasterKey)?;
    let mut tx = as_actor(pool, actor).await?;
    let created = sqlx::query("INSERT INTO apps (id) VALUES ($1) ON CONFLICT (id) DO NOTHING")
        .bind(id)
        .execute(&mut *tx)
        .await?
        .rows_affected()
        == 1;
    // Serialises concurrent PUTs of one app.
    sqlx::query("SELECT id FROM apps WHERE id = $1 FOR UPDATE")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    let all_disabled: Option<bool> = sqlx::query_scalar(
        "SELECT bool_and(status = 'disabled') FROM app_credentials WHERE app_id = $1",
    )
    .bind(id)
    .fetch_one(&mut *tx)
    .await?;
    let kinds: Vec<&str> = input.kinds().map(|c| c.kind().as_str()).collect();
    sqlx::query("DELETE FROM app_credentials WHERE app_id = $1 AND NOT (kind = ANY($2))")
        .bind(id)
        .bind(&kinds)
        .execute(&mut *tx)
        .await?;
    let new_status = if all_disabled == Some(true) {
        "disabled"
    } else {
        "active"
    };
    for creds in input.kinds() {
        let sealed = keyring.seal(id, creds.kind(), creds.secret().expose_secret().as_bytes());
        sqlx::query(
            "INSERT INTO app_credentials \
                 (app_id, kind, master_key_id, nonce, ciphertext, fingerprint, settings, status) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8) \
             ON CONFLICT (app_id, kind) DO UPDATE SET \
                 master_key_id = EXCLUDED.master_key_id, nonce = EXCLUDED.nonce, \
                 ciphertext = EXCLUDED.ciphertext, fingerprint = EXCLUDED.fingerprint, \
                 settings = EXCLUDED.settings, \
                 status = CASE WHEN app_credentials.status = 'disabled' \
                               THEN 'disabled' ELSE 'active' END, \
                 halted_reason = NULL",
        )
        .bind(id)
        .bind(creds.kind().as_str())
        .bind(&sealed.master_key_id)
        .bind(&sealed.nonce)
        .bind(&sealed.ciphertext)
        .bind(creds.fingerprint())
        .bind(creds.settings_json())
        .bind(new_status)
        .execute(&mut *tx)
        .await?;
    }
    tx.commit().await?;
    let app = get(pool, id)
        .await?
        .ok_or_else(|| AppsError::NotFound(id.to_string()))?;
    Ok((app, created))
}

/// One app, without secrets.
pub async fn get(pool: &PgPool, id: &str) -> Result<Option<AppView>, AppsError> {
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "SELECT {COLUMNS} FROM apps a LEFT JOIN app_credentials c ON c.app_id = a.id \
         WHERE a.id = $1 ORDER BY c.kind"
    ))
    .bind(id)
    .fetch_all(pool)
    .await?;
    Ok(group(rows).pop())
}

/// A page of apps and where the next one starts (`None`: this is the last).
#[derive(Debug, Clone, PartialEq)]
pub struct Page {
    pub items: Vec<AppView>,
    pub next: Option<String>,
}

/// Apps by id after `after`, at most `limit` (1–[`MAX_PAGE`]; `None`: all). The page
/// is picked first and only its apps' credentials are joined, so a page costs the same
/// with 100 or 100,000 apps; one row more than asked says whether another page follows.
pub async fn page(
    pool: &PgPool,
    limit: Option<i64>,
    after: Option<&str>,
) -> Result<Page, AppsError> {
    if let Some(n) = limit.filter(|n| !(1..=MAX_PAGE).contains(n)) {
        return Err(FieldError::new("limit", format!("must be 1 to {MAX_PAGE}, got {n}")).into());
    }
    if let Some(a) = after {
        check_id(a).map_err(|e| FieldError::new("after", e.reason))?;
    }
    // Two fixed statements, so that each gets a plan that walks the primary key.
    let filter = if after.is_some() {
        "WHERE id > $1"
    } else {
        "WHERE $1::text IS NULL"
    };
    let rows: Vec<Row> = sqlx::query_as(&format!(
        "WITH p AS (SELECT id FROM apps {filter} ORDER BY id LIMIT $2) \
         SELECT {COLUMNS} FROM p JOIN apps a ON a.id = p.id \
         LEFT JOIN app_credentials c ON c.app_id = a.id ORDER BY a.id, c.kind"
    ))
    .bind(after)
    .bind(limit.map(|n| n + 1))
    .fetch_all(pool)
    .await?;
    let mut items = group(rows);
    let more = limit.is_some_and(|n| items.len() as i64 > n);
    if more {
        items.pop();
    }
    let next = more.then(|| items.last().map(|a| a.id.clone())).flatten();
    Ok(Page { items, next })
}

/// Locks app `id`'s row for the rest of `tx`; [`AppsError::NotFound`] if there is none.
async fn lock_app(tx: &mut Transaction<'_, Postgres>, id: &str) -> Result<(), AppsError> {
    let found: Option<String> = sqlx::query_scalar("SELECT id FROM apps WHERE id = $1 FOR UPDATE")
        .bind(id)
        .fetch_optional(&mut **tx)
        .await?;
    match found {
        Some(_) => Ok(()),
        None => Err(AppsError::NotFound(id.to_string())),
    }
}

/// Disables (`enable` false) or enables every kind of an app. Enabling also ends a
/// halt: the operator says the credentials are fixed.
pub async fn set_enabled(
    pool: &PgPool,
    id: &str,
    enable: bool,
    actor: Option<&str>,
) -> Result<AppView, AppsError> {
    check_id(id)?;
    let mut tx = as_actor(pool, actor).await?;
    lock_app(&mut tx, id).await?;
    let status = if enable { "active" } else { "disabled" };
    sqlx::query(
        "UPDATE app_credentials SET status = $2, halted_reason = NULL \
         WHERE app_id = $1 AND status <> $2",
    )
    .bind(id)
    .bind(status)
    .execute(&mut *tx)
    .await?;
    tx.commit().await?;
    get(pool, id)
        .await?
        .ok_or_else(|| AppsError::NotFound(id.to_string()))
}

/// The campaigns that still send through `id`: the database's
/// `app_sending_campaigns(app)`, from what every worker published in the last seconds
/// (migration 20261207000100_apps_send.sql).
pub async fn sending_campaigns(ex: impl sqlx::PgExecutor<'_>, id: &str) -> Result<i64, AppsError> {
    Ok(sqlx::query_scalar("SELECT app_sending_campaigns($1)")
        .bind(id)
        .fetch_one(ex)
        .await?)
}

/// The campaigns each app of `ids` sends through now, by app id, sorted: every
/// worker's `worker_campaigns` rows naming it, published within
/// [`crate::store::worker_campaigns::FRESH_S`]. One statement for a whole page of apps;
/// an app with none is absent.
pub async fn campaigns_by_app(
    pool: &PgPool,
    ids: &[&str],
) -> Result<BTreeMap<String, Vec<String>>, AppsError> {
    let rows: Vec<(String, Vec<String>)> = sqlx::query_as(
        "SELECT app_id, array_agg(DISTINCT campaign_id ORDER BY campaign_id) \
         FROM worker_campaigns \
         WHERE app_id = ANY($1) AND updated_at > now() - make_interval(secs => $2) \
         GROUP BY app_id",
    )
    .bind(ids)
    .bind(crate::store::worker_campaigns::FRESH_S)
    .fetch_all(pool)
    .await?;
    Ok(rows.into_iter().collect())
}

/// Deletes an app and its credentials; refused ([`AppsError::InUse`]) while campaigns
/// still send through it, unless `force`. Returns how many campaigns did.
pub async fn delete(
    pool: &PgPool,
    id: &str,
    force: bool,
    actor: Option<&str>,
) -> Result<i64, AppsError> {
    check_id(id)?;
    let mut tx = as_actor(pool, actor).await?;
    lock_app(&mut tx, id).await?;
    let campaigns = sending_campaigns(&mut *tx, id).await?;
    if campaigns > 0 && !force {
        return Err(AppsError::InUse {
            app: id.to_string(),
            campaigns,
        });
    }
    sqlx::query("DELETE FROM apps WHERE id = $1")
        .bind(id)
        .execute(&mut *tx)
        .await?;
    tx.commit().await?;
    Ok(campaigns)
}

#[derive(sqlx::FromRow)]
struct SealedRow {
    master_key_id: String,
    nonce: Vec<u8>,
    ciphertext: Vec<u8>,
    fingerprint: String,
    settings: serde_json::Value,
    status: String,
    halted_reason: Option<String>,
}

impl SealedRow {
    fn sealed(&self) -> Sealed {
        Sealed {
            master_key_id: self.master_key_id.clone(),
            nonce: self.nonce.clone(),
            ciphertext: self.ciphertext.clone(),
        }
    }
}

/// Opens a sealed row and reads it back into credentials, checked against the stored
/// fingerprint. The error is the halt reason (no secret in it).
fn unseal(
    keyring: &Keyring,
    id: &str,
    kind: AppKind,
    row: &SealedRow,
) -> Result<Credentials, String> {
    let plain = keyring
        .open(id, kind, &row.sealed())
        .map_err(|e| format!("the sealed secret {e}"))?;
    let text = std::str::from_utf8(&plain)
        .map_err(|_| "the sealed secret is not UTF-8 text".to_string())?;
    let creds = Credentials::from_stored(kind, &row.settings, SecretString::from(text.to_string()))
        .map_err(|e| format!("the stored credentials no longer check: {e}"))?;
    if creds.fingerprint() != row.fingerprint {
        return Err("the sealed secret does not match the stored fingerprint".into());
    }
    Ok(creds)
}

/// Marks `id`'s `kind` halted because a provider refused the credentials with
/// `fingerprint`: only while they are still the ones installed and active (a PUT or a
/// disable since then stands). Returns whether it halted them.
pub async fn halt_refused(
    pool: &PgPool,
    id: &str,
    kind: AppKind,
    fingerprint: &str,
    reason: &str,
) -> Result<bool, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE app_credentials SET status = 'halted', halted_reason = $3 \
         WHERE app_id = $1 AND kind = $2 AND fingerprint = $4 AND status = 'active'",
    )
    .bind(id)
    .bind(kind.as_str())
    .bind(reason)
    .bind(fingerprint)
    .execute(pool)
    .await?;
    Ok(done.rows_affected() > 0)
}

/// Marks `id`'s `kind` halted with `reason`, if the row is still the one that failed
/// (a PUT in between replaced it, and is not halted for the old one's fault).
async fn halt(
    ex: impl sqlx::PgExecutor<'_>,
    id: &str,
    kind: AppKind,
    row: &SealedRow,
    reason: &str,
) -> Result<(), sqlx::Error> {
    sqlx::query(
        "UPDATE app_credentials SET status = 'halted', halted_reason = $3 \
         WHERE app_id = $1 AND kind = $2 AND master_key_id = $4 AND nonce = $5",
    )
    .bind(id)
    .bind(kind.as_str())
    .bind(reason)
    .bind(&row.master_key_id)
    .bind(&row.nonce)
    .execute(ex)
    .await?;
    Ok(())
}

/// The credentials of `id`'s `kind`, opened for use. A row that does not open or read
/// back (altered, moved from another app, sealed under a master key this process does
/// not hold, or no longer valid) is marked `halted` with the reason and answered with
/// [`AppsError::Halted`]; a halted or disabled kind is not opened.
pub async fn open(
    pool: &PgPool,
    keyring: Option<&Keyring>,
    id: &str,
    kind: AppKind,
) -> Result<Credentials, AppsError> {
    let row: Option<SealedRow> = sqlx::query_as(
        "SELECT master_key_id, nonce, ciphertext, fingerprint, settings, status, halted_reason \
         FROM app_credentials WHERE app_id = $1 AND kind = $2",
    )
    .bind(id)
    .bind(kind.as_str())
    .fetch_optional(pool)
    .await?;
    let Some(row) = row else {
        return Err(match get(pool, id).await? {
            Some(_) => AppsError::NoCredentials {
                app: id.to_string(),
                kind,
            },
            None => AppsError::NotFound(id.to_string()),
        });
    };
    let halted = |reason: String| AppsError::Halted {
        app: id.to_string(),
        kind,
        reason,
    };
    match row.status.as_str() {
        "halted" => return Err(halted(row.halted_reason.clone().unwrap_or_default())),
        "disabled" => {
            return Err(AppsError::Disabled {
                app: id.to_string(),
                kind,
            })
        }
        _ => {}
    }
    let keyring = keyring.ok_or(AppsError::NoMasterKey)?;
    match unseal(keyring, id, kind, &row) {
        Ok(creds) => Ok(creds),
        Err(reason) => {
            tracing::error!(app = %id, kind = %kind, reason = %reason, "app credentials halted");
            halt(pool, id, kind, &row, &reason).await?;
            Err(halted(reason))
        }
    }
}
