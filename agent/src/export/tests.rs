use std::collections::BTreeMap;

use super::*;
use crate::{
    base::bus::EventBus,
    pleg::{ContainerId, PodLifecycleEventType, PodUid, Source},
};

fn event(sequence: u64) -> Arc<PodLifecycleEvent> {
    Arc::new(PodLifecycleEvent {
        sequence,
        pod: PodUid("uid".into()),
        pod_namespace: "ns".into(),
        pod_name: "pod".into(),
        container_id: ContainerId(format!("c{sequence}")),
        container_name: "app".into(),
        event_type: PodLifecycleEventType::ContainerStarted,
        observed_at: std::time::SystemTime::UNIX_EPOCH,
        emitted_at: std::time::SystemTime::UNIX_EPOCH,
        sources: vec![Source::Relist],
        observations: Vec::new(),
        exit_code: None,
        reason: String::new(),
        confirmed_by: None,
        signal: None,
        image: String::new(),
        attempt: 0,
        host: None,
        pod_labels: BTreeMap::new(),
        pod_annotations: BTreeMap::new(),
    })
}

/// The sequences a batch's records carry.
fn sequences(batch: &Batch) -> Vec<u64> {
    use opentelemetry_proto::tonic::common::v1::any_value::Value;
    batch
        .records
        .iter()
        .map(|record| {
            let attribute = record
                .attributes
                .iter()
                .find(|a| a.key == "plegd.sequence")
                .and_then(|a| a.value.as_ref()?.value.as_ref());
            match attribute {
                Some(Value::IntValue(sequence)) => u64::try_from(*sequence).unwrap(),
                other => panic!("plegd.sequence: {other:?}"),
            }
        })
        .collect()
}

fn exported(metrics: &Metrics, name: &str) -> String {
    metrics
        .encode()
        .lines()
        .find(|line| line.starts_with(name))
        .unwrap_or_default()
        .to_owned()
}

#[tokio::test(start_paused = true)]
async fn a_burst_goes_in_batches_of_at_most_the_maximum_and_a_lone_event_after_the_linger() {
    let bus = EventBus::new(1, 10_000, 10_000);
    let metrics = Metrics::new();
    let mut events = Batcher::new(bus.follow(1, 10_000), 1);
    let burst = MAX_BATCH as u64 + 10;
    for s in 1..=burst {
        bus.publish(event(s));
    }
    let first = events.next(&metrics).await.unwrap();
    assert_eq!(
        sequences(&first),
        (1..=MAX_BATCH as u64).collect::<Vec<_>>()
    );
    let started = Instant::now();
    let rest = events.next(&metrics).await.unwrap();
    assert_eq!(
        sequences(&rest),
        (MAX_BATCH as u64 + 1..=burst).collect::<Vec<_>>()
    );
    assert_eq!(started.elapsed(), LINGER, "the rest waited for more");
    // A lone event, and one that comes while it lingers: one batch.
    let lone = tokio::spawn(async move {
        let batch = events.next(&Metrics::new()).await;
        (batch, events)
    });
    bus.publish(event(burst + 1));
    tokio::time::sleep(LINGER / 2).await;
    bus.publish(event(burst + 2));
    bus.close();
    let (batch, mut events) = lone.await.unwrap();
    assert_eq!(sequences(&batch.unwrap()), [burst + 1, burst + 2]);
    assert!(events.next(&metrics).await.is_none());
}

/// An event whose pod carries `bytes` of annotations.
fn large_event(sequence: u64, bytes: usize) -> Arc<PodLifecycleEvent> {
    let mut event = Arc::unwrap_or_clone(event(sequence));
    event.pod_annotations = BTreeMap::from([("a".to_owned(), "x".repeat(bytes))]);
    Arc::new(event)
}

