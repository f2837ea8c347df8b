//! A throwaway certificate authority for the loopback mocks: a self-signed CA and a
//! server certificate it signs for `localhost` and `127.0.0.1`, made fresh per
//! [`TestCa::new`]. Clients trust it through the provider setting `ca_pem`
//! ([`TestCa::ca_pem`]), so the adapters run the same TLS path as against the real
//! services.

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::ServerConfig;
use std::sync::Arc;

/// A CA and one server certificate signed by it.
pub struct TestCa {
    ca_pem: String,
    chain: Vec<CertificateDer<'static>>,
    key_der: Vec<u8>,
}

impl std::fmt::Debug for TestCa {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The server key stays out of debug output.
        f.debug_struct("TestCa").finish_non_exhaustive()
    }
}

impl Default for TestCa {
    fn default() -> Self {
        Self::new()
    }
}

impl TestCa {
    /// A fresh CA and server certificate (ECDSA P-256). Panics only if rcgen cannot
    /// build a certificate from these fixed parameters, which is a bug.
    pub fn new() -> TestCa {
        let ca_key = KeyPair::generate().expect("CA key");
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "pushpace mock CA");
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_cert = ca_params.self_signed(&ca_key).expect("CA certificate");

        let server_key = KeyPair::generate().expect("server key");
        let mut params = CertificateParams::new(vec!["localhost".into(), "127.0.0.1".into()])
            .expect("server params");
        params
            .distinguished_name
            .push(DnType::CommonName, "pushpace mock provider");
        let server_cert = params
            .signed_by(&server_key, &ca_cert, &ca_key)
            .expect("server certificate");
        TestCa {
            ca_pem: ca_cert.pem(),
            chain: vec![server_cert.der().clone(), ca_cert.der().clone()],
            key_der: server_key.serialize_der(),
        }
    }

    /// The CA certificate in PEM, for a client's `ca_pem`.
    pub fn ca_pem(&self) -> String {
        self.ca_pem.clone()
    }

    /// A server configuration with the certificate and ALPN `h2` only. (rustls refuses a
    /// client that offers ALPN without `h2`; [`super::h2server`] also refuses one that
    /// offers no ALPN at all.)
    pub fn server_config(&self) -> Arc<ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_der.clone()));
        let mut config = ServerConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .expect("TLS versions")
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), key)
            .expect("server certificate and key match");
        config.alpn_protocols = vec![b"h2".to_vec()];
        Arc::new(config)
    }
}
