//! Who saw a change first: reconcile says what changed, the hints say which sources saw it,
//! when, and what they observed. Dressing one with the other is pure, so it is table-tested
//! here rather than through whole relists.

use std::{collections::BTreeSet, time::SystemTime};

use crate::pleg::{
    decide::hints::Hints,
    model::{
        event::{PodLifecycleEvent, PodLifecycleEventType},
        record::{ContainerRecord, PodRecord},
        source::Source,
        trigger::{Observation, ObservationKind, Says},
    },
};

/// One change reconcile found: a container of a pod, the event, and the record the event
/// announces (for `ContainerRemoved`, the container's last one).
#[derive(Clone, Copy, Debug)]
pub struct Change<'a> {
    pub pod: &'a PodRecord,
    pub event_type: PodLifecycleEventType,
    pub record: &'a ContainerRecord,
}

/// The event of `change`, complete with the state it announces, and credited to the sources
/// whose hints are about its container: their earliest time and their observations of it
/// (those consumers see). A change no hint is about was found by the relist itself, at
/// `read_at`. Sequence numbers and emission times are the publisher's.
pub fn event(change: Change<'_>, hints: &Hints, read_at: SystemTime) -> PodLifecycleEvent {
    let Change {
        pod,
        event_type,
        record,
    } = change;
    let hint = hints
        .for_container(&pod.uid, &record.id)
        .filter(|h| !h.sources.is_empty());
    let mut event = PodLifecycleEvent {
        sequence: 0,
        pod: pod.uid.clone(),
        pod_namespace: pod.namespace.clone(),
        pod_name: pod.name.clone(),
        container_id: record.id.clone(),
        container_name: record.name.clone(),
        event_type,
        observed_at: hint.as_ref().map_or(read_at, |h| h.observed_at),
        emitted_at: read_at,
        sources: hint.as_ref().map_or_else(
            || vec![Source::Relist],
            |h| h.sources.iter().copied().collect(),
        ),
        // Those that speak of what the event announces: a batch may hold an exec that came
        // after the start it read, and the death that followed.
        observations: hint
            .map(|h| {
                h.observations
                    .into_iter()
                    .map(|(_, o)| o)
                    .filter(|o| o.kind.is_shown() && announces(event_type, o.kind.says()))
                    .collect()
            })
            .unwrap_or_default(),
        exit_code: record.exit_code,
        reason: record.reason.clone(),
        confirmed_by: Some(record.confirmed_by),
        signal: None,
        image: record.image.clone(),
        attempt: record.attempt,
        host: record.host.clone(),
        pod_labels: pod.labels.clone(),
        pod_annotations: pod.annotations.clone(),
    };
    if event_type == PodLifecycleEventType::ContainerDied {
        // An OOM kill the record learned in an earlier relist (its init lived on then, or
        // died a moment later): still the death's, as a source saw it.
        for &source in &record.oom_killed_by {
            let oom = Observation {
                source,
                kind: ObservationKind::OomKilled,
            };
            if !event.observations.contains(&oom) {
                event.observations.push(oom);
            }
        }
        // The kernel's account of that kill, likewise, unless the hints brought one.
        if let Some(kill) = &record.oom_kill
            && !event
                .observations
                .iter()
                .any(|o| matches!(o.kind, ObservationKind::OomKill(_)))
        {
            event.observations.push(Observation {
                source: Source::Ebpf,
                kind: ObservationKind::OomKill(std::sync::Arc::clone(kill)),
            });
        }
    }
    event.signal = signal_of(&event);
    event
}

/// The signal that ended a dead container's init: the kernel's word, else the runtime's exit
/// status above 128 (containerd reports a death by signal as 128 + the signal).
fn signal_of(event: &PodLifecycleEvent) -> Option<i32> {
    if event.event_type != PodLifecycleEventType::ContainerDied {
        return None;
    }
    let kernel = event.observations.iter().find_map(|o| match o.kind {
        ObservationKind::Signal(signal) => Some(signal),
        _ => None,
    });
    kernel.or_else(|| {
        event
            .exit_code
            .filter(|code| (129..=128 + 64).contains(code))
            .map(|code| code - 128)
    })
}

/// Whether an observation that `says` this speaks of what an event of `event_type` announces
/// (an OOM kill, of a death).
fn announces(event_type: PodLifecycleEventType, says: Says) -> bool {
    match event_type {
        PodLifecycleEventType::ContainerStarted => says == Says::Started,
        PodLifecycleEventType::ContainerDied => matches!(says, Says::Died | Says::OomKill),
        PodLifecycleEventType::ContainerRemoved => says == Says::Deleted,
        PodLifecycleEventType::ContainerChanged => false,
    }
}

