//! The bad-input corpus (bad_01 to bad_26): each message is refused with the right
//! kind and a reason naming the field; and a message key plays no part.

use super::*;

#[test]
fn bad_01_invalid_json() {
    rejects(
        br#"{"job_id": "j-1", "campaign_id":"#,
        MALFORMED,
        None,
        "not valid JSON",
    );
    rejects(b"{job_id: 'j'}", MALFORMED, None, "not valid JSON");
    rejects(b"not json at all", MALFORMED, None, "not valid JSON");
}

#[test]
fn bad_02_invalid_utf8() {
    let mut msg = with("job_id", json!("j-1"));
    let at = msg.iter().position(|&b| b == b'j').unwrap();
    msg[at] = 0xff;
    rejects(&msg, MALFORMED, None, "not valid UTF-8");
    rejects(&[0xc3, 0x28], MALFORMED, None, "offset 0");
}

#[test]
fn bad_03_empty_and_whitespace_messages() {
    rejects(b"", MALFORMED, None, "empty");
    rejects(b" \n\t ", MALFORMED, None, "empty");
}

#[test]
fn bad_04_not_an_object() {
    rejects(b"[1,2]", MALFORMED, None, "an array");
    rejects(b"\"job\"", MALFORMED, None, "a string");
    rejects(b"null", MALFORMED, None, "null");
    rejects(b"42", MALFORMED, None, "a number");
}

#[test]
fn bad_05_trailing_data_after_the_object() {
    let mut msg = serde_json::to_vec(&base()).unwrap();
    msg.extend_from_slice(b" {}");
    rejects(&msg, MALFORMED, None, "trailing");
}

#[test]
fn bad_06_wrong_types() {
    rejects(
        &with("job_id", json!(123)),
        INVALID,
        Some("job_id"),
        "invalid type: integer `123`",
    );
    rejects(
        &with("campaign_id", json!(["c"])),
        INVALID,
        Some("campaign_id"),
        "invalid type: sequence",
    );
    rejects(
        &with("devices", json!("tok-a")),
        INVALID,
        Some("devices"),
        "invalid type: string",
    );
    rejects(
        &with("devices", json!({"0": "tok"})),
        INVALID,
        Some("devices"),
        "invalid type: map",
    );
    rejects(
        &with("devices", json!(["ok", 5])),
        INVALID,
        Some("devices[1]"),
        "invalid type: integer `5`",
    );
    rejects(
        &with("devices", json!(["ok", "ok", null])),
        INVALID,
        Some("devices[2]"),
        "null",
    );
    rejects(
        &with("send_rate", json!(true)),
        INVALID,
        Some("send_rate"),
        "a number of sends per second",
    );
    rejects(
        &with("algorithm", json!(7)),
        INVALID,
        Some("algorithm"),
        "an algorithm name",
    );
}

#[test]
fn bad_07_missing_fields() {
    for field in ["job_id", "campaign_id", "devices", "payload"] {
        rejects(&without(field), INVALID, Some(field), "missing; required");
    }
    rejects(b"{}", INVALID, Some("job_id"), "missing");
}

#[test]
fn bad_08_empty_devices() {
    rejects(
        &with("devices", json!([])),
        INVALID,
        Some("devices"),
        "must hold 1–10000 device tokens, got 0",
    );
}

#[test]
fn bad_09_too_many_devices() {
    let devices: Vec<String> = (0..=MAX_DEVICES).map(|i| format!("t{i}")).collect();
    rejects(
        &with("devices", json!(devices)),
        INVALID,
        Some("devices"),
        "got 10001",
    );
}

#[test]
fn bad_10_device_tokens_out_of_range() {
    let mut devices = vec![json!("a"), json!("b"), json!("c"), json!("x".repeat(5000))];
    let err = rejects(
        &with("devices", json!(devices.clone())),
        INVALID,
        Some("devices[3]"),
        "got 5000",
    );
    assert_eq!(
        err.to_string(),
        "devices[3]: must be 1–4096 bytes, got 5000"
    );
    devices[3] = json!("");
    rejects(
        &with("devices", json!(devices)),
        INVALID,
        Some("devices[3]"),
        "got 0",
    );
}

#[test]
fn bad_11_two_mib_message() {
    let devices: Vec<String> = (0..1000).map(|_| "d".repeat(2100)).collect();
    let msg = with("devices", json!(devices));
    assert!(msg.len() > 2 << 20);
    rejects(&msg, MALFORMED, None, "the limit is 1048576 bytes");
}

