//! What of a URL may be shown in logs, messages, `Debug`, `pushpace config` and
//! `providers list`: the scheme, the user, the host and port, and the path's first
//! segment. Everything else may be a credential (a webhook's secret path, `code=`,
//! `sig=`, a password), so it is kept only where it is known to be harmless.

/// Query parameters whose value is shown: connection settings that never hold a secret.
/// Any other parameter's value is `***`, so a new kind of token cannot leak.
const SHOWN_PARAMS: &[&str] = &[
    "sslmode",
    "sslrootcert",
    "sslcert",
    "connect_timeout",
    "application_name",
    "target_session_attrs",
    "protocol",
];

/// The URL with its password, every path segment after the first, every query value not
/// in [`SHOWN_PARAMS`] and its fragment replaced by `***`; unparsable input is hidden
/// whole.
pub fn url(raw: &str) -> String {
    let Ok(mut u) = url::Url::parse(raw) else {
        return "<unparsable url>".to_string();
    };
    if u.password().is_some() {
        let _ = u.set_password(Some("***"));
    }
    let first_of_more = u.path_segments().and_then(|mut segments| {
        let first = segments.next()?.to_string();
        segments.next().map(|_| first)
    });
    if let Some(first) = first_of_more {
        u.set_path(&format!("/{first}/***"));
    }
    if u.query().is_some() {
        let pairs: Vec<(String, String)> = u
            .query_pairs()
            .map(|(k, v)| {
                let shown = SHOWN_PARAMS.iter().any(|s| k.eq_ignore_ascii_case(s));
                let v = if shown { v.into_owned() } else { "***".into() };
                (k.into_owned(), v)
            })
            .collect();
        u.query_pairs_mut().clear().extend_pairs(pairs);
    }
    if u.fragment().is_some() {
        u.set_fragment(Some("***"));
    }
    u.to_string()
}

#[cfg(test)]
mod tests {
    use super::url;

    #[test]
    fn secrets_in_paths_queries_and_passwords_are_hidden() {
        assert_eq!(
            url("https://u:p4ss@push.example:8443/v1?token=t0k&x=1#frag"),
            "https://u:***@push.example:8443/v1?token=***&x=***#***"
        );
        // A webhook whose path is its credential (Slack-style) and a signed query.
        assert_eq!(
            url("https://hooks.example/services/T0001/B0002/s3cr3tP4th?code=abc&sig=def"),
            "https://hooks.example/services/***?code=***&sig=***"
        );
        assert_eq!(
            url("postgres://app:pw@db:5432/x?sslmode=require&PASSWORD=a&sslpassword=b&passfile=%2Fp"),
            "postgres://app:***@db:5432/x?sslmode=require&PASSWORD=***&sslpassword=***&passfile=***"
        );
        assert_eq!(
            url("rediss://pushpace:pw@localhost:6380/0"),
            "rediss://pushpace:***@localhost:6380/0"
        );
    }

    #[test]
    fn what_holds_no_secret_is_kept_as_it_is() {
        assert_eq!(url("http://h/p"), "http://h/p");
        assert_eq!(url("http://h/"), "http://h/");
        assert_eq!(url("http://127.0.0.1:9000"), "http://127.0.0.1:9000/");
        assert_eq!(url("not a url"), "<unparsable url>");
    }
}
