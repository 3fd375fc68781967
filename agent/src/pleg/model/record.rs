//! What a relist reads from the runtime: pods, their sandboxes and containers.
//!
//! Records are plain data, identical whichever backend (CRI, containerd) produced them, so the
//! diff, the cache and the tests never see a runtime type; they are saved across restarts
//! (`crate::daemon::state`).

use std::{
    cmp::Ordering,
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::SystemTime,
};

use serde::{Deserialize, Serialize};

use crate::pleg::model::{oom::OomKill, source::Source};

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

/// Which of the runtime's stores confirmed a container's state. containerd keeps two: its task
/// service knows of a start or an exit first; its CRI store shows it some 30 ms later, after
/// the runtime's cleanup. `--confirm` names the one whose word an event waits for.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Store {
    /// The runtime's container store, as CRI (or containerd's container API) shows it.
    #[default]
    #[serde(alias = "cri")]
    Cri,
    /// The runtime's task service (containerd's shim record of the container's init): it
    /// knows of a start or an exit some 30 ms before the CRI store does, which is updated
    /// only after the runtime's cleanup.
    #[serde(alias = "task")]
    Task,
}

impl Store {
    /// The lowercase name, as in the API, the config and the output.
    pub fn name(self) -> &'static str {
        match self {
            Self::Cri => "cri",
            Self::Task => "task",
        }
    }
}

/// A store named by its lowercase name (`--confirm task`).
impl std::str::FromStr for Store {
    type Err = UnknownStore;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        [Self::Task, Self::Cri]
            .into_iter()
            .find(|store| store.name() == name)
            .ok_or_else(|| UnknownStore(name.to_owned()))
    }
}

/// A name that is no store's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0:?} is not a store: task or cri")]
pub struct UnknownStore(String);

/// What the runtime's task service recorded about a container's init process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TaskRecord {
    /// The init process was started (at `at`, where the record says when).
    Started { at: Option<SystemTime> },
    /// The init process exited with `code` at `at`.
    Exited { code: i32, at: SystemTime },
}

/// Task records by container, for one relist.
pub type TaskRecords = BTreeMap<ContainerId, TaskRecord>;

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
    /// Runtime's reason for the state, e.g. "Error", "OOMKilled", "Completed"; for an exit
    /// the task service confirmed, the one its CRI store will show ([`exit_reason`]).
    pub reason: String,
    /// The record the state comes from; [`Store::Task`] until the CRI store catches up.
    #[serde(default)]
    pub confirmed_by: Store,
    /// The sources that said the OOM killer killed a process of the container while it ran
    /// (containerd recorded it, or the kernel said so): the reason of the exit that follows,
    /// whichever process it was.
    #[serde(default, skip_serializing_if = "BTreeSet::is_empty")]
    pub oom_killed_by: BTreeSet<Source>,
    /// The kernel's account of the last OOM kill in it while it ran (which limit, whom).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_kill: Option<Arc<OomKill>>,
    /// Who it is on the host, once the kernel or the runtime said.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host: Option<Arc<HostIdentity>>,
}

impl ContainerRecord {
    /// Whether the OOM killer killed one of its processes while it ran.
    pub fn oom_killed(&self) -> bool {
        !self.oom_killed_by.is_empty()
    }

    /// Whether its record awaits the CRI store, which tells an exit's reason (OOMKilled,
    /// Completed, ...): an exit only the task service confirmed, or one the CRI store showed
    /// before it recorded the OOM kill containerd told (`/tasks/oom` comes apart from
    /// `/tasks/exit`, and the CRI plugin records it as it comes, exited or not). A start the
    /// task service confirmed awaits nothing worth a read: the next full relist's listing finds
    /// the store caught up.
    pub fn awaits_cri(&self) -> bool {
        self.state == ContainerState::Exited
            && (self.confirmed_by == Store::Task
                || (!self.sandbox
                    && self.oom_killed_for(OomWitness::Runtime)
                    && self.reason != exit_reason(0, true)))
    }

    /// Whether `witness` says the OOM killer killed one of its processes: what decides its
    /// death's reason until the CRI store shows one.
    pub fn oom_killed_for(&self, witness: OomWitness) -> bool {
        match witness {
            OomWitness::Any => self.oom_killed(),
            OomWitness::Runtime => self.oom_killed_by.contains(&Source::Containerd),
        }
    }
}

