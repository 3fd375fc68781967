use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use ContainerState::{Created, Exited, Running};
use ObservationKind::{
    Deleted, Exec, ExitCode, OomKilled, Present, Signal, TaskExited, TaskStarted,
};
use PodLifecycleEventType::{ContainerChanged, ContainerDied, ContainerRemoved, ContainerStarted};
use Source::{Containerd, CriEvents, Ebpf};
use tokio::time::Instant;

use super::*;
use crate::{
    pleg::model::{source::Source, trigger::Observation},
    runtime::testing::{container, exited, pod},
};

fn at(ms: u64) -> SystemTime {
    SystemTime::UNIX_EPOCH + Duration::from_millis(ms)
}

fn id(id: &str) -> ContainerId {
    ContainerId(id.to_owned())
}

fn uid(uid: &str) -> PodUid {
    PodUid(uid.to_owned())
}

const TASK: Settings = Settings {
    confirm: Store::Task,
    emit_changed: false,
    oom_witness: OomWitness::Any,
    runtime_events: false,
    baseline_read: false,
};
const CRI: Settings = Settings {
    confirm: Store::Cri,
    emit_changed: false,
    oom_witness: OomWitness::Any,
    runtime_events: false,
    baseline_read: false,
};

/// Pod "p" holding container "c" in `state` (none: an empty committed set).
fn committed(state: Option<ContainerState>) -> Committed {
    let mut committed = Committed::default();
    if let Some(state) = state {
        committed.commit(
            &uid("p"),
            Some(Arc::new(pod("p", "web", [record(state)]))),
            false,
        );
    }
    committed
}

fn record(state: ContainerState) -> ContainerRecord {
    match state {
        Exited => exited("c", "app", 2, "Error"),
        state => container("c", "app", state),
    }
}

/// A hint on pod "p" (or container "c" when `on_container`) carrying `kinds` about "c".
fn hints(on_container: bool, source: Source, kinds: &[ObservationKind]) -> Hints {
    let target = if on_container {
        Scope::Container(id("c"))
    } else {
        Scope::Pod(uid("p"))
    };
    let mut hints = Hints::default();
    hints.insert(
        target,
        Hint {
            sources: BTreeSet::from([source]),
            observed_at: at(10),
            observations: kinds
                .iter()
                .map(|kind| {
                    let kind = kind.clone();
                    (id("c"), Observation { source, kind })
                })
                .collect(),
            unspecific: kinds.is_empty(),
        },
    );
    hints
}

fn reading(covers: Covers, pods: Vec<(&str, PodReading)>) -> Reading {
    Reading {
        covers,
        pods: pods.into_iter().map(|(u, r)| (uid(u), r)).collect(),
        tasks: TaskRecords::new(),
        read_at: at(50),
    }
}

fn inspected(state: ContainerState) -> PodReading {
    PodReading::Inspected(pod("p", "web", [record(state)]))
}

/// Pod "p" read by container ids: "c" in `state`, unless `gone` holds it.
fn read_alone(state: ContainerState, gone: &[&str]) -> PodReading {
    let gone: Vec<ContainerId> = gone.iter().map(|g| id(g)).collect();
    let shown: Vec<ContainerRecord> = Some(record(state))
        .filter(|r| !gone.contains(&r.id))
        .into_iter()
        .collect();
    PodReading::Containers {
        pod: pod("p", "web", shown),
        gone,
    }
}

/// A pod's plan as collected.
struct Planned {
    record: Option<PodRecord>,
    events: Vec<PodLifecycleEvent>,
    corrected: Vec<Correction>,
}

/// Collects each pod's plan, committing it as the relist does.
struct Collect {
    committed: Committed,
    pods: Vec<Planned>,
    /// The events of containers no record held ([`Act::tell`]).
    told: Vec<PodLifecycleEvent>,
}

impl Act for Collect {
    fn committed(&self) -> &Committed {
        &self.committed
    }

    fn tell(&mut self, events: std::vec::Drain<'_, PodLifecycleEvent>) {
        self.told.extend(events);
    }

    fn act(&mut self, pod: PodPlan<'_>) {
        let record = pod.record.clone().map(Arc::new);
        self.committed.commit(&pod.uid, record, pod.same_containers);
        self.pods.push(Planned {
            record: pod.record,
            events: pod.events.collect(),
            corrected: pod.corrected,
        });
    }
}

/// [`super::reconcile`] against `committed`: the pods' plans as handed over, and what is
/// left.
fn reconcile(
    committed: &Committed,
    reading: Reading,
    hints: &Hints,
    queued: &Hints,
    tombstones: &HashSet<ContainerId>,
    settings: Settings,
) -> (Vec<Planned>, FollowUp) {
    let mut out = Collect {
        committed: committed.clone(),
        pods: Vec::new(),
        told: Vec::new(),
    };
    let plan = super::reconcile(&mut out, reading, hints, queued, tombstones, settings, true);
    (out.pods, plan)
}

/// (type, exit code, confirmed by) of each event.
type EventRow = (PodLifecycleEventType, Option<i32>, Option<Store>);

fn rows(pods: &[Planned]) -> Vec<EventRow> {
    pods.iter()
        .flat_map(|p| &p.events)
        .map(|e| (e.event_type, e.exit_code, e.confirmed_by))
        .collect()
}

fn whys(plan: &FollowUp) -> Vec<Why> {
    plan.reread.iter().map(|a| a.why).collect()
}

struct Case {
    name: &'static str,
    committed: Option<ContainerState>,
    reading: Reading,
    hints: Hints,
    settings: Settings,
    events: Vec<EventRow>,
    reread: Vec<Why>,
    /// Its container is to be read once more for the CRI store.
    settles: bool,
}

fn exit(code: i32) -> ObservationKind {
    TaskExited { code, at: at(9) }
}

/// Runs each case through reconcile, against its pod `p` committed as `case.committed`.
fn check(cases: impl IntoIterator<Item = Case>) {
    for case in cases {
        let (pods, plan) = reconcile(
            &committed(case.committed),
            case.reading,
            &case.hints,
            &Hints::default(),
            &HashSet::new(),
            case.settings,
        );
        assert_eq!(rows(&pods), case.events, "{}: events", case.name);
        assert_eq!(whys(&plan), case.reread, "{}: reread", case.name);
        let settles = plan.settling == [id("c")];
        assert_eq!(settles, case.settles, "{}: settling {plan:?}", case.name);
    }
}

