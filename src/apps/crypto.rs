//! Secrets at rest: AES-256-GCM under a master key, with the app id and the kind as
//! associated data.
//!
//! Each sealed row keeps the id of the key that sealed it (the first 8 hex digits of the
//! key's SHA-256, which names the key without revealing it), so a [`Keyring`] of one
//! current key and older ones opens every row while a rotation re-seals them under the
//! current key. The nonce is 96 random bits per seal: with a few million seals per key
//! the chance of a repeat stays far below 2^-32 (NIST SP 800-38D's bound). The
//! associated data binds a sealed secret to its app and kind, so a row copied to
//! another app (or from apns to fcm) fails to open instead of lending its credentials.

use super::AppKind;
use aes_gcm::aead::{Aead, AeadCore, KeyInit, OsRng, Payload};
use aes_gcm::{Aes256Gcm, Key, Nonce};
use base64::Engine;
use secrecy::zeroize::Zeroizing;
use sha2::{Digest, Sha256};

/// Bytes in a master key.
pub const KEY_BYTES: usize = 32;
/// Bytes in a nonce (AES-GCM's standard 96 bits).
pub const NONCE_BYTES: usize = 12;

/// Why a key could not be read or a row could not be opened. No variant holds key or
/// plaintext bytes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CryptoError {
    #[error(
        "is not a master key: expected {KEY_BYTES} random bytes in base64 \
         (e.g. `openssl rand -base64 32`), got {0}"
    )]
    BadKey(String),
    #[error("sealed under master key {0}, which is not configured (apps.master_key or apps.old_master_key_files)")]
    UnknownKey(String),
    #[error("does not open under master key {0}: the ciphertext was altered, or the row was moved from another app or kind")]
    Tampered(String),
    #[error("the stored nonce is {0} bytes, not {NONCE_BYTES}")]
    BadNonce(usize),
    #[error("two different master keys have the same id {0}; generate a new one")]
    IdCollision(String),
}

/// One master key. `Debug` shows its id only; the bytes are wiped on drop.
#[derive(Clone)]
pub struct MasterKey {
    id: String,
    key: Zeroizing<[u8; KEY_BYTES]>,
}

impl std::fmt::Debug for MasterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MasterKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl MasterKey {
    /// From the raw bytes.
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> MasterKey {
        let key = Zeroizing::new(bytes);
        let digest = Sha256::digest(&key[..]);
        let id = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
        MasterKey { id, key }
    }

    /// From base64 text (standard or URL-safe alphabet, padded or not; surrounding
    /// whitespace, such as a file's final newline, is ignored). The error never quotes
    /// the text.
    pub fn from_base64(text: &str) -> Result<MasterKey, CryptoError> {
        use base64::engine::general_purpose::{
            STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
        };
        let t = text.trim();
        let decoded = [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD]
            .iter()
            .find_map(|e| e.decode(t).ok())
            .map(Zeroizing::new)
            .ok_or_else(|| {
                CryptoError::BadKey(format!("{} characters that are not base64", t.len()))
            })?;
        let bytes: [u8; KEY_BYTES] = decoded[..]
            .try_into()
            .map_err(|_| CryptoError::BadKey(format!("{} bytes", decoded.len())))?;
        Ok(MasterKey::from_bytes(bytes))
    }

    /// A fresh random key (tests, and `openssl rand` for those without it).
    pub fn generate() -> MasterKey {
        let key = Aes256Gcm::generate_key(OsRng);
        let mut bytes = [0u8; KEY_BYTES];
        bytes.copy_from_slice(&key);
        MasterKey::from_bytes(bytes)
    }

    /// The key as base64 (tests that hand a key to the configuration).
    pub fn to_base64(&self) -> Zeroizing<String> {
        Zeroizing::new(base64::engine::general_purpose::STANDARD.encode(&self.key[..]))
    }

    /// First 8 hex digits of the key's SHA-256.
    pub fn id(&self) -> &str {
        &self.id
    }

    fn cipher(&self) -> Aes256Gcm {
        Aes256Gcm::new(Key::<Aes256Gcm>::from_slice(&self.key[..]))
    }
}

/// A secret as stored: the key that sealed it, the nonce and the ciphertext (with tag).
#[derive(Clone, PartialEq, Eq)]
pub struct Sealed {
    pub master_key_id: String,
    pub nonce: Vec<u8>,
    pub ciphertext: Vec<u8>,
}

impl std::fmt::Debug for Sealed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sealed")
            .field("master_key_id", &self.master_key_id)
            .field("ciphertext_bytes", &self.ciphertext.len())
            .finish_non_exhaustive()
    }
}

