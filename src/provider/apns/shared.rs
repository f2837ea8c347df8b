//! One token signer per APNs key in the process: every sender of that key (the apps of
//! one team that share its `.p8`, or an app rebuilt by a PUT that changed its topic or
//! endpoint) shows Apple the same token, so the key's token is re-signed only on its
//! own schedule, never more often than Apple's 20 minutes.

use super::jwt::{Clock, TokenSigner};
use crate::provider::settings::ApnsSpec;
use crate::provider::ProviderError;
use parking_lot::Mutex;
use secrecy::ExposeSecret;
use sha2::{Digest, Sha256};
use std::collections::HashMap;
use std::sync::{Arc, OnceLock, Weak};

/// The key: team, key id, a digest of the key itself, and the refresh period.
type Key = (String, String, [u8; 32], u64);

fn signers() -> &'static Mutex<HashMap<Key, Weak<TokenSigner>>> {
    static SIGNERS: OnceLock<Mutex<HashMap<Key, Weak<TokenSigner>>>> = OnceLock::new();
    SIGNERS.get_or_init(|| Mutex::new(HashMap::new()))
}

/// The live signer of `spec`'s key, or a new one (on the system clock). Senders are
/// built off the send path (start-up, the app router), so the lock is never hot.
pub fn signer(spec: &ApnsSpec) -> Result<Arc<TokenSigner>, ProviderError> {
    let digest: [u8; 32] = Sha256::digest(spec.key_pem.expose_secret().as_bytes()).into();
    let key = (
        spec.team_id.clone(),
        spec.key_id.clone(),
        digest,
        spec.token_refresh.as_secs(),
    );
    let mut all = signers().lock();
    if let Some(live) = all.get(&key).and_then(Weak::upgrade) {
        return Ok(live);
    }
    let signer = Arc::new(TokenSigner::new(
        &spec.name,
        &spec.team_id,
        &spec.key_id,
        &spec.key_pem,
        spec.token_refresh,
        Clock::system(),
    )?);
    // Forget the keys no sender holds any more, so the map stays as small as the live set.
    all.retain(|_, w| w.strong_count() > 0);
    all.insert(key, Arc::downgrade(&signer));
    Ok(signer)
}