#[test]
fn bad_12_payload_over_the_decoders_limit() {
    let payload = json!({"body": "x".repeat(MAX_PAYLOAD_BYTES)});
    rejects(
        &with("payload", payload),
        INVALID,
        Some("payload"),
        "at most 5120 bytes of JSON, got 5131",
    );
    // 4107 bytes decode (APNs VoIP takes 5120); the webhook's 4096 applies at intake.
    let job = decode(&with("payload", json!({"body": "x".repeat(4096)}))).unwrap();
    let e = pushpace::job::check_for_provider(&job, pushpace::provider::ProviderKind::Webhook)
        .unwrap_err();
    assert_eq!(
        e.to_string(),
        "payload: must be at most 4096 bytes of JSON, got 4107"
    );
    assert_eq!(e.kind(), INVALID);
}

#[test]
fn bad_13_payload_not_an_object() {
    rejects(
        &with("payload", json!(["a"])),
        INVALID,
        Some("payload"),
        "must be a JSON object (or, for Web Push, a string), got an array",
    );
    // A string is Web Push plaintext: it decodes, and every other kind refuses it.
    assert_eq!(
        decode(&with("payload", json!("hi"))).unwrap().payload.get(),
        "\"hi\""
    );
    rejects(
        &with("payload", json!(null)),
        INVALID,
        Some("payload"),
        "got null",
    );
    rejects(
        &with("payload", json!(1.5)),
        INVALID,
        Some("payload"),
        "got a number",
    );
}

#[test]
fn bad_14_send_rate_zero() {
    rejects(
        &with("send_rate", json!(0)),
        INVALID,
        Some("send_rate"),
        "greater than 0",
    );
}

#[test]
fn bad_15_send_rate_negative() {
    rejects(
        &with("send_rate", json!(-1)),
        INVALID,
        Some("send_rate"),
        "got -1",
    );
}

#[test]
fn bad_14b_send_rate_below_the_minimum() {
    for tiny in [1e-300, 0.000_999] {
        rejects(
            &with("send_rate", json!(tiny)),
            INVALID,
            Some("send_rate"),
            "must be at least 0.001 sends per second",
        );
    }
}

#[test]
fn bad_16_send_rate_nan_as_a_string() {
    rejects(
        &with("send_rate", json!("NaN")),
        INVALID,
        Some("send_rate"),
        "string \"NaN\"",
    );
    rejects(
        &with("send_rate", json!("500")),
        INVALID,
        Some("send_rate"),
        "a number of sends per second",
    );
    // Bare NaN is not JSON at all.
    rejects(
        br#"{"job_id":"j","campaign_id":"c","send_rate":NaN,"devices":["d"],"payload":{}}"#,
        MALFORMED,
        None,
        "not valid JSON",
    );
}

#[test]
fn bad_17_send_rate_too_high() {
    rejects(
        &with("send_rate", json!(1e12)),
        INVALID,
        Some("send_rate"),
        "at most 10000000",
    );
}

#[test]
fn bad_18_two_hundred_character_campaign_id() {
    let id = "c".repeat(200);
    rejects(
        &with("campaign_id", json!(id)),
        INVALID,
        Some("campaign_id"),
        "must be 1–128 characters from [A-Za-z0-9._:-], got 200",
    );
    rejects(&with("job_id", json!("")), INVALID, Some("job_id"), "got 0");
}

#[test]
fn bad_19_ids_with_spaces_or_quotes() {
    rejects(
        &with("campaign_id", json!("spring sale")),
        INVALID,
        Some("campaign_id"),
        "' ' at character 6",
    );
    rejects(
        &with("job_id", json!("j\"1")),
        INVALID,
        Some("job_id"),
        "'\"' at character 1",
    );
    rejects(
        &with("job_id", json!("j'1")),
        INVALID,
        Some("job_id"),
        "'\\'' at character 1",
    );
    rejects(
        &with("job_id", json!("café")),
        INVALID,
        Some("job_id"),
        "'é' at character 3",
    );
}

#[test]
fn bad_20_sql_metacharacters_in_every_field() {
    let sql = "x'; DROP TABLE campaigns; --";
    rejects(
        &with("job_id", json!(sql)),
        INVALID,
        Some("job_id"),
        "only A-Z, a-z, 0-9 and . _ : - are allowed",
    );
    rejects(
        &with("campaign_id", json!(sql)),
        INVALID,
        Some("campaign_id"),
        "\"x'; DROP TABLE campaigns; --\"",
    );
    rejects(
        &with("algorithm", json!(sql)),
        INVALID,
        Some("algorithm"),
        "unknown algorithm",
    );
    rejects(
        &with("send_rate", json!(sql)),
        INVALID,
        Some("send_rate"),
        "invalid type",
    );
    // Tokens and payloads are opaque to pushpace: they are accepted and passed on as they
    // are, except control characters in a token (no provider issues one).
    let mut v = base();
    v["devices"] = json!([sql, "tok\\\u{0}"]);
    rejects(
        &serde_json::to_vec(&v).unwrap(),
        INVALID,
        Some("devices[1]"),
        "control characters (byte 0x00 at 4)",
    );
    v["devices"] = json!([sql, "tok\\"]);
    v["payload"] = json!({"q": sql});
    let job = decode(&serde_json::to_vec(&v).unwrap()).unwrap();
    assert_eq!(job.devices[0], sql);
    assert_eq!(job.devices[1], "tok\\");
    assert!(job.payload.get().contains("DROP TABLE"));
}