/// Whose word on an OOM kill decides a death's reason before the CRI store shows it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum OomWitness {
    /// Any source's: the kernel's too. Where containerd's event stream does not reach plegd,
    /// the kernel's is the only word there is.
    #[default]
    Any,
    /// containerd's own record (`/tasks/oom`), the one its CRI store takes: its shim sees an
    /// OOM kill only once it watches the container's cgroup, and one the kernel saw before
    /// (a process that runs out of memory as it starts) is no reason CRI ever shows.
    Runtime,
}

/// Who a container is on the host: its cgroup (as the kernel's probes know it) and its init's
/// pid (as the kernel or the runtime said): what an agent joins plegd's events to its own
/// data by.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostIdentity {
    /// The cgroup2 id of its cgroup (the inode of the cgroup's directory).
    pub cgroup_id: Option<u64>,
    /// Its cgroup's path below the cgroup2 root.
    pub cgroup_path: Option<String>,
    /// The host pid of its init.
    pub init_pid: Option<u32>,
}

impl HostIdentity {
    /// `self` with what `newer` says laid over it.
    pub fn updated(&self, newer: &HostIdentity) -> HostIdentity {
        HostIdentity {
            cgroup_id: newer.cgroup_id.or(self.cgroup_id),
            cgroup_path: newer
                .cgroup_path
                .clone()
                .or_else(|| self.cgroup_path.clone()),
            init_pid: newer.init_pid.or(self.init_pid),
        }
    }
}

/// The reason containerd's CRI store shows for an exit with `code` (its `toCRIContainerStatus`,
/// the same in 1.6, 1.7 and 2.1): "OOMKilled" once it recorded an OOM kill of the container,
/// which it keeps whatever the code, else "Completed" for 0 and "Error" for any other.
pub fn exit_reason(code: i32, oom_killed: bool) -> &'static str {
    match (oom_killed, code) {
        (true, _) => "OOMKilled",
        (false, 0) => "Completed",
        (false, _) => "Error",
    }
}

/// One pod as listed by the runtime.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodRecord {
    pub uid: PodUid,
    pub namespace: String,
    pub name: String,
    /// Sandboxes and containers, keyed by id (sorted, so diffs are deterministic).
    pub containers: Containers,
    /// The pod's labels and annotations (its sandbox's), those kept by `--pod-labels` and
    /// `--pod-annotations` (none by default).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub annotations: BTreeMap<String, String>,
}

impl PodRecord {
    /// A pod known by its uid alone (empty: not even that), with no containers.
    pub fn known_as(uid: PodUid) -> PodRecord {
        PodRecord {
            uid,
            namespace: String::new(),
            name: String::new(),
            containers: Containers::new(),
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
        }
    }

    /// The pod's identity with no containers: the shell a partial reading fills.
    pub fn identity(&self) -> PodRecord {
        PodRecord {
            uid: self.uid.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
            containers: Containers::new(),
            labels: self.labels.clone(),
            annotations: self.annotations.clone(),
        }
    }
}

/// A pod's containers by id, sorted: a map over a sorted vector. A pod has a handful of
/// containers, and the relist copies every pod's record several times (listing, committed
/// reading, cache): a `BTreeMap` node holds eleven 160-byte records whatever the count, some
/// 2 KiB per pod and copy, which at 10,000 pods took the working set past the CPU's cache.
/// Saved (serde) and printed as a map.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Containers(Vec<(ContainerId, ContainerRecord)>);

impl Containers {
    pub fn new() -> Self {
        Self::default()
    }

    fn position(&self, id: &ContainerId) -> Result<usize, usize> {
        self.0.binary_search_by(|(key, _)| key.cmp(id))
    }

    pub fn get(&self, id: &ContainerId) -> Option<&ContainerRecord> {
        self.position(id).ok().map(|i| &self.0[i].1)
    }

    pub fn get_mut(&mut self, id: &ContainerId) -> Option<&mut ContainerRecord> {
        self.position(id).ok().map(|i| &mut self.0[i].1)
    }

    pub fn contains_key(&self, id: &ContainerId) -> bool {
        self.position(id).is_ok()
    }

