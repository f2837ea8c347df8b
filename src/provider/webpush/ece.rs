//! Web Push message encryption (RFC 8291 over RFC 8188 `aes128gcm`).
//!
//! Each message gets a fresh ephemeral P-256 key and salt; the shared secret with the
//! subscription's `p256dh` key and its `auth` secret derive the content key and nonce.
//! The sender's side runs on `ring`'s `agreement` (constant-time assembly, several
//! times faster than the pure-Rust `p256` per message); `p256` stays for the fixed keys
//! of the RFC vector and the browser's side.
//! The body is one record: `salt(16) || rs(4) || idlen(1) = 65 || as_public(65)` then
//! AES-128-GCM over `plaintext || 0x02`. [`decrypt`] is the browser's side, used by the
//! loopback mock and the tests.

use aes_gcm::aead::{AeadInPlace, KeyInit};
use aes_gcm::{Aes128Gcm, Nonce};
use hkdf::Hkdf;
use p256::elliptic_curve::sec1::ToEncodedPoint;
use p256::{PublicKey, SecretKey};
use ring::agreement::{agree_ephemeral, EphemeralPrivateKey, UnparsedPublicKey, ECDH_P256};
use ring::rand::{SecureRandom, SystemRandom};
use sha2::Sha256;

/// The record size written in the header.
pub const RECORD_SIZE: u32 = 4096;
/// `salt || rs || idlen || keyid`.
pub const HEADER_LEN: usize = 16 + 4 + 1 + 65;
/// The GCM tag.
const TAG_LEN: usize = 16;
/// Largest plaintext: push services take bodies of at most 4096 bytes, and the header,
/// the padding delimiter and the tag take 103 of them.
pub const MAX_PLAINTEXT: usize = 4096 - HEADER_LEN - 1 - TAG_LEN;

/// Why a message cannot be encrypted or decrypted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EceError {
    #[error("plaintext is {0} bytes; Web Push allows at most {MAX_PLAINTEXT}")]
    TooLarge(usize),
    #[error("message is shorter than its header")]
    Truncated,
    #[error("record size {0} is not supported")]
    RecordSize(u32),
    #[error("the sender key in the header is not a P-256 point")]
    BadKey,
    #[error("the record does not authenticate (wrong keys or a changed body)")]
    Authentication,
    #[error("the record lacks its last-record padding delimiter")]
    Padding,
    #[error("the system's random number generator failed")]
    Random,
}

/// Encrypts `plaintext` for a subscription with a fresh key and salt.
pub fn encrypt(
    plaintext: &[u8],
    ua_public: &PublicKey,
    auth: &[u8; 16],
) -> Result<Vec<u8>, EceError> {
    if plaintext.len() > MAX_PLAINTEXT {
        return Err(EceError::TooLarge(plaintext.len()));
    }
    let rng = SystemRandom::new();
    let mut salt = [0u8; 16];
    rng.fill(&mut salt).map_err(|_| EceError::Random)?;
    let as_secret =
        EphemeralPrivateKey::generate(&ECDH_P256, &rng).map_err(|_| EceError::Random)?;
    let as_public = as_secret
        .compute_public_key()
        .map_err(|_| EceError::Random)?;
    let ua_bytes = ua_public.to_encoded_point(false);
    let peer = UnparsedPublicKey::new(&ECDH_P256, ua_bytes.as_bytes());
    let (cek, nonce) = agree_ephemeral(as_secret, &peer, |shared| {
        derive(shared, auth, &salt, ua_bytes.as_bytes(), as_public.as_ref())
    })
    // A subscription key is checked on the curve when parsed, so this cannot fail.
    .map_err(|_| EceError::BadKey)?;
    seal(plaintext, &salt, as_public.as_ref(), &cek, &nonce)
}

/// Encrypts with a given sender key and salt (the RFC's test vector; never reuse either
/// in production: [`encrypt`] draws them fresh).
pub fn encrypt_with(
    plaintext: &[u8],
    ua_public: &PublicKey,
    auth: &[u8; 16],
    as_secret: &SecretKey,
    salt: &[u8; 16],
) -> Result<Vec<u8>, EceError> {
    if plaintext.len() > MAX_PLAINTEXT {
        return Err(EceError::TooLarge(plaintext.len()));
    }
    let as_public = as_secret.public_key().to_encoded_point(false);
    let ua_bytes = ua_public.to_encoded_point(false);
    let shared = p256::ecdh::diffie_hellman(as_secret.to_nonzero_scalar(), ua_public.as_affine());
    let (cek, nonce) = derive(
        shared.raw_secret_bytes().as_slice(),
        auth,
        salt,
        ua_bytes.as_bytes(),
        as_public.as_bytes(),
    );
    seal(plaintext, salt, as_public.as_bytes(), &cek, &nonce)
}