/// The message key is the producer's partitioning choice, not the campaign: jobs keyed
/// by another id, by binary bytes, by bytes holding NUL, by nothing or by an empty key
/// are all delivered, and none is dead-lettered.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_message_key_is_accepted() {
    let mut tw = TestWorker::options().partitions(2).prepare().await;
    let (pool, sink) = (tw.pool.clone(), tw.sink());
    let producer = Producer::new();
    let campaign = unique_name("keys").replace('_', "-");
    let keys: [Option<&[u8]>; 5] = [
        Some(b"job-0001"),
        Some(&[0xff, 0xfe, 0x80, 0x01]),
        Some(b"c\0x\0"),
        Some(b""),
        None,
    ];
    for (i, key) in keys.iter().enumerate() {
        let devices = [format!("d{i}a"), format!("d{i}b")];
        let value = job_at(&format!("{campaign}-j{i}"), &campaign, 1000.0, &devices).to_json();
        let record = Record {
            key: *key,
            ..Record::of(&value)
        };
        producer.send(&tw.topic, record).await;
    }
    let expected = keys.len() as u64 * 2;
    tw.start().await;
    let worker = tw.take_worker();
    wait_for("every keyed job delivered", Duration::from_secs(60), || {
        sink.summary().distinct_delivered >= expected
    })
    .await;
    worker.shutdown().await.unwrap();
    assert_eq!(sink.summary().distinct_delivered, expected);
    let letters = pushpace::store::dead_letters::list(&pool, None, None, 100)
        .await
        .unwrap();
    assert!(letters.is_empty(), "no dead letter: {letters:#?}");
}

#[test]
fn bad_22_unknown_algorithm() {
    rejects(
        &with("algorithm", json!("GCRA")),
        INVALID,
        Some("algorithm"),
        "unknown algorithm \"GCRA\"; expected one of",
    );
}

#[test]
fn bad_23_duplicate_fields() {
    rejects(
        br#"{"job_id":"j","campaign_id":"c","campaign_id":"d","devices":["x"],"payload":{}}"#,
        INVALID,
        Some("campaign_id"),
        "appears more than once",
    );
}