    /// Adds or replaces `id`'s record; returns the one replaced.
    pub fn insert(&mut self, id: ContainerId, record: ContainerRecord) -> Option<ContainerRecord> {
        match self.position(&id) {
            Ok(i) => Some(std::mem::replace(&mut self.0[i].1, record)),
            Err(i) => {
                self.0.insert(i, (id, record));
                None
            }
        }
    }

    pub fn remove(&mut self, id: &ContainerId) -> Option<ContainerRecord> {
        self.position(id).ok().map(|i| self.0.remove(i).1)
    }

    /// Keeps only the records `keep` says to, as `BTreeMap::retain`.
    pub fn retain(&mut self, mut keep: impl FnMut(&ContainerId, &mut ContainerRecord) -> bool) {
        self.0.retain_mut(|(id, record)| keep(id, record));
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (&ContainerId, &ContainerRecord)> {
        self.0.iter().map(|(id, record)| (id, record))
    }

    pub fn iter_mut(
        &mut self,
    ) -> impl DoubleEndedIterator<Item = (&ContainerId, &mut ContainerRecord)> {
        self.0.iter_mut().map(|(id, record)| (&*id, record))
    }

    pub fn keys(&self) -> impl DoubleEndedIterator<Item = &ContainerId> + Clone {
        self.0.iter().map(|(id, _)| id)
    }

    pub fn values(&self) -> impl DoubleEndedIterator<Item = &ContainerRecord> + Clone {
        self.0.iter().map(|(_, record)| record)
    }

    pub fn values_mut(&mut self) -> impl DoubleEndedIterator<Item = &mut ContainerRecord> {
        self.0.iter_mut().map(|(_, record)| record)
    }
}

impl FromIterator<(ContainerId, ContainerRecord)> for Containers {
    /// Sorted by id; of two records with the same id the last wins, as in a map.
    fn from_iter<I: IntoIterator<Item = (ContainerId, ContainerRecord)>>(iter: I) -> Self {
        let mut entries: Vec<_> = iter.into_iter().collect();
        // Stable: equal ids keep their order, and dedup keeps the first of each run.
        entries.sort_by(|a, b| a.0.cmp(&b.0));
        entries.reverse();
        entries.dedup_by(|a, b| a.0 == b.0);
        entries.reverse();
        Self(entries)
    }
}

impl<const N: usize> From<[(ContainerId, ContainerRecord); N]> for Containers {
    fn from(entries: [(ContainerId, ContainerRecord); N]) -> Self {
        entries.into_iter().collect()
    }
}

impl std::ops::Index<&ContainerId> for Containers {
    type Output = ContainerRecord;

    /// Panics when there is no such container, as a map's index does (tests).
    fn index(&self, id: &ContainerId) -> &ContainerRecord {
        self.get(id).expect("no container with this id")
    }
}

impl<'a> IntoIterator for &'a Containers {
    type Item = (&'a ContainerId, &'a ContainerRecord);
    type IntoIter = std::iter::Map<
        std::slice::Iter<'a, (ContainerId, ContainerRecord)>,
        fn(&'a (ContainerId, ContainerRecord)) -> (&'a ContainerId, &'a ContainerRecord),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter().map(|(id, record)| (id, record))
    }
}

impl<'a> IntoIterator for &'a mut Containers {
    type Item = (&'a ContainerId, &'a mut ContainerRecord);
    type IntoIter = std::iter::Map<
        std::slice::IterMut<'a, (ContainerId, ContainerRecord)>,
        fn(&'a mut (ContainerId, ContainerRecord)) -> (&'a ContainerId, &'a mut ContainerRecord),
    >;

    fn into_iter(self) -> Self::IntoIter {
        self.0.iter_mut().map(|(id, record)| (&*id, record))
    }
}

impl IntoIterator for Containers {
    type Item = (ContainerId, ContainerRecord);
    type IntoIter = std::vec::IntoIter<(ContainerId, ContainerRecord)>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

impl std::fmt::Debug for Containers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_map().entries(self.iter()).finish()
    }
}

impl Serialize for Containers {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.iter())
    }
}

impl<'de> Deserialize<'de> for Containers {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let map = BTreeMap::<ContainerId, ContainerRecord>::deserialize(deserializer)?;
        Ok(map.into_iter().collect())
    }
}

/// Every pod a relist saw, keyed by uid.
pub type PodRecords = BTreeMap<PodUid, PodRecord>;