/// The associated data: a version tag, the app id and the kind. Ids cannot hold NUL
/// (the id rule), so the parts cannot run into each other.
fn aad(app_id: &str, kind: AppKind) -> Vec<u8> {
    format!("pushpace-app-secret:v1\0{app_id}\0{}", kind.as_str()).into_bytes()
}

/// The current master key and the older ones still accepted for opening.
#[derive(Clone, Debug)]
pub struct Keyring {
    current: MasterKey,
    old: Vec<MasterKey>,
}

impl Keyring {
    /// `old` may repeat the current key or each other (a key listed twice is one key);
    /// two different keys with one id are refused.
    pub fn new(current: MasterKey, old: Vec<MasterKey>) -> Result<Keyring, CryptoError> {
        let mut ring = Keyring {
            current,
            old: Vec::new(),
        };
        for k in old {
            match ring.find(k.id()) {
                Some(same) if same.key[..] == k.key[..] => {}
                Some(_) => return Err(CryptoError::IdCollision(k.id.clone())),
                None => ring.old.push(k),
            }
        }
        Ok(ring)
    }

    pub fn current_id(&self) -> &str {
        self.current.id()
    }

    /// Every key id, the current one first.
    pub fn ids(&self) -> Vec<&str> {
        std::iter::once(&self.current)
            .chain(&self.old)
            .map(MasterKey::id)
            .collect()
    }

    fn find(&self, id: &str) -> Option<&MasterKey> {
        std::iter::once(&self.current)
            .chain(&self.old)
            .find(|k| k.id == id)
    }

    /// Seals `plaintext` for `app_id`'s `kind` under the current key, with a fresh nonce.
    pub fn seal(&self, app_id: &str, kind: AppKind, plaintext: &[u8]) -> Sealed {
        let nonce = Aes256Gcm::generate_nonce(&mut OsRng);
        let ciphertext = self
            .current
            .cipher()
            .encrypt(
                &nonce,
                Payload {
                    msg: plaintext,
                    aad: &aad(app_id, kind),
                },
            )
            // Only a plaintext over 64 GiB fails to encrypt.
            .expect("AES-GCM encrypts any secret this small");
        Sealed {
            master_key_id: self.current.id.clone(),
            nonce: nonce.to_vec(),
            ciphertext,
        }
    }

    /// Opens a sealed secret of `app_id`'s `kind` with the key it names.
    pub fn open(
        &self,
        app_id: &str,
        kind: AppKind,
        sealed: &Sealed,
    ) -> Result<Zeroizing<Vec<u8>>, CryptoError> {
        let key = self
            .find(&sealed.master_key_id)
            .ok_or_else(|| CryptoError::UnknownKey(sealed.master_key_id.clone()))?;
        if sealed.nonce.len() != NONCE_BYTES {
            return Err(CryptoError::BadNonce(sealed.nonce.len()));
        }
        key.cipher()
            .decrypt(
                Nonce::from_slice(&sealed.nonce),
                Payload {
                    msg: &sealed.ciphertext,
                    aad: &aad(app_id, kind),
                },
            )
            .map(Zeroizing::new)
            .map_err(|_| CryptoError::Tampered(key.id.clone()))
    }