#[tokio::test(start_paused = true)]
async fn a_batch_stays_within_its_bytes_and_a_larger_record_goes_alone() {
    let bus = EventBus::new(1, 100, 100);
    let metrics = Metrics::new();
    let mut batches = Batcher::new(bus.follow(1, 100), 1);
    // Ten of 300 KB: three to a batch.
    for s in 1..=10 {
        bus.publish(large_event(s, 300_000));
    }
    // One larger than a whole batch, between two small ones.
    bus.publish(event(11));
    bus.publish(large_event(12, MAX_BATCH_BYTES + 1));
    bus.publish(event(13));
    bus.close();
    let mut got = Vec::new();
    while let Some(batch) = batches.next(&metrics).await {
        assert!(
            batch.bytes <= MAX_BATCH_BYTES || batch.records.len() == 1,
            "{} bytes in {} records",
            batch.bytes,
            batch.records.len()
        );
        assert_eq!(batch.last, *sequences(&batch).last().unwrap());
        got.push(sequences(&batch));
    }
    let expected: [&[u64]; 6] = [&[1, 2, 3], &[4, 5, 6], &[7, 8, 9], &[10, 11], &[12], &[13]];
    assert_eq!(got, expected);
}

#[test]
fn only_a_request_the_receiver_says_it_will_never_take_is_dropped() {
    use tonic::{Code, Status};
    /// A `google.rpc.Status` whose details hold one message of `type_url`.
    fn details(type_url: &str) -> Vec<u8> {
        #[derive(Clone, PartialEq, prost::Message)]
        struct RpcStatus {
            #[prost(int32, tag = "1")]
            code: i32,
            #[prost(message, repeated, tag = "3")]
            details: Vec<prost_types::Any>,
        }
        let status = RpcStatus {
            code: Code::ResourceExhausted as i32,
            details: vec![prost_types::Any {
                type_url: type_url.to_owned(),
                value: Vec::new(),
            }],
        };
        prost::Message::encode_to_vec(&status)
    }
    let retry_info = details("type.googleapis.com/google.rpc.RetryInfo");
    let other = details("type.googleapis.com/google.rpc.DebugInfo");
    let cases = [
        (Status::invalid_argument("bad record"), true),
        (
            Status::resource_exhausted("Received message larger than max (5000000 vs. 4194304)"),
            true,
        ),
        (
            Status::with_details(Code::ResourceExhausted, "debug", other.into()),
            true,
        ),
        (
            Status::with_details(Code::ResourceExhausted, "slow down", retry_info.into()),
            false,
        ),
        (Status::unavailable("connection refused"), false),
        (Status::deadline_exceeded("10 s"), false),
        (Status::unknown("transport error"), false),
        (Status::internal("receiver bug"), false),
        (Status::unauthenticated("certificate rotated"), false),
        (Status::unimplemented("no logs pipeline yet"), false),
    ];
    for (status, dropped) in cases {
        assert_eq!(never_taken(&status), dropped, "{status:?}");
    }
}

#[test]
fn plain_http_beyond_this_host_is_told() {
    let cases = [
        ("http://127.0.0.1:4317", None),
        ("http://127.3.2.1:4317", None),
        ("http://localhost:4317", None),
        ("http://LOCALHOST:4317", None),
        ("http://[::1]:4317", None),
        ("https://otel.example:4317", None),
        ("http://otel.example:4317", Some("otel.example")),
        ("http://10.0.0.7:4317", Some("10.0.0.7")),
        ("http://[fd00::7]:4317", Some("[fd00::7]")),
        ("http://localhost.example:4317", Some("localhost.example")),
    ];
    for (endpoint, told) in cases {
        assert_eq!(
            plaintext_beyond_loopback(endpoint).as_deref(),
            told,
            "{endpoint}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn events_gone_from_the_history_are_counted_as_dropped() {
    let bus = EventBus::new(1, 5, 8);
    let metrics = Metrics::new();
    // Resuming after 2 with a history that keeps 6..=10 only.
    for s in 1..=10 {
        bus.publish(event(s));
    }
    let mut events = Batcher::new(bus.follow(3, 8), 1);
    bus.close();
    let batch = events.next(&metrics).await.unwrap();
    assert_eq!(sequences(&batch), [6, 7, 8, 9, 10]);
    assert_eq!(
        exported(&metrics, "plegd_otlp_dropped_total"),
        "plegd_otlp_dropped_total 3"
    );
}
