//! Confirmation at the runtime's own record: a start or an exit the runtime's task service has
//! recorded is the container's state, though the CRI store shows it some 30 ms later (containerd
//! updates that store only after its cleanup: `runc kill --all`, `runc delete`, the rootfs
//! unmount, an fsync).
//!
//! Nothing here trusts a source blindly. Only the runtime's own records confirm: its
//! `/tasks/start` and `/tasks/exit` events, or its task status read on a kernel hint. The kernel
//! still only says where and when to look, and the relist stays the one path that makes
//! events: these records are laid over its reading before the diff.

use std::collections::{BTreeMap, BTreeSet};

use crate::pleg::{
    diff::ContainerEvent,
    event::{ObservationKind, PodLifecycleEventType, Scope},
    hints::Hints,
    record::{ContainerId, ContainerState, Layer, PodRecord, PodRecords, PodUid, TaskRecord},
};

/// Task records by container, for one relist.
pub type TaskRecords = BTreeMap<ContainerId, TaskRecord>;

/// The task records the hints carry (the runtime's own events). An exit outranks a start.
pub fn from_hints(hints: &Hints) -> TaskRecords {
    let mut records = TaskRecords::new();
    for (id, observation) in hints.observations() {
        let Some(record) = observation.kind.task_record() else {
            continue;
        };
        let known = records.get(id);
        if !matches!(known, Some(TaskRecord::Exited { .. })) {
            records.insert(id.clone(), record);
        }
    }
    records
}

/// The pod of a targeted relist that the runtime's own task events answer in full, so that it
/// need not wait on the CRI store at all: every trigger behind it carried observations, each
/// about a container of the pod as last committed whose task record moves it on (an exit of a
/// created or running container, a start of a created one). A container or pod no relist has
/// committed yet, or a trigger without observations (a container created, removed), needs a
/// listing. The CRI store is read on the recheck that follows, for its status and reason.
pub fn answered(
    scope: &Scope,
    hints: &Hints,
    tasks: &TaskRecords,
    committed: &PodRecords,
) -> Option<PodUid> {
    let Scope::Pod(uid) = scope else {
        return None;
    };
    let pod = committed.get(uid)?;
    let moves_on = |id: &ContainerId| {
        let state = pod.containers.get(id).map(|c| c.state);
        matches!(
            (tasks.get(id), state),
            (
                Some(TaskRecord::Exited { .. }),
                Some(ContainerState::Created | ContainerState::Running)
            ) | (
                Some(TaskRecord::Started { .. }),
                Some(ContainerState::Created)
            )
        )
    };
    let mut observations = hints.observations().peekable();
    let answered = !hints.listing_needed()
        && observations.peek().is_some()
        && observations.all(|(id, o)| !o.kind.is_deletion() && moves_on(id));
    answered.then(|| uid.clone())
}

/// The containers whose task record is worth reading: a kernel hint says their init died or
/// started, the CRI store does not show it yet, and no event of the runtime's said it.
pub fn to_read(listed: &PodRecords, hints: &Hints, known: &TaskRecords) -> Vec<ContainerId> {
    let mut ids: Vec<ContainerId> = hints
        .observations()
        .filter(|(id, observation)| {
            observation.kind.task_record().is_none() && !known.contains_key(id) && {
                let state = listed
                    .values()
                    .find_map(|pod| pod.containers.get(id))
                    .map(|c| c.state);
                if observation.kind.is_death() {
                    matches!(
                        state,
                        Some(ContainerState::Created | ContainerState::Running)
                    )
                } else {
                    state == Some(ContainerState::Created)
                }
            }
        })
        .map(|(id, _)| id.clone())
        .collect();
    ids.sort();
    ids.dedup();
    ids
}

/// Lays the task records over a CRI-layer reading of `pod`: a container the task service saw
/// exit (or start) while the CRI store still shows it running (or created) takes the task's
/// state, exit code and time. A state the task layer confirmed at an earlier relist
/// (`committed`) is kept while the CRI store still lags it, so a slow store never makes a
/// container look alive again. A CRI state that has caught up is left as it is: it carries the
/// runtime's reason (OOMKilled, Completed, ...).
pub fn apply(pod: &mut PodRecord, tasks: &TaskRecords, committed: Option<&PodRecord>) {
    for (id, container) in &mut pod.containers {
        let earlier = committed
            .and_then(|p| p.containers.get(id))
            .filter(|c| c.confirmed_by == Layer::Task);
        match (tasks.get(id), container.state) {
            (
                Some(&TaskRecord::Exited { code, at }),
                ContainerState::Created | ContainerState::Running,
            ) => {
                container.state = ContainerState::Exited;
                container.exit_code = Some(code);
                container.finished_at = Some(at);
                container.confirmed_by = Layer::Task;
            }
            (Some(&TaskRecord::Started { at }), ContainerState::Created) => {
                container.state = ContainerState::Running;
                container.started_at = at.or(container.started_at);
                container.confirmed_by = Layer::Task;
            }
            _ => {
                if let Some(earlier) = earlier
                    && rank(earlier.state) > rank(container.state)
                {
                    container.state = earlier.state;
                    container.exit_code = earlier.exit_code;
                    container.started_at = earlier.started_at.or(container.started_at);
                    container.finished_at = earlier.finished_at;
                    container.confirmed_by = Layer::Task;
                }
            }
        }
    }
}

