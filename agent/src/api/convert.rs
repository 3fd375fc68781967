//! Domain types to `plegd.v1` messages (and back, for the few enums clients send).

use std::time::SystemTime;

use plegd_proto::v1 as pb;
use prost_types::Timestamp;

use crate::{
    pleg::{
        cache::{CachedPod, PodCache},
        event::{
            Observation, ObservationKind, PodLifecycleEvent, PodLifecycleEventType, TriggerSource,
        },
        health::HealthError,
        record::{ContainerRecord, ContainerState, Layer, PodRecord},
    },
    sources::status::{SourceState, SourceStatus},
    sync_loop::{PodSync, SyncReason},
};

/// A wall-clock time as a protobuf timestamp.
pub fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::from(t)
}

/// The event as served.
pub fn event(event: &PodLifecycleEvent, run_id: u64) -> pb::Event {
    pb::Event {
        sequence: event.sequence,
        pod_uid: event.pod.0.clone(),
        pod_namespace: event.pod_namespace.clone(),
        pod_name: event.pod_name.clone(),
        container_id: event
            .container_id
            .as_ref()
            .map(|c| c.0.clone())
            .unwrap_or_default(),
        container_name: event.container_name.clone(),
        r#type: event_type(event.event_type) as i32,
        observed_at: Some(timestamp(event.observed_at)),
        emitted_at: Some(timestamp(event.emitted_at)),
        sources: event.sources.iter().map(|s| source(*s) as i32).collect(),
        observations: event.observations.iter().filter_map(observation).collect(),
        run_id,
        exit_code: event.exit_code,
        reason: event.reason.clone(),
        confirmed_by: event.confirmed_by.map_or(pb::Layer::Unspecified, layer) as i32,
    }
}

pub fn event_type(t: PodLifecycleEventType) -> pb::EventType {
    match t {
        PodLifecycleEventType::ContainerStarted => pb::EventType::ContainerStarted,
        PodLifecycleEventType::ContainerDied => pb::EventType::ContainerDied,
        PodLifecycleEventType::ContainerRemoved => pb::EventType::ContainerRemoved,
        PodLifecycleEventType::ContainerChanged => pb::EventType::ContainerChanged,
        PodLifecycleEventType::PodSync => pb::EventType::PodSync,
    }
}

pub fn source(s: TriggerSource) -> pb::TriggerSource {
    match s {
        TriggerSource::Ebpf => pb::TriggerSource::Ebpf,
        TriggerSource::Containerd => pb::TriggerSource::Containerd,
        TriggerSource::CriEvents => pb::TriggerSource::CriEvents,
        TriggerSource::Relist => pb::TriggerSource::Relist,
    }
}

/// An observation as consumers see it; `None` for those that only tell plegd where to look
/// ([`ObservationKind::is_shown`]).
pub fn observation(o: &Observation) -> Option<pb::Observation> {
    use pb::observation::Kind;
    let kind = match &o.kind {
        ObservationKind::ExitCode(code) => Kind::ExitCode(*code),
        ObservationKind::Signal(signal) => Kind::Signal(*signal),
        ObservationKind::OomKilled => Kind::OomKilled(true),
        ObservationKind::Exec(path) => Kind::Exec(path.clone()),
        ObservationKind::Exited => Kind::Exited(true),
        ObservationKind::CgroupRemoved => Kind::CgroupRemoved(true),
        ObservationKind::TaskStarted { .. } => Kind::TaskStarted(true),
        ObservationKind::TaskExited { code, .. } => Kind::ExitCode(*code),
        ObservationKind::Deleted => Kind::Deleted(true),
        ObservationKind::Present | ObservationKind::TaskDeleted => return None,
    };
    Some(pb::Observation {
        source: source(o.source) as i32,
        kind: Some(kind),
    })
}

/// A pod sync as served.
pub fn pod_sync(sync: &PodSync, run_id: u64) -> pb::PodSync {
    pb::PodSync {
        pod_uid: sync.pod.0.clone(),
        pod_namespace: sync.namespace.clone(),
        pod_name: sync.name.clone(),
        reason: sync_reason(sync.reason) as i32,
        status: pod_status(&sync.status),
        sequence: sync.sequence,
        run_id,
    }
}

pub fn sync_reason(r: SyncReason) -> pb::SyncReason {
    match r {
        SyncReason::Event => pb::SyncReason::Event,
        SyncReason::Resync => pb::SyncReason::Resync,
        SyncReason::Removed => pb::SyncReason::Removed,
    }
}

/// A cached pod, or `None` on a cache miss.
pub fn pod_status(cached: &CachedPod) -> Option<pb::PodStatus> {
    let record = cached.record.as_ref()?;
    Some(pod(record, cached.modified.map(to_wall)))
}

fn pod(record: &PodRecord, read_at: Option<SystemTime>) -> pb::PodStatus {
    pb::PodStatus {
        uid: record.uid.0.clone(),
        namespace: record.namespace.clone(),
        name: record.name.clone(),
        containers: record.containers.values().map(container).collect(),
        timestamp: read_at.map(timestamp),
    }
}

fn container(c: &ContainerRecord) -> pb::ContainerStatus {
    pb::ContainerStatus {
        id: c.id.0.clone(),
        name: c.name.clone(),
        attempt: c.attempt,
        image: c.image.clone(),
        state: container_state(c.state) as i32,
        created_at: c.created_at.map(timestamp),
        started_at: c.started_at.map(timestamp),
        finished_at: c.finished_at.map(timestamp),
        exit_code: c.exit_code.unwrap_or(0),
        reason: c.reason.clone(),
        sandbox: c.sandbox,
        has_exit_code: c.exit_code.is_some(),
        confirmed_by: layer(c.confirmed_by) as i32,
    }
}

