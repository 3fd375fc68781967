//! What the triggers behind a relist said, by target: the scheduler's bookkeeping, carried with
//! each batch so the relist can credit events to the sources that saw them, lay the runtime's
//! own records they carry over its reading, and tell whether the runtime has caught up yet
//! (`crate::pleg::decide::reconcile`).

use std::{
    collections::{BTreeMap, BTreeSet},
    time::SystemTime,
};

use crate::pleg::model::{
    record::{ContainerId, PodUid, TaskRecord, TaskRecords},
    source::Source,
    trigger::{Observation, Scope},
};

/// What the triggers coalesced into one target said.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Hint {
    /// Distinct sources, sorted.
    pub sources: BTreeSet<Source>,
    /// The earliest trigger's time.
    pub observed_at: SystemTime,
    /// Observations with the container each is about, in arrival order.
    pub observations: Vec<(ContainerId, Observation)>,
    /// A trigger behind it said only that something changed (no observation): only a reading
    /// of the runtime answers it.
    pub unspecific: bool,
}

impl Hint {
    /// What one trigger of `source` saw: `observations`, each with its container (none: it
    /// said only that something changed).
    pub(crate) fn seen(
        source: Source,
        observed_at: SystemTime,
        observations: Vec<(ContainerId, Observation)>,
    ) -> Self {
        Self {
            sources: BTreeSet::from([source]),
            observed_at,
            unspecific: observations.is_empty(),
            observations,
        }
    }

    pub(crate) fn merge(&mut self, other: Hint) {
        self.sources.extend(other.sources);
        self.observed_at = self.observed_at.min(other.observed_at);
        self.observations.extend(other.observations);
        self.unspecific |= other.unspecific;
    }
}

/// The hints behind one relist, by target.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Hints(BTreeMap<Scope, Hint>);

impl Hints {
    /// What the triggers said about one container of one pod: the pod's hint and the
    /// container's own, merged, keeping only the observations about this container.
    pub fn for_container(&self, pod: &PodUid, container: &ContainerId) -> Option<Hint> {
        // A full relist often has no hints: skip building the two owned lookup keys per event.
        if self.0.is_empty() {
            return None;
        }
        let by_pod = self.0.get(&Scope::Pod(pod.clone()));
        let by_container = self.0.get(&Scope::Container(container.clone()));
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
    pub fn sources(&self) -> BTreeSet<Source> {
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

    /// The runtime's task records the hints carry (its `/tasks/start` and `/tasks/exit`), by
    /// container. An exit outranks a start.
    pub fn task_records(&self) -> TaskRecords {
        let mut records = TaskRecords::new();
        for (id, observation) in self.observations() {
            let Some(record) = observation.kind.task_record() else {
                continue;
            };
            if !matches!(records.get(id), Some(TaskRecord::Exited { .. })) {
                records.insert(id.clone(), record);
            }
        }
        records
    }

    /// Each target with its hint.
    pub fn iter(&self) -> impl Iterator<Item = (&Scope, &Hint)> {
        self.0.iter()
    }

    pub fn insert(&mut self, target: Scope, hint: Hint) {
        match self.0.get_mut(&target) {
            Some(existing) => existing.merge(hint),
            None => {
                self.0.insert(target, hint);
            }
        }
    }

    /// The scopes, in order.
    pub fn scopes(&self) -> impl Iterator<Item = &Scope> {
        self.0.keys()
    }
}

/// Hints by target; a target given twice has its hints merged, as [`Hints::insert`] does.
impl FromIterator<(Scope, Hint)> for Hints {
    fn from_iter<I: IntoIterator<Item = (Scope, Hint)>>(iter: I) -> Self {
        let mut hints = Self::default();
        for (target, hint) in iter {
            hints.insert(target, hint);
        }
        hints
    }
}

impl IntoIterator for Hints {
    type Item = (Scope, Hint);
    type IntoIter = std::collections::btree_map::IntoIter<Scope, Hint>;

    fn into_iter(self) -> Self::IntoIter {
        self.0.into_iter()
    }
}

/// For tests: the hints of one pod-wide trigger, each observation about its container.
#[cfg(test)]
pub(crate) fn pod_hints(
    pod: &str,
    observations: &[(&str, Source, crate::pleg::model::trigger::ObservationKind)],
) -> Hints {
    let mut hints = Hints::default();
    hints.insert(
        Scope::Pod(PodUid(pod.to_owned())),
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
            unspecific: observations.is_empty(),
        },
    );
    hints
}

#[cfg(test)]
mod tests {
    use ObservationKind::{Signal, TaskExited, TaskStarted};

    use super::*;
    use crate::pleg::model::trigger::ObservationKind;

    #[test]
    fn the_task_records_they_carry_and_an_exit_outranks_a_start() {
        let start = TaskStarted {
            at: SystemTime::UNIX_EPOCH,
            pid: 0,
        };
        let exit = TaskExited {
            code: 137,
            at: SystemTime::UNIX_EPOCH,
        };
        let hints = pod_hints(
            "p",
            &[
                ("a", Source::Containerd, start.clone()),
                ("a", Source::Containerd, exit.clone()),
                ("b", Source::Containerd, exit.clone()),
                ("b", Source::Containerd, start.clone()),
                ("s", Source::Containerd, start),
                ("k", Source::Ebpf, Signal(9)),
            ],
        );
        let exited = exit.task_record().expect("a record");
        assert_eq!(
            hints.task_records(),
            TaskRecords::from([
                (ContainerId("a".into()), exited),
                (ContainerId("b".into()), exited),
                (
                    ContainerId("s".into()),
                    TaskRecord::Started {
                        at: Some(SystemTime::UNIX_EPOCH)
                    }
                ),
            ])
        );
    }

    #[test]
    fn a_containers_hint_merges_its_pods_and_its_own_keeping_only_its_observations() {
        let mut hints = pod_hints(
            "p",
            &[
                ("a", Source::Ebpf, Signal(9)),
                ("b", Source::Ebpf, Signal(15)),
            ],
        );
        hints.insert(
            Scope::Container(ContainerId("a".into())),
            Hint {
                sources: BTreeSet::from([Source::Containerd]),
                observed_at: SystemTime::UNIX_EPOCH - std::time::Duration::from_secs(1),
                observations: Vec::new(),
                unspecific: true,
            },
        );
        let hint = hints
            .for_container(&PodUid("p".into()), &ContainerId("a".into()))
            .expect("a hint");
        assert_eq!(
            hint.sources,
            BTreeSet::from([Source::Ebpf, Source::Containerd])
        );
        assert_eq!(hint.observations.len(), 1);
        assert!(hint.unspecific);
        assert!(
            hints
                .for_container(&PodUid("q".into()), &ContainerId("c".into()))
                .is_none()
        );
    }
}