    /// Opens `sealed` and seals it again under the current key (rotation). A row
    /// already under the current key is sealed again too, with a fresh nonce.
    pub fn reseal(
        &self,
        app_id: &str,
        kind: AppKind,
        sealed: &Sealed,
    ) -> Result<Sealed, CryptoError> {
        let plain = self.open(app_id, kind, sealed)?;
        Ok(self.seal(app_id, kind, &plain))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECRET: &[u8] = b"-----BEGIN PRIVATE KEY-----\nnot really\n-----END PRIVATE KEY-----\n";

    #[test]
    fn a_sealed_secret_opens_for_its_app_and_kind_only() {
        let ring = Keyring::new(MasterKey::generate(), vec![]).unwrap();
        let sealed = ring.seal("app-1", AppKind::Apns, SECRET);
        assert_eq!(sealed.master_key_id, ring.current_id());
        assert_eq!(sealed.nonce.len(), NONCE_BYTES);
        assert!(!sealed.ciphertext.windows(SECRET.len()).any(|w| w == SECRET));
        assert_eq!(
            &ring.open("app-1", AppKind::Apns, &sealed).unwrap()[..],
            SECRET
        );
        // Moved to another app, or to another kind of the same app.
        for (app, kind) in [("app-2", AppKind::Apns), ("app-1", AppKind::Fcm)] {
            let e = ring.open(app, kind, &sealed).unwrap_err();
            assert_eq!(e, CryptoError::Tampered(ring.current_id().to_string()));
        }
        // Two seals of one secret differ (fresh nonces).
        assert_ne!(ring.seal("app-1", AppKind::Apns, SECRET), sealed);
    }

    #[test]
    fn a_tampered_row_or_an_unknown_key_fails() {
        let ring = Keyring::new(MasterKey::generate(), vec![]).unwrap();
        let sealed = ring.seal("a", AppKind::WebPush, SECRET);
        for i in [0, sealed.ciphertext.len() / 2, sealed.ciphertext.len() - 1] {
            let mut bad = sealed.clone();
            bad.ciphertext[i] ^= 1;
            assert!(matches!(
                ring.open("a", AppKind::WebPush, &bad),
                Err(CryptoError::Tampered(_))
            ));
        }
        let mut bad = sealed.clone();
        bad.nonce[0] ^= 1;
        assert!(matches!(
            ring.open("a", AppKind::WebPush, &bad),
            Err(CryptoError::Tampered(_))
        ));
        let mut bad = sealed.clone();
        bad.nonce.pop();
        assert_eq!(
            ring.open("a", AppKind::WebPush, &bad).unwrap_err(),
            CryptoError::BadNonce(11)
        );
        // Sealed under a key this ring does not hold.
        let other = Keyring::new(MasterKey::generate(), vec![]).unwrap();
        let e = other.open("a", AppKind::WebPush, &sealed).unwrap_err();
        assert_eq!(e, CryptoError::UnknownKey(ring.current_id().to_string()));
        // A wrong key that claims the right id (a forged or colliding id).
        let mut forged = other.seal("a", AppKind::WebPush, SECRET);
        forged.master_key_id = ring.current_id().to_string();
        assert!(matches!(
            ring.open("a", AppKind::WebPush, &forged),
            Err(CryptoError::Tampered(_))
        ));
    }

    #[test]
    fn rotation_reseals_under_the_new_key_and_the_old_one_still_opens() {
        let old = MasterKey::generate();
        let before = Keyring::new(old.clone(), vec![]).unwrap();
        let sealed = before.seal("a", AppKind::Fcm, SECRET);
        let new = MasterKey::generate();
        let after = Keyring::new(new.clone(), vec![old.clone()]).unwrap();
        assert_eq!(after.ids(), vec![new.id(), old.id()]);
        assert_eq!(&after.open("a", AppKind::Fcm, &sealed).unwrap()[..], SECRET);
        let resealed = after.reseal("a", AppKind::Fcm, &sealed).unwrap();
        assert_eq!(resealed.master_key_id, new.id());
        // Once re-sealed, the old key is no longer needed.
        let only_new = Keyring::new(new, vec![]).unwrap();
        assert_eq!(
            &only_new.open("a", AppKind::Fcm, &resealed).unwrap()[..],
            SECRET
        );
        assert!(only_new.open("a", AppKind::Fcm, &sealed).is_err());
        // The same key listed twice is one key.
        let twice = Keyring::new(old.clone(), vec![old.clone(), old]).unwrap();
        assert_eq!(twice.ids().len(), 1);
    }

    #[test]
    fn keys_read_from_base64_and_are_never_shown() {
        let k = MasterKey::generate();
        let text = format!("{}\n", &*k.to_base64());
        let back = MasterKey::from_base64(&text).unwrap();
        assert_eq!(back.id(), k.id());
        assert_eq!(k.id().len(), 8);
        assert!(k.id().bytes().all(|b| b.is_ascii_hexdigit()));
        let shown = format!("{k:?} {:?}", Keyring::new(k.clone(), vec![]).unwrap());
        assert!(shown.contains(k.id()), "{shown}");
        assert!(
            !shown.contains(k.to_base64().trim_end_matches('=')),
            "{shown}"
        );
        for bad in ["", "not base64!", "c2hvcnQ="] {
            let e = MasterKey::from_base64(bad).unwrap_err();
            assert!(matches!(e, CryptoError::BadKey(_)), "{bad}: {e}");
            assert!(bad.is_empty() || !e.to_string().contains(bad), "{e}");
        }
        // The id is the SHA-256 prefix: a fixed key gives a fixed id.
        let zero = MasterKey::from_bytes([0; KEY_BYTES]);
        assert_eq!(zero.id(), "66687aad");
    }
}