/// `changes` with the starts the runtime's task service recorded but no reading showed: a
/// container that started and exited between two readings goes from created (or unseen) to
/// exited, which the diff makes a lone `ContainerDied`, as kubelet's PLEG does. Its
/// `/tasks/start` is the runtime's own record that it ran, so its `ContainerStarted` goes out
/// just before the death. Under load a relist can wait seconds behind a slow full one, and a
/// container's whole run can fall within that wait.
pub fn recorded_starts(
    changes: Vec<ContainerEvent>,
    hints: &Hints,
    committed: &PodRecords,
) -> Vec<ContainerEvent> {
    let started: BTreeSet<&ContainerId> = hints
        .observations()
        .filter(|(_, o)| matches!(o.kind, ObservationKind::TaskStarted { .. }))
        .map(|(id, _)| id)
        .collect();
    if started.is_empty() {
        return changes;
    }
    let seen_running = |change: &ContainerEvent| {
        committed
            .get(&change.pod)
            .and_then(|pod| pod.containers.get(&change.container))
            .is_some_and(|c| c.state == ContainerState::Running)
    };
    let mut out = Vec::with_capacity(changes.len());
    for change in changes {
        if change.event_type == PodLifecycleEventType::ContainerDied
            && started.contains(&change.container)
            && !seen_running(&change)
        {
            out.push(ContainerEvent {
                event_type: PodLifecycleEventType::ContainerStarted,
                ..change.clone()
            });
        }
        out.push(change);
    }
    out
}

/// Whether the CRI store has caught up with a state only the task layer had confirmed in
/// `committed`: the pod is read again (no event: its state did not change) so the cache takes
/// the runtime's full status, reason included.
pub fn caught_up(committed: Option<&PodRecord>, listed: Option<&PodRecord>) -> bool {
    let (Some(committed), Some(listed)) = (committed, listed) else {
        return false;
    };
    committed.containers.iter().any(|(id, before)| {
        before.confirmed_by == Layer::Task
            && listed
                .containers
                .get(id)
                .is_some_and(|now| now.confirmed_by == Layer::Cri && now.state == before.state)
    })
}

