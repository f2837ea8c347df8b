//! Messages whose headers rdkafka's own accessors cannot read: a non-UTF-8 header name
//! (rdkafka's reader panics on it), through the real broker, and a header block
//! librdkafka cannot parse (rdkafka's reader reports "no headers"), through librdkafka's
//! mock cluster (tansu refuses to store such a record). Both must come back from
//! `inspect_message` as `malformed_job`, without a panic.

use crate::harness::{Producer, Record};
use crate::helpers::{brokers, fresh_topic, unique_name};
use pushpace::store::DeadLetterKind;
use pushpace::worker::message::{inspect_message, raw_headers, HeaderSource, Rejection};
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{BorrowedMessage, Headers, OwnedHeaders};
use rdkafka::mocking::MockCluster;
use rdkafka::{Message, Offset, TopicPartitionList};
use std::time::{Duration, Instant};

const JOB: &str = r#"{"job_id":"j1","campaign_id":"c1","devices":["t"],"payload":{}}"#;

/// How long the produced messages may take to come back: a produce with acks=all and a
/// fetch on the shared broker take well under a second; the rest is room for a 2-core
/// machine running other builds.
const READ_BACK_LIMIT: Duration = Duration::from_secs(60);

/// More headers than librdkafka's consumer will parse (it refuses over 100,000).
const UNPARSEABLE_HEADER_COUNT: usize = 100_001;

async fn produce(bootstrap: &str, topic: &str, headers: Vec<OwnedHeaders>) {
    let producer = Producer::on(bootstrap);
    for h in headers {
        let record = Record::of(JOB.as_bytes())
            .key(b"c1")
            .partition(0)
            .headers(h);
        producer.send(topic, record).await;
    }
}

/// Reads `count` messages of partition 0 from the start and hands each to `check`.
fn read_back(
    bootstrap: &str,
    topic: &str,
    count: usize,
    mut check: impl FnMut(usize, &BorrowedMessage<'_>),
) {
    let consumer: BaseConsumer =
        pushpace::broker::client_config(&crate::helpers::kafka(), bootstrap)
            .set("group.id", unique_name("poison"))
            .set("enable.auto.commit", "false")
            .create()
            .expect("consumer");
    let mut tpl = TopicPartitionList::new();
    tpl.add_partition_offset(topic, 0, Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).expect("assign");
    let deadline = Instant::now() + READ_BACK_LIMIT;
    let mut seen = 0;
    while seen < count {
        assert!(
            Instant::now() < deadline,
            "read {seen} of {count} messages in {READ_BACK_LIMIT:?}"
        );
        match consumer.poll(Duration::from_millis(200)) {
            Some(Ok(msg)) => {
                check(seen, &msg);
                seen += 1;
            }
            Some(Err(e)) => panic!("consume: {e}"),
            None => {}
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_utf8_header_names_and_values_are_malformed_not_a_panic() {
    let topic = fresh_topic(1).await;
    produce(
        &brokers(),
        &topic,
        vec![
            raw_headers(&[(&[0xff, 0xfe], Some(b"v"))]),
            raw_headers(&[(b"trace", Some(b"t")), (b"bin", Some(&[0xc3, 0x28]))]),
            raw_headers(&[(b"trace", Some(b"t")), (b"empty", None)]),
        ],
    )
    .await;

    let mut results: Vec<Result<String, Rejection>> = Vec::new();
    // The broker may hand headers back in another order (tansu does not keep theirs);
    // the reason names the index in the message as read.
    let mut bin_at = None;
    read_back(&brokers(), &topic, 3, |i, msg| {
        if i == 1 {
            let list = msg.header_list().expect("readable headers");
            bin_at = list.iter().position(|(name, _)| name == b"bin");
        }
        if i == 0 {
            // The broker kept the raw name bytes: rdkafka's own reader panics on them.
            let caught = std::panic::catch_unwind(|| msg.headers().map(|h| h.iter().count()));
            assert!(caught.is_err(), "rdkafka read the non-UTF-8 name");
        }
        let result = inspect_message(msg).map(|j| j.job_id);
        // A parked message is re-read detached; it must get the same answer.
        assert_eq!(inspect_message(&msg.detach()).map(|j| j.job_id), result);
        results.push(result);
    });

    let malformed = |reason: &str| {
        Err(Rejection {
            kind: DeadLetterKind::MalformedJob,
            reason: reason.into(),
        })
    };
    assert_eq!(
        results,
        vec![
            malformed(
                r#"header 0: the name is not UTF-8 text (invalid byte at offset 0): "\xff\xfe""#
            ),
            malformed(&format!(
                r#"header {} ("bin"): the value is not UTF-8 text (invalid byte at offset 0): "\xc3(""#,
                bin_at.expect("the header came back")
            )),
            Ok("j1".to_string()),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_librdkafka_cannot_parse_are_malformed() {
    let mock = MockCluster::new(1).expect("mock cluster");
    let topic = unique_name("jobs");
    mock.create_topic(&topic, 1, 1).expect("create topic");
    let empty: Vec<(&[u8], Option<&[u8]>)> = vec![(b"", None); UNPARSEABLE_HEADER_COUNT];
    produce(&mock.bootstrap_servers(), &topic, vec![raw_headers(&empty)]).await;

    read_back(&mock.bootstrap_servers(), &topic, 1, |_, msg| {
        // rdkafka's reader takes the unparseable block for "no headers".
        assert!(msg.headers().is_none());
        let r = inspect_message(msg).unwrap_err();
        assert_eq!(r.kind, DeadLetterKind::MalformedJob);
        assert_eq!(
            r.reason,
            "the message headers cannot be read: BadMessage (Local: Bad message format)"
        );
    });
}
