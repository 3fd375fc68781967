//! plegd's domain types to `plegd.v1` messages, and back: written once, used wherever a
//! message is made or read (the API's watchers, the saved run's history, `plegd watch`).

use std::{sync::Arc, time::SystemTime};

use plegd_proto::v1 as pb;
use prost_types::Timestamp;

use crate::{
    pleg::{
        CachedPod, ContainerId, ContainerRecord, ContainerState, HealthError, HostIdentity, Notice,
        NoticeKind, Observation, ObservationKind, OomKill, OomScope, PodCache, PodLifecycleEvent,
        PodLifecycleEventType, PodRecord, PodSync, PodUid, Source, Store, SyncReason,
    },
    sources::status::{SourceState, SourceStatus},
};

/// A message that is no PLEG event: a kernel notice's, or one with an unknown type.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a PLEG event: type {0}")]
pub struct NotAnEvent(pub i32);

/// A wall-clock time as a protobuf timestamp.
pub fn timestamp(t: SystemTime) -> Timestamp {
    Timestamp::from(t)
}

/// A protobuf timestamp as a wall-clock time.
pub fn from_timestamp(t: Option<&Timestamp>) -> Option<SystemTime> {
    SystemTime::try_from(*t?).ok()
}

/// The event as served.
pub fn event(event: &PodLifecycleEvent, run_id: u64) -> pb::Event {
    pb::Event {
        sequence: event.sequence,
        pod_uid: event.pod.0.clone(),
        pod_namespace: event.pod_namespace.clone(),
        pod_name: event.pod_name.clone(),
        container_id: event.container_id.0.clone(),
        container_name: event.container_name.clone(),
        r#type: event_type(event.event_type) as i32,
        observed_at: Some(timestamp(event.observed_at)),
        emitted_at: Some(timestamp(event.emitted_at)),
        sources: event.sources.iter().map(|s| source(*s) as i32).collect(),
        observations: event.observations.iter().filter_map(observation).collect(),
        run_id,
        exit_code: event.exit_code,
        reason: event.reason.clone(),
        confirmed_by: event
            .confirmed_by
            .map_or(pb::Layer::Unspecified, store_to_pb) as i32,
        signal: event.signal.unwrap_or(0),
        image: event.image.clone(),
        attempt: event.attempt,
        host: event.host.as_deref().map(host),
        pod_labels: event.pod_labels.clone().into_iter().collect(),
        pod_annotations: event.pod_annotations.clone().into_iter().collect(),
    }
}

/// Who a container is on the host, as served.
pub fn host(host: &HostIdentity) -> pb::HostIdentity {
    pb::HostIdentity {
        cgroup_id: host.cgroup_id.unwrap_or(0),
        cgroup_path: host.cgroup_path.clone().unwrap_or_default(),
        init_pid: host.init_pid.unwrap_or(0),
    }
}

/// Who a container is on the host, back from a message (0 and empty: not known).
fn host_from_pb(host: &pb::HostIdentity) -> HostIdentity {
    HostIdentity {
        cgroup_id: Some(host.cgroup_id).filter(|id| *id != 0),
        cgroup_path: Some(host.cgroup_path.clone()).filter(|path| !path.is_empty()),
        init_pid: Some(host.init_pid).filter(|pid| *pid != 0),
    }
}