const TASK_STORE: Option<Store> = Some(Store::Task);
const CRI_STORE: Option<Store> = Some(Store::Cri);

fn nothing() -> Reading {
    Reading::none(at(50))
}

/// What the runtime recorded (containerd's task events, a deletion) answers a hint without
/// a reading; a kernel hint alone never does, nor a record when confirming at the CRI store.
#[test]
fn the_runtimes_own_records_answer_unread() {
    check([
        Case {
            name: "a task exit answers a death unread, and awaits the CRI store",
            committed: Some(Running),
            reading: nothing(),
            hints: hints(false, Containerd, &[exit(137)]),
            settings: TASK,
            events: vec![(ContainerDied, Some(137), TASK_STORE)],
            reread: vec![],
            settles: true,
        },
        Case {
            name: "a task start answers a start unread, and awaits nothing more",
            committed: Some(Created),
            reading: nothing(),
            hints: hints(false, Containerd, &[TaskStarted { at: at(8), pid: 0 }]),
            settings: TASK,
            events: vec![(ContainerStarted, None, TASK_STORE)],
            reread: vec![],
            settles: false,
        },
        Case {
            name: "a deletion answers a removal unread",
            committed: Some(Exited),
            reading: nothing(),
            hints: hints(false, Containerd, &[Deleted]),
            settings: TASK,
            events: vec![(ContainerRemoved, Some(2), CRI_STORE)],
            reread: vec![],
            settles: false,
        },
        Case {
            name: "a start and an exit of a created container are two events",
            committed: Some(Created),
            reading: nothing(),
            hints: hints(
                false,
                Containerd,
                &[TaskStarted { at: at(8), pid: 0 }, exit(1)],
            ),
            settings: TASK,
            events: vec![
                (ContainerStarted, None, TASK_STORE),
                (ContainerDied, Some(1), TASK_STORE),
            ],
            reread: vec![],
            settles: true,
        },
        Case {
            name: "a kernel death alone is only where to look",
            committed: Some(Running),
            reading: nothing(),
            hints: hints(false, Ebpf, &[Signal(9)]),
            settings: TASK,
            events: vec![],
            reread: vec![Why::Unreflected],
            settles: false,
        },
        Case {
            name: "an unspecific hint is not answered without a reading",
            committed: Some(Running),
            reading: nothing(),
            hints: hints(false, Containerd, &[]),
            settings: TASK,
            events: vec![],
            reread: vec![Why::Unreflected],
            settles: false,
        },
        Case {
            name: "confirming by the CRI store takes no task record",
            committed: Some(Running),
            reading: nothing(),
            hints: hints(false, Containerd, &[exit(137)]),
            settings: CRI,
            events: vec![],
            reread: vec![Why::Unreflected],
            settles: false,
        },
    ]);
}

/// A reading of the pod confirms what a kernel hint said, or leaves it to read again.
#[test]
fn a_reading_confirms_what_the_hints_said_or_leaves_it_to_read_again() {
    check([
        Case {
            name: "a kernel death is confirmed by the inspection that shows it",
            committed: Some(Running),
            reading: reading(Covers::Pod(uid("p")), vec![("p", inspected(Exited))]),
            hints: hints(false, Ebpf, &[Signal(9)]),
            settings: TASK,
            events: vec![(ContainerDied, Some(2), CRI_STORE)],
            reread: vec![],
            settles: false,
        },
        Case {
            name: "an inspection that does not show it yet leaves it to read again",
            committed: Some(Running),
            reading: reading(Covers::Pod(uid("p")), vec![("p", inspected(Running))]),
            hints: hints(false, Ebpf, &[Signal(9)]),
            settings: TASK,
            events: vec![],
            reread: vec![Why::Unreflected],
            settles: false,
        },
        Case {
            name: "a failed inspection is read again and changes nothing",
            committed: Some(Running),
            reading: reading(Covers::Pod(uid("p")), vec![("p", PodReading::Failed)]),
            hints: hints(false, Ebpf, &[Signal(9)]),
            settings: TASK,
            events: vec![],
            reread: vec![Why::Failed],
            settles: false,
        },
        Case {
            name: "a pod gone is a death and a removal",
            committed: Some(Running),
            reading: reading(Covers::Node, vec![("p", PodReading::Gone)]),
            hints: Hints::default(),
            settings: TASK,
            events: vec![
                (ContainerDied, None, CRI_STORE),
                (ContainerRemoved, None, CRI_STORE),
            ],
            reread: vec![],
            settles: false,
        },
        Case {
            name: "a pod listed as committed is no news",
            committed: Some(Running),
            reading: reading(Covers::Node, vec![]),
            hints: hints(false, Containerd, &[]),
            settings: TASK,
            events: vec![],
            reread: vec![],
            settles: false,
        },
        Case {
            name: "a container first seen exited is a death",
            committed: None,
            reading: reading(Covers::Pod(uid("p")), vec![("p", inspected(Exited))]),
            hints: Hints::default(),
            settings: TASK,
            events: vec![(ContainerDied, Some(2), CRI_STORE)],
            reread: vec![],
            settles: false,
        },
    ]);
}