/// Each named field, the last ones of the list included, given twice: refused naming
/// it (the decoder's table of fields seen must hold every one of them).
#[test]
fn bad_23b_every_field_given_twice_is_refused_naming_it() {
    let fields: [(&str, &str); 16] = [
        ("job_id", r#""j""#),
        ("campaign_id", r#""c""#),
        ("app_id", r#""shop-1""#),
        ("send_rate", "10"),
        ("algorithm", r#""gcra""#),
        ("devices", r#"["x"]"#),
        ("payload", "{}"),
        ("provider", r#""p""#),
        ("priority", r#""high""#),
        ("collapse_id", r#""k""#),
        ("expiration", "0"),
        ("ttl_s", "60"),
        ("push_type", r#""alert""#),
        ("not_before", "1"),
        ("expires_at", "2"),
        ("campaign_total_devices", "5"),
    ];
    for (field, value) in fields {
        let mut msg = String::from("{");
        for (f, v) in fields.iter().filter(|(f, _)| {
            ["job_id", "campaign_id", "devices", "payload"].contains(f) && *f != field
        }) {
            msg.push_str(&format!("\"{f}\":{v},"));
        }
        msg.push_str(&format!("\"{field}\":{value},\"{field}\":{value}}}"));
        rejects(
            msg.as_bytes(),
            INVALID,
            Some(field),
            "appears more than once",
        );
    }
}

#[test]
fn bad_24_control_characters_are_escaped_in_reasons() {
    let err = rejects(
        &with("job_id", json!("j\u{0}1")),
        INVALID,
        Some("job_id"),
        "'\\0'",
    );
    assert!(!err.to_string().contains('\u{0}'));
}

#[test]
fn bad_25_deep_nesting_never_overflows_the_stack() {
    let deep = |n: usize| format!("{}{}", "[".repeat(n), "]".repeat(n));
    let in_payload = |n: usize| {
        format!(
            r#"{{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{{"a":{}}}}}"#,
            deep(n)
        )
    };
    // The payload is decoded strictly, which caps its depth at serde_json's limit.
    assert!(decode(in_payload(120).as_bytes()).is_ok());
    rejects(
        in_payload(200).as_bytes(),
        INVALID,
        Some("payload"),
        "recursion limit",
    );
    rejects(
        in_payload(400_000).as_bytes(),
        INVALID,
        Some("payload"),
        "at most 5120 bytes",
    );
    // Unknown fields are scanned without recursion: depth alone is no reason to refuse.
    let msg = format!(
        r#"{{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{{}},"x":{}}}"#,
        deep(400_000)
    );
    assert!(decode(msg.as_bytes()).is_ok());
    // Where values are built (a job that is not an object), depth is capped too.
    rejects(deep(400_000).as_bytes(), MALFORMED, None, "recursion limit");
    rejects(
        format!("{{\"x\":{}", deep(400_000)).as_bytes(),
        MALFORMED,
        None,
        "EOF",
    );
}

#[test]
fn bad_26_payload_strings_must_decode() {
    // Found by the fuzzer: a lone surrogate escape passed the raw scan, and the body
    // built from it was refused by strict JSON parsers.
    let msg = br#"{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{"c":"\ud83d\ufe00"}}"#;
    rejects(msg, INVALID, Some("payload"), "lone leading surrogate");
    let msg = br#"{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{"c":"\udc00"}}"#;
    rejects(
        msg,
        INVALID,
        Some("payload"),
        "payload: is not JSON that every parser accepts",
    );
    // A proper pair is fine, and kept as written.
    let msg = br#"{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{"c":"\ud83d\ude00"}}"#;
    assert_eq!(
        decode(msg).unwrap().payload.get(),
        r#"{"c":"\ud83d\ude00"}"#
    );
    // Tokens are decoded anyway: a lone surrogate there is not JSON at all.
    let msg = br#"{"job_id":"j","campaign_id":"c","devices":["\ud83d"],"payload":{}}"#;
    rejects(msg, MALFORMED, None, "hex escape");
    // Job::new applies the same check (RawValue::from_string does not decode strings).
    let raw = RawValue::from_string(r#"{"c":"\ud83d"}"#.into()).unwrap();
    let err = Job::new("j", "c", vec!["d".into()], raw).unwrap_err();
    assert_eq!(err.field(), Some("payload"));
}

#[test]
fn a_syntax_error_anywhere_wins_over_a_field_error() {
    // The field error comes first in the text, but the message is not JSON at all.
    rejects(
        br#"{"job_id": 5, "campaign_id": "c", "devices": ["#,
        MALFORMED,
        None,
        "not valid JSON",
    );
    rejects(
        br#"{"job_id": 5, "campaign_id": "c"} trailing"#,
        MALFORMED,
        None,
        "trailing",
    );
    rejects(
        br#"{"job_id":"j","campaign_id":"c","devices":["d"],"payload":{}"#,
        MALFORMED,
        None,
        "EOF",
    );
}

#[test]
fn echoed_values_are_cut_short() {
    let long = format!("{} {}", "a".repeat(100), "b".repeat(100_000));
    let err = rejects(
        &with("campaign_id", json!(long)),
        INVALID,
        Some("campaign_id"),
        "(100101 characters)",
    );
    assert!(err.to_string().len() < 300);
    let err = rejects(
        &with("send_rate", json!("x".repeat(100_000))),
        INVALID,
        Some("send_rate"),
        "invalid type",
    );
    assert!(err.to_string().chars().count() < 320);
}

#[test]
fn job_new_applies_the_same_rules() {
    let payload = RawValue::from_string("{}".into()).unwrap();
    assert!(Job::new("j", "c", vec!["d".into()], payload.clone()).is_ok());
    let err = Job::new("j", "c c", vec!["d".into()], payload.clone()).unwrap_err();
    assert_eq!(err.field(), Some("campaign_id"));
    let err = Job::new("j", "c", vec![], payload.clone()).unwrap_err();
    assert_eq!(err.field(), Some("devices"));
    let err = Job::new("j", "c", vec!["d".into(), String::new()], payload).unwrap_err();
    assert_eq!(err.field(), Some("devices[1]"));
    let err = Job::new(
        "j",
        "c",
        vec!["d".into()],
        RawValue::from_string("[]".into()).unwrap(),
    )
    .unwrap_err();
    assert_eq!(err.field(), Some("payload"));
}

// --- Properties. ---