/// The one record: header, then `plaintext || 0x02` sealed under `cek` and `nonce`.
fn seal(
    plaintext: &[u8],
    salt: &[u8; 16],
    as_public: &[u8],
    cek: &[u8; 16],
    nonce: &[u8; 12],
) -> Result<Vec<u8>, EceError> {
    let mut out = Vec::with_capacity(HEADER_LEN + plaintext.len() + 1 + TAG_LEN);
    out.extend_from_slice(salt);
    out.extend_from_slice(&RECORD_SIZE.to_be_bytes());
    out.push(65);
    out.extend_from_slice(as_public);
    out.extend_from_slice(plaintext);
    out.push(0x02);
    let cipher = Aes128Gcm::new(cek.into());
    let tag = cipher
        .encrypt_in_place_detached(Nonce::from_slice(nonce), b"", &mut out[HEADER_LEN..])
        // AES-GCM fails only beyond 64 GiB of plaintext.
        .map_err(|_| EceError::TooLarge(plaintext.len()))?;
    out.extend_from_slice(&tag);
    Ok(out)
}

/// Decrypts a one-record `aes128gcm` Web Push message with the subscription's private
/// key and auth secret, returning the plaintext without its padding.
pub fn decrypt(body: &[u8], ua_secret: &SecretKey, auth: &[u8; 16]) -> Result<Vec<u8>, EceError> {
    if body.len() < 21 {
        return Err(EceError::Truncated);
    }
    let salt: [u8; 16] = body[..16].try_into().map_err(|_| EceError::Truncated)?;
    let rs = u32::from_be_bytes([body[16], body[17], body[18], body[19]]);
    let idlen = usize::from(body[20]);
    if body.len() < 21 + idlen + TAG_LEN {
        return Err(EceError::Truncated);
    }
    let record = &body[21 + idlen..];
    // One record only: it must fit the record size the header declares.
    if rs < 18 || record.len() > rs as usize {
        return Err(EceError::RecordSize(rs));
    }
    let as_public =
        PublicKey::from_sec1_bytes(&body[21..21 + idlen]).map_err(|_| EceError::BadKey)?;
    let ua_public = ua_secret.public_key().to_encoded_point(false);
    let shared = p256::ecdh::diffie_hellman(ua_secret.to_nonzero_scalar(), as_public.as_affine());
    let (cek, nonce) = derive(
        shared.raw_secret_bytes().as_slice(),
        auth,
        &salt,
        ua_public.as_bytes(),
        &body[21..21 + idlen],
    );
    let (ciphertext, tag) = record.split_at(record.len() - TAG_LEN);
    let mut plain = ciphertext.to_vec();
    Aes128Gcm::new(&cek.into())
        .decrypt_in_place_detached(
            Nonce::from_slice(&nonce),
            b"",
            &mut plain,
            aes_gcm::Tag::from_slice(tag),
        )
        .map_err(|_| EceError::Authentication)?;
    // RFC 8188: padding is zeros after the delimiter; 0x02 marks the last record.
    while plain.last() == Some(&0) {
        plain.pop();
    }
    match plain.pop() {
        Some(0x02) => Ok(plain),
        _ => Err(EceError::Padding),
    }
}

