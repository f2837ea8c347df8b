//! Unit tests of `[database]`'s connection keys: sslmode, certificates, the password.

use super::*;
use sqlx::postgres::PgSslMode;

fn load(env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    super::tests::load(env, &[])
}

fn file_with(text: &str) -> tempfile::NamedTempFile {
    let f = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(f.path(), text).unwrap();
    f
}

#[test]
fn the_keys_go_over_the_urls_parameters() {
    let ca = file_with("-----BEGIN CERTIFICATE-----\n");
    let url = "postgres://app@db.example:5432/pushpace?sslmode=disable";
    let s = load(&[
        ("PUSHPACE__DATABASE__URL", url),
        ("PUSHPACE__DATABASE__SSLMODE", "verify-full"),
        (
            "PUSHPACE__DATABASE__SSLROOTCERT",
            ca.path().to_str().unwrap(),
        ),
    ])
    .unwrap();
    let options = s.database.connect_options().unwrap();
    assert!(matches!(options.get_ssl_mode(), PgSslMode::VerifyFull));
    assert_eq!(options.get_host(), "db.example");
    assert_eq!(options.get_database(), Some("pushpace"));
    let other = s.database.connect_options_for("postgres").unwrap();
    assert_eq!(other.get_database(), Some("postgres"));
    assert!(matches!(other.get_ssl_mode(), PgSslMode::VerifyFull));
    // Without the key, the URL's mode holds.
    let s = load(&[("PUSHPACE__DATABASE__URL", url)]).unwrap();
    let options = s.database.connect_options().unwrap();
    assert!(matches!(options.get_ssl_mode(), PgSslMode::Disable));
}

#[test]
fn a_bad_sslmode_or_a_missing_file_is_refused_by_name() {
    let e = load(&[("PUSHPACE__DATABASE__SSLMODE", "verify_full")]).unwrap_err();
    assert!(e.to_string().contains("database.sslmode"), "{e}");
    assert!(e.to_string().contains("verify-full"), "{e}");
    // Refused from the key and from the URL alike (see database.rs: the driver's
    // verify-ca checks the name after all).
    let e = load(&[("PUSHPACE__DATABASE__SSLMODE", "verify-ca")]).unwrap_err();
    assert!(e.to_string().contains("verify-ca is not available"), "{e}");
    let url = "postgres://app@db.example/pushpace?sslmode=verify-ca";
    let e = load(&[("PUSHPACE__DATABASE__URL", url)]).unwrap_err();
    assert!(e.to_string().contains("verify-ca is not available"), "{e}");
    let e = load(&[("PUSHPACE__DATABASE__SSLROOTCERT", "no/such/ca.pem")]).unwrap_err();
    assert!(e.to_string().contains("database.sslrootcert"), "{e}");
    let cert = file_with("cert");
    let e = load(&[("PUSHPACE__DATABASE__SSLCERT", cert.path().to_str().unwrap())]).unwrap_err();
    assert!(e.to_string().contains("database.sslkey"), "{e}");
}

#[test]
fn the_password_file_is_read_and_never_shown() {
    let secret = "s3cret-from-file";
    let f = file_with(&format!("{secret}\n"));
    let s = load(&[(
        "PUSHPACE__DATABASE__PASSWORD_FILE",
        f.path().to_str().unwrap(),
    )])
    .unwrap();
    let shown = format!("{s:?}");
    assert!(!shown.contains(secret), "{shown}");
    assert!(shown.contains("password: Some(\"[set]\")"), "{shown}");
    let options = s.database.connect_options().unwrap();
    let debug = format!("{:?}", s.database);
    assert!(!debug.contains(secret));
    // sqlx keeps it for the handshake; the settings' own accessors never show it.
    assert!(format!("{options:?}").contains(secret));
    let e = load(&[
        (
            "PUSHPACE__DATABASE__PASSWORD_FILE",
            f.path().to_str().unwrap(),
        ),
        ("PUSHPACE__DATABASE__PASSWORD", "other"),
    ])
    .unwrap_err();
    assert!(e.to_string().contains("not both"), "{e}");
    assert!(!e.to_string().contains(secret));
}