/// Containers read by their id, and pods read whole that are gone.
#[test]
fn containers_read_by_their_id() {
    check([
        Case {
            name: "a new container read by its id is its pod's news",
            committed: None,
            reading: reading(
                Covers::Containers(vec![id("c")]),
                vec![("p", read_alone(Running, &[]))],
            ),
            hints: hints(true, Ebpf, &[Exec("/bin/sleep".into())]),
            settings: TASK,
            events: vec![(ContainerStarted, None, CRI_STORE)],
            reread: vec![],
            settles: false,
        },
        Case {
            name: "a container not found is no news, and nothing is left to read",
            committed: None,
            reading: reading(Covers::Containers(vec![id("c")]), vec![]),
            hints: hints(true, Ebpf, &[Present]),
            settings: TASK,
            events: vec![],
            reread: vec![],
            settles: false,
        },
        Case {
            // containerd publishes /containers/create before its CRI store holds the
            // container: a ContainerChanged to send is worth another look.
            name: "with ContainerChanged sent, a created container not found yet is read again",
            committed: None,
            reading: reading(Covers::Containers(vec![id("c")]), vec![]),
            hints: hints(true, Containerd, &[Present]),
            settings: Settings {
                emit_changed: true,
                ..TASK
            },
            events: vec![],
            reread: vec![Why::Unreflected],
            settles: false,
        },
        Case {
            name: "a container its status read finds gone died and went",
            committed: Some(Running),
            reading: reading(
                Covers::Containers(vec![id("c")]),
                vec![("p", read_alone(Running, &["c"]))],
            ),
            hints: hints(false, Ebpf, &[Signal(9)]),
            settings: TASK,
            events: vec![
                (ContainerDied, None, CRI_STORE),
                (ContainerRemoved, None, CRI_STORE),
            ],
            reread: vec![],
            settles: false,
        },
        Case {
            name: "a container read by its id that does not show the exit yet is read again",
            committed: Some(Running),
            reading: reading(
                Covers::Containers(vec![id("c")]),
                vec![("p", read_alone(Running, &[]))],
            ),
            hints: hints(false, Ebpf, &[Signal(9)]),
            settings: TASK,
            events: vec![],
            reread: vec![Why::Unreflected],
            settles: false,
        },
        Case {
            // Committed as each pod is decided: that the container was in the pod read is
            // a fact of before the plan.
            name: "a pod read whole and gone shows its container's death",
            committed: Some(Running),
            reading: reading(Covers::Pod(uid("p")), vec![("p", PodReading::Gone)]),
            hints: hints(true, Ebpf, &[Signal(9)]),
            settings: TASK,
            events: vec![
                (ContainerDied, None, CRI_STORE),
                (ContainerRemoved, None, CRI_STORE),
            ],
            reread: vec![],
            settles: false,
        },
    ]);
}

