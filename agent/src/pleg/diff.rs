//! The pure heart of the PLEG: two snapshots in, lifecycle events out (kubelet's
//! `generateEvents`). No runtime, no clock, no channel.

use std::collections::BTreeSet;

use crate::pleg::{
    event::PodLifecycleEventType,
    record::{ContainerId, ContainerState, PodRecord, PodRecords, PodUid, SortedLookup},
};

/// One event the diff found, before the relist dresses it up with names and provenance.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ContainerEvent {
    pub pod: PodUid,
    pub container: ContainerId,
    pub event_type: PodLifecycleEventType,
}

/// A container's state as far as the PLEG cares. `NonExistent` makes "appeared" and "vanished"
/// ordinary transitions of the same table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PlegState {
    Running,
    Exited,
    Unknown,
    NonExistent,
}

impl From<ContainerState> for PlegState {
    fn from(state: ContainerState) -> Self {
        match state {
            ContainerState::Running => Self::Running,
            ContainerState::Exited => Self::Exited,
            // A created container has not run yet: kubelet maps it to unknown too.
            ContainerState::Created | ContainerState::Unknown => Self::Unknown,
        }
    }
}

/// Diffs only `pods` (a targeted relist). A pod in `pods` but missing from `new` has vanished; a
/// pod outside `pods` is not looked at, so a targeted relist never takes the pods it did not
/// list for removed.
///
/// Events come per pod in the order of `pods`, and within a pod by container id; `ContainerDied`
/// precedes `ContainerRemoved` for a container that vanished while running. `ContainerChanged`
/// is included: the caller decides whether to send it.
pub fn diff_pods<'a>(
    old: &PodRecords,
    new: &PodRecords,
    pods: impl IntoIterator<Item = &'a PodUid>,
) -> Vec<ContainerEvent> {
    let mut events = Vec::new();
    let (mut old_pods, mut new_pods) = (SortedLookup::new(old), SortedLookup::new(new));
    for uid in pods {
        let (old_pod, new_pod) = (old_pods.get(uid), new_pods.get(uid));
        let container_events = |id: &ContainerId| {
            let from = state_of(old_pod, id);
            let to = state_of(new_pod, id);
            events.extend(
                transition(from, to)
                    .iter()
                    .map(|&event_type| ContainerEvent {
                        pod: uid.clone(),
                        container: id.clone(),
                        event_type,
                    }),
            );
        };
        match (old_pod, new_pod) {
            // The readings hold different containers: walk their union.
            (Some(o), Some(n)) if !o.containers.keys().eq(n.containers.keys()) => {
                let ids: BTreeSet<&ContainerId> =
                    o.containers.keys().chain(n.containers.keys()).collect();
                ids.into_iter().for_each(container_events);
            }
            // One reading, or two with the same containers (most pods, most of the time):
            // walk its ids as they are, without collecting a set per pod.
            _ => old_pod
                .or(new_pod)
                .into_iter()
                .flat_map(|pod| pod.containers.keys())
                .for_each(container_events),
        }
    }
    events
}

fn state_of(pod: Option<&PodRecord>, id: &ContainerId) -> PlegState {
    pod.and_then(|pod| pod.containers.get(id))
        .map_or(PlegState::NonExistent, |c| c.state.into())
}

/// Kubelet's transition table.
fn transition(from: PlegState, to: PlegState) -> &'static [PodLifecycleEventType] {
    use PlegState::*;
    use PodLifecycleEventType::*;
    if from == to {
        return &[];
    }
    match (from, to) {
        (_, Running) => &[ContainerStarted],
        (_, Exited) => &[ContainerDied],
        (_, Unknown) => &[ContainerChanged],
        (Exited, NonExistent) => &[ContainerRemoved],
        // Vanished without being seen exited: it died, then it was removed.
        (Running | Unknown, NonExistent) => &[ContainerDied, ContainerRemoved],
        // from == to was handled above.
        (NonExistent, NonExistent) => &[],
    }
}

