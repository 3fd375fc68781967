//! What the triggers behind a relist said, by target, and whether a runtime reading reflects
//! it: the scheduler's bookkeeping, carried with each batch so the relist can credit events to
//! the sources that saw them and tell when the runtime has not caught up yet.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::SystemTime,
};

use crate::pleg::{
    event::{Observation, Scope, TriggerSource},
    record::{ContainerId, ContainerState, PodRecords, PodUid},
};

/// What a targeted relist is about: a pod, or a container whose pod no relist has seen yet.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Target {
    Pod(PodUid),
    Container(ContainerId),
}

impl Target {
    pub(crate) fn scope(&self) -> Scope {
        match self {
            Self::Pod(uid) => Scope::Pod(uid.clone()),
            Self::Container(id) => Scope::Container(id.clone()),
        }
    }
}

/// What the triggers coalesced into one target said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hint {
    /// Distinct sources, sorted.
    pub sources: BTreeSet<TriggerSource>,
    /// The earliest trigger's time.
    pub observed_at: SystemTime,
    /// Observations with the container each is about, in arrival order.
    pub observations: Vec<(ContainerId, Observation)>,
    /// A trigger behind it carried no observation (a container created or removed, a pod
    /// changed): only a listing of the runtime answers it.
    pub listing_needed: bool,
}

impl Hint {
    pub(crate) fn merge(&mut self, other: Hint) {
        self.sources.extend(other.sources);
        self.observed_at = self.observed_at.min(other.observed_at);
        self.observations.extend(other.observations);
        self.listing_needed |= other.listing_needed;
    }
}

/// The hints behind one relist, by target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints(BTreeMap<Target, Hint>);

impl Hints {
    /// What the triggers said about one container of one pod: the pod's hint and the
    /// container's own, merged, keeping only the observations about this container.
    pub fn for_container(&self, pod: &PodUid, container: &ContainerId) -> Option<Hint> {
        // A full relist often has no hints: skip building the two owned lookup keys per event.
        if self.0.is_empty() {
            return None;
        }
        let by_pod = self.0.get(&Target::Pod(pod.clone()));
        let by_container = self.0.get(&Target::Container(container.clone()));
        let mut hint: Option<Hint> = None;
        for h in by_pod.into_iter().chain(by_container) {
            let only_this = Hint {
                observations: h
                    .observations
                    .iter()
                    .filter(|(id, _)| id == container)
                    .cloned()
                    .collect(),
                ..h.clone()
            };
            match &mut hint {
                Some(acc) => acc.merge(only_this),
                None => hint = Some(only_this),
            }
        }
        hint
    }

    /// Every source that contributed a hint.
    pub fn sources(&self) -> BTreeSet<TriggerSource> {
        self.0
            .values()
            .flat_map(|h| h.sources.iter().copied())
            .collect()
    }