/// An event as served, back in plegd's terms (its run is the message's `run_id`).
pub fn event_from_pb(message: &pb::Event) -> Result<PodLifecycleEvent, NotAnEvent> {
    let event_type = event_type_from_pb(message.r#type()).ok_or(NotAnEvent(message.r#type))?;
    let time = |t: &Option<Timestamp>| from_timestamp(t.as_ref()).unwrap_or(SystemTime::UNIX_EPOCH);
    Ok(PodLifecycleEvent {
        sequence: message.sequence,
        pod: PodUid(message.pod_uid.clone()),
        pod_namespace: message.pod_namespace.clone(),
        pod_name: message.pod_name.clone(),
        container_id: ContainerId(message.container_id.clone()),
        container_name: message.container_name.clone(),
        event_type,
        observed_at: time(&message.observed_at),
        emitted_at: time(&message.emitted_at),
        sources: message.sources().filter_map(source_from_pb).collect(),
        observations: message
            .observations
            .iter()
            .filter_map(observation_from_pb)
            .collect(),
        exit_code: message.exit_code,
        reason: message.reason.clone(),
        confirmed_by: store_from_pb(message.confirmed_by()),
        signal: Some(message.signal).filter(|signal| *signal != 0),
        image: message.image.clone(),
        attempt: message.attempt,
        host: message.host.as_ref().map(|h| Arc::new(host_from_pb(h))),
        pod_labels: message.pod_labels.clone().into_iter().collect(),
        pod_annotations: message.pod_annotations.clone().into_iter().collect(),
    })
}

/// A kernel notice as served: an event of its own type, never numbered.
pub fn notice(notice: &Notice, run_id: u64) -> pb::Event {
    pb::Event {
        sequence: 0,
        pod_uid: notice.pod.0.clone(),
        pod_namespace: notice.pod_namespace.clone(),
        pod_name: notice.pod_name.clone(),
        container_id: notice.container_id.0.clone(),
        container_name: notice.container_name.clone(),
        r#type: notice_kind(notice.kind) as i32,
        observed_at: Some(timestamp(notice.observed_at)),
        emitted_at: Some(timestamp(notice.emitted_at)),
        sources: vec![source(Notice::SOURCE) as i32],
        observations: notice.observations.iter().filter_map(observation).collect(),
        run_id,
        ..pb::Event::default()
    }
}

/// A kernel notice as served, back in plegd's terms; `None` for a message of another type.
pub fn notice_from_pb(message: &pb::Event) -> Option<Notice> {
    let kind = [NoticeKind::Ahead, NoticeKind::Unconfirmed]
        .into_iter()
        .find(|kind| notice_kind(*kind) == message.r#type())?;
    let time = |t: &Option<Timestamp>| from_timestamp(t.as_ref()).unwrap_or(SystemTime::UNIX_EPOCH);
    Some(Notice {
        kind,
        pod: PodUid(message.pod_uid.clone()),
        pod_namespace: message.pod_namespace.clone(),
        pod_name: message.pod_name.clone(),
        container_id: ContainerId(message.container_id.clone()),
        container_name: message.container_name.clone(),
        observations: message
            .observations
            .iter()
            .filter_map(observation_from_pb)
            .collect(),
        observed_at: time(&message.observed_at),
        emitted_at: time(&message.emitted_at),
    })
}

/// What a Watch stream sends, back in plegd's terms.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Watched {
    Event(PodLifecycleEvent),
    Notice(Notice),
}

/// A message of a Watch stream back in plegd's terms: an event or a kernel notice;
/// [`NotAnEvent`] for a type this plegd does not know (a newer daemon's).
pub fn watched_from_pb(message: &pb::Event) -> Result<Watched, NotAnEvent> {
    match notice_from_pb(message) {
        Some(notice) => Ok(Watched::Notice(notice)),
        None => event_from_pb(message).map(Watched::Event),
    }
}

fn notice_kind(kind: NoticeKind) -> pb::EventType {
    match kind {
        NoticeKind::Ahead => pb::EventType::KernelObservation,
        NoticeKind::Unconfirmed => pb::EventType::ObservationUnconfirmed,
    }
}

pub fn event_type(t: PodLifecycleEventType) -> pb::EventType {
    match t {
        PodLifecycleEventType::ContainerStarted => pb::EventType::ContainerStarted,
        PodLifecycleEventType::ContainerDied => pb::EventType::ContainerDied,
        PodLifecycleEventType::ContainerRemoved => pb::EventType::ContainerRemoved,
        PodLifecycleEventType::ContainerChanged => pb::EventType::ContainerChanged,
    }
}

/// The PLEG event type of a message; `None` for the API's own types (kernel notices) and
/// `PodSync`, which the PLEG never emits.
pub fn event_type_from_pb(t: pb::EventType) -> Option<PodLifecycleEventType> {
    [
        PodLifecycleEventType::ContainerStarted,
        PodLifecycleEventType::ContainerDied,
        PodLifecycleEventType::ContainerRemoved,
        PodLifecycleEventType::ContainerChanged,
    ]
    .into_iter()
    .find(|domain| event_type(*domain) == t)
}

pub fn source(s: Source) -> pb::TriggerSource {
    match s {
        Source::Ebpf => pb::TriggerSource::Ebpf,
        Source::Containerd => pb::TriggerSource::Containerd,
        Source::CriEvents => pb::TriggerSource::CriEvents,
        Source::Relist => pb::TriggerSource::Relist,
    }
}

const SOURCES: [Source; 4] = [
    Source::Ebpf,
    Source::Containerd,
    Source::CriEvents,
    Source::Relist,
];

pub fn source_from_pb(s: pb::TriggerSource) -> Option<Source> {
    SOURCES.into_iter().find(|domain| source(*domain) == s)
}

/// A source's name as printed; `unspecified` for none.
pub fn source_name(s: pb::TriggerSource) -> &'static str {
    source_from_pb(s).map_or("unspecified", Source::name)
}

