//! Unit tests of `[kafka]`'s connection keys: SASL, TLS, `[kafka.properties]`, secrets.

use super::*;
use secrecy::ExposeSecret;

fn load_dir(dir: &Path, env: &[(&str, &str)]) -> Result<Settings, ConfigError> {
    let env: Vec<(String, String)> = env
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let lookup = env.clone();
    Settings::load_with_env(
        &LoadOptions {
            config_dir: Some(dir.to_path_buf()),
            environment: Some("kt".into()),
            overrides: Vec::new(),
        },
        move |k| lookup.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone()),
        env.into_iter(),
    )
}

/// A config directory: the shipped base.toml under an environment file holding `extra`.
fn dir_with(extra: &str) -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config");
    std::fs::copy(shipped.join("base.toml"), d.path().join("base.toml")).unwrap();
    std::fs::write(d.path().join("kt.toml"), extra).unwrap();
    d
}

fn err(extra: &str, env: &[(&str, &str)]) -> String {
    let d = dir_with(extra);
    load_dir(d.path(), env)
        .expect_err("should be refused")
        .to_string()
}

#[test]
fn sasl_ssl_with_a_password_file_loads_and_hides_the_password() {
    let d = dir_with("");
    let pw = d.path().join("kafka.pw");
    std::fs::write(&pw, "s3cr3t-Kafka\n").unwrap();
    let ca = d.path().join("ca.pem");
    std::fs::write(&ca, "-----BEGIN CERTIFICATE-----\n").unwrap();
    let extra = format!(
        "[kafka]\nsecurity_protocol = \"sasl_ssl\"\nsasl_mechanism = \"SCRAM-SHA-512\"\n\
         sasl_username = \"pushpace\"\nsasl_password_file = {:?}\nssl_ca_file = {:?}\n\
         [kafka.properties]\n\"socket.keepalive.enable\" = \"true\"\n\"ssl.key.password.x\" = \"hidden-too\"\n",
        pw.display().to_string(),
        ca.display().to_string()
    );
    std::fs::write(d.path().join("kt.toml"), extra).unwrap();
    // An unknown property is librdkafka's to refuse; this one is not known to it.
    let e = load_dir(d.path(), &[])
        .expect_err("unknown property")
        .to_string();
    assert!(e.contains("kafka.properties.ssl.key.password.x"), "{e}");
    assert!(!e.contains("hidden-too"), "{e}");
    let fixed = std::fs::read_to_string(d.path().join("kt.toml"))
        .unwrap()
        .replace("\"ssl.key.password.x\" = \"hidden-too\"\n", "");
    std::fs::write(d.path().join("kt.toml"), fixed).unwrap();
    let s = load_dir(d.path(), &[]).expect("loads");
    assert_eq!(s.kafka.security_protocol, kafka::SecurityProtocol::SaslSsl);
    assert_eq!(
        s.kafka
            .sasl_password
            .as_ref()
            .map(|p| p.expose_secret().to_string()),
        Some("s3cr3t-Kafka".to_string())
    );
    let shown = format!("{s:#?}");
    assert!(!shown.contains("s3cr3t-Kafka"), "{shown}");
    assert!(shown.contains("socket.keepalive.enable"), "{shown}");
}

#[test]
fn the_password_may_come_from_the_environment() {
    let extra = "[kafka]\nsecurity_protocol = \"sasl_plaintext\"\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\n";
    let d = dir_with(extra);
    let s = load_dir(d.path(), &[("PUSHPACE__KAFKA__SASL_PASSWORD", "from-env")]).unwrap();
    assert_eq!(
        s.kafka
            .sasl_password
            .as_ref()
            .map(|p| p.expose_secret().to_string()),
        Some("from-env".to_string())
    );
    assert!(!format!("{s:?}").contains("from-env"));
    assert!(err(extra, &[]).starts_with("kafka.sasl_password:"));
}

#[test]
fn owned_properties_are_refused_with_the_reason() {
    for (key, why) in [
        ("group.id", "kafka.group_id"),
        ("enable.auto.commit", "durable"),
        ("isolation.level", "kafka.isolation_level"),
        ("sasl.password", "sasl_password_file"),
        ("partition.assignment.strategy", "kafka.assignment_strategy"),
    ] {
        let e = err(&format!("[kafka.properties]\n{key:?} = \"x\"\n"), &[]);
        assert!(e.starts_with(&format!("kafka.properties.{key}: ")), "{e}");
        assert!(e.contains(why), "{e}");
        assert!(!e.contains("= \"x\""), "{e}");
    }
}

#[test]
fn mismatched_keys_are_refused() {
    let e = err(
        "[kafka]\nsasl_mechanism = \"PLAIN\"\nsasl_username = \"u\"\n",
        &[],
    );
    assert!(e.starts_with("kafka.security_protocol:"), "{e}");
    let e = err("[kafka]\nsecurity_protocol = \"sasl_ssl\"\n", &[]);
    assert!(e.starts_with("kafka.sasl_mechanism:"), "{e}");
    let e = err("[kafka]\nssl_ca_file = \"Cargo.toml\"\n", &[]);
    assert!(e.contains("needs security_protocol ssl"), "{e}");
    let e = err(
        "[kafka]\nsecurity_protocol = \"ssl\"\nssl_ca_file = \"no/such/ca.pem\"\n",
        &[],
    );
    assert!(e.contains("not a readable file"), "{e}");
    let e = err("[kafka]\nsecurity_protocol = \"tls\"\n", &[]);
    assert!(e.contains("tls"), "{e}");
}