#[test]
fn the_cri_store_catching_up_rewrites_the_record_without_an_event() {
    let mut dead = record(Exited);
    dead.confirmed_by = Store::Task;
    dead.reason = String::new();
    let mut committed = Committed::default();
    committed.commit(&uid("p"), Some(Arc::new(pod("p", "web", [dead]))), false);
    let read = reading(Covers::Pod(uid("p")), vec![("p", inspected(Exited))]);
    let (pods, plan) = reconcile(
        &committed,
        read,
        &Hints::default(),
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    assert_eq!(rows(&pods), vec![]);
    let record = pods[0].record.as_ref().expect("the pod stays");
    let c = record
        .containers
        .get(&id("c"))
        .expect("the container stays");
    assert_eq!((c.confirmed_by, c.reason.as_str()), (Store::Cri, "Error"));
    assert_eq!(whys(&plan), vec![]);
}

#[test]
fn a_deleted_container_is_not_brought_back_by_a_listing_that_lags() {
    let tombstones = HashSet::from([id("c")]);
    let read = reading(Covers::Node, vec![("p", inspected(Exited))]);
    let (pods, plan) = reconcile(
        &committed(None),
        read,
        &Hints::default(),
        &Hints::default(),
        &tombstones,
        TASK,
    );
    assert_eq!(rows(&pods), vec![]);
    assert!(pods.is_empty(), "{plan:?}");
}

#[test]
fn a_start_recorded_by_a_queued_hint_is_announced_before_the_death_read() {
    // Never committed, first read exited (a kernel hint's full listing found it); the
    // containerd start sits in a hint waiting for its retry.
    let read = reading(Covers::Node, vec![("p", inspected(Exited))]);
    let start = hints(true, Containerd, &[TaskStarted { at: at(8), pid: 0 }]);
    let (cri, task) = (Some(Store::Cri), Some(Store::Task));
    let none = Hints::default();
    for (queued, settings, events) in [
        (&none, TASK, vec![(ContainerDied, Some(2), cri)]),
        (
            &start,
            TASK,
            vec![
                (ContainerStarted, None, task),
                (ContainerDied, Some(2), cri),
            ],
        ),
        // Confirming at the CRI store no runtime record is taken, a queued hint's neither.
        (&start, CRI, vec![(ContainerDied, Some(2), cri)]),
    ] {
        let (pods, plan) = reconcile(
            &committed(None),
            read.clone(),
            &none,
            queued,
            &HashSet::new(),
            settings,
        );
        assert_eq!(rows(&pods), events, "queued {queued:?}, {settings:?}");
        let reread = whys(&plan);
        assert_eq!(
            reread,
            vec![],
            "a queued hint is not the batch's to read again"
        );
    }
}

/// A container first read while the CRI store still showed it running, the task service's
/// `Wait` saying in the same read that it exited (a kernel hint past its grace while
/// containerd's `/tasks/start` was still on its way): the start the store showed is told
/// before the death. (good_neighbour lost it: the late `/tasks/start` found the container
/// exited, and the start was never told.)
#[test]
fn a_start_the_cri_store_showed_is_told_before_the_exit_the_task_service_read() {
    let hint = hints(true, Ebpf, &[Exec("/bin/sleep".into()), Signal(9)]);
    let none = Hints::default();
    let (cri, task) = (Some(Store::Cri), Some(Store::Task));
    for (shown, events) in [
        (
            Running,
            vec![
                (ContainerStarted, None, cri),
                (ContainerDied, Some(137), task),
            ],
        ),
        // Never shown running: nothing says it ran but the exit (kubelet's unknown to exited).
        (Created, vec![(ContainerDied, Some(137), task)]),
    ] {
        let mut read = reading(
            Covers::Containers(vec![id("c")]),
            vec![("p", read_alone(shown, &[]))],
        );
        read.tasks.insert(
            id("c"),
            TaskRecord::Exited {
                code: 137,
                at: at(40),
            },
        );
        let (pods, _) = reconcile(&committed(None), read, &hint, &none, &HashSet::new(), TASK);
        assert_eq!(rows(&pods), events, "shown {shown:?}");
    }
}

/// A container a hint asked about (CRI's `CONTAINER_CREATED`), first read exited, its start
/// recorded by the runtime (`started_at`): while containerd's events are on their way its
/// whole life is told, the start before the death (good_neighbour on containerd 2.1: the read
/// found the container exited 100 ms on, its `/tasks/start` came 10 ms after the read, found
/// it exited, and the start was never told); so is one a full relist found over while a hint
/// about it waited, and, once the run's baseline is read, any. Without the runtime's events,
/// or in the baseline for a container nothing asked about, kubelet's rule: died, nothing more.
#[test]
fn a_life_a_read_found_over_is_told_whole_while_the_runtimes_events_come() {
    let asked = hints(true, Source::CriEvents, &[]);
    let none = Hints::default();
    let mut shown = record(Exited);
    shown.started_at = Some(at(20));
    let read = reading(
        Covers::Containers(vec![id("c")]),
        vec![(
            "p",
            PodReading::Containers {
                pod: pod("p", "web", [shown.clone()]),
                gone: Vec::new(),
            },
        )],
    );
    let events = Settings {
        runtime_events: true,
        ..TASK
    };
    let after_baseline = Settings {
        baseline_read: true,
        ..events
    };
    let cri = Some(Store::Cri);
    let (whole, died) = (
        vec![(ContainerStarted, None, cri), (ContainerDied, Some(2), cri)],
        vec![(ContainerDied, Some(2), cri)],
    );
    // The same reading, the container's start recorded at `started_at`.
    let started = |started_at: Option<SystemTime>| {
        let mut read = read.clone();
        if let Some((_, PodReading::Containers { pod, .. })) = read.pods.first_mut() {
            pod.containers
                .values_mut()
                .for_each(|c| c.started_at = started_at);
        }
        read
    };
    let started_during_the_read = started(Some(read.read_at));
    let never_started = started(None);
    for (name, read, hints, queued, settings, expected) in [
        (
            "asked, events on their way",
            read.clone(),
            &asked,
            &none,
            events,
            &whole,
        ),
        (
            // good_neighbour on 1.6: the kernel's exec hints waited in their grace for
            // `/tasks/start`, a full relist found the container over meanwhile.
            "a full relist, asked by a queued hint, events on their way",
            read.clone(),
            &none,
            &asked,
            events,
            &whole,
        ),
        (
            "asked, no runtime events",
            read.clone(),
            &asked,
            &none,
            TASK,
            &died,
        ),
        (
            "nothing asked, in the run's baseline",
            read.clone(),
            &none,
            &none,
            events,
            &died,
        ),
        (
            // good_neighbour on 1.6: plegd frozen while containers came and went; thawed, a
            // full relist found one over before its `/tasks/start` reached plegd.
            "nothing asked, after the baseline, events on their way",
            read.clone(),
            &none,
            &none,
            after_baseline,
            &whole,
        ),
        (
            "nothing asked, after the baseline, no runtime events",
            read.clone(),
            &none,
            &none,
            Settings {
                runtime_events: false,
                ..after_baseline
            },
            &died,
        ),
        (
            // soak through a plegd crash: the new run's baseline listed the container created,
            // read it exited; its `/tasks/start` waited for the baseline's end.
            "nothing asked, in the baseline, started after the read began",
            started_during_the_read,
            &none,
            &none,
            events,
            &whole,
        ),
        (
            "after the baseline, never started",
            never_started.clone(),
            &none,
            &none,
            after_baseline,
            &died,
        ),
        (
            "asked, never started",
            never_started,
            &asked,
            &none,
            events,
            &died,
        ),
    ] {
        let (pods, _) = reconcile(
            &committed(None),
            read,
            hints,
            queued,
            &HashSet::new(),
            settings,
        );
        assert_eq!(&rows(&pods), expected, "{name}");
    }
}

#[test]
fn a_deletion_is_remembered_for_later_readings() {
    let (pods, plan) = reconcile(
        &committed(Some(Exited)),
        Reading::none(at(50)),
        &hints(false, Containerd, &[Deleted]),
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    assert_eq!(plan.deleted, vec![id("c")]);
    assert_eq!(pods[0].record, None, "its pod held only it");
}

#[test]
fn a_full_relist_inspects_only_the_pods_that_moved_on() {
    let old = pod("p", "web", [record(Running)]);
    let none = HashSet::new();
    assert!(!inspection_needed(&old, &old, &none), "as committed");
    let died = pod("p", "web", [container("c", "app", Exited)]);
    assert!(inspection_needed(&old, &died, &none), "a death");
    let more = pod(
        "p",
        "web",
        [record(Running), container("d", "side", Created)],
    );
    assert!(inspection_needed(&old, &more, &none), "a container more");
    let tombstones = HashSet::from([id("d")]);
    assert!(
        !inspection_needed(&old, &more, &tombstones),
        "a deleted one lingering in the listing"
    );
    assert!(inspection_needed(&more, &old, &none), "a container fewer");
    let other = pod("p", "web", [container("b", "app", Running)]);
    assert!(
        inspection_needed(&old, &other, &none),
        "another container in its place"
    );
    let mut confirmed = record(Exited);
    confirmed.confirmed_by = Store::Task;
    let by_task = pod("p", "web", [confirmed]);
    assert!(
        inspection_needed(&by_task, &died, &none),
        "the CRI store caught up with the task service"
    );
}

#[test]
fn a_targeted_relist_reads_the_containers_its_hints_name() {
    let mut settling = record(Exited);
    settling.confirmed_by = Store::Task;
    let by_task = pod("p", "web", [settling, container("d", "side", Running)]);
    let cases = [
        (
            "hints naming containers",
            hints(false, Containerd, &[exit(137)]),
            ToRead::Containers(vec![id("c")]),
        ),
        (
            "a hint naming none",
            hints(false, Containerd, &[]),
            ToRead::Pod,
        ),
        (
            "no hint: what only the task store confirmed",
            Hints::default(),
            ToRead::Containers(vec![id("c")]),
        ),
    ];
    for (name, hints, read) in cases {
        assert_eq!(what_to_read(Some(&by_task), &hints), read, "{name}");
    }
    let settled = pod("p", "web", [record(Exited)]);
    assert_eq!(
        what_to_read(Some(&settled), &Hints::default()),
        ToRead::Containers(vec![]),
        "nothing left to settle"
    );
}

/// Pod "p" holding "c" and "d", both running.
fn c_and_d_running() -> Committed {
    let mut committed = Committed::default();
    committed.commit(
        &uid("p"),
        Some(Arc::new(pod(
            "p",
            "web",
            [record(Running), container("d", "side", Running)],
        ))),
        false,
    );
    committed
}

#[test]
fn a_container_read_by_its_id_leaves_the_rest_of_its_pod_as_committed() {
    let committed = c_and_d_running();
    let read = reading(
        Covers::Containers(vec![id("c")]),
        vec![("p", read_alone(Exited, &[]))],
    );
    let (pods, plan) = reconcile(
        &committed,
        read,
        &hints(false, Ebpf, &[Signal(9)]),
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    assert_eq!(
        rows(&pods),
        vec![(ContainerDied, Some(2), Some(Store::Cri))]
    );
    let record = pods[0].record.as_ref().expect("the pod stays");
    let states: Vec<_> = record.containers.values().map(|c| c.state).collect();
    assert_eq!(states, vec![Exited, Running], "d is as committed");
    assert_eq!(whys(&plan), vec![]);
}

#[test]
fn only_what_the_node_does_not_show_yet_is_read_again() {
    let committed = c_and_d_running();
    let observation = |source, kind| Observation { source, kind };
    let mut hints = Hints::default();
    hints.insert(
        Scope::Pod(uid("p")),
        Hint {
            sources: BTreeSet::from([Ebpf, Containerd]),
            observed_at: at(10),
            observations: vec![
                (id("c"), observation(Ebpf, Signal(9))),
                (id("d"), observation(Containerd, exit(1))),
            ],
            unspecific: false,
        },
    );
    let (pods, plan) = reconcile(
        &committed,
        Reading::none(at(50)),
        &hints,
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    assert_eq!(
        rows(&pods),
        vec![(ContainerDied, Some(1), Some(Store::Task))]
    );
    let [again] = plan.reread.as_slice() else {
        panic!("one target to read again: {:?}", plan.reread);
    };
    assert_eq!(
        again.hint.observations,
        vec![(id("c"), observation(Ebpf, Signal(9)))],
        "d's exit is shown"
    );
    assert_eq!(again.hint.sources, BTreeSet::from([Ebpf]));
    assert_eq!(
        what_to_read(committed.get(&uid("p")), &unanswered(&plan.reread)),
        ToRead::Containers(vec![id("c")])
    );
}

#[test]
fn task_statuses_are_read_only_for_kernel_hints_the_runtime_does_not_show() {
    let kernel = hints(false, Ebpf, &[Signal(9)]);
    assert_eq!(
        tasks_to_read(&kernel, |_| Some(Running)),
        vec![(id("c"), TaskAsk::Exit)]
    );
    assert_eq!(tasks_to_read(&kernel, |_| Some(Exited)), vec![]);
    assert_eq!(tasks_to_read(&kernel, |_| None), vec![], "unknown");
    let exec = hints(false, Ebpf, &[Exec("/bin/sh".into())]);
    assert_eq!(
        tasks_to_read(&exec, |_| Some(Created)),
        vec![(id("c"), TaskAsk::Start)]
    );
    assert_eq!(tasks_to_read(&exec, |_| Some(Running)), vec![]);
    let carried = hints(false, Containerd, &[exit(137)]);
    assert_eq!(tasks_to_read(&carried, |_| Some(Running)), vec![]);
    let both = hints(false, Ebpf, &[Exec("/bin/sh".into()), Signal(9)]);
    assert_eq!(
        tasks_to_read(&both, |_| Some(Created)),
        vec![(id("c"), TaskAsk::Exit)],
        "the exit outranks the start"
    );
}

/// Container "c" of pod "p" as the plans left it.
fn planned_container(pods: &[Planned]) -> &ContainerRecord {
    let pod = pods
        .iter()
        .find_map(|p| p.record.as_ref())
        .expect("a plan of pod p");
    &pod.containers[&id("c")]
}

/// An OOM kill of one of a running container's processes says nothing of its state (the init
/// may live on): it is learned with no reading and no event, and is the reason of the death
/// that follows, whatever its code.
#[test]
fn an_oom_kill_is_learned_unread_and_is_the_reason_of_the_death_that_follows() {
    for source in [Ebpf, Containerd] {
        let (pods, plan) = reconcile(
            &committed(Some(Running)),
            nothing(),
            &hints(false, source, &[OomKilled]),
            &Hints::default(),
            &HashSet::new(),
            TASK,
        );
        assert_eq!(rows(&pods), vec![], "{source:?}: no event");
        assert_eq!(whys(&plan), vec![], "{source:?}: nothing to read");
        let learned = planned_container(&pods);
        assert_eq!(
            learned.oom_killed_by,
            BTreeSet::from([source]),
            "{source:?}"
        );
        assert_eq!(learned.state, Running, "{source:?}");

        let mut after = Committed::default();
        let mut oomed = pod("p", "web", [learned.clone()]);
        oomed.uid = uid("p");
        after.commit(&uid("p"), Some(Arc::new(oomed)), false);
        let (pods, _) = reconcile(
            &after,
            nothing(),
            &hints(false, Containerd, &[exit(0)]),
            &Hints::default(),
            &HashSet::new(),
            TASK,
        );
        let died = &pods[0].events[0];
        assert_eq!(
            (died.event_type, died.exit_code, died.reason.as_str()),
            (ContainerDied, Some(0), "OOMKilled"),
            "{source:?}"
        );
    }
}

/// The OOM kill and the exit in one batch (containerd's /tasks/oom, or the kernel's kill held
/// in its grace, answered by /tasks/exit): the death carries the reason, and the signal.
#[test]
fn a_death_and_its_oom_kill_in_one_batch_tell_the_reason_and_the_signal() {
    let (pods, _) = reconcile(
        &committed(Some(Running)),
        nothing(),
        &hints(false, Containerd, &[OomKilled, exit(137)]),
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    let died = &pods[0].events[0];
    assert_eq!(
        (died.reason.as_str(), died.signal, died.confirmed_by),
        ("OOMKilled", Some(9), Some(Store::Task))
    );
    // The kernel's OOM kill still queued (in its grace) when the runtime's exit is read.
    let (pods, _) = reconcile(
        &committed(Some(Running)),
        nothing(),
        &hints(false, Containerd, &[exit(137)]),
        &hints(true, Ebpf, &[OomKilled]),
        &HashSet::new(),
        TASK,
    );
    assert_eq!(pods[0].events[0].reason, "OOMKilled");
}

/// Who a container is on the host comes with the kernel's observations of it (and the
/// runtime's start): its record keeps it, and its events carry it.
#[test]
fn the_containers_identity_on_the_host_is_kept_and_carried() {
    let identity = ObservationKind::Identity(crate::pleg::model::trigger::Identity {
        cgroup_id: 7,
        cgroup_path: "/k8s.io/c".into(),
        init_pid: Some(41),
        pod: None,
    });
    let (pods, _) = reconcile(
        &committed(Some(Created)),
        nothing(),
        &hints(false, Containerd, &[TaskStarted { at: at(8), pid: 42 }]),
        &hints(true, Ebpf, &[Exec("/bin/sh".into()), identity]),
        &HashSet::new(),
        TASK,
    );
    let started = &pods[0].events[0];
    assert_eq!(started.event_type, ContainerStarted);
    let host = started.host.as_deref().expect("the identity on the event");
    assert_eq!(
        (host.cgroup_id, host.cgroup_path.as_deref(), host.init_pid),
        (Some(7), Some("/k8s.io/c"), Some(42)),
        "the runtime's pid stands where both said one"
    );
    assert_eq!(planned_container(&pods).host.as_deref(), Some(host));
}

/// A container no reading showed, whose whole life the runtime's records tell (its start,
/// exit and deletion all came before any read of it could run), is told from them: started,
/// died with the recorded code, removed, confirmed by the task service, in the pod its cgroup
/// names; not while a read of it is in flight (nor answered then), and not at all when it
/// never started.
#[test]
fn a_life_no_reading_showed_is_told_from_the_runtimes_records() {
    let in_pod = ObservationKind::Identity(crate::pleg::model::trigger::Identity {
        cgroup_id: 9,
        cgroup_path: "/kubepods/besteffort/podp/c".into(),
        init_pid: Some(41),
        pod: Some(uid("p")),
    });
    let whole_life = [TaskStarted { at: at(8), pid: 41 }, exit(137), Deleted];
    let mut hints = hints(true, Containerd, &whole_life);
    let kernel = crate::pleg::decide::hints::Hint {
        sources: BTreeSet::from([Ebpf]),
        observed_at: at(9),
        observations: vec![
            (
                id("c"),
                Observation {
                    source: Ebpf,
                    kind: Signal(9),
                },
            ),
            (
                id("c"),
                Observation {
                    source: Ebpf,
                    kind: in_pod,
                },
            ),
        ],
        unspecific: false,
    };
    hints.insert(Scope::Container(id("c")), kernel);
    // Its pod is known (another container of it): the event names it.
    let mut before = Committed::default();
    before.commit(
        &uid("p"),
        Some(Arc::new(pod("p", "web", [container("s", "", Running)]))),
        false,
    );

    let tell = |unread: bool, hints: &Hints| {
        let mut out = Collect {
            committed: before.clone(),
            pods: Vec::new(),
            told: Vec::new(),
        };
        let settings = TASK;
        let plan = super::reconcile(
            &mut out,
            nothing(),
            hints,
            &Hints::default(),
            &HashSet::new(),
            settings,
            unread,
        );
        (out, plan)
    };
    let (out, plan) = tell(true, &hints);
    let told: Vec<_> = out
        .told
        .iter()
        .map(|e| {
            (
                e.event_type,
                e.exit_code,
                e.confirmed_by,
                e.pod.0.as_str(),
                e.pod_name.as_str(),
            )
        })
        .collect();
    assert_eq!(
        told,
        [
            (ContainerStarted, None, TASK_STORE, "p", "web"),
            (ContainerDied, Some(137), TASK_STORE, "p", "web"),
            (ContainerRemoved, Some(137), TASK_STORE, "p", "web"),
        ]
    );
    let died = &out.told[1];
    assert_eq!(
        (died.reason.as_str(), died.signal, died.sources.clone()),
        ("Error", Some(9), vec![Ebpf, Containerd])
    );
    assert!(
        out.pods.is_empty(),
        "no pod's record changes: {:?}",
        out.pods.len()
    );
    assert_eq!((whys(&plan), plan.deleted), (vec![], vec![id("c")]));

    let (out, plan) = tell(false, &hints);
    assert!(out.told.is_empty(), "a read of it is in flight");
    assert_eq!(
        (whys(&plan), plan.deleted),
        (vec![Why::Unreflected], vec![]),
        "nor answered: the read (or the records after it) will tell it"
    );

    let never_started = self::hints(true, Containerd, &[Deleted]);
    let (out, plan) = tell(true, &never_started);
    assert!(out.told.is_empty(), "created and deleted: no event");
    assert_eq!(plan.deleted, [id("c")]);
    // The deletion alone, while a read of the container is in flight: its start and exit may
    // be that read's hints. Left to it, not answered.
    let (out, plan) = tell(false, &never_started);
    assert!(out.told.is_empty());
    assert_eq!(
        (whys(&plan), plan.deleted),
        (vec![Why::Unreflected], vec![])
    );
}

/// CRI's events tell a deletion without the records of the life before it, which containerd's
/// stream brings ahead of its own `/containers/delete`: when CRI's word comes first, the
/// container no reading showed is not closed by it (no event, and not recorded deleted), and
/// containerd's records that follow tell its life. The suite lost a whole lifecycle on
/// containerd 2.1 that way, the two streams' triggers of a frozen plegd taken in one after
/// the other.
#[test]
fn a_deletion_cri_told_first_leaves_the_life_to_containerds_records() {
    let tell = |hints: &Hints, tombstones: &HashSet<ContainerId>| {
        let mut out = Collect {
            committed: Committed::default(),
            pods: Vec::new(),
            told: Vec::new(),
        };
        let plan = super::reconcile(
            &mut out,
            nothing(),
            hints,
            &Hints::default(),
            tombstones,
            TASK,
            true,
        );
        (out.told, plan)
    };
    let cri = hints(true, CriEvents, &[ExitCode(137), Deleted]);
    let (told, plan) = tell(&cri, &HashSet::new());
    assert!(told.is_empty(), "no record of its start or exit: {told:?}");
    assert_eq!(plan.deleted, [], "not closed");
    assert_eq!(whys(&plan), [], "nor read: the runtime has it no more");

    let containerd = hints(
        true,
        Containerd,
        &[TaskStarted { at: at(8), pid: 41 }, exit(137), Deleted],
    );
    let tombstones: HashSet<ContainerId> = plan.deleted.into_iter().collect();
    let (told, plan) = tell(&containerd, &tombstones);
    let told: Vec<_> = told.iter().map(|e| (e.event_type, e.exit_code)).collect();
    assert_eq!(
        told,
        [
            (ContainerStarted, None),
            (ContainerDied, Some(137)),
            (ContainerRemoved, Some(137)),
        ]
    );
    assert_eq!(plan.deleted, [id("c")]);

    // containerd's own deletion without a start before it: created and deleted, closed.
    let (told, plan) = tell(&hints(true, Containerd, &[Deleted]), &HashSet::new());
    assert!(told.is_empty());
    assert_eq!(plan.deleted, [id("c")]);
}

/// Reads run side by side: what a reading begun later showed of a container stands against
/// one begun earlier (the full relist's listing, beside the container's own read), which
/// neither takes its record back nor finds it gone; the rest of that reading stands.
#[test]
fn a_reading_begun_earlier_leaves_what_a_later_one_showed_as_it_is() {
    let (t0, t1) = {
        let now = Instant::now();
        (now, now + Duration::from_millis(5))
    };
    let mut held = Committed::default();
    let other = container("o", "other", Running);
    held.commit(
        &uid("p"),
        Some(Arc::new(pod(
            "p",
            "web",
            [exited("c", "app", 1, "Error"), other],
        ))),
        false,
    );
    held.shown(&id("c"), t1);
    held.shown(&id("o"), t0 - Duration::from_millis(1));
    let earlier = |read| fresh(reading(Covers::Node, vec![("p", read)]), &held, t0);
    // Inspected before c's exit was read: c not taken back; o, gone since, is gone.
    let stale = earlier(PodReading::Inspected(pod(
        "p",
        "web",
        [container("c", "app", Running)],
    )));
    assert_eq!(
        stale.pods,
        [(
            uid("p"),
            PodReading::Containers {
                pod: pod("p", "web", []),
                gone: vec![id("o")]
            }
        )]
    );
    // The pod not listed: c stands, o is gone.
    let stale = earlier(PodReading::Gone);
    assert_eq!(
        stale.pods,
        [(
            uid("p"),
            PodReading::Containers {
                pod: pod("p", "web", []).identity(),
                gone: vec![id("o")]
            }
        )]
    );
    // Begun after both were read: as it came.
    let later = fresh(
        reading(Covers::Node, vec![("p", PodReading::Gone)]),
        &held,
        t1,
    );
    assert_eq!(later.pods, [(uid("p"), PodReading::Gone)]);
}

/// A container committed before, whose end the runtime's records tell in one batch, is told
/// gone once: by its committed record's plan, not again as a life no reading showed.
#[test]
fn a_committed_containers_end_told_by_the_records_is_told_once() {
    let (pods, plan) = reconcile(
        &committed(Some(Running)),
        nothing(),
        &hints(true, Containerd, &[exit(137), Deleted]),
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    assert_eq!(
        rows(&pods),
        [
            (ContainerDied, Some(137), TASK_STORE),
            (ContainerRemoved, Some(137), TASK_STORE)
        ]
    );
    assert_eq!((whys(&plan), plan.deleted), (vec![], vec![id("c")]));
}

/// A container a reading found gone is gone for good: the runtime's records of its end that
/// come after (a frozen plegd resumed: the full relist ran before their triggers) tell
/// nothing again.
#[test]
fn a_container_a_reading_found_gone_is_not_told_gone_again_by_the_records() {
    let (pods, plan) = reconcile(
        &committed(Some(Running)),
        reading(Covers::Node, vec![("p", PodReading::Gone)]),
        &Hints::default(),
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    assert_eq!(
        rows(&pods),
        [
            (ContainerDied, None, CRI_STORE),
            (ContainerRemoved, None, CRI_STORE)
        ]
    );
    assert_eq!(plan.deleted, [id("c")], "remembered gone");
    let tombstones: HashSet<ContainerId> = plan.deleted.into_iter().collect();
    let mut out = Collect {
        committed: Committed::default(),
        pods: Vec::new(),
        told: Vec::new(),
    };
    let late = hints(true, Containerd, &[exit(137), Deleted]);
    let plan = super::reconcile(
        &mut out,
        nothing(),
        &late,
        &Hints::default(),
        &tombstones,
        TASK,
        true,
    );
    assert!(out.told.is_empty() && out.pods.is_empty(), "{:?}", out.told);
    assert_eq!(whys(&plan), [], "the records are answered");
}

/// Pod p with c's death committed as the task service told it: `Error`, the reason predicted.
fn told_error_by_the_task_service() -> Committed {
    let mut told = exited("c", "app", 137, "Error");
    told.confirmed_by = Store::Task;
    let mut before = Committed::default();
    before.commit(&uid("p"), Some(Arc::new(pod("p", "web", [told]))), false);
    before
}

/// A death whose reason the task service's record decided, and the CRI store shows another:
/// the record takes the store's, the plan says so, and a ContainerChanged tells consumers
/// (with `emit_changed` off: it is no news of a created container).
#[test]
fn the_cri_store_correcting_a_deaths_reason_is_said() {
    let before = told_error_by_the_task_service();
    let pods = corrected_to_oom_killed(&before, Covers::Pod(uid("p")));
    assert_eq!(planned_container(&pods).reason, "OOMKilled");
}

/// `committed`'s death of c, told `Error`, read as the CRI store shows it (OOMKilled): the
/// ContainerChanged and the correction that says so.
fn corrected_to_oom_killed(committed: &Committed, covers: Covers) -> Vec<Planned> {
    let pods = read_oom_killed_in_the_store(committed, covers, TASK);
    said_oom_killed(&pods, Store::Cri);
    pods
}

/// `committed`'s c read as the CRI store shows it once it recorded the OOM kill.
fn read_oom_killed_in_the_store(
    committed: &Committed,
    covers: Covers,
    settings: Settings,
) -> Vec<Planned> {
    let mut oomed = exited("c", "app", 137, "OOMKilled");
    oomed.confirmed_by = Store::Cri;
    let (pods, _) = reconcile(
        committed,
        reading(
            covers,
            vec![("p", PodReading::Inspected(pod("p", "web", [oomed])))],
        ),
        &Hints::default(),
        &Hints::default(),
        &HashSet::new(),
        settings,
    );
    pods
}

/// The plan says c's death, told `Error`, was an OOM kill (`confirmed_by` that record): a
/// ContainerChanged with the reason, and the correction.
fn said_oom_killed(pods: &[Planned], confirmed_by: Store) {
    assert_eq!(
        rows(pods),
        vec![(ContainerChanged, Some(137), Some(confirmed_by))]
    );
    assert_eq!(pods[0].events[0].reason, "OOMKilled");
    assert_eq!(
        pods[0].corrected,
        vec![Correction {
            container: id("c"),
            told: "Error".into(),
            shown: "OOMKilled".into(),
        }]
    );
}

/// `committed` against `source`'s word (alone) that c was OOM-killed.
fn oom_killed_by(
    committed: &Committed,
    source: Source,
    settings: Settings,
) -> (Vec<Planned>, FollowUp) {
    reconcile(
        committed,
        nothing(),
        &hints(false, source, &[OomKilled]),
        &Hints::default(),
        &HashSet::new(),
        settings,
    )
}

/// Pod p holding the container the plan made of c.
fn committed_as_planned(pods: &[Planned]) -> Committed {
    let mut learned = pod("p", "web", [planned_container(pods).clone()]);
    learned.uid = uid("p");
    let mut committed = Committed::default();
    committed.commit(&uid("p"), Some(Arc::new(learned)), false);
    committed
}

/// containerd's `/tasks/oom` after the CRI store showed the death (the shim sends it apart
/// from `/tasks/exit`, and the CRI plugin records it as it comes, the death's reason with it):
/// the death is read again, and the store's OOMKilled corrects its Error; until the store
/// shows it, the full relist reads it too. The kernel's word on it alone reads nothing: the
/// CRI store never learns of an OOM kill the runtime missed.
#[test]
fn an_oom_kill_containerd_tells_after_the_death_corrects_its_reason() {
    let mut before = Committed::default();
    let mut cri_error = exited("c", "app", 137, "Error");
    cri_error.confirmed_by = Store::Cri;
    before.commit(
        &uid("p"),
        Some(Arc::new(pod("p", "web", [cri_error]))),
        false,
    );
    for (source, settles) in [(Ebpf, false), (Containerd, true)] {
        let (pods, plan) = oom_killed_by(&before, source, TASK);
        assert_eq!(rows(&pods), vec![], "{source:?}: no event yet");
        let learned = planned_container(&pods);
        assert_eq!(
            (
                learned.reason.as_str(),
                learned.awaits_cri(),
                &plan.settling
            ),
            (
                "Error",
                settles,
                &if settles { vec![id("c")] } else { vec![] }
            ),
            "{source:?}"
        );
        let listed = pod("p", "web", [learned.clone()]);
        assert_eq!(
            inspection_needed(&listed, &listed, &HashSet::new()),
            settles,
            "{source:?}: the full relist reads it while it awaits the store"
        );
    }

    let (pods, _) = oom_killed_by(&before, Containerd, TASK);
    let after = committed_as_planned(&pods);
    let pods = corrected_to_oom_killed(&after, Covers::Containers(vec![id("c")]));
    assert!(!planned_container(&pods).awaits_cri(), "settled");
}

/// containerd's `/tasks/oom` after its `/tasks/exit` told the death `Error` (the shim sends
/// them apart; on a busy node the exit comes first): the reason predicted again is said at
/// once, a correction, and the CRI store showing OOMKilled later corrects nothing more
/// (exit_reasons' counters: a death counted `Error` and never corrected). The kernel's word
/// alone changes no reason where containerd's is the witness.
#[test]
fn an_oom_kill_containerd_tells_after_the_exit_corrects_the_reason_told() {
    let before = told_error_by_the_task_service();
    let runtime_witness = Settings {
        oom_witness: OomWitness::Runtime,
        ..TASK
    };
    let (pods, _) = oom_killed_by(&before, Ebpf, runtime_witness);
    assert_eq!(rows(&pods), vec![], "the kernel's word alone");

    let (pods, _) = oom_killed_by(&before, Containerd, runtime_witness);
    said_oom_killed(&pods, Store::Task);

    let pods = read_oom_killed_in_the_store(
        &committed_as_planned(&pods),
        Covers::Containers(vec![id("c")]),
        runtime_witness,
    );
    assert_eq!(rows(&pods), vec![], "the store agrees: nothing more to say");
    assert!(pods.iter().all(|p| p.corrected.is_empty()));
}

/// A pod's labels and annotations come with its sandbox: a reading of its containers by id
/// (without them) keeps the committed ones, and the events carry them.
#[test]
fn a_pods_labels_outlive_a_reading_of_its_containers_alone() {
    let mut labelled = pod("p", "web", [record(Created)]);
    labelled.labels = BTreeMap::from([("app".into(), "web".into())]);
    labelled.annotations = BTreeMap::from([("owner".into(), "alice".into())]);
    let mut before = Committed::default();
    before.commit(&uid("p"), Some(Arc::new(labelled.clone())), false);
    let (pods, _) = reconcile(
        &before,
        reading(
            Covers::Containers(vec![id("c")]),
            vec![("p", read_alone(Running, &[]))],
        ),
        &hints(true, Ebpf, &[Exec("/bin/sh".into())]),
        &Hints::default(),
        &HashSet::new(),
        TASK,
    );
    let record = pods[0].record.as_ref().expect("the pod stays");
    assert_eq!(
        (&record.labels, &record.annotations),
        (&labelled.labels, &labelled.annotations)
    );
    let started = &pods[0].events[0];
    assert_eq!(started.event_type, ContainerStarted);
    assert_eq!(started.pod_labels, labelled.labels);
    assert_eq!(started.pod_annotations, labelled.annotations);
}