/// An observation as consumers see it; `None` for those that only tell plegd where to look
/// ([`ObservationKind::is_shown`]).
pub fn observation(o: &Observation) -> Option<pb::Observation> {
    use pb::observation::Kind;
    let kind = match &o.kind {
        ObservationKind::ExitCode(code) => Kind::ExitCode(*code),
        ObservationKind::Signal(signal) => Kind::Signal(*signal),
        ObservationKind::OomKilled => Kind::OomKilled(true),
        ObservationKind::OomKill(kill) => Kind::OomKill(oom_kill(kill)),
        ObservationKind::Exec(path) => Kind::Exec(path.clone()),
        ObservationKind::Exited => Kind::Exited(true),
        ObservationKind::CgroupRemoved => Kind::CgroupRemoved(true),
        ObservationKind::TaskStarted { .. } => Kind::TaskStarted(true),
        ObservationKind::TaskExited { code, .. } => Kind::ExitCode(*code),
        ObservationKind::Deleted => Kind::Deleted(true),
        ObservationKind::Present | ObservationKind::TaskDeleted | ObservationKind::Identity(_) => {
            return None;
        }
    };
    Some(pb::Observation {
        source: source(o.source) as i32,
        kind: Some(kind),
    })
}

/// An observation as served, back in plegd's terms: what a consumer is shown of it (the
/// runtime's task records come back as the facts they show, an exit code and a start).
pub fn observation_from_pb(o: &pb::Observation) -> Option<Observation> {
    use pb::observation::Kind;
    let kind = match o.kind.as_ref()? {
        Kind::ExitCode(code) => ObservationKind::ExitCode(*code),
        Kind::Signal(signal) => ObservationKind::Signal(*signal),
        Kind::OomKilled(_) => ObservationKind::OomKilled,
        Kind::OomKill(kill) => ObservationKind::OomKill(Arc::new(oom_kill_from_pb(kill))),
        Kind::Exec(path) => ObservationKind::Exec(path.clone()),
        Kind::Exited(_) => ObservationKind::Exited,
        Kind::CgroupRemoved(_) => ObservationKind::CgroupRemoved,
        Kind::TaskStarted(_) => ObservationKind::TaskStarted {
            at: SystemTime::UNIX_EPOCH,
            pid: 0,
        },
        Kind::Deleted(_) => ObservationKind::Deleted,
    };
    Some(Observation {
        source: source_from_pb(o.source())?,
        kind,
    })
}

/// An OOM kill's account as served.
pub fn oom_kill(kill: &OomKill) -> pb::OomKill {
    pb::OomKill {
        scope: oom_scope(kill.scope) as i32,
        cgroup: kill.cgroup.as_deref().unwrap_or_default().to_owned(),
        limit_bytes: kill.limit_bytes.unwrap_or_default(),
        victim_pid: kill.victim_pid,
        victim_comm: kill.victim_comm.clone(),
        victim_init: kill.victim_init,
    }
}

/// An OOM kill's account as served, back in plegd's terms.
pub fn oom_kill_from_pb(kill: &pb::OomKill) -> OomKill {
    OomKill {
        scope: OOM_SCOPES
            .into_iter()
            .find(|scope| oom_scope(*scope) == kill.scope())
            .unwrap_or(OomScope::Unknown),
        cgroup: Some(kill.cgroup.as_str())
            .filter(|c| !c.is_empty())
            .map(Into::into),
        limit_bytes: Some(kill.limit_bytes).filter(|&b| b != 0),
        victim_pid: kill.victim_pid,
        victim_comm: kill.victim_comm.clone(),
        victim_init: kill.victim_init,
    }
}

pub fn oom_scope(scope: OomScope) -> pb::OomScope {
    match scope {
        OomScope::Container => pb::OomScope::Container,
        OomScope::Pod => pb::OomScope::Pod,
        OomScope::Ancestor => pb::OomScope::Ancestor,
        OomScope::Node => pb::OomScope::Node,
        OomScope::Unknown => pb::OomScope::Unknown,
    }
}

const OOM_SCOPES: [OomScope; 5] = [
    OomScope::Container,
    OomScope::Pod,
    OomScope::Ancestor,
    OomScope::Node,
    OomScope::Unknown,
];

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

pub fn sync_reason_from_pb(r: pb::SyncReason) -> Option<SyncReason> {
    [SyncReason::Event, SyncReason::Resync, SyncReason::Removed]
        .into_iter()
        .find(|reason| sync_reason(*reason) == r)
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
        labels: record.labels.clone().into_iter().collect(),
        annotations: record.annotations.clone().into_iter().collect(),
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
        confirmed_by: store_to_pb(c.confirmed_by) as i32,
        host: c.host.as_deref().map(host),
        oom_killed: c.oom_killed(),
    }
}

/// A store as the API names it: `Layer`, the name its first version gave the enum, kept for
/// the clients generated from it (the wire carries only the numbers).
pub fn store_to_pb(store: Store) -> pb::Layer {
    match store {
        Store::Cri => pb::Layer::Cri,
        Store::Task => pb::Layer::Task,
    }
}