/// A container's entry in a pod's record, as [`side_by_side`] walks them: borrowed or owned.
pub trait ContainerEntry {
    fn id(&self) -> &ContainerId;
}

impl ContainerEntry for (&ContainerId, &ContainerRecord) {
    fn id(&self) -> &ContainerId {
        self.0
    }
}

impl ContainerEntry for (ContainerId, ContainerRecord) {
    fn id(&self) -> &ContainerId {
        &self.0
    }
}

/// The containers of two pods' records side by side, ascending by id: each id once, with its
/// entry in `old` and in `new` (each ascending), either of which may lack it. One walk over
/// both compares each id once or twice; a lookup of each id in each record (the relist's way
/// before) compared it with several others, and at 10,000 changed pods every compare of two
/// ids is a miss or two.
pub fn side_by_side<A: ContainerEntry, B: ContainerEntry>(
    old: impl IntoIterator<Item = A>,
    new: impl IntoIterator<Item = B>,
) -> impl Iterator<Item = (Option<A>, Option<B>)> {
    let (mut old, mut new) = (old.into_iter().peekable(), new.into_iter().peekable());
    std::iter::from_fn(move || {
        let order = match (old.peek(), new.peek()) {
            (None, None) => return None,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some(a), Some(b)) => a.id().cmp(b.id()),
        };
        Some(match order {
            Ordering::Less => (old.next(), None),
            Ordering::Greater => (None, new.next()),
            Ordering::Equal => (old.next(), new.next()),
        })
    })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn record(id: &str, attempt: u32) -> ContainerRecord {
        ContainerRecord {
            attempt,
            ..crate::runtime::testing::container(id, id, ContainerState::Running)
        }
    }

    proptest! {
        /// Built from any entries, the containers hold and save what a map would: sorted by
        /// id, the last of two records with the same id, and the same saved form (the state
        /// file wrote a map before).
        #[test]
        fn containers_behave_as_a_map(entries in prop::collection::vec((0u8..6, 0u32..4), 0..12)) {
            let entries: Vec<_> = entries
                .into_iter()
                .map(|(id, attempt)| (ContainerId(format!("c{id}")), record(&format!("c{id}"), attempt)))
                .collect();
            let map: BTreeMap<_, _> = entries.iter().cloned().collect();
            let mut containers: Containers = entries.into_iter().collect();
            prop_assert!(containers.iter().eq(map.iter()));
            prop_assert_eq!(
                serde_json::to_string(&containers).expect("serializes"),
                serde_json::to_string(&map).expect("serializes")
            );
            let saved = serde_json::to_string(&map).expect("serializes");
            prop_assert_eq!(&serde_json::from_str::<Containers>(&saved).expect("reads a map"), &containers);
            for id in map.keys() {
                let removed = containers.remove(id);
                prop_assert_eq!(removed.as_ref(), map.get(id));
                prop_assert!(!containers.contains_key(id));
            }
            prop_assert!(containers.is_empty());
        }

        /// Side by side, two pods' containers are every id of either once, ascending, each
        /// with what a lookup in each finds.
        #[test]
        fn side_by_side_answers_as_lookups(
            old in prop::collection::btree_set(0u8..8, 0..6),
            new in prop::collection::btree_set(0u8..8, 0..6),
            old_absent in any::<bool>(),
        ) {
            let containers = |ids: &std::collections::BTreeSet<u8>, attempt| -> Containers {
                ids.iter().map(|i| (ContainerId(format!("c{i}")), record(&format!("c{i}"), attempt))).collect()
            };
            let (old, new) = (containers(&old, 0), containers(&new, 1));
            let old = (!old_absent).then_some(&old);
            let mut ids: Vec<&ContainerId> = old.into_iter().flat_map(|c| c.keys()).chain(new.keys()).collect();
            ids.sort();
            ids.dedup();
            let walked: Vec<_> = side_by_side(old.into_iter().flatten(), new.clone())
                .map(|(a, b)| (a.map(|(id, c)| (id.clone(), c.clone())), b))
                .collect();
            let entry = |c: Option<&Containers>, id: &ContainerId| {
                c.and_then(|c| c.get(id)).map(|record| (id.clone(), record.clone()))
            };
            let looked_up: Vec<_> = ids
                .into_iter()
                .map(|id| (entry(old, id), entry(Some(&new), id)))
                .collect();
            prop_assert_eq!(walked, looked_up);
        }
    }
}
