//! What plegd last committed of the runtime (kubelet's `podRecords`): each pod's complete
//! record as its last events announced it, and which pod holds each container. The relist
//! reconciles every reading against it and commits the result; it is saved across restarts.

use std::collections::HashMap;

use crate::pleg::record::{ContainerId, ContainerRecord, PodRecord, PodRecords, PodUid};

/// The committed records, with a container index over them.
#[derive(Clone, Debug, Default)]
pub struct Committed {
    pods: PodRecords,
    /// Container -> pod, over `pods`, so container triggers can be relisted by pod.
    pods_of_containers: HashMap<ContainerId, PodUid>,
}

impl Committed {
    pub fn pods(&self) -> &PodRecords {
        &self.pods
    }

    pub fn get(&self, uid: &PodUid) -> Option<&PodRecord> {
        self.pods.get(uid)
    }

    /// The pod holding `container`, as last committed.
    pub fn pod_of(&self, container: &ContainerId) -> Option<&PodUid> {
        self.pods_of_containers.get(container)
    }

    /// `container`'s committed record.
    pub fn container(&self, container: &ContainerId) -> Option<&ContainerRecord> {
        let uid = self.pod_of(container)?;
        self.pods.get(uid)?.containers.get(container)
    }

    pub fn into_pods(self) -> PodRecords {
        self.pods
    }

    /// Makes `new` the record of pod `uid` (`None`: the pod is gone).
    pub fn commit(&mut self, uid: &PodUid, new: Option<PodRecord>) {
        let Some(pod) = new else {
            if let Some(old) = self.pods.remove(uid) {
                for id in old.containers.keys() {
                    self.pods_of_containers.remove(id);
                }
            }
            return;
        };
        let index = &mut self.pods_of_containers;
        match self.pods.get_mut(uid) {
            // Most pods keep their containers from one commit to the next: replace the record
            // in place, leaving the map and the container index as they are.
            Some(old) if old.containers.keys().eq(pod.containers.keys()) => *old = pod,
            Some(old) => {
                for id in old.containers.keys() {
                    if !pod.containers.contains_key(id) {
                        index.remove(id);
                    }
                }
                index_containers(index, uid, &pod);
                *old = pod;
            }
            None => {
                index_containers(index, uid, &pod);
                self.pods.insert(uid.clone(), pod);
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{
        pleg::record::ContainerState::Running,
        runtime::testing::{container, pod},
    };

    #[test]
    fn the_index_follows_what_is_committed() {
        let mut committed = Committed::default();
        let uid = PodUid("p".into());
        let (a, b) = (ContainerId("a".into()), ContainerId("b".into()));
        committed.commit(
            &uid,
            Some(pod("p", "web", [container("a", "app", Running)])),
        );
        assert_eq!(committed.pod_of(&a), Some(&uid));
        committed.commit(
            &uid,
            Some(pod("p", "web", [container("b", "app", Running)])),
        );
        assert_eq!(committed.pod_of(&a), None);
        assert_eq!(committed.container(&b).map(|c| c.state), Some(Running));
        committed.commit(&uid, None);
        assert_eq!(committed.pod_of(&b), None);
        assert!(committed.pods().is_empty());
    }
}