    /// Every observation, with its container.
    pub fn observations(&self) -> impl Iterator<Item = &(ContainerId, Observation)> {
        self.0.values().flat_map(|h| &h.observations)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Whether a trigger behind them carried no observation, so only a listing answers it.
    pub fn listing_needed(&self) -> bool {
        self.0.values().any(|h| h.listing_needed)
    }

    pub(crate) fn insert(&mut self, target: Target, hint: Hint) {
        match self.0.get_mut(&target) {
            Some(existing) => existing.merge(hint),
            None => {
                self.0.insert(target, hint);
            }
        }
    }

    /// The targets whose hints a reading (`listed`, of the targets or of the whole node) does
    /// not reflect yet, with their hints: a container a source saw start is not listed
    /// running or exited, one a source saw die is still listed running, one the runtime
    /// deleted is still listed. `committed` is the reading before it: a container it held
    /// that this one does not was removed since, and nothing more will come of what was seen
    /// of it.
    pub fn unreflected(&self, listed: &PodRecords, committed: &PodRecords) -> Hints {
        let state_in = |records: &PodRecords, id: &ContainerId| {
            records
                .values()
                .find_map(|pod| pod.containers.get(id))
                .map(|c| c.state)
        };
        let deleted: BTreeSet<&ContainerId> = self
            .observations()
            .filter(|(_, o)| o.kind.is_deletion())
            .map(|(id, _)| id)
            .collect();
        let gone = |id: &ContainerId| {
            state_in(listed, id).is_none()
                && (deleted.contains(id) || state_in(committed, id).is_some())
        };
        let reflects = |target: &Target, hint: &Hint| {
            // A container the reading does not show, and never showed, is an answer when
            // nothing was observed of it (its create event came before the runtime's store
            // has it): retrying would only crowd the relists for seconds. Something observed
            // of it (an exec, a start, an exit) says the runtime must come to show it.
            if let Target::Container(id) = target
                && state_in(listed, id).is_none()
                && !gone(id)
                && hint.observations.iter().any(|(about, _)| about == id)
            {
                return false;
            }
            hint.observations.iter().all(|(id, observation)| {
                let state = state_in(listed, id);
                match observation.kind {
                    // Whatever else was seen of it: the runtime's store forgets it a moment
                    // after its delete event, and only a reading without it answers.
                    _ if deleted.contains(id) => state.is_none(),
                    _ if gone(id) => true,
                    // A source saw it die: the runtime must not still show it running.
                    ref kind if kind.is_death() => state != Some(ContainerState::Running),
                    // Its init started (the kernel saw it exec, or the task service started
                    // it): the CRI store marks it running only once the start call returns.
                    _ => matches!(
                        state,
                        Some(ContainerState::Running | ContainerState::Exited)
                    ),
                }
            })
        };
        Hints(
            self.0
                .iter()
                .filter(|(target, hint)| !reflects(target, hint))
                .map(|(target, hint)| (target.clone(), hint.clone()))
                .collect(),
        )
    }

    /// The targets, in order.
    pub fn targets(&self) -> impl Iterator<Item = &Target> {
        self.0.keys()
    }
}

impl IntoIterator for Hints {
    type Item = (Target, Hint);
    type IntoIter = std::collections::btree_map::IntoIter<Target, Hint>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// For tests: the hints of one pod-wide trigger, each observation about its container.
#[cfg(test)]
pub(crate) fn pod_hints(
    pod: &str,
    observations: &[(&str, TriggerSource, crate::pleg::event::ObservationKind)],
) -> Hints {
    let mut hints = Hints::default();
    hints.insert(
        Target::Pod(PodUid(pod.to_owned())),
        Hint {
            sources: observations.iter().map(|(_, source, _)| *source).collect(),
            observed_at: SystemTime::UNIX_EPOCH,
            observations: observations
                .iter()
                .map(|(id, source, kind)| {
                    let observation = Observation {
                        source: *source,
                        kind: kind.clone(),
                    };
                    (ContainerId((*id).to_owned()), observation)
                })
                .collect(),
            listing_needed: observations.is_empty(),
        },
    );
    hints
}

#[cfg(test)]
mod tests {
    use ContainerState::{Created, Exited, Running};
    use ObservationKind::{CgroupRemoved, Deleted, Exec, ExitCode, OomKilled, Signal, TaskStarted};

    use super::*;
    use crate::{
        pleg::event::ObservationKind,
        runtime::testing::{container, pod},
    };

    fn listed(containers: &[(&str, ContainerState)]) -> PodRecords {
        let containers = containers
            .iter()
            .map(|(id, state)| container(id, "", *state));
        let pod = pod("p", "web", containers);
        PodRecords::from([(pod.uid.clone(), pod)])
    }

    /// The hints of one trigger on `target`, each observation about its container.
    fn hints(target: &Target, observations: &[(&str, ObservationKind)]) -> Hints {
        let mut hints = Hints::default();
        hints.insert(
            target.clone(),
            Hint {
                sources: BTreeSet::from([TriggerSource::Ebpf]),
                observed_at: SystemTime::UNIX_EPOCH,
                observations: observations
                    .iter()
                    .map(|(id, kind)| {
                        let observation = Observation {
                            source: TriggerSource::Ebpf,
                            kind: kind.clone(),
                        };
                        (ContainerId((*id).to_owned()), observation)
                    })
                    .collect(),
                listing_needed: observations.is_empty(),
            },
        );
        hints
    }

