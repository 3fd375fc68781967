//! What plegd last committed of the runtime (kubelet's `podRecords`): each pod's complete
//! record as its last events announced it, and which pod holds each container. The relist
//! reconciles every reading against it and commits the result; it is saved across restarts.

use std::{
    borrow::Borrow,
    collections::{BTreeMap, HashMap, HashSet},
    hash::{BuildHasher, Hash, Hasher},
    sync::Arc,
};

use smallvec::SmallVec;
use tokio::time::Instant;

use crate::pleg::model::record::{ContainerId, ContainerRecord, PodRecord, PodRecords, PodUid};

/// The committed records, with a container index over them.
///
/// Laid out for the full relist's walk, which compares each listed pod with its committed one:
/// when the pod is listed as it was last listed, the walk reads its key and one word of its
/// entry, both in the B-tree's node, and nothing else (see [`Entry`]). At 10,000 pods, reading
/// the records themselves (strings and containers elsewhere in memory, no longer in the CPU's
/// caches) made a steady relist 3 to 4 times slower per pod than at 100; now 1.3 to 1.5.
#[derive(Clone, Debug, Default)]
pub struct Committed {
    pods: BTreeMap<PodKey, Entry>,
    /// Container -> pod, over `pods`, so container triggers can be relisted by pod.
    pods_of_containers: HashMap<ContainerId, PodUid>,
    /// When the reading that last showed each container began ([`Committed::shown`]): reads
    /// run side by side, and one that began before the record was read must not undo it.
    read_at: HashMap<ContainerId, Instant>,
    /// Seeds the listings' fingerprints, anew at each start: no container id can be chosen to
    /// make two listings of a pod look the same.
    fingerprints: foldhash::quality::RandomState,
}

/// A pod's uid as the records are keyed by it: its bytes held in the key up to 40 (a
/// Kubernetes pod uid is a 36-byte UUID), so the walk compares a listed uid with the committed
/// one without reading a string elsewhere. Ordered as [`PodUid`].
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct PodKey(SmallVec<[u8; 40]>);

impl PodKey {
    fn of(uid: &PodUid) -> Self {
        Self(SmallVec::from_slice(uid.0.as_bytes()))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn uid(&self) -> PodUid {
        // Made of a `String`'s bytes: nothing is lost.
        PodUid(String::from_utf8_lossy(&self.0).into_owned())
    }
}

impl Borrow<[u8]> for PodKey {
    fn borrow(&self) -> &[u8] {
        &self.0
    }
}

/// A pod as committed.
#[derive(Clone, Debug)]
struct Entry {
    /// Out of the node, which the walk then reads in half the cache lines; shared with the
    /// pod cache, which holds the same record (one copy less per changed pod).
    record: Arc<PodRecord>,
    /// The fingerprint of the last listing a full relist found as this record, state for
    /// state ([`Committed::note_listing`]); none since the record was committed.
    listed: Option<u64>,
}

/// One committed pod as a full relist walks them.
#[derive(Clone, Copy, Debug)]
pub struct CommittedPod<'a> {
    /// Shared: a read that runs beside the relister takes it along.
    pub record: &'a Arc<PodRecord>,
    /// See [`Committed::note_listing`].
    pub listed: Option<u64>,
}

impl Committed {
    /// The committed pods, ascending.
    pub fn iter(&self) -> impl Iterator<Item = (&PodKey, CommittedPod<'_>)> {
        self.pods.iter().map(|(key, entry)| {
            let pod = CommittedPod {
                record: &entry.record,
                listed: entry.listed,
            };
            (key, pod)
        })
    }

    pub fn len(&self) -> usize {
        self.pods.len()
    }

    pub fn get(&self, uid: &PodUid) -> Option<&PodRecord> {
        self.shared(uid).map(|record| &**record)
    }

    /// Pod `uid`'s record, shared: a read that runs beside the relister takes it along.
    pub fn shared(&self, uid: &PodUid) -> Option<&Arc<PodRecord>> {
        self.pods.get(uid.0.as_bytes()).map(|entry| &entry.record)
    }

    /// The pod holding `container`, as last committed.
    pub fn pod_of(&self, container: &ContainerId) -> Option<&PodUid> {
        self.pods_of_containers.get(container)
    }

    /// `container`'s committed record.
    pub fn container(&self, container: &ContainerId) -> Option<&ContainerRecord> {
        let uid = self.pod_of(container)?;
        self.get(uid)?.containers.get(container)
    }

    /// Notes that a reading begun at `at` showed `container` as it is committed now.
    pub fn shown(&mut self, container: &ContainerId, at: Instant) {
        if self.pods_of_containers.contains_key(container) {
            let stamp = self.read_at.entry(container.clone()).or_insert(at);
            *stamp = (*stamp).max(at);
        }
    }

    /// Whether a reading begun after `at` showed `container` since it was committed last.
    pub fn read_since(&self, container: &ContainerId, at: Instant) -> bool {
        self.read_at.get(container).is_some_and(|read| *read > at)
    }

    pub fn into_pods(self) -> PodRecords {
        self.pods
            .into_iter()
            .map(|(key, entry)| (key.uid(), Arc::unwrap_or_clone(entry.record)))
            .collect()
    }