/// Credits an event its relist found with no hint about its container (`[Relist]`) to a hint
/// still queued for that container (`queued`, see `Batch::queued`), when that hint saw what
/// the event announces: its sources, its time, and those of its observations that say so (a
/// queued start's exec does not ride on a death; an OOM kill does).
pub fn credit(event: &mut PodLifecycleEvent, queued: &Hints) {
    if queued.is_empty() || event.sources != [Source::Relist] {
        return;
    }
    let Some(hint) = queued.for_container(&event.pod, &event.container_id) else {
        return;
    };
    let saw: Vec<_> = hint
        .observations
        .into_iter()
        .map(|(_, o)| o)
        .filter(|o| announces(event.event_type, o.kind.says()))
        .collect();
    if saw.is_empty() {
        return;
    }
    let sources: BTreeSet<Source> = saw.iter().map(|o| o.source).collect();
    event.sources = sources.into_iter().collect();
    event.observed_at = event.observed_at.min(hint.observed_at);
    event.observations = saw.into_iter().filter(|o| o.kind.is_shown()).collect();
    event.signal = signal_of(event);
}

#[cfg(test)]
mod tests {
    use std::{collections::BTreeSet, time::Duration};

    use PodLifecycleEventType::ContainerDied;
    use Source::{Containerd, Ebpf, Relist};

    use super::*;
    use crate::{
        pleg::{
            decide::hints::Hint,
            model::{
                record::{ContainerId, ContainerState, PodUid, Store},
                trigger::{Observation, ObservationKind, Scope},
            },
        },
        runtime::testing::{self, container, exited},
    };

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn observation(id: &str, source: Source, kind: ObservationKind) -> (ContainerId, Observation) {
        (ContainerId(id.into()), Observation { source, kind })
    }

    fn hint(sources: &[Source], at_ms: u64, observations: Vec<(ContainerId, Observation)>) -> Hint {
        Hint {
            sources: sources.iter().copied().collect::<BTreeSet<_>>(),
            observed_at: at(at_ms),
            unspecific: observations.is_empty(),
            observations,
        }
    }

    /// (sources, observed_at ms, observation count) of an event.
    type Row = (Vec<Source>, u64, usize);

    /// (name, the hints by scope, the event's row).
    type Case = (&'static str, Vec<(Scope, Hint)>, Row);

    fn row(e: &PodLifecycleEvent) -> Row {
        (
            e.sources.clone(),
            e.observed_at
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_millis() as u64),
            e.observations.len(),
        )
    }

    #[test]
    fn events_are_credited_to_the_hints_about_their_container() {
        let read_at_ms = 1_000;
        let pod = testing::pod(
            "p",
            "web",
            [
                container("a", "app", ContainerState::Running),
                container("b", "side", ContainerState::Running),
            ],
        );
        let pod_hint = || {
            hint(
                &[Ebpf],
                300,
                vec![
                    observation("a", Ebpf, ObservationKind::Signal(9)),
                    observation("b", Ebpf, ObservationKind::Exited),
                    // Only says where to look: never on an event.
                    observation("a", Ebpf, ObservationKind::Present),
                    // Of its start, which an earlier relist read: not on its death.
                    observation("a", Ebpf, ObservationKind::Exec("/bin/sh".into())),
                ],
            )
        };
        let cases: Vec<Case> = vec![
            (
                "no hint: found by the relist when it read",
                vec![],
                (vec![Relist], read_at_ms, 0),
            ),
            (
                "a pod hint credits its container with only its own shown observations",
                vec![(Scope::Pod(PodUid("p".into())), pod_hint())],
                (vec![Ebpf], 300, 1),
            ),
            (
                "a container hint merges with the pod's: both sources, the earliest time",
                vec![
                    (Scope::Pod(PodUid("p".into())), pod_hint()),
                    (
                        Scope::Container(ContainerId("a".into())),
                        hint(
                            &[Containerd],
                            200,
                            vec![observation("a", Containerd, ObservationKind::ExitCode(137))],
                        ),
                    ),
                ],
                (vec![Ebpf, Containerd], 200, 2),
            ),
            (
                "a hint about another container does not credit this one",
                vec![(
                    Scope::Container(ContainerId("b".into())),
                    hint(&[Containerd], 200, vec![]),
                )],
                (vec![Relist], read_at_ms, 0),
            ),
            (
                "a hint of no source (a read the relist asked for itself) credits the relist",
                vec![(Scope::Pod(PodUid("p".into())), hint(&[], 100, vec![]))],
                (vec![Relist], read_at_ms, 0),
            ),
        ];
        for (name, targets, want) in cases {
            let hints: Hints = targets.into_iter().collect();
            let change = Change {
                pod: &pod,
                event_type: ContainerDied,
                record: &pod.containers[&ContainerId("a".into())],
            };
            let got = event(change, &hints, at(read_at_ms));
            assert_eq!(row(&got), want, "{name}");
            assert_eq!(
                (got.pod_namespace.as_str(), got.pod_name.as_str()),
                ("ns", "web"),
                "{name}"
            );
            assert_eq!(got.container_name, "app", "{name}");
        }
    }

