//! TLS client configuration for the push providers: rustls on the ring provider (no
//! process-wide provider needed), the webpki root certificates plus any extra CA a
//! provider's settings name (`ca_pem`: a private gateway, or the loopback mocks' CA in
//! tests and demos), TLS 1.2 and 1.3, and ALPN `h2` only, since every provider speaks
//! HTTP/2 ([`super::h2pool`] refuses a connection that did not negotiate it).

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::CertificateDer;
use rustls::{ClientConfig, RootCertStore};
use std::sync::Arc;

/// The ALPN protocol every provider connection offers: HTTP/2 only.
pub const ALPN_H2: &[u8] = b"h2";

/// A client configuration trusting the webpki roots and the PEM certificates in
/// `ca_pem` (one or more `CERTIFICATE` blocks; other blocks are ignored).
pub fn client_config(ca_pem: Option<&[u8]>) -> Result<Arc<ClientConfig>, String> {
    let mut roots = RootCertStore {
        roots: webpki_roots::TLS_SERVER_ROOTS.to_vec(),
    };
    if let Some(pem) = ca_pem {
        let mut added = 0;
        for cert in CertificateDer::pem_slice_iter(pem) {
            let cert = cert.map_err(|e| format!("CA certificates: {e}"))?;
            roots
                .add(cert)
                .map_err(|e| format!("CA certificate not usable: {e}"))?;
            added += 1;
        }
        if added == 0 {
            return Err("CA certificates: no PEM CERTIFICATE block found".into());
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
        .map_err(|e| format!("TLS versions: {e}"))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![ALPN_H2.to_vec()];
    Ok(Arc::new(config))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn webpki_roots_only_offers_h2() {
        let config = client_config(None).expect("config");
        assert_eq!(config.alpn_protocols, vec![b"h2".to_vec()]);
    }

    #[test]
    fn extra_ca_must_hold_a_certificate() {
        assert!(client_config(Some(b"not a pem")).is_err());
        let ca = crate::tools::mock::tls::TestCa::new();
        assert!(client_config(Some(ca.ca_pem().as_bytes())).is_ok());
    }
}
