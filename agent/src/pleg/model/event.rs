//! What the PLEG emits: one lifecycle event per change of a container's runtime record.

use std::{collections::BTreeMap, sync::Arc, time::SystemTime};

use crate::{
    base::bus::Sequenced,
    pleg::model::{
        record::{ContainerId, HostIdentity, PodUid, Store},
        source::Source,
        trigger::{Observation, ObservationKind},
    },
};

/// Kind of a lifecycle event (kubelet's `PodLifeCycleEventType`, without `PodSync`: plegd's
/// level-triggered face is the sync loop's pod syncs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum PodLifecycleEventType {
    /// A container (or sandbox) is now running.
    ContainerStarted,
    /// A container (or sandbox) is now exited, or vanished while running.
    ContainerDied,
    /// An exited container (or sandbox) no longer exists.
    ContainerRemoved,
    /// A container's state became unknown (or created). Not sent by default: kubelet considers
    /// it unreliable.
    ContainerChanged,
}

impl PodLifecycleEventType {
    /// The name, as in the API's documentation, the output and the metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::ContainerStarted => "ContainerStarted",
            Self::ContainerDied => "ContainerDied",
            Self::ContainerRemoved => "ContainerRemoved",
            Self::ContainerChanged => "ContainerChanged",
        }
    }
}

/// One lifecycle event, as kubelet's PLEG would emit it plus plegd's provenance.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodLifecycleEvent {
    /// Increases by one per sent event, across all pods, for the life of the run.
    pub sequence: u64,
    pub pod: PodUid,
    pub pod_namespace: String,
    pub pod_name: String,
    /// The container (or sandbox) the event is about.
    pub container_id: ContainerId,
    /// Empty for sandboxes.
    pub container_name: String,
    pub event_type: PodLifecycleEventType,
    /// When the change was first seen: by the earliest trigger, else by the relist's list call.
    pub observed_at: SystemTime,
    pub emitted_at: SystemTime,
    /// Sources of the triggers that led to the event; `[Relist]` when none did.
    pub sources: Vec<Source>,
    /// What the triggers saw about this container.
    pub observations: Vec<Observation>,
    /// The runtime's exit code of the container, once exited (as of the record announced; for
    /// `ContainerRemoved`, its last one).
    pub exit_code: Option<i32>,
    /// The runtime's reason for the state ("Error", "OOMKilled", "Completed"); for a death
    /// the task service confirmed, the one the CRI store will show (`record::exit_reason`).
    pub reason: String,
    /// Which of the runtime's stores confirmed the state announced; `None` for a container
    /// removed unseen.
    pub confirmed_by: Option<Store>,
    /// The signal that ended the container's init, on a death: the kernel's word, else the
    /// runtime's exit status above 128.
    pub signal: Option<i32>,
    /// The container's image and restart attempt.
    pub image: String,
    pub attempt: u32,
    /// Who the container is on the host, once known.
    pub host: Option<Arc<HostIdentity>>,
    /// The pod's labels and annotations that plegd keeps (none by default).
    pub pod_labels: BTreeMap<String, String>,
    pub pod_annotations: BTreeMap<String, String>,
}

impl Sequenced for PodLifecycleEvent {
    fn sequence(&self) -> u64 {
        self.sequence
    }

    /// The event and the text it owns; the host identity it shares with its container's
    /// other events is counted in each (an upper bound).
    fn size(&self) -> usize {
        // A map's entry: its key and value in a B-tree node, with the nodes' slack.
        const ENTRY: usize = 2 * size_of::<String>() + 16;
        let map = |map: &BTreeMap<String, String>| -> usize {
            map.iter().map(|(k, v)| ENTRY + k.len() + v.len()).sum()
        };
        let texts = [
            &self.pod.0,
            &self.pod_namespace,
            &self.pod_name,
            &self.container_id.0,
            &self.container_name,
            &self.reason,
            &self.image,
        ];
        let observations: usize = self
            .observations
            .iter()
            .map(|o| {
                size_of::<Observation>()
                    + match &o.kind {
                        ObservationKind::Exec(path) => path.len(),
                        _ => 0,
                    }
            })
            .sum();
        let host = self.host.as_ref().map_or(0, |host| {
            size_of::<HostIdentity>() + host.cgroup_path.as_ref().map_or(0, String::len)
        });
        size_of::<Self>()
            + texts.iter().map(|text| text.len()).sum::<usize>()
            + self.sources.len() * size_of::<Source>()
            + observations
            + host
            + map(&self.pod_labels)
            + map(&self.pod_annotations)
    }
}

/// What a kernel observation is, told on its own: never a PLEG event, never numbered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum NoticeKind {
    /// Seen by the kernel, ahead of the runtime's word: the event that carries it follows if
    /// the runtime confirms it.
    Ahead,
    /// The runtime never confirmed it.
    Unconfirmed,
}

impl NoticeKind {
    /// The name, as in the API's documentation and the output (beside the events' types).
    pub fn name(self) -> &'static str {
        match self {
            Self::Ahead => "KernelObservation",
            Self::Unconfirmed => "ObservationUnconfirmed",
        }
    }
}

/// Kernel observations about one container, for the consumers that asked to see them before
/// (or without) the runtime's confirmation; best effort.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    pub kind: NoticeKind,
    /// The pod as last committed; empty for a container no relist has seen yet.
    pub pod: PodUid,
    pub pod_namespace: String,
    pub pod_name: String,
    pub container_id: ContainerId,
    pub container_name: String,
    /// What the kernel saw: only observations consumers are shown.
    pub observations: Vec<Observation>,
    pub observed_at: SystemTime,
    pub emitted_at: SystemTime,
}

impl Notice {
    /// Where every notice comes from: the kernel's probes.
    pub const SOURCE: Source = Source::Ebpf;
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(annotations: usize) -> PodLifecycleEvent {
        PodLifecycleEvent {
            sequence: 1,
            pod: PodUid("0d9c7a5e-2b8f-4a51-9d0c-3f1e6b7a8c9d".into()),
            pod_namespace: "default".into(),
            pod_name: "web-7d4b9c".into(),
            container_id: ContainerId("f".repeat(64)),
            container_name: "app".into(),
            event_type: PodLifecycleEventType::ContainerDied,
            observed_at: SystemTime::UNIX_EPOCH,
            emitted_at: SystemTime::UNIX_EPOCH,
            sources: vec![Source::Relist],
            observations: Vec::new(),
            exit_code: Some(137),
            reason: "Error".into(),
            confirmed_by: Some(Store::Task),
            signal: Some(9),
            image: "registry.example/web:1.2".into(),
            attempt: 0,
            host: None,
            pod_labels: BTreeMap::from([("app".into(), "web".into())]),
            pod_annotations: (0..annotations)
                .map(|i| (format!("a{i}"), "x".repeat(4_000)))
                .collect(),
        }
    }

    #[test]
    fn an_events_size_is_what_it_holds_give_or_take_its_overheads() {
        let plain = event(0).size();
        assert!((500..1_000).contains(&plain), "{plain}");
        // Four 4,000-byte annotations, what the 16 KiB default keeps of them.
        let large = event(4).size();
        assert!(
            (16_000..17_000).contains(&(large - plain)),
            "{plain} {large}"
        );
    }
}
