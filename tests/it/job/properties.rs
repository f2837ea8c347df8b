//! Property tests of the decoder: valid jobs (provider fields and subscriptions
//! included) round-trip, reformatting changes nothing, and arbitrary or mutated bytes
//! never panic and are refused with an actionable reason.

use proptest::prelude::*;
use pushpace::job::{
    decode, Job, Priority, PushOptions, PushType, MAX_DEVICE_TOKEN_BYTES, MAX_PAYLOAD_BYTES,
    MAX_TTL_S,
};
use pushpace::limiter::{Algorithm, Rate};
use pushpace::store::DeadLetterKind;
use serde_json::json;
use serde_json::value::RawValue;

fn id_strategy() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._:-]{1,128}"
}

fn token_strategy() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-zA-Z0-9_-]{1,64}",
        // Web Push subscriptions, kept as their compact JSON text.
        (
            "https://[a-z.]{1,20}/[!-~&&[^\"\\\\]]{0,40}",
            "[A-Za-z0-9_-]{1,90}",
            "[A-Za-z0-9_-]{1,24}"
        )
            .prop_map(|(endpoint, p256dh, auth)| {
                format!(
                    r#"{{"endpoint":"{endpoint}","keys":{{"p256dh":"{p256dh}","auth":"{auth}"}}}}"#
                )
            }),
        // Anything at all, escapes and non-ASCII included.
        any::<String>().prop_filter("1–4096 bytes", |s| !s.is_empty()
            && s.len() <= MAX_DEVICE_TOKEN_BYTES),
    ]
}

fn payload_strategy() -> impl Strategy<Value = Box<RawValue>> {
    let leaf = prop_oneof![
        any::<i64>().prop_map(|n| json!(n)),
        any::<bool>().prop_map(|b| json!(b)),
        ".{0,20}".prop_map(|s| json!(s)),
        Just(json!(null)),
        (-1e6f64..1e6).prop_map(|f| json!(f)),
    ];
    let value = leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(serde_json::Value::Array),
            prop::collection::btree_map(".{0,8}", inner, 0..4)
                .prop_map(|m| serde_json::Value::Object(m.into_iter().collect())),
        ]
    });
    (
        prop::collection::btree_map(".{0,8}", value, 0..6),
        any::<bool>(),
    )
        .prop_map(|(m, pretty)| {
            let v = serde_json::Value::Object(m.into_iter().collect());
            // Pretty-printed payloads check that inner whitespace survives as written.
            let text = if pretty {
                serde_json::to_string_pretty(&v)
            } else {
                serde_json::to_string(&v)
            }
            .unwrap();
            RawValue::from_string(text).unwrap()
        })
}

fn options_strategy() -> impl Strategy<Value = (Option<String>, PushOptions)> {
    (
        prop::option::of("[a-z0-9_-]{1,64}"),
        prop::option::of(prop::sample::select(vec![
            Priority::High,
            Priority::Normal,
            Priority::Low,
        ])),
        prop::option::of("[ -~]{1,64}"),
        prop_oneof![
            Just((None, None)),
            (0i64..i64::MAX).prop_map(|e| (Some(e), None)),
            (0u32..=MAX_TTL_S).prop_map(|t| (None, Some(t))),
        ],
        prop::option::of(prop::sample::select(PushType::ALL.to_vec())),
    )
        .prop_map(
            |(provider, priority, collapse_id, (expiration, ttl_s), push_type)| {
                let options = PushOptions {
                    priority,
                    collapse_id,
                    expiration,
                    ttl_s,
                    push_type,
                };
                (provider, options)
            },
        )
}

fn job_strategy() -> impl Strategy<Value = Job> {
    (
        options_strategy(),
        (
            id_strategy(),
            id_strategy(),
            prop::option::of(prop_oneof![
                0.001f64..1e7,
                (1u32..100_000).prop_map(f64::from)
            ]),
            prop::option::of(prop::sample::select(Algorithm::ALL.to_vec())),
            prop::collection::vec(token_strategy(), 1..20),
            payload_strategy().prop_filter("≤ 5 KiB", |p| p.get().len() <= MAX_PAYLOAD_BYTES),
            prop::option::of(id_strategy()),
        ),
    )
        .prop_map(
            |(
                (provider, options),
                (job_id, campaign_id, rate, algorithm, devices, payload, app),
            )| {
                let mut job = Job::new(job_id, campaign_id, devices, payload).unwrap();
                job.provider = provider;
                job = job.with_app(app);
                job.options = options;
                if let Some(r) = rate {
                    job = job.with_send_rate(Rate::per_second(r).unwrap());
                }
                if let Some(a) = algorithm {
                    job = job.with_algorithm(a);
                }
                job
            },
        )
}

proptest! {

    #[test]
    fn valid_jobs_round_trip(job in job_strategy()) {
        let bytes = job.to_json();
        let back = decode(&bytes).unwrap();
        prop_assert_eq!(&back, &job);
        // The payload's bytes are the producer's, exactly.
        prop_assert_eq!(back.payload.get(), job.payload.get());
    }

    #[test]
    fn reformatted_jobs_decode_the_same(job in job_strategy()) {
        // Field order and whitespace do not matter (the payload compares as JSON here).
        let v: serde_json::Value = serde_json::from_slice(&job.to_json()).unwrap();
        let text = serde_json::to_vec_pretty(&v).unwrap();
        let back = decode(&text).unwrap();
        prop_assert_eq!(&back.devices, &job.devices);
        prop_assert_eq!(&back.job_id, &job.job_id);
        let a: serde_json::Value = serde_json::from_str(back.payload.get()).unwrap();
        let b: serde_json::Value = serde_json::from_str(job.payload.get()).unwrap();
        prop_assert_eq!(a, b);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        if let Err(e) = decode(&bytes) {
            prop_assert!(!e.to_string().is_empty());
        }
    }

    #[test]
    fn mutated_jobs_never_panic_and_errors_are_actionable(
        job in job_strategy(),
        edits in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>(), 0u8..3), 1..6),
    ) {
        let mut bytes = job.to_json();
        for (at, byte, op) in edits {
            if bytes.is_empty() { break; }
            let i = at.index(bytes.len());
            match op {
                0 => bytes[i] = byte,
                1 => { bytes.remove(i); }
                _ => bytes.insert(i, byte),
            }
        }
        match decode(&bytes) {
            Ok(back) => {
                // Whatever was accepted obeys the rules and re-encodes to itself.
                prop_assert_eq!(decode(&back.to_json()).unwrap(), back);
            }
            Err(e) => {
                let reason = e.to_string();
                prop_assert!(!reason.chars().any(|c| c.is_control()), "{:?}", reason);
                prop_assert_eq!(e.field().is_some(), e.kind() == DeadLetterKind::InvalidJob);
            }
        }
    }
}