/// Lifecycle order: a container id never goes back (created, running, exited); unknown states
/// are not ranked.
fn rank(state: ContainerState) -> Option<u8> {
    match state {
        ContainerState::Created => Some(0),
        ContainerState::Running => Some(1),
        ContainerState::Exited => Some(2),
        ContainerState::Unknown => None,
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, SystemTime};

    use ContainerState::{Created, Exited, Running, Unknown};

    use super::*;
    use crate::{
        pleg::{
            event::{ObservationKind, TriggerSource},
            hints::pod_hints,
            record::PodUid,
        },
        runtime::testing::{self, container},
    };

    fn at(ms: u64) -> SystemTime {
        SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
    }

    fn cid(id: &str) -> ContainerId {
        ContainerId(id.into())
    }

    fn pod(containers: &[(&str, ContainerState, Layer)]) -> PodRecord {
        let containers = containers.iter().map(|(id, state, layer)| {
            let mut c = container(id, "", *state);
            c.confirmed_by = *layer;
            c
        });
        testing::pod("p", "web", containers)
    }

    fn hints(observations: &[(&str, TriggerSource, ObservationKind)]) -> Hints {
        pod_hints("p", observations)
    }

    const EXIT: ObservationKind = ObservationKind::TaskExited {
        code: 137,
        at: SystemTime::UNIX_EPOCH,
    };

    #[test]
    fn the_runtimes_events_are_task_records_and_an_exit_outranks_a_start() {
        let start = ObservationKind::TaskStarted { at: at(5) };
        let h = hints(&[
            ("a", TriggerSource::Containerd, start.clone()),
            ("a", TriggerSource::Containerd, EXIT),
            ("b", TriggerSource::Containerd, EXIT),
            ("b", TriggerSource::Containerd, start),
            ("k", TriggerSource::Ebpf, ObservationKind::Signal(9)),
        ]);
        let records = from_hints(&h);
        let exited = TaskRecord::Exited {
            code: 137,
            at: SystemTime::UNIX_EPOCH,
        };
        assert_eq!(
            records,
            TaskRecords::from([(cid("a"), exited), (cid("b"), exited)])
        );
    }

    /// A start the task service recorded goes out before a death the diff found from a state
    /// short of running; never for a container a reading already showed running, nor for one
    /// whose start no task event recorded.
    #[test]
    fn recorded_starts_go_out_only_where_no_reading_showed_the_container_running() {
        let committed = PodRecords::from([(
            PodUid("p".into()),
            pod(&[
                ("created", Created, Layer::Cri),
                ("ran", Running, Layer::Cri),
            ]),
        )]);
        let start = ObservationKind::TaskStarted { at: at(1) };
        let h = hints(&[
            ("created", TriggerSource::Containerd, start.clone()),
            ("unseen", TriggerSource::Containerd, start.clone()),
            ("ran", TriggerSource::Containerd, start),
            (
                "kernel",
                TriggerSource::Ebpf,
                ObservationKind::Exec("/app".into()),
            ),
        ]);
        let change = |id: &str, event_type| ContainerEvent {
            pod: PodUid("p".into()),
            container: cid(id),
            event_type,
        };
        use PodLifecycleEventType::{ContainerDied, ContainerRemoved, ContainerStarted};
        let changes = vec![
            change("created", ContainerDied),
            change("kernel", ContainerDied),
            change("ran", ContainerDied),
            change("unseen", ContainerDied),
            change("unseen", ContainerRemoved),
        ];
        assert_eq!(
            recorded_starts(changes.clone(), &h, &committed),
            [
                change("created", ContainerStarted),
                change("created", ContainerDied),
                change("kernel", ContainerDied),
                change("ran", ContainerDied),
                change("unseen", ContainerStarted),
                change("unseen", ContainerDied),
                change("unseen", ContainerRemoved),
            ]
        );
        assert_eq!(
            recorded_starts(changes.clone(), &Hints::default(), &committed),
            changes
        );
    }

    #[test]
    fn task_records_are_read_only_for_kernel_hints_the_store_does_not_show_yet() {
        let listed = PodRecords::from([(
            PodUid("p".into()),
            pod(&[
                ("running", Running, Layer::Cri),
                ("created", Created, Layer::Cri),
                ("exited", Exited, Layer::Cri),
                ("by-event", Running, Layer::Cri),
            ]),
        )]);
        let h = hints(&[
            ("running", TriggerSource::Ebpf, ObservationKind::Signal(9)),
            ("running", TriggerSource::Ebpf, ObservationKind::Exited),
            (
                "created",
                TriggerSource::Ebpf,
                ObservationKind::Exec("/app".into()),
            ),
            ("exited", TriggerSource::Ebpf, ObservationKind::ExitCode(1)),
            ("by-event", TriggerSource::Ebpf, ObservationKind::Signal(9)),
            ("by-event", TriggerSource::Containerd, EXIT),
            ("unlisted", TriggerSource::Ebpf, ObservationKind::Exited),
        ]);
        let known = from_hints(&h);
        assert_eq!(
            to_read(&listed, &h, &known),
            [cid("created"), cid("running")]
        );
    }

    /// (container, CRI state, task record, committed state and layer, wanted state and layer).
    type Case = (
        &'static str,
        ContainerState,
        Option<TaskRecord>,
        Option<(ContainerState, Layer)>,
        (ContainerState, Layer),
    );

    #[test]
    fn task_records_lay_over_a_lagging_store_and_give_way_once_it_catches_up() {
        let exited = TaskRecord::Exited {
            code: 3,
            at: at(40),
        };
        let started = TaskRecord::Started { at: Some(at(10)) };
        let cases: [Case; 9] = [
            (
                "exit over running",
                Running,
                Some(exited),
                None,
                (Exited, Layer::Task),
            ),
            (
                "exit over created",
                Created,
                Some(exited),
                None,
                (Exited, Layer::Task),
            ),
            (
                "the store caught up",
                Exited,
                Some(exited),
                None,
                (Exited, Layer::Cri),
            ),
            (
                "unknown is left alone",
                Unknown,
                Some(exited),
                None,
                (Unknown, Layer::Cri),
            ),
            (
                "start over created",
                Created,
                Some(started),
                None,
                (Running, Layer::Task),
            ),
            (
                "start once running",
                Running,
                Some(started),
                None,
                (Running, Layer::Cri),
            ),
            (
                "a confirmed exit is kept while the store lags",
                Running,
                None,
                Some((Exited, Layer::Task)),
                (Exited, Layer::Task),
            ),
            (
                "an exit the store showed first is never undone",
                Running,
                None,
                Some((Exited, Layer::Cri)),
                (Running, Layer::Cri),
            ),
            ("no record", Running, None, None, (Running, Layer::Cri)),
        ];
        for (name, cri, task, committed, (state, layer)) in cases {
            let mut reading = pod(&[("c", cri, Layer::Cri)]);
            let tasks: TaskRecords = task.map(|t| (cid("c"), t)).into_iter().collect();
            let committed = committed.map(|(s, l)| pod(&[("c", s, l)]));
            apply(&mut reading, &tasks, committed.as_ref());
            let c = &reading.containers[&cid("c")];
            assert_eq!((c.state, c.confirmed_by), (state, layer), "{name}");
            if layer == Layer::Task && state == Exited && task.is_some() {
                assert_eq!(
                    (c.exit_code, c.finished_at),
                    (Some(3), Some(at(40))),
                    "{name}"
                );
            }
        }
    }

    #[test]
    fn a_pod_is_read_again_once_the_store_shows_what_the_task_layer_confirmed() {
        let committed = pod(&[("c", Exited, Layer::Task), ("d", Running, Layer::Cri)]);
        let lagging = pod(&[("c", Exited, Layer::Task), ("d", Running, Layer::Cri)]);
        let caught = pod(&[("c", Exited, Layer::Cri), ("d", Running, Layer::Cri)]);
        assert!(!caught_up(Some(&committed), Some(&lagging)));
        assert!(caught_up(Some(&committed), Some(&caught)));
        assert!(
            !caught_up(Some(&caught), Some(&caught)),
            "nothing was task-confirmed"
        );
        assert!(!caught_up(Some(&committed), None), "gone");
    }

    #[test]
    fn task_events_answer_a_relist_only_when_they_move_on_every_container_hinted() {
        let committed = PodRecords::from([(
            PodUid("p".into()),
            pod(&[
                ("running", Running, Layer::Cri),
                ("created", Created, Layer::Cri),
                ("exited", Exited, Layer::Cri),
            ]),
        )]);
        let start = ObservationKind::TaskStarted { at: at(1) };
        let kill = ObservationKind::Signal(9);
        let p = Scope::Pod(PodUid("p".into()));
        let cases = [
            (
                "an exit of a running container",
                p.clone(),
                vec![("running", TriggerSource::Containerd, EXIT)],
                true,
            ),
            (
                "with the kernel's hint beside it",
                p.clone(),
                vec![
                    ("running", TriggerSource::Ebpf, kill.clone()),
                    ("running", TriggerSource::Containerd, EXIT),
                ],
                true,
            ),
            (
                "a start of a created container",
                p.clone(),
                vec![("created", TriggerSource::Containerd, start.clone())],
                true,
            ),
            (
                "a kernel hint alone",
                p.clone(),
                vec![("running", TriggerSource::Ebpf, kill.clone())],
                false,
            ),
            (
                "a kernel hint about another container",
                p.clone(),
                vec![
                    ("running", TriggerSource::Containerd, EXIT),
                    ("created", TriggerSource::Ebpf, kill),
                ],
                false,
            ),
            (
                "an exit the store already shows",
                p.clone(),
                vec![("exited", TriggerSource::Containerd, EXIT)],
                false,
            ),
            (
                "a start of a running container",
                p.clone(),
                vec![("running", TriggerSource::Containerd, start)],
                false,
            ),
            (
                "a container not committed yet",
                p.clone(),
                vec![("new", TriggerSource::Containerd, EXIT)],
                false,
            ),
            (
                "a pod not committed yet",
                Scope::Pod(PodUid("q".into())),
                vec![("running", TriggerSource::Containerd, EXIT)],
                false,
            ),
            (
                "a container scope",
                Scope::Container(cid("running")),
                vec![("running", TriggerSource::Containerd, EXIT)],
                false,
            ),
            (
                "an exit, then the container deleted",
                p.clone(),
                vec![
                    ("running", TriggerSource::Containerd, EXIT),
                    (
                        "running",
                        TriggerSource::Containerd,
                        ObservationKind::Deleted,
                    ),
                ],
                false,
            ),
            ("no observation", p.clone(), vec![], false),
        ];
        for (name, scope, observations, want) in cases {
            let h = hints(&observations);
            let got = answered(&scope, &h, &from_hints(&h), &committed);
            assert_eq!(got.is_some(), want, "{name}");
        }
    }
}
