//! What a relist reads from the runtime: pods, their sandboxes and containers.
//!
//! Records are plain data, identical whichever backend (CRI, containerd) produced them, so the
//! diff, the cache and the tests never see a runtime type; they are saved across restarts
//! (`crate::state`).

use std::{
    collections::{BTreeMap, btree_map},
    iter::Peekable,
    time::SystemTime,
};

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

/// Every pod a relist saw, keyed by uid.
pub type PodRecords = BTreeMap<PodUid, PodRecord>;

/// Looks up keys of a sorted map in ascending order by walking the map once, where a full
/// relist looks up every pod: at 10,000 pods a tree descent per pod compares a key against
/// some twenty others scattered over the heap, a walk against one or two next to each other.
/// A key behind the walk is still found, by a descent that restarts the walk there.
pub struct SortedLookup<'a, K, V> {
    map: &'a BTreeMap<K, V>,
    walk: Peekable<btree_map::Range<'a, K, V>>,
    /// The last key the walk went past: every key up to it is behind the walk.
    passed: Option<&'a K>,
}

impl<'a, K: Ord, V> SortedLookup<'a, K, V> {
    pub fn new(map: &'a BTreeMap<K, V>) -> Self {
        Self {
            map,
            walk: map.range::<K, _>(..).peekable(),
            passed: None,
        }
    }

    /// The value of `key`, as `map.get(key)`.
    pub fn get(&mut self, key: &K) -> Option<&'a V> {
        if self.passed.is_some_and(|passed| key <= passed) {
            // Behind the walk (the keys asked for do not ascend): restart it at `key`.
            self.walk = self.map.range(key..).peekable();
            self.passed = self.map.range(..key).next_back().map(|(k, _)| k);
        }
        while let Some((next, _)) = self.walk.next_if(|(next, _)| *next < key) {
            self.passed = Some(next);
        }
        self.walk
            .peek()
            .filter(|(next, _)| *next == key)
            .map(|(_, value)| *value)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// Whatever order the keys come in, ascending (a full relist) or not, each lookup
        /// answers as `get` does.
        #[test]
        fn sorted_lookup_answers_as_get(
            map in prop::collection::btree_map(0u8..40, any::<u16>(), 0..20),
            keys in prop::collection::vec(0u8..40, 0..40),
            ascending in any::<bool>(),
        ) {
            let mut keys = keys;
            if ascending {
                keys.sort();
            }
            let mut lookup = SortedLookup::new(&map);
            for key in &keys {
                prop_assert_eq!(lookup.get(key), map.get(key), "key {}", key);
            }
        }
    }
}