#[cfg(test)]
mod tests {
    use std::collections::{BTreeMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    /// Diffs every pod of either snapshot (a full relist).
    fn diff(old: &PodRecords, new: &PodRecords) -> Vec<ContainerEvent> {
        let pods: BTreeSet<&PodUid> = old.keys().chain(new.keys()).collect();
        diff_pods(old, new, pods)
    }
    use crate::pleg::record::ContainerRecord;

    fn container(id: &str, state: ContainerState) -> ContainerRecord {
        crate::runtime::testing::container(id, id, state)
    }

    /// Builds records from `(pod, container, state)` triples.
    fn records(entries: &[(&str, &str, ContainerState)]) -> PodRecords {
        let mut pods = PodRecords::new();
        for &(pod, id, state) in entries {
            pods.entry(PodUid(pod.to_owned()))
                .or_insert_with(|| PodRecord {
                    uid: PodUid(pod.to_owned()),
                    namespace: "ns".to_owned(),
                    name: pod.to_owned(),
                    containers: crate::pleg::record::Containers::new(),
                })
                .containers
                .insert(ContainerId(id.to_owned()), container(id, state));
        }
        pods
    }

    fn event(pod: &str, id: &str, event_type: PodLifecycleEventType) -> ContainerEvent {
        ContainerEvent {
            pod: PodUid(pod.to_owned()),
            container: ContainerId(id.to_owned()),
            event_type,
        }
    }

    #[test]
    fn transition_table() {
        use ContainerState::*;
        use PodLifecycleEventType::*;
        // (old state, new state, expected events); None = the container does not exist.
        let table: &[(
            Option<ContainerState>,
            Option<ContainerState>,
            &[PodLifecycleEventType],
        )] = &[
            (None, None, &[]),
            (None, Some(Created), &[ContainerChanged]),
            (None, Some(Running), &[ContainerStarted]),
            (None, Some(Exited), &[ContainerDied]),
            (None, Some(Unknown), &[ContainerChanged]),
            (Some(Created), Some(Created), &[]),
            (Some(Created), Some(Unknown), &[]),
            (Some(Created), Some(Running), &[ContainerStarted]),
            (Some(Created), Some(Exited), &[ContainerDied]),
            (Some(Created), None, &[ContainerDied, ContainerRemoved]),
            (Some(Running), Some(Running), &[]),
            (Some(Running), Some(Exited), &[ContainerDied]),
            (Some(Running), Some(Unknown), &[ContainerChanged]),
            (Some(Running), Some(Created), &[ContainerChanged]),
            (Some(Running), None, &[ContainerDied, ContainerRemoved]),
            (Some(Exited), Some(Exited), &[]),
            (Some(Exited), Some(Running), &[ContainerStarted]),
            (Some(Exited), Some(Unknown), &[ContainerChanged]),
            (Some(Exited), None, &[ContainerRemoved]),
            (Some(Unknown), Some(Unknown), &[]),
            (Some(Unknown), Some(Running), &[ContainerStarted]),
            (Some(Unknown), Some(Exited), &[ContainerDied]),
            (Some(Unknown), None, &[ContainerDied, ContainerRemoved]),
        ];
        for &(from, to, expected) in table {
            let old = records(&from.map(|s| ("p", "c", s)).into_iter().collect::<Vec<_>>());
            let new = records(&to.map(|s| ("p", "c", s)).into_iter().collect::<Vec<_>>());
            let got: Vec<_> = diff(&old, &new).into_iter().map(|e| e.event_type).collect();
            assert_eq!(got, expected, "{from:?} -> {to:?}");
        }
    }

    #[test]
    fn sandboxes_are_containers_of_their_pod() {
        let mut old = records(&[("p", "sandbox", ContainerState::Running)]);
        for c in old.values_mut().flat_map(|pod| pod.containers.values_mut()) {
            c.sandbox = true;
        }
        let new = PodRecords::new();
        assert_eq!(
            diff(&old, &new),
            [
                event("p", "sandbox", PodLifecycleEventType::ContainerDied),
                event("p", "sandbox", PodLifecycleEventType::ContainerRemoved),
            ]
        );
    }

    #[test]
    fn order_is_by_pod_then_container() {
        use ContainerState::*;
        use PodLifecycleEventType::*;
        let old = records(&[("b", "z", Running), ("a", "y", Exited)]);
        let new = records(&[("b", "x", Running), ("a", "w", Running)]);
        assert_eq!(
            diff(&old, &new),
            [
                event("a", "w", ContainerStarted),
                event("a", "y", ContainerRemoved),
                event("b", "x", ContainerStarted),
                event("b", "z", ContainerDied),
                event("b", "z", ContainerRemoved),
            ]
        );
    }

    #[test]
    fn scoped_diff_ignores_pods_outside_the_scope() {
        use ContainerState::*;
        use PodLifecycleEventType::*;
        let old = records(&[("a", "c1", Running), ("b", "c2", Running)]);
        // A targeted relist of pod "a" lists only "a": "b" must not be taken for removed.
        let new = records(&[("a", "c1", Exited)]);
        let scope = [PodUid("a".to_owned())];
        assert_eq!(
            diff_pods(&old, &new, &scope),
            [event("a", "c1", ContainerDied)]
        );
        // A targeted relist of a pod that vanished reports its containers gone.
        let scope = [PodUid("b".to_owned())];
        assert_eq!(
            diff_pods(&old, &PodRecords::new(), &scope),
            [
                event("b", "c2", ContainerDied),
                event("b", "c2", ContainerRemoved)
            ]
        );
    }

    /// Replays events on a per-container state, as a consumer would.
    fn apply(state: &mut BTreeMap<(PodUid, ContainerId), PlegState>, events: &[ContainerEvent]) {
        for e in events {
            let key = (e.pod.clone(), e.container.clone());
            match e.event_type {
                PodLifecycleEventType::ContainerStarted => state.insert(key, PlegState::Running),
                PodLifecycleEventType::ContainerDied => state.insert(key, PlegState::Exited),
                PodLifecycleEventType::ContainerChanged => state.insert(key, PlegState::Unknown),
                PodLifecycleEventType::ContainerRemoved => state.remove(&key),
                PodLifecycleEventType::PodSync => None,
            };
        }
    }

    fn pleg_states(records: &PodRecords) -> BTreeMap<(PodUid, ContainerId), PlegState> {
        records
            .values()
            .flat_map(|pod| {
                pod.containers
                    .values()
                    .map(|c| ((pod.uid.clone(), c.id.clone()), c.state.into()))
            })
            .collect()
    }

    fn any_state() -> impl Strategy<Value = Option<ContainerState>> {
        prop_oneof![
            Just(None),
            Just(Some(ContainerState::Created)),
            Just(Some(ContainerState::Running)),
            Just(Some(ContainerState::Exited)),
            Just(Some(ContainerState::Unknown)),
        ]
    }

    /// A snapshot over a small universe (3 pods x 3 containers) so transitions collide often.
    fn any_snapshot() -> impl Strategy<Value = PodRecords> {
        prop::collection::vec(any_state(), 9).prop_map(|states| {
            let mut entries = Vec::new();
            for (i, state) in states.into_iter().enumerate() {
                if let Some(state) = state {
                    entries.push((format!("p{}", i / 3), format!("c{}", i % 3), state));
                }
            }
            let borrowed: Vec<_> = entries
                .iter()
                .map(|(p, c, s)| (p.as_str(), c.as_str(), *s))
                .collect();
            records(&borrowed)
        })
    }

    proptest! {
        #[test]
        fn events_replay_to_the_last_snapshot(snapshots in prop::collection::vec(any_snapshot(), 1..8)) {
            let mut state = pleg_states(&snapshots[0]);
            for pair in snapshots.windows(2) {
                let events = diff(&pair[0], &pair[1]);
                let unique: HashSet<_> = events.iter().collect();
                prop_assert_eq!(unique.len(), events.len(), "duplicate events: {:?}", events);
                apply(&mut state, &events);
            }
            prop_assert_eq!(state, pleg_states(snapshots.last().unwrap_or(&snapshots[0])));
        }

        #[test]
        fn identical_snapshots_yield_nothing(snapshot in any_snapshot()) {
            prop_assert!(diff(&snapshot, &snapshot).is_empty());
        }
    }
}