    #[test]
    fn a_change_found_with_no_hint_is_credited_to_a_queued_one_that_saw_it() {
        let read_at_ms = 1_000;
        let pod = testing::pod("p", "web", [exited("a", "app", 137, "Error")]);
        let pod_target = || Scope::Pod(PodUid("p".into()));
        let died_hint = || {
            hint(
                &[Ebpf],
                300,
                vec![
                    observation("a", Ebpf, ObservationKind::Signal(9)),
                    observation("a", Ebpf, ObservationKind::CgroupRemoved),
                    observation("b", Ebpf, ObservationKind::Exited),
                ],
            )
        };
        // (name, the batch's own hints, the queued ones, the event's row)
        type Queued = (&'static str, Vec<(Scope, Hint)>, Vec<(Scope, Hint)>, Row);
        let cases: Vec<Queued> = vec![
            (
                "nothing queued: the relist's own",
                vec![],
                vec![],
                (vec![Relist], read_at_ms, 0),
            ),
            (
                "a queued death: its sources, time and observations of this container",
                vec![],
                vec![(pod_target(), died_hint())],
                (vec![Ebpf], 300, 2),
            ),
            (
                "a queued start says nothing of a death",
                vec![],
                vec![(
                    pod_target(),
                    hint(
                        &[Ebpf],
                        200,
                        vec![observation(
                            "a",
                            Ebpf,
                            ObservationKind::Exec("/bin/sh".into()),
                        )],
                    ),
                )],
                (vec![Relist], read_at_ms, 0),
            ),
            (
                "a queued death credits only its own observations among others",
                vec![],
                vec![(
                    pod_target(),
                    hint(
                        &[Ebpf, Containerd],
                        100,
                        vec![
                            observation("a", Ebpf, ObservationKind::Exec("/bin/sh".into())),
                            observation("a", Containerd, ObservationKind::TaskDeleted),
                        ],
                    ),
                )],
                (vec![Containerd], 100, 0),
            ),
            (
                "an event its batch's hints credited keeps them",
                vec![(
                    Scope::Container(ContainerId("a".into())),
                    hint(
                        &[Containerd],
                        400,
                        vec![observation("a", Containerd, ObservationKind::ExitCode(137))],
                    ),
                )],
                vec![(pod_target(), died_hint())],
                (vec![Containerd], 400, 1),
            ),
        ];
        for (name, own, queued, want) in cases {
            assert_eq!(died_credited(&pod, own, queued, read_at_ms), want, "{name}");
        }
    }

    /// The row of container `a`'s death in `pod`, found by a batch with hints `own` and
    /// credited to `queued`.
    fn died_credited(
        pod: &PodRecord,
        own: Vec<(Scope, Hint)>,
        queued: Vec<(Scope, Hint)>,
        read_at_ms: u64,
    ) -> Row {
        let (own, queued): (Hints, Hints) =
            (own.into_iter().collect(), queued.into_iter().collect());
        let change = Change {
            pod,
            event_type: ContainerDied,
            record: &pod.containers[&ContainerId("a".into())],
        };
        let mut got = event(change, &own, at(read_at_ms));
        credit(&mut got, &queued);
        row(&got)
    }

    #[test]
    fn an_event_carries_the_state_it_announces() {
        let mut died = exited("a", "app", 137, "OOMKilled");
        died.confirmed_by = Store::Task;
        let pod = testing::pod("p", "web", [died.clone()]);
        let change = Change {
            pod: &pod,
            event_type: ContainerDied,
            record: &died,
        };
        let got = event(change, &Hints::default(), at(0));
        assert_eq!(
            (got.exit_code, got.reason.as_str(), got.confirmed_by),
            (Some(137), "OOMKilled", Some(Store::Task))
        );
    }
}