/// The store a message names; `None` for none.
pub fn store_from_pb(named: pb::Layer) -> Option<Store> {
    [Store::Cri, Store::Task]
        .into_iter()
        .find(|store| store_to_pb(*store) == named)
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
    sources: &[(Source, SourceStatus)],
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
    use crate::pleg::{ContainerId, PodUid};

    #[test]
    fn an_event_carries_its_state_and_every_field() {
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        let domain = PodLifecycleEvent {
            sequence: 3,
            pod: PodUid("u".into()),
            pod_namespace: "ns".into(),
            pod_name: "p".into(),
            container_id: ContainerId("c1".into()),
            container_name: "app".into(),
            event_type: PodLifecycleEventType::ContainerDied,
            observed_at: at,
            emitted_at: at + Duration::from_millis(5),
            sources: vec![Source::Containerd],
            observations: vec![
                Observation {
                    source: Source::Ebpf,
                    kind: ObservationKind::OomKilled,
                },
                // Only where to look: not served.
                Observation {
                    source: Source::Containerd,
                    kind: ObservationKind::TaskDeleted,
                },
            ],
            exit_code: Some(137),
            reason: "Error".into(),
            confirmed_by: Some(Store::Task),
            ..crate::runtime::testing::event(3, "p")
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
        assert_eq!(
            (e.signal, e.image.as_str()),
            (9, "localhost/busybox:latest")
        );
        let host = e.host.clone().unwrap();
        assert_eq!(
            (host.cgroup_id, host.cgroup_path.as_str(), host.init_pid),
            (4242, "/k8s.io/c1", 4243)
        );
        assert_eq!(e.pod_labels["app"], "p");
        // And back: what a message carries of the event is the event.
        let back = event_from_pb(&event(&crate::runtime::testing::event(3, "p"), 9)).unwrap();
        assert_eq!(back, crate::runtime::testing::event(3, "p"));
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
    fn an_oom_kills_account_is_served_and_read_back_whole() {
        let kill = OomKill {
            scope: OomScope::Ancestor,
            cgroup: Some("/kubepods/besteffort".into()),
            limit_bytes: Some(64 << 20),
            victim_pid: 77,
            victim_comm: "hog".into(),
            victim_init: false,
        };
        let observed = Observation {
            source: Source::Ebpf,
            kind: ObservationKind::OomKill(Arc::new(kill.clone())),
        };
        let served = observation(&observed).unwrap();
        let Some(pb::observation::Kind::OomKill(pb_kill)) = &served.kind else {
            panic!("{served:?}");
        };
        assert_eq!(pb_kill.scope(), pb::OomScope::Ancestor);
        assert_eq!(observation_from_pb(&served), Some(observed));
        assert_eq!(
            observation_from_pb(&served).unwrap().to_string(),
            "ebpf:oom_scope=ancestor(/kubepods/besteffort,limit=67108864,victim=77/hog)"
        );
        // A node OOM: no cgroup, no limit; an unset scope reads as unknown.
        let node = OomKill {
            scope: OomScope::Node,
            cgroup: None,
            limit_bytes: None,
            ..kill
        };
        assert_eq!(oom_kill_from_pb(&oom_kill(&node)), node);
        let unset = pb::OomKill::default();
        assert_eq!(oom_kill_from_pb(&unset).scope, OomScope::Unknown);
    }

    /// What `plegd watch` reads back of a Watch stream: events and notices whole, a type it
    /// does not know named.
    #[test]
    fn a_watch_streams_messages_read_back_as_events_and_notices() {
        let event = crate::runtime::testing::event(3, "p");
        assert_eq!(
            watched_from_pb(&self::event(&event, 9)),
            Ok(Watched::Event(event.clone()))
        );
        let at = SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000);
        for kind in [NoticeKind::Ahead, NoticeKind::Unconfirmed] {
            let told = Notice {
                kind,
                pod: event.pod.clone(),
                pod_namespace: "ns".into(),
                pod_name: "p".into(),
                container_id: event.container_id.clone(),
                container_name: "app".into(),
                observations: vec![Observation {
                    source: Source::Ebpf,
                    kind: ObservationKind::Signal(9),
                }],
                observed_at: at,
                emitted_at: at + Duration::from_millis(1),
            };
            let served = notice(&told, 9);
            assert_eq!(served.sequence, 0);
            assert_eq!(watched_from_pb(&served), Ok(Watched::Notice(told)));
        }
        let newer = pb::Event {
            r#type: 99,
            ..self::event(&event, 9)
        };
        assert_eq!(watched_from_pb(&newer), Err(NotAnEvent(99)));
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
            labels: Default::default(),
            annotations: Default::default(),
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