    #[test]
    fn a_reading_reflects_hints_once_the_runtime_shows_what_they_saw() {
        let pod = Target::Pod(PodUid("p".into()));
        let container = |id: &str| Target::Container(ContainerId(id.into()));
        let cases = [
            (
                "no observation",
                pod.clone(),
                vec![],
                vec![],
                vec![("a", Running)],
                true,
            ),
            (
                "a death while still running",
                pod.clone(),
                vec![("a", Signal(9))],
                vec![],
                vec![("a", Running)],
                false,
            ),
            (
                "a death once exited",
                pod.clone(),
                vec![("a", ExitCode(1))],
                vec![],
                vec![("a", Exited)],
                true,
            ),
            (
                "a death once gone",
                pod.clone(),
                vec![("a", OomKilled)],
                vec![],
                vec![],
                true,
            ),
            (
                "a removed cgroup still running",
                pod.clone(),
                vec![("a", CgroupRemoved)],
                vec![],
                vec![("a", Running)],
                false,
            ),
            (
                "an exec not yet running",
                pod.clone(),
                vec![("a", Exec("/app".into()))],
                vec![],
                vec![],
                false,
            ),
            (
                "an exec once running",
                pod.clone(),
                vec![("a", Exec("/app".into()))],
                vec![],
                vec![("a", Running)],
                true,
            ),
            (
                "an exec already exited",
                pod.clone(),
                vec![("a", Exec("/app".into()))],
                vec![],
                vec![("a", Exited)],
                true,
            ),
            (
                "a container scope not listed, nothing observed (not created yet, or removed)",
                container("a"),
                vec![],
                vec![],
                vec![("b", Running)],
                true,
            ),
            (
                "a container scope not listed yet, its exec observed",
                container("a"),
                vec![("a", Exec("/app".into()))],
                vec![],
                vec![("b", Running)],
                false,
            ),
            (
                "a container scope not listed yet, its death observed",
                container("a"),
                vec![("a", Signal(9))],
                vec![],
                vec![],
                false,
            ),
            (
                "a container scope listed",
                container("a"),
                vec![],
                vec![],
                vec![("a", Running)],
                true,
            ),
            (
                "a start, then removed (known before)",
                pod.clone(),
                vec![(
                    "a",
                    TaskStarted {
                        at: SystemTime::UNIX_EPOCH,
                    },
                )],
                vec![("a", Created)],
                vec![("b", Running)],
                true,
            ),
            (
                "a container scope not listed any more, its start observed",
                container("a"),
                vec![(
                    "a",
                    TaskStarted {
                        at: SystemTime::UNIX_EPOCH,
                    },
                )],
                vec![("a", Running)],
                vec![],
                true,
            ),
            (
                "a deletion still listed",
                container("a"),
                vec![("a", Deleted)],
                vec![("a", Exited)],
                vec![("a", Exited)],
                false,
            ),
            (
                "a deletion no longer listed",
                container("a"),
                vec![("a", Deleted)],
                vec![("a", Exited)],
                vec![("b", Running)],
                true,
            ),
            (
                "a death, then a deletion, still listed exited",
                pod.clone(),
                vec![("a", Signal(9)), ("a", Deleted)],
                vec![("a", Running)],
                vec![("a", Exited)],
                false,
            ),
            (
                "a deletion of a container never listed",
                container("a"),
                vec![("a", Deleted)],
                vec![],
                vec![],
                true,
            ),
        ];
        for (name, target, observations, committed, containers, want) in cases {
            let got = hints(&target, &observations)
                .unreflected(&listed(&containers), &listed(&committed))
                .is_empty();
            assert_eq!(got, want, "{name}");
        }
    }

    #[test]
    fn only_the_targets_a_reading_does_not_reflect_are_left() {
        let mut both = hints(&Target::Pod(PodUid("p".into())), &[("a", Signal(9))]);
        for (target, hint) in hints(
            &Target::Container(ContainerId("b".into())),
            &[("b", Exec("/app".into()))],
        ) {
            both.insert(target, hint);
        }
        let left = both.unreflected(
            &listed(&[("a", Exited), ("b", Created)]),
            &PodRecords::new(),
        );
        assert_eq!(
            left.targets().collect::<Vec<_>>(),
            [&Target::Container(ContainerId("b".into()))]
        );
    }
}
