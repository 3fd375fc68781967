//! Who saw a change first: the diff says what changed, the hints say which sources saw it, when,
//! and what they observed. Dressing one with the other is pure, so it is table-tested here
//! rather than through whole relists.

use std::time::SystemTime;

use crate::pleg::{
    diff::ContainerEvent,
    event::{PodLifecycleEvent, TriggerSource},
    hints::Hints,
    record::{PodRecord, PodUid},
};

/// One pod as the relist knows it: its new listing, and its last committed one.
#[derive(Clone, Copy, Debug)]
pub struct PodReadings<'a> {
    pub new: Option<&'a PodRecord>,
    pub old: Option<&'a PodRecord>,
}

/// The events of one pod's `changes`, named from its readings (a removed container only has a
/// name in the old one) and credited to the sources whose hints are about it: their earliest
/// time and their observations of that container. A change no hint is about was found by the
/// relist itself, at `listed_at`. Sequence numbers and emission times are the publisher's.
pub fn pod_events(
    uid: &PodUid,
    changes: &[ContainerEvent],
    readings: PodReadings<'_>,
    hints: &Hints,
    listed_at: SystemTime,
) -> Vec<PodLifecycleEvent> {
    let PodReadings { new, old } = readings;
    let Some(pod) = new.or(old) else {
        return Vec::new();
    };
    changes
        .iter()
        .map(|change| {
            let container_name = new
                .into_iter()
                .chain(old)
                .find_map(|p| p.containers.get(&change.container))
                .map(|c| c.name.clone())
                .unwrap_or_default();
            let hint = hints.for_container(uid, &change.container);
            PodLifecycleEvent {
                sequence: 0,
                pod: uid.clone(),
                pod_namespace: pod.namespace.clone(),
                pod_name: pod.name.clone(),
                container_id: Some(change.container.clone()),
                container_name,
                event_type: change.event_type,
                observed_at: hint.as_ref().map_or(listed_at, |h| h.observed_at),
                emitted_at: listed_at,
                sources: hint.as_ref().map_or_else(
                    || vec![TriggerSource::Relist],
                    |h| h.sources.iter().copied().collect(),
                ),
                observations: hint
                    .map(|h| h.observations.into_iter().map(|(_, o)| o).collect())
                    .unwrap_or_default(),
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, time::Duration};

    use PodLifecycleEventType::{ContainerDied, ContainerRemoved, ContainerStarted};
    use TriggerSource::{Containerd, Ebpf, Relist};

    use super::*;
    use crate::{
        pleg::{
            event::{Observation, ObservationKind, PodLifecycleEventType},
            hints::{Hint, Target},
            record::{ContainerId, ContainerState},
        },
        runtime::testing::{self, container},
    };

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn pod(containers: &[(&str, &str)]) -> PodRecord {
        let containers = containers
            .iter()
            .map(|(id, name)| container(id, name, ContainerState::Running));
        testing::pod("p", "web", containers)
    }

    fn change(id: &str, event_type: PodLifecycleEventType) -> ContainerEvent {
        ContainerEvent {
            pod: PodUid("p".into()),
            container: ContainerId(id.into()),
            event_type,
        }
    }

    fn observation(
        id: &str,
        source: TriggerSource,
        kind: ObservationKind,
    ) -> (ContainerId, Observation) {
        (ContainerId(id.into()), Observation { source, kind })
    }

    fn hint(
        sources: &[TriggerSource],
        at_ms: u64,
        observations: Vec<(ContainerId, Observation)>,
    ) -> Hint {
        Hint {
            sources: sources.iter().copied().collect::<BTreeSet<_>>(),
            observed_at: at(at_ms),
            listing_needed: observations.is_empty(),
            observations,
        }
    }

    /// (container, name, sources, observed_at ms, observation count) per event.
    type Row = (&'static str, &'static str, Vec<TriggerSource>, u64, usize);

    /// Name, hints by target, the diff's changes, and the events wanted.
    type Case = (
        &'static str,
        Vec<(Target, Hint)>,
        Vec<ContainerEvent>,
        Vec<Row>,
    );

    fn rows(events: &[PodLifecycleEvent]) -> Vec<(String, String, Vec<TriggerSource>, u64, usize)> {
        events
            .iter()
            .map(|e| {
                (
                    e.container_id
                        .as_ref()
                        .map(|c| c.0.clone())
                        .unwrap_or_default(),
                    e.container_name.clone(),
                    e.sources.clone(),
                    e.observed_at
                        .duration_since(SystemTime::UNIX_EPOCH)
                        .map_or(0, |d| d.as_millis() as u64),
                    e.observations.len(),
                )
            })
            .collect()
    }

    #[test]
    fn events_are_credited_to_the_hints_about_their_container() {
        let listed_at_ms = 1_000;
        let new = pod(&[("a", "app"), ("b", "side")]);
        let old = pod(&[("a", "app"), ("b", "side"), ("gone", "old-name")]);
        let pod_hint = || {
            hint(
                &[Ebpf],
                300,
                vec![
                    observation("a", Ebpf, ObservationKind::Signal(9)),
                    observation("b", Ebpf, ObservationKind::Exited),
                ],
            )
        };
        let cases: Vec<Case> = vec![
            (
                "no hint: found by the relist at its listing",
                vec![],
                vec![change("a", ContainerStarted)],
                vec![("a", "app", vec![Relist], listed_at_ms, 0)],
            ),
            (
                "a pod hint credits every container, each with only its own observations",
                vec![(Target::Pod(PodUid("p".into())), pod_hint())],
                vec![change("a", ContainerDied), change("b", ContainerDied)],
                vec![
                    ("a", "app", vec![Ebpf], 300, 1),
                    ("b", "side", vec![Ebpf], 300, 1),
                ],
            ),
            (
                "a container hint merges with the pod's: both sources, the earliest time",
                vec![
                    (Target::Pod(PodUid("p".into())), pod_hint()),
                    (
                        Target::Container(ContainerId("a".into())),
                        hint(
                            &[Containerd],
                            200,
                            vec![observation("a", Containerd, ObservationKind::ExitCode(137))],
                        ),
                    ),
                ],
                vec![change("a", ContainerDied), change("b", ContainerDied)],
                vec![
                    ("a", "app", vec![Ebpf, Containerd], 200, 2),
                    ("b", "side", vec![Ebpf], 300, 1),
                ],
            ),
            (
                "a hint about another container does not credit this one",
                vec![(
                    Target::Container(ContainerId("b".into())),
                    hint(&[Containerd], 200, vec![]),
                )],
                vec![change("a", ContainerStarted)],
                vec![("a", "app", vec![Relist], listed_at_ms, 0)],
            ),
            (
                "a removed container is named from the old reading",
                vec![],
                vec![change("gone", ContainerRemoved)],
                vec![("gone", "old-name", vec![Relist], listed_at_ms, 0)],
            ),
        ];
        for (name, targets, changes, want) in cases {
            let mut hints = Hints::default();
            for (target, h) in targets {
                hints.insert(target, h);
            }
            let readings = PodReadings {
                new: Some(&new),
                old: Some(&old),
            };
            let got = pod_events(
                &PodUid("p".into()),
                &changes,
                readings,
                &hints,
                at(listed_at_ms),
            );
            let want: Vec<_> = want
                .into_iter()
                .map(|(id, n, s, t, o)| (id.to_owned(), n.to_owned(), s, t, o))
                .collect();
            assert_eq!(rows(&got), want, "{name}");
            assert!(
                got.iter()
                    .all(|e| e.pod_namespace == "ns" && e.pod_name == "web"),
                "{name}: pod names"
            );
        }
    }

    #[test]
    fn a_pod_in_neither_reading_has_no_events() {
        let readings = PodReadings {
            new: None,
            old: None,
        };
        let events = pod_events(
            &PodUid("p".into()),
            &[change("a", ContainerDied)],
            readings,
            &Hints::default(),
            at(0),
        );
        assert!(events.is_empty());
    }
}
