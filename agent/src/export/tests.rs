use std::collections::BTreeMap;

use super::*;
use crate::{
    base::bus::EventBus,
    pleg::{ContainerId, PodLifecycleEventType, PodUid, TriggerSource},
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
        sources: vec![TriggerSource::Relist],
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

fn sequences(batch: &[Arc<PodLifecycleEvent>]) -> Vec<u64> {
    batch.iter().map(|e| e.sequence).collect()
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
    let mut events = bus.follow(1, 10_000);
    let burst = MAX_BATCH as u64 + 10;
    for s in 1..=burst {
        bus.publish(event(s));
    }
    let first = next_batch(&mut events, &metrics).await.unwrap();
    assert_eq!(
        sequences(&first),
        (1..=MAX_BATCH as u64).collect::<Vec<_>>()
    );
    let started = Instant::now();
    let rest = next_batch(&mut events, &metrics).await.unwrap();
    assert_eq!(
        sequences(&rest),
        (MAX_BATCH as u64 + 1..=burst).collect::<Vec<_>>()
    );
    assert_eq!(started.elapsed(), LINGER, "the rest waited for more");
    // A lone event, and one that comes while it lingers: one batch.
    let lone = tokio::spawn(async move {
        let batch = next_batch(&mut events, &Metrics::new()).await;
        (batch, events)
    });
    bus.publish(event(burst + 1));
    tokio::time::sleep(LINGER / 2).await;
    bus.publish(event(burst + 2));
    bus.close();
    let (batch, mut events) = lone.await.unwrap();
    assert_eq!(sequences(&batch.unwrap()), [burst + 1, burst + 2]);
    assert!(next_batch(&mut events, &metrics).await.is_none());
}

#[tokio::test(start_paused = true)]
async fn events_gone_from_the_history_are_counted_as_dropped() {
    let bus = EventBus::new(1, 5, 8);
    let metrics = Metrics::new();
    // Resuming after 2 with a history that keeps 6..=10 only.
    for s in 1..=10 {
        bus.publish(event(s));
    }
    let mut events = bus.follow(3, 8);
    bus.close();
    let batch = next_batch(&mut events, &metrics).await.unwrap();
    assert_eq!(sequences(&batch), [6, 7, 8, 9, 10]);
    assert_eq!(
        exported(&metrics, "plegd_otlp_dropped_total"),
        "plegd_otlp_dropped_total 3"
    );
}