    /// The fingerprint of what [`crate::pleg::decide::reconcile::inspection_needed`] reads of a
    /// listing: equal for two listings (barring a 64-bit collision) only if the one needs an
    /// inspection whenever the other does, against the same record.
    pub fn fingerprint(&self, listed: &PodRecord, tombstones: &HashSet<ContainerId>) -> u64 {
        listing_fingerprint(listed, tombstones, self.fingerprints.build_hasher())
    }

    /// Notes that pod `uid` was listed as committed, in a listing of fingerprint `listing`: a
    /// listing of the same fingerprint needs no inspection until the pod's record changes.
    pub fn note_listing(&mut self, uid: &PodUid, listing: u64) {
        if let Some(entry) = self.pods.get_mut(uid.0.as_bytes()) {
            entry.listed = Some(listing);
        }
    }

    /// Makes `new` the record of pod `uid` (`None`: the pod is gone). `same_containers`: the
    /// caller found that `new` holds the containers (by id) the committed record holds
    /// ([`crate::pleg::decide::reconcile::PodPlan::same_containers`]); when false, they are compared
    /// here.
    pub fn commit(&mut self, uid: &PodUid, new: Option<Arc<PodRecord>>, same_containers: bool) {
        let Some(pod) = new else {
            if let Some(old) = self.pods.remove(uid.0.as_bytes()) {
                for id in old.record.containers.keys() {
                    self.pods_of_containers.remove(id);
                    self.read_at.remove(id);
                }
            }
            return;
        };
        let (index, read_at) = (&mut self.pods_of_containers, &mut self.read_at);
        match self.pods.get_mut(uid.0.as_bytes()) {
            Some(old) => {
                // Most pods keep their containers from one commit to the next: then the
                // container index stays as it is.
                if !same_containers && !old.record.containers.keys().eq(pod.containers.keys()) {
                    for id in old.record.containers.keys() {
                        if !pod.containers.contains_key(id) {
                            index.remove(id);
                            read_at.remove(id);
                        }
                    }
                    index_containers(index, uid, &pod);
                }
                old.record = pod;
                old.listed = None;
            }
            None => {
                index_containers(index, uid, &pod);
                let entry = Entry {
                    record: pod,
                    listed: None,
                };
                self.pods.insert(PodKey::of(uid), entry);
            }
        }
    }
}

/// Points each container of `pod` at `uid` in the container index.
fn index_containers(index: &mut HashMap<ContainerId, PodUid>, uid: &PodUid, pod: &PodRecord) {
    for id in pod.containers.keys() {
        match index.get_mut(id) {
            Some(known) if known == uid => {}
            Some(known) => *known = uid.clone(),
            None => {
                index.insert(id.clone(), uid.clone());
            }
        }
    }
}

/// A fingerprint of what reconcile's `inspection_needed` reads of a listed pod: its containers but those
/// the runtime recorded deleted, each by its id, state and confirming store, in order.
fn listing_fingerprint(
    listed: &PodRecord,
    tombstones: &HashSet<ContainerId>,
    mut hasher: impl Hasher,
) -> u64 {
    for c in listed
        .containers
        .values()
        .filter(|c| !tombstones.contains(&c.id))
    {
        (&c.id, c.state, c.confirmed_by).hash(&mut hasher);
    }
    hasher.finish()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pleg::model::record::ContainerState::{Exited, Running},
        runtime::testing::{container, pod},
    };

    #[test]
    fn the_index_follows_what_is_committed() {
        let mut committed = Committed::default();
        let uid = PodUid("p".into());
        let (a, b) = (ContainerId("a".into()), ContainerId("b".into()));
        let holding =
            |id: &str, state| Some(Arc::new(pod("p", "web", [container(id, "app", state)])));
        committed.commit(&uid, holding("a", Running), false);
        assert_eq!(committed.pod_of(&a), Some(&uid));
        // The caller found the containers the same: the index stays, the record changes.
        committed.commit(&uid, holding("a", Exited), true);
        assert_eq!(committed.pod_of(&a), Some(&uid));
        assert_eq!(committed.container(&a).map(|c| c.state), Some(Exited));
        committed.commit(&uid, holding("b", Running), false);
        assert_eq!(committed.pod_of(&a), None);
        assert_eq!(committed.container(&b).map(|c| c.state), Some(Running));
        committed.commit(&uid, None, false);
        assert_eq!(committed.pod_of(&b), None);
        assert_eq!(committed.len(), 0);
    }

    #[test]
    fn the_keys_walk_in_the_uids_order_and_give_them_back_whatever_their_length() {
        let long = "f".repeat(64); // a container's id, for a container with no pod
        let uids = [
            "b",
            "0f7c9a2e-5c1d-4d8e-9a3b-2f6e1c0d4b7a",
            long.as_str(),
            "a",
            "ab",
        ];
        let mut committed = Committed::default();
        for u in uids {
            committed.commit(&PodUid(u.into()), Some(Arc::new(pod(u, "web", []))), false);
        }
        let walked: Vec<PodUid> = committed.iter().map(|(key, _)| key.uid()).collect();
        let mut sorted: Vec<PodUid> = uids.iter().map(|u| PodUid((*u).into())).collect();
        sorted.sort();
        assert_eq!(walked, sorted);
        for uid in &sorted {
            assert_eq!(committed.get(uid).map(|p| &p.uid), Some(uid));
        }
        assert_eq!(
            committed.into_pods().into_keys().collect::<Vec<_>>(),
            sorted
        );
    }
}