pub fn layer(l: Layer) -> pb::Layer {
    match l {
        Layer::Cri => pb::Layer::Cri,
        Layer::Task => pb::Layer::Task,
    }
}

pub fn container_state(s: ContainerState) -> pb::ContainerState {
    match s {
        ContainerState::Created => pb::ContainerState::Created,
        ContainerState::Running => pb::ContainerState::Running,
        ContainerState::Exited => pb::ContainerState::Exited,
        ContainerState::Unknown => pb::ContainerState::Unknown,
    }
}

/// Every cached pod, sorted by namespace, name and uid.
pub fn pods(cache: &PodCache) -> Vec<pb::PodStatus> {
    let mut pods: Vec<pb::PodStatus> = cache
        .pods()
        .iter()
        .filter_map(|(_, cached)| pod_status(cached))
        .collect();
    pods.sort_by(|a, b| (&a.namespace, &a.name, &a.uid).cmp(&(&b.namespace, &b.name, &b.uid)));
    pods
}

/// Overall health and source states.
pub fn health(
    check: Result<(), HealthError>,
    sources: &[(TriggerSource, SourceStatus)],
    run_id: u64,
    last_sequence: u64,
) -> pb::Health {
    pb::Health {
        healthy: check.is_ok(),
        message: check.err().map(|e| e.to_string()).unwrap_or_default(),
        sources: sources
            .iter()
            .map(|(s, status)| pb::SourceHealth {
                source: source(*s) as i32,
                state: source_state(status.state) as i32,
                last_delivered: status.last_delivered.map(timestamp),
                detail: status.detail.clone(),
                chosen: status.chosen.clone(),
            })
            .collect(),
        run_id,
        last_sequence,
    }
}

fn source_state(s: SourceState) -> pb::SourceState {
    match s {
        SourceState::Disabled => pb::SourceState::Disabled,
        SourceState::Connecting => pb::SourceState::Connecting,
        SourceState::Connected => pb::SourceState::Connected,
        SourceState::Reconnecting => pb::SourceState::Reconnecting,
        SourceState::Unsupported => pb::SourceState::Unsupported,
    }
}

/// A monotonic instant as wall-clock time, by its age now.
fn to_wall(at: tokio::time::Instant) -> SystemTime {
    let age = tokio::time::Instant::now().saturating_duration_since(at);
    SystemTime::now()
        .checked_sub(age)
        .unwrap_or(SystemTime::UNIX_EPOCH)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::{
        output::from_timestamp,
        pleg::record::{ContainerId, PodUid},
    };

    #[test]
    fn an_event_carries_its_state_and_every_field() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let domain = PodLifecycleEvent {
            sequence: 3,
            pod: PodUid("u".into()),
            pod_namespace: "ns".into(),
            pod_name: "p".into(),
            container_id: Some(ContainerId("c1".into())),
            container_name: "app".into(),
            event_type: PodLifecycleEventType::ContainerDied,
            observed_at: at,
            emitted_at: at + Duration::from_millis(5),
            sources: vec![TriggerSource::Containerd],
            observations: vec![
                Observation {
                    source: TriggerSource::Ebpf,
                    kind: ObservationKind::OomKilled,
                },
                // Only where to look: not served.
                Observation {
                    source: TriggerSource::Containerd,
                    kind: ObservationKind::TaskDeleted,
                },
            ],
            exit_code: Some(137),
            reason: "Error".into(),
            confirmed_by: Some(Layer::Task),
        };
        let e = event(&domain, 9);
        assert_eq!(e.sequence, 3);
        assert_eq!(e.run_id, 9);
        assert_eq!(e.r#type(), pb::EventType::ContainerDied);
        assert_eq!(e.exit_code, Some(137));
        assert_eq!(e.reason, "Error");
        assert_eq!(e.confirmed_by(), pb::Layer::Task);
        assert_eq!(e.sources, [pb::TriggerSource::Containerd as i32]);
        assert_eq!(
            e.observations
                .iter()
                .map(|o| o.kind.clone())
                .collect::<Vec<_>>(),
            [Some(pb::observation::Kind::OomKilled(true))]
        );
        assert_eq!(from_timestamp(e.observed_at.as_ref()), Some(at));
        let unconfirmed = PodLifecycleEvent {
            confirmed_by: None,
            ..domain
        };
        assert_eq!(
            event(&unconfirmed, 1).confirmed_by(),
            pb::Layer::Unspecified
        );
    }

    #[test]
    fn a_cached_pod_lists_with_its_exit_code_and_time() {
        let cache = PodCache::new();
        let id = ContainerId("c1".into());
        let record = PodRecord {
            uid: PodUid("u".into()),
            namespace: "ns".into(),
            name: "p".into(),
            containers: [(
                id.clone(),
                crate::runtime::testing::exited(&id.0, "app", 137, "Error"),
            )]
            .into(),
        };
        cache.set(
            record.uid.clone(),
            Some(std::sync::Arc::new(record)),
            tokio::time::Instant::now(),
        );
        let listed = pods(&cache);
        assert_eq!(listed.len(), 1);
        assert!(listed[0].containers[0].has_exit_code);
        assert!(listed[0].timestamp.is_some());
    }
}
