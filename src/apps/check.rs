//! `POST /api/apps/{id}/check` and `pushpace apps check`: each kind's authentication
//! round trip, the one `pushpace providers check` makes, with the app's own credentials.
//! Nothing is sent to a device; the answer names what failed, never a secret.

use super::provider::{named_provider, AppDefaults};
use super::{store, AppKind, AppsError, Keyring};
use sqlx::PgPool;

/// One kind's result.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct KindCheck {
    pub kind: AppKind,
    pub ok: bool,
    /// The round trip's summary, or what is wrong.
    pub detail: String,
}

/// Checks every kind `id` has, in kind order. A kind that does not open (disabled,
/// halted, no master key, a row that no longer opens) fails with that reason.
pub async fn check(
    pool: &PgPool,
    keyring: Option<&Keyring>,
    defaults: &AppDefaults,
    id: &str,
) -> Result<Vec<KindCheck>, AppsError> {
    store::check_id(id)?;
    let Some(app) = store::get(pool, id).await? else {
        return Err(AppsError::NotFound(id.to_string()));
    };
    let mut out = Vec::with_capacity(app.credentials.len());
    for &kind in app.credentials.keys() {
        let result = match store::open(pool, keyring, id, kind).await {
            Err(AppsError::Database(e)) => return Err(AppsError::Database(e)),
            Err(e) => Err(e.to_string()),
            Ok(creds) => match named_provider(id, &creds, defaults) {
                Err(e) => Err(e.to_string()),
                Ok(p) => crate::provider::check::check_one(&p)
                    .await
                    .map_err(|e| e.to_string()),
            },
        };
        let (ok, detail) = match result {
            Ok(summary) => (true, summary),
            Err(problem) => (false, problem),
        };
        out.push(KindCheck { kind, ok, detail });
    }
    Ok(out)
}
