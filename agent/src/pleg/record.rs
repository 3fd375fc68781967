//! What a relist reads from the runtime: pods, their sandboxes and containers.
//!
//! Records are plain data, identical whichever backend (CRI, containerd) produced them, so the
//! diff, the cache and the tests never see a runtime type; they are saved across restarts
//! (`crate::state`).

use std::{collections::BTreeMap, time::SystemTime};

use serde::{Deserialize, Serialize};

/// A pod's uid (`io.kubernetes.pod.uid`), or the container id for a container that has no pod.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PodUid(pub String);

impl std::fmt::Display for PodUid {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A container's (or sandbox's) runtime id.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct ContainerId(pub String);

impl std::fmt::Display for ContainerId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A container's state as the runtime reports it (CRI `ContainerState`; sandboxes map
/// READY -> Running and NOTREADY -> Exited).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ContainerState {
    Created,
    Running,
    Exited,
    Unknown,
}

impl ContainerState {
    /// How far a container's life has gone: created, then running, then exited; `None` for
    /// unknown, which is in no order.
    pub fn progress(self) -> Option<u8> {
        match self {
            Self::Created => Some(0),
            Self::Running => Some(1),
            Self::Exited => Some(2),
            Self::Unknown => None,
        }
    }
}

/// Which of the runtime's records a container's state was confirmed by.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Layer {
    /// The runtime's container store, as CRI (or containerd's container API) shows it.
    #[default]
    Cri,
    /// The runtime's task service (containerd's shim record of the container's init): it
    /// knows of a start or an exit some 30 ms before the CRI store does, which is updated
    /// only after the runtime's cleanup.
    Task,
}

impl Layer {
    /// The lowercase name, as in the API, the config and the output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cri => "cri",
            Self::Task => "task",
        }
    }
}

/// What the runtime's task service recorded about a container's init process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskRecord {
    /// The init process was started (at `at`, where the record says when).
    Started { at: Option<SystemTime> },
    /// The init process exited with `code` at `at`.
    Exited { code: i32, at: SystemTime },
}

/// One container or sandbox of a pod.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerRecord {
    pub id: ContainerId,
    /// Container name from the runtime metadata; empty for sandboxes.
    pub name: String,
    pub attempt: u32,
    pub image: String,
    pub state: ContainerState,
    /// True for the pod's sandbox; kubelet's PLEG treats sandboxes as containers of their pod.
    pub sandbox: bool,
    pub created_at: Option<SystemTime>,
    pub started_at: Option<SystemTime>,
    pub finished_at: Option<SystemTime>,
    /// Exit code once exited (from a status call; a list call does not carry it).
    pub exit_code: Option<i32>,
    /// Runtime's reason for the state, e.g. "Error", "OOMKilled", "Completed".
    pub reason: String,
    /// The record the state comes from; [`Layer::Task`] until the CRI store catches up.
    #[serde(default)]
    pub confirmed_by: Layer,
}

/// One pod as listed by the runtime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    /// Sandboxes and containers, keyed by id (sorted, so diffs are deterministic).
    pub containers: BTreeMap<ContainerId, ContainerRecord>,
}

impl PodRecord {
    /// Holds an inspection of the pod back to `listed`, the reading its events come from: a
    /// container the inspection shows further on (it exited, or was removed, between the list
    /// and the status calls) takes its listed record; one the listing lacks (created in
    /// between) is left out. The next reading announces them. Returns whether anything was
    /// held back.
    pub fn hold_back_to(&mut self, listed: &PodRecord) -> bool {
        let before = self.containers.len();
        self.containers
            .retain(|id, _| listed.containers.contains_key(id));
        let mut held = self.containers.len() < before;
        for (id, listed) in &listed.containers {
            let ahead = self.containers.get(id).is_none_or(|inspected| {
                matches!(
                    (inspected.state.progress(), listed.state.progress()),
                    (Some(i), Some(l)) if i > l
                )
            });
            if ahead {
                self.containers.insert(id.clone(), listed.clone());
                held = true;
            }
        }
        held
    }
}

/// Every pod a relist saw, keyed by uid.
pub type PodRecords = BTreeMap<PodUid, PodRecord>;

#[cfg(test)]
mod tests {
    use super::{ContainerState::*, *};
    use crate::runtime::testing::container;

    fn pod(containers: &[(&str, ContainerState)]) -> PodRecord {
        PodRecord {
            uid: PodUid("p".to_owned()),
            namespace: "ns".to_owned(),
            name: "p".to_owned(),
            containers: containers
                .iter()
                .map(|(id, state)| (ContainerId((*id).to_owned()), container(id, id, *state)))
                .collect(),
        }
    }

    #[test]
    fn an_inspection_is_held_back_to_the_listing_never_moved_on() {
        // (listed, inspected, cached, held back)
        let table = [
            (Running, Exited, Running, true),
            (Created, Running, Created, true),
            (Created, Exited, Created, true),
            (Running, Running, Running, false),
            // Behind the listing: the relist reads the pod again, nothing to hold back.
            (Exited, Running, Running, false),
            // Unknown is in no order.
            (Unknown, Exited, Exited, false),
            (Running, Unknown, Unknown, false),
        ];
        for (listed, inspected, cached, held) in table {
            let mut record = pod(&[("c", inspected)]);
            assert_eq!(
                record.hold_back_to(&pod(&[("c", listed)])),
                held,
                "{listed:?} listed, {inspected:?} inspected"
            );
            assert_eq!(record, pod(&[("c", cached)]), "{listed:?}, {inspected:?}");
        }
    }

    #[test]
    fn a_container_the_listing_lacks_is_left_out_of_the_cache() {
        let mut record = pod(&[("old", Running), ("new", Running)]);
        assert!(record.hold_back_to(&pod(&[("old", Running)])));
        assert_eq!(record, pod(&[("old", Running)]));
    }

    #[test]
    fn a_listed_container_the_inspection_lacks_is_cached_as_listed() {
        // Removed between the list and the status calls: its removal is the next reading's.
        let mut record = pod(&[("old", Running)]);
        assert!(record.hold_back_to(&pod(&[("old", Running), ("gone", Exited)])));
        assert_eq!(record, pod(&[("old", Running), ("gone", Exited)]));
    }
}