/// RFC 8291 section 3.4 and RFC 8188 section 2.2: the content key and nonce from the
/// ECDH shared secret.
fn derive(
    shared: &[u8],
    auth: &[u8; 16],
    salt: &[u8; 16],
    ua_public: &[u8],
    as_public: &[u8],
) -> ([u8; 16], [u8; 12]) {
    let mut info = Vec::with_capacity(14 + 130);
    info.extend_from_slice(b"WebPush: info\0");
    info.extend_from_slice(ua_public);
    info.extend_from_slice(as_public);
    let mut ikm = [0u8; 32];
    // Expanding to 32, 16 or 12 bytes is always within HKDF-SHA256's 8160-byte limit.
    let _ = Hkdf::<Sha256>::new(Some(auth), shared).expand(&info, &mut ikm);
    let prk = Hkdf::<Sha256>::new(Some(salt), &ikm);
    let mut cek = [0u8; 16];
    let mut nonce = [0u8; 12];
    let _ = prk.expand(b"Content-Encoding: aes128gcm\0", &mut cek);
    let _ = prk.expand(b"Content-Encoding: nonce\0", &mut nonce);
    (cek, nonce)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provider::webpush::subscription::B64URL;
    use aes_gcm::aead::OsRng;
    use base64::Engine;

    // RFC 8291 Appendix A (section 5's example message and its keys).
    const PLAINTEXT: &[u8] = b"When I grow up, I want to be a watermelon";
    const AS_PRIVATE: &str = "yfWPiYE-n46HLnH0KqZOF1fJJU3MYrct3AELtAQ-oRw";
    const UA_PRIVATE: &str = "q1dXpw3UpT5VOmu_cf_v6ih07Aems3njxI-JWgLcM94";
    const UA_PUBLIC: &str =
        "BCVxsr7N_eNgVRqvHtD0zTZsEc6-VV-JvLexhqUzORcxaOzi6-AYWXvTBHm4bjyPjs7Vd8pZGH6SRpkNtoIAiw4";
    const SALT: &str = "DGv6ra1nlYgDCS1FRnbzlw";
    const AUTH: &str = "BTBZMqHH6r4Tts7J_aSIgg";
    const BODY: &str = "DGv6ra1nlYgDCS1FRnbzlwAAEABBBP4z9KsN6nGRTbVYI_c7VJSPQTBtkgcy27mlmlMoZIIgDll6e3vCYLocInmYWAmS6TlzAC8wEqKK6PBru3jl7A_yl95bQpu6cVPTpK4Mqgkf1CXztLVBSt2Ks3oZwbuwXPXLWyouBWLVWGNWQexSgSxsj_Qulcy4a-fN";

    fn b(s: &str) -> Vec<u8> {
        B64URL.decode(s).expect("test vector is base64url")
    }

    fn auth() -> [u8; 16] {
        b(AUTH).try_into().expect("16 bytes")
    }

    #[test]
    fn rfc8291_vector_decrypts() {
        let ua = SecretKey::from_slice(&b(UA_PRIVATE)).expect("key");
        assert_eq!(
            decrypt(&b(BODY), &ua, &auth()).expect("decrypts"),
            PLAINTEXT
        );
    }

    #[test]
    fn rfc8291_vector_encrypts_byte_for_byte() {
        let as_secret = SecretKey::from_slice(&b(AS_PRIVATE)).expect("key");
        let ua_public = PublicKey::from_sec1_bytes(&b(UA_PUBLIC)).expect("point");
        let salt: [u8; 16] = b(SALT).try_into().expect("16 bytes");
        let body = encrypt_with(PLAINTEXT, &ua_public, &auth(), &as_secret, &salt).expect("ok");
        assert_eq!(B64URL.encode(&body), BODY);
    }

    #[test]
    fn fresh_keys_round_trip_and_differ() {
        let ua = SecretKey::random(&mut OsRng);
        let text = vec![b'x'; MAX_PLAINTEXT];
        let a = encrypt(&text, &ua.public_key(), &auth()).expect("fits");
        let c = encrypt(&text, &ua.public_key(), &auth()).expect("fits");
        assert_eq!(a.len(), 4096, "the largest message is exactly 4096 bytes");
        assert_ne!(a[..16], c[..16], "a fresh salt per message");
        assert_ne!(a[21..86], c[21..86], "a fresh sender key per message");
        assert_eq!(decrypt(&a, &ua, &auth()).expect("ok"), text);
        assert_eq!(decrypt(&c, &ua, &auth()).expect("ok"), text);
    }

    #[test]
    fn refuses_too_large_and_detects_tampering() {
        let ua = SecretKey::random(&mut OsRng);
        let err = encrypt(&[0; MAX_PLAINTEXT + 1], &ua.public_key(), &auth());
        assert_eq!(err, Err(EceError::TooLarge(MAX_PLAINTEXT + 1)));

        let mut body = encrypt(b"hello", &ua.public_key(), &auth()).expect("ok");
        let other = [9u8; 16];
        assert_eq!(decrypt(&body, &ua, &other), Err(EceError::Authentication));
        let last = body.len() - 1;
        body[last] ^= 1;
        assert_eq!(decrypt(&body, &ua, &auth()), Err(EceError::Authentication));
        assert_eq!(decrypt(&body[..30], &ua, &auth()), Err(EceError::Truncated));
    }
}
